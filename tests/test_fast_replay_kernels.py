"""The numba replay kernels (kernels/cpu/fast_sumtree.py, fast_storage.py) against the numpy
reference sum tree, a float64 cumsum/searchsorted reference and plain numpy storage."""
from __future__ import annotations

import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pearl.kernels.cpu import fast_storage as fs
from pearl.kernels.cpu.fast_sumtree import NumbaSumTree
from pearl.kernels.cpu.sumtree import SumTree
from sumtree_reference import away_from_boundaries, check_last_write_wins, reference_find


def assert_same_tree(fast, ref):
    """Every level of both trees bit-identical (same summation order), totals and min too."""
    assert (fast.capacity, fast.fanout, fast.depth) == (ref.capacity, ref.fanout, ref.depth)
    assert len(fast.sums) == len(ref.sums)
    for a, b in zip(fast.sums, ref.sums):
        assert a.tobytes() == b.tobytes()
    for a, b in zip(fast.mins, ref.mins):
        assert a.tobytes() == b.tobytes()
    assert fast.total == ref.total and fast.min() == ref.min()


def filled(capacity, fanout, priorities):
    fast, ref = NumbaSumTree(capacity, fanout), SumTree(capacity, fanout)
    fast.update(np.arange(len(priorities)), priorities)
    ref.update(np.arange(len(priorities)), priorities)
    return fast, ref


# -- layout and basic interface --------------------------------------------------------------------
def test_one_contiguous_array_with_level_offsets():
    tree = NumbaSumTree(1000, 4)
    assert tree.depth == SumTree(1000, 4).depth == 5
    assert tree.sums[0].base is tree.mins[0].base is tree._prefix.base is tree._buffer.base
    # every level starts a cache line (64 bytes), right after the previous one
    np.testing.assert_array_equal(tree.offsets, [0, 8, 16, 32, 96, 352, 1376])
    assert tree._buffer.ctypes.data % 64 == 0
    assert [len(level) for level in tree.sums] == [1, 4, 16, 64, 256, 1024]
    restored = pickle.loads(pickle.dumps(tree))
    assert restored._buffer.ctypes.data % 64 == 0 and restored.depth == 5
    assert tree.total == 0.0 and tree.min() == np.inf
    with pytest.raises(ValueError):
        NumbaSumTree(0)
    with pytest.raises(ValueError):
        NumbaSumTree(4, 1)
    with pytest.raises(IndexError):
        tree.update(np.array([1000]), np.array([1.0]))
    with pytest.raises(IndexError):
        tree.update(np.array([-1]), np.array([1.0]))


@pytest.mark.parametrize("fanout", [2, 3, 4, 16])
@pytest.mark.parametrize("capacity", [1, 7, 1000, 100_000])
def test_matches_reference_bit_for_bit(capacity, fanout):
    if capacity == 100_000 and fanout == 3:
        pytest.skip("covered by 2, 4, 16")
    rng = np.random.default_rng(capacity * 31 + fanout)
    priorities = rng.random(capacity) ** 3
    priorities[rng.random(capacity) < 0.1] = 0.0
    priorities[0] = 1.0  # never all zero
    fast, ref = filled(capacity, fanout, priorities)
    assert_same_tree(fast, ref)
    for _ in range(3):  # batches with duplicates, zeros, tiny and large values
        n = min(300, 2 * capacity)
        idx = rng.integers(0, capacity, n)
        p = rng.random(n) * 10.0 ** rng.integers(-8, 3, n)
        p[rng.random(n) < 0.1] = 0.0
        fast.update(idx, p)
        ref.update(idx, p)
        assert_same_tree(fast, ref)
        if ref.total == 0.0:
            continue
        uniforms = rng.random(256)
        np.testing.assert_array_equal(fast.sample(uniforms), ref.sample(uniforms))
        out, prio = np.empty(256, np.int64), np.empty(256)
        fast.sample_into(uniforms, out, prio)
        np.testing.assert_array_equal(out, ref.sample(uniforms))
        np.testing.assert_array_equal(prio, ref.get(out))
        assert (prio > 0).all()
        prefixes = np.concatenate((rng.random(500) * ref.total, [0.0, np.nextafter(ref.total, 0.0),
                                                                  ref.total, 2 * ref.total]))
        found = fast.find(prefixes)
        np.testing.assert_array_equal(found, ref.find(prefixes))
        leaves = ref.get(np.arange(capacity))
        assert found.max() < capacity and (leaves[found] > 0).all()  # the rounding guard
        keep = away_from_boundaries(leaves, prefixes) & (prefixes < ref.total)
        np.testing.assert_array_equal(found[keep], reference_find(leaves, prefixes[keep]))


@pytest.mark.parametrize("fanout", [3, 8, 16, 32])
def test_sorted_and_unsorted_updates_agree(fanout):
    """An update of non-decreasing leaves (a stratified sample's) takes its own path (neighbours
    compared, no stamps); in any order the tree is the reference's, bit for bit."""
    rng = np.random.default_rng(fanout)
    capacity = 5000
    priorities = rng.random(capacity)
    fast, ref = filled(capacity, fanout, priorities)
    shuffled, ordered = filled(capacity, fanout, priorities)[0], fast
    for _ in range(5):
        idx = np.sort(rng.integers(0, capacity, 256))  # duplicates included
        p = rng.random(256) * (rng.random(256) < 0.95)
        ordered.update(idx, p)
        ref.update(idx, p)
        last = {}  # the same final values in a shuffled order: keep each index's last value
        for i, v in zip(idx, p):
            last[i] = v
        keys = np.array(list(last))[rng.permutation(len(last))]
        shuffled.update(keys, np.array([last[i] for i in keys]))
        assert_same_tree(ordered, ref)
        assert_same_tree(shuffled, ref)
        uniforms = rng.random(256)
        np.testing.assert_array_equal(ordered.sample(uniforms), ref.sample(uniforms))


@pytest.mark.parametrize("fanout", [2, 4, 16])
def test_min_tree_exact_when_minima_rise(fanout):
    """The lazy min tree rescans an ancestor only when its old min rose: exact with every leaf
    holding the min (all priorities equal) and with distinct priorities raised smallest first
    (every raise moves the global min)."""
    rng = np.random.default_rng(fanout)
    capacity = 3000
    fast, ref = filled(capacity, fanout, np.ones(capacity))
    for _ in range(20):
        idx = rng.integers(0, capacity, 64)
        p = 1.0 + rng.random(64)  # each touched leaf rises from the shared min
        fast.update(idx, p)
        ref.update(idx, p)
        assert_same_tree(fast, ref)
    distinct = rng.random(capacity) + 0.01
    fast.update(np.arange(capacity), distinct)
    ref.update(np.arange(capacity), distinct)
    for leaf in np.argsort(distinct)[:30]:  # raise the unique global min, again and again
        fast.update(np.array([leaf]), np.array([5.0]))
        ref.update(np.array([leaf]), np.array([5.0]))
        assert fast.min() == ref.min()
    assert_same_tree(fast, ref)


def test_large_fanout_pairwise_recursion():
    """Fanout > 128: numpy's pairwise sum recurses; same association here."""
    rng = np.random.default_rng(0)
    p = rng.random(700) * 10.0 ** rng.integers(-6, 6, 700)
    fast, ref = filled(700, 300, p)
    assert_same_tree(fast, ref)
    u = rng.random(64)
    np.testing.assert_array_equal(fast.sample(u), ref.sample(u))


def test_duplicates_last_wins_and_zero_priorities():
    fast = NumbaSumTree(6, fanout=2)
    fast.update(np.arange(6), np.ones(6))
    fast.update(np.array([2, 4, 2, 2]), np.array([10.0, 3.0, 7.0, 0.5]))
    np.testing.assert_array_equal(fast.get(np.arange(6)), [1, 1, 0.5, 1, 3, 1])
    assert fast.total == 7.5 and fast.min() == 0.5
    np.testing.assert_array_equal(fast.find(np.array([0.0, 2.2, 2.6, 4.0, 7.4])), [0, 2, 3, 4, 5])
    fast.update(np.array([2, 2]), np.array([0.25, 0.0]))
    assert fast.min() == 1.0 and fast.total == 7.0
    for prefix in np.linspace(0, 7.0, 50):
        assert fast.find(np.array([prefix]))[0] != 2


def test_update_from_td_and_fill():
    rng = np.random.default_rng(1)
    fast, ref = NumbaSumTree(100, 4), SumTree(100, 4)
    idx = rng.integers(0, 100, 80)
    td = rng.normal(size=80)
    top = fast.update_from_td(idx, td, 0.6, 1e-6)
    ref.update(idx, (np.abs(td) + 1e-6) ** 0.6)
    assert top == np.max(np.abs(td) + 1e-6)
    np.testing.assert_allclose(fast.leaves, ref.leaves, rtol=2e-13)  # the fast power (fastmath.py)
    assert fast.total == pytest.approx(ref.total, rel=1e-14)
    fast.update_from_td(idx, td.astype(np.float32), 0.5, 0.0)  # float32 TD errors accepted
    np.testing.assert_allclose(fast.get(idx[-1:]), np.sqrt(np.abs(td[-1:].astype(np.float32)).astype(np.float64)),
                               rtol=2e-13)
    fast.fill(95, 10, 2.0)  # wraps: 95..99, 0..4
    ref.update((95 + np.arange(10)) % 100, np.full(10, 2.0))
    ref.update(idx, np.sqrt(np.abs(td.astype(np.float32).astype(np.float64))))
    fast.update(idx, ref.get(idx))
    ref.update((95 + np.arange(10)) % 100, np.full(10, 2.0))
    fast.fill(95, 10, 2.0)
    assert_same_tree(fast, ref)


priority_lists = st.lists(
    st.one_of(st.just(0.0), st.floats(1e-6, 100.0, allow_nan=False, allow_infinity=False)),
    min_size=1, max_size=70).filter(lambda ps: sum(ps) > 0)


@settings(max_examples=25, deadline=None, derandomize=True)
@given(priorities=priority_lists, seed=st.integers(0, 2**32 - 1), fanout=st.sampled_from([2, 3, 4, 16]))
def test_property_find_matches_reference_and_searchsorted(priorities, seed, fanout):
    p = np.array(priorities)
    fast, ref = filled(len(p), fanout, p)
    assert_same_tree(fast, ref)
    total = fast.total
    prefixes = np.concatenate((np.random.default_rng(seed).random(100) * total,
                               [0.0, np.nextafter(total, 0.0)]))
    found = fast.find(prefixes)
    np.testing.assert_array_equal(found, ref.find(prefixes))
    assert (p[found] > 0).all()
    keep = away_from_boundaries(p, prefixes)
    np.testing.assert_array_equal(found[keep], reference_find(p, prefixes[keep]))


@settings(max_examples=25, deadline=None, derandomize=True)
@given(capacity=st.integers(1, 40), fanout=st.sampled_from([2, 4, 16]), data=st.data())
def test_property_updates_with_duplicates_last_wins(capacity, fanout, data):
    check_last_write_wins(NumbaSumTree(capacity, fanout), SumTree(capacity, fanout), capacity, data, assert_same_tree)


def test_sampling_distribution_chisquare():
    from scipy.stats import chisquare

    rng = np.random.default_rng(2)
    capacity = 50
    p = rng.random(capacity) + 0.05
    p[[3, 17]] = 0.0
    fast = NumbaSumTree(capacity, 4)
    fast.update(np.arange(capacity), p)
    counts = np.zeros(capacity)
    out = np.empty(256, np.int64)
    for _ in range(400):
        np.add.at(counts, fast.sample_into(rng.random(256), out), 1)
    assert counts[3] == counts[17] == 0
    positive = p > 0
    expected = p[positive] / p.sum() * counts.sum()
    assert chisquare(counts[positive], expected).pvalue > 1e-3


# -- storage --------------------------------------------------------------------------------------
def layout(obs_dim):
    return (("obs", np.float32, (obs_dim,)), ("actions", np.int64, ()), ("rewards", np.float32, ()),
            ("next_obs", np.float32, (obs_dim,)), ("discounts", np.float32, ()),
            ("extra", np.float64, (2, 3)))


def numpy_fields(capacity, obs_dim):
    return tuple(np.zeros((capacity, *shape), dtype) for _, dtype, shape in layout(obs_dim))


def batch(start, count, obs_dim):
    ids = np.arange(start, start + count)
    obs = (ids[:, None] * 10 + np.arange(obs_dim)).astype(np.float32)
    return (obs, ids % 4, ids.astype(np.float32), obs + 0.5,
            np.where(ids % 5 == 0, 0.0, 0.99).astype(np.float32),
            np.broadcast_to(ids[:, None, None] * 1.5, (count, 2, 3)).copy())


@pytest.mark.parametrize("obs_dim, row_bytes", [(1, 32), (4, 64), (17, 192)])
def test_rows_are_line_aligned_and_padded(obs_dim, row_bytes):
    ring = fs.RowRing(10, layout(obs_dim)[:5])
    assert ring.row_bytes == row_bytes
    assert ring.rows.ctypes.data % 64 == 0 and ring.rows.strides[0] == row_bytes
    for name, dtype, shape in layout(obs_dim)[:5]:
        field = ring.fields[name]
        assert field.shape == (10, *shape) and field.dtype == dtype
        assert field.ctypes.data % np.dtype(dtype).itemsize == 0  # aligned items
    small = fs.RowRing(3, (("a", np.float32, ()),))
    assert small.row_bytes == 4
    odd = fs.RowRing(3, (("odd", np.float16, (1,)), ("rgb", np.uint8, (3,))))  # padded to whole words
    assert odd.row_bytes == 8
    odd.insert(2, 2, (np.array([[1.5], [2.5]], np.float16), np.array([[1, 2, 3], [4, 5, 6]], np.uint8)))
    half, rgb = odd.gather(np.array([0, 2, 0]))
    assert half[:, 0].tolist() == [2.5, 1.5, 2.5] and rgb.tolist() == [[4, 5, 6], [1, 2, 3], [4, 5, 6]]


@settings(max_examples=20, deadline=None, derandomize=True)
@given(capacity=st.integers(1, 12), counts=st.lists(st.integers(1, 15), min_size=1, max_size=10),
       obs_dim=st.sampled_from([1, 4, 17]))
def test_ring_insert_wraps_like_numpy(capacity, counts, obs_dim):
    ring = fs.RowRing(capacity, layout(obs_dim))
    reference = numpy_fields(capacity, obs_dim)
    cursor = inserted = 0
    for count in counts:
        values = batch(inserted, count, obs_dim)
        ring.insert(cursor, count, values)
        slots = (cursor + np.arange(count)) % capacity
        for ref, v in zip(reference, values):
            ref[slots] = v  # numpy fancy assignment: last write wins on wrap-around
        cursor = (cursor + count) % capacity
        inserted += count
        for (name, _, _), ref in zip(layout(obs_dim), reference):
            np.testing.assert_array_equal(ring.fields[name], ref)


def test_insert_casts_and_broadcasts():
    ring = fs.RowRing(4, (("obs", np.float32, (2,)), ("actions", np.int64, ())))
    ring.insert(3, 2, (np.array([[1.5, 2.5], [3.5, 4.5]]), 7))  # float64 rows, one action for both
    np.testing.assert_array_equal(ring.fields["obs"][[3, 0]], [[1.5, 2.5], [3.5, 4.5]])
    np.testing.assert_array_equal(ring.fields["actions"], [7, 0, 0, 7])
    ring.insert(1, 1, ([[9, 9]], [3]))  # lists
    assert ring.fields["actions"][1] == 3 and ring.fields["obs"][1, 0] == 9.0


@pytest.mark.parametrize("obs_dim", [1, 4, 17])
def test_compiled_and_numpy_inserts_agree(obs_dim):
    """Exact-dtype C-contiguous batches take the compiled row copy, anything else numpy's casting
    assignment; both give the same fields, also across the wrap."""
    values = batch(0, 7, obs_dim)
    fast, slow = fs.RowRing(9, layout(obs_dim)), fs.RowRing(9, layout(obs_dim))
    others = [(v.astype(np.float64) if v.dtype == np.float32 else v) for v in values]  # cast
    others[1] = np.asfortranarray(np.stack([values[1], values[1]], 1))[:, 0]  # strided
    others[-1] = np.asfortranarray(values[-1])  # not C-contiguous
    assert fast._as_rows(7, values) and not fast._as_rows(7, others) and not fast._as_rows(6, values)
    for start in (0, 5):  # 5: wraps after 4 rows
        fast.insert(start, 7, values)
        slow.insert(start, 7, others)
        for name, _, _ in layout(obs_dim):
            np.testing.assert_array_equal(fast.fields[name], slow.fields[name])


def frame_of(values, lead: int = 12):
    """The values' C-order bytes one after the other in a uint8 frame, each at a multiple of 8
    after `lead` bytes (a received inline message's layout), and their byte offsets."""
    parts, offsets, at = [np.zeros(lead, np.uint8)], [], lead
    for value in values:
        pad = -at % 8
        parts += [np.zeros(pad, np.uint8), np.ascontiguousarray(value).reshape(-1).view(np.uint8)]
        offsets.append(at + pad)
        at += pad + value.nbytes
    return np.concatenate(parts), np.array(offsets, np.int64)


@settings(max_examples=20, deadline=None, derandomize=True)
@given(capacity=st.integers(1, 12), counts=st.lists(st.integers(1, 12), min_size=1, max_size=10),
       obs_dim=st.sampled_from([1, 4, 17]))
def test_insert_frame_equals_numpy_assignment(capacity, counts, obs_dim):
    """RowRing.insert_frame (one compiled copy from a received message's bytes) against numpy's
    fancy assignment of the same rows, across the wrap; a read-only frame (bytes) works too."""
    counts = [min(c, capacity) for c in counts]
    ring = fs.RowRing(capacity, layout(obs_dim))
    reference = numpy_fields(capacity, obs_dim)
    cursor = inserted = 0
    assert ring.word_rows
    for count in counts:
        values = batch(inserted, count, obs_dim)
        frame, offsets = frame_of(values)
        if inserted % 2:
            frame = np.frombuffer(frame.tobytes(), np.uint8)  # read-only, as pyzmq's bytes
        ring.insert_frame(cursor, count, frame, offsets)
        slots = (cursor + np.arange(count)) % capacity
        for ref, v in zip(reference, values):
            ref[slots] = v
        cursor, inserted = (cursor + count) % capacity, inserted + count
        for (name, _, _), ref in zip(layout(obs_dim), reference):
            np.testing.assert_array_equal(ring.fields[name], ref)
    assert not fs.RowRing(3, (("rgb", np.uint8, (3,)),)).word_rows  # padded rows: insert() only


@pytest.mark.parametrize("obs_dim", [1, 4, 17])
def test_sample_uniform_scales_uniforms_and_gathers(obs_dim):
    ring = fs.RowRing(100, layout(obs_dim))
    ring.insert(0, 100, batch(0, 100, obs_dim))
    uniforms = np.array([0.0, 0.5, 0.999999, 0.25, 1 - 2.0 ** -53])
    indices, outs = ring.sample_uniform(uniforms, 60)
    np.testing.assert_array_equal(indices, [0, 30, 59, 15, 59])
    for got, (name, _, _) in zip(outs, layout(obs_dim)):
        np.testing.assert_array_equal(got, ring.fields[name][indices])
    again, _ = ring.sample_uniform(uniforms[::-1].copy(), 100)
    assert again is indices  # preallocated per batch size
    np.testing.assert_array_equal(indices, [99, 25, 99, 50, 0])


@pytest.mark.parametrize("obs_dim", [1, 4, 17])
def test_gather_matches_numpy_take(obs_dim):
    rng = np.random.default_rng(obs_dim)
    ring = fs.RowRing(100, layout(obs_dim))
    ring.insert(0, 100, batch(0, 100, obs_dim))
    for n in (1, 7, 256):
        indices = rng.integers(0, 100, n)
        outs = ring.gather(indices)
        for got, (name, dtype, _) in zip(outs, layout(obs_dim)):
            np.testing.assert_array_equal(got, ring.fields[name][indices])
            assert got.dtype == dtype and got.flags.c_contiguous
        assert ring.gather(indices[::-1].copy())[0] is outs[0]  # buffers reused per batch size
    with pytest.raises(IndexError):
        ring.gather(np.array([100]))
    with pytest.raises(IndexError):
        ring.gather(np.array([-1]))


@pytest.mark.parametrize("beta", [0.0, 0.4, 1.0])
def test_importance_weights_match_numpy(beta):
    rng = np.random.default_rng(3)
    size = 50
    priorities = rng.random(size) + 0.01
    total, min_priority = priorities.sum(), priorities.min()
    idx = rng.integers(0, size, 32)
    out = np.empty(32, np.float32)
    fs.importance_weights(priorities[idx], total, min_priority, size, beta, out, np.empty(32))
    w = (size * priorities / total) ** -beta
    expected = w[idx] / (size * min_priority / total) ** -beta
    np.testing.assert_allclose(out, expected.astype(np.float32), rtol=1e-6)
    assert out.max() <= 1.0 + 1e-6
    out64 = np.empty(32)
    fs.importance_weights(priorities[idx], total, min_priority, size, beta, out64, np.empty(32))
    np.testing.assert_allclose(out64, expected, rtol=1e-13)
    # no usable minimum: normalised by the batch's largest weight
    fs.importance_weights(priorities[idx], total, np.inf, size, beta, out64, np.empty(32))
    np.testing.assert_allclose(out64, w[idx] / w[idx].max(), rtol=1e-13)
