"""Stable-Baselines3's surface: the README's SB3 script (fast: few steps; slow: as written, and it
learns), SB3's constructor names and defaults, env forms, learn / predict / save / load, the
callbacks and when they are called, one-line errors for what PEARL does not do."""
import re
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

import pearl
from pearl.callbacks import (BaseCallback, CallbackList, CheckpointCallback, EvalCallback, EveryNTimesteps,
                             StopTrainingOnMaxEpisodes, StopTrainingOnRewardThreshold)
from pearl.errors import ConfigError, PearlError
from pearl.plan import Plan
from pearl.sb3 import NormalActionNoise, OrnsteinUhlenbeckActionNoise

README = Path(__file__).resolve().parents[1] / "README.md"
SMALL = dict(learning_starts=100, buffer_size=5000, policy_kwargs=dict(net_arch=[32, 32]), seed=0)


def readme_script() -> str:
    text = README.read_text()
    section = text.split("## Coming from Stable-Baselines3", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_readme_script_imports_only_pearl_in_place_of_sb3():
    script = readme_script()
    imports = [line for line in script.splitlines() if line.startswith(("import ", "from "))]
    assert imports and all("stable_baselines3" not in line.split("#")[0] for line in imports)
    assert "from pearl import DQN, SAC" in script


def test_readme_script_runs_with_few_steps(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    script = readme_script().replace("total_timesteps=50_000", "total_timesteps=1_500")
    script = script.replace("total_timesteps=20_000", "total_timesteps=150").replace("eval_freq=5_000", "eval_freq=500")
    namespace = {}
    exec(compile(script, "README.md", "exec"), namespace)
    assert (tmp_path / "dqn_cartpole.npz").is_file() and (tmp_path / "sac_pendulum.npz").is_file()
    assert isinstance(namespace["model"], pearl.SAC) and namespace["model"].num_timesteps == 150
    assert namespace["action"] in (0, 1) and namespace["_state"] is None
    assert np.isfinite(namespace["cartpole_mean"]) and np.isfinite(namespace["pendulum_mean"])


@pytest.mark.slow
def test_readme_script_learns_cartpole_and_pendulum_as_sb3(tmp_path, monkeypatch):
    """As written: the RL Zoo's settings; SB3's own figures: CartPole 500 (Zoo), Pendulum about -150."""
    monkeypatch.chdir(tmp_path)
    namespace = {}
    exec(compile(readme_script(), "README.md", "exec"), namespace)
    assert namespace["cartpole_mean"] >= 450  # training stopped at an evaluation of >= 475
    assert namespace["pendulum_mean"] > -300


def test_sb3_style_starts_from_sb3_defaults_and_pearl_style_keeps_pearls():
    sb3 = pearl.DQN("MlpPolicy", "CartPole-v1")
    dqn = sb3.config.dqn
    assert (dqn.lr, dqn.batch_size, dqn.learning_starts, dqn.train_freq, dqn.gradient_steps) == (1e-4, 32, 100, 4, 1)
    assert (dqn.target_update_interval, dqn.double, dqn.hidden, sb3.config.replay.capacity) == (10_000, False, [64, 64], 1_000_000)
    assert dqn.exploration.final == 0.05 and dqn.exploration.fraction == 0.1
    own = pearl.DQN("CartPole-v1", learning_rate=5e-4, exploration_final_eps=0.02)
    assert own.config.dqn.lr == 5e-4 and own.config.dqn.exploration.final == 0.02
    assert own.config.dqn.double and own.config.dqn.train_freq is None  # PEARL's defaults otherwise
    assert pearl.DQN(env="CartPole-v1", lr=3e-4).config.dqn.lr == 3e-4  # PEARL's names keep working
    sac = pearl.SAC("MlpPolicy", "Pendulum-v1", ent_coef="auto_0.1", target_entropy=-0.5, buffer_size=1e4)
    assert (sac.config.sac.autotune, sac.config.sac.init_ent_coef, sac.config.sac.target_entropy) == (True, 0.1, -0.5)
    assert sac.config.replay.capacity == 10_000 and sac.config.sac.hidden == [256, 256]
    td3 = pearl.TD3("MlpPolicy", "Pendulum-v1", action_noise=NormalActionNoise(np.zeros(1), 0.2 * np.ones(1)),
                    policy_kwargs=dict(net_arch=dict(pi=[64, 64], qf=[64, 64])), policy_delay=3, train_freq=(2, "step"),
                    gradient_steps=-1)
    t = td3.config.td3
    assert (t.action_noise, t.hidden, t.policy_delay, t.train_freq, t.gradient_steps) == (0.2, [64, 64], 3, 2, 2)


def test_env_forms(tmp_path):
    instance = pearl.DQN("MlpPolicy", gym.make("CartPole-v1"), **SMALL)
    assert instance.parts.family.n_actions == 2
    vec = pearl.DQN("MlpPolicy", gym.make_vec("CartPole-v1", num_envs=3), train_freq=4, **SMALL)
    assert vec.plan.envs_per_actor == 3 and vec.config.dqn.train_freq == 12 and vec.n_envs == 3
    fns = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 2)
    assert pearl.DQN("MlpPolicy", fns, **SMALL).plan.envs_per_actor == 2
    vec.learn(300)
    assert vec.num_timesteps == 300


@pytest.mark.parametrize("build,message", [
    (lambda: pearl.DQN("CnnPolicy", "CartPole-v1"), "policy: CartPole-v1's observations (4,) are flat: 'CnnPolicy'"),
    (lambda: pearl.DQN("ConvPolicy", "CartPole-v1"), "policy: expected 'MlpPolicy' (flat observations) or 'CnnPolicy'"),
    (lambda: pearl.DQN("MlpPolicy", "CartPole-v1", learning_rate=lambda p: 1e-3), "learning_rate: PEARL takes a constant"),
    (lambda: pearl.DQN("MlpPolicy", "CartPole-v1", train_freq=(1, "episode")), "train_freq: PEARL trains every N env steps"),
    (lambda: pearl.DQN("MlpPolicy", "CartPole-v1", train_freq=0), "train_freq: expected an integer >= 1"),
    (lambda: pearl.DQN("MlpPolicy", "CartPole-v1", gradient_steps=0), "dqn.gradient_steps: expected an integer >= 1"),
    (lambda: pearl.DQN("MlpPolicy", "CartPole-v1", optimize_memory_usage=True),
     "optimize_memory_usage: PEARL stores each frame once for observations stacked by gymnasium's"),
    (lambda: pearl.DQN("MlpPolicy", "CartPole-v1", optimize_memory_usage=1), "optimize_memory_usage: expected True"),
    (lambda: pearl.DQN("MlpPolicy", "CartPole-v1", policy_kwargs=dict(features_extractor_class=1)),
     "policy_kwargs.features_extractor_class: not supported"),
    (lambda: pearl.DQN("MlpPolicy", "CartPole-v1", policy_kwargs=dict(activation_fn=__import__("torch").nn.Tanh)),
     "policy_kwargs.activation_fn: PEARL's networks use ReLU"),
    (lambda: pearl.TD3("MlpPolicy", "Pendulum-v1", action_noise=OrnsteinUhlenbeckActionNoise(np.zeros(1), np.ones(1))),
     "action_noise: PEARL's actors add independent Gaussian noise"),
    (lambda: pearl.TD3("MlpPolicy", "Pendulum-v1", policy_kwargs=dict(net_arch=dict(pi=[64], qf=[400, 300]))),
     "policy_kwargs.net_arch: PEARL's actor and critics share their widths"),
    (lambda: pearl.SAC("MlpPolicy", "Pendulum-v1", ent_coef="automatic"), "ent_coef: expected 'auto'"),
    (lambda: pearl.SAC("MlpPolicy", "Pendulum-v1", use_sde=True), "use_sde: PEARL supports only"),
    (lambda: pearl.SAC("MlpPolicy", "Pendulum-v1", action_noise=NormalActionNoise(np.zeros(1), np.ones(1))),
     "action_noise: PEARL's SAC explores with its own policy"),
    (lambda: pearl.DQN("MlpPolicy", "CartPole-v1", no_such_argument=1), "no_such_argument: unknown DQN option"),
    (lambda: pearl.DQN("MlpPolicy", "CartPole-v1", "extra"), "DQN: takes (env) or (policy, env) positionally"),
    (lambda: pearl.DQN("MlpPolicy", gym.make("Pendulum-v1")), "env: "),
    (lambda: pearl.DQN("MlpPolicy", "CartPole-v1").learn(0), "total_timesteps: expected a positive integer"),
    (lambda: pearl.DQN("MlpPolicy", "CartPole-v1").predict(np.zeros(3)), "observation: expected shape (4,) or (n, 4)"),
])
def test_what_pearl_does_not_do_is_one_line(build, message):
    with pytest.raises(ConfigError) as err:
        build()
    assert str(err.value).startswith(message) and "\n" not in str(err.value), str(err.value)


class Frames(gym.Env):
    """36x36 uint8 frames (the Nature convolutions' smallest fit): the frame's value is the step."""

    observation_space = gym.spaces.Box(0, 255, (36, 36), np.uint8)
    action_space = gym.spaces.Discrete(3)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros((36, 36), np.uint8), {}

    def step(self, action):
        self.t += 1
        return np.full((36, 36), self.t % 256, np.uint8), float(action == 1), self.t >= 50, False, {}


def stacked_frames(padding: str = "reset"):
    return gym.wrappers.FrameStackObservation(Frames(), 4, padding_type=padding)


def test_cnn_policy_on_images_with_frames_stored_once():
    """SB3's CnnPolicy: the Nature convolutions and NatureCNN's 512 features before its net_arch
    (none for DQN); optimize_memory_usage=True stores each frame of the env's stacks once (PEARL's
    frame table). MlpPolicy on images, and frames once without a reset-padded frame stack, are one
    line each."""
    from pearl.replay import FrameReplay
    from pearl.sb3 import sb3_overrides

    model = pearl.DQN("CnnPolicy", stacked_frames, buffer_size=2000, optimize_memory_usage=True, learning_starts=100,
                      target_update_interval=100, seed=0)
    assert isinstance(model.replay, FrameReplay) and model.config.replay.frame_stack == 4
    assert model.config.dqn.hidden == [512] and model.config.dqn.conv == [[32, 8, 4], [64, 4, 2], [64, 3, 1]]
    model.learn(300)
    assert model.num_timesteps == 300 and model.replay.inserted == 300 and model.updates == (300 - 100) // 4
    whole = pearl.DQN("CnnPolicy", stacked_frames, buffer_size=500, policy_kwargs=dict(net_arch=[64]))
    assert not isinstance(whole.replay, FrameReplay) and whole.config.dqn.hidden == [512, 64]
    assert sb3_overrides("td3", {}, "CnnPolicy", 1)["td3.hidden"] == [512, 256, 256]  # (MlpPolicy's: 400-300)
    assert sb3_overrides("sac", {}, "CnnPolicy", 1)["sac.hidden"] == [512, 256, 256]
    for build, message in ((lambda: pearl.DQN("MlpPolicy", stacked_frames), "are images: use 'CnnPolicy'"),
                           (lambda: pearl.DQN("CnnPolicy", lambda: stacked_frames("zero"), optimize_memory_usage=True),
                            "optimize_memory_usage: PEARL stores each frame once")):
        with pytest.raises(ConfigError, match=message):
            build()


def test_learn_sizes_the_schedules_returns_self_and_continues():
    model = pearl.DQN("MlpPolicy", "CartPole-v1", exploration_fraction=0.5, **SMALL)
    assert model.learn(total_timesteps=800) is model
    assert model.num_timesteps == 800 and model.config.total_steps == 800
    assert model.algo.epsilon(400) == pytest.approx(0.05)  # decayed over half of the 800 steps, as SB3 does
    updates = model.updates
    model.learn(200, reset_num_timesteps=False)
    assert model.num_timesteps == 1000 and model.updates == updates + 200 // 4 * 1


def test_predict_single_and_batched():
    dqn = pearl.DQN("MlpPolicy", "CartPole-v1", **SMALL)
    obs = np.zeros(4, dtype=np.float32)
    action, state = dqn.predict(obs, deterministic=True)
    assert state is None and np.shape(action) == () and action in (0, 1)
    actions, _ = dqn.predict(np.zeros((5, 4)), deterministic=True)
    assert actions.shape == (5,) and set(actions) <= {0, 1}
    sac = pearl.SAC("MlpPolicy", "Pendulum-v1", seed=0)
    action, _ = sac.predict(np.zeros(3))
    assert action.shape == (1,) and -2.0 <= action[0] <= 2.0
    actions, _ = sac.predict(np.zeros((4, 3)), deterministic=True)
    assert actions.shape == (4, 1) and np.all(np.abs(actions) <= 2.0)


def test_predict_and_evaluate_policy_on_images():
    """CnnPolicy's predict takes the env's (C, H, W) uint8 stacks, a batch of them, and SB3's
    channel-last stacks (VecFrameStack's); the action is the Q-network's argmax."""
    import torch

    from pearl.callbacks import evaluate_policy

    model = pearl.DQN("CnnPolicy", stacked_frames, buffer_size=2000, seed=0)
    env = stacked_frames()
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, (8, 4, 36, 36), dtype=np.uint8)
    with torch.no_grad():  # actions near a tie on these frames, so that which frame decides the action
        model.algo.online.trunk[-1].bias -= model.algo.online(torch.as_tensor(frames, dtype=torch.float32)).mean(0)
        wanted = model.algo.online(torch.as_tensor(frames, dtype=torch.float32)).argmax(-1).numpy()
    assert len(set(wanted)) > 1  # the frames tell actions apart: the checks below can fail
    actions, state = model.predict(frames, deterministic=True)
    assert state is None and actions.dtype.kind == "i"
    np.testing.assert_array_equal(actions, wanted)
    np.testing.assert_array_equal(model.predict(np.moveaxis(frames, 1, -1), deterministic=True)[0], wanted)
    assert [model.predict(f, deterministic=True)[0] for f in frames] == list(wanted)
    assert model.predict(np.moveaxis(frames[0], 0, -1), deterministic=True)[0] == wanted[0]
    assert [model.act(f) for f in frames] == list(wanted)
    obs, _ = env.reset(seed=0)
    assert obs.shape == (4, 36, 36) and obs.dtype == np.uint8
    mean, std = evaluate_policy(model, env, n_eval_episodes=2)
    assert np.isfinite(mean) and std >= 0
    for wrong in (frames[0, :3], frames[:, :, :35], np.zeros(4 * 36 * 36)):
        with pytest.raises(ConfigError, match=r"observation: expected shape \(4, 36, 36\) or \(n, 4, 36, 36\), "
                                              r"channel-last \(36, 36, 4\) or \(n, 36, 36, 4\), got"):
            model.predict(wrong)
    with pytest.raises(ConfigError, match=r"obs: expected shape \(4,\) or \(n, 4\), got \(8,\)"):
        pearl.DQN("MlpPolicy", "CartPole-v1", **SMALL).act(np.zeros(8))  # was two observations' worth, silently


@pytest.mark.slow  # CI's slow suite installs SB3 (`.[bench]`)
def test_evaluate_policy_on_sb3_vec_envs_is_sb3s():
    """On an SB3 VecEnv, PEARL's evaluate_policy gives SB3's own episodes: the same returns and
    lengths in the same order, with and without a Monitor."""
    pytest.importorskip("stable_baselines3")
    import warnings

    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy as sb3_evaluate_policy
    from stable_baselines3.common.vec_env import DummyVecEnv

    from pearl.callbacks import evaluate_policy

    model = pearl.DQN("MlpPolicy", "CartPole-v1", **SMALL).learn(1000)
    for make in (lambda: make_vec_env("CartPole-v1", n_envs=3, seed=0),  # Monitor-wrapped
                 lambda: DummyVecEnv([lambda: gym.make("CartPole-v1")] * 3)):
        ours = evaluate_policy(model, make(), n_eval_episodes=7, return_episode_rewards=True, seed=5)
        env = make()
        env.seed(5)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # SB3's "not wrapped with a Monitor"
            theirs = sb3_evaluate_policy(model, env, n_eval_episodes=7, return_episode_rewards=True)
        assert len(ours[0]) == 7 and ours == theirs


@pytest.mark.slow  # CI's slow suite installs SB3 (`.[bench]`)
def test_evaluate_policy_on_sb3s_atari_vec_env_counts_games_not_lives():
    """SB3's Atari stack (make_atari_env: a life lost ends an episode; its Monitor sees whole games;
    VecFrameStack's channel-last stacks) with a CnnPolicy model: SB3's own figures."""
    pytest.importorskip("stable_baselines3")
    pytest.importorskip("ale_py")
    from stable_baselines3.common.env_util import make_atari_env
    from stable_baselines3.common.evaluation import evaluate_policy as sb3_evaluate_policy
    from stable_baselines3.common.vec_env import VecFrameStack

    from pearl.callbacks import evaluate_policy

    model = pearl.DQN("CnnPolicy", "BreakoutNoFrameskip-v4", buffer_size=1000, seed=0)
    ours = evaluate_policy(model, VecFrameStack(make_atari_env("BreakoutNoFrameskip-v4", n_envs=2, seed=0), 4),
                           n_eval_episodes=3, return_episode_rewards=True)
    theirs = sb3_evaluate_policy(model, VecFrameStack(make_atari_env("BreakoutNoFrameskip-v4", n_envs=2, seed=0), 4),
                                 n_eval_episodes=3, return_episode_rewards=True)
    assert ours == theirs and len(ours[0]) == 3


def test_get_env_runs_sb3s_front_page_loop():
    """SB3's README loop (model.get_env(), reset, predict, step, render) on PEARL's vector env: an
    ended episode starts the next one at once, its last observation and whether a time limit cut it
    in the step's info, as SB3's vector envs do."""
    from pearl.callbacks import evaluate_policy
    from pearl.sb3 import DummyVecEnv

    model = pearl.DQN("MlpPolicy", gym.make("CartPole-v1", max_episode_steps=20), **SMALL)
    model.learn(300)
    vec_env = model.get_env()
    assert isinstance(vec_env, DummyVecEnv) and model.env is vec_env and vec_env.num_envs == model.n_envs == 1
    assert vec_env.seed(3) == [3]
    obs = vec_env.reset()
    assert obs.shape == (1, 4) and np.array_equal(obs[0], gym.make("CartPole-v1").reset(seed=3)[0])
    ended, steps = [], 0
    for _ in range(200):
        action, _ = model.predict(obs, deterministic=True)
        obs, reward, done, info = vec_env.step(action)
        assert reward.shape == done.shape == (1,) and obs.shape == (1, 4)
        steps += 1
        if done[0]:
            ended.append((steps, info[0]["TimeLimit.truncated"]))
            steps = 0
            assert info[0]["terminal_observation"].shape == (4,)
            assert not np.array_equal(info[0]["terminal_observation"], obs[0])  # obs: the next episode's first
        else:
            assert "terminal_observation" not in info[0] and not info[0]["TimeLimit.truncated"]
    assert ended and all(cut == (length == 20) for length, cut in ended)
    vec_env.envs[0].render = lambda: "the first env's frame"
    assert vec_env.render() == "the first env's frame"
    returns, lengths = evaluate_policy(model, vec_env, n_eval_episodes=3, return_episode_rewards=True)
    assert len(returns) == 3 and all(1 <= n <= 20 for n in lengths) and returns == [float(n) for n in lengths]
    vec_env.close()


class ThreeActions(gym.Env):
    """CartPole's observations, three actions."""

    observation_space = gym.make("CartPole-v1").observation_space
    action_space = gym.spaces.Discrete(3)

    def reset(self, *, seed=None, options=None):
        return np.zeros(4, np.float32), {}

    def step(self, action):
        return np.zeros(4, np.float32), 0.0, True, False, {}


def test_set_env_trains_on_the_new_env_with_everything_else_kept():
    model = pearl.DQN("MlpPolicy", "CartPole-v1", **SMALL).learn(500)
    weights, inserted, updates = model.learner.policy_weights().copy(), model.replay.inserted, model.updates
    model.set_env(gym.make("CartPole-v1", max_episode_steps=12))
    np.testing.assert_array_equal(model.learner.policy_weights(), weights)
    assert (model.replay.inserted, model.updates, model.num_timesteps) == (inserted, updates, 500)
    episodes = model.episodes
    with pytest.warns(UserWarning, match="schedules"):
        model.learn(300, reset_num_timesteps=False)
    assert model.num_timesteps == 800 and model.updates > updates and model.replay.inserted == inserted + 300
    new = model.episodes - episodes
    assert new >= 300 // 12 and max(list(model.recent_returns)[-new:]) <= 12  # the new env's episodes
    for env, message in (("Acrobot-v1", "env: Acrobot-v1 has the observation_space Box"),
                         ("MountainCarContinuous-v0", "env: MountainCarContinuous-v0 has actions Box.*DQN needs Discrete"),
                         (ThreeActions, r"env: pearl/ThreeActions-v\d+ has the action_space Discrete\(3\), "
                                        r"this agent's is Discrete\(2\)"),
                         (gym.make_vec("CartPole-v1", num_envs=2), "env: 2 envs, but this agent steps 1")):
        with pytest.raises(ConfigError, match=message):
            model.set_env(env)


@pytest.mark.slow  # CI's slow suite installs SB3 (`.[bench]`)
def test_pearls_dummy_vec_env_steps_as_sb3s():
    """The same envs, seeds and actions through SB3's DummyVecEnv and PEARL's: the same observations,
    rewards, dones and terminal observations, auto-resets and time limits included."""
    pytest.importorskip("stable_baselines3")
    from stable_baselines3.common.vec_env import DummyVecEnv as SB3DummyVecEnv

    from pearl.sb3 import DummyVecEnv

    make = [lambda: gym.make("CartPole-v1", max_episode_steps=15), lambda: gym.make("CartPole-v1")]
    ours, theirs = DummyVecEnv(make), SB3DummyVecEnv(make)
    ours.seed(7), theirs.seed(7)
    np.testing.assert_array_equal(ours.reset(), theirs.reset())
    actions = np.random.default_rng(0).integers(0, 2, (300, 2))
    for step in actions:
        mine, sb3 = ours.step(step), theirs.step(step)
        for got, want in zip(mine[:3], sb3[:3]):
            np.testing.assert_array_equal(got, want)
        for got, want in zip(mine[3], sb3[3]):
            assert got.keys() == want.keys()
            if "terminal_observation" in want:
                np.testing.assert_array_equal(got["terminal_observation"], want["terminal_observation"])
                assert got["TimeLimit.truncated"] == want["TimeLimit.truncated"]


def test_save_and_load_the_sb3_way(tmp_path):
    model = pearl.DQN("MlpPolicy", "CartPole-v1", **SMALL).learn(300)
    model.save(tmp_path / "m")
    assert (tmp_path / "m.npz").is_file()
    loaded = pearl.DQN.load(tmp_path / "m", env=gym.make("CartPole-v1"))
    obs = np.linspace(-0.1, 0.1, 4)
    assert loaded.num_timesteps == 300 and loaded.predict(obs, deterministic=True)[0] == \
        model.predict(obs, deterministic=True)[0]
    with pytest.raises(ConfigError, match="a DQN checkpoint, not SAC"):
        pearl.SAC.load(tmp_path / "m")


SB3_STYLE = {  # SB3 constructor arguments, none at its default
    "dqn": dict(learning_rate=3e-4, buffer_size=5000, learning_starts=50, batch_size=64, tau=0.5, gamma=0.98,
                target_update_interval=500, exploration_fraction=0.2, exploration_initial_eps=0.9,
                exploration_final_eps=0.02, max_grad_norm=5.0, seed=3),
    "td3": dict(learning_rate=2e-3, buffer_size=6000, learning_starts=60, batch_size=128, tau=0.01, gamma=0.97,
                policy_delay=3, target_policy_noise=0.3, target_noise_clip=0.4, seed=4),
    "sac": dict(learning_rate=1e-3, buffer_size=7000, learning_starts=70, batch_size=64, tau=0.02, gamma=0.95, seed=5),
}


@pytest.mark.parametrize("algo", sorted(SB3_STYLE))
def test_sb3_hyperparameter_attributes_read_the_config(algo):
    env = "CartPole-v1" if algo == "dqn" else "Pendulum-v1"
    model = getattr(pearl, algo.upper())("MlpPolicy", env, **SB3_STYLE[algo])
    for name, value in SB3_STYLE[algo].items():
        assert getattr(model, name) == value, name
    probe = gym.make(env)
    assert model.observation_space == probe.observation_space and model.action_space == probe.action_space
    if algo == "dqn":
        assert model.exploration_rate == 1.0  # before learning_starts: uniformly random actions
        model.learn(300)
        assert model.exploration_rate == pytest.approx(0.02)  # decayed over the first 0.2 x 300 steps
    absent = {"dqn": ["policy_delay", "target_noise_clip"], "td3": ["exploration_rate", "max_grad_norm"],
              "sac": ["exploration_rate", "target_update_interval", "policy_delay"]}
    for name in absent[algo]:
        with pytest.raises(AttributeError, match=f"object has no attribute '{name}'"):
            getattr(model, name)


@pytest.mark.slow  # CI's slow suite installs SB3 (`.[bench]`)
@pytest.mark.parametrize("algo", sorted(SB3_STYLE))
def test_sb3_hyperparameter_attributes_match_sb3s_own(algo):
    """Stable-Baselines3's model, built from the same arguments: its attributes are PEARL's."""
    sb3 = pytest.importorskip("stable_baselines3")
    from pearl.sb3 import HYPERPARAMETERS

    env = "CartPole-v1" if algo == "dqn" else "Pendulum-v1"
    theirs = getattr(sb3, algo.upper())("MlpPolicy", env, **SB3_STYLE[algo])
    ours = getattr(pearl, algo.upper())("MlpPolicy", env, **SB3_STYLE[algo])
    answered = [name for name in HYPERPARAMETERS if hasattr(ours, name)]
    assert set(answered) >= SB3_STYLE[algo].keys()
    for name in answered:
        assert getattr(ours, name) == getattr(theirs, name), name
    assert ours.observation_space == theirs.observation_space and ours.action_space == theirs.action_space


def test_get_set_parameters_and_the_replay_buffer(tmp_path):
    source = pearl.DQN("MlpPolicy", "CartPole-v1", **SMALL).learn(400)
    target = pearl.DQN("MlpPolicy", "CartPole-v1", **{**SMALL, "seed": 1})
    assert not np.array_equal(target.learner.policy_weights(), source.learner.policy_weights())
    params = source.get_parameters()
    target.set_parameters(params)
    np.testing.assert_array_equal(target.learner.policy_weights(), source.learner.policy_weights())
    obs = np.random.default_rng(0).normal(size=(32, 4))
    np.testing.assert_array_equal(target.predict(obs, deterministic=True)[0], source.predict(obs, deterministic=True)[0])
    kept = source.learner.policy_weights().copy()
    with pytest.warns(UserWarning, match="schedules"):
        source.learn(100, reset_num_timesteps=False)  # get_parameters gave a copy: training on leaves it
    third = pearl.DQN("MlpPolicy", "CartPole-v1", **{**SMALL, "seed": 2})
    third.set_parameters(params)
    np.testing.assert_array_equal(third.learner.policy_weights(), kept)
    source.save(tmp_path / "model")
    third.set_parameters(tmp_path / "model")  # a saved agent's learner; its replay stays out
    np.testing.assert_array_equal(third.learner.policy_weights(), source.learner.policy_weights())
    assert third.replay.inserted == 0

    source.save_replay_buffer(tmp_path / "buffer")
    assert (tmp_path / "buffer.npz").is_file()
    for path in (tmp_path / "buffer", tmp_path / "model.npz"):  # agent.save's file holds the contents too
        fresh = pearl.DQN("MlpPolicy", "CartPole-v1", **{**SMALL, "seed": 3})
        fresh.load_replay_buffer(path)
        mine, theirs = fresh.replay.state_dict(), source.replay.state_dict()
        assert fresh.replay.inserted == source.replay.inserted == 500
        for name in ("obs", "actions", "rewards", "next_obs", "discounts"):
            np.testing.assert_array_equal(mine["storage"][name], theirs["storage"][name])
        fresh.learn(200)  # and trains from them

    narrow = pearl.DQN("MlpPolicy", "CartPole-v1", **{**SMALL, "policy_kwargs": dict(net_arch=[16])})
    for call, message in ((lambda: narrow.set_parameters(params), r"parameters: learner\..*expected float32"),
                          (lambda: narrow.set_parameters(tmp_path / "buffer"), "buffer.npz: holds no learner state"),
                          (lambda: narrow.set_parameters({"policy": {}}), r"expected get_parameters\(\)'s dict"),
                          (lambda: narrow.set_parameters(params, exact_match=False), "exact_match: PEARL sets"),
                          (lambda: pearl.SAC("MlpPolicy", "Pendulum-v1").load_replay_buffer(tmp_path / "buffer"),
                           r"buffer.npz: replay\..*expected"),
                          (lambda: narrow.load_replay_buffer(tmp_path / "nothing"), "nothing: no such checkpoint file")):
        with pytest.raises(PearlError, match=message):
            call()


class Recorder(BaseCallback):
    def __init__(self):
        super().__init__()
        self.events, self.steps = [], []

    def _on_training_start(self):
        self.events.append("start")

    def _on_rollout_end(self):
        self.events.append("rollout_end")

    def _on_step(self):
        self.steps.append((self.n_calls, self.num_timesteps))
        return True

    def _on_training_end(self):
        self.events.append("end")


def test_callbacks_are_called_per_vector_step_in_the_sequential_runtime():
    recorder = Recorder()
    model = pearl.DQN("MlpPolicy", "CartPole-v1", train_freq=16, gradient_steps=8, **SMALL)
    model.learn(480, callback=recorder)
    assert recorder.steps == [(i, i) for i in range(1, 481)]  # SB3's: one call per env step
    assert recorder.events[0] == "start" and recorder.events[-1] == "end"
    assert recorder.events.count("rollout_end") == 480 // 16
    assert recorder.model is model


def test_callbacks_run_once_per_round_in_the_processes_runtime(tmp_path):
    recorder = Recorder()
    # the actor processes' rounds (not the learner's own actor, which may act the whole short run
    # while the processes start)
    model = pearl.DQN("MlpPolicy", "CartPole-v1", plan=Plan(runtime="processes", actors=2, act_while_actors_start=False),
                      **SMALL)
    evaluation = EvalCallback(gym.make("CartPole-v1"), eval_freq=600, n_eval_episodes=2, log_path=str(tmp_path),
                              verbose=0)
    model.learn(3000, callback=CallbackList([recorder, evaluation]))
    assert model.n_envs == 2
    calls = [n for n, _ in recorder.steps]
    assert calls == sorted(calls) and calls[-1] == model.num_timesteps // 2  # vector steps of 2 envs
    assert len(recorder.steps) < model.num_timesteps  # rounds, not env steps
    # an evaluation at each crossing of 600 vector steps (1200 env steps), at round granularity
    assert len(evaluation.evaluations_timesteps) == model.num_timesteps // 1200
    saved = np.load(tmp_path / "evaluations.npz")
    assert saved["results"].shape == (model.num_timesteps // 1200, 2)


def test_stopping_callbacks_and_plain_functions(tmp_path):
    model = pearl.DQN("MlpPolicy", "CartPole-v1", **SMALL)
    model.learn(5000, callback=StopTrainingOnMaxEpisodes(max_episodes=3))
    assert model.episodes == 3 and model.num_timesteps < 5000
    seen = []

    def stop_at_100(locals_, globals_):
        seen.append(locals_["self"].num_timesteps)
        return locals_["self"].num_timesteps < 100

    model = pearl.DQN("MlpPolicy", "CartPole-v1", **SMALL).learn(1000, callback=stop_at_100)
    assert model.num_timesteps == 100 and seen[-1] == 100
    saver = CheckpointCallback(save_freq=250, save_path=str(tmp_path / "ck"), name_prefix="dqn")
    model = pearl.DQN("MlpPolicy", "CartPole-v1", **SMALL).learn(
        1000, callback=[saver, EveryNTimesteps(400, StopTrainingOnMaxEpisodes(10**6))])
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == \
        [f"dqn_{n}_steps.npz" for n in (1000, 250, 500, 750)]
    assert pearl.DQN.load(tmp_path / "ck" / "dqn_500_steps.npz").num_timesteps == 500
    threshold = StopTrainingOnRewardThreshold(reward_threshold=-1e9)  # any evaluation reaches it
    model = pearl.DQN("MlpPolicy", "CartPole-v1", **SMALL).learn(
        2000, callback=EvalCallback("CartPole-v1", callback_on_new_best=threshold, eval_freq=300,
                                    n_eval_episodes=1, verbose=0))
    assert model.num_timesteps == 300


def test_checkpoint_callback_saves_models_as_sb3_does_and_the_buffer_beside(tmp_path):
    """Model files without the replay contents (SB3's model files hold no buffer); with
    save_replay_buffer the buffer beside under SB3's name. SB3's way back: load the model, then its
    buffer: training goes on at once, at the ratio (a model alone refills learning_starts first)."""
    from pearl.checkpoint import load_checkpoint

    saver = CheckpointCallback(save_freq=400, save_path=str(tmp_path), name_prefix="dqn", save_replay_buffer=True)
    model = pearl.DQN("MlpPolicy", "CartPole-v1", **SMALL).learn(800, callback=saver)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dqn_400_steps.npz", "dqn_800_steps.npz",
                                                         "dqn_replay_buffer_400_steps.npz",
                                                         "dqn_replay_buffer_800_steps.npz"]
    header, arrays = load_checkpoint(tmp_path / "dqn_800_steps.npz")
    assert "replay" not in header and not any(name.startswith("replay.") for name in arrays)
    assert (tmp_path / "dqn_800_steps.npz").stat().st_size < (tmp_path / "dqn_replay_buffer_800_steps.npz").stat().st_size
    resumed = pearl.DQN.load(tmp_path / "dqn_800_steps.npz")
    resumed.load_replay_buffer(tmp_path / "dqn_replay_buffer_800_steps.npz")
    assert resumed.replay.inserted == 800 and resumed.updates == model.updates == (800 - 100) // 4
    with pytest.warns(UserWarning, match="schedules"):
        resumed.learn(200, reset_num_timesteps=False)
    assert resumed.updates == model.updates + 200 // 4  # at once
    alone = pearl.DQN.load(tmp_path / "dqn_800_steps.npz")
    with pytest.warns(UserWarning, match="schedules"):
        alone.learn(200, reset_num_timesteps=False)
    assert alone.updates == model.updates + (200 - 100) // 4 and alone.replay.inserted == 200


def test_threaded_runtime_pauses_the_learner_for_an_evaluation():
    model = pearl.DQN("MlpPolicy", "CartPole-v1", plan=Plan(runtime="threaded"), **SMALL)
    evaluation = EvalCallback(gym.make("CartPole-v1"), eval_freq=250, n_eval_episodes=1, verbose=0)
    model.learn(1000, callback=evaluation)
    assert evaluation.evaluations_timesteps == [250, 500, 750, 1000]
    assert model.updates == model.parts.schedule.due(1000)
