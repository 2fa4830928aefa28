"""The Actor on CartPole-v1: transitions replayed against independent reference environments,
episode bookkeeping, exploration, and n-step output.

Actor.step returns its own buffers, reused on the next step: everything is copied on receipt.
"""
from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from pearl.envs import make_env
from pearl.kernels.cpu import MLPLayout, QPolicy
from pearl.runtime.actor import Actor

ENV = "CartPole-v1"
GAMMA = 0.9
SHORT_ENV = "PearlTestCartPoleShort-v0"  # CartPole with a 15-step time limit: truncations
if SHORT_ENV not in gym.registry:
    gym.register(id=SHORT_ENV, entry_point="gymnasium.envs.classic_control.cartpole:CartPoleEnv",
                 max_episode_steps=15)


def balancing_policy() -> QPolicy:
    """A 4-2-2 ReLU net whose greedy action is 1 iff pole angle + angular velocity > 0: the
    classic hand-made CartPole controller (keeps the pole up, and its greedy action varies)."""
    policy = QPolicy(MLPLayout([4, 2, 2]))
    (w1, b1), (w2, b2) = policy.layout.views(policy.flat)
    w1[:] = [[0, 0, 1, 1], [0, 0, -1, -1]]
    b1[:] = 0
    w2[:] = [[0, 1], [1, 0]]  # Q(left) = relu(-s), Q(right) = relu(s)
    b2[:] = 0
    return policy


def record(actor, steps, epsilon):
    """Copies of everything each step returns, and the observation each step acted on."""
    rows = []
    for _ in range(steps):
        acted_on = actor.obs.copy()
        transitions, finished = actor.step(epsilon)
        copied = None if transitions is None else tuple(np.array(x, copy=True) for x in transitions)
        rows.append((acted_on, copied, list(finished)))
    return rows


@pytest.mark.parametrize("n_envs", [1, 3])
@pytest.mark.parametrize("env_id", [ENV, SHORT_ENV])
def test_transitions_match_reference_envs(n_envs, env_id):
    seed = 17
    actor = Actor(env_id, n_envs, seed, balancing_policy(), n_actions=2, n_step=1, gamma=GAMMA)
    steps = 300
    rows = record(actor, steps, epsilon=0.7)

    refs = [make_env(env_id, seed + i) for i in range(n_envs)]
    current = [env.reset(seed=seed + i)[0] for i, env in enumerate(refs)]
    returns = np.zeros(n_envs)
    lengths = np.zeros(n_envs, dtype=int)
    counts = {"terminated": 0, "truncated": 0}
    for t, (acted_on, (obs, actions, rewards, next_obs, discounts), finished) in enumerate(rows):
        assert obs.shape == (n_envs, 4) and obs.dtype == np.float32
        assert next_obs.shape == (n_envs, 4) and next_obs.dtype == np.float32
        assert discounts.dtype == np.float32 and rewards.shape == actions.shape == (n_envs,)
        np.testing.assert_array_equal(obs, acted_on)
        expected_finished = []
        for i, env in enumerate(refs):
            np.testing.assert_array_equal(obs[i], current[i])
            o, r, terminated, truncated, _ = env.step(int(actions[i]))
            np.testing.assert_array_equal(next_obs[i], np.float32(o))
            assert rewards[i] == r
            # discount 0 exactly at termination; gamma otherwise, truncation included
            assert discounts[i] == (0.0 if terminated else np.float32(GAMMA))
            returns[i] += r
            lengths[i] += 1
            if terminated or truncated:
                counts["terminated" if terminated else "truncated"] += 1
                expected_finished.append((returns[i], lengths[i]))
                returns[i], lengths[i] = 0.0, 0
                current[i] = env.reset()[0]  # the actor must restart from a fresh reset
                # ... which is a new start state, not the terminal observation
                if t + 1 < steps:
                    next_acted_on = rows[t + 1][0][i]
                    assert not np.array_equal(next_acted_on, next_obs[i])
                    assert np.all(np.abs(next_acted_on) <= 0.05)
            else:
                current[i] = o
                if t + 1 < steps:  # next_obs of a non-final step is the next step's obs
                    np.testing.assert_array_equal(rows[t + 1][0][i], next_obs[i])
        assert [(float(r), int(n)) for r, n in expected_finished] == finished
    assert counts["terminated"] > 0
    if env_id == SHORT_ENV:
        assert counts["truncated"] > 0
    actor.close()


def test_truncation_keeps_discount_and_restarts():
    """With the balancing policy the pole stays up, so every episode of the 15-step env ends by
    truncation: discount gamma at the last step, next_obs the real last observation."""
    actor = Actor(SHORT_ENV, 2, 3, balancing_policy(), n_actions=2, n_step=1, gamma=GAMMA)
    rows = record(actor, 45, epsilon=0.0)
    for t, (_, (obs, actions, rewards, next_obs, discounts), finished) in enumerate(rows):
        np.testing.assert_array_equal(discounts, np.float32(GAMMA))
        if (t + 1) % 15 == 0:
            assert finished == [(15.0, 15), (15.0, 15)]
            if t + 1 < len(rows):
                restarted = rows[t + 1][0]
                assert not np.array_equal(restarted, next_obs)
        else:
            assert finished == []
    actor.close()


@pytest.mark.parametrize("n_envs", [1, 3])
def test_epsilon_one_explores_both_actions(n_envs):
    policy = balancing_policy()
    actor = Actor(ENV, n_envs, 5, policy, n_actions=2, n_step=1, gamma=GAMMA)
    rows = record(actor, 200, epsilon=1.0)
    actions = np.concatenate([tr[1] for _, tr, _ in rows])
    greedy = np.concatenate([policy.greedy(acted_on) for acted_on, _, _ in rows])
    assert set(actions.tolist()) == {0, 1}
    assert 0.35 < actions.mean() < 0.65
    assert 0.3 < (actions != greedy).mean() < 0.7  # ignores the policy
    actor.close()


@pytest.mark.parametrize("n_envs", [1, 3])
def test_epsilon_zero_follows_greedy_policy(n_envs):
    policy = balancing_policy()
    actor = Actor(ENV, n_envs, 8, policy, n_actions=2, n_step=1, gamma=GAMMA)
    rows = record(actor, 200, epsilon=0.0)
    all_actions = []
    for acted_on, (obs, actions, *_), _ in rows:
        np.testing.assert_array_equal(actions, policy.greedy(acted_on))
        all_actions.append(actions)
    assert set(np.concatenate(all_actions).tolist()) == {0, 1}
    actor.close()


def test_policy_weights_reloaded_take_effect():
    policy = balancing_policy()
    actor = Actor(ENV, 2, 1, policy, n_actions=2, n_step=1, gamma=GAMMA)
    flipped = policy.flat.copy()
    layers = MLPLayout([4, 2, 2]).views(flipped)
    layers[1][0][:] = layers[1][0][::-1].copy()  # swap the output rows: the opposite controller
    policy.load(flipped)
    for acted_on, (obs, actions, *_), _ in record(actor, 30, epsilon=0.0):
        s = acted_on[:, 2] + acted_on[:, 3]
        np.testing.assert_array_equal(actions[s != 0], (s < 0)[s != 0].astype(np.int64))
    actor.close()


def nstep_reference(env_rows, n, gamma):
    """n-step transitions of one env's 1-step stream, each with the step that completes it."""
    out = []
    start = 0
    for end in range(len(env_rows)):
        terminated, truncated = env_rows[end][5], env_rows[end][6]
        if not (terminated or truncated):
            continue
        for t in range(start, end + 1):
            k = min(n, end + 1 - t)
            ret = sum(gamma ** i * env_rows[t + i][2] for i in range(k))
            discount = 0.0 if terminated and t + k == end + 1 else gamma ** k
            out.append((t + k - 1 if t + k <= end else end, (env_rows[t][0], env_rows[t][1], ret,
                                                               env_rows[t + k - 1][3], discount)))
        start = end + 1
    for t in range(start, len(env_rows) - n + 1):  # an unfinished episode: full windows only
        ret = sum(gamma ** i * env_rows[t + i][2] for i in range(n))
        out.append((t + n - 1, (env_rows[t][0], env_rows[t][1], ret, env_rows[t + n - 1][3],
                                gamma ** n)))
    return out


@pytest.mark.parametrize("n_envs", [1, 3])
def test_nstep_actor_matches_reference_from_one_step_stream(n_envs):
    """An n_step=3 actor and an n_step=1 actor with the same seed see the same steps (epsilon=1:
    the same random actions); the n-step output must be the reference n-step returns of it."""
    seed, n, steps = 4, 3, 150
    one = Actor(SHORT_ENV, n_envs, seed, balancing_policy(), 2, n_step=1, gamma=GAMMA)
    multi = Actor(SHORT_ENV, n_envs, seed, balancing_policy(), 2, n_step=n, gamma=GAMMA)
    one_rows = record(one, steps, epsilon=1.0)
    multi_rows = record(multi, steps, epsilon=1.0)

    # Per env: (obs, action, reward, next_obs, discount, terminated, truncated) of each step.
    env_rows = [[] for _ in range(n_envs)]
    for t, (_, (obs, actions, rewards, next_obs, discounts), finished) in enumerate(one_rows):
        for i in range(n_envs):
            ended = t + 1 < steps and not np.array_equal(one_rows[t + 1][0][i], next_obs[i])
            terminated = discounts[i] == 0.0
            env_rows[i].append((obs[i], int(actions[i]), float(rewards[i]), next_obs[i],
                                float(discounts[i]), terminated, ended and not terminated))
    flags = [(row[5], row[6]) for rows in env_rows for row in rows]
    assert any(term for term, _ in flags) and any(trunc for _, trunc in flags)
    expected_by_step = [[] for _ in range(steps)]
    for i in range(n_envs):
        for t_emit, tr in nstep_reference(env_rows[i], n, GAMMA):
            expected_by_step[t_emit].append(tr)
    # Within a step the actor emits env 0's transitions first, then env 1's, ...: so does this.

    emitted_any = False
    for t, ((acted_on, got, finished), (_, _, one_finished)) in enumerate(zip(multi_rows, one_rows)):
        assert finished == one_finished
        if t == steps - 1:
            break  # whether an episode ended at the very last step is not known here
        expected = expected_by_step[t]
        if not expected:
            assert got is None
            continue
        emitted_any = True
        obs, actions, rets, next_obs, discounts = got
        assert len(rets) == len(expected)
        assert rets.dtype == np.float32 and discounts.dtype == np.float32
        for j, (e_obs, e_action, e_ret, e_next, e_disc) in enumerate(expected):
            np.testing.assert_array_equal(obs[j], e_obs)
            assert actions[j] == e_action
            assert rets[j] == pytest.approx(e_ret, rel=1e-6)
            np.testing.assert_array_equal(next_obs[j], e_next)
            assert discounts[j] == pytest.approx(e_disc, rel=1e-6)
            if e_disc == 0.0:
                assert discounts[j] == 0.0
    assert emitted_any
    one.close()
    multi.close()
