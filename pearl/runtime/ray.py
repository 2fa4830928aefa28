"""The ray runtime: actor nodes on a Ray cluster, the replay server and the learner on the driver.

Ray does placement, lifecycle and control; PEARL does the data path (docs/RAY.md):
- one node agent per node (pearl/runtime/node_agent.py, a Ray actor in a STRICT_SPREAD placement
  group: one bundle per node) runs the plan's `actors` actor processes there exactly as the
  processes runtime does (shared-memory rings, weight board) and streams their committed
  transitions to the replay server in chunks (pearl/server: sequence numbers, credits);
- the replay server runs in this (the learner's) process around the run's own replay table, bound
  to this node's address, CURVE-authenticated with keys made for the run (the agents receive the
  client key pair through Ray's control plane); the learner, in the same process, samples the table
  directly under the server's lock with the server's ratio bookkeeping (ReplayService.sample_here:
  no socket), the previous batch's priority update applied before each draw;
- weights go out once per sync as one object-store put (`ray.put`) that every node agent reads; a
  sync due while the previous one is still being delivered is folded into the next one.
No transition travels through a Ray call.

The replay ratio is the server's (pearl/server/service.py): it counts the env steps the agents
commit, serves a sample only while updates < floor((env_steps - learning_starts) x
updates_per_step) and grants the agents credit so that the updates trail that count by at most
`lag_bound` updates during the run; at the end the learner takes exactly the updates due. Target
updates follow the update that completes the count due at each crossing of the interval, as in
the processes runtime. A node agent that dies is restarted by Ray (`plan.ray.max_restarts`) and
its actors resume from what the server acknowledged (node_agent.py). Ctrl-C (counters.stop_requested)
stops the agents, their actor processes and rings, the server and, if this run started it, Ray.
"""
from __future__ import annotations

import math
import os
import sys
import tempfile
import time

import numpy as np

from pearl.contracts import Runtime, implements
from pearl.errors import PearlError
from pearl.io import interrupts_deferred
from pearl.runtime.counters import Counters, Hooks
from pearl.schedule import MAX_LAG, allowance, crossings, sync_due

POLL_S = 0.2  # how often the driver collects the agents' episodes and checks their runs
IDLE_S = 0.0005  # the learner's nap when nothing is due (it reads the server's count in this process)
REPORT_S = 10.0  # how often the progress line of the nodes is printed
# after Ctrl-C, how long agents get to flush their chunks (and at the end of a failed run, to
# stop) before they are killed
STOP_WAIT_S = 10.0


def lag_bound(plan, updates_per_step: float, n_step: int) -> int:
    """Updates the learner may trail the count due during a ray run: the processes runtime's bound,
    plus room for each node agent to hold the credit of one chunk (at most `chunk` rows, each with
    the env steps it commits; n-step heads add up to n_step x envs per actor)."""
    per_chunk = plan.ray.chunk + n_step * plan.envs_per_actor * plan.actors
    return MAX_LAG["processes"] + plan.ray.nodes * math.ceil(updates_per_step * per_chunk)


def connect(address: str) -> bool:
    """Joins Ray (`address`: "auto" or HOST:PORT), or starts a local instance on 127.0.0.1 ("");
    an already initialised Ray is used as it is. Returns whether this call started it."""
    import ray

    if ray.is_initialized():
        return False
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if address:
        ray.init(address=address, log_to_driver=True, configure_logging=False)
    else:
        # "local": a new instance even where another cluster on this machine could be joined
        ray.init(address="local", _node_ip_address="127.0.0.1", include_dashboard=False, num_cpus=os.cpu_count(),
                 object_store_memory=200 * 2**20, log_to_driver=True, configure_logging=False)
    return True


def _keys(directory: str) -> dict:
    """A CURVE key pair for the server (its secret in a private file) and one for the run's clients."""
    import zmq

    server_public, server_secret = zmq.curve_keypair()
    path = os.path.join(directory, "server.key_secret")
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as out:  # zmq's certificate format (zmq.auth.load_certificate)
        out.write(f'metadata\ncurve\n    public-key = "{server_public.decode()}"\n'
                  f'    secret-key = "{server_secret.decode()}"\n')
    return {"server_secret_file": path, "server_public": server_public, "client": zmq.curve_keypair()}


@implements(Runtime)
class RayRuntime:
    name = "ray"
    # the replay server keeps the bound: MAX_LAG['processes'] plus one chunk's credit per node (lag_bound)
    max_lag = MAX_LAG["processes"]

    def run(self, parts, counters: Counters, steps: int, hooks: Hooks) -> None:
        """Advances `counters` by about `steps` env steps on the plan's nodes (module doc)."""
        try:
            import ray  # noqa: F401
        except ImportError:
            raise PearlError("runtime: ray needs Ray: pip install 'pearl-rl[ray]'") from None
        started = connect(parts.plan.ray.address)
        try:
            _run(parts, counters, steps, hooks)
        finally:
            if started:
                import ray

                ray.shutdown()


RUNTIME = RayRuntime()


def _run(parts, counters: Counters, steps: int, hooks: Hooks) -> None:
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from pearl.runtime.node_agent import NodeAgent
    from pearl.server.config import AuthConfig, RatioConfig, ServerConfig, TableConfig
    from pearl.server.server import ReplayServer

    plan, learner, schedule, replay = parts.plan, parts.learner, parts.schedule, parts.replay
    nodes, n, envs = plan.ray.nodes, plan.actors, plan.envs_per_actor
    per_node = math.ceil(steps / (nodes * n * envs)) * envs * n  # env steps per node
    u = schedule.updates_per_step
    start = counters.env_steps
    fields = parts.transition_fields
    _, obs_shape = fields["obs"]
    action_dtype, action_shape = fields["actions"]
    table = TableConfig(kind=parts.config.replay.kind, capacity=replay.capacity, obs_dim=int(obs_shape[0]),
                        action_dtype=str(action_dtype), action_shape=tuple(action_shape))
    keydir = tempfile.TemporaryDirectory(prefix="pearl-ray-keys-")
    keys = _keys(keydir.name)
    host = ray.util.get_node_ip_address()
    ratio = RatioConfig(updates_per_step=u, learning_starts=schedule.learning_starts,
                        max_lag=lag_bound(plan, u, parts.n_step))
    server = ReplayServer(ServerConfig(table=table, bind=f"tcp://{host}:0", ratio=ratio, max_chunk_rows=plan.ray.chunk,
                                       auth=AuthConfig(server_secret=keys["server_secret_file"],
                                                       allow=[keys["client"][0].decode()])), table=replay)
    # the server's table is the run's own (the agent's checkpoint holds it); its counts go on from the run's
    server.service.env_steps, server.service.updates = counters.env_steps, counters.updates
    limiter, replay.rate_limiter = replay.rate_limiter, None  # the server's credits keep the band
    agents, runs, restarts, finished, group = [], {}, 0, {}, None
    rates = _Rates(plan.ray.nodes)
    try:
        server.start()
    except BaseException:
        replay.rate_limiter = limiter
        keydir.cleanup()
        raise
    agent_keys = {"client": keys["client"], "server_public": keys["server_public"]}
    service, pending = server.service, None  # pending: the last batch's (indices, |td|), not applied yet
    weights = learner.policy_weights()
    spec = {"recipe": parts.actor_recipe, "seed": parts.seed, "fields": fields, "n_step": parts.n_step,
            "actors": n, "envs": envs, "env": parts.config.env, "n_weights": int(weights.size)}
    ahead = allowance(u, nodes * n, envs)
    counters.ray_agents = agents  # while the run lasts: the node agents' handles (tests kill one)
    try:
        alive = [node for node in ray.nodes() if node["Alive"]]
        group = placement_group([{"CPU": 1}] * nodes, strategy="STRICT_SPREAD" if len(alive) >= nodes else "SPREAD")
        if not group.wait(timeout_seconds=120):
            raise PearlError(f"plan.ray.nodes: {nodes} nodes with 1 free CPU each were not available within 120 s "
                             f"(the cluster has {len(alive)} alive nodes)")
        remote = ray.remote(NodeAgent)
        for node in range(nodes):
            strategy = PlacementGroupSchedulingStrategy(placement_group=group, placement_group_bundle_index=node)
            agents.append(remote.options(num_cpus=1, max_restarts=plan.ray.max_restarts, max_concurrency=4,
                                         scheduling_strategy=strategy).remote(
                node, spec, server.address, agent_keys, per_node, ahead, plan.ray.chunk, plan.ray.window, start))
        published = _Publisher(agents)
        published.send(weights, parts.algo.epsilon(counters.env_steps))
        runs = {agents[node].run.remote(): node for node in range(nodes)}
        targets: list[int] = []  # env steps crossed whose target updates are owed
        known = start  # the server's env steps as last heard
        clock = time.perf_counter
        last_poll = last_report = clock()
        stop_by = None  # once stopping (Ctrl-C): when agents still running are given up and killed
        while True:
            if counters.stop_requested and stop_by is None:
                # the agents stop taking from their rings and flush what they sent; the learner goes
                # on taking what is due, so the run ends with the exact count over what they committed
                for agent in agents:
                    agent.stop.remote()
                stop_by = clock() + STOP_WAIT_S
            # learn what is due over the env steps the server has counted
            while counters.updates < schedule.due(known):
                t0 = clock()
                with server.lock:  # the server thread handles the agents' inserts between our samples
                    batch = service.sample_here(schedule.batch_size, pending)
                pending = None
                if service.outbox:  # credit the agents waited for: the server thread sends it
                    server.wake()
                t1 = clock()
                loss, abs_td = learner.update(batch)
                if replay.prioritized:  # applied before the next draw, as a piggybacked update
                    pending = (batch.indices.copy(), np.abs(abs_td, dtype=np.float32))
                if hooks.timer:
                    hooks.timer.add("sample", t1 - t0)
                    hooks.timer.add("learn", clock() - t1)
                counters.updates += 1
                counters.record_loss(loss)
                while targets and counters.updates >= schedule.due(targets[0]):
                    learner.update_target()
                    targets.pop(0)
                if sync_due(counters.updates, schedule.sync_interval):
                    published.due = True
                if published.due:
                    published.send(learner.policy_weights(), parts.algo.epsilon(counters.env_steps))
                previous, known = known, service.env_steps
                targets += crossings(previous, known, schedule.target_interval)
                _advance(counters, known, hooks)
            if clock() - last_poll > POLL_S or len(finished) == nodes:
                last_poll = clock()
                _collect(agents, counters, rates)
                done, _ = ray.wait(list(runs), num_returns=len(runs), timeout=0)
                for ref in done:
                    node = runs.pop(ref)
                    try:
                        finished[node] = ray.get(ref)
                        counters.record_episodes(finished[node]["episodes"])
                    except ray.exceptions.RayActorError as error:
                        if stop_by is not None:  # stopping anyway: its acknowledged chunks are in
                            finished[node] = {}
                            continue
                        restarts += 1
                        if restarts > plan.ray.max_restarts * nodes:
                            raise PearlError(f"node agent {node} died and its restarts were used up: "
                                             f"{str(error).splitlines()[0]}") from None
                        print(f"pearl: node agent {node} died; Ray restarts it and its actors resume "
                              f"(restart {restarts})", file=sys.stderr, flush=True)
                        published.sent[node] = None  # the restarted agent needs the weights again
                        published.due = True
                        runs[agents[node].run.remote()] = node
                if published.due:
                    published.send(learner.policy_weights(), parts.algo.epsilon(counters.env_steps))
            if clock() - last_report > REPORT_S:
                last_report = clock()
                print(rates.line(), file=sys.stderr, flush=True)
            previous, known = known, service.env_steps
            targets += crossings(previous, known, schedule.target_interval)
            _advance(counters, known, hooks)
            if len(finished) == nodes and counters.updates >= schedule.due(known):
                break
            if stop_by is not None and clock() > stop_by and counters.updates >= schedule.due(known):
                break  # an agent that did not finish in time is killed below; its unacknowledged chunks are lost
            if known == previous and counters.updates >= schedule.due(known):
                time.sleep(IDLE_S)
    finally:
        with interrupts_deferred():
            counters.ray_agents = None
            for agent in agents:
                agent.stop.remote()  # the agent stops its actor processes and unlinks their rings
            if runs:
                ray.wait(list(runs), num_returns=len(runs), timeout=STOP_WAIT_S if stop_by is None else 1)
            for agent in agents:
                try:
                    ray.get(agent.close.remote(), timeout=5)
                except Exception:  # a dead or stuck agent: killing it ends its actors (they see their parent go)
                    pass
                ray.kill(agent, no_restart=True)
            if group is not None:
                remove_placement_group(group)
            if pending is not None:
                with server.lock:
                    service.update_priorities_here(*pending)
            server.stop()
            replay.rate_limiter = limiter
            keydir.cleanup()
    counters.actor_restarts = restarts + sum(r.get("actor_restarts", 0) for r in finished.values())
    counters.node_rates = rates.summary()
    parts.policy.load(learner.policy_weights())


def _collect(agents, counters: Counters, rates) -> None:
    """The agents' finished episodes and rates (a dead agent's are lost with it)."""
    import ray

    refs = [agent.report.remote() for agent in agents]
    for ref in refs:
        try:
            report = ray.get(ref, timeout=30)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            continue
        counters.record_episodes(report["episodes"])
        rates.add(report)


def _advance(counters: Counters, env_steps: int, hooks: Hooks) -> None:
    if env_steps > counters.env_steps:
        counters.env_steps = env_steps
        if hooks.on_round is not None:
            hooks.on_round()


class _Publisher:
    """Weights to every node agent: one `ray.put` per sync, the same reference to each agent. A
    sync due while an agent has not taken the previous one yet is folded into the next (`due`)."""

    def __init__(self, agents):
        self.agents, self.sent, self.due = agents, [None] * len(agents), False

    def send(self, weights, epsilon: float) -> None:
        import ray

        busy = [ref for ref in self.sent if ref is not None]
        if busy and len(ray.wait(busy, num_returns=len(busy), timeout=0)[0]) < len(busy):
            self.due = True
            return
        ref = ray.put(weights)
        self.sent = [agent.publish.remote(ref, float(epsilon)) for agent in self.agents]
        self.due = False


class _Rates:
    """Per-node env steps/s and the actors' act time, from the agents' reports."""

    def __init__(self, nodes: int):
        self.last = [None] * nodes

    def add(self, report: dict) -> None:
        self.last[report["node"]] = report

    def summary(self) -> list[dict]:
        return [{"node": r["node"], "env_steps": r["committed"], "steps_per_s": r["committed"] / max(r["wall_s"], 1e-9),
                 "act_us_per_round": 1e6 * r["act_s"] / max(r["rounds"], 1)} for r in self.last if r is not None]

    def line(self) -> str:
        return "ray nodes: " + ", ".join(f"node {s['node']} {s['steps_per_s']:,.0f} steps/s "
                                         f"(act {s['act_us_per_round']:.0f} us/round)" for s in self.summary())
