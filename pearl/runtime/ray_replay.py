"""The replay of a ray run placed off the learner's process (`plan.ray.replay: server | node`).

`ReplayShard` is the body of a Ray actor that hosts one replay server (pearl.server.ReplayServer,
as `pearl replay-server` runs it) in its own process: on the learner's node (`server`: node
affinity) or on a node of its own (`node`: a bundle of the run's placement group). `shards`
such servers split the table's capacity; the node agents write to them round-robin (a frame
table's rows by stream) and the learner samples them through pearl.server.shards.ShardedReplayClient
(exact prioritized sampling across the shards). The servers keep no replay ratio of their own:
the driver keeps it (pearl/runtime/ray.py grants each node agent the env steps it may commit).

The run's checkpoint holds the replay as with every runtime: `merge_states` gathers the shards'
tables into the run's one table (oldest rows first), `split_states` deals it back out to fresh
shards when a run continues (row j to shard j mod S, so each shard's share fits its capacity).
A frame table (replay.frame_stack) is split by env stream instead (`FrameShards`): a stream's
records must stay together and in order, so each shard holds whole streams. Its frames (99.8% of
an Atari table's bytes) are not gathered into one state: a checkpoint, or the run's end, takes the
shards' snapshots (`ReplayShard.snapshot`: all but the frames) and reads the frames through
`ShardFrames`, a bounded Ray call at a time, straight into the checkpoint file or the run's table.
"""
from __future__ import annotations

import os
import tempfile
import threading

import numpy as np

from pearl.replay.frames import FrameReplay, stored_slots
from pearl.schedule import share


def server_keys(directory: str) -> dict:
    """A CURVE key pair for the replay server(s) (the secret in a private file of `directory`, and
    as z85 for servers on other nodes) and one for the run's clients."""
    import zmq

    public, secret = zmq.curve_keypair()
    return {"server_secret_file": write_secret(directory, public, secret), "server": (public, secret),
            "server_public": public, "client": zmq.curve_keypair()}


def write_secret(directory: str, public: bytes, secret: bytes) -> str:
    """A 0600 file in zmq's certificate format (zmq.auth.load_certificate) holding the key pair."""
    path = os.path.join(directory, "server.key_secret")
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as out:
        out.write(f'metadata\ncurve\n    public-key = "{public.decode()}"\n    secret-key = "{secret.decode()}"\n')
    return path


def shard_capacities(capacity: int, shards: int) -> list[int]:
    return [capacity // shards + (k < capacity % shards) for k in range(shards)]


def step_shares(env_steps: int, shards: int) -> list[int]:
    """A run's env steps dealt out to its shards (the count each shard's beta annealing reads)."""
    return [env_steps // shards + (k < env_steps % shards) for k in range(shards)]


def _oldest_first(state: dict, capacity: int) -> np.ndarray:
    size, cursor = int(state["size"]), int(state["cursor"])
    return (cursor + np.arange(size)) % capacity if size == capacity else np.arange(size)


def merge_states(states: list[dict], capacities: list[int], capacity: int, env_steps: int, extra: dict) -> dict:
    """One table's state (pearl.replay state_dict) from the shards' states, oldest rows first.
    `extra`: keys of the run's own table that the shards do not have (its rate limiter's state)."""
    orders = [_oldest_first(s, c) for s, c in zip(states, capacities)]
    size = sum(len(o) for o in orders)
    merged = {"storage": {name: np.concatenate([s["storage"][name][o] for s, o in zip(states, orders)])
                          for name in states[0]["storage"]},
              "cursor": size % capacity, "size": size, "inserted": sum(int(s["inserted"]) for s in states), **extra}
    if "priorities" in states[0]:
        merged.update(priorities=np.concatenate([np.asarray(s["priorities"])[o] for s, o in zip(states, orders)]),
                      max_priority=max(float(s["max_priority"]) for s in states), progress=env_steps)
    return merged


def split_states(state: dict, capacity: int, capacities: list[int], env_steps: int) -> list[tuple[dict, int]]:
    """The run's table dealt out to the shards: [(shard's state, its share of the env steps)]."""
    shards = len(capacities)
    order = _oldest_first(state, capacity)
    older = int(state["inserted"]) - len(order)  # rows inserted and since overwritten
    parts = []
    for k, (cap, steps) in enumerate(zip(capacities, step_shares(env_steps, shards))):
        rows = order[k::shards]
        part = {"storage": {name: np.ascontiguousarray(values[rows]) for name, values in state["storage"].items()},
                "cursor": len(rows) % cap, "size": len(rows),
                "inserted": len(rows) + older // shards + (k < older % shards)}
        if "priorities" in state:
            part.update(priorities=np.asarray(state["priorities"])[rows], max_priority=state["max_priority"],
                        progress=steps)
        parts.append((part, steps))
    return parts


class FrameShards:
    """A frame table (pearl/replay/frames.py) over S shards: env stream s of the run's table lives on
    shard s mod S as its stream s // S (pearl.server.shards.stream_shard routes the writers' step
    records so), each stream's ring of the run's table's length. A stream's records, episode
    bookkeeping and priorities move between the run's table and a shard as they are: a state's
    rows are its streams' stored records, stream after stream (FrameReplay.state_dict), so a
    shard's rows are the run's rows of its streams, in the same order."""

    ROWS = FrameReplay.ROWS + ("priorities",)  # one per stored record
    STREAMS = ("counts", "episode_start", "starting")  # one per stream

    def __init__(self, streams: int, length: int, shards: int):
        self.held = [np.arange(k, streams, shards) for k in range(shards)]  # the run's streams, by shard
        self.capacities = [len(held) * length for held in self.held]
        self.streams, self.length = streams, length

    def _shard_of_rows(self, counts) -> np.ndarray:
        """The shard each of a run state's rows goes to (its stream's, s mod S)."""
        return np.repeat(np.arange(self.streams) % len(self.held), np.minimum(np.asarray(counts), self.length))

    def split(self, state: dict, env_steps: int) -> list[tuple[dict, int]]:
        """The run's table dealt out to the shards: [(shard's state, its share of the env steps)]
        (a snapshot's state: their frames follow by `send_frames`)."""
        shards, counts = len(self.held), np.asarray(state["counts"])
        slots = stored_slots(counts, self.length)
        rows = [name for name in self.ROWS if name in state]  # (a snapshot's state has no frames)
        if len(state["actions"]) != len(slots):  # a state of every slot, rings not full (older checkpoints)
            state = {**state, **{name: np.asarray(state[name])[slots] for name in rows}}
        owner = self._shard_of_rows(counts)
        records = max(1, int(counts.sum()))
        parts, done = [], 0
        for k, (held, steps) in enumerate(zip(self.held, step_shares(env_steps, shards))):
            mine = int(counts[held].sum())
            inserted = share(int(state["inserted"]), done, done + mine, records)
            done += mine
            part = {name: np.ascontiguousarray(np.asarray(state[name])[owner == k]) for name in rows}
            part.update({name: np.asarray(state[name])[held].copy() for name in self.STREAMS})
            part.update(state=np.array([int(np.count_nonzero(part["valid"])), int(state["state"][1])], np.int64),
                        inserted=inserted, max_priority=state["max_priority"], progress=steps)
            parts.append((part, steps))
        return parts

    def send_frames(self, frames, counts, shards) -> None:
        """The run's frames (a frame source: FrameSnapshot) to the shards holding their streams,
        after their states (`split` of the snapshot's state): at most SHARD_READ_BYTES a call, one
        call at a time, so no copy of the table is made on the way."""
        import ray

        reader, sent = _SnapshotReader(frames), [0] * len(shards)
        for shard, count in self.calls(counts, frames.dtype.itemsize * int(np.prod(frames.row_shape))):
            ray.get(shards[shard].load_frames.remote(sent[shard], reader.rows(count)), timeout=300)
            sent[shard] += count

    def calls(self, counts, frame_bytes: int) -> list[tuple[int, int]]:
        """The run's stored records in its row order as (shard, rows) runs of at most
        SHARD_READ_BYTES: stream after stream, stream s's on shard s mod S."""
        per_call = max(1, SHARD_READ_BYTES // frame_bytes)
        return [(stream % len(self.held), min(per_call, int(stored) - start))
                for stream, stored in enumerate(np.minimum(np.asarray(counts), self.length))
                for start in range(0, int(stored), per_call)]

    def merge(self, states: list[dict], env_steps: int, extra: dict) -> dict:
        """One frame table's state from the shards' states (or their snapshots': all but the frames).
        `extra`: keys of the run's own table that the shards do not have (its rate limiter's state)."""
        first = states[0]
        merged = {name: np.empty(self.streams, np.asarray(first[name]).dtype) for name in self.STREAMS}
        for state, held in zip(states, self.held):
            for name in self.STREAMS:
                merged[name][held] = state[name]
        owner = self._shard_of_rows(merged["counts"])
        rows = [name for name in self.ROWS if name in first]  # (a snapshot's state has no frames)
        merged.update({name: np.empty((len(owner), *np.shape(first[name])[1:]), np.asarray(first[name]).dtype)
                       for name in rows})
        for k, state in enumerate(states):
            for name in rows:
                merged[name][owner == k] = state[name]
        merged.update(state=np.array([sum(int(s["state"][0]) for s in states), max(int(s["state"][1]) for s in states)],
                                     np.int64),
                      inserted=sum(int(s["inserted"]) for s in states),
                      max_priority=max(float(s["max_priority"]) for s in states), progress=env_steps, **extra)
        return merged


SHARD_READ_BYTES = 32 << 20  # frames one Ray call brings from a shard's snapshot


class ShardFrames:
    """A ray run's frame table's frames as its shards held them at their snapshots (`_Remote.snapshot`,
    pearl/runtime/ray.py), in the run's row order: stream after stream, stream s read from shard
    s mod S, at most SHARD_READ_BYTES a Ray call. The frame source a checkpoint writes block by
    block (pearl/checkpoint.py, as a FrameSnapshot) and the run's table loads at the run's end:
    nowhere a whole copy of the frames beside the shards' tables (the shards' detached states,
    Ray's object store's copy of them and their merge were three)."""

    def __init__(self, shards, layout: FrameShards, counts, ident: int, frame_bytes: int):
        self.shards, self.ident = shards, ident
        self.dtype, self.row_shape = np.dtype(np.uint8), (frame_bytes,)
        self.calls = layout.calls(counts, frame_bytes)
        self.rows, self.blocks = sum(count for _, count in self.calls), len(self.calls)
        self.closed = threading.Event()

    def __len__(self) -> int:
        return self.rows

    def block(self, block: int) -> np.ndarray:
        import ray

        shard, count = self.calls[block]
        return ray.get(self.shards[shard].frame_rows.remote(self.ident, count), timeout=300)

    def close(self) -> None:
        """The shards drop their snapshots, read whole or not."""
        import ray

        if self.closed.is_set():
            return
        try:
            ray.get([shard.drop.remote(self.ident) for shard in self.shards], timeout=60)
        except (ray.exceptions.RayError, TimeoutError):  # (shards gone: so are their snapshots)
            pass
        finally:
            self.closed.set()


class _SnapshotReader:
    """A shard's FrameSnapshot read in runs of rows of any length, in order."""

    def __init__(self, frames):
        self.frames, self.next_block, self.ahead = frames, 0, []

    def rows(self, count: int) -> np.ndarray:
        have = sum(len(block) for block in self.ahead)
        while have < count:
            block = self.frames.block(self.next_block)
            self.next_block += 1
            self.ahead.append(block)
            have += len(block)
        rows = np.concatenate(self.ahead) if len(self.ahead) > 1 else self.ahead[0]
        self.ahead = [rows[count:]] if len(rows) > count else []
        return rows[:count]


class ReplayShard:
    """The body of a Ray actor (ray.py wraps it with `ray.remote`): one replay server bound to this
    node's address, CURVE-authenticated with the run's server key pair (reaching it through Ray's
    control plane, as the clients' keys reach the node agents), allowing the run's client key."""

    def __init__(self, table, max_chunk_rows: int, server_keys: tuple[bytes, bytes], client_public: bytes):
        import ray

        from pearl.server.config import AuthConfig, ServerConfig
        from pearl.server.server import ReplayServer

        self.keydir = tempfile.TemporaryDirectory(prefix="pearl-ray-shard-")
        secret = write_secret(self.keydir.name, *server_keys)
        host = ray.util.get_node_ip_address()
        self.server = ReplayServer(ServerConfig(table=table, bind=f"tcp://{host}:0", max_chunk_rows=max_chunk_rows,
                                                auth=AuthConfig(server_secret=secret, allow=[client_public.decode()])))
        self.server.start()
        self.snapshots: dict[int, _SnapshotReader] = {}  # a frame table's, being read (`snapshot`)

    def address(self) -> str:
        return self.server.address

    def where(self) -> tuple[str, int]:
        """(Ray node id, process id) of this server."""
        import ray

        return ray.get_runtime_context().get_node_id(), os.getpid()

    def load(self, state: dict | None, env_steps: int) -> None:
        """A run that goes on: its share of the table (None: the run's table is empty, as this
        shard's is) and of the env steps (the count the sharded client's beta annealing reads)."""
        with self.server.lock:
            service = self.server.service
            if state is not None:
                service.table.load_state_dict(state)
            service.env_steps = service.table.progress = env_steps

    def state(self) -> tuple[dict, int]:
        """The table's state and the env steps its chunks committed, taken between two requests."""
        with self.server.lock:  # (Ray serializes the state after the lock is released)
            return self.server.service.table.state_dict(detached=True), self.server.service.env_steps

    def load_frames(self, first: int, rows: np.ndarray) -> None:
        """Frames of a state `load` took without them (FrameShards.send_frames)."""
        with self.server.lock:
            self.server.service.table.load_frames(first, rows)

    def snapshot(self, ident: int) -> tuple[dict, int]:
        """A frame table's state but its frames and the env steps its chunks committed, taken
        between two requests; `frame_rows(ident, n)` then reads its frames as they were then, in
        the order of the state's rows, while the server goes on (copy-on-write: FrameSnapshot)."""
        with self.server.lock:
            state, frames = self.server.service.table.snapshot()
            self.snapshots[ident] = _SnapshotReader(frames)
            return state, self.server.service.env_steps

    def frame_rows(self, ident: int, count: int) -> np.ndarray:
        return self.snapshots[ident].rows(count)

    def drop(self, ident: int) -> None:
        reader = self.snapshots.pop(ident, None)
        if reader is not None:
            reader.frames.close()

    def close(self) -> None:
        for ident in list(self.snapshots):
            self.drop(ident)
        self.server.stop()
        self.keydir.cleanup()
