"""Stable-Baselines3's train_freq / gradient_steps bursts: `gradient_steps` updates every
`train_freq` env steps (not an even ratio), in every runtime, exact at the end; bad values refused
in one line; the estimator costs their average."""
import math

import pytest
from hypothesis import given, settings, strategies as st

import pearl
from pearl.cli import main
from pearl.config import ExperimentConfig, apply_overrides, parse_config
from pearl.errors import ConfigError
from pearl.plan import Plan
from pearl.runtime import RUNTIMES, get
from pearl.schedule import Schedule, burst_updates_due, updates_due

FAST = dict(total_steps=4000, learning_starts=300, target_update_interval=200, hidden=[32, 32], batch_size=32)


def sb3_updates(env_steps: int, learning_starts: int, train_freq: int, gradient_steps: int) -> int:
    """SB3's off-policy loop, step by step: a rollout of train_freq steps, then, once
    num_timesteps > learning_starts, gradient_steps updates."""
    updates = 0
    for t in range(1, env_steps + 1):
        if t % train_freq == 0 and t > learning_starts:
            updates += gradient_steps
    return updates


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 3000), st.integers(0, 500), st.integers(1, 64), st.integers(1, 16))
def test_burst_count_is_sb3s_loop(env_steps, learning_starts, train_freq, gradient_steps):
    assert burst_updates_due(env_steps, learning_starts, train_freq, gradient_steps) == \
        sb3_updates(env_steps, learning_starts, train_freq, gradient_steps)


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 3000), st.integers(0, 500), st.integers(1, 8))
def test_train_freq_one_is_the_even_schedule(env_steps, learning_starts, gradient_steps):
    bursts = Schedule(learning_starts, float(gradient_steps), 32, train_freq=1, gradient_steps=gradient_steps)
    assert bursts.due(env_steps) == updates_due(env_steps, learning_starts, gradient_steps)


def test_config_sets_the_average_ratio_and_the_schedule_bursts():
    agent = pearl.DQN("CartPole-v1", **FAST, train_freq=16, gradient_steps=8)
    assert agent.config.dqn.updates_per_step == 0.5
    schedule = agent.parts.schedule
    assert (schedule.train_freq, schedule.gradient_steps) == (16, 8)
    seen = []
    agent.train(1000, on_round=lambda a: seen.append((a.env_steps, a.updates)))
    # updates move only at multiples of 16 past learning_starts, 8 at a time
    for (s0, u0), (s1, u1) in zip(seen, seen[1:]):
        assert u1 - u0 == (8 if s1 % 16 == 0 and s1 > 300 else 0), (s0, s1, u0, u1)
    assert agent.updates == 8 * (1000 // 16 - 300 // 16)


@pytest.mark.parametrize("name", RUNTIMES)
def test_bursts_keep_the_ratio_exact_in_every_runtime(name):
    actors, envs = (2, 2) if name == "processes" else (1, 1)
    agent = pearl.DQN("CartPole-v1", plan=Plan(runtime=name, actors=actors, envs_per_actor=envs),
                      **FAST, train_freq=16, gradient_steps=8)
    due = agent.parts.schedule.due
    lags = []
    agent.train(2500, on_round=lambda a: lags.append(due(a.env_steps) - a.updates))
    assert agent.updates == due(agent.env_steps) == 8 * (agent.env_steps // 16 - 300 // 16)
    assert lags and min(lags) >= 0, "the learner ran ahead of the bursts"
    assert max(lags) <= get(name).max_lag + 8 * math.ceil(actors * envs * 2500 / 16)
    assert agent.replay.inserted == agent.env_steps


def test_bursts_with_a_continuous_algorithm():
    agent = pearl.TD3("Pendulum-v1", total_steps=1000, learning_starts=100, hidden=[16, 16], batch_size=32,
                      train_freq=5, gradient_steps=3)
    agent.train(400)
    assert agent.updates == 3 * (400 // 5 - 100 // 5)


def test_estimator_costs_the_bursts_average():
    from pearl.estimator.workload import workload_from_config

    config = parse_config({"dqn": {"train_freq": 16, "gradient_steps": 8}})
    assert workload_from_config(config).updates_per_step == 0.5
    # a dumped config (every key) reads back the same: its updates_per_step agrees with the bursts
    assert parse_config(config.to_dict()).dqn.updates_per_step == 0.5
    # new bursts given as overrides set the ratio afresh
    assert apply_overrides(config, {"dqn.train_freq": 4}).dqn.updates_per_step == 2.0


@pytest.mark.parametrize("section,message", [
    ({"train_freq": 0}, "dqn.train_freq: expected an integer >= 1, got 0"),
    ({"train_freq": 4, "gradient_steps": 0}, "dqn.gradient_steps: expected an integer >= 1, got 0"),
    ({"train_freq": 4, "gradient_steps": -1}, "dqn.gradient_steps: expected an integer >= 1, got -1"),
    ({"gradient_steps": 8}, "dqn.gradient_steps: needs dqn.train_freq"),
    ({"train_freq": 1.5}, "dqn.train_freq: expected an integer, got 1.5"),
    ({"train_freq": "4"}, "dqn.train_freq: expected an integer, got '4'"),
    ({"train_freq": 16, "gradient_steps": 8, "updates_per_step": 0.25},
     "dqn.updates_per_step: 0.25 disagrees with dqn.gradient_steps / dqn.train_freq = 8 / 16"),
])
def test_bad_burst_values_refused_in_one_line(section, message):
    with pytest.raises(ConfigError) as err:
        parse_config({"dqn": section})
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_bad_bursts_from_the_cli(tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text("sac:\n  train_freq: 0\nalgo: sac\nenv: Pendulum-v1\n")
    assert main(["train", str(config), "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [err] and "sac.train_freq: expected an integer >= 1, got 0" in err
    assert not (tmp_path / "run").exists()


def test_default_config_is_unchanged():
    assert ExperimentConfig().dqn.train_freq is None and ExperimentConfig().dqn.updates_per_step == 0.25
