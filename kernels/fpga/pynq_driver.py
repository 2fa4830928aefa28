"""The FPGA driver for Zynq MPSoC boards (ZCU104, KV260, ...) through PYNQ.

The HLS kernels are built in the Vivado IP flow (hls/Makefile `csynth` with FLOW=vivado, then a
block design whose .bit/.hwh make the overlay): each kernel is an IP with an AXI-Lite control
interface (ap_ctrl_hs) and AXI masters into PS DDR. The calls this driver makes, and nothing else:

    overlay = pynq.Overlay(bitstream)                  load (downloads the .bit, parses the .hwh)
    ip = getattr(overlay, <instance>)                  the IP whose name starts with the kernel's
    buf = pynq.allocate(shape=(n,), dtype=dtype)       physically contiguous, device_address
    buf.sync_to_device() / buf.sync_from_device()      cache flush / invalidate (non-coherent)
    ip.write(offset, value)                            arguments (kernels.register_offsets), then
                                                       ap_start at 0x00
    ip.read(0x00)                                      polled until ap_done
    buf.freebuffer()                                   close()

PYNQ 4.x pins numpy<2, so it is an optional dependency installed on the board, never here; the
test suite checks these calls against a recording fake of the same API (tests/test_fpga_drivers.py).
"""
from __future__ import annotations

import time

import numpy as np

from pearl.kernels.fpga.driver import Buffer, FPGADevice, Kernel, Run
from pearl.kernels.fpga.kernels import AP_DONE, AP_START, CONTROL, POINTER, SIGNATURES, register_offsets


class PynqBuffer(Buffer):
    def __init__(self, pynq, count: int, dtype):
        self.array = pynq.allocate(shape=(count,), dtype=np.dtype(dtype))

    @property
    def device_address(self) -> int:
        return int(self.array.device_address)

    # PYNQ flushes / invalidates the whole buffer: the count is not needed
    def sync_to_device(self, count: int | None = None) -> None:
        self.array.sync_to_device()

    def sync_from_device(self, count: int | None = None) -> None:
        self.array.sync_from_device()

    def free(self) -> None:
        self.array.freebuffer()


class PynqRun(Run):
    def __init__(self, ip, name: str, timeout_s: float):
        self.ip, self.name, self.timeout_s = ip, name, timeout_s

    def wait(self) -> None:
        deadline = time.monotonic() + self.timeout_s
        while not self.ip.read(CONTROL) & AP_DONE:  # ap_done is clear-on-read: seen once
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name}: no ap_done within {self.timeout_s} s")


class PynqKernel(Kernel):
    def __init__(self, ip, name: str, timeout_s: float = 10.0):
        self.ip, self.name, self.timeout_s = ip, name, timeout_s
        self.offsets = register_offsets(name)

    def start(self, *args) -> Run:
        signature = SIGNATURES[self.name]
        if len(args) != len(signature):
            raise TypeError(f"{self.name} takes {len(signature)} arguments, got {len(args)}")
        for (arg, kind), value in zip(signature, args):
            offset = self.offsets[arg]
            if kind == POINTER:
                address = value.device_address
                self.ip.write(offset, address & 0xFFFFFFFF)
                self.ip.write(offset + 4, address >> 32)
            else:
                self.ip.write(offset, int(value) & 0xFFFFFFFF)
        self.ip.write(CONTROL, AP_START)
        return PynqRun(self.ip, self.name, self.timeout_s)


class PynqDevice(FPGADevice):
    kind = "pynq"
    simulated = False

    def __init__(self, pynq_module=None):
        if pynq_module is None:
            import pynq as pynq_module
        self.pynq = pynq_module
        self.overlay = None
        self.label = "FPGA (PYNQ overlay)"
        self._buffers: list[PynqBuffer] = []

    def load(self, bitstream) -> None:
        self.overlay = self.pynq.Overlay(str(bitstream))
        self.label = f"FPGA (PYNQ overlay {bitstream})"

    def allocate(self, count: int, dtype, kernel=None, arg=None) -> PynqBuffer:
        buffer = PynqBuffer(self.pynq, count, dtype)
        self._buffers.append(buffer)
        return buffer

    def kernel(self, name: str, defines: dict | None = None) -> PynqKernel:
        """The overlay's IP for HLS top `name` (instance names like `<name>_0`); `defines` are
        the simulation's build options: the bitstream already fixed them."""
        if self.overlay is None:
            raise RuntimeError("PynqDevice.kernel: load() a bitstream first")
        matches = sorted(key for key in self.overlay.ip_dict if key.split("/")[-1].startswith(name))
        if not matches:
            raise LookupError(f"the overlay has no IP for kernel {name} (IPs: {', '.join(self.overlay.ip_dict)})")
        return PynqKernel(getattr(self.overlay, matches[0].split("/")[-1]), name)

    def close(self) -> None:
        for buffer in self._buffers:
            buffer.free()
        self._buffers.clear()
