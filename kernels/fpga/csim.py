"""ctypes bindings of the C-simulation libraries (hls/*/..._csim.cpp, built by build.py).

`implementation(kernel, defines)` returns one simulated compute unit: `.call(*raw_args)` runs the
kernel body on raw C arguments (ints, pointers) and `.cycles(timing, *args)` is the timing
model's count for that call. Each unit owns its on-chip state (a sum tree, on-chip weights).
"""
from __future__ import annotations

import ctypes
from functools import lru_cache

import numpy as np

from pearl.kernels.fpga import build, timing

_P = ctypes.c_void_p
_I = ctypes.c_int


@lru_cache(maxsize=None)
def _library(kernel: str, source: str, defines: tuple) -> ctypes.CDLL:
    return ctypes.CDLL(str(build.build(kernel, [source], dict(defines))))


def sumtree_library(fanout: int, depth: int, double: bool) -> ctypes.CDLL:
    defines = {"PEARL_SUMTREE_FANOUT": fanout, "PEARL_SUMTREE_DEPTH": depth}
    if double:
        defines["PEARL_SUMTREE_DOUBLE"] = None
    lib = _library("sumtree", "sumtree_csim.cpp", tuple(sorted(defines.items())))
    if not getattr(lib, "_pearl_typed", False):
        lib.pearl_sumtree_new.restype = _P
        lib.pearl_sumtree_free.argtypes = [_P]
        lib.pearl_sumtree_call.argtypes = [_P, _I, _I, _P, _P, _P, _P]
        lib.pearl_sumtree_call.restype = _I
        lib.pearl_sumtree_read_level.argtypes = [_P, _I, _I, _P]
        lib.pearl_sumtree_read_level.restype = _I
        lib._pearl_typed = True
    return lib


def mlp_library(max_width: int, max_batch: int) -> ctypes.CDLL:
    defines = {"PEARL_MLP_MAX_WIDTH": max_width, "PEARL_MLP_MAX_BATCH": max_batch}
    lib = _library("mlp", "mlp_csim.cpp", tuple(sorted(defines.items())))
    if not getattr(lib, "_pearl_typed", False):
        lib.pearl_mlp_limits.argtypes = [_P]
        for name in ("pearl_mlp_forward_new", "pearl_mlp_train_new"):
            getattr(lib, name).restype = _P
        for name in ("pearl_mlp_forward_free", "pearl_mlp_train_free"):
            getattr(lib, name).argtypes = [_P]
        lib.pearl_mlp_forward_call.argtypes = [_P, _I, _I, _I, _P, _P, _P, _P]
        lib.pearl_mlp_forward_call.restype = _I
        lib.pearl_mlp_train_call.argtypes = [_P, _I, _I, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P]
        lib.pearl_mlp_train_call.restype = _I
        lib._pearl_typed = True
    return lib


def _pow2_at_least(n: int, floor: int = 8) -> int:
    return max(floor, 1 << (int(n) - 1).bit_length())


class _Unit:
    def __init__(self, lib, new, free, call):
        self._lib, self._free, self._call = lib, getattr(lib, free), getattr(lib, call)
        self.handle = getattr(lib, new)()
        if not self.handle:
            raise MemoryError("C-simulation: out of memory for the kernel's on-chip state")

    def __del__(self):
        handle, self.handle = getattr(self, "handle", None), None
        if handle:
            self._free(handle)

    def call(self, *raw) -> None:
        status = self._call(self.handle, *raw)
        if status != 0:
            raise ValueError(f"C-simulated kernel refused the call (status {status}): arguments outside "
                             f"the build's limits")


class SumTreeUnit(_Unit):
    """pearl_sumtree; defines: PEARL_SUMTREE_FANOUT, PEARL_SUMTREE_DEPTH, PEARL_SUMTREE_DOUBLE (bool)."""

    def __init__(self, defines: dict):
        self.fanout = int(defines.get("PEARL_SUMTREE_FANOUT", 16))
        self.depth = int(defines.get("PEARL_SUMTREE_DEPTH", 5))
        lib = sumtree_library(self.fanout, self.depth, bool(defines.get("PEARL_SUMTREE_DOUBLE", False)))
        super().__init__(lib, "pearl_sumtree_new", "pearl_sumtree_free", "pearl_sumtree_call")
        self._cycles: dict = {}

    _OP_NAMES = {v: k for k, v in timing.SUMTREE_OPS.items()}

    def cycles(self, kernel_timing, op, n, *_):
        key = (id(kernel_timing), op, n)
        cached = self._cycles.get(key)
        if cached is None:  # a training run repeats a handful of (op, batch) shapes
            cached = self._cycles[key] = timing.sumtree_cycles(kernel_timing, self._OP_NAMES[int(op)], int(n),
                                                               self.fanout, self.depth)
        return cached

    def read_level(self, level: int, which: int) -> np.ndarray:
        out = np.empty(self.fanout ** level, np.float64)
        if self._lib.pearl_sumtree_read_level(self.handle, level, which, out.ctypes.data) != 0:
            raise IndexError(f"no level {level}")
        return out


class MLPForwardUnit(_Unit):
    """pearl_mlp_forward; defines: PEARL_MLP_MAX_WIDTH, PEARL_MLP_MAX_BATCH (rounded up to powers
    of two; zero padding to a power of two keeps every adder tree's association)."""

    def __init__(self, defines: dict):
        lib = mlp_library(_pow2_at_least(defines.get("PEARL_MLP_MAX_WIDTH", 256)),
                          _pow2_at_least(defines.get("PEARL_MLP_MAX_BATCH", 256)))
        super().__init__(lib, "pearl_mlp_forward_new", "pearl_mlp_forward_free", "pearl_mlp_forward_call")
        self.sizes: list[int] = []

    def call(self, load_weights, n_layers, batch, sizes, params, obs, q) -> None:
        if load_weights:
            self.sizes = list(np.ctypeslib.as_array(ctypes.cast(sizes, ctypes.POINTER(ctypes.c_int)),
                                                    (n_layers + 1,)))
        super().call(load_weights, n_layers, batch, sizes, params, obs, q)
        self._loaded = bool(load_weights)

    def cycles(self, kernel_timing, load_weights, n_layers, batch, *_):
        return timing.mlp_forward_cycles(kernel_timing, self.sizes, int(batch), bool(load_weights))


class MLPTrainUnit(_Unit):
    """pearl_mlp_train_step; defines as for MLPForwardUnit."""

    def __init__(self, defines: dict):
        lib = mlp_library(_pow2_at_least(defines.get("PEARL_MLP_MAX_WIDTH", 256)),
                          _pow2_at_least(defines.get("PEARL_MLP_MAX_BATCH", 256)))
        super().__init__(lib, "pearl_mlp_train_new", "pearl_mlp_train_free", "pearl_mlp_train_call")
        self.sizes: list[int] = []

    def call(self, n_layers, batch, sizes, *rest) -> None:
        self.sizes = list(np.ctypeslib.as_array(ctypes.cast(sizes, ctypes.POINTER(ctypes.c_int)), (n_layers + 1,)))
        super().call(n_layers, batch, sizes, *rest)

    def cycles(self, kernel_timing, n_layers, batch, *_):
        return timing.mlp_train_step_cycles(kernel_timing, self.sizes, int(batch))


_UNITS = {"pearl_sumtree": SumTreeUnit, "pearl_mlp_forward": MLPForwardUnit,
          "pearl_mlp_train_step": MLPTrainUnit}


def implementation(kernel: str, defines: dict):
    if kernel not in _UNITS:
        raise KeyError(f"no C-simulation of kernel {kernel!r} (have {', '.join(_UNITS)})")
    return _UNITS[kernel](defines)
