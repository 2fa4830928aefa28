"""The placement rule: which task may run on which device, in one place.

Built on the backends' answers (pearl.kernels.registry: `can_run`, `check`, `learner_kernels`,
`table_on_device`, `default_platform`), so a registered backend's devices are placed, refused and
enumerated like the built-in ones. Everything that places tasks asks here: the builder (a Plan
before any part is built: `check_placement`), Plan.check (`check_platform_devices`), the mapper
(`check_placement(..., here=False)` on every candidate), `pearl profile` / `--measure`
(`runnable_here`), the replay (`replay_device`), the config's learn device (`check_device`).

`devices` are a Plan's task -> device id strings (a task left out runs on the cpu); `workload`
is an estimator.workload.Workload (algo, replay_kind, continuous, dueling, learner_kernels, ...);
`platform` is a platforms/ profile, by name or path or already loaded ("" or None: the default
of the backends whose devices a profile names, e.g. alveo_u250 for fpga:N).
"""
from __future__ import annotations

import dataclasses

from pearl.errors import ConfigError
from pearl.kernels.registry import REPLAY_TASKS, TASKS, backend, backends, kind_of, parse_device

# The order devices are checked for existence in: the replay table's device under its `sample`
# task, where the table lives, before the tasks that must share it.
_CHECK_ORDER = ("act", "sample", "insert", "update_priorities", "learn", "sync_weights")


def _or(items: list[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} or {items[-1]}"


def _runs_on(task: str, workload) -> str:
    """'cpu or opencl:N': the registered kinds that run `task` for `workload`."""
    return _or([b.kind if b.kind == "cpu" else f"{b.kind}:{'ADDR' if b.addressed else 'N'}" for b in backends()
                if b.can_run(task, workload) is None])


def _replay_runs_on(task: str, workload) -> str:
    """Where each replay kind the workload accepts runs `task`."""
    return ", ".join(f"{kind} replay runs on {_runs_on(task, dataclasses.replace(workload, replay_kind=kind))}"
                     for kind in workload.replay_kinds)


def platform_profile(platform, kind_backend):
    """The loaded profile that names `kind_backend`'s devices (`platform`, else its default)."""
    if hasattr(platform, "devices"):
        return platform
    from pearl.platforms import load_platform

    try:
        return load_platform(platform or kind_backend.default_platform)
    except ConfigError as err:
        raise ConfigError(f"plan.platform: {err}") from None


def check_device(field: str, device: str, platform="", here: bool = True) -> None:
    """`device` (named by `field`) exists: on this machine (`here`), or in its platform profile."""
    did = parse_device(device, field)
    b = backend(did.kind)
    if b.default_platform is not None:
        b.check(did, platform_profile(platform, b), field)
    elif here:
        b.check(did, None, field)


def check_platform_devices(devices: dict[str, str], platform="") -> None:
    """The devices a platform profile names (fpga:N) are devices of the plan's profile (Plan.check:
    a plan names them whatever machine loads it; the machine's own devices are checked when the
    plan is built, `check_placement`)."""
    for task, device in devices.items():
        if backend(parse_device(device, f"plan.devices.{task}").kind).default_platform is not None:
            check_device(f"plan.devices.{task}", device, platform, here=False)


def check_placement(devices: dict[str, str], workload, learner_kernel: str | None = "auto", platform="",
                    *, here: bool = True) -> None:
    """Raises a one-line ConfigError naming the field unless the runtime can run every task of
    `workload` where `devices` put it with `learner_kernel`; `here`: the devices must also exist on
    this machine (or be simulated), as when a plan is built (the mapper costs other machines)."""
    device = {task: devices.get(task) or "cpu" for task in TASKS}
    kinds = {task: backend(parse_device(device[task], f"plan.devices.{task}").kind) for task in TASKS}
    reason = kinds["act"].can_run("act", workload)
    if reason:
        raise ConfigError(f"plan.devices.act: {device['act']} {reason} (act runs on {_runs_on('act', workload)})")
    for task in REPLAY_TASKS:
        reason = kinds[task].can_run(task, workload)
        if reason:
            raise ConfigError(f"plan.devices.{task}: {device[task]} {reason} ({_replay_runs_on(task, workload)})")
    sample = device["sample"]
    for task in ("insert", "update_priorities"):  # the priority structure is one object
        if device[task] != sample:
            raise ConfigError(f"plan.devices.{task}: must be the sample device ({sample}), where the priority "
                              f"tree lives; got {device[task]}")
    for task in ("learn", "sync_weights"):
        reason = kinds[task].can_run(task, workload)
        if reason:
            raise ConfigError(f"plan.devices.{task}: {device[task]} {reason} ({task} runs on "
                              f"{_runs_on(task, workload)})")
    checked = set()
    for task in _CHECK_ORDER:
        if device[task] not in checked:
            checked.add(device[task])
            check_device(f"plan.devices.{task}", device[task], platform, here)
    if kinds["sample"].table_on_device and device["learn"] != sample:  # batches stay on that device
        raise ConfigError(f"plan.devices.learn: a replay on {sample} feeds a learner on the same device; "
                          f"got {device['learn']}")
    available = kinds["learn"].learner_kernels(workload)
    if learner_kernel not in (None, "auto") and learner_kernel not in available:
        raise ConfigError(f"runtime.learner_kernel: {device['learn']} has no {learner_kernel} learner for "
                          f"{workload.algo}{' with a dueling head' if workload.dueling else ''}"
                          f"{' stepping ' + workload.optimizer if workload.optimizer != 'adam' else ''} (it has "
                          f"{', '.join(available) or 'none'}); use 'auto'")


def replay_device(devices: dict[str, str], platform: str = "") -> str:
    """Where the replay's priority structure lives: the `sample` device, with `@platform` when a
    profile names that kind's devices and the plan gives one (the sampler opens that profile)."""
    sample = devices.get("sample") or "cpu"
    if platform and backend(kind_of(sample)).default_platform is not None:
        return f"{sample}@{platform}"
    return sample


def runnable_here(device_ids) -> bool:
    """Whether this machine can run every device of `device_ids` (a platform profile's devices,
    such as fpga:N, run simulated without their board)."""
    for device in set(device_ids):
        b = backend(kind_of(device))
        if b.default_platform is not None:
            continue
        try:
            b.check(parse_device(device), None)
        except ConfigError:
            return False
    return True
