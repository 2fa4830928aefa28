"""NStepAccumulator against a direct computation of n-step returns over a whole episode."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pearl.replay import NStepAccumulator


def reference(observations, actions, rewards, n, gamma, terminated):
    """Every transition of an episode of T steps, computed directly.

    observations has T + 1 entries (the last is the final observation). The transition from step t
    looks k = min(n, T - t) steps ahead: R = sum_{i<k} gamma^i r_{t+i}, next_obs = observations[t+k],
    discount gamma^k, or 0 when the window reaches a termination.
    """
    steps = len(rewards)
    out = []
    for t in range(steps):
        k = min(n, steps - t)
        ret = sum(gamma ** i * rewards[t + i] for i in range(k))
        reaches_end = t + k == steps
        discount = 0.0 if (terminated and reaches_end) else gamma ** k
        out.append((observations[t], actions[t], ret, observations[t + k], discount))
    return out


def run_episode(acc, observations, actions, rewards, terminated, truncated):
    """Feeds an episode; returns every emitted transition with the step that emitted it."""
    emitted = []
    steps = len(rewards)
    for t in range(steps):
        last = t == steps - 1
        for tr in acc.step(observations[t], actions[t], rewards[t], observations[t + 1],
                           terminated and last, truncated and last):
            emitted.append((t, tr))
    return emitted


def assert_transitions_equal(actual, expected):
    assert len(actual) == len(expected)
    for (obs, action, ret, next_obs, discount), (e_obs, e_action, e_ret, e_next, e_disc) in zip(
            actual, expected):
        np.testing.assert_array_equal(obs, e_obs)
        assert action == e_action
        assert ret == pytest.approx(e_ret, rel=1e-12, abs=1e-12)
        np.testing.assert_array_equal(next_obs, e_next)
        assert discount == pytest.approx(e_disc, rel=1e-12, abs=0.0)
        if e_disc == 0.0:
            assert discount == 0.0


def episode(steps, seed=0):
    rng = np.random.default_rng(seed)
    observations = [np.array([t, -t], dtype=np.float32) for t in range(steps + 1)]
    actions = [int(a) for a in rng.integers(0, 3, steps)]
    rewards = [float(r) for r in rng.integers(-5, 6, steps)]
    return observations, actions, rewards


def test_hand_built_episode_n1():
    acc = NStepAccumulator(1, 0.9)
    assert acc.step("s0", 0, 1.0, "s1", False, False) == [("s0", 0, 1.0, "s1", 0.9)]
    assert acc.step("s1", 1, 2.0, "s2", False, False) == [("s1", 1, 2.0, "s2", 0.9)]
    assert acc.step("s2", 0, 3.0, "s3", True, False) == [("s2", 0, 3.0, "s3", 0.0)]
    assert not acc.pending
    # truncation with n = 1 keeps the one-step discount
    assert acc.step("s0", 1, -1.0, "s1", False, True) == [("s0", 1, -1.0, "s1", 0.9)]


def test_hand_built_episode_n3_terminated():
    g = 0.5
    acc = NStepAccumulator(3, g)
    assert acc.step("s0", 0, 1.0, "s1", False, False) == []
    assert acc.step("s1", 1, 2.0, "s2", False, False) == []
    out = acc.step("s2", 2, 4.0, "s3", False, False)
    assert out == [("s0", 0, 1.0 + g * 2.0 + g * g * 4.0, "s3", g ** 3)]
    out = acc.step("s3", 0, 8.0, "s4", False, False)
    assert out == [("s1", 1, 2.0 + g * 4.0 + g * g * 8.0, "s4", g ** 3)]
    # termination: every pending transition is flushed, none bootstraps
    out = acc.step("s4", 1, 16.0, "s5", True, False)
    assert out == [
        ("s2", 2, 4.0 + g * 8.0 + g * g * 16.0, "s5", 0.0),
        ("s3", 0, 8.0 + g * 16.0, "s5", 0.0),
        ("s4", 1, 16.0, "s5", 0.0),
    ]
    assert not acc.pending


def test_hand_built_episode_n3_truncated():
    g = 0.5
    acc = NStepAccumulator(3, g)
    acc.step("s0", 0, 1.0, "s1", False, False)
    out = acc.step("s1", 1, 2.0, "s2", False, True)
    # time limit: flushed, and each keeps gamma^k to bootstrap from the last observation
    assert out == [("s0", 0, 1.0 + g * 2.0, "s2", g ** 2), ("s1", 1, 2.0, "s2", g)]
    assert not acc.pending


def test_episode_shorter_than_n():
    acc = NStepAccumulator(5, 0.9)
    out = acc.step("s0", 3, 1.5, "s1", True, False)
    assert out == [("s0", 3, 1.5, "s1", 0.0)]


@pytest.mark.parametrize("n", [1, 2, 3, 5])
@pytest.mark.parametrize("end", ["terminated", "truncated"])
@pytest.mark.parametrize("steps", [1, 2, 3, 4, 10])
def test_matches_reference(n, end, steps):
    gamma = 0.9
    observations, actions, rewards = episode(steps, seed=steps * 10 + n)
    acc = NStepAccumulator(n, gamma)
    emitted = run_episode(acc, observations, actions, rewards, end == "terminated",
                          end == "truncated")
    expected = reference(observations, actions, rewards, n, gamma, end == "terminated")
    assert_transitions_equal([tr for _, tr in emitted], expected)
    # transition t is emitted as soon as it is complete: at step t + n - 1, or at the end
    for i, (t_emit, _) in enumerate(emitted):
        assert t_emit == min(i + n - 1, steps - 1)
    assert not acc.pending


def test_consecutive_episodes_do_not_leak():
    gamma = 0.8
    acc = NStepAccumulator(3, gamma)
    got, want = [], []
    for k, (steps, terminated) in enumerate([(5, True), (2, False), (7, True), (4, False)]):
        observations, actions, rewards = episode(steps, seed=k)
        got += [tr for _, tr in run_episode(acc, observations, actions, rewards, terminated,
                                            not terminated)]
        want += reference(observations, actions, rewards, 3, gamma, terminated)
    assert_transitions_equal(got, want)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(n=st.integers(1, 6), gamma=st.floats(0.0, 1.0),
       rewards=st.lists(st.floats(-10, 10, allow_nan=False), min_size=1, max_size=15),
       terminated=st.booleans())
def test_property(n, gamma, rewards, terminated):
    steps = len(rewards)
    observations = [np.array([t], dtype=np.float64) for t in range(steps + 1)]
    actions = list(range(steps))
    acc = NStepAccumulator(n, gamma)
    emitted = run_episode(acc, observations, actions, rewards, terminated, not terminated)
    assert_transitions_equal([tr for _, tr in emitted],
                             reference(observations, actions, rewards, n, gamma, terminated))


@settings(max_examples=60, deadline=None, derandomize=True)
@given(n=st.integers(1, 5), n_envs=st.integers(1, 4), seed=st.integers(0, 2**31 - 1))
def test_vectorised_buffer_matches_one_accumulator_per_env(n, n_envs, seed):
    from pearl.replay import NStepBuffer

    rng = np.random.default_rng(seed)
    gamma = 0.9
    buffer = NStepBuffer(n, gamma, n_envs, obs_dim=2)
    references = [NStepAccumulator(n, gamma) for _ in range(n_envs)]
    obs = rng.normal(size=(n_envs, 2)).astype(np.float32)
    for _ in range(60):
        actions = rng.integers(0, 3, n_envs)
        rewards = rng.normal(size=n_envs).astype(np.float32)
        next_obs = rng.normal(size=(n_envs, 2)).astype(np.float32)
        ends = rng.random(n_envs)
        terminated, truncated = ends < 0.1, (ends >= 0.1) & (ends < 0.15)
        got = buffer.step(obs, actions, rewards, next_obs, terminated, truncated)
        expected = []
        for i, ref in enumerate(references):
            expected += ref.step(obs[i].copy(), int(actions[i]), float(rewards[i]), next_obs[i].copy(),
                                 bool(terminated[i]), bool(truncated[i]))
        if not expected:
            assert got is None
        else:
            e_obs, e_act, e_ret, e_next, e_disc = (np.array(x) for x in zip(*expected))
            np.testing.assert_array_equal(got[0], e_obs)
            np.testing.assert_array_equal(got[1], e_act)
            np.testing.assert_allclose(got[2], e_ret, rtol=1e-5, atol=1e-6)
            np.testing.assert_array_equal(got[3], e_next)
            np.testing.assert_allclose(got[4], e_disc, rtol=1e-6)
        obs = next_obs
