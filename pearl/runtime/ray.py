"""The ray runtime: actor nodes on a Ray cluster, the replay server(s) placed by the plan, the learner on the driver.

Ray does placement, lifecycle and control; PEARL does the data path (docs/RAY.md):
- one node agent per node (pearl/runtime/node_agent.py, a Ray actor in a STRICT_SPREAD placement
  group: one bundle per node) runs the plan's `actors` actor processes there exactly as the
  processes runtime does (shared-memory rings, weight board) and streams their committed
  transitions to the replay server(s) in chunks (pearl/server: sequence numbers, credits);
- `plan.ray.replay: learner` (_InProcess): the replay server runs in this (the learner's) process
  around the run's own replay table, bound to this node's address, CURVE-authenticated with keys
  made for the run (the agents receive the client key pair through Ray's control plane); the
  learner samples the table directly under the server's lock with the server's ratio bookkeeping
  (ReplayService.sample_here: no socket), the previous batch's priority update applied before each draw;
- `server` / `node` (_Remote): `shards` replay servers in Ray actors of their own
  (pearl/runtime/ray_replay.py) on this node or on nodes of their own (bundles of the placement
  group); the agents write to them round-robin (a frame table's step records: each to its
  stream's shard), the learner samples them through the sharded
  client (exact prioritized sampling across shards), and the run's table is gathered back from
  them for each checkpoint and at the end;
- weights go out at most every PUBLISH_S, inside the publish call (as bytes) when small, else as one
  object-store put (`ray.put`) that every node agent reads; a sync due sooner, or while the
  previous one is still being delivered, is folded into the next one.
No transition travels through a Ray call (a checkpoint's pull of remote shards aside).
While the node agents start (a Ray worker each, then their actor processes), with `learner` and
`plan.act_while_actors_start` the driver steps the learner's own actor into the table as the
processes runtime does, until an agent's env steps arrive (docs/RAY.md "Start-up").

The replay ratio: with `learner` the server keeps it (pearl/server/service.py): it counts the env
steps the agents commit, serves a sample only while updates < floor((env_steps - learning_starts)
x updates_per_step) and grants the agents credit so that the updates trail that count by at most
`credit_lag` updates. Remote servers keep none (each shard sees only its share): the driver grants
each node agent the env steps it may commit (`NodeAgent.allow`) from the same bound. Either way the
updates trail the count due by at most `lag_bound` during the run and at the end the learner takes
exactly the updates due. Target updates follow the update that completes the count due at each
crossing of the interval, as in the processes runtime. A node agent that dies is restarted by Ray
(`plan.ray.max_restarts`) and its actors resume from what the server(s) acknowledged
(node_agent.py). Ctrl-C (counters.stop_requested) stops the agents, their actor processes and
rings, the servers and, if this run started it, Ray.
"""
from __future__ import annotations

import contextlib
import itertools
import math
import os
import sys
import tempfile
import threading
import time

import numpy as np

from pearl.contracts import Runtime, implements
from pearl.errors import PearlError
from pearl.io import interrupts_deferred
from pearl.runtime.counters import Counters, Hooks
from pearl.schedule import (INLINE_WEIGHTS_BYTES, MAX_LAG, PUBLISH_S, SAMPLES_AHEAD, agent_allowance, allowance,
                            chunk_steps, credit_lag, crossings, grant_step, sync_due)

POLL_S = 0.2  # how often the driver collects the agents' episodes and checks their runs
ENDING_POLL_S = 0.005  # the same once the run's steps are in and the agents are stopping
LEARN_S = 0.005  # the longest the driver learns before its loop checks the end, a stop, the poll
# a node commits at most this many times its even share of a run's env steps: nodes that Ray
# started late (a fresh worker process on a node: ~1-2 s) or that run slower leave the others
# less of a tail, and every node still takes part
NODE_SHARE_MAX = 1.5
IDLE_S = 0.0005  # the learner's nap when nothing is due (it reads the server's count in this process)
REFRESH_S = 0.002  # how often the driver asks remote replay servers their count when it has nothing to learn
REPORT_S = 10.0  # how often the progress line of the nodes is printed
# after Ctrl-C, how long agents get to flush their chunks (and at the end of a failed run, to
# stop) before they are killed
STOP_WAIT_S = 10.0
READ_WAIT_S = 600.0  # the longest the end of a run waits for a checkpoint reading its shards' frames


def lag_bound(plan, updates_per_step: float, n_step: int) -> int:
    """Updates the learner may trail the count due during a ray run. With the replay off the
    learner's process the driver grants the credit (`_Remote.grant`) and an agent may take one
    actor's allowance (and n-step heads) past its grant before it stops taking."""
    bound = credit_lag(plan, updates_per_step, n_step)
    if plan.ray.replay != "learner":
        ahead = allowance(updates_per_step, plan.ray.nodes * plan.actors, plan.envs_per_actor)
        over = ahead + n_step * plan.envs_per_actor * plan.actors + 1
        bound += math.ceil(updates_per_step * plan.ray.nodes * over) + 1
    return bound


def loopback_ray():
    """Ray, for an instance on this machine only: Ray takes a node's address from the host's
    network (the interface its route out uses) unless RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER is off, and
    an `_node_ip_address` of 127.0.0.1 does not keep its GCS, raylet and workers off that interface
    (measured on a host whose name resolves to 192.0.2.2; `pearl profile --ray`'s cluster did not
    even start there). Off by default (a user's explicit setting stands): in the environment for
    Ray's processes, and in Ray's constant that this process read at its import."""
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray
    from ray._private import ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = ray_constants.env_bool(ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR, True)
    return ray


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
        ray = loopback_ray()
        # "local": a new instance even where another cluster on this machine could be joined
        ray.init(address="local", _node_ip_address="127.0.0.1", include_dashboard=False, num_cpus=os.cpu_count(),
                 object_store_memory=200 * 2**20, log_to_driver=True, configure_logging=False)
    return True


def ceiling(schedule, allowed: int, start: int) -> int:
    """The most env steps (>= start) whose updates due are at most `allowed` (the schedule's own
    count, bursts included; it never falls as env steps grow)."""
    lo, hi = start, start + 1
    while schedule.due(hi) <= allowed:
        lo, hi = hi, hi + 2 * (hi - lo)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if schedule.due(mid) <= allowed else (lo, mid)
    return lo


@implements(Runtime)
class RayRuntime:
    name = "ray"
    # the replay server keeps the bound: MAX_LAG['processes'] plus one chunk's credit per node (lag_bound)
    max_lag = MAX_LAG["processes"]

    def run(self, parts, counters: Counters, steps: int, hooks: Hooks) -> None:
        """Advances `counters` by about `steps` env steps on the plan's nodes (module doc)."""
        try:
            import ray
        except ImportError:
            raise PearlError("runtime: ray needs Ray: pip install 'pearl-rl[ray]'") from None
        started = connect(parts.plan.ray.address)
        try:
            _run(parts, counters, steps, hooks)
        finally:
            if started:
                ray.shutdown()


RUNTIME = RayRuntime()


def _run(parts, counters: Counters, steps: int, hooks: Hooks) -> None:
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from pearl.runtime.node_agent import NodeAgent
    from pearl.runtime.ray_replay import server_keys

    plan, learner, schedule = parts.plan, parts.learner, parts.schedule
    nodes, n, envs = plan.ray.nodes, plan.actors, plan.envs_per_actor
    # env steps a node may commit: up to NODE_SHARE_MAX x its even share; the run ends once the
    # nodes together committed `steps` (a node Ray started late does less, and leaves no tail)
    per_node = math.ceil(NODE_SHARE_MAX * steps / (nodes * n * envs)) * envs * n
    u = schedule.updates_per_step
    start = counters.env_steps
    remote_replay = plan.ray.replay != "learner"
    keydir = tempfile.TemporaryDirectory(prefix="pearl-ray-keys-")
    keys = server_keys(keydir.name)
    agents, runs, restarts, finished, group, side, published = [], {}, 0, {}, None, None, None
    rates = _Rates(plan.ray.nodes)
    weights = learner.policy_weights()
    spec = {"recipe": parts.actor_recipe, "seed": parts.seed, "fields": parts.transition_fields, "n_step": parts.n_step,
            "actors": n, "envs": envs, "env": parts.config.env, "n_weights": int(weights.size)}
    ahead = agent_allowance(plan, u)
    counters.ray_agents = agents  # while the run lasts: the node agents' handles (tests kill one)
    stop_by = None  # once stopping (Ctrl-C): when agents still running are given up and killed
    ending = False  # the nodes together committed `steps`: the agents were told to stop
    try:
        alive = [node for node in ray.nodes() if node["Alive"]]
        bundles = nodes + (plan.ray.shards if plan.ray.replay == "node" else 0)
        group = placement_group([{"CPU": 1}] * bundles, strategy="STRICT_SPREAD" if len(alive) >= bundles else "SPREAD")
        # the agents first: Ray creates them (~1-1.5 s beside a learning driver here) while the group
        # is placed and the replay server starts (its kernels' first load: ~0.45 s); `run` brings
        # them the server's address
        agent_keys = {"client": keys["client"], "server_public": keys["server_public"]}
        remote = ray.remote(NodeAgent)
        for node in range(nodes):
            strategy = PlacementGroupSchedulingStrategy(placement_group=group, placement_group_bundle_index=node)
            agents.append(remote.options(num_cpus=1, max_restarts=plan.ray.max_restarts, max_concurrency=4,
                                         scheduling_strategy=strategy).remote(
                node, spec, agent_keys, per_node, ahead, plan.ray.chunk, plan.ray.window, start, remote_replay))
        if not group.wait(timeout_seconds=120):
            for agent in agents:  # never placed: nothing of theirs to stop (a close call would wait)
                ray.kill(agent, no_restart=True)
            agents.clear()
            raise PearlError(f"plan.ray.nodes: {bundles} nodes with 1 free CPU each were not available within 120 s "
                             f"(the cluster has {len(alive)} alive nodes)")
        if remote_replay:
            side = _Remote(parts, counters, keys, group, nodes)
        else:
            side = _InProcess(parts, counters, keys)
        side.grant(agents, counters.updates)
        published = _Publisher(agents)
        published.send(learner.policy_weights, parts.algo.epsilon(counters.env_steps))
        runs = {agents[node].run.remote(side.addresses): node for node in range(nodes)}
        # the learner's own actor steps while the node agents start (a Ray worker, then their actor
        # processes: ~2-4 s here), as the processes runtime's does, until an agent's steps arrive
        # (not into a frame table: the learner's actor would write node 0's first actor's streams
        # while that actor, already up, writes them too; the processes runtime holds its rounds back)
        local = (parts.actor if plan.act_while_actors_start and not remote_replay
                 and not parts.config.replay.frame_stack else None)
        loop = _Learning(parts, counters, hooks, side, published, local)
        counters.learner_env_steps = 0
        reports = _Reports(agents, rates)
        clock = time.perf_counter
        last_poll = last_report = clock()
        while True:
            if counters.stop_requested and stop_by is None:
                # the agents stop taking from their rings and flush what they sent; the learner goes
                # on taking what is due, so the run ends with the exact count over what they committed
                for agent in agents:
                    agent.stop.remote()
                stop_by = clock() + STOP_WAIT_S
            if not ending and counters.env_steps - start >= steps:
                # the run's steps are in: the agents stop taking and flush what they sent (what they
                # took and did not send is dropped with its env steps, as the processes runtime
                # drops what its actors commit after its last take)
                ending = True
                for agent in agents:
                    agent.stop.remote()
            if loop.local is not None:
                if ending or stop_by is not None or side.env_steps() > start + loop.local_steps:
                    loop.local = None  # an agent's steps are in (or the run is over): the agents take over
                else:
                    loop.act_here()
            loop.learn_due(clock() + LEARN_S)
            if clock() - last_poll > (ENDING_POLL_S if ending else POLL_S) or len(finished) == nodes:
                last_poll = clock()
                reports.collect(counters)
                if ending and stop_by is None and loop.local_steps:
                    # an agent still booting when the run's steps are in (the learner's own actor
                    # took them): it has not even connected to the server, so it holds nothing to
                    # flush; killed now rather than waited for (its Ray worker: seconds under load).
                    # (Only the learner's own actor leaves an agent no steps: with `learner` replay.)
                    for ref, node in list(runs.items()):
                        if not side.connected(node):
                            runs.pop(ref)
                            ray.kill(agents[node], no_restart=True)
                            finished[node] = {}
                done, _ = ray.wait(list(runs), num_returns=len(runs), timeout=0)
                for ref in done:
                    node = runs.pop(ref)
                    try:
                        finished[node] = ray.get(ref)
                        counters.record_episodes(finished[node]["episodes"])
                        rates.add(finished[node])  # its final report
                    except ray.exceptions.RayActorError as error:
                        if stop_by is not None or ending:  # stopping anyway: its acknowledged chunks are in
                            finished[node] = {}
                            continue
                        restarts += 1
                        if restarts > plan.ray.max_restarts * nodes:
                            raise PearlError(f"node agent {node} died and its restarts were used up: "
                                             f"{str(error).splitlines()[0]}") from None
                        print(f"pearl: node agent {node} died; Ray restarts it and its actors resume "
                              f"(restart {restarts})", file=sys.stderr, flush=True)
                        published.forget(node)  # the restarted agent needs the weights again
                        side.regrant(node)
                        runs[agents[node].run.remote(side.addresses)] = node
                side.grant(agents, counters.updates)
                if published.due:
                    published.send(learner.policy_weights, parts.algo.epsilon(counters.env_steps))
            if clock() - last_report > REPORT_S:
                last_report = clock()
                print(rates.line(), file=sys.stderr, flush=True)
            moved = loop.advance(REFRESH_S)
            if len(finished) == nodes and counters.updates >= schedule.due(counters.env_steps):
                break
            if stop_by is not None and clock() > stop_by and counters.updates >= schedule.due(counters.env_steps):
                break  # an agent that did not finish in time is killed below; its unacknowledged chunks are lost
            if not moved and loop.local is None and counters.updates >= schedule.due(counters.env_steps):
                time.sleep(IDLE_S)
        published.close()  # (its thread calls the agents)
        _stop_agents(agents, runs, STOP_WAIT_S if stop_by is None else 1)
        # what reached the replay before the agents were gone: its updates too, so the count is exact
        loop.advance(0.0)
        loop.learn_due()
        side.finish(counters)
    finally:
        with interrupts_deferred():
            counters.ray_agents = None
            if published is not None:
                published.close()
            _stop_agents(agents, runs, 1)
            if side is not None:
                side.close()
            if group is not None:
                remove_placement_group(group)
            keydir.cleanup()
    counters.actor_restarts = restarts + sum(r.get("actor_restarts", 0) for r in finished.values())
    counters.node_rates = rates.summary()
    parts.policy.load(learner.policy_weights())


def _stop_agents(agents, runs, wait_s: float) -> None:
    """Stops every node agent (its actor processes, their rings) and kills it; `runs` empties."""
    import ray

    for agent in agents:
        agent.stop.remote()
    if runs:
        ray.wait(list(runs), num_returns=len(runs), timeout=wait_s)
        runs.clear()
    for agent in agents:
        try:
            ray.get(agent.close.remote(), timeout=5)
        except Exception:  # a dead or stuck agent: killing it ends its actors (they see their parent go)
            pass
        ray.kill(agent, no_restart=True)
    agents.clear()


class _Learning:
    """The learner's side of the loop: the updates due over the env steps the replay has counted,
    target updates after the update completing the count due at each crossing of the interval,
    weights published every sync_interval updates."""

    def __init__(self, parts, counters, hooks, side, published, local=None):
        self.parts, self.counters, self.hooks, self.side, self.published = parts, counters, hooks, side, published
        self.local, self.local_steps = local, 0  # the learner's own actor while the agents start; its env steps
        self.targets: list[int] = []  # env steps crossed whose target updates are owed
        self.seen = counters.env_steps  # env steps whose crossings are in `targets`

    def advance(self, age: float | None = None) -> bool:
        """Takes in the env steps the replay has counted (asked of remote servers if their count is
        over `age` s old; the round's hook sees the table as they left it); whether they moved."""
        counters, side = self.counters, self.side
        moved = side.env_steps(age) > counters.env_steps
        if moved:  # (the check outside `consistent`: it runs after every update and mostly finds nothing)
            with side.consistent():
                counters.env_steps = side.env_steps()
                if self.hooks.on_round is not None:
                    self.hooks.on_round()  # may checkpoint: _Remote's view raises env_steps to what it holds
        if counters.env_steps > self.seen:
            self.targets += crossings(self.seen, counters.env_steps, self.parts.schedule.target_interval)
            self.seen = counters.env_steps
        return moved

    def act_here(self) -> None:
        """One round of the learner's own actor into the table (`_InProcess.act_here`), then counted."""
        parts, counters = self.parts, self.counters
        envs = parts.plan.envs_per_actor
        finished = self.side.act_here(self.local, parts.algo.epsilon(counters.env_steps), envs)
        if finished is not None:
            self.local_steps += envs
            counters.learner_env_steps = self.local_steps  # (the rounds' hooks see it)
            counters.record_episodes(finished)
            self.advance()

    def learn_due(self, deadline: float = math.inf) -> None:
        """The updates due, until `deadline` (perf_counter): while the learner is the bottleneck
        more are due after every update, and the driver's loop must get round to its checks."""
        parts, counters, side, timer = self.parts, self.counters, self.side, self.hooks.timer
        schedule, learner, clock = parts.schedule, parts.learner, time.perf_counter
        while counters.updates < schedule.due(counters.env_steps) and clock() < deadline:
            t0 = clock()
            batch = side.sample(schedule.batch_size)
            side.prefetch(schedule.batch_size, schedule.due(counters.env_steps) - counters.updates - 1)
            t1 = clock()
            loss, abs_td = learner.update(batch)
            if parts.replay.prioritized:  # applied before the next draw, as a piggybacked update
                side.update_priorities(batch.indices, abs_td)
            if timer:
                timer.add("sample", t1 - t0)
                timer.add("learn", clock() - t1)
            counters.updates += 1
            counters.record_loss(loss)
            while self.targets and counters.updates >= schedule.due(self.targets[0]):
                learner.update_target()
                self.targets.pop(0)
            if sync_due(counters.updates, schedule.sync_interval):
                self.published.due = True
                if self.local is not None:
                    self.local.policy.load(learner.policy_weights())
            if self.published.due:
                self.published.send(learner.policy_weights, parts.algo.epsilon(counters.env_steps))
            side.grant(self.published.agents, counters.updates)
            self.advance()


def table_schema(parts) -> dict:
    """A replay server table's schema keys for the run's transition fields: observations of any
    shape, float32 or uint8, as the run's own table stores them (a frame table: one frame each)."""
    fields = parts.transition_fields
    (obs_dtype, obs_shape), (action_dtype, action_shape) = fields["obs"], fields["actions"]
    schema = dict(obs_shape=tuple(obs_shape), obs_dtype=str(obs_dtype), action_dtype=str(action_dtype),
                  action_shape=tuple(action_shape), frame_stack=parts.config.replay.frame_stack)
    if schema["frame_stack"]:
        replay = parts.replay
        schema.update(streams=replay.streams, n_step=replay.n_step, gamma=replay.gamma)
    return schema


class _InProcess:
    """`replay: learner`: the replay server runs in this process around the run's own table and
    keeps the ratio with its credits; the learner samples it under the server's lock."""

    def __init__(self, parts, counters, keys):
        import ray

        from pearl.server.config import AuthConfig, RatioConfig, ServerConfig, TableConfig
        from pearl.server.server import ReplayServer

        plan, schedule, replay = parts.plan, parts.schedule, parts.replay
        u = schedule.updates_per_step
        table = TableConfig(kind=parts.config.replay.kind, capacity=replay.capacity,
                            **table_schema(parts))
        ratio = RatioConfig(updates_per_step=u, learning_starts=schedule.learning_starts,
                            max_lag=credit_lag(plan, u, parts.n_step))
        host = ray.util.get_node_ip_address()
        self.server = ReplayServer(ServerConfig(table=table, bind=f"tcp://{host}:0", ratio=ratio,
                                                max_chunk_rows=plan.ray.chunk,
                                                auth=AuthConfig(server_secret=keys["server_secret_file"],
                                                                allow=[keys["client"][0].decode()])), table=replay)
        # the server's table is the run's own (the agent's checkpoint holds it); its counts go on from the run's
        self.service = self.server.service
        self.service.env_steps, self.service.updates = counters.env_steps, counters.updates
        self.replay = replay
        self.limiter, replay.rate_limiter = replay.rate_limiter, None  # the server's credits keep the band
        self.pending = None  # the last batch's (indices, |td|), applied before the next draw
        self.reserve = plan.ray.nodes * chunk_steps(plan, parts.n_step)  # the agents' credit (act_here)
        try:
            self.server.start()
        except BaseException:
            replay.rate_limiter = self.limiter
            raise
        self.addresses = [self.server.address]

    def env_steps(self, age: float | None = None) -> int:
        return self.service.env_steps

    @contextlib.contextmanager
    def consistent(self):
        """No insert between reading the count and the round's hook; a checkpoint in the hook sees
        the table as the run's (its rate limiter too, whose state it holds)."""
        with self.server.lock:
            self.replay.rate_limiter = self.limiter
            try:
                yield
            finally:
                self.replay.rate_limiter = None

    def sample(self, batch_size: int):
        with self.server.lock:  # the server thread handles the agents' inserts between our samples
            batch = self.service.sample_here(batch_size, self.pending)
        self.pending = None
        if self.service.outbox:  # credit the agents waited for: the server thread sends it
            self.server.wake()
        return batch

    def update_priorities(self, indices, abs_td) -> None:
        self.pending = (indices.copy(), np.abs(abs_td, dtype=np.float32))

    def prefetch(self, batch_size: int, due: int) -> None:
        """A sample here costs ~40 us under the server's lock: nothing to overlap."""

    def act_here(self, actor, epsilon: float, envs: int):
        """One round of the learner's own actor stored and counted as a writer's chunk would be, if
        the ratio leaves room for its env steps beside the credit the agents hold and a chunk's
        credit for each of them (so the lag stays within the server's bound and an agent that comes
        up is granted credit at once); its finished episodes, or None if it did not act. Under the
        server's lock: no insert or grant between the check and the count."""
        service = self.service
        with self.server.lock:
            room = service.ceiling() - service.env_steps - sum(service.credit.values()) - self.reserve
            if service.snapshot is not None or room < envs:
                return None
            transitions, finished = actor.step(epsilon)
            if transitions is not None:
                self.replay.add(*transitions)
            service.env_steps += envs
            self.replay.progress = service.env_steps
        return finished

    def connected(self, node: int) -> bool:
        """Whether node agent `node`'s writer has reached the server (its client connects in the
        agent's __init__, before it starts any actor process)."""
        return node + 1 in self.service.acked

    def grant(self, agents, updates: int) -> None:
        """The server grants credit itself."""

    def regrant(self, node: int) -> None:
        """A restarted agent asks the server for credit itself."""

    def finish(self, counters) -> None:
        if self.pending is not None:
            with self.server.lock:
                self.service.update_priorities_here(*self.pending)
            self.pending = None

    def close(self) -> None:
        self.server.stop()
        self.replay.rate_limiter = self.limiter


class _Remote:
    """`replay: server | node`: `shards` replay servers in Ray actors of their own
    (pearl/runtime/ray_replay.py), sampled through the sharded client. They keep no ratio: the
    driver grants each node agent the env steps it may commit, so that the updates due over them
    stay within `credit_lag` of the updates taken (plus what an agent takes past its grant)."""

    def __init__(self, parts, counters, keys, group, nodes: int):
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

        from pearl.runtime.ray_replay import FrameShards, ReplayShard, shard_capacities, split_states, step_shares
        from pearl.server.client import ClientAuth
        from pearl.server.config import TableConfig
        from pearl.server.shards import ShardedReplayClient

        plan, schedule, replay, config = parts.plan, parts.schedule, parts.replay, parts.config
        self.parts, self.counters, self.replay, self.nodes = parts, counters, replay, nodes
        self.start = counters.env_steps
        shards = plan.ray.shards
        schema = table_schema(parts)
        r = config.replay
        # a frame table's shards hold whole env streams (their writers route each row by its stream)
        self.frames = FrameShards(replay.streams, replay.length, shards) if r.frame_stack else None
        self.capacities = self.frames.capacities if self.frames else shard_capacities(replay.capacity, shards)
        remote = ray.remote(ReplayShard)
        self.shards, self.client = [], None
        try:
            here = ray.get_runtime_context().get_node_id()
            for k, capacity in enumerate(self.capacities):
                if self.frames:
                    schema.update(streams=len(self.frames.held[k]))
                table = TableConfig(kind=r.kind, capacity=capacity, **schema, alpha=r.alpha,
                                    beta=r.beta, beta_final=r.beta_final, beta_steps=max(1, config.total_steps),
                                    priority_eps=r.priority_eps, fanout=r.fanout, backend=r.backend)
                if plan.ray.replay == "node":  # a bundle of its own, after the agents'
                    options = dict(num_cpus=1, scheduling_strategy=PlacementGroupSchedulingStrategy(
                        placement_group=group, placement_group_bundle_index=nodes + k))
                else:  # on the learner's node, beside it (its CPU is the learner node's)
                    options = dict(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False))
                self.shards.append(remote.options(max_restarts=0, **options).remote(
                    table, plan.ray.chunk, keys["server"], keys["client"][0]))
            addresses = ray.get([shard.address.remote() for shard in self.shards], timeout=120)
            # the run's table (if a run goes on) and env steps dealt out to the shards: an empty table's
            # state is not sent (a frame table's arrays are whole: 0.7 GB for Atari's 100k frames)
            fresh = not counters.env_steps and not len(replay)
            # a frame table's state but its frames, which follow a bounded call at a time
            state, frames = replay.snapshot() if self.frames and not fresh else (None, None)
            try:
                if fresh:
                    parts_of = [(None, steps) for steps in step_shares(counters.env_steps, shards)]
                elif self.frames:
                    parts_of = self.frames.split(state, counters.env_steps)
                else:
                    parts_of = split_states(replay.state_dict(), replay.capacity, self.capacities, counters.env_steps)
                ray.get([shard.load.remote(*part) for shard, part in zip(self.shards, parts_of)], timeout=120)
                if frames is not None:
                    self.frames.send_frames(frames, state["counts"], self.shards)
            finally:
                if frames is not None:
                    frames.close()
            auth = ClientAuth(plaintext=False, client_keys=keys["client"], server_public=keys["server_public"])
            self.client = ShardedReplayClient(addresses, auth, timeout=60.0)
            self.client.refresh()
            self.refreshed = time.perf_counter()
            self.addresses = addresses
            u = schedule.updates_per_step
            self.lag = credit_lag(plan, u, parts.n_step)
            self.step = grant_step(plan, u, parts.n_step)  # grants move by at least this many env steps
            self.granted = [None] * nodes  # the last limit sent to each node agent
            self.ceiling = self.start
            self.rng = np.random.default_rng([parts.seed, counters.env_steps])
            self.prefetching = not replay.prioritized
            self.snapshot_ids, self.reading = itertools.count(), []  # a frame table's snapshots (ShardFrames)
        except BaseException:
            self.close()  # the shards started so far
            raise
        parts.replay = _CheckpointView(self, replay)  # the api's checkpoints pull the shards' tables
        counters.ray_shards = self.shards  # while the run lasts (tests look where they run)

    def env_steps(self, age: float | None = None) -> int:
        """The shards' count: from their last sample replies, or asked if that was over `age` s ago
        and no batch is asked for (its reply brings the count)."""
        if age is not None and not self.client.asked and time.perf_counter() - self.refreshed >= age:
            self.client.refresh()
            self.refreshed = time.perf_counter()
        return self.client.progress

    def consistent(self):
        return contextlib.nullcontext()

    def sample(self, batch_size: int):
        batch = self.client.sample(batch_size, self.rng)
        self.refreshed = time.perf_counter()  # the reply carried the shards' counts
        return batch

    def prefetch(self, batch_size: int, due: int) -> None:
        """Asks the shards for up to SAMPLES_AHEAD batches beyond the one the learner holds, of
        the `due` updates still due after it, so that their round trips overlap its updates (a
        sample's round trip costs the learner more than its update: docs/BENCHMARKS.md issue 15).
        Uniform replay only: a prioritized batch is drawn after the previous one's priority update."""
        if self.prefetching:
            while len(self.client.asked) < min(SAMPLES_AHEAD, due):
                self.client.ask(batch_size, self.rng)

    def update_priorities(self, indices, abs_td) -> None:
        self.client.update_priorities(indices, abs_td)

    def grant(self, agents, updates: int) -> None:
        """Each node may commit its share of the env steps whose updates due stay within the lag."""
        self.ceiling = ceiling(self.parts.schedule, updates + self.lag, self.ceiling)
        limit = math.ceil((self.ceiling - self.start) / self.nodes)
        for node, agent in enumerate(agents):
            if self.granted[node] is None or limit - self.granted[node] >= self.step:
                agent.allow.remote(limit)
                self.granted[node] = limit

    def regrant(self, node: int) -> None:
        self.granted[node] = None  # a restarted agent starts with no grant

    def pull(self) -> tuple[dict, int]:
        """The shards' tables as the run's one table, and the env steps their chunks committed."""
        import ray

        from pearl.runtime.ray_replay import merge_states

        states = ray.get([shard.state.remote() for shard in self.shards], timeout=300)
        env_steps = sum(steps for _, steps in states)
        states = [state for state, _ in states]
        if self.frames:
            return self.frames.merge(states, env_steps, self._table_extra()), env_steps
        return merge_states(states, self.capacities, self.replay.capacity, env_steps, self._table_extra()), env_steps

    def snapshot(self):
        """(A frame table's state from the shards but its frames, the env steps their chunks
        committed, its frames to read: ShardFrames), each shard's taken between two of its requests."""
        import ray

        from pearl.runtime.ray_replay import ShardFrames

        ident = next(self.snapshot_ids)
        replies = ray.get([shard.snapshot.remote(ident) for shard in self.shards], timeout=300)
        env_steps = sum(steps for _, steps in replies)
        state = self.frames.merge([state for state, _ in replies], env_steps, self._table_extra())
        replay = self.replay
        frames = ShardFrames(self.shards, self.frames, state["counts"], ident,
                             replay.frame_bytes(replay.frame_shape, replay.frame_dtype))
        self.reading = [reading for reading in self.reading if not reading.closed.is_set()] + [frames]
        return state, env_steps, frames

    def _table_extra(self) -> dict:
        """What the run's own table keeps that the shards do not: its rate limiter's counts."""
        limiter = self.replay.rate_limiter
        return {"rate_limiter": limiter.state_dict()} if limiter is not None else {}

    def finish(self, counters) -> None:
        self.client.flush_updates()
        if self.frames:  # the frames straight from the shards into the run's table
            state, env_steps, frames = self.snapshot()
            try:
                self.replay.load_state_dict({**state, "frames": frames})
            finally:
                frames.close()
        else:
            state, env_steps = self.pull()
            self.replay.load_state_dict(state)
        counters.env_steps = env_steps

    def close(self) -> None:
        import ray

        self.parts.replay = self.replay
        self.counters.ray_shards = None
        if self.client is not None:
            self.client.close()
        for frames in self.reading:  # a checkpoint still being written reads the shards until it is done
            frames.closed.wait(READ_WAIT_S)
        for shard in self.shards:
            try:
                ray.get(shard.close.remote(), timeout=10)
            except Exception:
                pass
            ray.kill(shard, no_restart=True)


class _CheckpointView:
    """The run's table while its rows live on the shards: a checkpoint taken during the run
    (`state_dict`, read before the counters by pearl.checkpoint.agent_state) holds the shards'
    tables and counts the env steps their chunks committed, so the two agree."""

    def __init__(self, remote: _Remote, table):
        self._remote, self._table = remote, table
        if remote.frames:  # (a flat table has no snapshot: pearl.checkpoint.start_checkpoint asks)
            self.snapshot = self._snapshot

    def state_dict(self) -> dict:
        state, env_steps = self._remote.pull()
        self._count(env_steps)
        return state

    def _snapshot(self):
        """A frame table's checkpoint state but its frames, and its frames (ShardFrames), as
        FrameReplay.snapshot gives them: a run's checkpoint writes them while the run goes on."""
        state, env_steps, frames = self._remote.snapshot()
        self._count(env_steps)
        return state, frames

    def _count(self, env_steps: int) -> None:
        counters = self._remote.counters
        counters.env_steps = max(counters.env_steps, env_steps)

    def __getattr__(self, name):
        return getattr(self._table, name)


class _Reports:
    """The agents' finished episodes and rates, asked without waiting: one report call in flight
    per agent, its answer taken at a later poll (an agent still starting, a Ray worker booting,
    answers only once it is up; the driver learns and acts meanwhile). A dead agent's are lost."""

    def __init__(self, agents, rates):
        self.agents, self.rates, self.asked = agents, rates, {}  # ref -> node

    def collect(self, counters: Counters) -> None:
        import ray

        if self.asked:
            done, _ = ray.wait(list(self.asked), num_returns=len(self.asked), timeout=0)
            for ref in done:
                self.asked.pop(ref)
                try:
                    report = ray.get(ref)
                except ray.exceptions.RayActorError:
                    continue
                counters.record_episodes(report["episodes"])
                self.rates.add(report)
        waiting = set(self.asked.values())
        for node, agent in enumerate(self.agents):
            if node not in waiting:
                self.asked[agent.report.remote()] = node


class _Publisher:
    """Weights to every node agent, the same to each: their bytes inside the call up to
    INLINE_WEIGHTS_BYTES (a bytes argument costs both sides ~20-35% less than the array's pickle),
    else one `ray.put` whose reference each agent gets. A sync due within PUBLISH_S of the last
    publish, or while the last one is still being delivered, is folded into the next (`due`).

    The Ray calls are made by a thread of the driver's own ("ray-publisher"): submitting a call
    and polling its delivery held the learner's thread ~20% of its wall time in a profile (a
    `.remote()` and a `ray.wait` each wait for Ray's core worker, slow whenever the cores are
    busy), while the learner's kernel runs without the GIL. The learner's thread only copies the
    weights (the kernel changes them in place) and hands them over."""

    def __init__(self, agents):
        self.agents, self.sent, self.due = agents, [None] * len(agents), False
        self.last, self.count = -math.inf, 0  # when the last publish was handed over; publishes
        self.pending = None  # (payload, epsilon) handed to the thread, not yet sent
        self.forgotten: set[int] = set()  # restarted agents: their last call is not waited for
        self.error = None  # what ended the thread, raised in the learner's thread
        self.lock, self.wake, self.stopping = threading.Lock(), threading.Event(), False
        self.thread = threading.Thread(target=self._serve, name="ray-publisher", daemon=True)
        self.thread.start()

    def send(self, weights_of, epsilon: float) -> None:
        """Hands `weights_of()` (copied only if it goes out now) and epsilon to the thread, or marks
        it due: within PUBLISH_S of the last, or while the thread still delivers the last."""
        if self.error is not None:
            raise self.error
        now = time.perf_counter()
        if now - self.last < PUBLISH_S or self.pending is not None:
            self.due = True
            return
        weights = weights_of()
        payload = weights.tobytes() if weights.nbytes <= INLINE_WEIGHTS_BYTES else weights.copy()
        with self.lock:
            self.pending = (payload, float(epsilon))
        self.wake.set()
        self.due, self.last, self.count = False, now, self.count + 1

    def forget(self, node: int) -> None:
        """Agent `node` was restarted: it needs the next weights, and its last call will not answer."""
        with self.lock:
            self.forgotten.add(node)
        self.due = True

    def _serve(self) -> None:
        import ray

        try:
            while True:
                self.wake.wait()
                self.wake.clear()
                if self.stopping:
                    return
                with self.lock:
                    payload, epsilon = self.pending
                    for node in self.forgotten:
                        self.sent[node] = None
                    self.forgotten.clear()
                if not isinstance(payload, bytes):
                    payload = ray.put(payload)
                self.sent = [agent.publish.remote(payload, epsilon) for agent in self.agents]
                # delivered (or its agent dead) before the next is taken: a booting agent's calls
                # do not pile up; the learner folds its syncs meanwhile
                busy = list(self.sent)
                while busy and not self.stopping:
                    busy = ray.wait(busy, num_returns=len(busy), timeout=0.05)[1]
                    with self.lock:
                        forgotten = {self.sent[node] for node in self.forgotten}
                    busy = [ref for ref in busy if ref not in forgotten]
                with self.lock:
                    self.pending = None
        except BaseException as error:  # noqa: BLE001 (raised again in the learner's thread)
            self.error = error

    def close(self) -> None:
        self.stopping = True
        self.wake.set()
        self.thread.join(timeout=5)


class _Rates:
    """Per-node env steps/s and the actors' act time, from the agents' reports."""

    def __init__(self, nodes: int):
        self.last = [None] * nodes

    def add(self, report: dict) -> None:
        self.last[report["node"]] = report

    def summary(self) -> list[dict]:
        """Per node: env steps/s, and per act round the actors' time acting (wall), their CPU in it
        (below the wall time: the node's cores are shared) and their time waiting (allowance, ring)."""
        return [{"node": r["node"], "env_steps": r["committed"], "steps_per_s": r["committed"] / max(r["wall_s"], 1e-9),
                 **{f"{key}_us_per_round": 1e6 * r[f"{key}_s"] / max(r["rounds"], 1) for key in ("act", "act_cpu", "wait")}}
                for r in self.last if r is not None]

    def line(self) -> str:
        return "ray nodes: " + ", ".join(f"node {s['node']} {s['steps_per_s']:,.0f} steps/s (act {s['act_us_per_round']:.0f}"
                                         f" us/round, CPU {s['act_cpu_us_per_round']:.0f}, wait {s['wait_us_per_round']:.0f})"
                                         for s in self.summary())
