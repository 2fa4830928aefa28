"""Running candidate plans on this machine: what `pearl profile` times and `pearl autotune
--measure` compares against. Above the estimator (it builds agents with pearl.api); the estimator's
profile and tune take this module as their `runner` (estimator.profile.Runner) and never import it.

Every figure comes from the runtime's own code path: an agent is built for a plan exactly as
`pearl train --plan` builds it (pearl.api.make_agent), trained past `learning_starts`, then
trained for a few seconds, with `time_tasks=True` when profiling (the TaskTimer: wall time of each
task call inside the real loop).
"""
from __future__ import annotations

import dataclasses
import time

import numpy as np

from pearl.errors import ConfigError

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


def default_warmup(config) -> int:
    """Env steps an agent trains before it is timed: past learning_starts, into steady updates."""
    return config.algo_config.learning_starts + 500


def agent_for(config, cand, warmup_steps: int, total_steps: int):
    """An agent of the config's algorithm for `cand` (its complete plan: replay kind included)
    whose exploration has reached its final form by the end of the warm-up (DQN's epsilon its
    final value; the continuous algorithms act by their policy from learning_starts on), so timed
    steps run the policy's inference as a long run would."""
    from pearl.api import make_agent
    from pearl.config import apply_overrides
    from pearl.plan import replanned

    # a window times the plan's own thread count (the profile's tables are per count); a run adapts it
    overrides = {"total_steps": total_steps, "eval.interval": 0, "log.plot": False, "runtime.adapt_threads": False}
    if config.algo == "dqn":
        overrides["dqn.exploration.fraction"] = min(1.0, warmup_steps / total_steps)
    # the candidate decides what the plan and the config both say (replay kind, batch size, ...):
    # the config's values go back to their defaults so that the plan's are no conflict
    config, plan = replanned(apply_overrides(config, overrides), cand.to_plan(), cand.to_plan())
    # what a window measures is the actor processes' steady state, not the learner acting while they start
    plan = dataclasses.replace(plan, act_while_actors_start=False)
    agent = make_agent(config, plan)
    agent.train(warmup_steps)
    return agent


def _window(agent, seconds: float, time_tasks: bool) -> dict:
    """Trains `agent` for `seconds`: its env steps, updates, wall time and (with time_tasks) the
    TaskTimer's mean us per call and total task seconds."""
    import torch

    from pearl.runtime.counters import TaskTimer

    # torch's intra-op threads are the process's, set when an agent is built (pearl/build.py): the
    # agents taking turns here may be built for different learner threads
    torch.set_num_threads(agent.parts.family.torch_threads(agent.learner.kernel, agent.plan.device_of("learn"),
                                                           agent.plan.learner_threads))
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
    """One run of the agent's runtime that stops itself `seconds` after settling; returns (env
    steps, updates, time) where the measured part began and its length."""
    clock, marks = time.perf_counter, {}

    def on_round(agent):
        now = clock()
        first = marks.setdefault("first", now)
        if "start" not in marks and now - first >= PROCESSES_SETTLE_S:
            marks["start"] = (agent.env_steps, agent.updates, now)
        elif "start" in marks and now - marks["start"][2] >= seconds:
            agent.stop_requested = True  # the runtime stops at the end of its round
            marks["end"] = now

    # what is left of total_steps (agent_for sizes it far beyond any window): the run stops itself
    agent.train(time_tasks=time_tasks, on_round=on_round)
    agent.stop_requested = False
    steps, updates, started = marks["start"]
    return steps, updates, marks["end"] - started


def _in_turns(agents: list, seconds: float, time_tasks: bool, sensors=None) -> list[list[dict]]:
    """Each agent trains `seconds` in WINDOWS windows, the agents taking turns window by window;
    with `sensors` (pearl.power.Sensors) each window also has the watts its counters read over it
    (the energy over the window's elapsed time, start-up of a processes run included)."""
    out = [[] for _ in agents]
    for _ in range(WINDOWS):
        for i, agent in enumerate(agents):
            if agent is not None:
                snapshot, started = (sensors.read(), time.perf_counter()) if sensors else (None, 0.0)
                window = _window(agent, seconds / WINDOWS, time_tasks)
                if sensors:
                    window["watts"] = sensors.joules_since(snapshot) / (time.perf_counter() - started)
                out[i].append(window)
    return out


def measure_many(config, cands, seconds: float = 3.0, warmup_steps: int | None = None, sensors=None) -> list[dict]:
    """Measured env steps/s of each candidate on this machine: warm-up past learning_starts, then
    `seconds` of training with no task timers (the plain runtime's speed) in windows taken in
    turns; `steps_per_s` is the fastest window's, `mean_steps_per_s` the whole time's. Where this
    machine has a power sensor (pearl.power: RAPL, NVML; `sensors` default: the ones here) a
    result also has the fastest window's measured `watts`, `samples_per_j` and `power_source`
    (the counters' names); with none, no watt is reported (only the model has them, labelled so).
    A plan the runtime refuses gets {"error": one line} instead."""
    from pearl.errors import PearlError
    from pearl.power import Sensors

    sensors = Sensors.here() if sensors is None else sensors
    warmup = warmup_steps if warmup_steps is not None else default_warmup(config)
    agents, errors = [], {}
    for i, cand in enumerate(cands):
        try:
            agents.append(agent_for(config, cand, warmup, warmup + 10_000_000))
        except (PearlError, RuntimeError) as err:  # a ConfigError, a rate limiter's refusal
            agents.append(None)
            errors[i] = f"{type(err).__name__}: {str(err).splitlines()[0]}"
    out = []
    for i, windows in enumerate(_in_turns(agents, seconds, time_tasks=False, sensors=sensors or None)):
        if i in errors:
            out.append({"error": errors[i]})
            continue
        steps, wall = sum(w["steps"] for w in windows), sum(w["wall_s"] for w in windows)
        fastest = max(windows, key=lambda w: w["steps_per_s"])
        out.append({"steps_per_s": fastest["steps_per_s"], "mean_steps_per_s": steps / wall,
                    "steps": steps, "wall_s": wall,
                    **({"watts": fastest["watts"], "power_source": sensors.source,
                        "samples_per_j": fastest["steps_per_s"] / fastest["watts"] if fastest["watts"] > 0 else 0.0}
                       if "watts" in fastest else {})})
    return out


def measure(config, cand, seconds: float = 3.0, warmup_steps: int | None = None) -> dict:
    """measure_many for one candidate (a refused plan raises)."""
    result = measure_many(config, [cand], seconds, warmup_steps)[0]
    if "error" in result:
        raise ConfigError(f"plan {cand.label()}: {result['error']}")
    return result


def profile_runs(config, cands, seconds: float) -> list[tuple[dict, dict]]:
    """Per candidate, timed with the task timers: (per task, the smallest window mean in us; its
    least disturbed window: steps, updates, rounds, wall_s, steps_per_s, task_s)."""
    warmup = default_warmup(config)
    agents = [agent_for(config, cand, warmup, warmup + 10_000_000) for cand in cands]
    out = []
    for windows in _in_turns(agents, seconds, time_tasks=True):
        means = {task: min(w["task_us"][task] for w in windows if task in w["task_us"])
                 for task in windows[0]["task_us"]}
        out.append((means, max(windows, key=lambda w: w["steps_per_s"])))
    return out


def ring_write_us(config, envs, rounds: int = 2000) -> dict:
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


# The wire's figures (`pearl profile --wire`): each request kind timed WIRE_REPEATS times over
# WIRE_CALLS calls per size, the least disturbed repeat kept (the smallest median round trip, the
# smallest CPU per call), as the profile keeps its fastest window.
WIRE_CALLS = 200
WIRE_REPEATS = 3


def _wire_server(table: dict, max_rows: int, secret_file: str, client_public: bytes, control) -> None:
    """A replay server process for `wire_us` (a spawned child): serves on loopback, reports its
    address, then answers each byte on `control` with its CPU seconds (packed doubles: nothing on
    the pipe is unpickled) until the pipe closes: the server's thread and ZeroMQ's I/O thread
    (CURVE), as a ray run's shard process spends them."""
    import struct

    from pearl.server.config import AuthConfig, ServerConfig, TableConfig
    from pearl.server.server import ReplayServer

    server = ReplayServer(ServerConfig(table=TableConfig(**table), bind="tcp://127.0.0.1:0", max_chunk_rows=max_rows,
                                       auth=AuthConfig(server_secret=secret_file, allow=[client_public.decode()])))
    server.start()
    try:
        control.send_bytes(server.address.encode())
        while control.poll(60.0):  # the parent asks at most a few seconds apart (bounded: a lost parent)
            try:
                control.recv_bytes(16)
            except EOFError:
                break
            control.send_bytes(struct.pack("<d", time.process_time()))
    finally:
        server.stop()


def wire_us(config, kinds, rows, batches) -> dict:
    """The replay wire on this machine, through the runtime's own code: a replay server
    (pearl.server.ReplayServer, as a ray run's shard hosts it: a process of its own, CURVE keys as
    a ray run makes them, loopback) holding the config's transitions, and its clients in this
    process. Per replay kind, tables `wire|TASK|KIND|PART` by size (estimator/wire.py reads them):
    - insert, by rows: a chunk of that many rows sent and its acknowledgement awaited;
    - sample, by batch: a draw of that many rows through the learner's own client (a ray run's
      ShardedReplayClient, here of one shard; prioritized: the previous batch's priorities riding
      on it);
    PART: `rtt` the call's wall time as its caller waits (median), `client` the caller's CPU per
    call (its thread and ZeroMQ's I/O thread, which encrypts), `server` the server's CPU per
    request (validation, the table's work, packing, the socket's encryption)."""
    import multiprocessing
    import struct
    import tempfile

    from pearl.api import make_agent
    from pearl.runtime.ray_replay import server_keys
    from pearl.server.client import ClientAuth, ReplayClient
    from pearl.server.shards import ShardedReplayClient

    fields = make_agent(config).parts.transition_fields
    (action_dtype, action_shape), (obs_dtype, obs_shape) = fields["actions"], fields["obs"]
    data_rng = np.random.default_rng(0)

    def chunk(n: int) -> list:
        return [data_rng.standard_normal((n, *obs_shape)).astype(obs_dtype), np.zeros((n, *action_shape), action_dtype),
                np.ones(n, np.float32), data_rng.standard_normal((n, *obs_shape)).astype(obs_dtype),
                np.full(n, 0.99, np.float32)]

    out: dict = {}
    capacity = max(4 * max(batches), 4 * max(rows), min(config.replay.capacity, 1 << 16))
    spawn = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="pearl-wire-") as keydir:
        keys = server_keys(keydir)
        auth = ClientAuth(plaintext=False, client_keys=keys["client"], server_public=keys["server_public"])
        for kind in kinds:
            table = dict(kind=kind, capacity=capacity, obs_dim=int(obs_shape[0]),
                         action_dtype=str(np.dtype(action_dtype)), action_shape=tuple(action_shape))
            control, child_end = spawn.Pipe()
            child = spawn.Process(target=_wire_server, daemon=True,
                                  args=(table, max(rows), keys["server_secret_file"], keys["client"][0], child_end))
            child.start()
            writer = learner = None
            try:
                if not control.poll(120.0):
                    raise RuntimeError("the wire profile's replay server did not start within 120 s")
                address = control.recv_bytes(256).decode()

                def server_cpu() -> float:
                    control.send_bytes(b"?")
                    if not control.poll(30.0):
                        raise RuntimeError("the wire profile's replay server stopped answering")
                    return struct.unpack("<d", control.recv_bytes(16))[0]

                writer = ReplayClient(address, auth, writer=1, window=1, timeout=30.0)
                learner = ShardedReplayClient([address], auth, timeout=30.0)
                sample_rng = np.random.default_rng(0)
                for _ in range(capacity // max(rows) // 2):  # rows to sample from
                    writer.add(*chunk(max(rows)))
                writer.flush()
                payloads = {n: chunk(n) for n in rows}

                def insert(n):
                    writer.add(*payloads[n])
                    writer.flush()

                indices = np.arange(max(batches), dtype=np.int64)
                td = np.ones(max(batches), np.float32)

                def sample(b):
                    if kind != "uniform":
                        learner.update_priorities(indices[:b], td[:b])
                    learner.sample(b, sample_rng)

                for task, call, sizes in (("insert", insert, rows), ("sample", sample, batches)):
                    for size in sizes:
                        best = {"rtt": np.inf, "client": np.inf, "server": np.inf}
                        for _ in range(WIRE_REPEATS):
                            walls = np.empty(WIRE_CALLS)
                            cpu0, server0 = time.process_time(), server_cpu()
                            for i in range(WIRE_CALLS):
                                started = time.perf_counter()
                                call(size)
                                walls[i] = time.perf_counter() - started
                            figures = {"rtt": float(np.median(walls)),
                                       "client": (time.process_time() - cpu0) / WIRE_CALLS,
                                       "server": (server_cpu() - server0) / WIRE_CALLS}
                            best = {part: min(best[part], figures[part]) for part in best}
                        for part, seconds in best.items():
                            out.setdefault(f"wire|{task}|{kind}|{part}", {})[str(size)] = round(seconds * 1e6, 3)
            finally:
                for client in (writer, learner):
                    if client is not None:
                        client.close()
                control.close()
                child.join(10.0)
                if child.is_alive():
                    child.kill()
                    child.join(5.0)
    return out
