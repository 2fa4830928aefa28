"""env_kwargs (the RL Zoo's name): every env of a run - the probe, the actors in this process and in
actor processes, the evaluation, get_env - is made with the config's keyword arguments; for ALE ids
the Atari preprocessing takes its own by name. CartPole's sutton_barto_reward makes every step's
reward 0 and a fall -1, so a return <= 0 shows an env made with it (any CartPole episode otherwise
returns >= 8)."""
from pathlib import Path

import numpy as np
import pytest

import pearl
from pearl.callbacks import evaluate_policy
from pearl.cli import main
from pearl.config import apply_overrides, load_config, parse_config
from pearl.envs import make_env
from pearl.errors import ConfigError

SUTTON_BARTO = {"sutton_barto_reward": True}
CONFIGS = Path(__file__).resolve().parents[1] / "configs"
SMALL = dict(hidden=[16], learning_starts=100, total_steps=600)


@pytest.mark.parametrize("runtime", ["sequential", "threaded", "processes"])
def test_every_env_of_a_run_is_made_with_the_env_kwargs(runtime):
    agent = pearl.DQN("CartPole-v1", env_kwargs=SUTTON_BARTO, plan=pearl.Plan(runtime=runtime), **SMALL)
    summary = agent.train()
    assert summary["env_steps"] == 600 and summary["episodes"] > 0
    assert summary["mean_return_100"] <= 0  # the actors' episodes
    assert max(agent.evaluate(episodes=2)["returns"]) <= 0
    vec = agent.get_env()
    vec.reset()
    _, rewards, _, _ = vec.step(np.zeros(vec.num_envs, dtype=np.int64))
    assert rewards[0] == 0.0


def test_without_env_kwargs_the_same_run_returns_positive():
    """The control: the assertions above fail for a run without the kwargs."""
    agent = pearl.DQN("CartPole-v1", plan=pearl.Plan(runtime="processes"), **SMALL)
    assert agent.train()["mean_return_100"] >= 8
    assert min(agent.evaluate(episodes=2)["returns"]) >= 8


def test_evaluate_policy_makes_the_models_env_id_with_its_kwargs():
    agent = pearl.DQN("CartPole-v1", env_kwargs=SUTTON_BARTO, **SMALL)
    returns, _ = evaluate_policy(agent, "CartPole-v1", n_eval_episodes=2, return_episode_rewards=True)
    assert max(returns) <= 0
    returns, _ = evaluate_policy(agent, "CartPole-v0", n_eval_episodes=1, return_episode_rewards=True)
    assert returns[0] >= 8  # another id: made without them


def test_the_kwargs_survive_save_and_load(tmp_path):
    agent = pearl.DQN("CartPole-v1", env_kwargs=SUTTON_BARTO, **SMALL)
    agent.save(tmp_path / "a")
    loaded = pearl.load(tmp_path / "a")
    assert loaded.config.env_kwargs == SUTTON_BARTO
    assert max(loaded.evaluate(episodes=1)["returns"]) <= 0
    # an env factory given at load takes its own arguments: the saved kwargs no longer apply
    import gymnasium as gym

    assert pearl.load(tmp_path / "a", env=lambda: gym.make("CartPole-v1")).config.env_kwargs == {}


def test_set_env_keeps_them_for_an_id_and_drops_them_for_a_factory():
    import gymnasium as gym

    agent = pearl.DQN("CartPole-v1", env_kwargs=SUTTON_BARTO, **SMALL)
    agent.set_env("CartPole-v1")
    assert agent.config.env_kwargs == SUTTON_BARTO
    agent.set_env(lambda: gym.make("CartPole-v1"))
    assert agent.config.env_kwargs == {}


def test_cli_config_with_env_kwargs(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text("env: CartPole-v1\nenv_kwargs: {sutton_barto_reward: true}\n"
                    "dqn: {hidden: [16], learning_starts: 100}\neval: {episodes: 1}\nlog: {plot: false}\n")
    assert load_config(path).env_kwargs == SUTTON_BARTO
    assert main(["train", str(path), "--steps", "300", "--run-dir", str(tmp_path / "run"), "--quiet"]) == 0
    assert pearl.load(tmp_path / "run").config.env_kwargs == SUTTON_BARTO  # a resumed run makes its envs alike


@pytest.mark.parametrize("value, message", [
    ([1, 2], "env_kwargs: expected a mapping of names to values, got [1, 2]"),
    ({"1a": 2}, "env_kwargs: expected keyword names, got '1a'"),
    ("repeat_action_probability=0", "env_kwargs: expected a mapping of names to values"),
])
def test_a_malformed_env_kwargs_is_one_line(value, message):
    with pytest.raises(ConfigError, match="^" + message.replace("[", r"\[").replace("]", r"\]")):
        parse_config({"env_kwargs": value})


def test_an_argument_the_env_does_not_take_is_named():
    with pytest.raises(ConfigError) as err:
        pearl.DQN("CartPole-v1", env_kwargs={"pole_colour": "red"}, **SMALL)
    text = str(err.value)
    assert text.startswith("env_kwargs: making CartPole-v1 with {'pole_colour': 'red'} failed: TypeError")
    assert "pole_colour" in text and "\n" not in text and "environment creator" not in text


def test_an_env_factory_refuses_env_kwargs():
    import gymnasium as gym

    with pytest.raises(ConfigError, match="^env_kwargs: applies to an env id"):
        pearl.DQN(lambda: gym.make("CartPole-v1"), env_kwargs=SUTTON_BARTO, **SMALL)


def test_the_envpool_engine_refuses_env_kwargs(monkeypatch):
    import pearl.envs

    monkeypatch.setattr(pearl.envs, "check_envpool", lambda *args, **kwargs: None)  # as if installed
    with pytest.raises(ConfigError, match="^env_kwargs: plan.env_engine envpool makes its envs from the id alone"):
        pearl.DQN("CartPole-v1", env_kwargs=SUTTON_BARTO, plan=pearl.Plan(env_engine="envpool"), **SMALL)


# -- ALE: the preprocessing's arguments by name, the rest gymnasium.make's ------------------------
ale = pytest.importorskip("ale_py")


def test_ale_kwargs_split_between_the_preprocessing_and_the_game():
    env = make_env("ALE/Breakout-v5", 0, kwargs={"repeat_action_probability": 0.0, "frame_stack": 2,
                                                 "screen_size": 42})
    try:
        assert env.observation_space.shape == (2, 42, 42)
        assert env.unwrapped.ale.getFloat("repeat_action_probability") == 0.0
    finally:
        env.close()
    env = make_env("ALE/Breakout-v5", 0)
    try:
        assert env.observation_space.shape == (4, 84, 84)
        assert env.unwrapped.ale.getFloat("repeat_action_probability") == 0.25
    finally:
        env.close()


@pytest.mark.parametrize("on_life_loss", [True, False])
def test_terminal_on_life_loss_from_env_kwargs(on_life_loss):
    """Breakout's FIRE (action 1) serves the ball; a random policy loses a life within a few hundred
    steps. With terminal_on_life_loss the episode ends there, with 4 of 5 lives left."""
    env = make_env("BreakoutNoFrameskip-v4", 0, kwargs={"terminal_on_life_loss": on_life_loss})
    rng = np.random.default_rng(0)
    try:
        env.reset(seed=0)
        for _ in range(5000):
            _, _, terminated, truncated, info = env.step(int(rng.integers(env.action_space.n)))
            if terminated or truncated or info["lives"] < 5:
                break
        assert info["lives"] == 4
        assert terminated == on_life_loss
    finally:
        env.close()


def test_ale_frameskip_is_refused_for_the_preprocessings_frame_skip():
    with pytest.raises(ConfigError, match="^env_kwargs.frameskip: the Atari preprocessing repeats each action; "
                                          "give frame_skip"):
        make_env("ALE/Breakout-v5", 0, kwargs={"frameskip": 2})


def test_the_atari_config_takes_env_kwargs():
    config = apply_overrides(load_config(CONFIGS / "breakout_dqn.yaml"),
                             {"env_kwargs": {"terminal_on_life_loss": True}, "total_steps": 1000})
    agent = pearl.make_agent(config)
    assert agent.parts.actor_recipe.kwargs["env_kwargs"] == {"terminal_on_life_loss": True}
