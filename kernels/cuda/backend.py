"""The cuda backend: a GPU through torch. Replay tasks keep the whole table (storage and sum tree
as tensors) on the GPU and hand batches to a torch learner there; learn runs the generic torch
learner. No act kernel. Importing this module does not import torch."""
from __future__ import annotations

from pearl.errors import ConfigError
from pearl.kernels.registry import REPLAY_TASKS, Backend, register


class CUDABackend(Backend):
    kind = "cuda"
    table_on_device = True
    platform_keys = {"sms": True, "clock_mhz": False, "peak_gflops": True, "memory_bandwidth_gb_s": True,
                     "memory_gib": False}
    # kernel launches per task call (the torch ops of pearl/replay/device.py and the learner)
    call_counts = {"act": 8, "insert": 6, "sample": 12, "update_priorities": 10, ("learn", "torch"): 70,
                   "sync_weights": 2}
    algo_call_counts = {("ddpg", "learn", "torch"): 120, ("td3", "learn", "torch"): 100,
                        ("sac", "learn", "torch"): 200}

    def detect(self) -> list[dict]:
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

    def check(self, device, platform=None, field: str = "device") -> None:
        import torch

        if not torch.cuda.is_available():
            raise ConfigError(f"{field}: {device} requested but torch sees no CUDA GPU (run `pearl devices`)")
        if device.index >= torch.cuda.device_count():
            raise ConfigError(f"{field}: {device}: no such CUDA device ({torch.cuda.device_count()} found; "
                              f"see `pearl devices`)")

    def can_run(self, task: str, workload) -> str | None:
        if task in REPLAY_TASKS:
            if workload.image:  # its storage holds flat float32 observations
                return "holds flat float32 observations; image observations keep the replay on the cpu"
            if workload.continuous:  # the continuous learners read numpy batches
                return (f"holds a replay table that feeds the DQN learner only; {workload.algo} keeps its "
                        f"replay on the cpu")
            if workload.replay_kind not in ("uniform", "prioritized"):
                return f"has no {task} kernel for {workload.replay_kind} replay"
            return None
        if task == "act":
            return f"has no act kernel for {workload.algo}"
        return None  # learn, sync_weights: the torch learner

    def learner_kernels(self, workload) -> tuple[str, ...]:
        return ("torch",)

    def draft(self, device: dict, host: dict) -> tuple[list[str], list[str]]:
        entry = [f"  - id: {device['id']}", "    kind: cuda", f"    name: {device['name']!r}",
                 f"    sms: {device['sms']}                  # torch.cuda.get_device_properties",
                 f"    memory_gib: {device['memory_gib']}          # torch.cuda.get_device_properties",
                 f"    peak_gflops: {device['sms'] * 128 * 2 * 1.5:.0f}      # assumed (draft): SMs x 128 lanes x 2 x 1.5 GHz",
                 "    memory_bandwidth_gb_s: 1000  # assumed (draft)",
                 "    launch_us: 8.0              # assumed (draft): one torch op launch",
                 "    power_w: {idle: 40, tdp: 300}   # assumed (draft)"]
        link = [f"  - between: [cpu, {device['id']}]", "    kind: pcie",
                "    bandwidth_gb_s: 12.0        # assumed (draft)", "    latency_us: 10.0            # assumed (draft)"]
        return entry, link

    # `device`: a DeviceId (cuda:N) or a torch device string ("cpu": the same kernels on CPU
    # tensors, how they are tested without a GPU)
    def sum_tree(self, device, capacity: int, fanout: int, platform=None):
        from pearl.kernels.cuda.sumtree import TorchSumTree

        return TorchSumTree(capacity, fanout, str(device))

    def storage(self, device, capacity: int, obs_dim: int, action_dtype, action_shape):
        from pearl.kernels.cuda.sumtree import TorchTransitionStorage

        return TorchTransitionStorage(capacity, obs_dim, str(device), action_dtype, action_shape)


register(CUDABackend())
