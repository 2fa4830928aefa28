"""What compute this machine has, as the registered backends detect it (pearl.kernels.registry:
each kind's `detect`), and a draft platform profile of it."""
from __future__ import annotations

import platform

from pearl.kernels.registry import backend, backends


def detect_devices() -> list[dict]:
    """Every registered backend's devices on this machine, the host's cpu first."""
    return [device for b in backends() for device in b.detect()]


def unusable_devices() -> list[dict]:
    """Devices the backends found but cannot use, with why (kind, name, reason)."""
    return [device for b in backends() for device in b.unusable()]


# The built-in kinds' lists, for callers that want one kind (pearl profile, autotune).
def cpu_devices() -> list[dict]:
    return backend("cpu").detect()


def cuda_devices() -> list[dict]:
    return backend("cuda").detect()


def opencl_devices() -> list[dict]:
    return backend("opencl").detect()


def _cpu_clock_mhz() -> tuple[float, str]:
    """The nominal clock: the model name's "@ x.xGHz", else BogoMIPS / 2 (the TSC on x86)."""
    import re

    model = cpu_devices()[0]["name"]
    match = re.search(r"@\s*([0-9.]+)\s*GHz", model)
    if match:
        return float(match.group(1)) * 1000, "the CPU model name"
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.lower().startswith("bogomips"):
                    return round(float(line.split(":", 1)[1]) / 2, 1), "/proc/cpuinfo BogoMIPS / 2"
    except (OSError, ValueError):
        pass
    return 2000.0, "assumed (no clock found)"


def _simd_float32_lanes() -> tuple[int, str]:
    try:
        flags = next((line for line in open("/proc/cpuinfo") if line.startswith("flags")), "")
    except OSError:
        flags = ""
    if " avx512f" in flags:
        return 16, "avx512f flag"
    if " avx2" in flags or " avx " in flags:
        return 8, "avx/avx2 flag"
    return 4, "assumed 128-bit SIMD"


def draft_profile(path: str, name: str | None = None) -> str:
    """Writes a platform profile of this machine to `path` (atomically) and returns its text.

    Figures found on the machine say where they came from; the rest (power, memory bandwidth,
    launch costs) are marked "assumed (draft)" for the user to replace with datasheet figures.
    The draft is loaded back through the schema before it is kept, so it always validates.
    """
    from pathlib import Path

    from pearl.io import atomic_write_text
    from pearl.platforms import load_platform

    cpu = cpu_devices()[0]
    clock, clock_source = _cpu_clock_mhz()
    lanes, lanes_source = _simd_float32_lanes()
    peak = round(cpu["cores"] * clock / 1000 * lanes * 2 * 2, 1)
    name = name or Path(path).stem
    lines = [
        f"# Drafted by `pearl devices --write` on {platform.node()}: a starting point, not a datasheet.",
        "# Figures marked \"assumed (draft)\" were not found on the machine: replace them with the",
        "# datasheet figure and its source (platforms/README.md).",
        f"name: {name}",
        f"description: {cpu['name']}, {cpu['cores']} cores, {cpu['memory_gib']} GiB",
        "devices:",
        "  - id: cpu",
        "    kind: cpu",
        f"    name: {cpu['name']!r}",
        f"    cores: {cpu['cores']}                  # os.sched_getaffinity",
        f"    clock_mhz: {clock}            # {clock_source}",
        f"    peak_gflops: {peak}          # cores x clock x {lanes} float32 lanes ({lanes_source}) x 2 FMA x 2",
        f"    memory_bandwidth_gb_s: {10.0 * cpu['cores']:.1f}   # assumed (draft): 10 GB/s per core",
        "    call_overhead_us: 5.0       # assumed (draft): one Python-level kernel call",
        f"    power_w: {{idle: {2.0 * cpu['cores']:.1f}, tdp: {6.0 * cpu['cores']:.1f}}}   # assumed (draft): 2 W / 6 W per core",
    ]
    links = []
    for b in backends():  # the host is drafted above; every other detected device by its backend
        for device in b.detect() if b.kind != "cpu" else ():
            entry, link = b.draft(device, {"cores": cpu["cores"], "peak_gflops": peak})
            lines += entry
            links += link
    text = "\n".join(lines + (["links:"] + links if links else [])) + "\n"
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:  # validate before replacing anything the user has
        check = Path(tmp) / f"{name}.yaml"
        check.write_text(text)
        load_platform(check)
    atomic_write_text(path, text)
    return text
