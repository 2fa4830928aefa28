"""The FPGA cost of protocol tasks: what a task would take on an FPGA of a platform profile.

Time = launch + host<->device transfers over the profile's link + kernel cycles at the profile's
clock, with cycles from the HLS timing model (kernels/fpga/timing.py: declared II/depth, or a
csynth report's). Energy = static power x time + dynamic power x kernel time, i.e. the profile's
static + dynamic x utilisation with utilisation = the kernel's busy fraction of the call.

These are MODELLED (simulated) figures: no FPGA produced them. `FPGACost.simulated` is always
True, and `source` says where the II/depth figures came from.
"""
from __future__ import annotations

from dataclasses import dataclass

from pearl.kernels.fpga import timing


@dataclass(frozen=True)
class FPGACost:
    task: str
    seconds: float  # per call
    kernel_s: float
    transfer_s: float
    launch_s: float
    cycles: int
    energy_j: float  # per call
    source: str
    simulated: bool = True

    @property
    def power_w(self) -> float:
        return self.energy_j / self.seconds if self.seconds else 0.0


def _cost(task, platform, device_id, kernel, cycles, bytes_in, bytes_out, calls=1) -> FPGACost:
    from pearl.platforms import load_platform

    platform = load_platform(platform) if isinstance(platform, str) else platform
    device = platform.device(device_id)
    link = platform.link("cpu", device_id)
    kernel_s = cycles / (device.clock_mhz * 1e6)
    transfer_s = link.transfer_s(bytes_in) + link.transfer_s(bytes_out)
    launch_s = calls * link.launch_us * 1e-6
    seconds = kernel_s + transfer_s + launch_s
    energy = device.static_w * seconds + device.dynamic_w * kernel_s
    return FPGACost(task, seconds, kernel_s, transfer_s, launch_s, cycles, energy,
                    timing.kernel_timing(kernel).source)


def task_cost(task: str, platform="alveo_u250", device_id: str = "fpga:0", *, batch: int = 64,
              capacity: int = 100_000, fanout: int = 16, envs: int = 1, sizes: list[int] | None = None) -> FPGACost:
    """Per-call cost of `task` (insert, sample, update_priorities: the sum tree; act, learn,
    sync_weights: the MLP kernels for a network of layer widths `sizes`) on `device_id`."""
    from pearl.kernels.fpga.sumtree import tree_depth

    depth = tree_depth(capacity, fanout)
    if task in ("insert", "sample", "update_priorities"):
        t = timing.kernel_timing("pearl_sumtree")
        if task == "sample":  # uniforms in; indices and their priorities out
            cycles = timing.sumtree_cycles(t, "sample", batch, fanout, depth)
            return _cost(task, platform, device_id, "pearl_sumtree", cycles, 8 * batch, 16 * batch)
        n = envs if task == "insert" else batch  # indices + priorities in; the new root out
        cycles = timing.sumtree_cycles(t, "update", n, fanout, depth)
        return _cost(task, platform, device_id, "pearl_sumtree", cycles, 16 * n, 16)
    if sizes is None:
        raise ValueError(f"task {task}: the MLP tasks need the network's layer sizes")
    n_params = sum(i * o + o for i, o in zip(sizes[:-1], sizes[1:]))
    if task == "act":  # weights already on chip; observations in, Q-values out
        cycles = timing.mlp_forward_cycles(timing.kernel_timing("pearl_mlp_forward"), sizes, envs, False)
        return _cost(task, platform, device_id, "pearl_mlp_forward", cycles, 4 * envs * sizes[0], 4 * envs * sizes[-1])
    if task == "learn":  # batch and targets in, |td| out; weights and moments stay in device memory
        cycles = timing.mlp_train_step_cycles(timing.kernel_timing("pearl_mlp_train_step"), sizes, batch)
        return _cost(task, platform, device_id, "pearl_mlp_train_step", cycles,
                     4 * batch * (sizes[0] + 3) + 48, 4 * batch)
    if task == "sync_weights":  # the learner's weights to the acting kernel, reloaded on chip
        cycles = timing.kernel_timing("pearl_mlp_forward").loop("load_weights", n_params)
        return _cost(task, platform, device_id, "pearl_mlp_forward", cycles, 4 * n_params, 0)
    raise ValueError(f"unknown task {task!r}")
