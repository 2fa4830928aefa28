"""The plan model: a plan's env steps/s, bottleneck task, power (W) and samples/J.

A *candidate* fixes everything the model needs about a plan: where the replay table (insert,
sample, update_priorities) and the learner live, the learner kernel with its product precision and
threads, envs per actor, batch size, sync interval and replay kind. Each task's per-call time comes
from `estimator.costs.Costs`
(measured by `pearl profile` where this machine has the device, analytic otherwise); the model
multiplies by how often the runtime calls the task per env step and schedules the result.

The schedule is the plan's runtime's model (pearl/schedule/models.py, `MODELS`): which tasks run
on which thread, process or device, and how their times per env step combine into the step
(sequential: the sum; threaded: max(actor, learner, c x their sum); processes: max(A / min(N, C),
L, (A + L + (t - 1) x learn) / C) with its time-sharing factor; ray: actor nodes, node agents, replay servers and
the learner over a cluster's nodes, pricing the wire with estimator/wire.py; overlapped: the
paper's T_sample + max(...)). This module prices the tasks and the power; it has no
runtime-specific branch. Power of a ray plan: the learner's node only.

Power: every device the plan uses, plus the host cpu, draws idle + dynamic x utilisation, with
utilisation = its busy fraction of the step (the host: the runtime's one busy core of `cores`,
plus the extra cores an OpenCL-on-host kernel occupies; under the processes runtime, the cores
its processes keep busy, (A + L) over the step before c — c's overhead burns the cores too).
An OpenCL device on the host (PoCL) has no power of its own. "Samples" are env steps:
samples/J = env steps/s / W.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from pearl.kernels.registry import REPLAY_TASKS, TASKS, backend, kind_of
from pearl.plan import Plan, RayPlan
from pearl.schedule import CLUSTER_RUNTIMES
from pearl.schedule.models import MODELS, StepFigures


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
    runtime: str = "sequential"  # the Plan's runtime: sequential | threaded | processes | ray
    actors: int = 1  # actor processes (the processes runtime; per node for ray; the others run one)
    env_engine: str = "gymnasium"  # what steps the actors' envs (pearl.envs.ENV_ENGINES)
    # the ray runtime's plan.ray (pearl/plan.py RayPlan, its defaults): node agents, where the
    # replay server runs (learner | server | node), its shards, the rows per chunk at most
    nodes: int = RayPlan.nodes
    placement: str = RayPlan.replay
    shards: int = RayPlan.shards
    chunk: int = RayPlan.chunk
    precision: str = "fp32"  # the learner's products (Plan.learner_precision; estimator/costs.py prices it)
    threads: int = 1  # the learner's torch threads (Plan.learner_threads; estimator/costs.py prices it)

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
                + (f" x{self.actors}" if self.actors != 1 else "")
                + (f" N{self.nodes} {self.placement}" + (f"x{self.shards}" if self.shards != 1 else "")
                   + f" C{self.chunk}" if self.runtime == "ray" else "")
                + (f" {self.env_engine}" if self.env_engine != "gymnasium" else "")
                + (f" {self.precision}" if self.precision != "fp32" else "")
                + (f" t{self.threads}" if self.threads != 1 else ""))

    def to_plan(self, platform: str = "") -> Plan:
        """The complete Plan (`pearl train --plan` runs this candidate from it, replay kind
        included); `platform` is written only when a task is on an FPGA of it."""
        devices = {task: self.device_of(task) for task in TASKS}
        # a plan names its platform when a device of it is a profile's own (an FPGA of the profile)
        uses_profile = any(backend(kind_of(d)).default_platform is not None for d in devices.values())
        ray = (RayPlan(nodes=self.nodes, replay=self.placement, shards=self.shards, chunk=self.chunk)
               if self.runtime == "ray" else RayPlan())
        return Plan(devices=devices, actors=self.actors, envs_per_actor=self.envs, batch_size=self.batch,
                    sync_interval=self.sync_interval, learner_kernel=self.learner_kernel, replay=self.replay_kind,
                    runtime=self.runtime, platform=platform if uses_profile else "", ray=ray,
                    env_engine=self.env_engine, learner_precision=self.precision, learner_threads=self.threads)


# How far a figure of each source may be off (relative, one standard band): what the accuracy
# benchmark (benchmarks/autotune_accuracy.py, docs/BENCHMARKS.md) saw on this project's 2-core
# machine, development and held-out sets: profiled figures at the size within ~10% (the shared
# machine's run-to-run spread), between sizes ~15%, beyond them ~30%; the analytic roofline and the
# FPGA cycle model within a factor of ~1.6. A parallel runtime's step without its measured factor
# (threaded contention, processes overlap) is optimistic by up to ~half.
UNCERTAINTY = {"measured": 0.10, "interpolated": 0.15, "extrapolated": 0.30, "analytic": 0.60, "simulated": 0.60,
               "wire": 0.60}
UNMEASURED_FACTOR_UNCERTAINTY = 0.5


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
    # where the parallel runtime's measured factor came from (estimator.costs SOURCES or
    # "unmeasured"); "" for a schedule without one
    factor_source: str = ""

    @property
    def uncertainty(self) -> float:
        """The step's relative uncertainty: each task's band (UNCERTAINTY by its source) weighted by
        its share of the tasks' time per env step, plus the runtime factor's when it has one."""
        tasks = {t: self.step_us[t] for t in self.sources if self.step_us.get(t)}
        total = sum(tasks.values())
        spread = sum(us * UNCERTAINTY[self.sources[t]] for t, us in tasks.items()) / total if total else 0.0
        if self.factor_source:
            spread += UNCERTAINTY.get(self.factor_source, UNMEASURED_FACTOR_UNCERTAINTY) / 2
        return spread

    @property
    def steps_range(self) -> tuple[float, float]:
        """(low, high) env steps/s: the prediction divided and multiplied by 1 + uncertainty."""
        spread = 1.0 + self.uncertainty
        return self.steps_per_s / spread, self.steps_per_s * spread

    @property
    def limiting_side(self) -> str:
        return max(self.sides, key=self.sides.get) if self.sides else ""

    @property
    def simulated(self) -> bool:
        return "simulated" in self.sources.values()

    def summary(self) -> dict:
        low, high = self.steps_range
        return {"steps_per_s": round(self.steps_per_s, 1), "steps_per_s_range": [round(low, 1), round(high, 1)],
                "updates_per_s": round(self.updates_per_s, 1),
                "watts": round(self.watts, 2), "samples_per_j": round(self.samples_per_j, 2),
                "power": "modelled (no sensor read: estimator/model.py's idle + dynamic x utilisation)",
                "bottleneck": self.bottleneck, "schedule": self.schedule,
                "step_us": {k: round(v, 3) for k, v in self.step_us.items()},
                **({"sides_us": {k: round(v, 3) for k, v in self.sides.items()}} if self.sides else {}),
                "sources": dict(self.sources), **({"runtime_factor": self.factor_source} if self.factor_source else {}),
                "simulated": self.simulated}


def calls_per_step(task: str, cand: Candidate, updates_per_step: float) -> float:
    """How often the sequential runtime calls `task` per env step (steady state, past learning_starts)."""
    if task in ("act", "insert"):
        return 1.0 / cand.envs
    if task == "update_priorities":
        return updates_per_step if cand.replay_kind != "uniform" else 0.0
    if task == "sync_weights":
        return updates_per_step / cand.sync_interval
    return updates_per_step  # sample, learn


SCHEDULES = tuple(MODELS)


def predict(cand: Candidate, costs, schedule: str | None = None) -> Prediction:
    """The model's figures for `cand` under `costs` (an estimator.costs.Costs); the schedule is
    the candidate's runtime unless given."""
    schedule = schedule or cand.runtime
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule: expected one of {', '.join(SCHEDULES)}, got {schedule!r}")
    model = MODELS[schedule]
    workload, platform = costs.workload, costs.platform
    u = workload.updates_per_step
    call_us, step_us, sources = {}, {}, {}
    busy: dict[str, float] = {}  # device -> us busy per env step (its timeline, launches included)
    active: dict[str, float] = {}  # device -> us computing per env step (what dynamic power scales with)
    run, pass_envs = model.insert_run(cand, u)  # transitions per insert, env steps per pass of the loop
    loop = cand if pass_envs == cand.envs else replace(cand, envs=pass_envs)
    for task in TASKS:
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
    step = model.step(StepFigures(call_us, step_us, busy, u), cand, costs)
    if cand.runtime in CLUSTER_RUNTIMES:  # the wire's parts: the profile's measured wire, or wire.py's constants
        from pearl.estimator.wire import source

        sources.update(dict.fromkeys(("agent", "server_requests"), source(costs.measured, cand.replay_kind)))
    total, host_busy_cores = step.total_us, step.host_busy_cores

    utilisation, device_w = {}, {}
    host = platform.host
    for device_id, us in busy.items():
        if device_id == "cpu" or sources.get("sample") == "wire" and device_id == cand.replay_device:
            continue  # a replay server's power is its own machine's (estimator/wire.py)
        device = platform.device(device_id)
        util = min(1.0, active.get(device_id, 0.0) / total)
        utilisation[device_id] = util
        if device.host == "cpu":  # an accelerator on the host's cores (PoCL): no power of its own
            host_busy_cores += util * max(0, min(device.compute_units, host.cores) - 1)
            continue
        device_w[device_id] = device.power_w(util)
    utilisation["cpu"] = min(1.0, host_busy_cores / host.cores)
    device_w["cpu"] = host.power_w(utilisation["cpu"])
    watts = sum(device_w.values())
    steps_per_s = 1e6 / total
    return Prediction(cand, steps_per_s, steps_per_s * u, watts, steps_per_s / watts if watts else 0.0,
                      step.bottleneck, call_us, step_us, utilisation, device_w, sources, schedule, sides=step.sides,
                      factor_source=step.factor_source)
