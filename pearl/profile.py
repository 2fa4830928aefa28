"""`pearl profile`: measure each task kernel of a workload on this machine and cache the table.

Every figure comes from the runtime's own code path: an agent is built for a plan exactly as
`pearl train --plan` builds it (pearl/api.py: Actor, the replay table on the plan's device, the
learner kernel), trained past `learning_starts`, then trained for a few seconds with
`time_tasks=True` (pearl/runtime/sequential.py TaskTimer: wall time of each task call inside the
real loop). What the loop spends outside the tasks (counters, episode records, the progress hook)
is the run's wall time minus the tasks' time; a least-squares fit over all profile runs splits it
into a cost per act round and a cost per update.

The grid is a covering design, not the full product: act and insert depend on envs per actor,
sample and update_priorities on (replay kind, device, batch), learn on (kernel, batch) — so one
run per (replay, batch) at 1 env, one per (replay, envs) at the first batch size and one per
torch batch size cover every table, and the model combines tables for any plan on the grid.

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

import numpy as np

from pearl.errors import ConfigError
from pearl.io import atomic_write_text

PROFILE_VERSION = 2
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
    return data.get("workloads", {}).get(workload_key)


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


# -- running a candidate on this machine ---------------------------------------------------------
def runnable_here(cand) -> bool:
    """Whether this machine has every device the candidate names."""
    from pearl.devices import detect_devices

    present = {d["id"] for d in detect_devices()}
    return all(device in present for device in {cand.replay_device, cand.learn_device, cand.act_device}
               if not device.startswith("fpga"))  # fpga:N runs simulated without a board


def _agent(config, cand, warmup_steps: int, total_steps: int):
    """An agent of the config's algorithm for `cand` whose exploration has reached its final form
    by the end of the warm-up (DQN's epsilon its final value; the continuous algorithms act by
    their policy from learning_starts on), so timed steps run the policy's inference as a long
    run would."""
    from pearl.api import make_agent
    from pearl.config import apply_overrides

    overrides = {"replay.kind": cand.replay_kind, "total_steps": total_steps, "eval.interval": 0, "log.plot": False}
    if config.algo == "dqn":
        overrides["dqn.exploration.fraction"] = min(1.0, warmup_steps / total_steps)
    agent = make_agent(apply_overrides(config, overrides), cand.to_plan())
    agent.train(warmup_steps)
    return agent


def default_warmup(config) -> int:
    """Env steps an agent trains before it is timed: past learning_starts, into steady updates."""
    return config.algo_config.learning_starts + 500


# The machine is shared: other processes steal the cores for whole scheduler slices, which
# inflate a mean by whatever they took. Both the profile and the measurement therefore split each
# plan's time into WINDOWS windows, taken in turns across all the plans of the batch (plan 1
# window 1, plan 2 window 1, ..., plan 1 window 2, ...), so a burst of load hits one window of
# several plans rather than every window of one; and they keep each plan's least disturbed window
# (the fastest; per task, the smallest mean call time), as timeit keeps the minimum. Prediction
# and measurement then estimate the same thing: this machine's speed when the process has its cores.
WINDOWS = 4


# The processes runtime starts its actor processes at every run (fresh interpreters: ~0.5 s here)
# and they come up one after another; a window of it measures from PROCESSES_SETTLE_S after the
# learner first takes transitions in, when every actor is stepping, as a long run's steady state.
PROCESSES_SETTLE_S = 0.5


def _window(agent, seconds: float, time_tasks: bool) -> dict:
    """Trains `agent` for `seconds`: its env steps, updates, wall time and (with time_tasks) the
    TaskTimer's mean us per call and total task seconds."""
    from pearl.runtime.counters import TaskTimer

    envs = agent.plan.envs_per_actor
    chunk = max(envs, 100 * envs)
    agent.task_timer = TaskTimer()
    steps0, updates0, wall = agent.env_steps, agent.updates, 0.0
    if agent.plan.runtime == "processes":
        steps0, updates0, wall = _steady_run(agent, seconds, time_tasks)
    while wall < seconds:
        wall += agent.train(chunk, time_tasks=time_tasks)["wall_s"]
    steps = agent.env_steps - steps0
    timer = agent.task_timer
    return {"steps": steps, "updates": agent.updates - updates0, "rounds": steps / envs, "wall_s": wall,
            "steps_per_s": steps / wall, "task_us": timer.mean_us(), "task_s": sum(timer.seconds.values())}


def _steady_run(agent, seconds: float, time_tasks: bool) -> tuple[int, int, float]:
    """One run of the agent's runtime (as agent.train runs it) that stops itself `seconds` after
    settling; returns (env steps, updates, time) where the measured part began and its length."""
    clock, marks = time.perf_counter, {}

    def on_progress(agent):
        now = clock()
        first = marks.setdefault("first", now)
        if "start" not in marks and now - first >= PROCESSES_SETTLE_S:
            marks["start"] = (agent.env_steps, agent.updates, now)
        elif "start" in marks and now - marks["start"][2] >= seconds:
            agent.stop_requested = True  # the runtime stops at the end of its round
            marks["end"] = now

    agent.train(10**12, time_tasks=time_tasks, on_round=on_progress)
    agent.stop_requested = False
    steps, updates, started = marks["start"]
    return steps, updates, marks["end"] - started


def _in_turns(agents: list, seconds: float, time_tasks: bool) -> list[list[dict]]:
    """Each agent trains `seconds` in WINDOWS windows, the agents taking turns window by window."""
    out = [[] for _ in agents]
    for _ in range(WINDOWS):
        for i, agent in enumerate(agents):
            if agent is not None:
                out[i].append(_window(agent, seconds / WINDOWS, time_tasks))
    return out


def measure_many(config, cands, seconds: float = 3.0, warmup_steps: int | None = None) -> list[dict]:
    """Measured env steps/s of each candidate on this machine: warm-up past learning_starts, then
    `seconds` of training with no task timers (the plain runtime's speed) in windows taken in
    turns; `steps_per_s` is the fastest window's, `mean_steps_per_s` the whole time's. A plan the
    runtime refuses gets {"error": one line} instead."""
    from pearl.errors import PearlError

    warmup = warmup_steps if warmup_steps is not None else default_warmup(config)
    agents, errors = [], {}
    for i, cand in enumerate(cands):
        try:
            agents.append(_agent(config, cand, warmup, warmup + 10_000_000))
        except (PearlError, RuntimeError) as err:  # a ConfigError, a rate limiter's refusal
            agents.append(None)
            errors[i] = f"{type(err).__name__}: {str(err).splitlines()[0]}"
    out = []
    for i, windows in enumerate(_in_turns(agents, seconds, time_tasks=False)):
        if i in errors:
            out.append({"error": errors[i]})
            continue
        steps, wall = sum(w["steps"] for w in windows), sum(w["wall_s"] for w in windows)
        out.append({"steps_per_s": max(w["steps_per_s"] for w in windows), "mean_steps_per_s": steps / wall,
                    "steps": steps, "wall_s": wall})
    return out


def measure(config, cand, seconds: float = 3.0, warmup_steps: int | None = None) -> dict:
    """measure_many for one candidate (a refused plan raises)."""
    result = measure_many(config, [cand], seconds, warmup_steps)[0]
    if "error" in result:
        raise ConfigError(f"plan {cand.label()}: {result['error']}")
    return result


def _profile_runs(config, cands, seconds: float) -> list[tuple[dict, dict]]:
    """Per candidate: (per task, the smallest window mean in us; its least disturbed window)."""
    warmup = default_warmup(config)
    agents = [_agent(config, cand, warmup, warmup + 10_000_000) for cand in cands]
    out = []
    for windows in _in_turns(agents, seconds, time_tasks=True):
        means = {task: min(w["task_us"][task] for w in windows if task in w["task_us"])
                 for task in windows[0]["task_us"]}
        out.append((means, max(windows, key=lambda w: w["steps_per_s"])))
    return out


def profile(config, replays=(("uniform", "cpu"),), envs=(1, 4, 16), batches=(64,), kernels=None,
            seconds: float = 1.5, log=None, use_cache: bool = True, threaded: bool = False,
            processes: bool = False) -> dict:
    """The measured cost table of `config`'s workload on this machine (see the module doc);
    `kernels`: the cpu learner kernels to time (default: every one the algorithm has)."""
    from pearl.estimator.workload import workload_from_config

    workload = workload_from_config(config)
    kernels = tuple(kernels or workload.learner_kernels)
    _check_grid(workload, replays, kernels)
    wanted = _grid(replays, envs, batches, kernels)
    if use_cache:
        cached = load_cached(workload.key())
        if cached and all(name in cached["tables"] and str(size) in cached["tables"][name]
                          for name, size in _tables_of(wanted)) and (
                not threaded or all(f"threaded|{k}" in cached["tables"] for k in kernels)) and (
                not processes or all(f"processes|{k}" in cached["tables"] for k in kernels)):
            return cached["tables"]
    tables: dict = {}
    fit_rows, fit_y = [], []
    started = time.perf_counter()
    for i, (cand, (means, run)) in enumerate(zip(wanted, _profile_runs(config, wanted, seconds))):
        for task, us in means.items():
            name, size = _table_of(task, cand)
            # Tasks that do not touch the replay (act, learn, sync_weights) are measured in the
            # runs of every replay, and they are slower beside some (PoCL's worker threads share
            # the two cores with the Python thread). So each is kept twice: in a table of its
            # replay context (Costs prefers it) and in the context-free table, which keeps the
            # least disturbed (smallest) of the runs' figures.
            tables.setdefault(name, {}).setdefault(str(size), []).append(us)
            if task in CONTEXT_TASKS:
                context = f"{name}|in {cand.replay_kind}@{cand.replay_device}"
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
        tables.update(_threaded_factors(config, workload, tables, replays[0], envs, batches[0], kernels,
                                        seconds, log))
    if processes:
        tables["ring_write"] = _ring_write_us(config, envs)
        tables.update(_processes_factors(config, workload, tables, replays[0], envs, batches[0], kernels,
                                         seconds, log))
    _store(workload.key(), {"tables": tables, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                            "load_average": os.getloadavg()[0], "seconds_per_run": seconds})
    return tables


def _threaded_factors(config, workload, tables, replay, envs, batch, kernels, seconds, log) -> dict:
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
    for cand, run in zip(cands, measure_many(config, cands, seconds)):
        serial_us = 1e6 / predict(cand, costs, "sequential").steps_per_s
        factor = round(1e6 / run["steps_per_s"] / serial_us, 4)
        out.setdefault(f"threaded|{cand.learner_kernel}", {})[str(cand.envs)] = factor
        if log:
            log(f"threaded {cand.label()}: {run['steps_per_s']:,.0f} steps/s = {factor:.2f} x the threads' summed time")
    return out


def _processes_factors(config, workload, tables, replay, envs, batch, kernels, seconds, log) -> dict:
    """The processes runtime's time-sharing overhead here, per learner kernel: how much further a
    run with as many actors as cores (the N + 1 processes time-share them) falls short of the
    model (estimator/model.py with c = 1) than a run with one actor (a core each) does, both
    measured in the same turns: (model / measured at N = cores) / (model / measured at N = 1).
    Set against the one-actor run, a load the shared machine carries at that moment slows both
    and drops out. Each env count gives one such ratio, from single runs on a shared machine, so
    the factor is their median, and at least 1 (an overhead never speeds a run up). The model
    applies it whenever the processes outnumber the cores; nothing of it is fitted on plans with
    fewer actors."""
    from pearl.devices import cpu_devices
    from pearl.estimator.model import Candidate, predict

    cores = cpu_devices()[0]["cores"]
    counts = sorted({1, cores})
    costs = _measured_costs(workload, {k: v for k, v in tables.items() if not k.startswith("processes|")})
    cands = [Candidate(replay[0], replay[1], "cpu", kernel, e, batch, runtime="processes", actors=n)
             for kernel in kernels for e in envs for n in counts]
    short = {cand: predict(cand, costs).steps_per_s / run["steps_per_s"]
             for cand, run in zip(cands, measure_many(config, cands, seconds))}
    ratios: dict = {}
    for cand in cands:
        if cand.actors != cores:
            continue
        alone = replace(cand, actors=1)
        ratio = short[cand] / (short[alone] if cores > 1 else 1.0)
        ratios.setdefault(cand.learner_kernel, []).append(ratio)
        if log:
            log(f"processes {cand.label()}: {short[cand]:.2f} x the model's step, one actor "
                f"{short.get(alone, 1.0):.2f} x: ratio {ratio:.2f}")
    return {f"processes|{kernel}": {"0": round(max(1.0, float(np.median(values))), 4)}
            for kernel, values in ratios.items()}


def _ring_write_us(config, envs, rounds: int = 2000) -> dict:
    """An actor process's write of one act round (E transitions) into its shared-memory ring
    (pearl/runtime/shared.py ActorChannel.put, the runtime's own code), per envs per actor: the
    best of 3 timings of `rounds` writes, the ring drained between them."""
    from pearl.api import make_agent
    from pearl.runtime.shared import ActorChannel

    fields = make_agent(config).parts.transition_fields
    out = {}
    for e in envs:
        transitions = [np.zeros((e, *shape), dtype=dtype) for dtype, shape in fields.values()]
        channel = ActorChannel.create(fields, rounds * e)
        try:
            best = float("inf")
            for _ in range(3):
                started = time.perf_counter()
                for _ in range(rounds):
                    channel.put(transitions, [], e)
                best = min(best, (time.perf_counter() - started) / rounds)
                channel.take()
                channel.release()
        finally:
            channel.close()
        out[str(e)] = round(best * 1e6, 3)
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


def _grid(replays, envs, batches, kernels) -> list:
    from pearl.estimator.model import Candidate

    envs, batches = list(envs), list(batches)
    out = []
    for kind, device in replays:
        for b in batches:
            out.append(Candidate(kind, device, "cpu", kernels[0], envs[0], b))
        for e in envs[1:]:
            out.append(Candidate(kind, device, "cpu", kernels[0], e, batches[0]))
    kind, device = replays[0]
    for kernel in kernels[1:]:
        for b in batches:
            out.append(Candidate(kind, device, "cpu", kernel, envs[0], b))
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
