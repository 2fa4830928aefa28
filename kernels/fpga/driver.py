"""One interface for every FPGA backend, and its simulation.

    device.load(bitstream)            program the device (a .bit/.xclbin path; sim: a label)
    buf = device.allocate(n, dtype, kernel=k, arg="name")
                                      a buffer the kernel can reach (XRT places it in the memory
                                      bank of that kernel argument); buf.array is the host view
    buf.sync_to_device(count)         make the first `count` items visible to the kernel
    buf.sync_from_device(count)       make the kernel's writes visible to the host
    run = device.kernel(name).start(*args)   args in the order of kernels.SIGNATURES[name]:
                                      ints for scalars, buffers for pointers
    run.wait()                        block until the kernel is done

Implementations: `SimDevice` here (the C-simulated HLS kernel + the timing model; every figure
it reports is simulated), `PynqDevice` (kernels/fpga/pynq_driver.py, Zynq MPSoC boards) and
`XrtDevice` (kernels/fpga/xrt_driver.py, Alveo cards).
"""
from __future__ import annotations

import ctypes
from abc import ABC, abstractmethod

import numpy as np

from pearl.kernels.fpga import csim, timing
from pearl.kernels.fpga.kernels import POINTER, SIGNATURES


class Buffer(ABC):
    array: np.ndarray

    @abstractmethod
    def sync_to_device(self, count: int | None = None) -> None: ...

    @abstractmethod
    def sync_from_device(self, count: int | None = None) -> None: ...


class Run(ABC):
    @abstractmethod
    def wait(self) -> None: ...


class Kernel(ABC):
    name: str

    @abstractmethod
    def start(self, *args) -> Run: ...


class FPGADevice(ABC):
    kind: str = ""
    simulated: bool = False
    label: str = ""

    @abstractmethod
    def load(self, bitstream) -> None: ...

    @abstractmethod
    def allocate(self, count: int, dtype, kernel: Kernel | None = None, arg: str | None = None) -> Buffer: ...

    @abstractmethod
    def kernel(self, name: str, defines: dict | None = None) -> Kernel: ...

    def close(self) -> None:
        pass


# -- simulation -------------------------------------------------------------------------------
class SimBuffer(Buffer):
    """Host memory standing in for device memory; a sync costs its bytes over the platform link."""

    def __init__(self, device: "SimDevice", count: int, dtype):
        self.device = device
        self.array = np.zeros(count, dtype=dtype)
        self.address = self.array.ctypes.data
        self.pointer = ctypes.c_void_p(self.address)

    def _count_bytes(self, count):
        items = self.array.size if count is None else count
        return items * self.array.itemsize

    def sync_to_device(self, count: int | None = None) -> None:
        self.device._transfer(self._count_bytes(count))

    def sync_from_device(self, count: int | None = None) -> None:
        self.device._transfer(self._count_bytes(count))


class _DoneRun(Run):
    def wait(self) -> None:  # the C-simulation ran synchronously in start()
        pass


class SimKernel(Kernel):
    """A compute unit of a C-simulated kernel: `start` runs the kernel's C++ body and charges the
    timing model's cycles to the device's simulated clock."""

    def __init__(self, device: "SimDevice", name: str, defines: dict | None):
        self.device, self.name = device, name
        self.signature = SIGNATURES[name]
        self.timing = timing.kernel_timing(name)
        self.impl = csim.implementation(name, defines or {})

    def start(self, *args) -> Run:
        if len(args) != len(self.signature):
            raise TypeError(f"{self.name} takes {len(self.signature)} arguments, got {len(args)}")
        raw = []
        for (arg, kind), value in zip(self.signature, args):
            if kind == POINTER:
                if not isinstance(value, SimBuffer):
                    raise TypeError(f"{self.name}.{arg}: expected a buffer of this device")
                raw.append(value.pointer)
            else:
                raw.append(int(value))
        self.impl.call(*raw)
        cycles = self.impl.cycles(self.timing, *args)
        self.device._kernel(self.name, cycles)
        return _DoneRun()


class SimDevice(FPGADevice):
    """An FPGA of a platform profile, simulated: kernels are the C-simulated HLS sources, time is
    the timing model's cycles at the profile's clock plus transfers and launches over its link."""

    kind = "sim"
    simulated = True

    def __init__(self, platform, device_id: str = "fpga:0"):
        # `platform`: a loaded platforms/ profile (the caller reads the YAML; kernels do not)
        self.platform = platform
        self.profile = self.platform.device(device_id)
        self.link = self.platform.link("cpu", device_id)
        self.label = f"simulated FPGA {self.platform.name} {device_id}"
        self.description = (f"{self.profile.name} ({self.platform.name} {device_id}) simulated: C-simulated HLS "
                            f"kernels + timing model at {self.profile.clock_mhz:g} MHz, no board")
        self.bitstream = None
        self.reset_clock()

    def reset_clock(self) -> None:
        self.simulated_s = 0.0
        self.kernel_s: dict[str, float] = {}
        self.kernel_calls: dict[str, int] = {}
        self.transfer_s = 0.0
        self.transfer_bytes = 0

    def load(self, bitstream) -> None:
        self.bitstream = bitstream

    def allocate(self, count: int, dtype, kernel=None, arg=None) -> SimBuffer:
        return SimBuffer(self, count, dtype)

    def kernel(self, name: str, defines: dict | None = None) -> SimKernel:
        return SimKernel(self, name, defines)

    def _transfer(self, nbytes: int) -> None:
        seconds = self.link.transfer_s(nbytes)
        self.transfer_s += seconds
        self.transfer_bytes += nbytes
        self.simulated_s += seconds

    def _kernel(self, name: str, cycles: int) -> None:
        seconds = self.link.launch_us * 1e-6 + cycles / (self.profile.clock_mhz * 1e6)
        self.kernel_s[name] = self.kernel_s.get(name, 0.0) + seconds
        self.kernel_calls[name] = self.kernel_calls.get(name, 0) + 1
        self.simulated_s += seconds

    def report(self, since: dict | None = None) -> dict:
        """The simulated clock (since an earlier report, when given: the device may be shared by
        several trees or runs in one process). Every figure here is SIMULATED, not measured."""
        since = since or {}
        before_s, before_calls = since.get("simulated_kernel_s", {}), since.get("kernel_calls", {})
        return {"simulated": True, "label": self.label, "description": self.description,
                "platform": self.platform.name,
                "device": self.profile.id, "clock_mhz": self.profile.clock_mhz,
                "simulated_s": self.simulated_s - since.get("simulated_s", 0.0),
                "simulated_transfer_s": self.transfer_s - since.get("simulated_transfer_s", 0.0),
                "transfer_bytes": self.transfer_bytes - since.get("transfer_bytes", 0),
                "simulated_kernel_s": {k: v - before_s.get(k, 0.0) for k, v in self.kernel_s.items()},
                "kernel_calls": {k: v - before_calls.get(k, 0) for k, v in self.kernel_calls.items()}}
