"""The Backend contract (pearl/kernels/registry.py), checked on every registered backend: its
detected devices, its placement answers, its one-line errors and its sum tree against the float64
numpy reference (kernels/cpu/sumtree.py). A backend absent here is skipped, not failed."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from pearl.errors import ConfigError
from pearl.estimator.workload import Workload
from pearl.kernels import registry
from pearl.kernels.cpu.sumtree import SumTree
from pearl.kernels.registry import TASKS, DeviceId, parse_device
from sumtree_reference import away_from_boundaries

BACKENDS = [pytest.param(b, id=b.kind) for b in registry.backends()]

DQN = Workload(env="CartPole-v1", obs_dim=4, n_actions=2, hidden=(64, 64), replay_kind="prioritized",
               capacity=100_000, fanout=16, updates_per_step=0.25, learning_starts=1000)
WORKLOADS = [DQN, dataclasses.replace(DQN, replay_kind="uniform"), dataclasses.replace(DQN, replay_kind="amper"),
             dataclasses.replace(DQN, dueling=True),
             dataclasses.replace(DQN, algo="td3", replay_kind="uniform", n_actions=1, obs_dim=3),
             dataclasses.replace(DQN, algo="sac", replay_kind="uniform", n_actions=1, obs_dim=3)]


def one_line(err: ConfigError) -> str:
    text = str(err)
    assert text and "\n" not in text, text
    return text


def a_device(b):
    """(device, loaded profile) of `b` to build kernels on here, or skip. The cuda backend's
    kernels run on CPU tensors where no GPU is present (how they are tested without one)."""
    if b.default_platform is not None:
        from pearl.platforms import load_platform

        profile = load_platform(b.default_platform)
        ids = [d.id for d in profile.devices if d.kind == b.kind]
        if not ids:
            pytest.skip(f"{b.default_platform} has no {b.kind} device")
        return parse_device(ids[0]), profile
    found = b.detect()
    if found:
        return parse_device(found[0]["id"]), None
    if b.kind == "cuda":
        return "cpu", None
    pytest.skip(f"no {b.kind} device on this machine")


def host(values) -> np.ndarray:
    return values.cpu().numpy() if hasattr(values, "cpu") else np.asarray(values)


@pytest.mark.parametrize("b", BACKENDS)
def test_detect_lists_devices_of_its_kind(b):
    devices = b.detect()
    assert isinstance(devices, list)
    for device in devices:
        assert {"id", "kind", "name"} <= set(device) and device["kind"] == b.kind
        parsed = parse_device(device["id"])
        assert parsed.kind == b.kind
        b.check(parsed, None, "plan.devices.sample")  # what it detects exists


@pytest.mark.parametrize("b", BACKENDS)
def test_can_run_answers_none_or_one_line(b):
    for workload in WORKLOADS:
        for task in TASKS:
            reason = b.can_run(task, workload)
            assert reason is None or (isinstance(reason, str) and reason and "\n" not in reason), (task, reason)
        if b.can_run("learn", workload) is None:
            assert set(b.learner_kernels(workload)) <= {"fused", "torch"}
        assert all(isinstance(b.calls(task, "torch", workload.algo), int) for task in TASKS)
    assert set(b.platform_keys) and len(b.power_keys) == 2


@pytest.mark.parametrize("text", ["cpu:3", "opencl:99", "gpu:0", "cuda:x", "fpga:7", "", "cpu:"])
def test_bad_or_missing_devices_are_one_line_errors_naming_the_field(text):
    with pytest.raises(ConfigError) as err:
        device = parse_device(text, "plan.devices.sample")
        b = registry.backend(device.kind)
        profile = None
        if b.default_platform is not None:
            from pearl.platforms import load_platform

            profile = load_platform(b.default_platform)
        b.check(device, profile, "plan.devices.sample")
    assert one_line(err.value).startswith("plan.devices.sample: ")


def test_cpu_is_one_device():
    cpu = registry.backend("cpu")
    assert parse_device("cpu") == parse_device("cpu:0") == DeviceId("cpu", 0)
    cpu.check(parse_device("cpu:0"), None, "f")


def test_unknown_kind_lists_the_kinds():
    with pytest.raises(ConfigError) as err:
        registry.backend("tpu")
    assert all(kind in one_line(err.value) for kind in registry.kinds())


@pytest.mark.parametrize("b", BACKENDS)
def test_sum_tree_matches_the_float64_reference(b):
    device, profile = a_device(b)
    if b.kind == "fpga":
        from pearl.kernels.fpga import build

        if not build.available():
            pytest.skip("no C++ compiler: the HLS C-simulation cannot be built")
    capacity, fanout = 1000, 16
    try:
        tree = b.sum_tree(device, capacity, fanout, profile)
    except ConfigError as err:
        assert "has no sum tree" in one_line(err)
        pytest.skip(f"the {b.kind} backend has no sum tree")
    reference = SumTree(capacity, fanout)
    rng = np.random.default_rng(0)
    priorities = rng.random(capacity) ** 3 + 1e-3
    for t in (tree, reference):
        t.update(np.arange(capacity), priorities)
        t.update(np.array([5, 17, 5, 999]), np.array([4.0, 0.25, 2.0, 3.0]))  # the last duplicate wins
    leaves = reference.get(np.arange(capacity))
    np.testing.assert_allclose(host(tree.get(np.arange(capacity))), leaves, rtol=1e-6)
    assert tree.total == pytest.approx(reference.total, rel=1e-6)
    assert tree.min() == pytest.approx(reference.min(), rel=1e-6)
    uniforms = rng.random(64)
    got, want = host(tree.sample(uniforms)), reference.sample(uniforms)
    strata = (np.arange(64) + uniforms) * (reference.total / 64)
    clear = away_from_boundaries(leaves, strata, rel=1e-5)  # float32 trees round near boundaries
    assert clear.sum() > 50
    np.testing.assert_array_equal(got[clear], want[clear])


@pytest.mark.parametrize("b", [p for p in BACKENDS if p.values[0].kind in ("fpga", "opencl")])
def test_device_sum_trees_refuse_indices_outside_the_leaves(b):
    """A tree whose indices are copied to a device (kernels/cpu/sumtree.py checked_leaf_indices):
    a float, negative or too large index is an IndexError and writes nothing."""
    device, profile = a_device(b)
    if b.kind == "fpga":
        from pearl.kernels.fpga import build

        if not build.available():
            pytest.skip("no C++ compiler: the HLS C-simulation cannot be built")
    tree = b.sum_tree(device, 100, 4, profile)
    tree.update(np.arange(100), np.ones(100))
    for bad, message in ((np.array([1.0]), "must be integers"), (np.array([-1]), r"out of range \[0, 100\)"),
                         (np.array([3, 100]), r"out of range \[0, 100\)")):
        with pytest.raises(IndexError, match=message):
            tree.update(bad, np.full(bad.size, 5.0))
        with pytest.raises(IndexError, match=message):
            tree.get(bad)
    assert tree.total == pytest.approx(100.0)
    np.testing.assert_array_equal(host(tree.get(np.arange(100))), np.ones(100))
