"""The plan model: a plan's env steps/s, bottleneck task, power (W) and samples/J.

A *candidate* fixes everything the model needs about a plan: where the replay table (insert,
sample, update_priorities) and the learner live, the learner kernel, envs per actor, batch size,
sync interval and replay kind. Each task's per-call time comes from `estimator.costs.Costs`
(measured by `pearl profile` where this machine has the device, analytic otherwise); the model
multiplies by how often the runtime calls the task per env step and schedules the result.

Schedules:
- "sequential" — what pearl/runtime/sequential.py runs (docs/ARCHITECTURE.md, reference
  semantics): one thread; per act round `act` + `insert` (E env steps), then updates_per_step x E
  rounds of sample -> learn -> update_priorities, sync_weights every sync_interval updates.
  T_step = the sum of every task's time per env step + the loop's own overhead.
- "overlapped" — devices run concurrently and sampling stays on the critical path:
  T_step = S + max over devices d of (busy_d - S_d), with S the sampling time per env step and
  busy_d the time device d is busy per env step. With the replay on one device and the learner on
  another this is the PEARL paper's T_iter = T_sample + max(T_update + T_insert, T_learn); with
  everything on one device it collapses to the sequential sum. No runtime here runs it yet; the
  mapper uses it only when asked (`schedule="overlapped"`).
- "threaded" — pearl/runtime/threaded.py (a Plan's `runtime: threaded`): the calling thread acts
  and inserts (and loads weight snapshots), a learner thread samples, learns and updates
  priorities. T_step = max(actor, learner, c x (actor + learner)), each thread the sum of its
  tasks per env step plus its share of the loop overhead, and c the contention factor `pearl
  profile --threaded` measures per learner kernel (one threaded run's step time / its threads'
  summed time): the threads share the GIL and, on a small machine, the cores. Without a measured
  c the model takes c = 0, i.e. threads that never slow each other (an optimistic bound).
- "processes" — pearl/runtime/processes.py (a Plan's `runtime: processes`): N = `actors` actor
  processes each act on their E envs and write each round into a shared-memory ring, loading
  newly published weights once per round at most; the main process (the learner) drains the
  rings into the replay, does the loop's bookkeeping (episode records, progress), samples,
  learns, updates priorities and publishes weights. An actor runs at most its allowance R of env
  steps ahead (`allowance` of the runtime), so a learner that is the bottleneck drains runs of R
  transitions, one insert per actor per loop. Per env step of the whole plan:
      A = act / E + ring write / E + weight loads           (act: as measured in an actor
                                                              process when profiled, else the
                                                              sequential runtime's)
      L = insert(R) / R + the loop's time per loop / (N x R) + updates_per_step x (sample + learn
          + update_priorities + the loop's time per update)
          + updates_per_step / sync_interval x sync_weights (+ transfers)
  and with C = the host's cores, T_step = max(A / min(N, C), L, (A + L) / C): the actors in
  parallel, the learner alone, or all N + 1 processes sharing the cores (work conserving: actors
  wait once ahead by their allowance, leaving the cores to the learner). When the N + 1
  processes outnumber the cores, the step is c times that: c the time-sharing overhead (context
  switches, waiters yielding the core) `pearl profile --processes` measures with N = C actors
  against one actor, 1 when not measured.

Power: every device the plan uses, plus the host cpu, draws idle + dynamic x utilisation, with
utilisation = its busy fraction of the step (the host: the runtime's one busy core of `cores`,
plus the extra cores an OpenCL-on-host kernel occupies; under the processes runtime, the cores
its processes keep busy, (A + L) over the step before c — c's overhead burns the cores too).
An OpenCL device on the host (PoCL) has no power of its own. "Samples" are env steps:
samples/J = env steps/s / W.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from pearl.plan import Plan

REPLAY_TASKS = ("insert", "sample", "update_priorities")


@dataclass(frozen=True)
class Candidate:
    replay_kind: str
    replay_device: str
    learn_device: str
    learner_kernel: str  # fused | torch
    envs: int
    batch: int
    sync_interval: int = 1
    act_device: str = "cpu"
    runtime: str = "sequential"  # the Plan's runtime: sequential | threaded | processes
    actors: int = 1  # actor processes (the processes runtime; the others run one actor)

    def device_of(self, task: str) -> str:
        if task in REPLAY_TASKS:
            return self.replay_device
        if task in ("learn", "sync_weights"):
            return self.learn_device
        return self.act_device

    def label(self) -> str:
        return (f"{self.replay_kind}@{self.replay_device} learn {self.learner_kernel}@{self.learn_device} "
                f"E{self.envs} B{self.batch}" + (f" sync{self.sync_interval}" if self.sync_interval != 1 else "")
                + (f" {self.runtime}" if self.runtime != "sequential" else "")
                + (f" x{self.actors}" if self.actors != 1 else ""))

    def to_plan(self, platform: str = "") -> Plan:
        from pearl.plan import TASK_NAMES

        devices = {task: self.device_of(task) for task in TASK_NAMES}
        uses_fpga = any(d.startswith("fpga") for d in devices.values())
        return Plan(devices=devices, actors=self.actors, envs_per_actor=self.envs, batch_size=self.batch,
                    sync_interval=self.sync_interval, learner_kernel=self.learner_kernel,
                    platform=platform if uses_fpga else "", **({"runtime": self.runtime}
                                                                if self.runtime != "sequential" else {}))


@dataclass
class Prediction:
    candidate: Candidate
    steps_per_s: float
    updates_per_s: float
    watts: float
    samples_per_j: float
    bottleneck: str
    call_us: dict[str, float]  # per call, per task
    step_us: dict[str, float]  # per env step: tasks, transfers, overhead
    utilisation: dict[str, float]
    device_w: dict[str, float]
    sources: dict[str, str]  # task -> measured | analytic | simulated
    schedule: str = "sequential"
    notes: list[str] = field(default_factory=list)
    # parallel schedules, us per env step of each bound on the step: the threaded runtime's
    # actor, learner and contention (c x their sum), the processes runtime's actors, learner and
    # cores (before its overhead factor); the largest is the limiting one
    sides: dict[str, float] = field(default_factory=dict)

    @property
    def limiting_side(self) -> str:
        return max(self.sides, key=self.sides.get) if self.sides else ""

    @property
    def simulated(self) -> bool:
        return "simulated" in self.sources.values()

    def summary(self) -> dict:
        return {"steps_per_s": round(self.steps_per_s, 1), "updates_per_s": round(self.updates_per_s, 1),
                "watts": round(self.watts, 2), "samples_per_j": round(self.samples_per_j, 2),
                "bottleneck": self.bottleneck, "schedule": self.schedule,
                "step_us": {k: round(v, 3) for k, v in self.step_us.items()},
                **({"sides_us": {k: round(v, 3) for k, v in self.sides.items()}} if self.sides else {}),
                "sources": dict(self.sources), "simulated": self.simulated}


def calls_per_step(task: str, cand: Candidate, updates_per_step: float) -> float:
    """How often the sequential runtime calls `task` per env step (steady state, past learning_starts)."""
    if task in ("act", "insert"):
        return 1.0 / cand.envs
    if task == "update_priorities":
        return updates_per_step if cand.replay_kind != "uniform" else 0.0
    if task == "sync_weights":
        return updates_per_step / cand.sync_interval
    return updates_per_step  # sample, learn


SCHEDULES = ("sequential", "threaded", "processes", "overlapped")
ACTOR_THREAD = ("act", "insert", "sync_weights")  # the threaded runtime's calling thread
ACTOR_PROCESS = ("act", "ring_write", "weight_loads")  # the processes runtime's actors (per env step keys)


def predict(cand: Candidate, costs, schedule: str | None = None) -> Prediction:
    """The model's figures for `cand` under `costs` (an estimator.costs.Costs); the schedule is
    the candidate's runtime unless given."""
    from pearl.plan import TASK_NAMES

    schedule = schedule or cand.runtime
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule: expected one of {', '.join(SCHEDULES)}, got {schedule!r}")
    workload, platform = costs.workload, costs.platform
    u = workload.updates_per_step
    call_us, step_us, sources = {}, {}, {}
    busy: dict[str, float] = {}  # device -> us busy per env step (its timeline, launches included)
    active: dict[str, float] = {}  # device -> us computing per env step (what dynamic power scales with)
    run = cand.envs  # transitions per insert
    loop = cand  # what the runtime's loop takes in per pass, as a candidate with that many envs
    if schedule == "processes":
        from pearl.runtime.processes import allowance

        run = allowance(u, cand.actors, cand.envs)
        loop = replace(cand, envs=cand.actors * run)
    for task in TASK_NAMES:
        n, sized = calls_per_step(task, cand, u), cand
        if task == "insert" and run != cand.envs:
            n, sized = 1.0 / run, replace(cand, envs=run)
        if n == 0:
            continue
        seconds, source = costs.task_seconds(task, sized)
        call_us[task], sources[task] = seconds * 1e6, source
        step_us[task] = seconds * 1e6 * n
        device = cand.device_of(task)
        busy[device] = busy.get(device, 0.0) + step_us[task]
        active[device] = active.get(device, 0.0) + costs.active_seconds(task, sized) * 1e6 * n
    for (a, b), seconds in costs.transfers(cand).items():
        key = f"transfer {a}->{b}"
        step_us[key] = step_us.get(key, 0.0) + seconds * 1e6
        busy[b] = busy.get(b, 0.0) + seconds * 1e6  # the consumer waits for its input
    overhead = costs.overhead_us(loop)
    step_us["overhead"] = overhead
    busy["cpu"] = busy.get("cpu", 0.0) + overhead

    sides: dict[str, float] = {}
    host_busy_cores = 1.0  # the runtime's thread runs the whole step (it waits on devices by spinning)
    if schedule == "sequential":
        total = sum(step_us.values())
        bottleneck = max((k for k in step_us if k in call_us), key=step_us.get)
    elif schedule == "threaded":
        per_round, per_update = costs.overhead_parts_us(cand)
        threads = {"actor": per_round, "learner": per_update}
        for key, us in step_us.items():
            if key in call_us:
                threads["actor" if key in ACTOR_THREAD else "learner"] += us
            elif key.startswith("transfer"):
                threads["learner"] += us
        limiting = max(threads, key=threads.get)
        sides = {**threads, "contention": costs.threaded_factor(cand) * (threads["actor"] + threads["learner"])}
        total = max(sides.values())
        bottleneck = max((t for t in call_us if (t in ACTOR_THREAD) == (limiting == "actor")), key=step_us.get)
    elif schedule == "processes":
        step_us["ring_write"] = costs.ring_write_seconds(cand) * 1e6 / cand.envs
        # each actor loads a newly published version once per round at most
        loads = min(cand.actors * u / cand.sync_interval, 1.0 / cand.envs)
        step_us["weight_loads"] = loads * call_us.get("sync_weights", 0.0)
        actors_us = sum(step_us[key] for key in ACTOR_PROCESS if key in step_us)
        learner_us = sum(us for key, us in step_us.items() if key not in ACTOR_PROCESS)  # the loop's too
        cores = platform.host.cores
        sides = {"actors": actors_us / min(cand.actors, cores), "learner": learner_us,
                 "cores": (actors_us + learner_us) / cores}
        limiting = max(sides, key=sides.get)
        total = (costs.processes_factor(cand) if cand.actors + 1 > cores else 1.0) * sides[limiting]
        host_busy_cores = (actors_us + learner_us) / sides[limiting]
        on_side = {"actors": lambda t: t == "act", "learner": lambda t: t != "act", "cores": lambda t: True}[limiting]
        bottleneck = max((t for t in call_us if on_side(t)), key=step_us.get)
    else:
        sample = step_us.get("sample", 0.0)
        replay = cand.replay_device
        rest = {d: b - (sample if d == replay else 0.0) for d, b in busy.items()}
        limiting = max(rest, key=rest.get)
        total = sample + rest[limiting]
        tasks_on = [t for t in call_us if cand.device_of(t) == limiting and not (t == "sample")]
        bottleneck = max(tasks_on, key=step_us.get) if tasks_on else "sample"

    utilisation, device_w = {}, {}
    host = platform.host
    for device_id, us in busy.items():
        if device_id == "cpu":
            continue
        device = platform.device(device_id)
        util = min(1.0, active.get(device_id, 0.0) / total)
        utilisation[device_id] = util
        if device.kind == "opencl" and device.host == "cpu":  # PoCL: its kernels run on the host's cores
            host_busy_cores += util * max(0, min(device.compute_units, host.cores) - 1)
            continue
        device_w[device_id] = device.power_w(util)
    utilisation["cpu"] = min(1.0, host_busy_cores / host.cores)
    device_w["cpu"] = host.power_w(utilisation["cpu"])
    watts = sum(device_w.values())
    steps_per_s = 1e6 / total
    return Prediction(cand, steps_per_s, steps_per_s * u, watts, steps_per_s / watts if watts else 0.0,
                      bottleneck, call_us, step_us, utilisation, device_w, sources, schedule, sides=sides)
