"""The cpu backend: the host. Runs every task; its sum tree is the numba tree (the numpy
reference and AMPER are the replay config's other cpu variants, pearl/replay/prioritized.py).
Light: importing it imports no numba kernel, torch or SciPy."""
from __future__ import annotations

import functools
import os
import platform as _platform

from pearl.errors import ConfigError
from pearl.kernels.registry import Backend, register


def cpu_model() -> str:
    """The CPU's model name (also what the benchmarks print in their headers)."""
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return _platform.processor() or _platform.machine()


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (/proc/cpuinfo; empty where there is none)."""
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


# bfloat16 matrix units: AMX tiles or AVX-512 BF16 dot products (oneDNN uses either); without one,
# torch's bfloat16 products are emulated and slower than float32
BF16_FLAGS = ("amx_bf16", "avx512_bf16")


def bf16_products(flags: frozenset[str] | None = None) -> bool:
    """Whether this CPU multiplies bfloat16 in hardware (so a bf16 learner can pay)."""
    return any(flag in (cpu_flags() if flags is None else flags) for flag in BF16_FLAGS)


def _memory_gib() -> float | None:
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        return None


def proc_bytes(path: str, key: str) -> int | None:
    """The bytes of a `key: N kB` line of a /proc file (None where the file or the key is missing)."""
    try:
        with open(path) as lines:
            for line in lines:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def memory_available() -> int:
    """Bytes this machine can give a new table now: MemAvailable (free memory plus the page cache
    it can reclaim), or the physical memory where /proc/meminfo is missing. np.zeros maps a table
    lazily, so a table larger than this starts fine and is killed when it fills."""
    available = proc_bytes("/proc/meminfo", "MemAvailable")
    return available if available is not None else os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


class CPUBackend(Backend):
    kind = "cpu"
    platform_keys = {"cores": True, "clock_mhz": True, "peak_gflops": True, "memory_bandwidth_gb_s": True,
                     "call_overhead_us": False}
    # Python-level kernel calls per task call, read off the runtime's code (with 4-64-64-2
    # networks every task is overhead-bound, so the counts matter more than the FLOPs); the
    # learners' counts are call-equivalents of `call_overhead_us`: the intercept of the learn time
    # against the batch's FLOPs on the development set (CartPole DQN, Pendulum DDPG / TD3 / SAC at
    # 64x64, batch 64 against 128 or 256, quiet 2-core CI machine, issue 17) at
    # estimator/costs.py's CPU_KERNEL_EFFICIENCY: the fused DQN update is one compiled call and a
    # few Python lines around it; an autograd update is a few hundred small torch ops.
    call_counts = {"act": 4, "insert": 4, "sample": 4, "update_priorities": 3, ("learn", "fused"): 2,
                   ("learn", "torch"): 160, "sync_weights": 1}
    # The continuous algorithms' own counts: a fused update is two MLP forwards and backwards per
    # network on preallocated buffers, two Adam steps and the target lerps
    # (pearl/runtime/fused_actor_critic.py; TD3's actor half every other update), each a torch
    # call on preallocated buffers; autograd's update is a few hundred ops (SAC's sampling and
    # log-prob more); acting adds the policy's head and the action scaling. Fitted as above;
    # `pearl profile` replaces them with the real figures. A bf16 fused update ("fused/bf16") adds
    # its conversions: two per MLP forward and per backward, one weight copy per stepped network.
    # The fused counts (both precisions) were cut in session 10 when the fused learners stopped
    # going through torch.optim's step (~140 us of Python each) and SAC's elementwise steps became
    # compiled kernels: each is the session-9 count scaled by the measured ratio of the learn call's
    # CPU time, new / old code interleaved at 64x64 batch 64 (benchmarks/ddpg_precision.py
    # --learn-ab; DDPG 0.59 / bf16 0.65, TD3 0.64 / 0.65, SAC 0.42 / 0.55, load 12-19), less the
    # FLOP time the model holds unchanged: a re-fit on the quiet machine is still owed. TD3's and
    # SAC's were cut again in session 11 (twin critics as one batched product per layer) the same
    # way: mean ratio of two interleaved runs at 64x64 batch 64, load 7-8 (--learn-ab 559b328:
    # TD3 0.91 / bf16 0.71, SAC 0.82 / bf16 0.86; DDPG's 0.98-1.03, unchanged).
    algo_call_counts = {("ddpg", "act"): 6, ("td3", "act"): 6, ("sac", "act"): 6,
                        ("ddpg", "learn", "fused"): 32, ("td3", "learn", "fused"): 34,
                        ("ddpg", "learn", "fused/bf16"): 53, ("td3", "learn", "fused/bf16"): 39,
                        ("sac", "learn", "fused"): 19, ("sac", "learn", "fused/bf16"): 57,
                        ("ddpg", "learn", "torch"): 195, ("td3", "learn", "torch"): 190,
                        ("sac", "learn", "torch"): 360,
                        # DQN's torch CNN learner in bf16: the autograd update's ops plus BF16Copy's
                        # conversions (a gradient per parameter, the weight copy, the float32 outputs)
                        ("dqn", "learn", "torch/bf16"): 175}

    def detect(self) -> list[dict]:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        return [{"id": "cpu", "kind": "cpu", "name": cpu_model(), "cores": cores, "memory_gib": _memory_gib()}]

    def check(self, device, platform=None, field: str = "device") -> None:
        if device.index != 0:
            raise ConfigError(f"{field}: {device}: no such device (the host is one device, cpu or cpu:0)")

    def can_run(self, task: str, workload) -> str | None:
        return None

    def learner_kernels(self, workload) -> tuple[str, ...]:
        """The fused numba learner runs MLPs; a CNN (image observations) learns with torch."""
        return workload.learner_kernels

    def learner_precisions(self, workload, kernel: str) -> tuple[str, ...]:
        """bf16 too, on a CPU with bfloat16 units, for the fused DDPG / TD3 / SAC learners and for
        DQN's torch learner of a CNN Q-network stepping Adam (pearl/runtime/learners.py)."""
        if not bf16_products():
            return ("fp32",)
        if kernel == "torch" and workload.algo == "dqn" and workload.image and workload.optimizer == "adam":
            return ("fp32", "bf16")
        return workload.fused_precisions if kernel == "fused" else ("fp32",)

    def sum_tree(self, device, capacity: int, fanout: int, platform=None):
        from pearl.kernels.cpu.fast_sumtree import NumbaSumTree

        return NumbaSumTree(capacity, fanout)

    def policy(self, device, layout):
        from pearl.kernels.cpu.mlp import QPolicy

        return QPolicy(layout)


register(CPUBackend())
