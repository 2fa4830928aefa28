"""`pearl profile`: measure each task kernel of a workload on this machine and cache the table.

Every figure comes from the runtime's own code path, run by a `Runner` the caller passes in
(pearl/measure.py: an agent built for a plan exactly as `pearl train --plan` builds it, trained
past `learning_starts`, then for a few seconds with the task timers on: wall time of each task
call inside the real loop). The estimator never builds or runs an agent itself. What the loop
spends outside the tasks (counters, episode records, the progress hook) is the run's wall time
minus the tasks' time; a least-squares fit over all profile runs splits it into a cost per act
round and a cost per update.

The grid is a covering design, not the full product: act and insert depend on envs per actor,
sample and update_priorities on (replay kind, device, batch), learn on (kernel, precision, batch)
— so one run per (replay, batch) at 1 env, one per (replay, envs) at the first batch size and one
per torch batch size, per reduced precision the mapper offers (bf16) and per learner thread count
it offers beyond one (every core of this machine, each precision) cover every table, and the model
combines tables for any plan on the grid.

`--wire` adds the replay wire (estimator/wire.py): the runtime's replay server and its clients on
loopback, each request kind the ray plans send (an insert of a chunk of N rows, a sample of B
rows with its priority update) timed: its round trip, the client's and the server's CPU.

`--ray` adds what a local Ray cluster costs here beyond the calls the ray model prices
(pearl/runtime/ray_profile.py `ray_us`, which the caller passes in as it passes the runner: Ray's
processes per node at rest, a napping node agent's process per second, the work per publish in the
agent, Ray's processes and the driver's publishing thread, the time between publishes, a waiting
actor's CPU per second):
`ray|...` tables.

`--threaded` and `--processes` add what those runtimes cost beyond the tasks: a contention or
overhead factor per learner kernel and envs per actor (one run of each, set against the model),
and for processes the ring write of an act round (timed on the runtime's own ring).

The table is cached per machine (~/.cache/pearl/profile-<fingerprint>.json, or $PEARL_CACHE_DIR),
keyed by the workload (estimator.workload.Workload.key) and written atomically.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform as _platform
import time
from dataclasses import replace
from pathlib import Path
from typing import Protocol

import numpy as np

from pearl.errors import ConfigError
from pearl.io import atomic_write_text

# 3: the workload key names n_step, batch, dims; the entry its CPU model. 4: learner threads are the
# plan's (a learn table per thread count), no longer the key's
# 5: the fused DQN learner has a learn table per thread count too (where its products pair)
PROFILE_VERSION = 5
# The wire tables' own version (`wire|...`, `pearl profile --wire`): an entry whose wire_version
# differs keeps its task tables, and its wire tables are measured again when asked for. 2: a
# sample goes through the sharded client (the ray learner's), CPU is the processes' (ZeroMQ's I/O
# thread's CURVE too)
WIRE_VERSION = 2
# The ray tables' version (`ray|...`, `pearl profile --ray`), kept as the wire's is.
# 2: with ray|publish|driver, ray|publish|interval and ray|actor|wait; 3: without ray|actor|wait (an
# actor's back-off at its allowance takes only cycles nothing else wants: docs/BENCHMARKS.md session 16);
# 4: publishes 20 ms apart (pearl.schedule.PUBLISH_S), the interval ray|publish|interval measures
RAY_VERSION = 4
# what pearl/runtime/ray_profile.py measures (its module doc), {"0": us} each
RAY_TABLES = ("ray|daemon", "ray|agent", "ray|publish|agent", "ray|publish|ray", "ray|publish|driver",
              "ray|publish|interval")
WIRE_ROWS = (8, 32, 256)  # the chunks ray plans send: one 8-env act round up to the largest chunk
CONTEXT_TASKS = ("act", "learn", "sync_weights")


def machine_fingerprint() -> str:
    """What changes task costs: CPU model and cores, memory, Python / numpy / torch versions,
    the OpenCL devices. A different machine (or a software upgrade) gets a fresh table."""
    import torch

    from pearl import __version__
    from pearl.devices import cpu_devices, opencl_devices

    cpu = cpu_devices()[0]
    parts = [cpu["name"], str(cpu["cores"]), str(cpu["memory_gib"]), _platform.python_version(),
             np.__version__, torch.__version__, __version__,
             *sorted(d["name"] for d in opencl_devices())]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def cache_path() -> Path:
    root = os.environ.get("PEARL_CACHE_DIR") or Path.home() / ".cache" / "pearl"
    return Path(root) / f"profile-{machine_fingerprint()}.json"


def load_cached(workload_key: str) -> dict | None:
    path = cache_path()
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None  # a damaged cache is re-measured, not trusted
    if data.get("version") != PROFILE_VERSION:
        return None
    entry = data.get("workloads", {}).get(workload_key)
    if entry is None:
        return None
    check_tables(entry.get("tables"), path)
    if entry.get("wire_version") != WIRE_VERSION:  # wire tables of another measurement: absent
        entry["tables"] = {k: v for k, v in entry["tables"].items() if not k.startswith("wire|")}
    if entry.get("ray_version") != RAY_VERSION:
        entry["tables"] = {k: v for k, v in entry["tables"].items() if not k.startswith("ray|")}
    return entry


def check_tables(tables, path) -> None:
    """A ConfigError in one line naming the file and table when the profile's tables are not
    {table: {size: microseconds}} with integer sizes and finite, non-negative figures (a file
    edited or written by something else: its figures would price every plan)."""
    if not isinstance(tables, dict):
        raise ConfigError(f"{path}: tables: expected a mapping of table name to {{size: us}}")
    for name, cells in tables.items():
        if not isinstance(cells, dict) or not cells:
            raise ConfigError(f"{path}: table {name!r}: expected a non-empty mapping of size to us")
        for size, us in cells.items():
            if not (isinstance(size, str) and size.isdigit()) or isinstance(us, bool) or \
                    not isinstance(us, (int, float)) or not 0 <= us < float("inf"):
                raise ConfigError(f"{path}: table {name!r}: {size!r}: {us!r} (expected an integer size and "
                                  f"a finite number of us >= 0)")


def _store(workload_key: str, entry: dict) -> Path:
    path = cache_path()
    data = {"version": PROFILE_VERSION, "fingerprint": machine_fingerprint(), "workloads": {}}
    if path.is_file():
        try:
            old = json.loads(path.read_text())
            if old.get("version") == PROFILE_VERSION:
                data["workloads"] = old.get("workloads", {})
        except (OSError, json.JSONDecodeError):
            pass
    data["workloads"][workload_key] = entry
    atomic_write_text(path, json.dumps(data, indent=1, sort_keys=True))
    return path


# -- what this machine can run (pearl/measure.py runs it) ---------------------------------------
class Runner(Protocol):
    """What profile and tune need run on this machine (pearl.measure is one: pass the module)."""

    def profile_runs(self, config, cands, seconds: float) -> list[tuple[dict, dict]]:
        """Per candidate: (per task, its mean us per call; the run: rounds, updates, wall_s,
        steps_per_s, task_s)."""

    def measure_many(self, config, cands, seconds: float) -> list[dict]:
        """Per candidate: {"steps_per_s": ...} (and "watts", "power_source" where a sensor read
        them) or {"error": one line}."""

    def ring_write_us(self, config, envs) -> dict:
        """Per envs per actor (str): us of one act round's write into a processes-runtime ring."""

    def wire_us(self, config, kinds, rows, batches) -> dict:
        """The replay wire's tables (`wire|TASK|KIND|PART`: {size (str): us}), estimator/wire.py."""


def profile(config, replays=(("uniform", "cpu"),), envs=(1, 4, 16), batches=None, kernels=None,
            seconds: float = 1.5, log=None, use_cache: bool = True, threaded: bool = False,
            processes: bool = False, overlap: bool = False, wire: bool = False, ray=None, *,
            runner: Runner) -> dict:
    """The measured cost table of `config`'s workload on this machine (see the module doc), its
    runs made by `runner` (pearl.measure); `batches`: default the config's own batch size;
    `kernels`: the cpu learner kernels to time (default: every one the algorithm has); `overlap`:
    the processes runtime's one-actor factor and ring write (implied by `processes`); `wire`: the
    replay wire's tables for the cpu replay kinds of `replays`; `ray`: a function measuring the local
    Ray cluster's tables (RAY_TABLES) as `ray(n_params, log=log)` (pearl/runtime/ray_profile.py
    `ray_us`), or None."""
    from pearl.estimator.workload import workload_from_config

    workload = workload_from_config(config)
    batches = tuple(batches or (config.algo_config.batch_size,))
    overlap = overlap or processes
    kernels = tuple(kernels or workload.learner_kernels)
    _check_grid(workload, replays, kernels)
    from pearl.estimator.mapper import env_engines

    wanted = _grid(replays, envs, batches, kernels, workload, env_engines(workload))
    kinds = sorted({kind for kind, device in replays if device == "cpu"})
    if use_cache:
        cached = load_cached(workload.key())
        if cached and all(name in cached["tables"] and str(size) in cached["tables"][name]
                          for name, size in _tables_of(wanted)) and (
                not threaded or all(f"threaded|{k}" in cached["tables"] for k in kernels)) and (
                not overlap or all(str(e) in cached["tables"].get(f"processes1|{kernels[0]}", {}) for e in envs)) and (
                not processes or all(f"processes|{k}" in cached["tables"] for k in kernels)):
            from pearl.estimator.wire import source

            missing_wire = wire and not all(source(cached["tables"], kind) == "measured" for kind in kinds)
            missing_ray = ray is not None and not all(name in cached["tables"] for name in RAY_TABLES)
            if not (missing_wire or missing_ray):
                return cached["tables"]
            # only the wire or the ray tables are missing: measured alone and added to the entry
            if missing_wire:
                cached["tables"].update(_wire_tables(runner, config, kinds, batches, log))
                cached["wire_version"] = WIRE_VERSION
            if missing_ray:
                cached["tables"].update(_ray_tables(ray, workload, log))
                cached["ray_version"] = RAY_VERSION
            _store(workload.key(), cached)
            return cached["tables"]
    from pearl.estimator.costs import context_table

    tables: dict = {}
    fit_rows, fit_y = [], []
    started = time.perf_counter()
    for i, (cand, (means, run)) in enumerate(zip(wanted, runner.profile_runs(config, wanted, seconds))):
        for task, us in means.items():
            name, size = _table_of(task, cand)
            # Tasks that do not touch the replay (act, learn, sync_weights) are measured in the
            # runs of every replay, and they are slower beside some (PoCL's worker threads share
            # the two cores with the Python thread). So each is kept twice: in a table of its
            # replay context (Costs prefers it) and in the context-free table, which keeps the
            # least disturbed (smallest) of the runs' figures.
            # A run beside another env engine keeps every task to tables of its context (act's
            # table is its engine's anyway): EnvPool's actor thread sleeps while EnvPool's thread
            # steps the envs, and on a loaded machine the scheduler runs a thread that sleeps
            # sooner, so the run's learn, insert and sample were measured less disturbed than a
            # Gymnasium plan's (at load 9-15: the same fused learn 71-125 us beside EnvPool,
            # 177-834 us beside Gymnasium; their least priced the Gymnasium plans 60-100% too
            # fast, docs/BENCHMARKS.md issue 19 "new plan choices").
            context = context_table(name, cand)
            if cand.env_engine == "gymnasium" or task == "act":
                tables.setdefault(name, {}).setdefault(str(size), []).append(us)
            if task in CONTEXT_TASKS or cand.env_engine != "gymnasium":
                tables.setdefault(context, {}).setdefault(str(size), []).append(us)
        fit_rows.append([run["rounds"], run["updates"]])
        fit_y.append(max(0.0, run["wall_s"] - run["task_s"]))
        if log:
            log(f"[{i + 1}/{len(wanted)}] {cand.label()}: {run['steps_per_s']:,.0f} steps/s, "
                f"{', '.join(f'{t} {us:.1f}' for t, us in means.items())} us "
                f"(all runs: {time.perf_counter() - started:.1f} s)")
    tables = {name: {size: round(float(min(v)), 3) for size, v in cells.items()}
              for name, cells in tables.items()}
    per_round, per_update = np.linalg.lstsq(np.array(fit_rows, float), np.array(fit_y), rcond=None)[0]
    tables["overhead|round"] = {"0": round(float(max(0.0, per_round)) * 1e6, 3)}
    tables["overhead|update"] = {"0": round(float(max(0.0, per_update)) * 1e6, 3)}
    if threaded:
        tables.update(_threaded_factors(runner, config, workload, tables, replays[0], envs, batches[0], kernels,
                                        seconds, log))
    if overlap:
        tables["ring_write"] = runner.ring_write_us(config, envs)
        tables.update(_processes_factors(runner, config, workload, tables, replays[0], envs, batches[0],
                                         kernels if processes else kernels[:1], seconds, log, processes))
    if wire:
        tables.update(_wire_tables(runner, config, kinds, batches, log))
    if ray is not None:
        tables.update(_ray_tables(ray, workload, log))
    _store(workload.key(), {"tables": tables, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                            "load_average": os.getloadavg()[0], "seconds_per_run": seconds,
                            "cpu_model": this_cpu_model(), **({"wire_version": WIRE_VERSION} if wire else {}),
                            **({"ray_version": RAY_VERSION} if ray is not None else {})})
    if log:
        log(f"profiled in {time.perf_counter() - started:.1f} s (load average {os.getloadavg()[0]:.2f})")
    return tables


def _wire_tables(runner, config, kinds, batches, log) -> dict:
    """The wire's tables by the runner: chunks of WIRE_ROWS rows, samples of each batch size and
    its shares of 2 and 4 shards (the sharded client asks each shard batch / shards rows)."""
    sizes = sorted({max(1, b // s) for b in batches for s in (4, 2, 1)})
    out = runner.wire_us(config, kinds, WIRE_ROWS, sizes)
    if log:
        for name, cells in sorted(out.items()):
            log(f"{name}: " + ", ".join(f"{size}: {us:.1f} us" for size, us in cells.items()))
    return out


def _ray_tables(ray, workload, log) -> dict:
    """The local Ray cluster's tables measured by `ray` for the workload's weights."""
    return ray(workload.n_params, log=log)


def this_cpu_model() -> str:
    from pearl.devices import cpu_devices

    return cpu_devices()[0]["name"]


def _threaded_factors(runner, config, workload, tables, replay, envs, batch, kernels, seconds, log) -> dict:
    """How much the threaded runtime's two threads slow each other here (the GIL, shared cores):
    per learner kernel and envs per actor, one threaded run's measured step time / the sum of
    its threads' times from `tables` (what it would take if the threads took turns).
    estimator/model.py's threaded schedule is max(actor, learner, factor x (actor + learner)),
    with the factor interpolated over envs per actor."""
    from pearl.estimator.model import Candidate, predict

    costs = _measured_costs(workload, tables)
    cands = [Candidate(replay[0], replay[1], "cpu", kernel, e, batch, runtime="threaded")
             for kernel in kernels for e in envs]
    out: dict = {}
    for cand, run in zip(cands, runner.measure_many(config, cands, seconds)):
        serial_us = 1e6 / predict(cand, costs, "sequential").steps_per_s
        factor = round(1e6 / run["steps_per_s"] / serial_us, 4)
        out.setdefault(f"threaded|{cand.learner_kernel}", {})[str(cand.envs)] = factor
        if log:
            log(f"threaded {cand.label()}: {run['steps_per_s']:,.0f} steps/s = {factor:.2f} x the threads' summed time")
    return out


def _processes_factors(runner, config, workload, tables, replay, envs, batch, kernels, seconds, log,
                       time_sharing: bool = True) -> dict:
    """The processes runtime on this machine, measured against its schedule's bound
    (estimator/model.py with f = c = 1), per learner kernel:
    - f, its overlap (`processes1|kernel`, by envs per actor): a one-actor run's measured step /
      the bound. With a core each, the bound says actor and learner overlap perfectly; what the
      run shows instead (the learner polling and draining the rings, two interpreters, whatever
      load the shared machine carries at the time) is the factor, and the model multiplies every
      processes plan's step by it.
    - c, with `time_sharing` (`processes|kernel`): how much further a run with as many actors as
      cores (the N + 1 processes time-share them) falls short of the bound than the one-actor run,
      both measured in the same turns: (bound / measured at N = cores) / (bound / measured at
      N = 1). Set against the one-actor run, a load the machine carries at that moment slows both
      and drops out. Each env count gives one such ratio, from single runs on a shared machine, so
      the factor is their median, and at least 1 (an overhead never speeds a run up). The model
      applies it whenever the processes outnumber the cores."""
    from pearl.devices import cpu_devices
    from pearl.estimator.model import Candidate, predict

    cores = cpu_devices()[0]["cores"]
    counts = sorted({1, cores}) if time_sharing else [1]
    costs = _measured_costs(workload, {k: v for k, v in tables.items() if not k.startswith("processes")})
    cands = [Candidate(replay[0], replay[1], "cpu", kernel, e, batch, runtime="processes", actors=n)
             for kernel in kernels for e in envs for n in counts]
    short = {cand: predict(cand, costs).steps_per_s / run["steps_per_s"]
             for cand, run in zip(cands, runner.measure_many(config, cands, seconds))}
    out: dict = {}
    ratios: dict = {}
    for cand in cands:
        if cand.actors == 1:
            out.setdefault(f"processes1|{cand.learner_kernel}", {})[str(cand.envs)] = round(short[cand], 4)
            if log:
                log(f"processes {cand.label()}: the measured step is {short[cand]:.2f} x the schedule's bound")
        if cand.actors != cores or not time_sharing:
            continue
        alone = replace(cand, actors=1)
        ratio = short[cand] / (short[alone] if cores > 1 else 1.0)
        ratios.setdefault(cand.learner_kernel, []).append(ratio)
        if log:
            log(f"processes {cand.label()}: {short[cand]:.2f} x the model's step, one actor "
                f"{short.get(alone, 1.0):.2f} x: ratio {ratio:.2f}")
    out.update({f"processes|{kernel}": {"0": round(max(1.0, float(np.median(values))), 4)}
                for kernel, values in ratios.items()})
    return out


def _measured_costs(workload, tables):
    """Costs from the measured `tables` alone, on a stand-in for this host: of the host, only its
    core count is read (by the processes schedule)."""
    from pearl.devices import cpu_devices
    from pearl.estimator.costs import Costs
    from pearl.platforms import Device, Platform

    host = Device(id="cpu", kind="cpu", name="this machine", cores=cpu_devices()[0]["cores"], peak_gflops=1.0,
                  memory_bandwidth_gb_s=1.0)
    return Costs(Platform("here", "", (host,), (), "here"), workload, tables)


def _check_grid(workload, replays, kernels) -> None:
    """One-line errors for what the agent would refuse to build (pearl/api.py, pearl/continuous.py),
    before any run: a kernel the algorithm lacks, a replay kind it does not sample, a continuous
    algorithm's replay off the cpu."""
    for kernel in kernels:
        if kernel not in workload.learner_kernels:
            raise ConfigError(f"--kernels: {workload.algo}{' with a dueling head' if workload.dueling else ''} "
                              f"has the {' and '.join(workload.learner_kernels)} learner(s), not {kernel!r}")
    for kind, device in replays:
        if kind not in workload.replay_kinds:
            raise ConfigError(f"--replays: {workload.algo} samples its replay "
                              f"{' or '.join(workload.replay_kinds)}, not {kind}")
        if workload.continuous and device != "cpu":
            raise ConfigError(f"--replays: {workload.algo} keeps its replay on the cpu, not {device}")


def _grid(replays, envs, batches, kernels, workload, engines=("gymnasium",)) -> list:
    from pearl.estimator.model import Candidate
    from pearl.kernels.registry import backend

    envs, batches = list(envs), list(batches)
    # each other env engine's act at every env count (the act table is per engine)
    out = [Candidate(*replays[0], "cpu", kernels[0], e, batches[0], env_engine=engine)
           for engine in engines[1:] for e in envs]
    for kind, device in replays:
        for b in batches:
            out.append(Candidate(kind, device, "cpu", kernels[0], envs[0], b))
        for e in envs[1:]:
            out.append(Candidate(kind, device, "cpu", kernels[0], e, batches[0]))
    kind, device = replays[0]
    for kernel in kernels[1:]:
        for b in batches:
            out.append(Candidate(kind, device, "cpu", kernel, envs[0], b))
    for kernel in kernels:  # the product precisions the mapper offers beside float32 (bf16)
        for precision in backend("cpu").learner_precisions(workload, kernel)[1:]:
            out += [Candidate(kind, device, "cpu", kernel, envs[0], b, precision=precision) for b in batches]
    # the learner thread counts the mapper offers on this machine beyond one (a sequential plan's:
    # every core), at each precision; the learn table is per thread count
    from pearl.devices import cpu_devices
    from pearl.estimator.mapper import learner_threads

    cores = cpu_devices()[0]["cores"]
    for kernel in kernels:
        for threads in learner_threads(cores, workload, "cpu", kernel, "sequential")[1:]:
            out += [Candidate(kind, device, "cpu", kernel, envs[0], b, precision=precision, threads=threads)
                    for precision in backend("cpu").learner_precisions(workload, kernel) for b in batches]
    return out


def _table_of(task: str, cand) -> tuple[str, int]:
    from pearl.estimator.costs import Costs

    return Costs.measured_name(task, cand)


def _tables_of(cands) -> set:
    from pearl.estimator.model import calls_per_step

    out = set()
    for cand in cands:
        for task in ("act", "insert", "sample", "learn", "update_priorities", "sync_weights"):
            if calls_per_step(task, cand, 1.0):
                out.add(_table_of(task, cand))
    return out


def default_replays(config) -> list[tuple[str, str]]:
    """What `pearl profile` measures unless told: every replay kind the algorithm samples, on the
    cpu; for DQN also the prioritized replay on this machine's first OpenCL device, if any (the
    mapper places replays there, and an analytic OpenCL figure is the least trusted)."""
    from pearl.devices import opencl_devices
    from pearl.estimator.workload import REPLAY_KINDS

    if config.algo != "dqn":
        return [("uniform", "cpu")]
    opencl = opencl_devices()
    return [(kind, "cpu") for kind in REPLAY_KINDS] + ([("prioritized", opencl[0]["id"])] if opencl else [])


def parse_replays(text: str) -> list[tuple[str, str]]:
    """'uniform,prioritized@opencl:0,amper' -> [(kind, device), ...]."""
    from pearl.estimator.workload import REPLAY_KINDS

    out = []
    for item in text.split(","):
        kind, _, device = item.strip().partition("@")
        if kind not in REPLAY_KINDS:
            raise ConfigError(f"--replays: {kind!r} is not a replay kind (expected {', '.join(REPLAY_KINDS)}, "
                              f"optionally @device, e.g. prioritized@opencl:0)")
        out.append((kind, device or "cpu"))
    return out
