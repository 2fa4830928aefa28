"""Replay storage (ring buffer), uniform sampling, and prioritized replay on the sum tree, against
plain float64 numpy references."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pearl.config import ReplayConfig
from pearl.kernels.cpu import SumTree
from pearl.replay import PrioritizedReplay, UniformReplay, make_replay
from sumtree_reference import away_from_boundaries, reference_find

OBS_DIM = 3


def transitions(start, count, obs_dim=OBS_DIM):
    """`count` distinguishable transitions numbered from `start`."""
    ids = np.arange(start, start + count)
    obs = (ids[:, None] * 10 + np.arange(obs_dim)).astype(np.float32)
    return (obs, ids % 4, ids.astype(np.float32), obs + 0.5,
            np.where(ids % 5 == 0, 0.0, 0.99).astype(np.float32))


def stored_ids(replay):
    """Which transition number sits in each slot (rewards carry the number)."""
    return replay.storage["rewards"][:replay.size].astype(np.int64)


def check_rows(replay, indices, batch_fields):
    for name in ("obs", "actions", "rewards", "next_obs", "discounts"):
        np.testing.assert_array_equal(batch_fields[name], replay.storage[name][indices])


# -- uniform replay: the ring --------------------------------------------------------------------
def test_ring_buffer_counters_and_overwrite_oldest():
    replay = UniformReplay(capacity=5, obs_dim=OBS_DIM)
    assert len(replay) == 0 and replay.cursor == 0 and replay.inserted == 0
    for i in range(7):
        slots = replay.add(*transitions(i, 1))
        np.testing.assert_array_equal(slots, [i % 5])
        assert replay.inserted == i + 1
        assert replay.size == len(replay) == min(i + 1, 5)
        assert replay.cursor == (i + 1) % 5
    # transitions 0 and 1 (the oldest) were overwritten by 5 and 6
    np.testing.assert_array_equal(stored_ids(replay), [5, 6, 2, 3, 4])
    obs, actions, rewards, next_obs, discounts = transitions(5, 1)
    np.testing.assert_array_equal(replay.storage["obs"][0], obs[0])
    np.testing.assert_array_equal(replay.storage["next_obs"][0], next_obs[0])
    assert replay.storage["actions"][0] == actions[0]
    assert replay.storage["discounts"][0] == discounts[0]


def test_add_batch_that_wraps():
    replay = UniformReplay(capacity=5, obs_dim=OBS_DIM)
    np.testing.assert_array_equal(replay.add(*transitions(0, 3)), [0, 1, 2])
    assert (replay.cursor, replay.size, replay.inserted) == (3, 3, 3)
    slots = replay.add(*transitions(3, 4))  # slots 3, 4, then wraps to 0, 1
    np.testing.assert_array_equal(slots, [3, 4, 0, 1])
    assert (replay.cursor, replay.size, replay.inserted) == (2, 5, 7)
    np.testing.assert_array_equal(stored_ids(replay), [5, 6, 2, 3, 4])
    for slot, tid in zip(range(5), [5, 6, 2, 3, 4]):
        np.testing.assert_array_equal(replay.storage["obs"][slot], transitions(tid, 1)[0][0])


def test_actor_transitions_take_the_compiled_insert():
    """What the n-step buffer hands the replay (float32 observations from the actor, int64 actions,
    float32 returns and discounts) matches the rows' dtypes, so `add` takes the compiled row copy
    (kernels/cpu/fast_storage.py) rather than numpy's casting assignment."""
    from pearl.replay.nstep import NStepBuffer

    buffer = NStepBuffer(3, 0.99, n_envs=2, obs_dim=4)
    replay = UniformReplay(10, obs_dim=4)
    obs = np.zeros((2, 4), np.float32)
    no = np.zeros(2, bool)
    emitted = 0
    for t in range(6):
        next_obs = np.full((2, 4), t + 1, np.float32)
        transitions = buffer.step(obs, np.array([t, t]), np.ones(2, np.float32), next_obs, no,
                                  np.array([False, t == 4]))
        if transitions is not None:
            assert replay._ring._as_rows(len(transitions[2]), transitions)
            replay.add(*transitions)
            emitted += len(transitions[2])
        obs = next_obs
    # env 0 emits one per step at t = 2..5; env 1 at t = 2, 3, then flushes its 3 pending at t = 4
    assert emitted == len(replay) == 4 + 5
    np.testing.assert_array_equal(replay.storage["actions"][:2], [0, 0])


def test_add_batch_that_ends_exactly_at_capacity():
    replay = UniformReplay(capacity=4, obs_dim=OBS_DIM)
    replay.add(*transitions(0, 1))
    np.testing.assert_array_equal(replay.add(*transitions(1, 3)), [1, 2, 3])
    assert (replay.cursor, replay.size, replay.inserted) == (0, 4, 4)
    np.testing.assert_array_equal(replay.add(*transitions(4, 2)), [0, 1])
    np.testing.assert_array_equal(stored_ids(replay), [4, 5, 2, 3])


@settings(max_examples=40, deadline=None, derandomize=True)
@given(capacity=st.integers(1, 12), counts=st.lists(st.integers(1, 9), min_size=1, max_size=12))
def test_ring_matches_reference_list(capacity, counts):
    """Against a reference that appends every transition and keeps the newest `capacity`."""
    replay = UniformReplay(capacity=capacity, obs_dim=OBS_DIM)
    inserted = 0
    for count in counts:
        count = min(count, capacity)  # a single add of more than capacity is not a use case
        slots = replay.add(*transitions(inserted, count))
        np.testing.assert_array_equal(slots, (inserted + np.arange(count)) % capacity)
        inserted += count
        assert replay.inserted == inserted
        assert replay.size == min(inserted, capacity)
        assert replay.cursor == inserted % capacity
        newest = range(max(0, inserted - capacity), inserted)
        assert sorted(stored_ids(replay)) == list(newest)
        for tid in newest:
            assert replay.storage["rewards"][tid % capacity] == tid


def test_uniform_sample_only_returns_stored_indices():
    replay = UniformReplay(capacity=100, obs_dim=OBS_DIM)
    replay.add(*transitions(0, 7))
    rng = np.random.default_rng(0)
    seen = set()
    for _ in range(50):
        batch = replay.sample(32, rng)
        assert batch.indices.dtype == np.int64
        assert batch.indices.min() >= 0 and batch.indices.max() < 7
        assert batch.weights is None
        check_rows(replay, batch.indices, vars(batch))
        seen.update(batch.indices.tolist())
    assert seen == set(range(7))


def test_uniform_sample_frequencies_are_uniform():
    replay = UniformReplay(capacity=10, obs_dim=OBS_DIM)
    replay.add(*transitions(0, 13))  # full, wrapped
    rng = np.random.default_rng(1)
    counts = np.zeros(10)
    for _ in range(200):
        np.add.at(counts, replay.sample(100, rng).indices, 1)
    expected = np.full(10, counts.sum() / 10)
    assert chisquare_pvalue(counts, expected) > 1e-3


def test_gather_returns_matching_rows():
    replay = UniformReplay(capacity=8, obs_dim=OBS_DIM)
    replay.add(*transitions(0, 8))
    indices = np.array([7, 0, 3, 3, 5])
    out = replay.gather(indices)
    check_rows(replay, indices, out)
    assert out["obs"].dtype == np.float32 and out["actions"].dtype == np.int64
    # a different index set of the same length reuses (and rewrites) the same buffers
    again = replay.gather(np.array([1, 1, 1, 1, 1]))
    check_rows(replay, np.array([1, 1, 1, 1, 1]), again)


def test_uniform_state_dict_round_trip():
    replay = UniformReplay(capacity=6, obs_dim=OBS_DIM)
    replay.add(*transitions(0, 4))
    replay.add(*transitions(4, 5))  # wraps: cursor 3
    state = replay.state_dict()
    restored = UniformReplay(capacity=6, obs_dim=OBS_DIM)
    restored.load_state_dict(state)
    assert (restored.cursor, restored.size, restored.inserted) == (3, 6, 9)
    for name in replay.storage:
        np.testing.assert_array_equal(restored.storage[name], replay.storage[name])
    a, b = replay.sample(16, np.random.default_rng(5)), restored.sample(16, np.random.default_rng(5))
    np.testing.assert_array_equal(a.indices, b.indices)
    np.testing.assert_array_equal(a.obs, b.obs)
    np.testing.assert_array_equal(replay.add(*transitions(9, 1)), restored.add(*transitions(9, 1)))

    partial = UniformReplay(capacity=6, obs_dim=OBS_DIM)
    partial.add(*transitions(0, 2))
    fresh = UniformReplay(capacity=6, obs_dim=OBS_DIM)
    fresh.load_state_dict(partial.state_dict())
    assert (fresh.cursor, fresh.size, fresh.inserted) == (2, 2, 2)
    np.testing.assert_array_equal(stored_ids(fresh), [0, 1])


# -- the sum tree ---------------------------------------------------------------------------------
def check_tree_invariants(tree, reference):
    np.testing.assert_array_equal(tree.get(np.arange(tree.capacity)), reference)
    assert not tree.leaves[tree.capacity:].any()  # padding leaves stay empty
    k = tree.fanout
    # each internal node is recomputed from its children, exactly
    for level in range(tree.depth):
        children = tree.sums[level + 1].reshape(-1, k)
        np.testing.assert_array_equal(tree.sums[level], children.sum(axis=1))
        np.testing.assert_array_equal(tree.mins[level], tree.mins[level + 1].reshape(-1, k).min(axis=1))
    positive = np.asarray(reference)[np.asarray(reference) > 0]
    assert tree.min() == (positive.min() if positive.size else np.inf)
    assert tree.total == pytest.approx(float(np.sum(reference)), rel=1e-12, abs=1e-300)


priority_lists = st.lists(
    st.one_of(st.just(0.0), st.floats(1e-6, 100.0, allow_nan=False, allow_infinity=False)),
    min_size=1, max_size=70).filter(lambda ps: sum(ps) > 0)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(priorities=priority_lists, seed=st.integers(0, 2**32 - 1), fanout=st.sampled_from([2, 3, 4, 16]))
def test_sumtree_find_matches_cumsum_searchsorted(priorities, seed, fanout):
    tree = SumTree(len(priorities), fanout)
    tree.update(np.arange(len(priorities)), np.array(priorities))
    check_tree_invariants(tree, np.array(priorities))
    total = tree.total
    prefixes = np.random.default_rng(seed).random(200) * total
    prefixes = np.concatenate((prefixes, [0.0, np.nextafter(total, 0.0)]))
    found = tree.find(prefixes)
    # always a stored leaf with positive priority, whatever the rounding
    assert found.min() >= 0 and found.max() < len(priorities)
    assert (np.asarray(priorities)[found] > 0).all()
    keep = away_from_boundaries(priorities, prefixes)
    np.testing.assert_array_equal(found[keep], reference_find(priorities, prefixes[keep]))


@settings(max_examples=30, deadline=None, derandomize=True)
@given(priorities=st.lists(st.integers(0, 20), min_size=1, max_size=40).filter(any),
       fanout=st.sampled_from([2, 4, 8]))
def test_sumtree_exact_bracket_boundaries_with_integer_priorities(priorities, fanout):
    """Integer priorities make every partial sum exact, so [c_{j-1}, c_j) holds exactly,
    boundaries included: a prefix equal to c_j belongs to the next leaf with mass."""
    tree = SumTree(len(priorities), fanout)
    tree.update(np.arange(len(priorities)), np.array(priorities, dtype=np.float64))
    cum = np.cumsum(priorities)
    prefixes = np.unique(np.concatenate(([0], cum[cum < cum[-1]], cum[cum < cum[-1]] - 0.5,
                                         [cum[-1] - 0.5]))).astype(np.float64)
    prefixes = prefixes[prefixes >= 0]
    np.testing.assert_array_equal(tree.find(prefixes), reference_find(priorities, prefixes))


@settings(max_examples=40, deadline=None, derandomize=True)
@given(capacity=st.integers(1, 40), fanout=st.sampled_from([2, 4, 16]), data=st.data())
def test_sumtree_updates_with_duplicates_last_wins(capacity, fanout, data):
    tree = SumTree(capacity, fanout)
    reference = np.zeros(capacity)
    for _ in range(data.draw(st.integers(1, 6))):
        indices = data.draw(st.lists(st.integers(0, capacity - 1), min_size=1, max_size=2 * capacity))
        values = data.draw(st.lists(st.floats(0.0, 50.0), min_size=len(indices),
                                    max_size=len(indices)))
        tree.update(np.array(indices), np.array(values))
        for i, v in zip(indices, values):  # sequential semantics: the last write wins
            reference[i] = v
        check_tree_invariants(tree, reference)


def test_sumtree_duplicate_update_and_total():
    tree = SumTree(6, fanout=2)
    tree.update(np.arange(6), np.ones(6))
    assert tree.total == 6.0
    tree.update(np.array([2, 4, 2, 2]), np.array([10.0, 3.0, 7.0, 0.5]))
    np.testing.assert_array_equal(tree.get(np.arange(6)), [1, 1, 0.5, 1, 3, 1])
    assert tree.total == 7.5
    assert len(tree.leaves) == 8
    np.testing.assert_array_equal(tree.find(np.array([0.0, 2.2, 2.6, 4.0, 7.4])), [0, 2, 3, 4, 5])


def test_sumtree_capacity_one():
    tree = SumTree(1)
    tree.update(np.array([0]), np.array([2.5]))
    assert tree.total == 2.5
    np.testing.assert_array_equal(tree.find(np.array([0.0, 1.0, 2.4])), [0, 0, 0])


# -- prioritized replay ---------------------------------------------------------------------------
def chisquare_pvalue(observed, expected):
    """scipy.stats.chisquare's p-value; without scipy, the Wilson-Hilferty approximation."""
    observed, expected = np.asarray(observed, float), np.asarray(expected, float)
    try:
        from scipy.stats import chisquare
    except ImportError:
        stat = float(((observed - expected) ** 2 / expected).sum())
        k = len(observed) - 1
        z = ((stat / k) ** (1 / 3) - (1 - 2 / (9 * k))) / math.sqrt(2 / (9 * k))
        return 0.5 * math.erfc(z / math.sqrt(2))
    return float(chisquare(observed, expected).pvalue)


def per(capacity=16, alpha=0.6, beta=0.4, beta_final=1.0, beta_steps=100, eps=1e-6):
    return PrioritizedReplay(capacity=capacity, obs_dim=OBS_DIM, alpha=alpha, beta=beta,
                             beta_final=beta_final, beta_steps=beta_steps, priority_eps=eps)


def test_new_transitions_get_max_priority():
    replay = per(capacity=8, alpha=0.6, eps=1e-6)
    replay.add(*transitions(0, 3))
    np.testing.assert_array_equal(replay.tree.get(np.arange(3)), [1.0, 1.0, 1.0])
    replay.update_priorities(np.array([0, 1]), np.array([-4.0, 0.5]))  # |TD| is what counts
    assert replay.max_priority == pytest.approx(4.0 + 1e-6, rel=1e-15)
    replay.add(*transitions(3, 2))
    expected = np.array([4.0, 0.5, 1.0, 4.0, 4.0]) + np.array([1e-6, 1e-6, 0.0, 1e-6, 1e-6])
    np.testing.assert_allclose(replay.tree.get(np.arange(5)), expected ** 0.6, rtol=1e-12)
    assert replay.tree.min() == pytest.approx(float((expected ** 0.6).min()), rel=1e-12)
    assert replay.tree.total == pytest.approx(float((expected ** 0.6).sum()), rel=1e-12)
    # small TD errors do not lower the maximum
    replay.update_priorities(np.array([3]), np.array([0.01]))
    assert replay.max_priority == pytest.approx(4.0 + 1e-6, rel=1e-15)
    replay.add(*transitions(5, 1))
    assert replay.tree.get(np.array([5]))[0] == pytest.approx((4.0 + 1e-6) ** 0.6, rel=1e-12)


def test_update_priorities_duplicates_last_wins_and_totals():
    replay = per(capacity=8, alpha=0.5, eps=0.0)
    replay.add(*transitions(0, 8))
    replay.update_priorities(np.arange(8), np.arange(1.0, 9.0))
    replay.update_priorities(np.array([2, 5, 2]), np.array([100.0, 9.0, 16.0]))
    expected = np.sqrt(np.array([1, 2, 16, 4, 5, 9, 7, 8], dtype=np.float64))
    np.testing.assert_allclose(replay.tree.get(np.arange(8)), expected, rtol=1e-15)
    assert replay.tree.min() == pytest.approx(expected.min(), rel=1e-15)
    assert replay.tree.total == pytest.approx(expected.sum(), rel=1e-14)
    check_tree_invariants(replay.tree, replay.tree.get(np.arange(8)))


def test_prioritized_sample_only_stored_indices_and_rows_match():
    replay = per(capacity=64)
    replay.add(*transitions(0, 10))
    replay.update_priorities(np.arange(10), np.linspace(0.1, 3.0, 10))
    rng = np.random.default_rng(3)
    for _ in range(30):
        batch = replay.sample(32, rng)
        assert batch.indices.min() >= 0 and batch.indices.max() < 10
        # stratified: one draw per equal slice of mass, so indices come out in order
        assert (np.diff(batch.indices) >= 0).all()
        check_rows(replay, batch.indices, vars(batch))
        assert batch.weights.dtype == np.float32 and batch.weights.shape == (32,)


def reference_weights(priorities, alpha, beta, indices):
    scaled = np.asarray(priorities, np.float64) ** alpha
    probs = scaled / scaled.sum()
    n = len(priorities)
    w = (n * probs) ** -beta
    return w[indices] / w.max()  # the largest weight is the minimum priority's


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0])
def test_importance_weights(alpha):
    capacity, size = 32, 20
    replay = per(capacity=capacity, alpha=alpha, beta=0.4, beta_final=1.0, beta_steps=1000)
    replay.add(*transitions(0, size))
    rng = np.random.default_rng(7)
    td = rng.uniform(0.0, 5.0, size)
    replay.update_priorities(np.arange(size), td)
    priorities = np.abs(td) + replay.priority_eps
    for progress in (0, 250, 1000, 5000):
        replay.progress = progress
        beta = replay.beta
        batch = replay.sample(64, rng)
        expected = reference_weights(priorities, alpha, beta, batch.indices)
        np.testing.assert_allclose(batch.weights, expected, rtol=1e-5, atol=0)
        assert batch.weights.max() <= 1.0 + 1e-6
        if alpha == 0.0:
            np.testing.assert_allclose(batch.weights, 1.0, rtol=1e-6)


def test_beta_anneals_linearly_with_progress():
    replay = per(beta=0.4, beta_final=1.0, beta_steps=200)
    assert replay.progress == 0 and replay.beta == pytest.approx(0.4)
    for progress, beta in [(50, 0.55), (100, 0.7), (200, 1.0), (10_000, 1.0)]:
        replay.progress = progress
        assert replay.beta == pytest.approx(beta, rel=1e-12)
    down = per(beta=0.8, beta_final=0.2, beta_steps=10)
    down.progress = 5
    assert down.beta == pytest.approx(0.5)


def test_make_replay_builds_what_the_config_asks_for():
    uniform = make_replay(ReplayConfig(kind="uniform", capacity=10), obs_dim=4)
    assert isinstance(uniform, UniformReplay) and not uniform.prioritized
    cfg = ReplayConfig(kind="prioritized", capacity=10, alpha=0.7, beta=0.5, beta_final=0.9,
                       priority_eps=1e-3)
    prioritized = make_replay(cfg, obs_dim=4, total_steps=300)
    assert isinstance(prioritized, PrioritizedReplay) and prioritized.prioritized
    assert (prioritized.alpha, prioritized.beta0, prioritized.beta_final) == (0.7, 0.5, 0.9)
    assert (prioritized.beta_steps, prioritized.priority_eps) == (300, 1e-3)
    assert prioritized.storage["obs"].shape == (10, 4)


def test_sampling_frequencies_match_priorities_chisquare():
    capacity, alpha = 16, 0.6
    replay = per(capacity=capacity, alpha=alpha)
    replay.add(*transitions(0, capacity))
    rng = np.random.default_rng(12345)
    td = rng.uniform(0.05, 5.0, capacity)
    replay.update_priorities(np.arange(capacity), td)
    scaled = (td + replay.priority_eps) ** alpha
    probs = scaled / scaled.sum()

    # Independent draws (batch of one: a single uniform over the whole mass).
    n = 10_000
    counts = np.zeros(capacity)
    for _ in range(n):
        counts[replay.sample(1, rng).indices[0]] += 1
    assert chisquare_pvalue(counts, n * probs) > 1e-3

    # Stratified batches: the same marginal frequencies (and less variance than i.i.d.).
    counts[:] = 0
    batches, batch_size = 1_000, 64
    for _ in range(batches):
        np.add.at(counts, replay.sample(batch_size, rng).indices, 1)
    assert chisquare_pvalue(counts, batches * batch_size * probs) > 1e-3

    # Sanity: the test has power — the wrong exponent is rejected.
    wrong = td ** 1.0 / (td ** 1.0).sum()
    assert chisquare_pvalue(counts, batches * batch_size * wrong) < 1e-6


def test_prioritized_state_dict_round_trip():
    replay = per(capacity=12, alpha=0.6, beta=0.4, beta_steps=100)
    replay.add(*transitions(0, 9))
    replay.update_priorities(np.arange(9), np.linspace(0.2, 6.0, 9))
    replay.add(*transitions(9, 5))  # wraps, new items at max priority
    replay.progress = 37
    state = replay.state_dict()

    restored = per(capacity=12, alpha=0.6, beta=0.4, beta_steps=100)
    restored.load_state_dict(state)
    assert (restored.cursor, restored.size, restored.inserted) == (2, 12, 14)
    assert restored.max_priority == replay.max_priority
    assert restored.progress == 37 and restored.beta == replay.beta
    for mine, theirs in zip(restored.tree.sums + restored.tree.mins, replay.tree.sums + replay.tree.mins):
        np.testing.assert_array_equal(mine, theirs)
    for name in replay.storage:
        np.testing.assert_array_equal(restored.storage[name], replay.storage[name])
    a = replay.sample(32, np.random.default_rng(9))
    b = restored.sample(32, np.random.default_rng(9))
    np.testing.assert_array_equal(a.indices, b.indices)
    np.testing.assert_array_equal(a.weights, b.weights)
    np.testing.assert_array_equal(a.obs, b.obs)
    # both continue identically
    for r in (replay, restored):
        r.update_priorities(np.array([3, 4]), np.array([10.0, 0.1]))
        r.add(*transitions(14, 1))
    for mine, theirs in zip(restored.tree.sums, replay.tree.sums):
        np.testing.assert_array_equal(mine, theirs)


def test_prioritized_state_dict_round_trip_partially_filled():
    replay = per(capacity=10)
    replay.add(*transitions(0, 4))
    replay.update_priorities(np.array([1]), np.array([3.0]))
    restored = per(capacity=10)
    restored.load_state_dict(replay.state_dict())
    assert restored.size == 4 and restored.cursor == 4
    for mine, theirs in zip(restored.tree.sums, replay.tree.sums):
        np.testing.assert_array_equal(mine, theirs)
    batch = restored.sample(64, np.random.default_rng(0))
    assert batch.indices.max() < 4


def test_prioritized_load_replaces_previous_contents():
    source = PrioritizedReplay(capacity=64, obs_dim=2)
    source.add(np.ones((5, 2), np.float32), np.zeros(5, np.int64), np.ones(5, np.float32),
               np.ones((5, 2), np.float32), np.ones(5, np.float32))
    target = PrioritizedReplay(capacity=64, obs_dim=2)
    target.add(np.zeros((40, 2), np.float32), np.zeros(40, np.int64), np.zeros(40, np.float32),
               np.zeros((40, 2), np.float32), np.zeros(40, np.float32))
    target.load_state_dict(source.state_dict())
    batch = target.sample(256, np.random.default_rng(0))
    assert batch.indices.max() < 5 and target.tree.total == pytest.approx(source.tree.total)


@pytest.mark.parametrize("replay_class", [UniformReplay, PrioritizedReplay])
def test_sampling_an_empty_replay_is_an_error(replay_class):
    with pytest.raises(ValueError, match="empty replay"):
        replay_class(capacity=8, obs_dim=2).sample(4, np.random.default_rng(0))


@pytest.mark.parametrize("capacity, fanout", [(50, 4), (1000, 16)])
def test_fused_compiled_sample_matches_the_numpy_reference_path(capacity, fanout):
    """The one-call sampler (descent + weights + gather, kernels/cpu/fast_per.py) returns what the
    numpy tree, numpy weights and numpy indexing return, across wrap-around and updates."""
    compiled = PrioritizedReplay(capacity, 3, backend="numba", fanout=fanout, beta_steps=100)
    reference = PrioritizedReplay(capacity, 3, backend="numpy", fanout=fanout, beta_steps=100)
    rng = np.random.default_rng(capacity)
    inserted = 0
    for step in range(12):
        count = int(rng.integers(1, capacity // 3))
        for replay in (compiled, reference):
            replay.add(*transitions(inserted, count))
            replay.progress = 10 * step
        inserted += count
        seed = int(rng.integers(1 << 30))
        got = compiled.sample(64, np.random.default_rng(seed))
        want = reference.sample(64, np.random.default_rng(seed))
        np.testing.assert_array_equal(got.indices, want.indices)
        np.testing.assert_allclose(got.weights, want.weights, rtol=1e-6)
        for name in ("obs", "actions", "rewards", "next_obs", "discounts"):
            np.testing.assert_array_equal(getattr(got, name), getattr(want, name))
        td = rng.exponential(size=64) * (rng.random(64) < 0.9)
        compiled.update_priorities(got.indices, td)
        reference.update_priorities(want.indices, td)


def test_amper_replay_sample_is_the_samplers_draw_with_its_own_weights():
    """AMPER through the replay's one-call path (kernels/cpu/fast_per.py): the AmperSampler's own
    draw, weights (q_i / q_min)^-beta from the probabilities it really samples with, and the rows."""
    replay = PrioritizedReplay(40, 3, backend="amper", beta=0.5, beta_steps=1)
    replay.add(*transitions(0, 55))  # wraps
    rng = np.random.default_rng(11)
    replay.update_priorities(np.arange(40), rng.exponential(size=40))
    for seed in range(5):
        batch = replay.sample(32, np.random.default_rng(seed))
        uniforms = np.random.default_rng(seed).random(32)
        indices, q = replay.tree.sample_with_probabilities(uniforms)
        np.testing.assert_array_equal(batch.indices, indices)
        expected = (q / replay.tree.min_probability()) ** -replay.beta
        np.testing.assert_allclose(batch.weights, expected.astype(np.float32), rtol=1e-6)
        check_rows(replay, batch.indices, vars(batch))
    with pytest.raises(ValueError, match="empty"):
        PrioritizedReplay(8, 3, backend="amper").sample(4, rng)


# -- copies --------------------------------------------------------------------------------------
def _frame_table(kind, n_step):
    from pearl.replay import FrameReplay

    table = FrameReplay(256, (3, 3), 2, kind=kind, n_step=n_step, gamma=0.9)
    rng = np.random.default_rng(0)
    for t in range(150):
        table.add([0], rng.integers(0, 255, (1, 2, 3, 3), dtype=np.uint8), [t % 3], [float(t)],
                  rng.integers(0, 255, (1, 2, 3, 3), dtype=np.uint8), [t % 40 == 39], [False])
    return table


def _vector_table(factory):
    table = factory()
    table.add(*transitions(0, 150))
    return table


COPIED_TABLES = {
    "uniform": lambda: _vector_table(lambda: UniformReplay(200, OBS_DIM)),
    "prioritized": lambda: _vector_table(lambda: PrioritizedReplay(200, OBS_DIM)),
    "prioritized-numpy": lambda: _vector_table(lambda: PrioritizedReplay(200, OBS_DIM, backend="numpy")),
    "amper": lambda: _vector_table(lambda: PrioritizedReplay(200, OBS_DIM, backend="amper")),
    "frames": lambda: _frame_table("uniform", 1),  # obs and next obs: views of one window buffer
    "frames-prioritized": lambda: _frame_table("prioritized", 3),
}
BATCH_FIELDS = ("obs", "actions", "rewards", "next_obs", "discounts", "indices", "weights")


@pytest.mark.parametrize("how", ["pickle", "deepcopy"])
@pytest.mark.parametrize("table", list(COPIED_TABLES))
def test_a_copied_table_samples_as_the_original_and_is_its_own(table, how):
    """A copy's fields, batch outputs and bound kernels are its own views of its own arrays: it
    samples the original's batches, and what is added to one is not in the other. (Copies of
    numpy views are arrays of their own: a copy that kept the views' objects sampled stale rows.)"""
    import copy
    import pickle

    original = COPIED_TABLES[table]()
    original.sample(16, np.random.default_rng(1))  # binds the batch outputs and kernels first
    twin = pickle.loads(pickle.dumps(original)) if how == "pickle" else copy.deepcopy(original)
    for _ in range(3):
        a, b = original.sample(16, np.random.default_rng(2)), twin.sample(16, np.random.default_rng(2))
        for field in BATCH_FIELDS:
            np.testing.assert_array_equal(getattr(a, field), getattr(b, field), err_msg=field)
        if original.prioritized:
            original.update_priorities(a.indices, np.linspace(0.1, 3.0, 16))
            twin.update_priorities(b.indices, np.linspace(0.1, 3.0, 16))
    if table.startswith("frames"):
        return
    twin.add(*transitions(1000, 60))  # overwrites the oldest slots of the copy only
    assert set(stored_ids(original)) == set(range(150))
    assert set(stored_ids(twin)) == set(range(10, 150)) | set(range(1000, 1060))
    drawn = twin.sample(64, np.random.default_rng(3))
    np.testing.assert_array_equal(drawn.rewards, twin.storage["rewards"][drawn.indices])
