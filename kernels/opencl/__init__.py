"""OpenCL backend: the prioritized-replay sum tree, transition storage and Q-network inference
on an OpenCL device.

Importing this package does not import pyopencl; `available()` says whether it can run here.
"""
from pearl.kernels.opencl.sumtree import (  # noqa: F401
    OpenCLSumTree,
    OpenCLTransitionStorage,
    available,
    default_context,
    default_queue,
    kernel_source,
    parse_device_spec,
    sample_batch,
)
from pearl.kernels.opencl.mlp import OpenCLQPolicy, mlp_kernel_source  # noqa: F401,E402
