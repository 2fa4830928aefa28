"""C-simulation of the HLS sum-tree kernel (hls/sumtree) against the numpy reference
(kernels/cpu/sumtree.py) and the float64 cumsum model (tests/sumtree_reference.py), through the
Python driver's simulated device; and its C++ testbench, built and run as `make csim` would.
Skipped only when no C++ compiler exists."""
from __future__ import annotations

import os
import subprocess

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pearl.kernels.fpga import build

if not build.available():
    pytest.skip("no C++ compiler: the HLS C-simulation cannot be built", allow_module_level=True)

from pearl.kernels.cpu import SumTree  # noqa: E402
from pearl.kernels.fpga import FPGASumTree, SimDevice  # noqa: E402
from pearl.platforms import load_platform  # noqa: E402
from sumtree_reference import away_from_boundaries, assert_same_tree, check_last_write_wins, reference_find  # noqa: E402

U250 = load_platform("alveo_u250")  # the kernels take a loaded profile: they read no YAML


def pair(capacity, fanout, priorities=None, dtype=np.float64):
    tree, reference = FPGASumTree(capacity, fanout, device=SimDevice(U250), dtype=dtype), SumTree(capacity, fanout)
    if priorities is not None:
        tree.update(np.arange(capacity), priorities)
        reference.update(np.arange(capacity), priorities)
    return tree, reference


@pytest.mark.parametrize("fanout", [2, 4, 16])
@pytest.mark.parametrize("capacity", [1, 7, 1000, 100_000])
def test_float64_kernel_is_the_reference(capacity, fanout):
    """float64 build: every node, and every found index (boundaries included), bit for bit."""
    rng = np.random.default_rng(capacity * 31 + fanout)
    priorities = rng.random(capacity) * 10 * (rng.random(capacity) > 0.2)
    priorities[rng.integers(capacity)] = 1.5
    tree, reference = pair(capacity, fanout, priorities)
    assert_same_tree(tree, reference)
    np.testing.assert_array_equal(tree.get(np.arange(capacity)), priorities)
    total = tree.total
    prefixes = np.concatenate((rng.random(2000) * total, [0.0, np.nextafter(total, 0), total]))
    found = tree.find(prefixes)
    assert found.dtype == np.int64
    np.testing.assert_array_equal(found, reference.find(prefixes))
    assert (priorities[found] > 0).all()  # the overflow rule never lands on an empty leaf
    keep = away_from_boundaries(priorities, prefixes)
    np.testing.assert_array_equal(found[keep], reference_find(priorities, prefixes[keep]))
    for batch in (1, 64, 256):
        uniforms = rng.random(batch)
        np.testing.assert_array_equal(tree.sample(uniforms), reference.sample(uniforms))


@pytest.mark.parametrize("capacity", [1000, 100_000])
def test_float32_kernel_agrees_away_from_boundaries(capacity):
    """The hardware default: float32 nodes. Indices agree with the float64 model except within
    1e-6 x total of a bracket boundary; a zero-priority leaf is never returned."""
    rng = np.random.default_rng(capacity)
    priorities = rng.random(capacity) * 10 * (rng.random(capacity) > 0.2)
    tree, _ = pair(capacity, 16, priorities, dtype=np.float32)
    held = priorities.astype(np.float32).astype(np.float64)  # what the tree can hold
    np.testing.assert_array_equal(tree.get(np.arange(capacity)), held)
    assert tree.total == pytest.approx(held.sum(), rel=1e-5)
    assert tree.min() == held[held > 0].min()
    prefixes = rng.random(4000) * tree.total
    found = tree.find(prefixes)
    assert (held[found] > 0).all()
    keep = away_from_boundaries(held, prefixes, rel=1e-6)
    assert keep.mean() > 0.5
    np.testing.assert_array_equal(found[keep], reference_find(held, prefixes[keep]))
    uniforms = rng.random(256)
    strata = (np.arange(256) + uniforms) * (tree.total / 256)
    sampled = tree.sample(uniforms)
    keep = away_from_boundaries(held, strata, rel=1e-6)
    np.testing.assert_array_equal(sampled[keep], reference_find(held, strata[keep]))


@settings(max_examples=15, deadline=None, derandomize=True)
@given(capacity=st.integers(1, 40), fanout=st.sampled_from([2, 4, 16]), data=st.data())
def test_updates_with_duplicates_last_wins(capacity, fanout, data):
    check_last_write_wins(*pair(capacity, fanout), capacity, data)


def test_batches_larger_than_the_kernel_buffers_are_split_in_order():
    rng = np.random.default_rng(4)
    tree, reference = pair(20_000, 16)
    indices = rng.integers(0, 20_000, 3 * tree.max_batch + 17)  # duplicates across chunks
    values = rng.random(indices.size)
    tree.update(indices, values)
    reference.update(indices, values)
    assert_same_tree(tree, reference)
    with pytest.raises(ValueError, match="exceeds the kernel's batch"):
        tree.sample(rng.random(tree.max_batch + 1))


def test_empty_tree_zero_priorities_and_bad_input():
    tree = FPGASumTree(6, fanout=2, device=SimDevice(U250), dtype=np.float64)
    assert tree.total == 0.0 and tree.min() == np.inf
    tree.update(np.arange(6), np.ones(6))
    tree.update(np.array([2, 4, 2, 2]), np.array([10.0, 3.0, 7.0, 0.5]))
    np.testing.assert_array_equal(tree.get(np.arange(6)), [1, 1, 0.5, 1, 3, 1])
    assert tree.total == 7.5 and tree.min() == 0.5
    np.testing.assert_array_equal(tree.find(np.array([0.0, 2.2, 2.6, 4.0, 7.4])), [0, 2, 3, 4, 5])
    tree.update(np.array([2, 0]), 0.0)
    assert tree.total == 6.0 and tree.min() == 1.0
    with pytest.raises(IndexError):
        tree.update(np.array([6]), np.array([1.0]))
    with pytest.raises(IndexError):
        tree.get(np.array([0.5]))
    with pytest.raises(ValueError, match="power-of-two fanout"):
        FPGASumTree(10, fanout=3, device=SimDevice(U250))


def test_sim_device_charges_the_timing_model():
    device = SimDevice(U250)
    tree = FPGASumTree(1000, 16, device=device)
    device.reset_clock()
    tree.update(np.arange(64), np.ones(64))
    one_update = device.simulated_s
    assert device.kernel_calls == {"pearl_sumtree": 1}
    # 64 indices + 64 priorities in, the root (2 values) out
    assert device.transfer_bytes == 64 * 8 + 64 * 8 + 2 * 8
    tree.update(np.arange(128), np.ones(128))
    assert device.simulated_s - one_update > one_update  # a longer batch costs more
    report = device.report()
    assert report["simulated"] is True and "simulated" in report["label"]
    slow = SimDevice(load_platform("zcu104"))  # 200 MHz and a slower link than the U250's 300 MHz + PCIe
    FPGASumTree(1000, 16, device=slow).update(np.arange(64), np.ones(64))
    assert slow.kernel_s["pearl_sumtree"] > device.kernel_s["pearl_sumtree"] / 2


@pytest.mark.parametrize("double", [False, True])
def test_cpp_testbench_passes(double):
    """hls/sumtree/sumtree_tb.cpp against the kernel top, compiled as an executable (make csim)."""
    defines = {"PEARL_SUMTREE_DOUBLE": None} if double else {}
    exe = build.build("sumtree", ["sumtree.cpp", "sumtree_tb.cpp"], defines, shared=False)
    result = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "PASS" in result.stdout and ("float64" if double else "float32") in result.stdout


def test_build_cache_is_keyed_and_atomic(tmp_path, monkeypatch):
    monkeypatch.setenv("PEARL_HLS_CACHE", str(tmp_path))
    first = build.build("sumtree", ["sumtree_csim.cpp"], {"PEARL_SUMTREE_DEPTH": 2})
    assert first.parent == tmp_path and first.is_file()
    stamp = first.stat().st_mtime_ns
    assert build.build("sumtree", ["sumtree_csim.cpp"], {"PEARL_SUMTREE_DEPTH": 2}) == first
    assert first.stat().st_mtime_ns == stamp  # cached: not rebuilt
    other = build.build("sumtree", ["sumtree_csim.cpp"], {"PEARL_SUMTREE_DEPTH": 3})
    assert other != first
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


def test_missing_compiler_is_reported(monkeypatch):
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    monkeypatch.setenv("PATH", "/nonexistent")
    build.compiler.cache_clear()
    try:
        assert not build.available()
        with pytest.raises(build.CompilerMissing, match="no C\\+\\+ compiler"):
            build.build("sumtree", ["sumtree_csim.cpp"])
    finally:
        build.compiler.cache_clear()
