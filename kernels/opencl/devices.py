"""Which OpenCL devices this process can use: the one home of their discovery and numbering.

A device counts only once its compiler has built a trivial kernel. An OpenCL driver may list a
device it cannot compile for: PoCL 3.0 (the pocl-binary-distribution wheel, LLVM 14) passes the
host CPU's LLVM name to its code generator, and on a CPU newer than its LLVM (an AMD Zen 5, family
26) that name is "generic", which the same LLVM then refuses ("unknown target CPU 'generic'"), so
every program build fails. Such a device is left out of the numbering (opencl:0, opencl:1, ... count
the usable ones) and reported with its compiler's message by `unusable()` (`pearl devices` prints
it), instead of failing later inside a replay table's constructor.

PoCL compiles kernels into POCL_CACHE_DIR; when unset, a fresh per-process temporary directory is
used. Importing this module does not import pyopencl.
"""
from __future__ import annotations

import atexit
import os
import shutil
import tempfile

_CACHE_DIR: str | None = None
# device int_ptr -> None (builds) or the compiler's message; each device is probed once a process
_PROBED: dict[int, str | None] = {}
PROBE_SOURCE = "__kernel void probe(__global float *x) { x[get_global_id(0)] += 1.0f; }"


def _ensure_cache_dir() -> None:
    """PoCL needs a writable kernel cache; give this process its own unless one is configured.
    Must run before the first platform query (PoCL reads the variable when it initialises)."""
    global _CACHE_DIR
    if os.environ.get("POCL_CACHE_DIR") or _CACHE_DIR is not None:
        return
    _CACHE_DIR = tempfile.mkdtemp(prefix="pearl-pocl-")
    os.environ["POCL_CACHE_DIR"] = _CACHE_DIR
    atexit.register(shutil.rmtree, _CACHE_DIR, True)


def cl():
    """pyopencl, after the kernel cache is set up."""
    _ensure_cache_dir()
    import pyopencl

    return pyopencl


def listed() -> list[tuple]:
    """Every (platform, device) pair the installed drivers list, usable or not."""
    try:
        pyopencl = cl()
    except ImportError:
        return []
    try:
        platforms = pyopencl.get_platforms()
    except pyopencl.Error:  # no ICD loader or no platform installed
        return []
    pairs = []
    for platform in platforms:
        try:
            pairs += [(platform, device) for device in platform.get_devices()]
        except pyopencl.Error:  # a platform without devices raises DEVICE_NOT_FOUND
            continue
    return pairs


def compile_error(device) -> str | None:
    """None if `device` builds a trivial kernel, else the compiler's message (one line)."""
    key = device.int_ptr
    if key not in _PROBED:
        pyopencl = cl()
        try:
            pyopencl.Program(pyopencl.Context([device]), PROBE_SOURCE).build()
            _PROBED[key] = None
        except pyopencl.Error as error:
            _PROBED[key] = _first_error_line(str(error))
    return _PROBED[key]


def _first_error_line(message: str) -> str:
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    errors = [line for line in lines if line.lower().startswith("error")]
    return (errors or lines or ["the program build failed"])[0]


def usable() -> list[tuple]:
    """The (platform, device) pairs that build kernels, in the order that numbers them opencl:0, ..."""
    return [(platform, device) for platform, device in listed() if compile_error(device) is None]


def unusable() -> list[tuple]:
    """(platform, device, the compiler's message) for each listed device that builds no kernel."""
    return [(platform, device, error) for platform, device in listed()
            if (error := compile_error(device)) is not None]
