"""FPGA backend: the HLS kernels of hls/ behind one driver interface (kernels/fpga/driver.py).

- `SimDevice`: no board needed. The kernels are the HLS C++ sources compiled with the host's
  C++ compiler (C-simulation, build.py) and time is the cycle model of timing.py at the clock of a
  platform profile (platforms/*.yaml). Everything it reports is SIMULATED.
- `PynqDevice` (Zynq MPSoC boards through PYNQ) and `XrtDevice` (Alveo cards through pyxrt):
  the same calls on a real bitstream.
- `FPGASumTree`: the prioritized-replay sum tree (the interface of kernels/cpu/sumtree.py) on
  any of them; `open_device` picks a real board when one is there, else the simulation.

Importing this package imports neither pynq nor pyxrt, nor numpy and the C-simulation driver
(the registry imports `backend.py` below it on every run): those names load on first use.
"""
from __future__ import annotations

import os
from importlib import import_module

from pearl.errors import ConfigError

_EXPORTS = {"CompilerMissing": "pearl.kernels.fpga.build", "available": "pearl.kernels.fpga.build",
            "FPGADevice": "pearl.kernels.fpga.driver", "SimDevice": "pearl.kernels.fpga.driver",
            "FPGASumTree": "pearl.kernels.fpga.sumtree"}
_DEVICES: dict = {}


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'pearl.kernels.fpga' has no attribute {name!r}")


def _real_device(profile, index: int):
    """The board of `profile` when its driver and a bitstream are there, else None."""
    bitstream = os.environ.get("PEARL_FPGA_BITSTREAM")
    if profile.driver == "xrt":
        try:
            import pyxrt
        except ImportError:
            return None
        from pearl.kernels.fpga.xrt_driver import XrtDevice

        try:
            device = XrtDevice(index, pyxrt_module=pyxrt)
        except Exception:  # no card at this index
            return None
    else:
        try:
            import pynq  # noqa: F401
        except ImportError:
            return None
        from pearl.kernels.fpga.pynq_driver import PynqDevice

        device = PynqDevice()
    if not bitstream:
        raise ConfigError(f"fpga:{index}: a {profile.name} is present but PEARL_FPGA_BITSTREAM (the .xclbin / "
                          f".bit built by hls/Makefile) is not set")
    device.load(bitstream)
    return device


def open_device(platform, index: int = 0, simulate: bool | None = None):
    """fpga:`index` of `platform` (a loaded platforms/ profile: the caller reads the YAML, the
    kernels do not): the real board when this machine has one (and PEARL_FPGA_SIMULATE is not 1),
    else its simulation. One device object per (profile, index) per process, so every kernel on
    it shares one simulated clock."""
    key = (platform.source, index)
    if key in _DEVICES:
        return _DEVICES[key]
    device_id = f"fpga:{index}"
    profile = platform.device(device_id)
    if simulate is None:
        simulate = os.environ.get("PEARL_FPGA_SIMULATE") == "1"
    device = None if simulate else _real_device(profile, index)
    if device is None:
        from pearl.kernels.fpga.driver import SimDevice

        device = SimDevice(platform, device_id)
    _DEVICES[key] = device
    return device
