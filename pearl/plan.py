"""A Plan: which device runs each task, the runtime and its actors, envs per actor and their env engine, batch size,
learner kernel, its product precision and threads, and replay kind. YAML in and out; complete once
reconciled with a config.

A plan may leave a field unset (None, or a task missing from `devices`): the config then decides
it. A field both set differently is a conflict, never a silent winner: `reconcile` stops with one
line naming both, unless the config's value is its default (a config that did not choose).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from pearl.config import ExperimentConfig, from_dict, parse_yaml, read_yaml
from pearl.errors import ConfigError
from pearl.io import atomic_write_text
from pearl.kernels.registry import TASKS, backend, kind_of, parse_device

# The six tasks of an off-policy training loop (docs/ARCHITECTURE.md); a Plan places each on a device.
TASK_NAMES = TASKS


@dataclass
class ServerAccess:
    """How this run's clients authenticate to a replay server a task is placed on
    (`server:tcp://HOST:PORT`, kernels/server): CURVE with this client's certificate
    (NAME.key_secret) and the server's public key (a certificate file or a z85 string), both from
    `pearl replay-server --keygen`; or plaintext, for a private fabric only."""

    plaintext: bool = False
    client_secret: str = ""
    server_public: str = ""

    def check(self) -> None:
        if self.plaintext and (self.client_secret or self.server_public):
            raise ConfigError("plan.server: plaintext and CURVE keys (client_secret, server_public) are exclusive")
        if not self.plaintext and not (self.client_secret and self.server_public):
            raise ConfigError("plan.server: a replay server device needs client_secret and server_public (CURVE "
                              "keys from `pearl replay-server --keygen`), or plaintext: true on a private fabric")
        if self.client_secret and not Path(self.client_secret).is_file():
            raise ConfigError(f"plan.server.client_secret: {self.client_secret}: no such file")
        if self.server_public and not Path(self.server_public).is_file() and len(self.server_public) != 40:
            raise ConfigError(f"plan.server.server_public: {self.server_public}: expected a certificate file or a "
                              f"40-character z85 key")


@dataclass
class RayPlan:
    """`runtime: ray` (pearl/runtime/ray.py, docs/RAY.md): `nodes` node agents, one per Ray node
    (a STRICT_SPREAD placement group), each running the plan's `actors` actor processes of
    `envs_per_actor` envs and streaming their transitions to the replay server in chunks of at most
    `chunk` transitions, `window` chunks in flight. `replay`: where the replay server runs - in the
    learner's process (learner), in a process of its own on the learner's node (server), or on a Ray
    node of its own placed by the placement group (node); `shards` servers with exact prioritized
    sampling across them (pearl/server/shards.py; server and node only). `address`: "" starts a local Ray instance, "auto" or HOST:PORT joins a
    cluster (`pearl train --address`). A node agent that dies is restarted up to `max_restarts` times."""

    nodes: int = 1
    replay: Literal["learner", "server", "node"] = "learner"
    shards: int = 1
    chunk: int = 256
    window: int = 16
    address: str = ""
    max_restarts: int = 3

    def check(self) -> None:
        for name in ("nodes", "shards", "chunk", "window"):
            if getattr(self, name) < 1:
                raise ConfigError(f"plan.ray.{name}: expected an integer >= 1, got {getattr(self, name)}")
        if self.max_restarts < 0:
            raise ConfigError(f"plan.ray.max_restarts: expected an integer >= 0, got {self.max_restarts}")
        if self.shards > 1 and self.replay == "learner":
            raise ConfigError(f"plan.ray.shards: {self.shards} shards need replay: server or node (the learner "
                              f"placement holds the run's one table)")


@dataclass
class Plan:
    devices: dict[str, str] = field(default_factory=dict)  # task -> device id; a missing task: cpu
    actors: int = 1
    envs_per_actor: int | None = None  # None: the config's runtime.envs_per_actor
    batch_size: int | None = None  # None: the algorithm's batch_size
    sync_interval: int = 1  # learner updates between weight syncs to the actors
    learner_kernel: Literal["auto", "fused", "torch"] | None = None  # None: runtime.learner_kernel
    learner_precision: Literal["fp32", "bf16", "auto"] | None = None  # None: runtime.learner_precision
    # torch's intra-op threads in the learner's process, which split the learner's matrix products
    # (the torch learners and the fused DDPG / TD3 / SAC ones; the fused DQN learner is numba and
    # runs on one); None: runtime.torch_threads. The mapper offers more than 1 only where the
    # runtime's other threads and processes leave cores free (estimator/mapper.py learner_threads)
    learner_threads: int | None = None
    replay: Literal["uniform", "prioritized", "amper"] | None = None  # None: the config's replay.kind
    # a module of pearl/runtime (pearl.schedule.RUNTIMES: sequential, threaded, processes; or
    # pearl.runtime.CLUSTER_RUNTIMES: ray). ray: `actors` actor processes on each node
    runtime: str = "sequential"
    # processes runtime: sample the next batch and apply the previous batch's priority update on a
    # second thread while the learner learns (the priorities a batch is drawn with lag one update)
    prefetch: bool = False
    # processes runtime: the learner steps its own actor while the actor processes start (an
    # interpreter, imports and the first compiled-kernel load: ~1 s of CPU each), so a run does
    # not wait for them; it hands over to them once every one has committed its first round.
    # ray runtime (replay: learner): the same while the node agents start, until an agent's steps arrive
    act_while_actors_start: bool = True
    # processes runtime: None = each actor acts on the newest weights the learner has published (the
    # fastest; a run's result depends on timing). An integer D >= 0 = deterministic: the actor of
    # global act round g (actor g % actors) acts at env step t with the epsilon of step t and the
    # weights after the updates due at step t - D, and the learner takes rounds in and learns in a
    # fixed order, so a seeded run gives the same transitions, updates and weights whatever the
    # timing (and with D = 0 and one actor, the sequential runtime's run bit for bit). The learner
    # keeps ~D x updates_per_step / sync_interval weight versions in shared memory for the actors,
    # and does not act while they start
    deterministic_lag: int | None = None
    # what steps an actor's envs: real Gymnasium envs in a plain loop, or one EnvPool (C++ envs,
    # `pip install 'pearl-rl[envpool]'`: pays from ~16 envs per actor, costs more at one)
    env_engine: Literal["gymnasium", "envpool"] = "gymnasium"
    platform: str = ""  # platforms/ profile (name or .yaml path) whose fpga:N devices the plan names; "" = alveo_u250
    server: ServerAccess = field(default_factory=ServerAccess)  # read when a task is on server:ADDR
    ray: RayPlan = field(default_factory=RayPlan)  # read by runtime: ray

    def check(self) -> None:
        from pearl.schedule import MANY_ACTORS, RUNTIMES

        if not isinstance(self.devices, dict):
            raise ConfigError("plan.devices: expected a mapping of task name to device")
        for task, device in self.devices.items():
            if task not in TASK_NAMES:
                raise ConfigError(f"plan.devices.{task}: unknown task (expected one of {', '.join(TASK_NAMES)})")
            parse_device(device, f"plan.devices.{task}")
        for name in ("actors", "envs_per_actor", "batch_size", "sync_interval", "learner_threads"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"plan.{name}: expected an integer >= 1, got {value}")
        from pearl.runtime import CLUSTER_RUNTIMES

        runtimes, many = (*RUNTIMES, *CLUSTER_RUNTIMES), (*MANY_ACTORS, *CLUSTER_RUNTIMES)
        if self.runtime not in runtimes:
            raise ConfigError(f"plan.runtime: expected one of {', '.join(runtimes)}, got {self.runtime!r}")
        if self.actors != 1 and self.runtime not in many:
            raise ConfigError(f"plan.actors: the {self.runtime} runtime runs 1 actor, got "
                              f"{self.actors} (runtime: {' or '.join(many)} runs several)")
        if self.runtime == "ray":
            self.ray.check()
        if self.deterministic_lag is not None:
            if self.runtime != "processes":
                raise ConfigError(f"plan.deterministic_lag: an option of the processes runtime (the "
                                  f"sequential runtime is deterministic already); got runtime {self.runtime}")
            if (not isinstance(self.deterministic_lag, int) or isinstance(self.deterministic_lag, bool)
                    or self.deterministic_lag < 0):
                raise ConfigError(f"plan.deterministic_lag: expected an integer >= 0 (env steps) or null, "
                                  f"got {self.deterministic_lag!r}")
        if self.prefetch and self.runtime != "processes":
            raise ConfigError(f"plan.prefetch: the processes runtime prefetches batches; the {self.runtime} "
                              f"runtime keeps the reference order (sample, learn, update_priorities)")
        from pearl.envs import ENV_ENGINES, check_envpool

        if self.env_engine not in ENV_ENGINES:
            raise ConfigError(f"plan.env_engine: expected one of {', '.join(ENV_ENGINES)}, got {self.env_engine!r}")
        if self.env_engine == "envpool":
            check_envpool()
        from pearl.placement import check_platform_devices

        check_platform_devices(self.devices, self.platform)
        if any(backend(kind_of(device)).addressed for device in self.devices.values()):
            self.server.check()

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
        return cls.from_data(parse_yaml(text.encode(), source), source)

    @classmethod
    def from_data(cls, data: Any, source: str = "plan") -> "Plan":
        if not isinstance(data, dict) or not isinstance(data.get("plan"), dict):
            raise ConfigError(f"{source}: expected a mapping with a 'plan' section")
        devices = data["plan"].get("devices", {})
        if not isinstance(devices, dict):
            raise ConfigError("plan.devices: expected a mapping of task name to device")
        plan = from_dict(cls, {k: v for k, v in data["plan"].items() if k != "devices"}, "plan")
        plan.devices = dict(devices)
        plan.check()
        return plan


def load_plan(path: str | Path) -> Plan:
    return Plan.from_data(read_yaml(path, "plan"), str(path))


# Where a Plan field and a config field say the same thing: plan field -> dotted config key. The
# learn device is the config's runtime.device.
_OVERLAPS = {"envs_per_actor": "runtime.envs_per_actor", "learner_kernel": "runtime.learner_kernel",
             "learner_precision": "runtime.learner_precision", "learner_threads": "runtime.torch_threads",
             "replay": "replay.kind"}


def _config_value(config: ExperimentConfig, dotted: str):
    node = config
    for part in dotted.split("."):
        node = getattr(node, part)
    return node


def _normal_device(device: str) -> str:
    return str(parse_device(device))


def replanned(config: ExperimentConfig, saved: Plan, plan: Plan) -> tuple[ExperimentConfig, Plan]:
    """A saved run's config and plan made ready for a new `plan`: the config's plan-owned fields
    back to their defaults (the saved plan set them, not the user) and the new plan's unset fields
    and tasks from the saved plan."""
    from pearl.config import apply_overrides

    default = ExperimentConfig(algo=config.algo)
    overlaps = [*_OVERLAPS.values(), f"{config.algo}.batch_size", "runtime.device"]
    config = apply_overrides(config, {dotted: _config_value(default, dotted) for dotted in overlaps})
    unset = {name: getattr(saved, name) for name in (*_OVERLAPS, "batch_size") if getattr(plan, name) is None}
    return config, dataclasses.replace(plan, devices={**saved.devices, **plan.devices}, **unset)


def reconcile(config: ExperimentConfig, plan: Plan | None) -> tuple[ExperimentConfig, Plan]:
    """The run's config and complete plan: the plan's unset fields from the config, the config's
    overlapping fields from the plan. Raises ConfigError on a field both set differently (the
    config's value counts as set when it is neither its default nor "auto"; the plan's "auto"
    yields to a value the config set)."""
    from pearl.config import apply_overrides

    plan = dataclasses.replace(plan, devices=dict(plan.devices)) if plan is not None else Plan()
    default = ExperimentConfig(algo=config.algo)
    overlaps = {**_OVERLAPS, "batch_size": f"{config.algo}.batch_size"}
    chosen = {}
    for name, dotted in overlaps.items():
        mine, theirs = getattr(plan, name), _config_value(config, dotted)
        # "auto" chooses nothing: a run's saved plan holds what its config's auto resolved to
        configured = theirs != _config_value(default, dotted) and theirs != "auto"
        if mine is not None and mine != "auto" and configured and mine != theirs:
            raise ConfigError(f"plan.{name}: {mine}, but the config's {dotted} is {theirs}: make them agree "
                              f"or leave one unset")
        chosen[name] = theirs if mine is None or mine == "auto" and configured else mine
    learn, configured = plan.devices.get("learn"), _normal_device(config.runtime.device)
    if learn is not None and _normal_device(learn) != configured and configured != default.runtime.device:
        raise ConfigError(f"plan.devices.learn: {learn}, but the config's runtime.device is "
                          f"{config.runtime.device}: make them agree or leave one unset")
    chosen["learn"] = _normal_device(learn or configured)
    plan = dataclasses.replace(plan, envs_per_actor=chosen["envs_per_actor"], batch_size=chosen["batch_size"],
                               learner_kernel=chosen["learner_kernel"], learner_precision=chosen["learner_precision"],
                               learner_threads=chosen["learner_threads"], replay=chosen["replay"],
                               devices={task: plan.devices.get(task, "cpu") for task in TASK_NAMES})
    plan.devices["learn"] = chosen["learn"]
    plan.check()
    config = apply_overrides(config, {**{dotted: chosen[name] for name, dotted in overlaps.items()},
                                      "runtime.device": chosen["learn"]})
    return config, plan
