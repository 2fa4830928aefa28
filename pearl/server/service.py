"""The replay service without its socket: a PEARL replay table (pearl.replay.make_replay) plus
what only a server can own - the writers' sequence numbers, the env-step count from their commit
records, the replay ratio and the credits it grants, counters and latencies, checkpoints.

`handle(peer, frames)` validates one request completely (header, op, column dtypes and shapes,
byte lengths, row bounds, finite non-negative priorities, index range) before anything touches
the table; a bad request gets an ERROR reply and is counted in `rejected`, never executed. It
returns [(peer, reply frames), ...]: usually one reply to `peer`, none when the request waits
(a sample the ratio does not allow yet, a credit not grantable yet), and replies to waiting
peers that this request unblocked. One thread calls it (pearl/server/server.py's loop).
"""
from __future__ import annotations

import json
import math
import time
from collections import deque

import numpy as np
from numba import njit

from pearl.schedule import updates_due
from pearl.server.config import ServerConfig
from pearl.server.wire import (FLAG_INLINE, FLAG_MASSES, FLAG_NO_ACK, REQUESTS, Column, ErrorCode, Header, Op,
                               Packer, WireError, check_columns, error_frames, info_frames, inline_columns,
                               message_arrays, pack, unpack_header)

INDEX = Column(np.dtype(np.int64), ())
# an update's columns: indices and |td| (float32 or float64)
UPDATE_FLOAT32 = [INDEX, Column(np.dtype(np.float32), ())]
UPDATE_FLOAT64 = [INDEX, Column(np.dtype(np.float64), ())]


@njit(cache=True, nogil=True)
def _check_update(indices, td, size):
    """0 if every |td| is finite and >= 0 and every index in [0, size); else 1 (non-finite),
    2 (negative) or 3 (index out of range): one pass instead of four numpy reductions."""
    for i in range(td.shape[0]):
        x = td[i]
        if not np.isfinite(x):
            return 1
        if x < 0:
            return 2
        if indices[i] < 0 or indices[i] >= size:
            return 3
    return 0
LATENCY_WINDOW = 4096


def make_table(config: ServerConfig):
    """The PEARL replay table a server config asks for (uniform, prioritized sum tree, AMPER; with
    table.frame_stack the frame table of table.streams env streams)."""
    from pearl.config import ReplayConfig
    from pearl.replay import RateLimiter, check_table_fits, make_replay

    t = config.table
    replay = ReplayConfig(kind=t.kind, capacity=t.capacity, alpha=t.alpha, beta=t.beta,
                          beta_final=t.beta_final, priority_eps=t.priority_eps,
                          backend=t.backend if t.backend in ("auto", "numba", "numpy") else "auto",
                          fanout=t.fanout, frame_stack=t.frame_stack)
    limiter = None
    if config.rate_limiter is not None:
        r = config.rate_limiter
        limiter = RateLimiter(r.samples_per_insert, r.min_size_to_sample, r.error_buffer)
    # a frame table's observations are stacks of frame_stack frames of obs_shape
    obs_shape = (t.frame_stack, *t.observation_shape) if t.frame_stack else t.observation_shape
    check_table_fits("table.capacity", replay, obs_shape, t.obs_dtype, t.action_dtype, tuple(t.action_shape))
    return make_replay(replay, obs_shape, obs_dtype=np.dtype(t.obs_dtype), action_dtype=np.dtype(t.action_dtype),
                       action_shape=tuple(t.action_shape), total_steps=t.beta_steps, rate_limiter=limiter,
                       streams=t.streams, n_step=t.n_step, gamma=t.gamma)


def selector_masses(table, indices: np.ndarray) -> tuple[np.ndarray, float, float]:
    """(mass of each index, total mass, smallest mass) of the table's selector: one draw returns
    index i with probability mass_i / total. Sum tree: p_i^alpha; AMPER: its bucket's mean;
    uniform: 1 per stored row."""
    if not table.prioritized:
        return np.ones(len(indices)), float(table.size), 1.0
    tree = table.tree
    total = float(tree.total)
    if hasattr(tree, "probabilities"):  # AMPER draws with its buckets' means
        return tree.probabilities(indices) * total, total, float(tree.min())
    return np.asarray(tree.get(indices), dtype=np.float64), total, float(tree.min())


class Latency:
    def __init__(self):
        self.samples = np.zeros(LATENCY_WINDOW, np.int64)
        self.count = 0

    def add(self, ns: int) -> None:
        self.samples[self.count % LATENCY_WINDOW] = ns
        self.count += 1

    def summary(self) -> dict:
        window = self.samples[:min(self.count, LATENCY_WINDOW)]
        if not len(window):
            return {"count": 0}
        p50, p99 = np.percentile(window, [50, 99]) / 1e3
        return {"count": self.count, "p50_us": round(float(p50), 2), "p99_us": round(float(p99), 2)}


class ReplayService:
    def __init__(self, config: ServerConfig, table=None):
        self.config = config
        self.schema = config.schema()
        self.table = make_table(config) if table is None else table
        if table is None and not config.table.frame_stack:  # fault the ring's pages in now, not during
            for view in self.table.storage.values():           # the first pass of inserts
                view[...] = 0
        self.rng = np.random.default_rng(config.seed)
        self.env_steps = 0           # from the writers' commit records
        self.updates = 0             # samples served under the ratio (one per learner update)
        self.acked: dict[int, int] = {}    # writer -> highest contiguous sequence number stored
        self.writer_steps: dict[int, int] = {}  # writer -> env steps its stored chunks committed
        self.credit: dict[int, int] = {}   # writer -> env steps it may still commit (ratio only)
        self.durable: dict[int, int] = {}  # writer -> highest sequence number in the last checkpoint
        self.counts = {"inserts": 0, "rows_inserted": 0, "duplicates": 0, "samples": 0, "rows_sampled": 0,
                       "updates": 0, "rejected": 0, "checkpoints": 0}
        self.rejected_by_code: dict[str, int] = {}
        self.latency = {op.name.lower(): Latency() for op in REQUESTS}
        # op code -> (handler, its latency window): one dict look-up per request
        self._ops = {int(op): (getattr(self, "_" + op.name.lower()), self.latency[op.name.lower()]) for op in REQUESTS}
        self.max_lag_seen = 0
        self.waiting_samples: deque = deque()   # (peer, header, update columns) a ratio holds back
        self.waiting_credit: dict[int, tuple] = {}  # writer -> (peer, need)
        self.snapshot = None                    # a checkpoint in progress (pearl/server/checkpoint.py)
        self.outbox: list = []                  # replies made outside a request (sample_here), to send
        self.last_error = ""
        # inline INSERTs go into the ring by one compiled copy from the received frame (Replay.add_frame)
        self._frame_inserts = bool(getattr(self.table, "takes_frames", False))
        self._packers: dict[int, Packer | None] = {}  # rows -> BATCH reply packer
        self._staging: dict[tuple, np.ndarray] = {}  # (column, shape, dtype) -> a strided column's copy
        self._warm()

    def _warm(self) -> None:
        """Calls the insert path's and the update check's compiled kernels once on zero rows, with
        the array types a request gives them (read-only views of a received frame): a process's
        first numba call loads its target and the cached kernels (~0.7 s measured), which would
        otherwise stall the first writer's first chunk. Nothing is stored or changed."""
        def received(schema):
            frames = pack(Header(Op.INSERT), [np.zeros((0,) + c.shape, c.dtype) for c in schema], inline=True)
            return frames, *unpack_header(frames[0])

        limiter = self.table.rate_limiter
        if limiter is None or limiter.can_insert(0):
            self.table.add(*message_arrays(*received(self.schema)))
            if self._frame_inserts:
                self.table.add_frame(*inline_columns(*received(self.schema)), 0)
        for schema in (UPDATE_FLOAT32, UPDATE_FLOAT64):
            _check_update(*message_arrays(*received(schema)), 0)

    # ---- the replay ratio -------------------------------------------------------------------
    @property
    def due(self) -> int:
        r = self.config.ratio
        return updates_due(self.env_steps, r.learning_starts, r.updates_per_step)

    def ceiling(self) -> int:
        """The most env steps that may be committed now: due(ceiling) <= updates + max_lag."""
        r = self.config.ratio
        limit = self.updates + r.max_lag
        steps = r.learning_starts + int(math.ceil((limit + 1) / r.updates_per_step)) - 1
        while updates_due(steps, r.learning_starts, r.updates_per_step) > limit:
            steps -= 1
        while updates_due(steps + 1, r.learning_starts, r.updates_per_step) <= limit:
            steps += 1
        return steps

    def _grant(self, writer: int, need: int) -> bool:
        """Tops up `writer`'s credit to at least `need` env steps if the ceiling leaves room."""
        have = self.credit.get(writer, 0)
        if have >= need:
            return True
        headroom = self.ceiling() - self.env_steps - sum(self.credit.values())
        r = self.config.ratio
        share = max(1, int(r.max_lag / r.updates_per_step) // max(1, len(self.acked)))
        give = min(headroom, max(need - have, share))
        if have + give < need:
            return False
        self.credit[writer] = have + give
        return True

    # ---- requests ---------------------------------------------------------------------------
    def handle(self, peer, frames) -> list:
        start = time.perf_counter_ns()
        try:
            header, columns = unpack_header(frames[0])
            op = self._ops.get(header.op)
            if op is None:
                raise WireError(ErrorCode.UNKNOWN_OP, f"unknown op {header.op}")
            if header.table != 0:
                raise WireError(ErrorCode.UNKNOWN_TABLE, f"unknown table {header.table} (this server holds table 0)")
            if header.rows > 1 << 30:
                raise WireError(ErrorCode.TOO_LARGE, f"{header.rows} rows")
            if header.op == Op.INSERT and header.flags & FLAG_INLINE and self._frame_inserts:
                arrays = inline_columns(frames, header, columns)  # (frame, offsets): _insert's one copy
            else:
                arrays = message_arrays(frames, header, columns)
            replies = op[0](peer, header, columns, arrays)
        except WireError as error:
            self.counts["rejected"] += 1
            name = ErrorCode(error.code).name
            self.rejected_by_code[name] = self.rejected_by_code.get(name, 0) + 1
            self.last_error = str(error)
            return [(peer, error_frames(error.code, str(error)))]
        op[1].add(time.perf_counter_ns() - start)
        return replies


    def _hello(self, peer, header, columns, arrays):
        t = self.config.table
        info = {"version": 1, "kind": t.kind, "capacity": t.capacity, "obs_shape": list(t.observation_shape),
                "obs_dtype": t.obs_dtype, "frame_stack": t.frame_stack, "streams": t.streams, "n_step": t.n_step,
                "gamma": t.gamma,
                "insert": [[c.dtype.name, list(c.shape)] for c in self.schema],
                "action_dtype": t.action_dtype, "action_shape": list(t.action_shape),
                "prioritized": bool(self.table.prioritized), "alpha": t.alpha, "beta": t.beta,
                "beta_final": t.beta_final, "beta_steps": t.beta_steps,
                "ratio": None if self.config.ratio is None else vars(self.config.ratio),
                "max_chunk_rows": self.config.max_chunk_rows, "max_batch": self.config.max_batch,
                "checkpoints": self.config.checkpoint_dir is not None}
        return [(peer, info_frames(json.dumps(info)))]

    def _ack(self, peer, writer: int, seq: int) -> tuple:
        return (peer, pack(Header(Op.ACK, writer=writer, seq=seq, arg0=self.credit.get(writer, 0),
                                  arg1=self.durable.get(writer, 0))))

    def _writer(self, peer, header, columns, arrays):
        if header.writer == 0:
            raise WireError(ErrorCode.BAD_VALUE, "writer id 0 is reserved")
        self.acked.setdefault(header.writer, 0)
        return [self._ack(peer, header.writer, self.acked[header.writer])]

    def _insert(self, peer, header, columns, arrays):
        writer, seq, rows = header.writer, header.seq, header.rows
        if writer == 0 or seq == 0:
            raise WireError(ErrorCode.BAD_VALUE, "insert needs a writer id and a sequence number > 0")
        if not 1 <= rows <= self.config.max_chunk_rows:
            raise WireError(ErrorCode.TOO_LARGE, f"insert of {rows} rows (1..{self.config.max_chunk_rows})")
        check_columns(columns, self.schema, "insert")
        if header.arg0 > 1 << 40:
            raise WireError(ErrorCode.TOO_LARGE, f"insert commits {header.arg0} env steps")
        ack = not header.flags & FLAG_NO_ACK
        acked = self.acked.get(writer, 0)
        if seq <= acked:  # a resend of a chunk already stored: acknowledge, do not store again
            self.counts["duplicates"] += 1
            return [self._ack(peer, writer, acked)] if ack else []
        if seq != acked + 1:
            raise WireError(ErrorCode.SEQUENCE_GAP, f"writer {writer}: chunk {seq} after {acked} "
                                                    f"(resend from {acked + 1})")
        steps = int(header.arg0)
        if self.config.ratio is not None and steps > self.credit.get(writer, 0):
            raise WireError(ErrorCode.NO_CREDIT, f"writer {writer}: {steps} env steps over its credit "
                                                 f"{self.credit.get(writer, 0)}")
        limiter = self.table.rate_limiter
        if limiter is not None and not limiter.can_insert(rows):
            raise WireError(ErrorCode.RATE_LIMITED, f"insert of {rows} refused by the rate limiter: retry")
        if self.snapshot is not None and not self.snapshot.frames:  # (a frame table's add keeps its own)
            self.snapshot.before_write(self.table.cursor, rows)
        if type(arrays) is tuple:  # an inline chunk: one compiled copy from the frame into the ring
            self.table.add_frame(*arrays, rows)
        else:
            self.table.add(*arrays)
        self.acked[writer] = seq
        self.env_steps += steps
        self.writer_steps[writer] = self.writer_steps.get(writer, 0) + steps
        self.table.progress = self.env_steps
        if self.config.ratio is not None:
            self.credit[writer] -= steps
        self.counts["inserts"] += 1
        self.counts["rows_inserted"] += rows
        replies = [self._ack(peer, writer, seq)] if ack else []
        if self.waiting_samples:
            replies += self._serve_waiting()
        return replies

    def _credit(self, peer, header, columns, arrays):
        writer, need = header.writer, int(header.arg0)
        if self.config.ratio is None:
            self.acked.setdefault(writer, 0)
            return [self._ack(peer, writer, self.acked[writer])]
        r = self.config.ratio
        if writer == 0 or need < 0 or need > r.max_lag / r.updates_per_step:
            raise WireError(ErrorCode.BAD_VALUE, f"credit of {need} env steps (0..{int(r.max_lag / r.updates_per_step)}"
                                                 f" with max_lag {r.max_lag}: send smaller chunks)")
        self.acked.setdefault(writer, 0)
        if need == 0:  # a writer done gives its credit back: held, it would shrink the others' window for good
            self.credit.pop(writer, None)
            self.waiting_credit.pop(writer, None)
            return [self._ack(peer, writer, self.acked[writer])] + self._grant_waiting()
        if self._grant(writer, need):
            return [self._ack(peer, writer, self.acked[writer])]
        self.waiting_credit[writer] = (peer, need)
        return []

    def _parse_update(self, header, columns, arrays, what):
        if len(columns) != 2:
            raise WireError(ErrorCode.BAD_COLUMN, f"{what}: {len(columns)} columns (expected indices, |td|)")
        rows = header.rows
        if rows > self.config.max_batch:
            raise WireError(ErrorCode.TOO_LARGE, f"{what} of {rows} rows (at most {self.config.max_batch})")
        if columns[1].dtype not in (np.float32, np.float64):
            raise WireError(ErrorCode.BAD_COLUMN, f"column 1: |td| as {columns[1].dtype} (float32 or float64)")
        check_columns(columns, UPDATE_FLOAT32 if columns[1].dtype == np.float32 else UPDATE_FLOAT64, what)
        indices, td = arrays
        if rows:
            bad = _check_update(indices, td, self._index_bound())
            if bad == 1:
                raise WireError(ErrorCode.BAD_VALUE, f"{what}: non-finite priority")
            if bad == 2:
                raise WireError(ErrorCode.BAD_VALUE, f"{what}: negative |td| {float(td.min())}")
            if bad == 3:
                raise WireError(ErrorCode.BAD_VALUE, f"{what}: index outside [0, {self._index_bound()})")
        return indices, td

    def _index_bound(self) -> int:
        """Sampled indices lie below this: a ring's stored rows, a frame table's slots (one ring per
        stream, each filling from its own start)."""
        return self.table.capacity if self.config.table.frame_stack else self.table.size

    def _apply_update(self, indices, td) -> None:
        if len(indices):
            self.table.update_priorities(indices, td)
            self.counts["updates"] += 1

    def _update(self, peer, header, columns, arrays):
        self._apply_update(*self._parse_update(header, columns, arrays, "update"))
        return [(peer, pack(Header(Op.ACK)))]

    def _check_batch(self, batch: int) -> None:
        if not 1 <= batch <= self.config.max_batch:
            raise WireError(ErrorCode.TOO_LARGE, f"sample of {batch} rows (1..{self.config.max_batch})")

    def _sample(self, peer, header, columns, arrays):
        if columns:
            raise WireError(ErrorCode.BAD_COLUMN, f"sample: {len(columns)} columns (expected none)")
        self._check_batch(int(header.arg0))
        return self._sample_or_wait(peer, header)

    def _update_sample(self, peer, header, columns, arrays):
        update = self._parse_update(header, columns, arrays, "update")
        self._check_batch(int(header.arg0))
        self._apply_update(*update)  # the previous batch's priorities land before this batch is drawn
        return self._sample_or_wait(peer, header)

    def _allowed(self, batch: int) -> bool:
        if self.config.ratio is not None and self.updates >= self.due:
            return False
        limiter = self.table.rate_limiter
        return limiter is None or limiter.can_sample(batch)

    def _sample_or_wait(self, peer, header):
        if not self._allowed(int(header.arg0)):
            self.waiting_samples.append((peer, header))
            return []
        if not self.table.size:
            raise WireError(ErrorCode.BAD_VALUE, "sample from an empty table")
        return [self._draw(peer, header)] + self._grant_waiting()

    def _draw(self, peer, header) -> tuple:
        batch = self.table.sample(int(header.arg0), self.rng)
        if self.config.ratio is not None:
            self.max_lag_seen = max(self.max_lag_seen, self.due - self.updates)
            self.updates += 1
        self.counts["samples"] += 1
        self.counts["rows_sampled"] += len(batch.indices)
        columns = [batch.obs, batch.actions, batch.rewards, batch.next_obs, batch.discounts, batch.indices,
                   batch.weights if batch.weights is not None else np.ones(len(batch.indices), np.float32)]
        reply = Header(Op.BATCH, rows=len(batch.indices), arg0=self.env_steps, arg1=self.updates)
        if header.flags & FLAG_MASSES:
            masses, total, least = selector_masses(self.table, batch.indices)
            beta = float(getattr(self.table, "beta", 0.0))
            columns += [masses, np.array([[total, least, beta, self.table.size, self.env_steps]], np.float64)]
        else:
            packer = self._reply_packer(reply.rows, columns)
            if packer is not None:
                return (peer, packer.pack(reply, columns))  # one bytes frame: a copy of the table's buffers
        # the table reuses its sample buffers on the next draw: the server's send copies every frame
        # (ReplayServer._send, copy=True) before this thread draws again, so no copy here (a fresh
        # bytes object per MB-sized column faulted its pages in: 4 ms a 32 x 4 x 84 x 84 batch, 1 ms without)
        return (peer, pack(reply, [c if c.flags.c_contiguous else self._staged(k, c) for k, c in enumerate(columns)]))

    def _staged(self, k: int, column: np.ndarray) -> np.ndarray:
        """Strided column k of a reply (a frame table's obs and next obs: views of its windows)
        copied into a contiguous array kept for its place and shape: a fresh one per reply would
        fault its pages in each time. The send copies it, before the next draw."""
        key = (k, column.shape, column.dtype.str)
        buffer = self._staging.get(key)
        if buffer is None:
            if len(self._staging) >= 64:  # a learner uses one or two batch sizes: no unbounded cache
                self._staging.clear()
            buffer = self._staging[key] = np.empty(column.shape, column.dtype)
        np.copyto(buffer, column)
        return buffer

    def _reply_packer(self, rows: int, columns) -> Packer | None:
        """The Packer of BATCH replies of `rows` rows (the table's sample outputs keep their dtypes
        and shapes), or None where pack() must do: columns not C-contiguous, or over one inline frame."""
        if rows not in self._packers:
            try:
                packer = Packer(columns)
            except ValueError:
                packer = None
            if len(self._packers) >= 64:  # a learner uses one or two batch sizes: no unbounded cache
                return packer
            self._packers[rows] = packer
        return self._packers[rows]

    def sample_here(self, batch_size: int, update=None):
        """A batch for a learner in the server's own process (the Ray runtime's, which hosts the
        server around its table): the same ratio bookkeeping as a SAMPLE request, without the
        socket. `update`: the previous batch's (indices, |td|), applied first. None if the ratio
        (or the table's rate limiter) does not allow an update now. The credit replies it frees
        go to `outbox`, which the server thread sends (ReplayServer.wake). Call under the server's lock."""
        if update is not None:
            self._apply_update(*update)
        if not self._allowed(batch_size) or not self.table.size:
            return None
        batch = self.table.sample(batch_size, self.rng)
        if self.config.ratio is not None:
            self.max_lag_seen = max(self.max_lag_seen, self.due - self.updates)
            self.updates += 1
        self.counts["samples"] += 1
        self.counts["rows_sampled"] += len(batch.indices)
        self.outbox += self._grant_waiting()
        return batch

    def update_priorities_here(self, indices, td) -> None:
        """A priority update from a learner in this process (under the server's lock)."""
        self._apply_update(indices, td)

    def undo_sample(self) -> None:
        """A drawn batch could not be delivered (its learner left): it does not count as an update.
        (A table rate limiter's record of it stays: pearl.replay.RateLimiter has no un-record.)"""
        self.counts["samples"] -= 1
        self.counts["undelivered"] = self.counts.get("undelivered", 0) + 1
        if self.config.ratio is not None:
            self.updates -= 1

    def _serve_waiting(self) -> list:
        replies = []
        while self.waiting_samples and self._allowed(int(self.waiting_samples[0][1].arg0)):
            peer, header = self.waiting_samples.popleft()
            replies.append(self._draw(peer, header))
        return replies + (self._grant_waiting() if replies else [])

    def _grant_waiting(self) -> list:
        replies = []
        for writer, (peer, need) in list(self.waiting_credit.items()):
            if self._grant(writer, need):
                del self.waiting_credit[writer]
                replies.append(self._ack(peer, writer, self.acked[writer]))
        return replies

    def stats(self) -> dict:
        stats = {"size": int(self.table.size), "capacity": int(self.table.capacity),
                 "env_steps": self.env_steps, **self.counts, "rejected_by_code": dict(self.rejected_by_code),
                 "last_error": self.last_error, "writers": {str(k): v for k, v in self.acked.items()},
                 "writer_steps": {str(k): v for k, v in self.writer_steps.items()},
                 "latency": {k: v.summary() for k, v in self.latency.items() if v.count},
                 "waiting_samples": len(self.waiting_samples), "waiting_credit": len(self.waiting_credit)}
        if self.table.size:
            _, total, least = selector_masses(self.table, np.zeros(0, np.int64))
            stats.update(total_mass=total, min_mass=least)
        if self.config.ratio is not None:
            stats.update(updates=self.updates, updates_due=self.due, max_lag_seen=self.max_lag_seen,
                         max_lag=self.config.ratio.max_lag, credit={str(k): v for k, v in self.credit.items()})
        if self.snapshot is not None:
            stats["checkpoint_in_progress"] = True
        return stats

    def _stats(self, peer, header, columns, arrays):
        return [(peer, info_frames(json.dumps(self.stats())))]

    def _checkpoint(self, peer, header, columns, arrays):
        if self.config.checkpoint_dir is None:
            raise WireError(ErrorCode.BAD_VALUE, "this server has no checkpoint_dir")
        from pearl.server.checkpoint import start_checkpoint

        if self.snapshot is not None:
            self.snapshot.join()  # one at a time
        self.snapshot = start_checkpoint(self, peer)
        return []  # the reply goes out when the snapshot is on disk (ReplayServer polls `finished`)
