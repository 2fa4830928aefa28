"""A Plan: which device runs each task, how many actors, envs per actor, batch sizes. YAML in and out."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from pearl.config import from_dict, read_yaml
from pearl.errors import ConfigError
from pearl.io import atomic_write_text

DEVICE_KINDS = ("cpu", "cuda", "opencl", "fpga")


def _default_devices() -> dict[str, str]:
    from pearl.protocol.tasks import TASK_NAMES

    return {name: "cpu" for name in TASK_NAMES}


@dataclass
class Plan:
    devices: dict[str, str] = field(default_factory=_default_devices)
    actors: int = 1
    envs_per_actor: int = 1
    batch_size: int = 64
    sync_interval: int = 1  # learner updates between weight syncs to the actors
    learner_kernel: Literal["auto", "fused", "torch"] = "auto"
    # sequential: the reference loop; threaded: a learner thread beside the actor (pearl/runtime/threaded.py);
    # processes: `actors` actor processes beside the learner, shared-memory transport (pearl/runtime/processes.py)
    runtime: Literal["sequential", "threaded", "processes"] = "sequential"
    # processes runtime: sample the next batch and apply the previous batch's priority update on a
    # second thread while the learner learns (the priorities a batch is drawn with lag one update)
    prefetch: bool = False
    platform: str = ""  # platforms/ profile (name or .yaml path) whose fpga:N devices the plan names; "" = alveo_u250

    def check(self) -> None:
        from pearl.protocol.tasks import TASK_NAMES

        if not isinstance(self.devices, dict):
            raise ConfigError("plan.devices: expected a mapping of task name to device")
        for task, device in self.devices.items():
            if task not in TASK_NAMES:
                raise ConfigError(f"plan.devices.{task}: unknown task (expected one of {', '.join(TASK_NAMES)})")
            if not isinstance(device, str) or device.split(":")[0] not in DEVICE_KINDS:
                raise ConfigError(f"plan.devices.{task}: expected a device like cpu, cuda:0, opencl:0 or "
                                  f"fpga:0, got {device!r}")
        for name in ("actors", "envs_per_actor", "batch_size", "sync_interval"):
            if getattr(self, name) < 1:
                raise ConfigError(f"plan.{name}: expected an integer >= 1, got {getattr(self, name)}")
        if self.prefetch and self.runtime != "processes":
            raise ConfigError(f"plan.prefetch: the processes runtime prefetches batches; the {self.runtime} "
                              f"runtime keeps the reference order (sample, learn, update_priorities)")
        fpgas = sorted({d for d in self.devices.values() if d.split(":")[0] == "fpga"})
        if fpgas:
            from pearl.platforms import load_platform

            try:
                profile = load_platform(self.platform or "alveo_u250")
            except ConfigError as err:
                raise ConfigError(f"plan.platform: {err}") from None
            for device in fpgas:
                if device not in {d.id for d in profile.devices}:
                    raise ConfigError(f"plan.devices: {device} is not a device of platform {profile.name} "
                                      f"(it has {', '.join(d.id for d in profile.devices)})")

    def device_of(self, task: str) -> str:
        return self.devices.get(task, "cpu")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_yaml(self) -> str:
        return yaml.safe_dump({"plan": self.to_dict()}, sort_keys=False)

    def save(self, path: str | Path) -> None:
        atomic_write_text(Path(path), self.to_yaml())

    @classmethod
    def from_yaml(cls, text: str, source: str = "plan") -> "Plan":
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError:
            raise ConfigError(f"{source}: not valid YAML") from None
        return cls.from_data(data, source)

    @classmethod
    def from_data(cls, data: Any, source: str = "plan") -> "Plan":
        if not isinstance(data, dict) or not isinstance(data.get("plan"), dict):
            raise ConfigError(f"{source}: expected a mapping with a 'plan' section")
        devices = data["plan"].get("devices", {})
        if not isinstance(devices, dict):
            raise ConfigError("plan.devices: expected a mapping of task name to device")
        plan = from_dict(cls, {k: v for k, v in data["plan"].items() if k != "devices"}, "plan")
        plan.devices = {**_default_devices(), **devices}
        plan.check()
        return plan


def load_plan(path: str | Path) -> Plan:
    return Plan.from_data(read_yaml(path), str(path))

