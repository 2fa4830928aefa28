"""Each runtime's schedule model: which tasks run on which lane (thread, process, device), and how
the lanes' times per env step combine into the step time. The estimator (estimator/model.py)
prices every task per env step and asks the model of the plan's runtime (`MODELS[name]`) for the
step; a runtime module names its model, so a new runtime = its module + one model here.

Every figure is in us per env step of the whole plan. A model reads the task figures it is given
(`StepFigures`) and, for runtime-specific costs, a costs object (estimator.costs.Costs, duck-typed:
this module imports nothing of pearl's but the schedule arithmetic) and the plan's candidate
(estimator.model.Candidate: envs, batch, actors, sync_interval, replay_device, device_of).
"""
from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from pearl.schedule import (AGENT_NAP_S, FLUSH_S, INLINE_WEIGHTS_BYTES, PUBLISH_S, SAMPLES_AHEAD, agent_allowance,
                            allowance, credit_lag, grant_step)


@dataclass
class StepFigures:
    """What the estimator priced for one plan, per env step: `call_us` per call of each task the
    runtime calls, `step_us` per env step of each task, transfer ("transfer A->B") and the loop's
    own time ("overhead"), `busy` the us each device is occupied. A model may add its own step_us
    entries (the processes runtime's ring write)."""

    call_us: dict[str, float]
    step_us: dict[str, float]
    busy: dict[str, float]
    updates_per_step: float


@dataclass
class Step:
    """A model's answer: the step time, the task that limits it, the bounds on the step of a
    parallel runtime (`sides`, the largest limits) and the host cores the runtime keeps busy."""

    total_us: float
    bottleneck: str
    sides: dict[str, float] = field(default_factory=dict)
    host_busy_cores: float = 1.0  # the runtime's thread runs the whole step (it waits on devices by spinning)
    # where a runtime-specific factor applied to the step came from ("" when the model has none):
    # measured / interpolated / extrapolated by `pearl profile`, or "unmeasured" (taken as 1)
    factor_source: str = ""


class ScheduleModel(ABC):
    """One runtime's schedule. `lanes`: lane -> the tasks (step_us keys) that run on it."""

    name = ""
    lanes: dict[str, tuple[str, ...]] = {}

    def insert_run(self, cand, updates_per_step: float) -> tuple[int, int]:
        """(transitions one insert takes in, env steps one pass of the runtime's loop takes in):
        an act round's E for a runtime that inserts after each round."""
        return cand.envs, cand.envs

    @abstractmethod
    def step(self, figures: StepFigures, cand, costs) -> Step:
        """The step time, its bottleneck task and sides from the tasks' figures per env step."""


def _largest_task(figures: StepFigures, tasks) -> str:
    return max(tasks, key=figures.step_us.get)


class Sequential(ScheduleModel):
    """pearl/runtime/sequential.py, the reference semantics (docs/ARCHITECTURE.md): one thread;
    per act round `act` + `insert` (E env steps), then updates_per_step x E rounds of sample ->
    learn -> update_priorities, sync_weights every sync_interval updates. T_step = the sum of every
    task's time per env step + the loop's own overhead."""

    name = "sequential"
    lanes = {"runtime": ("act", "insert", "sample", "learn", "update_priorities", "sync_weights")}

    def step(self, figures, cand, costs) -> Step:
        return Step(sum(figures.step_us.values()), _largest_task(figures, figures.call_us))


class Threaded(ScheduleModel):
    """pearl/runtime/threaded.py: the calling thread acts and inserts (and loads weight
    snapshots), a learner thread samples, learns and updates priorities. T_step = max(actor,
    learner, c x (actor + learner)), each thread the sum of its tasks per env step plus its share
    of the loop overhead (transfers on the learner's), and c the contention factor `pearl profile
    --threaded` measures per learner kernel (one threaded run's step time / its threads' summed
    time): the threads share the GIL and, on a small machine, the cores. Without a measured c the
    model takes c = 0, i.e. threads that never slow each other (an optimistic bound)."""

    name = "threaded"
    lanes = {"actor": ("act", "insert", "sync_weights"), "learner": ("sample", "learn", "update_priorities")}

    def step(self, figures, cand, costs) -> Step:
        per_round, per_update = costs.overhead_parts_us(cand)
        threads = {"actor": per_round, "learner": per_update}
        for key, us in figures.step_us.items():
            if key in figures.call_us:
                threads["actor" if key in self.lanes["actor"] else "learner"] += us
            elif key.startswith("transfer"):
                threads["learner"] += us
        limiting = max(threads, key=threads.get)
        factor = costs.threaded_factor(cand)
        sides = {**threads, "contention": factor * (threads["actor"] + threads["learner"])}
        on_lane = [t for t in figures.call_us if (t in self.lanes["actor"]) == (limiting == "actor")]
        return Step(max(sides.values()), _largest_task(figures, on_lane), sides,
                    factor_source="measured" if factor else "unmeasured")


class Processes(ScheduleModel):
    """pearl/runtime/processes.py: N = `actors` actor processes each act on their E envs and write
    each round into a shared-memory ring, loading newly published weights once per round at most;
    the main process (the learner) drains the rings into the replay, does the loop's bookkeeping
    (episode records, progress), samples, learns, updates priorities and publishes weights. An
    actor runs at most its allowance R of env steps ahead (pearl.schedule.allowance), so a learner
    that is the bottleneck drains runs of R transitions, one insert per actor per loop. Per env
    step of the whole plan:
        A = act / E + ring write / E + weight loads           (act: as measured in an actor
                                                              process when profiled, else the
                                                              sequential runtime's)
        L = insert(R) / R + the loop's time per loop / (N x R) + updates_per_step x (sample + learn
            + update_priorities + the loop's time per update)
            + updates_per_step / sync_interval x sync_weights (+ transfers)
    and with C = the host's cores, T_step = max(A / min(N, C), L, (A + L + (t - 1) x learn) / C):
    the actors in parallel, the learner alone, or all N + 1 processes sharing the cores (work
    conserving: actors wait once ahead by their allowance, leaving the cores to the learner; a
    learner on t threads, Plan.learner_threads, takes t cores while it learns, so its learn counts
    t times there; a task on an OpenCL device of the host's own cores, PoCL, counts once per core
    its kernels take). Two measured factors
    multiply that bound. f, the runtime's overlap on this machine: a 1-actor run's measured step /
    this bound, per learner kernel and envs per actor (`pearl profile`; what the bound leaves out:
    the learner polling and draining the rings, the actor's interpreter beside the learner's, a
    shared machine's other load); 1 when not measured. And when the N + 1 processes outnumber the
    cores, c: the time-sharing overhead (context switches, waiters yielding the core) `pearl
    profile --processes` measures with N = C actors against one actor, 1 when not measured. The
    host's busy cores are (A + L) over the step before f and c (their overhead burns the cores too)."""

    name = "processes"
    lanes = {"actors": ("act", "ring_write", "weight_loads"),
             "learner": ("insert", "sample", "learn", "update_priorities", "sync_weights")}

    def insert_run(self, cand, updates_per_step):
        run = allowance(updates_per_step, cand.actors, cand.envs)
        return run, cand.actors * run

    def step(self, figures, cand, costs) -> Step:
        step_us, u = figures.step_us, figures.updates_per_step
        step_us["ring_write"] = costs.ring_write_seconds(cand) * 1e6 / cand.envs
        # each actor loads a newly published version once per round at most
        loads = min(cand.actors * u / cand.sync_interval, 1.0 / cand.envs)
        step_us["weight_loads"] = loads * figures.call_us.get("sync_weights", 0.0)
        actors = self.lanes["actors"]
        actors_us = sum(step_us[key] for key in actors if key in step_us)
        learner_us = sum(us for key, us in step_us.items() if key not in actors)  # the loop's too
        cores = costs.platform.host.cores
        # a device on the host's own cores (PoCL) runs each kernel on up to all of them, and the
        # processes wait for those cores meanwhile: its time counts once per core it takes
        shared = (cand.threads - 1) * step_us.get("learn", 0.0)
        for task in figures.call_us:
            device = cand.device_of(task)
            if device != "cpu" and costs.platform.device(device).host == "cpu":
                shared += (min(costs.platform.device(device).compute_units, cores) - 1) * step_us.get(task, 0.0)
        sides = {"actors": actors_us / min(cand.actors, cores), "learner": learner_us,
                 "cores": (actors_us + learner_us + shared) / cores}
        limiting = max(sides, key=sides.get)
        overlap, source = costs.processes_overlap(cand)
        total = overlap * (costs.processes_factor(cand) if cand.actors + 1 > cores else 1.0) * sides[limiting]
        on_lane = [t for t in figures.call_us if limiting == "cores" or (t in actors) == (limiting == "actors")]
        return Step(total, _largest_task(figures, on_lane), sides, (actors_us + learner_us) / sides[limiting],
                    factor_source=source)


class Overlapped(ScheduleModel):
    """Devices run concurrently and sampling stays on the critical path: T_step = S + max over
    devices d of (busy_d - S_d), with S the sampling time per env step and busy_d the time device d
    is busy per env step. With the replay on one device and the learner on another this is the
    PEARL paper's T_iter = T_sample + max(T_update + T_insert, T_learn); with everything on one
    device it collapses to the sequential sum. No runtime runs it yet; the mapper uses it only
    when asked (`schedule="overlapped"`). Its lanes are the plan's devices."""

    name = "overlapped"
    lanes = {"sample": ("sample",)}

    def step(self, figures, cand, costs) -> Step:
        sample = figures.step_us.get("sample", 0.0)
        rest = {d: b - (sample if d == cand.replay_device else 0.0) for d, b in figures.busy.items()}
        limiting = max(rest, key=rest.get)
        tasks_on = [t for t in figures.call_us if cand.device_of(t) == limiting and t not in self.lanes["sample"]]
        return Step(sample + rest[limiting], _largest_task(figures, tasks_on) if tasks_on else "sample")


class Ray(ScheduleModel):
    """pearl/runtime/ray.py (docs/RAY.md): N = `nodes` node agents, each running A = `actors` actor
    processes of E envs as the processes runtime does and streaming their transitions in chunks
    to the replay server; the learner on the driver. Per env step of the whole plan, with c the
    rows a chunk carries and v the weight versions published (costs.ray_parts prices the parts):
        actors  As = act + ring write / E + weight loads (each actor loads a version once a round);
                     on the cores, + N A x (step - As / N A) x an actor's measured CPU per second
                     waiting at its allowance (`pearl profile --ray`; 0 without it)
        agents  G  = N x pass x step / (AGENT_NAP_S + pass) + chunk(c) / c + v x N x a publish's
                     handling: an agent passes over its rings once per nap, busy or not; with
                     `pearl profile --ray` + N x its process's measured CPU per second x step (its
                     nap loop and Ray's threads: costs.ray_background) and the pass without its nap
        Ray     R  = (v x N + g) x Ray's measured work per publish per agent (0 without the profile's)
        server  S  = (insert(c) + request) / c, + u x a shard's work per update when remote
        learner L  = u x (sample + learn + update_priorities) + the loop's time per update and per
                     chunk + v x (sync_weights + N Ray calls at the publishing thread's measured
                     CPU per call (else the platform's), + a ray.put for weights over
                     INLINE_WEIGHTS_BYTES: a publish per agent)
                     + (d - v) ray.waits (a sync past the time gate while one is in flight polls);
                     `learner` placement: + the server's chunks (its thread shares the GIL);
                     `server` / `node`: + g grants (a Ray call each to an agent, handled there
                     as a publish is: + g x a publish's handling in G); the sample is a wait on
                     the wire and the shards; with
                     uniform replay the learner keeps SAMPLES_AHEAD batches asked for while it
                     learns, so it waits only where a round trip / SAMPLES_AHEAD exceeds its update
    With the replay in the learner the server's credit bounds the env steps committed ahead of
    the learner's updates to W = credit_lag / u (pearl.schedule.credit_lag); once an agent used its
    share it waits for more, and the steps in flight turn over once per credit cycle: the agent's
    CREDIT round trip, its chunk's round trip (the wire's insert round trip, measured by `pearl
    profile --wire` or wire.py's constants) and its nap (AGENT_NAP_S) before the next pass. By
    Little's law the step gains that cycle / W (`credit_wait`): small windows (small chunks, few
    nodes) cost the most.
    d = min(u / sync_interval, step / PUBLISH_S) and v = min(d, step / a publish's delivery (to one
    agent, + N - 1 calls; with `pearl profile --ray` at least its measured time between publishes,
    the runtime's gate and delivery wait)): syncs due within PUBLISH_S of the last publish or while a delivery is in
    flight fold into the next. g = 1 / pearl.schedule.grant_step per env step (0 with `learner`:
    the server's credit gates the agents). c = clamp(rows arriving over the passes until an agent's oldest row
    is FLUSH_S old, E, chunk): an agent sends what it holds then, so chunks fill only as far as
    that lets rows pile up (at the rate the other sides allow, up to its actors' allowances:
    pearl.schedule.agent_allowance, the runtime's). The step is the largest side: one actor
    process (As / N A), one agent (G / N), the learner (L), one shard (remote), the wire into the
    server's node, each node's cores ((As + G) + R / N cores), the learner node's cores (L's CPU, + the servers placed there) or, on a shared
    host (a local cluster: `nodes.shared_cores`), all the work (R too) over the cores its Ray
    daemons leave (measured at rest by `pearl profile --ray`, else the platform's `daemon_cores`),
    times the processes runtime's measured time-sharing factor when the processes outnumber the
    cores they share. c and v depend on the step: a fixed point, found by iteration."""

    name = "ray"
    lanes = {"actors": ("act", "ring_write", "weight_loads"), "agents": ("agent",),
             "server": ("insert", "server_requests"),
             "learner": ("sample", "learn", "update_priorities", "sync_weights", "publish")}
    ITERATIONS = 60

    def insert_run(self, cand, updates_per_step):
        return cand.chunk, cand.chunk  # the server's inserts: priced again at the chunks' fill (step)

    def step(self, figures, cand, costs) -> Step:
        nodes = costs.cluster(cand)
        n, a, e, u = cand.nodes, cand.actors, cand.envs, figures.updates_per_step
        call, host = figures.call_us, costs.platform.host
        remote = cand.placement != "learner"
        shards = cand.shards if remote else 0
        ring_write = costs.ring_write_seconds(cand) * 1e6 / e
        update = call.get("learn", 0.0) + call.get("update_priorities", 0.0)
        _, per_update = costs.overhead_parts_us(cand)  # the driver loop's time per update, per env step
        shared = nodes.shared_cores
        beside_learner = 1 + (shards if cand.placement == "server" else 0)  # the driver and its servers
        if shared:  # every process of the plan on the host's cores
            oversubscribed = n * (a + 1) + 1 + shards > shared
        else:  # a node's actors and agent, the learner node's processes
            oversubscribed = a + 1 > nodes.cores or beside_learner > host.cores
        factor = costs.processes_factor(cand) if oversubscribed else 1.0
        step_us = dict(figures.step_us)
        total = sum(step_us.values())  # a start: the sequential sum
        rows, priced, others = cand.chunk, {}, total
        # env steps the server's credit lets the agents commit ahead of the learner (replay: learner)
        window = 0.0 if remote else credit_lag(cand.to_plan(), u, costs.workload.n_step) / u
        # rows an agent finds in its rings at most: its actors' allowances, the runtime's own rule
        held = a * agent_allowance(cand.to_plan(), u)
        background = costs.ray_background()
        # the driver's grants to the agents (replay off the learner's process): Ray calls per env step
        grants = 1.0 / grant_step(cand.to_plan(), u, costs.workload.n_step) if remote else 0.0
        for _ in range(self.ITERATIONS):
            parts = priced.get(rows) or priced.setdefault(rows, costs.ray_parts(cand, rows))
            # an agent passes over its rings once per nap; it sends what it holds at the first pass
            # that finds its oldest row FLUSH_S old (or `chunk` rows): the rows arriving at a node
            # over that many passes, at the rate the rest of the plan allows
            cycle = AGENT_NAP_S * 1e6 + parts["agent_pass"]
            arriving = math.ceil(FLUSH_S * 1e6 / cycle) * cycle / (others * n)
            rows = int(min(cand.chunk, held, max(e, round(arriving))))
            parts = priced.get(rows) or priced.setdefault(rows, costs.ray_parts(cand, rows))
            # a publish: N calls on the driver (and one put for weights too large to ride in them),
            # each at the publishing thread's measured CPU per call (submit, its share of the polls);
            # the next one waits for its delivery (to one agent, and the further calls submitted
            # before the last one goes out) and for PUBLISH_S since the last
            put = nodes.ray_put_us if 4 * costs.workload.n_params > INLINE_WEIGHTS_BYTES else 0.0
            publish = call.get("sync_weights", 0.0) + put + n * background["publish_driver"]
            delivery = nodes.ray_publish_us + (n - 1) * nodes.ray_call_us
            due = min(u / cand.sync_interval, total / (PUBLISH_S * 1e6))  # syncs past the time gate
            versions = min(due, total / max(delivery, background["publish_interval"] or 0.0))
            step_us["ring_write"] = ring_write
            step_us["weight_loads"] = min(n * a * versions, 1.0 / e) * call.get("sync_weights", 0.0)
            # every agent's passes over the env step's time, its chunks, the publishes it takes;
            # measured, its process's CPU per second whatever the rate (the nap loop's wakes, Ray's
            # threads) beside the passes' own work
            passes = parts["agent_pass"] if background["agent"] is None else parts["agent_rings"]
            step_us["agent"] = n * passes * total / cycle + parts["agent_chunk"] / rows \
                + (versions * n + grants) * background["publish_agent"] + n * (background["agent"] or 0.0) * total
            step_us["ray"] = (versions * n + grants) * background["publish_ray"]
            step_us["insert"] = parts["insert"] / rows
            step_us["server_requests"] = parts["request"] / rows
            # each sync past the time gate while a delivery is in flight asks Ray whether it landed
            polls = max(0.0, due - versions)
            step_us["publish"] = versions * publish + polls * nodes.ray_wait_us
            step_us.pop("sync_weights", None)  # priced in publish, at the versions actually sent
            step_us["overhead"] = per_update + parts["round"] / rows + grants * nodes.ray_call_us
            if window:  # a credit cycle per window of env steps (the docstring)
                step_us["credit_wait"] = (AGENT_NAP_S * 1e6 + 2 * parts["insert_rtt"]) / window
            wait = step_us.get("credit_wait", 0.0)
            chunk_server = step_us["insert"] + step_us["server_requests"]
            if remote:
                step_us.pop("update_priorities", None)  # rides on the sample request, applied by the shards
                server = chunk_server / shards + u * parts["shard_update"]
                learner_cpu = u * (call.get("learn", 0.0) + parts["sample_client"]) + step_us["publish"] \
                    + step_us["overhead"]
                if cand.replay_kind == "uniform":  # SAMPLES_AHEAD batches asked for while it learns
                    learner = max(learner_cpu, u * parts["sample_wait"] / SAMPLES_AHEAD)
                else:  # a prioritized batch waits for the previous one's priorities: a round trip each
                    learner = learner_cpu + u * (parts["sample_wait"] - parts["sample_client"])
                step_us["sample"] = u * parts["sample_client"] + learner - learner_cpu
                servers_cpu = shards * server
            else:
                step_us["sample"] = u * call.get("sample", 0.0)
                learner = u * update + step_us["sample"] + step_us["publish"] + step_us["overhead"] + chunk_server
                learner_cpu, servers_cpu = learner, 0.0
            # (an actor waiting at its allowance yields its core, then sleeps: processes._wait's
            # back-off takes cycles only where nothing else runs, so it is not charged)
            actors_us = sum(step_us[k] for k in self.lanes["actors"] if k in step_us)
            agents_us = step_us["agent"]
            sides = {"actors": actors_us / (n * a), "agents": agents_us / n, "learner": learner}
            if remote:
                sides["server"] = server
            receivers = shards if cand.placement == "node" else 1  # the nodes the chunks flow into
            sides["wire"] = parts["chunk_wire"] / rows / receivers
            busy = actors_us + agents_us + learner_cpu + servers_cpu + step_us["ray"]
            if shared:
                free = shared - background["daemon"] * nodes.count
                sides["cores"] = busy / free
            else:
                on_nodes = actors_us + agents_us + step_us["ray"]
                sides["node cores"] = on_nodes / (n * nodes.cores)
                on_learner_node = learner_cpu + (servers_cpu if cand.placement == "server" else 0.0)
                sides["learner cores"] = on_learner_node / host.cores
            limiting = max(sides, key=sides.get)
            others = factor * max(v for k, v in sides.items() if k != "agents") + wait
            new = factor * sides[limiting] + wait
            if abs(new - total) <= 1e-6 * total:
                total = new
                break
            total = (total + new) / 2
        # the model's own parts, per call: an agent's pass, a chunk's request, a publish
        call.update(agent=parts["agent_pass"] + parts["agent_chunk"], server_requests=parts["request"],
                    publish=publish)
        lane = {"actors": "actors", "agents": "agents", "server": "server", "wire": "server"}.get(limiting, "learner")
        bottleneck = max((t for t in self.lanes[lane] if step_us.get(t)), key=step_us.get)
        figures.step_us.clear()
        figures.step_us.update(step_us)
        host_busy = min(busy, total * (shared or host.cores)) / total if shared else (
            min(learner_cpu + (servers_cpu if cand.placement == "server" else 0.0), total * host.cores) / total)
        return Step(total, bottleneck, sides, host_busy, factor_source="measured" if factor != 1.0 else "")


MODELS: dict[str, ScheduleModel] = {model.name: model for model in
                                    (Sequential(), Threaded(), Processes(), Overlapped(), Ray())}
