"""A node agent of the ray runtime (pearl/runtime/ray.py): one per node, a Ray actor there.

It runs that node's actor processes exactly as the processes runtime does (its `_ActorProcesses`:
isolated interpreters, one shared-memory ring each, the weight board, restarts of a killed actor,
their allowance), and is the learner of those rings: it drains them, packs the committed
transitions into chunks of at most `chunk` rows and streams them to the replay server as one
writer (pearl.server.client.ReplayClient: sequence numbers, `window` chunks in flight, env steps
committed only against the server's credit). With the replay off the learner's process the
servers keep no ratio (one, or several shards written round-robin by the ShardedReplayClient)
and the driver's grant (`allow`) bounds the env steps it commits instead. So no transition travels through a Ray call; Ray
carries control only: `run` (until the node's quota), `publish` (weights from one object-store put
+ epsilon), `allow` (the driver's grant), `report` (finished episodes and rates), `stop`.

Exactly-once across a restart of the agent (Ray restarts a dead one, `max_restarts`): its writer id
is the node's, so the new agent asks the server where its stream is (the acknowledged sequence
number) and how many env steps it has committed, and starts fresh actor processes for the rest of
the node's quota. What the dead agent had not had acknowledged is lost (as a killed actor's
unfinished n-step transitions are), nothing acknowledged is lost or stored twice. Its actor
processes exit on their own when they see their parent gone; the shared memory it created is
unlinked by its resource tracker.
"""
from __future__ import annotations

import dataclasses
import math
import os
import threading
import time
from types import SimpleNamespace

import numpy as np

from pearl.runtime.processes import HEALTH_CHECK_S, _ActorProcesses
from pearl.runtime.shared import _CREATED, ACT_CPU_NS, ACT_NS, ALLOWED, ROUNDS, WAIT_NS
from pearl.schedule import share
from pearl.schedule import AGENT_NAP_S, FLUSH_S

# the actors' own clocks the reports sum: time in act rounds, waiting (allowance, ring space), CPU
# in act rounds (sampled), and act rounds
CLOCKS = (ACT_NS, WAIT_NS, ACT_CPU_NS, ROUNDS)
# The agent's loop: take what its actors committed, nap AGENT_NAP_S, again; what it took goes out
# as one chunk once it holds `chunk` rows or its oldest row is FLUSH_S old. Each pass and each chunk
# costs CPU on the cores the actors and the learner share (spinning and a chunk per act round cost
# ~2x the actors' own CPU per env step); its actors may run several naps' worth of acting ahead
# meanwhile (pearl.schedule.agent_allowance). The learner sees a transition at most ~FLUSH_S + AGENT_NAP_S later.

# Unlinks the shared-memory blocks named on its stdin once that closes: the agent's ring janitor.
# Ray kills a dead worker's process group and children, Python's resource tracker with them, so a
# killed agent (or its node's raylet gone with a killed driver) would leave its rings behind; this
# process leaves the group and the agent's children (a session of its own, then a fork whose parent
# exits) and exits as soon as the agent's end of the pipe closes.
JANITOR = ("import os, sys\nif os.fork():\n    os._exit(0)\n"
           "names = {line.strip() for line in sys.stdin if line.strip()}\n"
           "for name in names:\n    try:\n        os.unlink('/dev/shm/' + name)\n"
           "    except OSError:\n        pass\n")


class NodeAgent:
    """The body of the Ray actor (ray.py wraps it with `ray.remote`); `spec` is the light part of
    the run the actor processes need (no torch module travels): actor recipe, seed, transition
    fields, n_step, actors and envs per actor, env id."""

    def __init__(self, node: int, spec: dict, keys: dict, node_quota: int, ahead: int, chunk: int, window: int,
                 start_steps: int, gated: bool = False):
        self.node, self.spec, self.chunk, self.keys, self.window = node, spec, chunk, keys, window
        self.node_quota, self.ahead, self.start_steps = node_quota, ahead, start_steps
        self.client = None  # the replay server(s)' client: `run` connects it
        self.committed = 0  # env steps the server(s) acknowledged from this node (theirs, once connected)
        # gated: the servers keep no replay ratio, the driver does; this node commits env steps
        # only up to the limit it grants (`allow`), counted like `committed`
        self.limit = 0 if gated else None
        self.lock = threading.Lock()
        self.weights, self.epsilon = None, 1.0
        self.have_weights = threading.Event()
        self.episodes: list[tuple[float, int]] = []
        self.stopping = threading.Event()
        self.actors = None
        self.janitor = None  # the ring janitor (JANITOR), started with the first rings
        self.clocks = [0] * len(CLOCKS)  # the finished actor processes' CLOCKS
        self.started = time.perf_counter()

    def _connect(self, addresses: list[str]) -> None:
        """The client of the replay server(s) at `addresses`, and what they acknowledged of this
        node's stream so far (a restarted agent goes on from there)."""
        from pearl.server.client import ClientAuth, ReplayClient

        keys = self.keys
        auth = ClientAuth(plaintext=False, client_keys=keys["client"], server_public=keys["server_public"])
        # the writer id is the node's: a restarted agent continues the same stream(s); several
        # servers (shards) take its chunks round-robin
        writer = self.node + 1
        if len(addresses) == 1:
            self.client = ReplayClient(addresses[0], auth, writer=writer, window=self.window, timeout=60.0)
            stats = [self.client.stats()]
        else:
            from pearl.server.shards import ShardedReplayClient  # (it loads the prioritized replay's kernels)

            self.client = ShardedReplayClient(addresses, auth, writer=writer, window=self.window, timeout=60.0)
            stats = self.client.stats()
        self.committed = sum(int(s["writer_steps"].get(str(writer), 0)) for s in stats)

    def pid(self) -> int:
        return os.getpid()

    def where(self) -> str:
        """The Ray node this agent runs on."""
        import ray

        return ray.get_runtime_context().get_node_id()

    def publish(self, weights: np.ndarray | bytes, epsilon: float) -> None:
        """The learner's weights (their float32 bytes inside the call, or one object-store put read
        here) and epsilon, onto the board."""
        if isinstance(weights, bytes):
            weights = np.frombuffer(weights, np.float32)
        with self.lock:
            self.weights, self.epsilon = weights, epsilon
            if self.actors is not None:
                self.actors.board.publish(weights)
                self.actors.board.epsilon = epsilon
        self.have_weights.set()

    def allow(self, limit: int) -> None:
        """The env steps this node may have committed in all (the driver's grant; it only grows)."""
        self.limit = max(self.limit, limit)

    def report(self) -> dict:
        """Episodes finished since the last report, env steps committed, the actors' act time."""
        with self.lock:  # (the run's end closes the channels once it has set self.actors to None)
            episodes, self.episodes = self.episodes, []
            actors = self.actors
            clocks = list(self.clocks)
            if actors is not None:
                clocks = _with_clocks(clocks, actors.channels)
        act_ns, wait_ns, cpu_ns, rounds = clocks
        return {"node": self.node, "episodes": episodes, "committed": self.committed, "act_s": act_ns * 1e-9,
                "wait_s": wait_ns * 1e-9, "act_cpu_s": cpu_ns * 1e-9, "rounds": rounds,
                "wall_s": time.perf_counter() - self.started,
                "actor_restarts": actors.restarts if actors is not None else 0}

    def stop(self) -> None:
        """Ends `run`: its loop sees the flag; the actor processes are stopped here too, in case the
        loop is waiting for credit the stopped learner will not grant."""
        self.stopping.set()
        with self.lock:
            if self.actors is not None:
                self.actors.stop()

    def run(self, addresses: list[str]) -> dict:
        """Runs the node's actors until the node has committed its quota of env steps (or `stop`),
        streaming their transitions to the replay server(s) at `addresses`; returns the final report.
        (The addresses come with the call, not the construction: the driver submits the agents
        before its server is up, so that their Ray workers boot meanwhile.)"""
        if self.client is None:
            self._connect(addresses)
        spec = self.spec
        n, envs = spec["actors"], spec["envs"]
        left = max(0, self.node_quota - self.committed)
        quota = math.ceil(left / (n * envs)) * envs  # env steps per actor process
        if quota == 0:
            return self.report()
        recipe = spec["recipe"]
        if recipe.kwargs.get("first_stream") is not None:  # a frame table's streams: node k's after k nodes' envs
            recipe = dataclasses.replace(recipe, kwargs={**recipe.kwargs, "first_stream": self.node * n * envs})
        parts = SimpleNamespace(plan=SimpleNamespace(actors=n, envs_per_actor=envs), actor_recipe=recipe,
                                seed=spec["seed"], transition_fields=spec["fields"], n_step=spec["n_step"],
                                config=SimpleNamespace(env=spec["env"]))
        # seeds differ per node and per restart of the agent (its start: the steps already committed)
        start = self.start_steps + self.committed + (self.node << 40)
        with self.lock:
            actors = _ActorProcesses(parts, start, spec["n_weights"], quota)
            self.actors = actors  # `publish` writes the board from now on
        taken = [0] * n
        pending: list[tuple] = []  # runs copied out of the rings, not yet sent
        rows = steps = 0
        channels = actors.channels

        def allow_actors() -> None:
            """Each actor may run `ahead` env steps past what was taken from it; a gated agent's
            actors together no further than its grant, so it never takes past the grant."""
            room = self.ahead
            if self.limit is not None:
                room = min(room, max(0, self.limit - self.committed - steps) // (n * envs) * envs)
            for index, channel in enumerate(channels):
                channel.counters[ALLOWED] = min(quota, taken[index] + room)

        try:
            # the actor processes boot (an interpreter, imports, the first kernel load: ~1 s) while
            # the janitor starts and the learner's first weights arrive; they act only once allowed
            for index in range(n):
                actors.start(index)
            self._janitor(set(_CREATED))
            while not self.have_weights.wait(0.01):  # the learner's first publish (a concurrent call)
                if self.stopping.is_set():
                    break
            if self.weights is not None:  # (not if stopped before the first publish)
                with self.lock:
                    actors.board.publish(self.weights)
                    actors.board.epsilon = self.epsilon
                allow_actors()
            clock = time.perf_counter
            last_check, oldest = clock(), None  # when the oldest transition of `pending` was taken
            while not self.stopping.is_set():
                for index, channel in enumerate(channels):
                    if self.limit is not None and self.committed + steps >= self.limit:
                        break  # over the driver's grant: the actors wait at their allowance
                    actor_steps, runs, finished = channel.take()
                    for run in runs:
                        pending.append(tuple(np.array(column) for column in run))
                        rows += len(run[2])
                    channel.release()
                    runs = run = None  # the ring's views must not outlive the rings (close unmaps them)
                    if actor_steps > taken[index]:
                        steps += actor_steps - taken[index]
                        taken[index] = actor_steps
                    if finished:
                        with self.lock:
                            self.episodes += finished
                done = all(t >= quota for t in taken)
                now = clock()
                if rows and oldest is None:
                    oldest = now
                full = rows >= self.chunk
                # env steps ride on the next chunk: those of n-step heads with no transition yet
                # wait for one (at the very end they are dropped, as the processes runtime drops
                # what its actors commit after its last take)
                if rows and (full or done or now - oldest >= FLUSH_S):
                    self._send(pending, steps)
                    pending, rows, steps, oldest = [], 0, 0, None
                allow_actors()
                if done:
                    break
                if not full:  # a nap, not a spin: its actors share the node's cores
                    time.sleep(AGENT_NAP_S)
                if now - last_check > HEALTH_CHECK_S and not self.stopping.is_set():
                    actors.check(lambda index: taken[index] >= quota)
                    last_check = clock()
            # done, or stopping: what was sent is acknowledged (its credit was granted); what is
            # still in `pending` was never committed to the server and is dropped with its env steps.
            # The credit left goes back: held by a node that is done, it could leave a node that Ray
            # started late too little of the window, waiting for credit no update would free.
            self.client.flush(release_credit=True)
        finally:
            actors.stop()
            with self.lock:
                self.clocks = _with_clocks(self.clocks, channels)
                self.actors = None
            actors.close()
        return self.report()

    def _send(self, runs: list[tuple], steps: int) -> None:
        """The runs as chunks of at most `chunk` rows, the `steps` env steps they commit shared out
        by rows (each chunk's env steps must fit the server's credit). Waits while the server's
        credit or the window is short."""
        columns = [np.concatenate(parts) for parts in zip(*runs)] if len(runs) > 1 else list(runs[0])
        total = len(columns[2])
        for first in range(0, total, self.chunk):
            last = min(total, first + self.chunk)
            self.client.add(*(c[first:last] for c in columns), env_steps=share(steps, first, last, total))
        self.committed += steps

    def _janitor(self, names: set[str]) -> None:
        import subprocess
        import sys

        if self.janitor is None:
            self.janitor = subprocess.Popen([sys.executable, "-I", "-c", JANITOR], stdin=subprocess.PIPE,
                                            start_new_session=True)
            self.janitor.wait(30)  # the forking parent; the janitor reads on
        self.janitor.stdin.write("".join(f"{name}\n" for name in names).encode())
        self.janitor.stdin.flush()

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
        if self.janitor is not None:  # the rings are unlinked already: it finds nothing left
            self.janitor.stdin.close()


def _with_clocks(totals: list[int], channels) -> list[int]:
    """`totals` (CLOCKS) plus what the actors' channels have counted so far."""
    return [total + sum(int(channel.counters[k]) for channel in channels) for total, k in zip(totals, CLOCKS)]
