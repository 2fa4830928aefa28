"""The opencl backend: any OpenCL device (a GPU's driver, or PoCL on the host CPU) whose compiler
builds kernels, numbered opencl:0, opencl:1, ... in the order of (platform, device) that pyopencl
lists them (kernels/opencl/devices.py). Prioritized replay's sum tree (transition storage stays in
host memory) and DQN's act (the Q-network, one launch per layer). Importing this module does not
import pyopencl."""
from __future__ import annotations

from pearl.errors import ConfigError
from pearl.kernels.opencl import devices
from pearl.kernels.registry import REPLAY_TASKS, Backend, register


def context(index: int):
    """A pyopencl context on device opencl:`index`."""
    handles = devices.usable()
    if index >= len(handles):
        raise ConfigError(f"opencl:{index}: no such OpenCL device ({len(handles)} found; "
                          f"see `pearl devices`)")
    import pyopencl as cl

    return cl.Context([handles[index][1]])


class OpenCLBackend(Backend):
    kind = "opencl"
    platform_keys = {"compute_units": False, "peak_gflops": True, "memory_bandwidth_gb_s": True, "host": False}
    # kernel launches (enqueue + finish) per task call
    call_counts = {"act": 3, "insert": 2, "sample": 3, "update_priorities": 2}

    def detect(self) -> list[dict]:
        return [{"id": f"opencl:{i}", "kind": "opencl", "name": dev.name.strip(),
                 "platform": plat.name.strip(), "compute_units": dev.max_compute_units,
                 "memory_gib": round(dev.global_mem_size / 2**30, 1)}
                for i, (plat, dev) in enumerate(devices.usable())]

    def unusable(self) -> list[dict]:
        return [{"kind": "opencl", "name": dev.name.strip(),
                 "reason": f"{plat.name.strip()}: its compiler builds no kernel: {error}"}
                for plat, dev, error in devices.unusable()]

    def check(self, device, platform=None, field: str = "device") -> None:
        count = len(devices.usable())
        if device.index >= count:
            raise ConfigError(f"{field}: {device}: no such OpenCL device ({count} found; see `pearl devices`)")

    def draft(self, device: dict, host: dict) -> tuple[list[str], list[str]]:
        on_host = "pocl" in device["platform"].lower() or "portable computing" in device["platform"].lower()
        entry = [f"  - id: {device['id']}", "    kind: opencl", f"    name: {device['name']!r}",
                 f"    compute_units: {device['compute_units']}        # pyopencl max_compute_units"]
        if on_host:
            entry += ["    host: cpu                   # an OpenCL device on the host CPU: its power is the cpu's",
                      f"    peak_gflops: {host['peak_gflops']}         # the host's cores", "    memory_bandwidth_gb_s: "
                      f"{10.0 * host['cores']:.1f}   # assumed (draft): as the cpu"]
        else:
            entry += ["    peak_gflops: 1000           # assumed (draft)", "    memory_bandwidth_gb_s: 100  # assumed (draft)",
                      "    power_w: {idle: 10, tdp: 100}   # assumed (draft)"]
        entry += ["    launch_us: 15.0             # assumed (draft): one enqueue + finish"]
        link = [f"  - between: [cpu, {device['id']}]", "    kind: " + ("host-memory" if on_host else "pcie"),
                "    bandwidth_gb_s: 10.0        # assumed (draft)", "    latency_us: 5.0             # assumed (draft)"]
        return entry, link

    def can_run(self, task: str, workload) -> str | None:
        if task in REPLAY_TASKS:
            if workload.replay_kind != "prioritized":
                return f"has no {task} kernel for {workload.replay_kind} replay"
            return None
        if task == "act":
            if workload.image:
                return "has no act kernel for a CNN (image observations act on the cpu)"
            return None if workload.algo == "dqn" else f"has no act kernel for {workload.algo}"
        return f"has no {'learner' if task == 'learn' else task + ' kernel'} for {workload.algo}"

    def sum_tree(self, device, capacity: int, fanout: int, platform=None):
        from pearl.kernels.opencl.sumtree import OpenCLSumTree

        return OpenCLSumTree(capacity, fanout, context=context(device.index))

    def policy(self, device, layout):
        from pearl.kernels.opencl.mlp import OpenCLQPolicy

        return OpenCLQPolicy(layout, context=context(device.index))


register(OpenCLBackend())
