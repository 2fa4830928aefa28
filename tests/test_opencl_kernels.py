"""The OpenCL sum tree and transition storage against the numpy reference (kernels/cpu/sumtree.py),
a float64 cumsum + searchsorted reference, and the numpy ring of pearl.replay. Skipped when
pyopencl or an OpenCL device is missing."""
from __future__ import annotations

import os
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("pyopencl")
from pearl.kernels import opencl as ocl  # noqa: E402

if not ocl.available():
    pytest.skip("no OpenCL platform/device", allow_module_level=True)

from pearl.kernels.cpu import SumTree  # noqa: E402
from pearl.replay import UniformReplay  # noqa: E402
from sumtree_reference import away_from_boundaries, assert_same_tree, check_last_write_wins, reference_find

warnings.filterwarnings("ignore", module="pyopencl")  # compiler-output chatter
OBS_DIM = 3


@pytest.fixture(scope="module")
def queue():
    return ocl.default_queue()


@pytest.fixture(scope="module")
def fp64(queue):
    if "cl_khr_fp64" not in queue.device.extensions:
        pytest.skip("device has no float64: exact comparisons do not apply")


def pair(capacity, fanout, priorities=None, **kw):
    tree, reference = ocl.OpenCLSumTree(capacity, fanout, **kw), SumTree(capacity, fanout)
    if priorities is not None:
        tree.update(np.arange(capacity), priorities)
        reference.update(np.arange(capacity), priorities)
    return tree, reference


def test_module_basics():
    assert "__kernel void sample" in ocl.kernel_source()  # package data via importlib.resources
    assert os.environ.get("POCL_CACHE_DIR")
    assert ocl.parse_device_spec("1:2") == (1, 2) and ocl.parse_device_spec("0") == (0, None)
    for bad in ("", "a:b", "1:2:3"):
        with pytest.raises(ValueError):
            ocl.parse_device_spec(bad)


@pytest.mark.parametrize("fanout", [2, 4, 16])
@pytest.mark.parametrize("capacity", [1, 7, 1000, 100_000])
def test_find_and_sample_match_references(queue, fp64, capacity, fanout):
    rng = np.random.default_rng(capacity * 31 + fanout)
    priorities = rng.random(capacity) * 10 * (rng.random(capacity) > 0.2)
    priorities[rng.integers(capacity)] = 1.5  # total > 0
    tree, reference = pair(capacity, fanout, priorities)
    assert tree.depth == reference.depth and tree.leaves.size == fanout ** tree.depth
    assert not tree.leaves[capacity:].any()  # padding leaves stay empty
    np.testing.assert_array_equal(tree.get(np.arange(capacity)), priorities)
    assert tree.total == pytest.approx(priorities.sum(), rel=1e-12)
    assert tree.min() == priorities[priorities > 0].min()
    total = tree.total
    prefixes = np.concatenate((rng.random(2000) * total, [0.0, np.nextafter(total, 0), total]))
    found = tree.find(prefixes)
    assert found.dtype == np.int64
    np.testing.assert_array_equal(found, reference.find(prefixes))  # exactly, boundaries included
    assert (priorities[found] > 0).all()  # the rounding guard
    keep = away_from_boundaries(priorities, prefixes)
    np.testing.assert_array_equal(found[keep], reference_find(priorities, prefixes[keep]))
    uniforms = rng.random(256)
    np.testing.assert_array_equal(tree.sample(uniforms), reference.sample(uniforms))


def test_tree_nodes_equal_reference_for_odd_and_wide_fanouts(fp64):
    rng = np.random.default_rng(3)
    for capacity, fanout in [(50, 3), (300, 9), (5000, 200)]:
        tree, reference = pair(capacity, fanout, rng.random(capacity) * 1e3)
        assert_same_tree(tree, reference)


@settings(max_examples=15, deadline=None, derandomize=True)
@given(capacity=st.integers(1, 40), fanout=st.sampled_from([2, 4, 16]), data=st.data())
def test_updates_with_duplicates_last_wins(fp64, capacity, fanout, data):
    check_last_write_wins(*pair(capacity, fanout), capacity, data)


@settings(max_examples=15, deadline=None, derandomize=True)
@given(priorities=st.lists(st.integers(0, 20), min_size=1, max_size=40).filter(any),
       fanout=st.sampled_from([2, 4, 16]))
def test_exact_bracket_boundaries_with_integer_priorities(priorities, fanout):
    """Integer sums are exact even in float32: a prefix equal to c_j goes to the next leaf."""
    tree = ocl.OpenCLSumTree(len(priorities), fanout)
    tree.update(np.arange(len(priorities)), np.array(priorities, dtype=np.float64))
    cum = np.cumsum(priorities)
    prefixes = np.unique(np.concatenate(([0], cum[cum < cum[-1]], cum[cum < cum[-1]] - 0.5,
                                         [cum[-1] - 0.5]))).astype(np.float64)
    np.testing.assert_array_equal(tree.find(prefixes), reference_find(priorities, prefixes))


def test_duplicate_update_total_and_min():
    tree = ocl.OpenCLSumTree(6, fanout=2)
    assert tree.total == 0.0 and tree.min() == np.inf
    tree.update(np.arange(6), np.ones(6))
    assert tree.total == 6.0 and tree.min() == 1.0
    tree.update(np.array([2, 4, 2, 2]), np.array([10.0, 3.0, 7.0, 0.5]))
    np.testing.assert_array_equal(tree.get(np.arange(6)), [1, 1, 0.5, 1, 3, 1])
    assert tree.total == 7.5 and tree.min() == 0.5
    np.testing.assert_array_equal(tree.find(np.array([0.0, 2.2, 2.6, 4.0, 7.4])), [0, 2, 3, 4, 5])
    tree.update(np.array([2, 0]), 0.0)  # zero priority: out of the min tree
    assert tree.total == 6.0 and tree.min() == 1.0
    with pytest.raises(IndexError):
        tree.update(np.array([6]), np.array([1.0]))


def test_large_update_takes_level_by_level_path(fp64):
    """More unique leaves than one work-group handles: one launch per level."""
    rng = np.random.default_rng(9)
    tree, reference = pair(100_000, 16, rng.random(100_000))
    indices = rng.integers(0, 100_000, 3 * tree.fused_limit)
    values = rng.random(indices.size)
    tree.update(indices, values)
    reference.update(indices, values)
    assert np.unique(indices).size > tree.fused_limit
    assert_same_tree(tree, reference)


def test_sampling_distribution_chisquare():
    from scipy.stats import chisquare

    rng = np.random.default_rng(11)
    capacity = 60
    priorities = rng.random(capacity) ** 2 * (rng.random(capacity) > 0.25)
    tree = ocl.OpenCLSumTree(capacity, fanout=4)
    tree.update(np.arange(capacity), priorities)
    counts = np.zeros(capacity)
    batches, batch = 100, 256
    for _ in range(batches):
        np.add.at(counts, tree.sample(rng.random(batch)), 1)
    assert counts[priorities == 0].sum() == 0  # never a zero-priority leaf
    probs = priorities / priorities.sum()
    live = probs > 0
    expected = batches * batch * probs[live]
    assert chisquare(counts[live], expected).pvalue > 1e-3
    wrong = np.where(live, 1.0, 0.0)[live] / live.sum()  # uniform over live leaves
    assert chisquare(counts[live], batches * batch * wrong).pvalue < 1e-6


def test_float32_fallback(queue):
    """Forced float32 (what a device without cl_khr_fp64 gets): close, not exact."""
    rng = np.random.default_rng(5)
    capacity = 1000
    priorities = rng.random(capacity) * (rng.random(capacity) > 0.2)
    tree = ocl.OpenCLSumTree(capacity, 16, dtype=np.float32)
    tree.update(np.arange(capacity), priorities)
    assert tree.total == pytest.approx(priorities.sum(), rel=1e-5)
    np.testing.assert_allclose(tree.get(np.arange(capacity)), priorities, rtol=1e-7)
    prefixes = rng.random(2000) * tree.total
    found = tree.find(prefixes)
    assert (priorities[found] > 0).all()
    keep = away_from_boundaries(priorities, prefixes, rel=1e-4)
    np.testing.assert_array_equal(found[keep], reference_find(priorities, prefixes[keep]))


# -- transition storage ---------------------------------------------------------------------------
def transitions(start, count, obs_dim=OBS_DIM):
    ids = np.arange(start, start + count)
    obs = (ids[:, None] * 10 + np.arange(obs_dim)).astype(np.float32)
    return (obs, ids % 4, ids.astype(np.float32), obs + 0.5,
            np.where(ids % 5 == 0, 0.0, 0.99).astype(np.float32))


def assert_same_storage(storage, reference):
    assert (storage.cursor, storage.size, storage.inserted) == (
        reference.cursor, reference.size, reference.inserted)
    for name, values in reference.storage.items():
        np.testing.assert_array_equal(storage.read(name), values)


def test_storage_wraps_and_gathers():
    storage = ocl.OpenCLTransitionStorage(5, OBS_DIM)
    reference = UniformReplay(capacity=5, obs_dim=OBS_DIM)
    np.testing.assert_array_equal(storage.add(*transitions(0, 3)), [0, 1, 2])
    reference.add(*transitions(0, 3))
    np.testing.assert_array_equal(storage.add(*transitions(3, 4)), [3, 4, 0, 1])  # wraps
    reference.add(*transitions(3, 4))
    assert (storage.cursor, storage.size, storage.inserted) == (2, 5, 7)
    np.testing.assert_array_equal(storage.read("rewards"), [5, 6, 2, 3, 4])
    assert_same_storage(storage, reference)
    indices = np.array([4, 0, 3, 3, 1])
    out = storage.gather(indices)
    expected = reference.gather(indices)
    for name in expected:
        assert out[name].dtype == expected[name].dtype and out[name].shape == expected[name].shape
        np.testing.assert_array_equal(out[name], expected[name])
    again = storage.gather(np.array([2, 2, 2, 2, 2]))
    assert again["obs"] is out["obs"]  # same batch size reuses the output arrays
    np.testing.assert_array_equal(again["rewards"], [2] * 5)
    with pytest.raises(IndexError):
        storage.gather(np.array([5]))


def test_storage_odd_row_sizes():
    """Rows that are not a multiple of 4 bytes (int8 actions of shape (3,)) use the byte gather."""
    storage = ocl.OpenCLTransitionStorage(4, 2, action_dtype=np.int8, action_shape=(3,))
    actions = np.arange(18, dtype=np.int8).reshape(6, 3)
    obs = np.arange(12, dtype=np.float32).reshape(6, 2)
    storage.add(obs, actions, np.arange(6), obs + 1, np.ones(6))
    out = storage.gather(np.array([0, 1, 3]))
    np.testing.assert_array_equal(out["actions"], actions[[4, 5, 3]])
    np.testing.assert_array_equal(out["obs"], obs[[4, 5, 3]])


@settings(max_examples=15, deadline=None, derandomize=True)
@given(capacity=st.integers(1, 12), counts=st.lists(st.integers(1, 15), min_size=1, max_size=8),
       seed=st.integers(0, 1000))
def test_storage_matches_numpy_ring(capacity, counts, seed):
    storage = ocl.OpenCLTransitionStorage(capacity, OBS_DIM)
    reference = UniformReplay(capacity=capacity, obs_dim=OBS_DIM)
    inserted = 0
    for count in counts:
        count = min(count, capacity)
        np.testing.assert_array_equal(storage.add(*transitions(inserted, count)),
                                      reference.add(*transitions(inserted, count)))
        inserted += count
    assert_same_storage(storage, reference)
    indices = np.random.default_rng(seed).integers(0, reference.size, 7)
    out, expected = storage.gather(indices), reference.gather(indices)
    for name in expected:
        np.testing.assert_array_equal(out[name], expected[name])


def test_sample_batch_on_device(fp64):
    rng = np.random.default_rng(2)
    capacity = 300
    storage = ocl.OpenCLTransitionStorage(capacity, OBS_DIM)
    reference = UniformReplay(capacity=capacity, obs_dim=OBS_DIM)
    storage.add(*transitions(0, 350))
    reference.add(*transitions(0, 350))
    tree, ref_tree = pair(capacity, 16, rng.random(capacity))
    uniforms = rng.random(64)
    indices, out = ocl.sample_batch(tree, storage, uniforms)
    np.testing.assert_array_equal(indices, ref_tree.sample(uniforms))
    expected = reference.gather(indices)
    for name in expected:
        np.testing.assert_array_equal(out[name], expected[name])


def test_plan_puts_the_priority_tree_on_an_opencl_device():
    """Same seed, same run: the tree on opencl:0 trains exactly like the numpy reference tree."""
    import pearl

    options = dict(replay="prioritized", total_steps=1500, learning_starts=300, hidden=[16, 16], seed=2)
    on_device = {**pearl.Plan().devices, "sample": "opencl:0", "insert": "opencl:0",
                 "update_priorities": "opencl:0"}
    device_agent = pearl.DQN("CartPole-v1", plan=pearl.Plan(devices=on_device), **options)
    config = device_agent.config
    reference = pearl.DQN(config=pearl.config.apply_overrides(config, {"replay.backend": "numpy"}))
    assert type(device_agent.replay.tree).__name__ == "OpenCLSumTree"
    device_agent.train()
    reference.train()
    np.testing.assert_array_equal(device_agent.learner.policy_weights(), reference.learner.policy_weights())
    np.testing.assert_array_equal(device_agent.replay.tree.leaves[:1500], reference.replay.tree.leaves[:1500])
