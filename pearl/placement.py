"""The placement rule: which task may run on which device for a workload (one home; the builder,
the mapper and the profiler ask it)."""
from __future__ import annotations

from pearl.errors import ConfigError


def check_placement(devices: dict[str, str], workload, learner_kernel: str, platform: str = "") -> None:
    """Raises ConfigError (one line) unless every task of `devices` can run where it is placed."""
    algo, kind = workload.algo, workload.replay_kind
    act = devices.get("act", "cpu")
    if act != "cpu":
        if not (act.startswith("opencl:") and algo == "dqn"):
            raise ConfigError(f"plan.devices.act: {act} has no act kernel for {algo} "
                              f"(act runs on cpu, or opencl:N for DQN)")
        from pearl.devices import opencl_context

        opencl_context(int(act.split(":")[1]))  # a missing device fails here, not in an actor
    for task in ("insert", "sample", "update_priorities"):
        device = devices.get(task, "cpu")
        if device == "cpu":
            continue
        whole_table_on_gpu = device.startswith("cuda") and kind in ("uniform", "prioritized")
        if not (whole_table_on_gpu or (device.startswith(("opencl", "fpga")) and kind == "prioritized")):
            raise ConfigError(f"plan.devices.{task}: {device} has no {task} kernel for "
                              f"{kind} replay (prioritized replay runs on cpu, opencl:N, fpga:N "
                              f"or cuda:N, uniform replay on cpu or cuda:N)")
    sample = devices.get("sample", "cpu")
    for task in ("insert", "update_priorities"):
        if devices.get(task, "cpu") != sample:
            raise ConfigError(f"plan.devices.{task}: must be the sample device ({sample}), "
                              f"where the priority tree lives; got {devices.get(task, 'cpu')}")
    learn = devices.get("learn", "cpu")
    if sample.startswith("cuda"):
        import torch

        if workload.continuous:  # the continuous learners read numpy batches
            raise ConfigError(f"plan.devices.sample: a replay table on {sample} feeds the DQN learner "
                              f"only; {algo} keeps its replay on the cpu")
        if not torch.cuda.is_available():
            raise ConfigError(f"plan.devices.sample: {sample} requested but torch sees no CUDA GPU "
                              f"(run `pearl devices`)")
        if learn != sample:  # the batch is a set of tensors on that GPU
            raise ConfigError(f"plan.devices.learn: a replay on {sample} feeds a learner on the "
                              f"same device; got {learn}")
    if learn.split(":")[0] not in ("cpu", "cuda"):
        raise ConfigError(f"plan.devices.learn: {learn} has no learner for {algo} "
                          f"(learn runs on cpu or cuda)")
    if learn.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise ConfigError(f"plan.devices.learn: {learn} requested but torch sees no CUDA GPU "
                              f"(run `pearl devices`)")
    if learner_kernel == "fused" and not (learn == "cpu" and "fused" in workload.learner_kernels):
        if workload.continuous:
            why = f"device {learn}" if algo != "sac" else "sac"
            raise ConfigError(f"runtime.learner_kernel: the fused kernel runs DDPG and TD3 on the cpu, "
                              f"not {why}; use 'torch' or 'auto'")
        why = "the dueling head" if workload.dueling else f"device {learn}"
        raise ConfigError(f"runtime.learner_kernel: the fused kernel runs plain MLPs on the cpu, "
                          f"not {why}; use 'torch' or 'auto'")


def replay_device(devices: dict[str, str], platform: str = "") -> str:
    """Where the replay's priority structure lives: the sample device (an FPGA's name carries the
    platform profile whose board it is)."""
    sample = devices.get("sample", "cpu")
    if sample.startswith("fpga") and platform:
        return f"{sample}@{platform}"
    return sample
