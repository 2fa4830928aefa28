"""The backend registry: one Backend per device kind (cpu, cuda, opencl, fpga, ...), each a
subpackage of pearl.kernels whose light `backend.py` registers itself, found by kind. Device ids
are parsed here once: `kind:index[@platform]` (`cpu` alone is `cpu:0`), or `kind:ADDRESS` for a
kind whose devices are network addresses (a replay server: `server:tcp://127.0.0.1:5555`).

Adding a backend = a subpackage kernels/<kind>/ with a `backend.py` that calls
`register(MyBackend())` (the registry finds it by scanning pearl.kernels), or `register(...)` from
any code (a test). Everything that used to test device-kind strings asks the registry instead:
the placement rule (pearl/placement.py: `can_run`, `check`), the replay (`sum_tree`, `storage`),
the actor (`policy`), the estimator (`calls`, `cost_source`), the platform schema
(`platform_keys`, `power_keys`) and `pearl devices` (`detect`).

Imports nothing of pearl's but its errors (tests/test_imports.py rule b). A backend.py must not
import torch, pyopencl or compiled kernels at import time: its factories import them when called.
"""
from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from abc import ABC, abstractmethod
from dataclasses import dataclass

from pearl.errors import ConfigError

# The tasks of an off-policy training loop (pearl/plan.py holds the same tuple for the Plan; the
# kernels may not import it). REPLAY_TASKS share one priority structure, so one device.
TASKS = ("act", "insert", "sample", "learn", "update_priorities", "sync_weights")
REPLAY_TASKS = ("insert", "sample", "update_priorities")


@dataclass(frozen=True)
class DeviceId:
    kind: str
    index: int = 0
    platform: str = ""
    address: str = ""  # a kind whose devices are named by a network address (server:tcp://HOST:PORT)

    def __str__(self) -> str:
        if self.address:
            return f"{self.kind}:{self.address}"
        text = self.kind if self.kind == "cpu" and not self.index else f"{self.kind}:{self.index}"
        return f"{text}@{self.platform}" if self.platform else text


class Backend(ABC):
    """What the rest of PEARL may ask of one device kind.

    Required: `kind`, `detect`, `check`, `can_run`. The factories and tables below default to
    "this backend has none" (a one-line ConfigError, or an empty table), so a backend implements
    what its kernels cover and nothing else. `platform` arguments are a loaded platform profile
    (pearl.platforms.Platform: `.name`, `.devices`, `.device(id)`, `.link(a, b)`) or None: the
    caller loads it, the kernels never read YAML.
    """

    kind: str = ""
    # Set when this kind's devices are named by a platform profile rather than found on the
    # machine (fpga: a board or its simulation): the profile a Plan without `platform` uses.
    # None: the devices are this machine's and checks need no profile.
    default_platform: str | None = None
    # The estimator's source for a task's time on this kind: "analytic" (roofline + this
    # backend's `calls` x the device's launch cost) or "simulated" (the FPGA cycle model,
    # estimator/fpga.py, which also counts its own transfers).
    cost_source: str = "analytic"
    # True when the replay tasks on this kind keep the whole table (storage too) on the device
    # and hand out batches there (cuda): the learner must then run on the same device.
    table_on_device: bool = False
    # True when this kind's devices are named by an address (`kind:ADDRESS`, not `kind:index`) and
    # the replay tasks there are a whole table served elsewhere: the builder asks `replay_table`.
    addressed: bool = False
    # The platform-YAML keys a device of this kind takes beyond id, kind, name, power_w,
    # launch_us and notes: key -> required (pearl/platforms validates each key by its name).
    platform_keys: dict[str, bool] = {}
    # The two power_w keys: datasheet (idle, tdp) or the FPGA model's (static, dynamic), and
    # whether a profile must give them (a device with `host: cpu` never must: its power is the host's).
    power_keys: tuple[str, str] = ("idle", "tdp")
    power_required: bool = True

    @abstractmethod
    def detect(self) -> list[dict]:
        """The devices of this kind on this machine, as `pearl devices` prints them: dicts with at
        least id, kind and name."""

    def unusable(self) -> list[dict]:
        """Devices of this kind that the machine lists but PEARL cannot use, as `pearl devices`
        prints them: dicts with kind, name and reason."""
        return []

    @abstractmethod
    def check(self, device: DeviceId, platform=None, field: str = "device") -> None:
        """Raises a one-line ConfigError naming `field` unless `device` exists here (or, for a
        kind with `default_platform`, is a device of `platform`, run or simulated)."""

    @abstractmethod
    def can_run(self, task: str, workload) -> str | None:
        """None if this kind runs `task` for `workload` (estimator.workload.Workload: algo,
        replay_kind, continuous, dueling, ...); else why not, one line that reads after the
        device id ("has no act kernel for sac")."""

    def learner_kernels(self, workload) -> tuple[str, ...]:
        """The learner kernels `learn` runs with on this kind for `workload` (first: auto's pick)."""
        return ()

    def learner_precisions(self, workload, kernel: str) -> tuple[str, ...]:
        """The product precisions (Plan.learner_precision) `kernel` runs `workload` in here, worth
        offering: float32 unless the backend has faster ones."""
        return ("fp32",)

    # The analytic cost model's fixed part: Python-level calls (host) or kernel launches
    # (devices) per task call, keyed task or (task, learner kernel); the algorithm's own counts
    # where they differ, keyed (algo, task) or (algo, task, kernel).
    call_counts: dict = {}
    algo_call_counts: dict = {}

    def calls(self, task: str, kernel: str, algo: str) -> int:
        """Calls or launches of one call of `task`: the algorithm's own count for this kernel or
        task if there is one, else the backend's; 1 where it has none."""
        for table, key in ((self.algo_call_counts, (algo, task, kernel)), (self.algo_call_counts, (algo, task)),
                           (self.call_counts, (task, kernel)), (self.call_counts, task)):
            if key in table:
                return table[key]
        return 1

    def draft(self, device: dict, host: dict) -> tuple[list[str], list[str]]:
        """`pearl devices --write`: the platform-YAML lines of a device `detect` found (its entry
        under devices:, its link to the host under links:), figures not found on the machine
        marked "assumed (draft)". `host`: the drafted cpu's cores and peak_gflops. None by default
        (the device is then left out of the draft)."""
        return [], []

    def _none(self, device, what: str):
        raise ConfigError(f"{device}: the {self.kind} backend has no {what}")

    # -- factories (called once, when a part is built; never per sample) ---------------------
    def sum_tree(self, device: DeviceId, capacity: int, fanout: int, platform=None):
        """A sum tree with the interface of kernels/cpu/sumtree.py SumTree on `device`."""
        self._none(device, "sum tree")

    def storage(self, device: DeviceId, capacity: int, obs_dim: int, action_dtype, action_shape):
        """Transition storage on the device (backends with `table_on_device`)."""
        self._none(device, "transition storage")

    def policy(self, device: DeviceId, layout):
        """The actor's Q-network (QPolicy's interface: load, q_values, greedy) for an MLPLayout."""
        self._none(device, "act kernel")

    def learner(self, device: DeviceId, algo, batch_size: int, platform=None):
        """The `learn` task's kernel where this backend has its own (not the generic torch one)."""
        self._none(device, "learner kernel")

    def replay_table(self, device: DeviceId, config, fields: dict, auth=None, frames: dict | None = None):
        """A whole replay table on `device` with pearl.contracts.ReplayTable's interface (an
        `addressed` kind: a client of a table served there). `config`: the run's ReplayConfig;
        `fields`: the transition schema (name -> (dtype, shape)); `auth`: how to authenticate;
        `frames`: a frame table's streams, n_step and gamma (config.frame_stack > 0)."""
        self._none(device, "replay table")


_BACKENDS: dict[str, Backend] = {}
_scanned = False


def _scan() -> None:
    """Imports pearl.kernels.<kind>.backend for every subpackage that has one (each registers
    itself). Once per process, on the first question."""
    global _scanned
    if _scanned:
        return
    _scanned = True
    import pearl.kernels as package

    for module in pkgutil.iter_modules(package.__path__):
        if module.ispkg and importlib.util.find_spec(f"pearl.kernels.{module.name}.backend") is not None:
            importlib.import_module(f"pearl.kernels.{module.name}.backend")


def register(backend: Backend) -> Backend:
    """Adds `backend` under its kind (replacing one of the same kind); returns it."""
    if not backend.kind.isidentifier():
        raise ValueError(f"a backend's kind must be an identifier, got {backend.kind!r}")
    _scan()
    _BACKENDS[backend.kind] = backend
    return backend


def unregister(kind: str) -> None:
    _scan()
    _BACKENDS.pop(kind, None)


def kinds() -> tuple[str, ...]:
    """The registered device kinds, the host's cpu first."""
    _scan()
    return tuple(sorted(_BACKENDS, key=lambda kind: (kind != "cpu", kind)))


def backends() -> list[Backend]:
    return [_BACKENDS[kind] for kind in kinds()]


def backend(kind: str) -> Backend:
    _scan()
    if kind not in _BACKENDS:
        raise ConfigError(f"device kind {kind!r}: no such backend (device kinds: {', '.join(kinds())})")
    return _BACKENDS[kind]


def parse_device(text, field: str = "device") -> DeviceId:
    """'cpu', 'cuda', 'cuda:1', 'opencl:0', 'fpga:0@zcu104', 'server:tcp://127.0.0.1:5555' (an
    `addressed` kind: the rest is its address, checked by its backend) -> DeviceId of a registered
    kind; anything else is a one-line ConfigError naming `field`."""
    expected = (f"{field}: expected a device like cpu, cuda:0, opencl:0, fpga:0 or server:tcp://HOST:PORT, "
                f"got {text!r}")
    if not isinstance(text, str) or not text:
        raise ConfigError(expected)
    head, colon, rest = text.partition(":")
    if head in kinds() and backend(head).addressed:
        if not colon or not rest:
            raise ConfigError(f"{field}: expected {head}:ADDRESS (e.g. {head}:tcp://127.0.0.1:5555), got {text!r}")
        return DeviceId(head, 0, "", rest)
    spec, _, platform = text.partition("@")
    kind, colon, index = spec.partition(":")
    if not kind.isidentifier() or (colon and not index.isdigit()) or (platform and not platform.strip()):
        raise ConfigError(expected)
    if kind not in kinds():
        raise ConfigError(f"{expected} (device kinds: {', '.join(kinds())})")
    return DeviceId(kind, int(index) if colon else 0, platform)


def kind_of(text: str) -> str:
    """The kind of a device id string, without validating it ('cuda:0' -> 'cuda')."""
    return text.partition("@")[0].partition(":")[0]
