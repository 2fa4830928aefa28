"""Recording fakes of the board APIs the FPGA drivers use: `pynq` (Overlay, allocate, PynqBuffer
sync/device_address/freebuffer, DefaultIP read/write) and `pyxrt` (device, xclbin, kernel, bo,
run). They follow the vendors' documented APIs, record every call the driver makes, keep device
memory separate from host memory (so a missing sync shows up as stale data), and execute a
started kernel with its C-simulation on the device-side memory.

Why fakes rather than the real packages: PYNQ 4.x pins numpy<2 and, like pyxrt, needs a board
(or XRT) to do anything; no real board exists here. What must be right without a board is the
sequence of calls and the values written (register offsets, addresses, sync directions), and
that is what these fakes check."""
from __future__ import annotations

import ctypes
import enum
import types

import numpy as np

from pearl.kernels.fpga import csim
from pearl.kernels.fpga.kernels import AP_DONE, AP_IDLE, AP_START, CONTROL, POINTER, SIGNATURES, register_offsets


class Board:
    """Device memory (address -> numpy array), the bitstream's kernels, and the call log."""

    def __init__(self, defines: dict | None = None):
        self.memory: dict[int, np.ndarray] = {}
        self.calls: list[tuple] = []
        self.next_address = 0x2000_0000
        self.defines = defines or {}
        self.units: dict[str, object] = {}

    def reserve(self, nbytes: int) -> int:
        address = self.next_address
        self.memory[address] = np.zeros(max(1, nbytes), np.uint8)
        self.next_address += (max(1, nbytes) + 4095) // 4096 * 4096
        return address

    def execute(self, name: str, values: list) -> None:
        """Run kernel `name` with scalar values and device addresses, on device memory."""
        unit = self.units.setdefault(name, csim.implementation(name, self.defines))
        raw = []
        for (arg, kind), value in zip(SIGNATURES[name], values):
            if kind == POINTER:
                if value not in self.memory:
                    raise RuntimeError(f"{name}.{arg}: address {value:#x} is not an allocated buffer")
                raw.append(ctypes.c_void_p(self.memory[value].ctypes.data))
            else:
                raw.append(ctypes.c_int(np.int32(np.uint32(value))).value)
        unit.call(*raw)


# -- pynq -----------------------------------------------------------------------------------------
class FakePynqBuffer(np.ndarray):
    def sync_to_device(self):
        self.board.calls.append(("sync_to_device", self.device_address))
        self.board.memory[self.device_address][:self.nbytes] = self.view(np.uint8).ravel()

    def sync_from_device(self):
        self.board.calls.append(("sync_from_device", self.device_address))
        self.view(np.uint8).ravel()[:] = self.board.memory[self.device_address][:self.nbytes]

    def freebuffer(self):
        self.board.calls.append(("freebuffer", self.device_address))


class FakeIP:
    """pynq.overlay.DefaultIP: 32-bit register read/write; ap_start runs the kernel."""

    def __init__(self, board: Board, kernel: str):
        self.board, self.kernel = board, kernel
        self.registers: dict[int, int] = {}
        self.done = False

    def write(self, offset, value):
        self.board.calls.append(("write", self.kernel, offset, value))
        assert 0 <= value <= 0xFFFFFFFF, "a 32-bit register"
        self.registers[offset] = value
        if offset == CONTROL and value & AP_START:
            values = []
            for arg, kind in SIGNATURES[self.kernel]:
                at = register_offsets(self.kernel)[arg]
                low = self.registers.get(at, 0)
                values.append(low | self.registers.get(at + 4, 0) << 32 if kind == POINTER else low)
            self.board.execute(self.kernel, values)
            self.done = True

    def read(self, offset):
        self.board.calls.append(("read", self.kernel, offset))
        if offset != CONTROL:
            return self.registers.get(offset, 0)
        status = AP_IDLE | (AP_DONE if self.done else 0)
        self.done = False  # ap_done is clear-on-read
        return status


def fake_pynq(board: Board, ip_names=("pearl_sumtree_0",)) -> types.ModuleType:
    module = types.ModuleType("pynq")

    def allocate(shape, dtype="u4", target=None, **kwargs):
        board.calls.append(("allocate", tuple(shape), np.dtype(dtype).str))
        buffer = np.zeros(shape, dtype).view(FakePynqBuffer)
        buffer.board = board
        buffer.device_address = board.reserve(buffer.nbytes)
        return buffer

    class Overlay:
        def __init__(self, bitfile_name, download=True, **kwargs):
            board.calls.append(("Overlay", bitfile_name))
            self.ip_dict = {name: {"type": f"xilinx.com:hls:{name.rsplit('_', 1)[0]}:1.0"} for name in ip_names}
            for name in ip_names:
                setattr(self, name, FakeIP(board, name.rsplit("_", 1)[0]))

    module.allocate, module.Overlay = allocate, Overlay
    return module


# -- pyxrt ----------------------------------------------------------------------------------------
def fake_pyxrt(board: Board, device_count: int = 1) -> types.ModuleType:
    module = types.ModuleType("pyxrt")
    Direction = enum.Enum("xclBOSyncDirection", ["XCL_BO_SYNC_BO_TO_DEVICE", "XCL_BO_SYNC_BO_FROM_DEVICE"])
    State = enum.Enum("ert_cmd_state", ["ERT_CMD_STATE_COMPLETED", "ERT_CMD_STATE_ERROR"])
    module.xclBOSyncDirection, module.ert_cmd_state = Direction, State

    class device:
        def __init__(self, index):
            if index >= device_count:
                raise RuntimeError(f"No such device {index}")
            board.calls.append(("device", index))

        def load_xclbin(self, xclbin_obj):
            board.calls.append(("load_xclbin", xclbin_obj.path))
            return "uuid-" + xclbin_obj.path

    class xclbin:
        def __init__(self, path):
            board.calls.append(("xclbin", path))
            self.path = path

    class bo:
        normal = "normal"

        def __init__(self, dev, nbytes, flags, group):
            board.calls.append(("bo", nbytes, flags, group))
            self.nbytes = nbytes
            self.host = bytearray(nbytes)
            self.address = board.reserve(nbytes)

        def map(self):
            return memoryview(self.host)

        def sync(self, direction, size, offset):
            board.calls.append(("sync", direction.name, size, offset, self.address))
            device_bytes = board.memory[self.address]
            host = np.frombuffer(self.host, np.uint8)
            if direction is Direction.XCL_BO_SYNC_BO_TO_DEVICE:
                device_bytes[offset:offset + size] = host[offset:offset + size]
            else:
                host[offset:offset + size] = device_bytes[offset:offset + size]

    class run:
        def __init__(self, state):
            self.state = state

        def wait(self, timeout=0):
            board.calls.append(("wait",))
            return self.state

    class kernel:
        shared = "shared"

        def __init__(self, dev, uuid, name, mode):
            board.calls.append(("kernel", uuid, name, mode))
            self.name = name

        def group_id(self, index):
            return 0  # hls/connectivity.cfg puts every argument in DDR[0]

        def __call__(self, *args):
            board.calls.append(("start", self.name, tuple(a.address if isinstance(a, bo) else a for a in args)))
            board.execute(self.name, [a.address if isinstance(a, bo) else a for a in args])
            return run(State.ERT_CMD_STATE_COMPLETED)

    module.device, module.xclbin, module.bo, module.kernel = device, xclbin, bo, kernel
    return module
