"""The PYNQ and XRT drivers against recording fakes of their APIs (tests/fake_fpga.py), backed by
the C-simulated kernel: the sum tree through each driver gives the reference's results, and the
drivers make exactly the documented calls (register offsets, addresses, sync directions)."""
from __future__ import annotations

import sys

import numpy as np
import pytest

from pearl.kernels.fpga import build

if not build.available():
    pytest.skip("no C++ compiler: the kernels behind the fakes are C-simulated", allow_module_level=True)

import fake_fpga  # noqa: E402
import pearl.kernels.fpga as fpga  # noqa: E402
from pearl.errors import ConfigError  # noqa: E402
from pearl.kernels.cpu import SumTree  # noqa: E402
from pearl.kernels.fpga import FPGASumTree  # noqa: E402
from pearl.kernels.fpga.kernels import register_offsets  # noqa: E402
from pearl.kernels.fpga.pynq_driver import PynqDevice  # noqa: E402
from pearl.kernels.fpga.xrt_driver import XrtDevice  # noqa: E402
from pearl.platforms import load_platform  # noqa: E402
from sumtree_reference import away_from_boundaries, reference_find  # noqa: E402

ZCU104 = load_platform("zcu104")  # the kernels take a loaded profile: they read no YAML
BITSTREAM_BUILD = {"PEARL_SUMTREE_FANOUT": 16, "PEARL_SUMTREE_DEPTH": 5}  # hls/Makefile's default build


def exercise(tree, capacity=5000):
    """update / sample / find / get through the driver, checked against the float64 model."""
    rng = np.random.default_rng(0)
    priorities = rng.random(capacity) * (rng.random(capacity) > 0.2)
    tree.update(np.arange(capacity), priorities)
    held = priorities.astype(np.float32).astype(np.float64)
    np.testing.assert_array_equal(tree.get(np.arange(capacity)), held)
    assert tree.total == pytest.approx(held.sum(), rel=1e-5) and tree.min() == held[held > 0].min()
    uniforms = rng.random(64)
    strata = (np.arange(64) + uniforms) * (tree.total / 64)
    sampled = tree.sample(uniforms)
    keep = away_from_boundaries(held, strata, rel=1e-6)
    assert keep.sum() > 32
    np.testing.assert_array_equal(sampled[keep], reference_find(held, strata[keep]))
    assert (held[sampled] > 0).all()
    reference = SumTree(capacity, 16)
    reference.update(np.arange(capacity), held)
    prefixes = rng.random(100) * tree.total
    keep = away_from_boundaries(held, prefixes, rel=1e-6)
    np.testing.assert_array_equal(tree.find(prefixes)[keep], reference.find(prefixes)[keep])


def test_pynq_driver_makes_the_pynq_calls(monkeypatch):
    board = fake_fpga.Board(BITSTREAM_BUILD)
    monkeypatch.setitem(sys.modules, "pynq", fake_fpga.fake_pynq(board))
    device = PynqDevice()
    device.load("pearl_zcu104.bit")
    tree = FPGASumTree(5000, 16, device=device)
    assert tree.kernel_depth == 5 and tree.max_batch == 4096  # read from the "bitstream" (OP_INFO)
    exercise(tree)

    calls = board.calls
    assert calls[0] == ("Overlay", "pearl_zcu104.bit")
    allocations = [c for c in calls if c[0] == "allocate"]
    assert ("allocate", (4096,), "<i8") in allocations and ("allocate", (4096,), "<f8") in allocations
    offsets = register_offsets("pearl_sumtree")
    assert offsets == {"op": 0x10, "n": 0x18, "indices": 0x20, "values": 0x2C, "out_indices": 0x38,
                       "out_values": 0x44}
    # one kernel call: every argument written, 64-bit addresses as two words, then ap_start,
    # then ap_done polled from the control register
    update = tree._indices.device_address
    start = [i for i, c in enumerate(calls) if c == ("write", "pearl_sumtree", 0x10, 2)][-1]  # the last sample
    writes = calls[start:start + 10]
    assert [w[2] for w in writes] == [0x10, 0x18, 0x20, 0x24, 0x2C, 0x30, 0x38, 0x3C, 0x44, 0x48]
    assert writes[1][3] == 64 and writes[2][3] == update & 0xFFFFFFFF and writes[3][3] == update >> 32
    assert calls[start + 10] == ("write", "pearl_sumtree", 0x00, 1)  # ap_start after the arguments
    assert calls[start + 11] == ("read", "pearl_sumtree", 0x00)  # ap_done polled
    # the uniforms flushed before the call, the found indices invalidated after it
    assert calls[start - 1] == ("sync_to_device", tree._values.device_address)
    assert calls[start + 12] == ("sync_from_device", tree._out_indices.device_address)
    device.close()
    assert ("freebuffer", tree._values.device_address) in board.calls


def test_pynq_fake_catches_a_missing_sync(monkeypatch):
    """The fake keeps device memory apart: data not synced is not seen by the kernel."""
    board = fake_fpga.Board(BITSTREAM_BUILD)
    monkeypatch.setitem(sys.modules, "pynq", fake_fpga.fake_pynq(board))
    device = PynqDevice()
    device.load("pearl.bit")
    tree = FPGASumTree(100, 16, device=device)
    tree._indices.array[:3] = [1, 2, 3]
    tree._values.array[:3] = 5.0
    tree.kernel.start(1, 3, tree._indices, tree._values, tree._out_indices, tree._out_values).wait()  # no sync
    tree._out_values.sync_from_device()
    assert tree._out_values.array[0] == 0.0  # the kernel saw zeros, not the host's 5.0s


def test_pynq_kernel_lookup_and_timeout(monkeypatch):
    board = fake_fpga.Board(BITSTREAM_BUILD)
    monkeypatch.setitem(sys.modules, "pynq", fake_fpga.fake_pynq(board, ip_names=("other_ip_0",)))
    device = PynqDevice()
    with pytest.raises(RuntimeError, match="load"):
        device.kernel("pearl_sumtree")
    device.load("x.bit")
    with pytest.raises(LookupError, match="no IP for kernel pearl_sumtree"):
        device.kernel("pearl_sumtree")


def test_xrt_driver_makes_the_pyxrt_calls(monkeypatch):
    board = fake_fpga.Board(BITSTREAM_BUILD)
    pyxrt = fake_fpga.fake_pyxrt(board)
    device = XrtDevice(0, pyxrt_module=pyxrt)
    device.load("pearl.xclbin")
    tree = FPGASumTree(5000, 16, device=device)
    exercise(tree)
    calls = board.calls
    assert calls[:3] == [("device", 0), ("xclbin", "pearl.xclbin"), ("load_xclbin", "pearl.xclbin")]
    assert ("kernel", "uuid-pearl.xclbin", "pearl_sumtree", "shared") in calls
    assert ("bo", 4096 * 8, "normal", 0) in calls
    starts = [c for c in calls if c[0] == "start"]
    assert starts and all(len(c[2]) == 6 for c in starts)
    # a sample: uniforms to the device (64 x 8 bytes), kernel, indices back
    i = next(i for i, c in enumerate(calls) if c[0] == "start" and c[2][:2] == (2, 64))
    assert calls[i - 1] == ("sync", "XCL_BO_SYNC_BO_TO_DEVICE", 64 * 8, 0, tree._values.bo.address)
    assert calls[i + 1] == ("wait",)
    assert calls[i + 2] == ("sync", "XCL_BO_SYNC_BO_FROM_DEVICE", 64 * 8, 0, tree._out_indices.bo.address)
    with pytest.raises(ValueError, match="needs the kernel"):
        device.allocate(4, np.float32)


def test_open_device_picks_the_board_or_the_simulation(monkeypatch):
    monkeypatch.setattr(fpga, "_DEVICES", {})
    board = fake_fpga.Board(BITSTREAM_BUILD)
    monkeypatch.setitem(sys.modules, "pynq", fake_fpga.fake_pynq(board))
    monkeypatch.delenv("PEARL_FPGA_BITSTREAM", raising=False)
    with pytest.raises(ConfigError, match="PEARL_FPGA_BITSTREAM"):
        fpga.open_device(ZCU104)
    monkeypatch.setenv("PEARL_FPGA_BITSTREAM", "pearl_zcu104.bit")
    device = fpga.open_device(ZCU104)
    assert isinstance(device, PynqDevice) and not device.simulated
    assert fpga.open_device(ZCU104, 0) is device
    monkeypatch.setattr(fpga, "_DEVICES", {})
    assert fpga.open_device(ZCU104, simulate=True).simulated
    monkeypatch.setattr(fpga, "_DEVICES", {})
    monkeypatch.setitem(sys.modules, "pyxrt", None)  # no XRT installed: the Alveo is simulated
    assert fpga.open_device(load_platform("alveo_u250")).simulated
