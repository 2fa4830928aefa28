"""The fpga backend: boards named by a platform profile (plans say fpga:N of `plan.platform`,
default alveo_u250 or PEARL_FPGA_PLATFORM), run on the board when this machine has it and its
bitstream, else simulated (C-simulated HLS kernels + cycle model, always labelled). Prioritized
replay's sum tree; a DQN learner (learner.py) that the placement rule does not offer yet: the
runtime does not drive it.
The estimator costs it with the HLS cycle model (estimator/fpga.py). Importing this module
compiles nothing and imports neither pynq nor pyxrt."""
from __future__ import annotations

import os

from pearl.errors import ConfigError
from pearl.kernels.registry import REPLAY_TASKS, Backend, register


class FPGABackend(Backend):
    kind = "fpga"
    cost_source = "simulated"
    power_keys = ("static", "dynamic")
    power_required = False
    platform_keys = {"driver": True, "part": False, "vitis_platform": False, "clock_mhz": True, "resources": False,
                     "bitstream": False, "memory_bandwidth_gb_s": False}

    @property
    def default_platform(self) -> str:
        return os.environ.get("PEARL_FPGA_PLATFORM") or "alveo_u250"

    def detect(self) -> list[dict]:
        return []  # a board is a device of a platform profile, not found by probing

    def check(self, device, platform=None, field: str = "device") -> None:
        ids = [d.id for d in platform.devices]
        if f"fpga:{device.index}" not in ids:
            raise ConfigError(f"{field}: fpga:{device.index} is not a device of platform {platform.name} "
                              f"(it has {', '.join(ids)})")

    def can_run(self, task: str, workload) -> str | None:
        if task in REPLAY_TASKS:
            if workload.replay_kind != "prioritized":
                return f"has no {task} kernel for {workload.replay_kind} replay"
            return None
        return f"has no {'learner' if task == 'learn' else task + ' kernel'} for {workload.algo}"

    def sum_tree(self, device, capacity: int, fanout: int, platform=None):
        from pearl.kernels.fpga import FPGASumTree, open_device

        return FPGASumTree(capacity, fanout, device=open_device(platform, device.index))

    def learner(self, device, algo, batch_size: int, platform=None):
        from pearl.kernels.fpga import open_device
        from pearl.kernels.fpga.learner import FPGALearner

        return FPGALearner(algo, open_device(platform, device.index), batch_size)


register(FPGABackend())
