"""QPolicy (numpy inference, kernels/cpu/mlp.py) against the PyTorch QNetwork it mirrors."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pearl.algos.dqn import DQN
from pearl.config import DQNConfig
from pearl.kernels.cpu import MLPLayout, QPolicy


def build(obs_dim, hidden, n_actions, dueling, seed=0):
    cfg = DQNConfig(hidden=list(hidden), dueling=dueling)
    algo = DQN(obs_dim, n_actions, cfg, total_steps=10, seed=seed)
    if dueling:
        layout = MLPLayout([obs_dim, *hidden], dueling_actions=n_actions)
    else:
        layout = MLPLayout([obs_dim, *hidden, n_actions])
    policy = QPolicy(layout)
    policy.load(DQN.flat_weights(algo.online))
    return algo, policy


def torch_q(algo, obs):
    with torch.no_grad():
        return algo.online(torch.from_numpy(obs)).numpy()


def check_against_torch(algo, policy, obs):
    expected = torch_q(algo, obs)
    q = policy.q_values(obs)
    assert q.shape == expected.shape
    assert q.dtype == np.float32
    np.testing.assert_allclose(q, expected, rtol=1e-5, atol=1e-6)
    # greedy == torch argmax wherever the best action is not a float32 near-tie
    top2 = np.sort(expected, axis=-1)[..., -2:] if expected.shape[-1] > 1 else None
    clear = np.ones(expected.shape[:-1], bool) if top2 is None else (top2[..., 1] - top2[..., 0]) > 1e-4
    greedy = policy.greedy(obs)
    np.testing.assert_array_equal(greedy[clear], expected.argmax(axis=-1)[clear])
    if obs.ndim == 2:  # the actor's in-place form, row by row as a one-env actor calls it
        into = np.full(len(obs), -1, np.int64)
        for i in range(len(obs)):
            policy.greedy_into(obs[i:i + 1], into[i:i + 1])
        np.testing.assert_array_equal(into[clear], expected.argmax(axis=-1)[clear])
    return q


@pytest.mark.parametrize("dueling", [False, True], ids=["plain", "dueling"])
@pytest.mark.parametrize("hidden", [[64, 64], [8], [32, 16, 8]])
def test_q_values_match_qnetwork(dueling, hidden):
    algo, policy = build(4, hidden, 3, dueling, seed=len(hidden))
    assert policy.layout.size == algo.n_params()
    assert policy.layout.dueling == dueling
    obs = np.random.default_rng(0).standard_normal((257, 4)).astype(np.float32)
    check_against_torch(algo, policy, obs)


@pytest.mark.parametrize("dueling", [False, True], ids=["plain", "dueling"])
def test_single_observation(dueling):
    algo, policy = build(6, [16], 4, dueling, seed=3)
    obs = np.random.default_rng(1).standard_normal((1, 6)).astype(np.float32)
    expected = torch_q(algo, obs)
    np.testing.assert_allclose(policy.q_values(obs), expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(policy.q_values(obs[0]), expected[0], rtol=1e-5, atol=1e-6)
    assert int(policy.greedy(obs[0])) == int(expected[0].argmax())


def test_dueling_head_is_mean_centred():
    """Q(s, a) - mean_a Q(s, a) equals the centred advantage; mean_a Q(s, a) equals V(s)."""
    algo, policy = build(5, [12, 12], 4, dueling=True, seed=2)
    obs = np.random.default_rng(2).standard_normal((50, 5)).astype(np.float32)
    with torch.no_grad():
        h = algo.online.trunk(torch.from_numpy(obs))
        value = algo.online.value(h).numpy()[:, 0]
    np.testing.assert_allclose(policy.q_values(obs).mean(axis=1), value, rtol=1e-5, atol=1e-6)


def test_load_copies_and_tracks_new_weights():
    algo, policy = build(4, [16, 16], 2, dueling=False, seed=4)
    flat = DQN.flat_weights(algo.online).copy()
    policy.load(flat)
    flat[:] = 0.0  # the policy holds its own copy
    obs = np.random.default_rng(3).standard_normal((20, 4)).astype(np.float32)
    check_against_torch(algo, policy, obs)

    # New weights (e.g. after learner updates) are picked up by the next load.
    with torch.no_grad():
        for p in algo.online.parameters():
            p.mul_(-1.5).add_(0.01)
    policy.load(DQN.flat_weights(algo.online))
    check_against_torch(algo, policy, obs)


def test_layout_views_follow_torch_parameter_order():
    algo, _ = build(3, [5, 7], 2, dueling=True, seed=0)
    layout = MLPLayout([3, 5, 7], dueling_actions=2)
    flat = DQN.flat_weights(algo.online)
    params = [p.detach().numpy() for p in algo.online.parameters()]
    views = layout.views(flat)
    assert len(views) * 2 == len(params)
    for (weight, bias), w_ref, b_ref in zip(views, params[0::2], params[1::2]):
        np.testing.assert_array_equal(weight, w_ref)
        np.testing.assert_array_equal(bias, b_ref)
    # views write through to the flat vector
    views[0][1][0] = 123.0
    assert 123.0 in flat


@settings(max_examples=15, deadline=None, derandomize=True)
@given(obs_dim=st.integers(1, 10), hidden=st.lists(st.integers(1, 40), min_size=1, max_size=3),
       n_actions=st.integers(1, 6), batch=st.integers(1, 64), dueling=st.booleans(),
       seed=st.integers(0, 1000))
def test_q_values_property(obs_dim, hidden, n_actions, batch, dueling, seed):
    algo, policy = build(obs_dim, hidden, n_actions, dueling, seed=seed)
    assert policy.layout.size == algo.n_params()
    obs = (3 * np.random.default_rng(seed).standard_normal((batch, obs_dim))).astype(np.float32)
    check_against_torch(algo, policy, obs)
