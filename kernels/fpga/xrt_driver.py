"""The FPGA driver for Alveo cards through XRT's Python bindings (pyxrt).

The kernels are built in the Vitis kernel flow (hls/Makefile: v++ -c, v++ -l with
hls/connectivity.cfg -> pearl.xclbin). The calls this driver makes (XRT native API, pyxrt):

    device = pyxrt.device(index)
    uuid = device.load_xclbin(pyxrt.xclbin(path))
    kernel = pyxrt.kernel(device, uuid, name, pyxrt.kernel.shared)
    bo = pyxrt.bo(device, nbytes, pyxrt.bo.normal, kernel.group_id(arg_index))
    host = numpy.frombuffer(bo.map(), dtype)           the host view of the buffer
    bo.sync(pyxrt.xclBOSyncDirection.XCL_BO_SYNC_BO_TO_DEVICE / _FROM_DEVICE, nbytes, 0)
    run = kernel(*args); state = run.wait()            buffers as bo, scalars as int

pyxrt comes with an XRT installation (not from PyPI); the tests use a recording fake.
"""
from __future__ import annotations

import numpy as np

from pearl.kernels.fpga.driver import Buffer, FPGADevice, Kernel, Run
from pearl.kernels.fpga.kernels import POINTER, SIGNATURES


class XrtBuffer(Buffer):
    def __init__(self, pyxrt, device, count: int, dtype, group: int):
        self.pyxrt = pyxrt
        self.dtype = np.dtype(dtype)
        self.nbytes = max(1, count) * self.dtype.itemsize
        self.bo = pyxrt.bo(device, self.nbytes, pyxrt.bo.normal, group)
        self.array = np.frombuffer(self.bo.map(), dtype=self.dtype, count=count)

    def _bytes(self, count):
        return self.nbytes if count is None else max(1, count) * self.dtype.itemsize

    def sync_to_device(self, count: int | None = None) -> None:
        self.bo.sync(self.pyxrt.xclBOSyncDirection.XCL_BO_SYNC_BO_TO_DEVICE, self._bytes(count), 0)

    def sync_from_device(self, count: int | None = None) -> None:
        self.bo.sync(self.pyxrt.xclBOSyncDirection.XCL_BO_SYNC_BO_FROM_DEVICE, self._bytes(count), 0)


class XrtRun(Run):
    def __init__(self, pyxrt, run, name):
        self.pyxrt, self.run, self.name = pyxrt, run, name

    def wait(self) -> None:
        state = self.run.wait()
        completed = self.pyxrt.ert_cmd_state.ERT_CMD_STATE_COMPLETED
        if state is not None and state != completed:
            raise RuntimeError(f"{self.name}: kernel run ended in state {state}")


class XrtKernel(Kernel):
    def __init__(self, pyxrt, kernel, name: str):
        self.pyxrt, self.handle, self.name = pyxrt, kernel, name

    def group_id(self, arg: str) -> int:
        names = [a for a, _ in SIGNATURES[self.name]]
        return self.handle.group_id(names.index(arg))

    def start(self, *args) -> Run:
        signature = SIGNATURES[self.name]
        if len(args) != len(signature):
            raise TypeError(f"{self.name} takes {len(signature)} arguments, got {len(args)}")
        raw = [value.bo if kind == POINTER else int(value) for (_, kind), value in zip(signature, args)]
        return XrtRun(self.pyxrt, self.handle(*raw), self.name)


class XrtDevice(FPGADevice):
    kind = "xrt"
    simulated = False

    def __init__(self, index: int = 0, pyxrt_module=None):
        if pyxrt_module is None:
            import pyxrt as pyxrt_module
        self.pyxrt = pyxrt_module
        self.index = index
        self.device = self.pyxrt.device(index)
        self.uuid = None
        self.label = f"FPGA (XRT device {index})"

    def load(self, bitstream) -> None:
        self.uuid = self.device.load_xclbin(self.pyxrt.xclbin(str(bitstream)))
        self.label = f"FPGA (XRT device {self.index}, {bitstream})"

    def kernel(self, name: str, defines: dict | None = None) -> XrtKernel:
        if self.uuid is None:
            raise RuntimeError("XrtDevice.kernel: load() an xclbin first")
        return XrtKernel(self.pyxrt, self.pyxrt.kernel(self.device, self.uuid, name, self.pyxrt.kernel.shared), name)

    def allocate(self, count: int, dtype, kernel=None, arg=None) -> XrtBuffer:
        """A buffer object in the memory bank of `kernel`'s argument `arg` (the connectivity
        file's sp= lines decide which bank that is)."""
        if kernel is None or arg is None:
            raise ValueError("XrtDevice.allocate needs the kernel and argument the buffer is for")
        return XrtBuffer(self.pyxrt, self.device, count, dtype, kernel.group_id(arg))
