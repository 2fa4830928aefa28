"""The CUDA backend's sum tree and transition ring (pearl.kernels.cuda), against the float64 numpy
reference tree and a cumsum/searchsorted reference. Every test runs on CPU tensors (the same code,
so the algorithm is verified without a GPU) and again on `cuda` when one is available."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pearl.kernels.cpu import SumTree
from pearl.kernels.cuda import GraphedSampler, TorchSumTree, TorchTransitionStorage
from sumtree_reference import away_from_boundaries, reference_find

CUDA = torch.cuda.is_available()
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not CUDA, reason="no CUDA device"))]
# hypothesis tests draw the device too, from what is available
AVAILABLE = ["cpu", "cuda"] if CUDA else ["cpu"]
OBS_DIM = 3


def numpy(tensor):
    return tensor.detach().cpu().numpy()


def assert_on(tensor, device, dtype=None):
    assert isinstance(tensor, torch.Tensor)
    assert tensor.device.type == torch.device(device).type
    if dtype is not None:
        assert tensor.dtype == dtype


def check_tree_invariants(tree, reference):
    """Leaves equal the reference, padding stays empty, every internal node is its children's sum
    (to rounding: the device reduction may add in another order) and min (exactly)."""
    reference = np.asarray(reference, np.float64)
    np.testing.assert_array_equal(numpy(tree.get(np.arange(tree.capacity))), reference)
    assert not numpy(tree.leaves[tree.capacity:]).any()
    k = tree.fanout
    sums, mins = [numpy(s) for s in tree.sums], [numpy(m) for m in tree.mins]
    for level in range(tree.depth):
        np.testing.assert_allclose(sums[level], sums[level + 1].reshape(-1, k).sum(axis=1),
                                   rtol=1e-13, atol=0)
        np.testing.assert_array_equal(mins[level], mins[level + 1].reshape(-1, k).min(axis=1))
    positive = reference[reference > 0]
    assert tree.min() == (positive.min() if positive.size else np.inf)
    assert tree.total == pytest.approx(float(reference.sum()), rel=1e-12, abs=1e-300)


# -- find and sample against both references ----------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fanout", [2, 4, 16])
@pytest.mark.parametrize("capacity", [1, 7, 1000, 100_000])
def test_find_and_sample_match_references(device, fanout, capacity):
    rng = np.random.default_rng(capacity * 31 + fanout)
    priorities = rng.random(capacity) ** 3 * 10
    priorities[rng.random(capacity) < 0.2] = 0.0  # some empty leaves
    if not priorities.any():
        priorities[-1] = 1.0
    reference = SumTree(capacity, fanout)
    reference.update(np.arange(capacity), priorities)
    tree = TorchSumTree(capacity, fanout, device=device)
    assert (tree.capacity, tree.fanout, tree.depth) == (capacity, fanout, reference.depth)
    tree.update(torch.arange(capacity, device=device), torch.as_tensor(priorities, device=device))
    if capacity <= 1000:
        check_tree_invariants(tree, priorities)
    else:
        np.testing.assert_array_equal(numpy(tree.leaves[:capacity]), priorities)
        assert tree.total == pytest.approx(priorities.sum(), rel=1e-12)
        assert tree.min() == priorities[priorities > 0].min()

    total = tree.total
    prefixes = np.concatenate((rng.random(2000) * total, [0.0, np.nextafter(total, 0.0)]))
    found = tree.find(prefixes)
    assert_on(found, device, torch.int64)
    found = numpy(found)
    assert found.min() >= 0 and found.max() < capacity
    assert (priorities[found] > 0).all()  # the rounding guard: never an empty leaf
    keep = away_from_boundaries(priorities, prefixes)
    assert keep.mean() > 0.95
    np.testing.assert_array_equal(found[keep], reference_find(priorities, prefixes[keep]))
    np.testing.assert_array_equal(found[keep], reference.find(prefixes[keep]))

    uniforms = rng.random(256)
    sampled = tree.sample(torch.as_tensor(uniforms, device=device))
    assert_on(sampled, device, torch.int64)
    strata = (np.arange(256) + uniforms) * (reference.total / 256)
    keep = away_from_boundaries(priorities, strata)
    np.testing.assert_array_equal(numpy(sampled)[keep], reference.sample(uniforms)[keep])
    np.testing.assert_array_equal(numpy(tree.sample(uniforms)), numpy(sampled))  # numpy input too
    got = tree.get(sampled)
    assert_on(got, device, torch.float64)
    np.testing.assert_array_equal(numpy(got), priorities[numpy(sampled)])


priority_lists = st.lists(
    st.one_of(st.just(0.0), st.floats(1e-6, 100.0, allow_nan=False, allow_infinity=False)),
    min_size=1, max_size=70).filter(lambda ps: sum(ps) > 0)


@settings(max_examples=25, deadline=None, derandomize=True)
@given(priorities=priority_lists, seed=st.integers(0, 2**32 - 1), fanout=st.sampled_from([2, 3, 4, 16]),
       device=st.sampled_from(AVAILABLE))
def test_find_matches_cumsum_searchsorted_property(priorities, seed, fanout, device):
    priorities = np.array(priorities)
    tree = TorchSumTree(len(priorities), fanout, device=device)
    tree.update(np.arange(len(priorities)), priorities)
    check_tree_invariants(tree, priorities)
    total = tree.total
    prefixes = np.random.default_rng(seed).random(200) * total
    prefixes = np.concatenate((prefixes, [0.0, np.nextafter(total, 0.0), total]))
    found = numpy(tree.find(prefixes))
    assert found.min() >= 0 and found.max() < len(priorities)
    assert (priorities[found] > 0).all()
    keep = away_from_boundaries(priorities, prefixes)
    np.testing.assert_array_equal(found[keep], reference_find(priorities, prefixes[keep]))


@settings(max_examples=20, deadline=None, derandomize=True)
@given(priorities=st.lists(st.integers(0, 20), min_size=1, max_size=40).filter(any),
       fanout=st.sampled_from([2, 4, 8]), device=st.sampled_from(AVAILABLE))
def test_exact_bracket_boundaries_with_integer_priorities(priorities, fanout, device):
    """Integer priorities make every partial sum exact, so [c_{j-1}, c_j) holds exactly,
    boundaries included: a prefix equal to c_j belongs to the next leaf with mass."""
    tree = TorchSumTree(len(priorities), fanout, device=device)
    tree.update(np.arange(len(priorities)), np.array(priorities, dtype=np.float64))
    cum = np.cumsum(priorities)
    prefixes = np.unique(np.concatenate(([0], cum[cum < cum[-1]], cum[cum < cum[-1]] - 0.5,
                                         [cum[-1] - 0.5]))).astype(np.float64)
    prefixes = prefixes[prefixes >= 0]
    np.testing.assert_array_equal(numpy(tree.find(prefixes)), reference_find(priorities, prefixes))


def test_rounding_guard_never_returns_an_empty_leaf():
    """A parent whose stored sum exceeds its children's (as rounding in another summation order
    can make it) sends some prefixes past every child: the last child with mass is taken."""
    tree = TorchSumTree(8, fanout=2)
    tree.update(np.arange(8), np.array([1.0, 2.0, 0.0, 0.0, 3.0, 0.0, 1.0, 0.0]))
    tree.sum_nodes[tree.offsets[1]] += 0.5  # left half claims 3.5, its leaves hold 3
    found = numpy(tree.find(np.array([2.9, 3.2, 3.49])))
    np.testing.assert_array_equal(found, [1, 1, 1])
    tree.sum_nodes[0] += 1.0  # the root claims more than both halves: the overflow goes right
    np.testing.assert_array_equal(numpy(tree.find(np.array([7.9]))), [6])


# -- updates ---------------------------------------------------------------------------------------
@settings(max_examples=25, deadline=None, derandomize=True)
@given(capacity=st.integers(1, 40), fanout=st.sampled_from([2, 4, 16]), data=st.data(),
       device=st.sampled_from(AVAILABLE))
def test_updates_with_duplicates_last_wins(capacity, fanout, data, device):
    tree = TorchSumTree(capacity, fanout, device=device)
    reference_tree = SumTree(capacity, fanout)
    reference = np.zeros(capacity)
    for _ in range(data.draw(st.integers(1, 5))):
        indices = data.draw(st.lists(st.integers(0, capacity - 1), min_size=1, max_size=2 * capacity))
        values = data.draw(st.lists(st.floats(0.0, 50.0), min_size=len(indices), max_size=len(indices)))
        tree.update(torch.tensor(indices, device=device), np.array(values))
        reference_tree.update(np.array(indices), np.array(values))
        for i, v in zip(indices, values):  # sequential semantics: the last write wins
            reference[i] = v
        check_tree_invariants(tree, reference)
        np.testing.assert_array_equal(numpy(tree.leaves), reference_tree.leaves)
        assert tree.min() == reference_tree.min()


@pytest.mark.parametrize("device", DEVICES)
def test_duplicate_update_totals_and_min(device):
    tree = TorchSumTree(6, fanout=2, device=device)
    assert tree.total == 0.0 and tree.min() == np.inf
    tree.update(np.arange(6), np.ones(6))
    assert tree.total == 6.0 and tree.min() == 1.0
    tree.update(np.array([2, 4, 2, 2]), np.array([10.0, 3.0, 7.0, 0.5]))
    np.testing.assert_array_equal(numpy(tree.get(np.arange(6))), [1, 1, 0.5, 1, 3, 1])
    assert tree.total == 7.5 and tree.min() == 0.5
    assert len(tree.leaves) == 8
    assert_on(tree.total_tensor(), device, torch.float64)
    assert_on(tree.min_tensor(), device, torch.float64)
    np.testing.assert_array_equal(numpy(tree.find(np.array([0.0, 2.2, 2.6, 4.0, 7.4]))), [0, 2, 3, 4, 5])
    tree.update(np.array([2, 2]), np.array([0.25, 0.0]))  # zero priorities leave the min tree
    assert tree.min() == 1.0 and tree.total == 7.0
    tree.update(np.array([3]), 2.5)  # a scalar priority
    assert tree.total == 8.5
    tree.update(np.array([], dtype=np.int64), np.array([]))  # empty batch: nothing happens
    assert tree.total == 8.5


@pytest.mark.parametrize("device", DEVICES)
def test_large_duplicate_heavy_update_matches_reference(device):
    capacity, fanout = 100_000, 16
    rng = np.random.default_rng(3)
    tree, reference = TorchSumTree(capacity, fanout, device=device), SumTree(capacity, fanout)
    start = rng.random(capacity)
    tree.update(np.arange(capacity), start)
    reference.update(np.arange(capacity), start)
    for _ in range(5):
        indices = rng.integers(0, 300, size=4096)  # many duplicates, runs spread across the batch
        values = rng.random(4096)
        tree.update(torch.as_tensor(indices, device=device), torch.as_tensor(values, device=device))
        reference.update(indices, values)
    np.testing.assert_array_equal(numpy(tree.leaves), reference.leaves)
    for level in range(tree.depth):
        np.testing.assert_allclose(numpy(tree.sums[level]), reference.sums[level], rtol=1e-12)
        np.testing.assert_array_equal(numpy(tree.mins[level]), reference.mins[level])


@pytest.mark.parametrize("device", DEVICES)
def test_capacity_one(device):
    tree = TorchSumTree(1, device=device)
    tree.update(np.array([0]), np.array([2.5]))
    assert tree.total == 2.5 and tree.min() == 2.5
    np.testing.assert_array_equal(numpy(tree.find(np.array([0.0, 1.0, 2.4]))), [0, 0, 0])
    np.testing.assert_array_equal(numpy(tree.sample(np.array([0.0, 0.5, 0.999]))), [0, 0, 0])


@pytest.mark.parametrize("device", DEVICES)
def test_float32_tree(device):
    rng = np.random.default_rng(4)
    priorities = rng.random(1000) + 0.01
    tree = TorchSumTree(1000, 4, device=device, dtype=torch.float32)
    tree.update(np.arange(1000), priorities)
    assert_on(tree.leaves, device, torch.float32)
    assert tree.total == pytest.approx(priorities.sum(), rel=1e-5)
    prefixes = rng.random(2000) * priorities.sum() * (1 - 1e-5)
    found = numpy(tree.find(prefixes))
    keep = away_from_boundaries(priorities, prefixes, rel=1e-4)
    np.testing.assert_array_equal(found[keep], reference_find(priorities, prefixes[keep]))
    assert found.max() < 1000
    with pytest.raises(ValueError):
        TorchSumTree(10, 4, dtype=torch.int32)
    with pytest.raises(ValueError):
        TorchSumTree(0, 4)


# -- sampling distribution -------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
def test_sampling_frequencies_match_priorities_chisquare(device):
    from scipy.stats import chisquare

    rng = np.random.default_rng(7)
    capacity = 50
    priorities = rng.random(capacity) * 5 + 0.1
    priorities[::7] = 0.0
    tree = TorchSumTree(capacity, 4, device=device)
    tree.update(np.arange(capacity), priorities)
    generator = torch.Generator(device=device).manual_seed(11)
    counts = torch.zeros(capacity, dtype=torch.int64, device=device)
    batches, batch_size = 200, 64
    for _ in range(batches):
        uniforms = torch.rand(batch_size, dtype=torch.float64, device=device, generator=generator)
        counts += torch.bincount(tree.sample(uniforms), minlength=capacity)
    counts = numpy(counts)
    assert counts[priorities == 0].sum() == 0
    probs = priorities / priorities.sum()
    mask = probs > 0
    expected = batches * batch_size * probs[mask]
    assert chisquare(counts[mask], expected).pvalue > 1e-3
    wrong = np.where(mask, 1.0, 0.0)[mask]
    wrong = batches * batch_size * wrong / wrong.sum()
    assert chisquare(counts[mask], wrong).pvalue < 1e-6  # the test can tell uniform from prioritized


# -- transition storage ----------------------------------------------------------------------------
def transitions(start, count, obs_dim=OBS_DIM):
    """`count` distinguishable transitions numbered from `start`."""
    ids = np.arange(start, start + count)
    obs = (ids[:, None] * 10 + np.arange(obs_dim)).astype(np.float32)
    return (obs, ids % 4, ids.astype(np.float32), obs + 0.5,
            np.where(ids % 5 == 0, 0.0, 0.99).astype(np.float32))


@pytest.mark.parametrize("device", DEVICES)
def test_storage_wraps_and_gathers(device):
    storage = TorchTransitionStorage(5, OBS_DIM, device=device)
    slots = storage.add(*transitions(0, 3))
    assert_on(slots, device, torch.int64)
    np.testing.assert_array_equal(numpy(slots), [0, 1, 2])
    slots = storage.add(*(torch.as_tensor(x, device=device) for x in transitions(3, 4)))  # tensors
    np.testing.assert_array_equal(numpy(slots), [3, 4, 0, 1])
    assert (storage.cursor, storage.size, storage.inserted, len(storage)) == (2, 5, 7, 5)
    np.testing.assert_array_equal(numpy(storage.storage["rewards"]), [5, 6, 2, 3, 4])
    np.testing.assert_array_equal(numpy(storage.add(*transitions(7, 3))), [2, 3, 4])  # ends at capacity
    assert storage.cursor == 0
    ids = np.array([5, 6, 7, 8, 9])  # transition number held by each slot
    indices = np.array([4, 0, 3, 3, 1])
    out = storage.gather(torch.as_tensor(indices, device=device))
    expected = transitions(0, 10)
    for name, values in zip(("obs", "actions", "rewards", "next_obs", "discounts"), expected):
        assert_on(out[name], device)
        np.testing.assert_array_equal(numpy(out[name]), values[ids[indices]])
    assert out["obs"].dtype == torch.float32 and out["actions"].dtype == torch.int64
    assert out["obs"].shape == (5, OBS_DIM)
    again = storage.gather(np.array([1, 1, 1, 1, 1]))  # same size: the same buffers, rewritten
    assert again["obs"].data_ptr() == out["obs"].data_ptr()
    np.testing.assert_array_equal(numpy(again["rewards"]), [6] * 5)
    mine = {name: torch.empty_like(t) for name, t in out.items()}
    assert storage.gather(np.array([0, 2, 4, 1, 3]), out=mine) is mine
    np.testing.assert_array_equal(numpy(mine["rewards"]), [5, 7, 9, 6, 8])
    with pytest.raises(ValueError):
        storage.add(*transitions(0, 6))


def test_storage_action_dtype_and_shape():
    storage = TorchTransitionStorage(4, 2, action_dtype=np.float32, action_shape=(3,))
    assert storage.storage["actions"].dtype == torch.float32
    assert storage.storage["actions"].shape == (4, 3)


@settings(max_examples=20, deadline=None, derandomize=True)
@given(capacity=st.integers(1, 12), counts=st.lists(st.integers(1, 9), min_size=1, max_size=10),
       device=st.sampled_from(AVAILABLE))
def test_storage_ring_matches_reference_list(capacity, counts, device):
    """Against a reference that appends every transition and keeps the newest `capacity`."""
    storage = TorchTransitionStorage(capacity, OBS_DIM, device=device)
    inserted = 0
    for count in counts:
        count = min(count, capacity)
        slots = storage.add(*transitions(inserted, count))
        np.testing.assert_array_equal(numpy(slots), (inserted + np.arange(count)) % capacity)
        inserted += count
        assert (storage.inserted, storage.size, storage.cursor) == (
            inserted, min(inserted, capacity), inserted % capacity)
        newest = np.arange(max(0, inserted - capacity), inserted)
        out = storage.gather(newest % capacity)
        np.testing.assert_array_equal(numpy(out["rewards"]), newest)
        np.testing.assert_array_equal(numpy(out["obs"]), transitions(0, inserted)[0][newest])


# -- CUDA-only paths -------------------------------------------------------------------------------
@pytest.mark.skipif(not CUDA, reason="no CUDA device")
def test_graphed_sampler_matches_eager_and_sees_updates():
    tree = TorchSumTree(10_000, 16, device="cuda")
    rng = np.random.default_rng(5)
    tree.update(np.arange(10_000), rng.random(10_000))
    sampler = GraphedSampler(tree, 256)
    uniforms = torch.rand(256, dtype=torch.float64, device="cuda")
    torch.testing.assert_close(sampler(uniforms), tree.sample(uniforms))
    tree.update(np.arange(5000), np.zeros(5000))  # updates after capture are seen by replays
    torch.testing.assert_close(sampler(uniforms), tree.sample(uniforms))
    assert (sampler(uniforms) >= 5000).all()


def test_graphed_sampler_refuses_cpu_trees():
    with pytest.raises(RuntimeError):
        GraphedSampler(TorchSumTree(10, 4), 8)
