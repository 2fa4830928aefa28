"""OpenCL backend: the prioritized-replay sum tree, transition storage and Q-network inference
on an OpenCL device.

Importing this package imports neither pyopencl nor the CPU kernels (the registry imports
`backend.py` below it on every run): names load on first use. `available()` says whether it can
run here.
"""
from importlib import import_module

_EXPORTS = {name: "pearl.kernels.opencl.sumtree" for name in (
    "OpenCLSumTree", "OpenCLTransitionStorage", "available", "default_context", "default_queue",
    "kernel_source", "parse_device_spec", "sample_batch")}
_EXPORTS.update(OpenCLQPolicy="pearl.kernels.opencl.mlp", mlp_kernel_source="pearl.kernels.opencl.mlp")


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'pearl.kernels.opencl' has no attribute {name!r}")
