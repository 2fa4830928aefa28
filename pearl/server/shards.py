"""Exact prioritized sampling across S replay servers, each with its own sum tree.

One draw from the union of the shards must return row i of shard s with probability
m_i / T, T = sum of the shards' totals T_s (m_i: the row's selector mass, p_i^alpha). The client
draws per-shard counts c ~ Multinomial(B, T_s / T) and asks shard s for c_s rows drawn by its own
tree (probability m_i / T_s each), all shards in parallel (one request each, then the replies).
So a draw is from shard s with probability T_s / T and then row i with m_i / T_s: m_i / T exactly.
Importance weights use the global quantities: w_i = (N P(i))^-beta / max_j (N P(j))^-beta =
(m_i / m_min)^-beta with m_min the smallest mass over all shards, so they equal one table's.

The shards' totals come from their previous replies (each reply carries the shard's total and
minimum after that request's priority update) and are refreshed by `refresh()`; rows inserted
since the last reply are not in them until the next one (a table of one shard has the same
staleness between a learner's steps). Indices handed to the learner are global: shard << 40 | slot.
Shards are separate servers with no shared replay ratio: give them none (the ratio is a single
server's feature; see docs/REPLAY_SERVER.md). Writers' chunks go round-robin, except a frame
table's step records: each row goes to its env stream's shard (`stream_shard`), whose table holds
that stream's whole ring.
"""
from __future__ import annotations

from collections import deque

import numpy as np

from pearl.contracts import Batch
from pearl.replay.prioritized import annealed_beta
from pearl.schedule import share
from pearl.server.client import ClientAuth, Connection, NoReply, ReplayClient, ServerError  # noqa: F401
from pearl.server.wire import FLAG_MASSES, Header, Op, pack

SHIFT = 40
SLOT = (1 << SHIFT) - 1


def stream_shard(streams: np.ndarray, shards: int) -> tuple[np.ndarray, np.ndarray]:
    """A frame table's env streams over S shards: stream s lives on shard s mod S as that shard's
    stream s // S (so each stream's records stay in order on one shard). A writer's first step of
    a stream (~s, negative) stays a first step (~(s // S)). Returns (shard of each row, its id there)."""
    first = streams < 0
    stream = np.where(first, ~streams, streams)
    local = stream // shards
    return stream % shards, np.where(first, ~local, local)


class ShardedReplayClient:
    """The table interface over S shard servers (writers: round-robin chunks to the shards)."""

    def __init__(self, addresses: list[str], auth: ClientAuth | None = None, writer: int | None = None,
                 timeout: float = 30.0, window: int = 16):
        self.shards = [ReplayClient(a, auth, writer=writer, timeout=timeout, window=window) for a in addresses]
        first = self.shards[0].info
        for shard in self.shards[1:]:
            for key in ("kind", "obs_shape", "obs_dtype", "action_dtype", "action_shape", "alpha", "beta",
                        "beta_final", "beta_steps", "frame_stack", "n_step", "gamma"):
                if shard.info[key] != first[key]:
                    raise ValueError(f"shard {shard.address}: {key} {shard.info[key]!r} != {first[key]!r}")
        if any(s.info["ratio"] is not None for s in self.shards):
            raise ValueError("sharded replay: the shards must not enforce a replay ratio each")
        self.info = first
        self.frame_stack = first.get("frame_stack", 0)
        self.prioritized = bool(first["prioritized"])
        self.capacity = sum(s.capacity for s in self.shards)
        self.totals = np.zeros(len(self.shards))
        self.mins = np.full(len(self.shards), np.inf)
        self.progress_of = np.zeros(len(self.shards), np.int64)
        self._next_shard = 0
        self._pending: list = [None] * len(self.shards)
        self.asked: deque[list[int]] = deque()  # batches asked for, not yet taken: the shards they asked
        self.timeout = timeout

    @property
    def progress(self) -> int:
        return int(self.progress_of.sum())

    @progress.setter
    def progress(self, value) -> None:
        pass

    def refresh(self) -> None:
        """The shards' totals, minima and env steps by a STATS request each: only with no batch in
        flight (a STATS reply would queue behind those batches on the same sockets; their replies
        carry the same figures)."""
        if self.asked:
            raise RuntimeError("refresh: batches asked for and not taken")
        for s, shard in enumerate(self.shards):
            stats = shard.stats()
            self.totals[s] = stats.get("total_mass", 0.0)
            self.mins[s] = stats.get("min_mass", np.inf)
            self.progress_of[s] = stats["env_steps"]

    def add(self, *columns, env_steps: int | None = None) -> None:
        """Whole transitions: the chunk to the next shard (round-robin). A frame table's step records:
        each row to its stream's shard (`stream_shard`), as that shard's stream, in order; the
        chunk's env steps shared out by rows."""
        if not self.frame_stack:
            shard = self.shards[self._next_shard]
            self._next_shard = (self._next_shard + 1) % len(self.shards)
            shard.add(*columns, env_steps=env_steps)
            return
        streams = np.asarray(columns[0], np.int64)
        shard_of, local = stream_shard(streams, len(self.shards))
        rows = len(streams)
        steps = rows if env_steps is None else int(env_steps)
        done = 0
        for s in np.unique(shard_of):
            mask = shard_of == s
            part = int(mask.sum())
            self.shards[s].add(local[mask], *(np.asarray(c)[mask] for c in columns[1:]),
                               env_steps=share(steps, done, done + part, rows))
            done += part

    def flush(self, release_credit: bool = False) -> None:
        for shard in self.shards:
            shard.flush(release_credit)

    def update_priorities(self, indices, td_errors) -> None:
        """Split by shard; each part rides on that shard's next request."""
        indices = np.asarray(indices, np.int64)
        td = np.abs(np.asarray(td_errors, np.float32))
        which = indices >> SHIFT
        for s in range(len(self.shards)):
            mask = which == s
            if mask.any():
                part = (np.ascontiguousarray(indices[mask] & SLOT), np.ascontiguousarray(td[mask]))
                if self._pending[s] is not None:
                    self.shards[s]._send_update(*self._pending[s])
                self._pending[s] = part

    def flush_updates(self) -> None:
        """Sends the priority updates still waiting for a sample request (a learner's last batch)."""
        for s, pending in enumerate(self._pending):
            if pending is not None:
                self._pending[s] = None
                self.shards[s]._send_update(*pending)

    def sample(self, batch_size: int, rng: np.random.Generator, timeout: float | None = None) -> Batch:
        """A batch: the oldest one asked for (`ask`), or a fresh one."""
        if not self.asked:
            self.ask(batch_size, rng)
        return self.take(timeout)

    def ask(self, batch_size: int, rng: np.random.Generator) -> None:
        """Sends the requests of one batch without waiting for it (`take` reads the replies, oldest
        batch first): a learner asks for its next batch before it learns on this one. One rule for
        the per-shard counts: while batches are in flight they come from the totals the replies
        taken so far carried (the asked batches' replies bring the next), and only with nothing in
        flight may a refresh (STATS) fetch totals the client does not have yet."""
        if not self.totals.sum() > 0 and not self.asked:
            self.refresh()
        total = self.totals.sum()
        if not total > 0:
            raise ValueError("cannot sample: the shards hold no mass" +
                             (" (as of the replies taken; batches are in flight)" if self.asked else ""))
        counts = rng.multinomial(batch_size, self.totals / total)
        asked = []
        for s, (shard, count) in enumerate(zip(self.shards, counts)):
            pending, self._pending[s] = self._pending[s], None
            if count == 0 and pending is None:
                continue
            if count == 0:  # only an update for this shard: its ack tells nothing new about totals
                frames = pack(Header(Op.UPDATE, rows=len(pending[0])), list(pending))
            elif pending is None:
                frames = pack(Header(Op.SAMPLE, arg0=int(count), flags=FLAG_MASSES))
            else:
                frames = pack(Header(Op.UPDATE_SAMPLE, rows=len(pending[0]), arg0=int(count), flags=FLAG_MASSES),
                              list(pending))
            shard.learner.send(frames)
            asked.append(s)
        self.asked.append(asked)

    def take(self, timeout: float | None = None) -> Batch:
        """The oldest asked batch (its shards' replies, in any order: they work in parallel)."""
        parts = {}
        for s in self.asked.popleft():
            header, arrays = self.shards[s].learner.recv(timeout if timeout is not None else self.timeout)
            if header.op == Op.BATCH:
                parts[s] = arrays
                meta = arrays[8][0]
                self.totals[s], self.mins[s], self.progress_of[s] = meta[0], meta[1], int(meta[4])
        order = [s for s in range(len(self.shards)) if s in parts]
        fields = [np.concatenate([parts[s][f] for s in order]) for f in range(5)]
        indices = np.concatenate([parts[s][5] + (s << SHIFT) for s in order])
        masses = np.concatenate([parts[s][7] for s in order])
        info = self.info
        if self.prioritized:
            beta = annealed_beta(info["beta"], info["beta_final"], max(1, info["beta_steps"]), self.progress)
            weights = ((masses / self.mins.min()) ** -beta).astype(np.float32)
        else:
            weights = np.ones(len(indices), np.float32)
        return Batch(*fields, indices=indices, weights=weights)

    def stats(self) -> list[dict]:
        return [shard.stats() for shard in self.shards]

    def state_dict(self, detached: bool = False) -> dict:
        return {"shards": [shard.state_dict() for shard in self.shards]}

    def load_state_dict(self, state: dict) -> None:
        """Nothing to load client-side: each shard restarts from its own latest checkpoint."""

    def close(self) -> None:
        for shard in self.shards:
            shard.close()
