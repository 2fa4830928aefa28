"""The actor's env engines (plan.env_engine): Gymnasium envs in a plain loop (with `env_stepper`
doing what Gymnasium's wrappers' steps do) and EnvPool, whose transitions must be the Gymnasium
engine's: the same dynamics step by step, an ended episode reset at once (not at EnvPool's next
step), the time limit a truncation with the discount kept.

The EnvPool tests are skipped without envpool (`pip install 'pearl-rl[envpool]'`); one test checks
the one-line refusal when it is missing."""
from __future__ import annotations

import importlib.util

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import pearl
from pearl.envs import env_stepper, make_env
from pearl.errors import ConfigError
from pearl.kernels.cpu import MLPLayout, QPolicy
from pearl.plan import Plan
from test_actor import GAMMA, SHORT_ENV, balancing_policy, record

HAS_ENVPOOL = importlib.util.find_spec("envpool") is not None
needs_envpool = pytest.mark.skipif(not HAS_ENVPOOL, reason="envpool is not installed (pip install 'pearl-rl[envpool]')")


@pytest.mark.parametrize("env_id", ["CartPole-v1", SHORT_ENV, "Acrobot-v1", "ALE/Pong-v5"])
def test_env_stepper_steps_as_the_wrappers_do(env_id):
    """Two envs seeded alike, one stepped through `env.step`, one through `env_stepper`: the same
    observations, rewards, terminations and truncations, resets included (an Atari env's chain
    has other wrappers: it keeps env.step)."""
    if env_id.startswith("ALE/") and importlib.util.find_spec("ale_py") is None:
        pytest.skip("ale-py is not installed")
    a, b = make_env(env_id, 3), make_env(env_id, 3)
    step = env_stepper(b)
    assert (step == b.step) == env_id.startswith("ALE/")
    rng = np.random.default_rng(0)
    ends = 0
    for episode in range(3 if env_id != "ALE/Pong-v5" else 1):
        oa, ob = a.reset(seed=episode)[0], b.reset(seed=episode)[0]
        np.testing.assert_array_equal(oa, ob)
        for _ in range(600 if not env_id.startswith("ALE/") else 50):
            action = int(rng.integers(a.action_space.n))
            ra, rb = a.step(action), step(action)
            np.testing.assert_array_equal(ra[0], rb[0])
            assert ra[1:4] == rb[1:4]
            if ra[2] or ra[3]:
                ends += 1
                break
    assert ends or env_id.startswith("ALE/")
    a.close()
    b.close()


@settings(max_examples=300, deadline=None)
@given(n=st.integers(1, 20), start=st.integers(-2**62, 2**62), offset=st.integers(-40, 40),
       kind=st.sampled_from(["int", "int64", "int8", "uint8", "float", "array", "bool"]))
def test_the_actors_discrete_space_answers_as_discrete(n, start, offset, kind):
    """`env_stepper`'s action space (pearl.envs._IntDiscrete) says what gymnasium's Discrete says of
    every value, Python ints near and far from the range and other types alike."""
    from pearl.envs import _IntDiscrete

    reference, fast = gym.spaces.Discrete(n, start=start), gym.spaces.Discrete(n, start=start)
    fast.__class__ = _IntDiscrete
    x = start + offset
    value = {"int": x, "int64": np.int64(min(max(x, -2**63), 2**63 - 1)), "int8": np.int8(offset),
             "uint8": np.uint8(abs(offset)), "float": float(x), "array": np.array([x]), "bool": True}[kind]
    assert fast.contains(value) == reference.contains(value)


def test_env_stepper_keeps_the_envs_action_check():
    env = make_env("CartPole-v1", 0)
    step = env_stepper(env)
    assert type(env.unwrapped.action_space).__name__ == "_IntDiscrete"
    env.reset(seed=0)
    step(1)
    with pytest.raises(AssertionError):
        step(2)
    with pytest.raises(AssertionError):
        step(-1)


def test_plan_refuses_an_unknown_engine():
    with pytest.raises(ConfigError, match=r"^plan.env_engine: expected one of gymnasium, envpool, got 'vectors'$"):
        Plan(env_engine="vectors").check()


@pytest.mark.skipif(HAS_ENVPOOL, reason="envpool is installed: the refusal is for machines without it")
def test_envpool_engine_without_envpool_is_one_line(tmp_path, capsys):
    refusal = r"^plan.env_engine: envpool is not installed \(pip install 'pearl-rl\[envpool\]'\)$"
    with pytest.raises(ConfigError, match=refusal):
        Plan(env_engine="envpool").check()
    from pearl.cli import main

    plan = tmp_path / "plan.yaml"
    plan.write_text("plan: {env_engine: envpool}\n")
    assert main(["train", "--plan", str(plan), "--steps", "200"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "plan.env_engine: envpool is not installed" in err, err


# -- EnvPool -------------------------------------------------------------------------------------
def envpool_actor(n_envs, seed, policy, env_id="CartPole-v1"):
    from pearl.runtime.actor import EnvPoolActor

    return EnvPoolActor(env_id, n_envs, seed, policy, n_actions=2, n_step=1, gamma=GAMMA)


def reference_step(env, state, action):
    """Gymnasium's own step from `state` (the env's dynamics, without its time limit)."""
    core = env.unwrapped
    core.state = np.asarray(state, dtype=np.float64)
    core.steps_beyond_terminated = None
    obs, reward, terminated, _, _ = core.step(action)
    return obs, reward, terminated


@needs_envpool
@pytest.mark.parametrize("n_envs", [1, 4])
@pytest.mark.parametrize("epsilon", [1.0, 0.0])
def test_envpool_transitions_are_gymnasiums(n_envs, epsilon):
    """Every transition of the EnvPool actor, checked against Gymnasium's CartPole stepped from the
    transition's observation with its action: the same next observation (to float32 rounding:
    EnvPool's state is its own), reward and termination; the time limit (500 steps) a truncation
    with discount gamma; after an episode's end the env acts from a fresh start state at once (no
    ignored action), and otherwise from the step's next observation."""
    steps = 1200 if epsilon == 0.0 else 400
    actor = envpool_actor(n_envs, 11, balancing_policy())
    rows = record(actor, steps, epsilon)
    ref = make_env("CartPole-v1", 0)
    ref.reset(seed=0)
    lengths = np.zeros(n_envs, dtype=int)
    returns = np.zeros(n_envs)
    ends = {"terminated": 0, "truncated": 0}
    for t, (acted_on, (obs, actions, rewards, next_obs, discounts), finished) in enumerate(rows):
        np.testing.assert_array_equal(obs, acted_on)
        expected_finished = []
        for i in range(n_envs):
            o, r, terminated = reference_step(ref, obs[i], int(actions[i]))
            np.testing.assert_allclose(next_obs[i], o, rtol=1e-5, atol=1e-5)
            assert rewards[i] == r
            lengths[i] += 1
            returns[i] += r
            truncated = lengths[i] == 500 and not terminated
            assert discounts[i] == (0.0 if terminated else np.float32(GAMMA))
            if terminated or lengths[i] == 500:
                ends["terminated" if terminated else "truncated"] += 1
                expected_finished.append((float(returns[i]), int(lengths[i])))
                lengths[i], returns[i] = 0, 0.0
                if t + 1 < steps:  # a fresh start, acted from at the next step
                    restarted = rows[t + 1][0][i]
                    assert np.all(np.abs(restarted) <= 0.05) and not np.array_equal(restarted, next_obs[i])
            elif t + 1 < steps:
                np.testing.assert_array_equal(rows[t + 1][0][i], next_obs[i])
            assert not truncated or discounts[i] == np.float32(GAMMA)
        assert finished == expected_finished
    assert ends["terminated"] > 0
    if epsilon == 0.0:  # the balancing controller keeps the pole up to the time limit
        assert ends["truncated"] > 0
    actor.close()


@needs_envpool
def test_envpool_actor_acts_greedily_and_reloads_weights():
    policy = balancing_policy()
    actor = envpool_actor(3, 2, policy)
    for acted_on, (_, actions, *_), _ in record(actor, 50, epsilon=0.0):
        np.testing.assert_array_equal(actions, policy.greedy(acted_on))
    actor.close()


@needs_envpool
@pytest.mark.parametrize("runtime", ["sequential", "processes"])
def test_dqn_trains_on_the_envpool_engine(runtime):
    """The engine reaches the actors from the plan (in actor processes too): counts exact, every
    transition inserted once."""
    agent = pearl.DQN("CartPole-v1", total_steps=3000, learning_starts=500, target_update_interval=200,
                      hidden=[32, 32], plan=Plan(runtime=runtime, envs_per_actor=8, env_engine="envpool",
                                                 act_while_actors_start=False))
    agent.train(2000)
    assert agent.env_steps == 2000
    assert agent.updates == agent.parts.schedule.due(agent.env_steps)
    assert agent.replay.inserted == agent.env_steps
    stored = agent.replay.storage["obs"][:agent.replay.inserted]
    assert len(np.unique(stored, axis=0)) == len(stored)
    assert agent.episodes > 0


@needs_envpool
def test_envpool_engine_refuses_what_it_does_not_run():
    with pytest.raises(ConfigError, match=r"^plan.env_engine: envpool steps DQN's discrete-action actors"):
        pearl.DDPG("Pendulum-v1", plan=Plan(env_engine="envpool"))
    from pearl.runtime.actor import EnvPoolActor

    with pytest.raises(ConfigError, match=r"^plan.env_engine: EnvPool has no 'PearlTestCartPoleShort-v0'"):
        EnvPoolActor(SHORT_ENV, 2, 0, QPolicy(MLPLayout([4, 2, 2])), 2, 1, GAMMA)


# -- the estimator and the mapper ----------------------------------------------------------------
def test_estimator_prices_act_per_engine(monkeypatch):
    """Analytic: EnvPool's fixed cost per round makes it dearer at 1 env and cheaper at many (the
    measured shape, docs/BENCHMARKS.md "Actor path"); a profile's act|envpool@cpu table is EnvPool's alone; the
    mapper offers EnvPool only where it has the env, and its plans carry the engine."""
    from pearl.estimator import mapper
    from pearl.estimator.costs import Costs
    from pearl.estimator.model import Candidate
    from pearl.estimator.workload import Workload
    from pearl.platforms import load_platform

    platform = load_platform("ci_2core")
    workload = Workload("CartPole-v1", 4, 2, (64, 64), "uniform", 50_000, 16, 0.25, 1000)
    costs = Costs(platform, workload)

    def act_us(engine, envs, c=costs):
        seconds, _ = c.task_seconds("act", Candidate("uniform", "cpu", "cpu", "fused", envs, 64, env_engine=engine))
        return seconds * 1e6

    assert act_us("envpool", 1) > 2 * act_us("gymnasium", 1)
    assert act_us("envpool", 64) < act_us("gymnasium", 64)
    measured = Costs(platform, workload, {"act|envpool@cpu": {"16": 50.0}, "act@cpu": {"16": 150.0}})
    assert act_us("envpool", 16, measured) == pytest.approx(50.0)
    assert act_us("gymnasium", 16, measured) == pytest.approx(150.0)

    monkeypatch.setattr("pearl.envs.envpool_has", lambda env_id: env_id == "CartPole-v1")
    cands, _ = mapper.candidates(platform, workload, envs=(1, 16))
    assert {c.env_engine for c in cands} == {"gymnasium", "envpool"}
    assert all(c.to_plan().env_engine == c.env_engine for c in cands)
    # a profile that timed Gymnasium's act but not EnvPool's: no measured-vs-analytic comparison
    assert mapper.env_engines(workload, {"act@cpu": {"1": 9.0}}) == ("gymnasium",)
    both = {"act@cpu": {"1": 9.0}, "act|envpool@cpu": {"1": 70.0}}
    assert mapper.env_engines(workload, both) == ("gymnasium", "envpool")
    monkeypatch.setattr("pearl.envs.envpool_has", lambda env_id: False)
    assert {c.env_engine for c in mapper.candidates(platform, workload, envs=(1, 16))[0]} == {"gymnasium"}
