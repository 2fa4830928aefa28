"""What compute this machine has: CPU cores, CUDA GPUs (through torch), OpenCL devices (pyopencl)."""
from __future__ import annotations

import os
import platform


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gib() -> float | None:
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        return None


def cpu_devices() -> list[dict]:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return [{"id": "cpu", "kind": "cpu", "name": _cpu_model(), "cores": cores, "memory_gib": _memory_gib()}]


def cuda_devices() -> list[dict]:
    import torch

    if not torch.cuda.is_available():
        return []
    out = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        out.append({"id": f"cuda:{i}", "kind": "cuda", "name": props.name,
                    "sms": props.multi_processor_count,
                    "memory_gib": round(props.total_memory / 2**30, 1),
                    "capability": f"{props.major}.{props.minor}"})
    return out


def _opencl_handles() -> list:
    """(platform, device) pairs in the order that numbers them opencl:0, opencl:1, ..."""
    try:
        import pyopencl as cl
    except ImportError:
        return []
    try:
        platforms = cl.get_platforms()
    except cl.Error:  # no ICD loader or no platform installed
        return []
    pairs = []
    for plat in platforms:
        try:
            pairs += [(plat, dev) for dev in plat.get_devices()]
        except cl.Error:  # a platform without devices
            continue
    return pairs


def opencl_devices() -> list[dict]:
    return [{"id": f"opencl:{i}", "kind": "opencl", "name": dev.name.strip(),
             "platform": plat.name.strip(), "compute_units": dev.max_compute_units,
             "memory_gib": round(dev.global_mem_size / 2**30, 1)}
            for i, (plat, dev) in enumerate(_opencl_handles())]


def opencl_context(index: int):
    """A pyopencl context on device opencl:`index`."""
    from pearl.errors import ConfigError

    handles = _opencl_handles()
    if index >= len(handles):
        raise ConfigError(f"opencl:{index}: no such OpenCL device ({len(handles)} found; see `pearl devices`)")
    import pyopencl as cl

    return cl.Context([handles[index][1]])


def detect_devices() -> list[dict]:
    return cpu_devices() + cuda_devices() + opencl_devices()
