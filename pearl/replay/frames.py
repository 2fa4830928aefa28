"""A replay table for stacked-frame observations (Atari's 4 x 84 x 84) that stores each frame once.

A transition's obs is a stack of `stack` frames, oldest first, and its next obs shares all but
one (n-step: all but n) of them; storing both stacks costs 2 x stack copies of every frame. Here
each env stream appends one record per step: the newest frame of the observation it acted on,
the action, the reward and how the step ended. At sample time the compiled gather
(kernels/cpu/frame_storage.py) assembles obs and next obs from the records, and the n-step return
and discount from the rewards in between. Memory: one frame per env step (plus one per episode,
its first observation), and a few bytes of metadata per record.

Semantics (the same as the actor's n-step transitions of flat observations, pearl/replay/nstep.py):

- obs of step t is the stack of frames t - stack + 1 .. t of its episode; where that reaches
  before the episode's first frame, the first frame is repeated, as gymnasium's
  `FrameStackObservation(env, stack, padding_type="reset")` (its default) does after a reset.
- the transition from step t has next obs = the stack ending at step t + k and return
  R = sum_{j<k} gamma^j r_{t+j}, with k = n, or the steps left to the episode's end if fewer;
  discount 0 if the episode terminated within them, else gamma^k (a truncated episode
  bootstraps from its final observation, which is stored for that).
- several env streams (an actor's envs, several actors) write into one table, each into its own
  ring of capacity // streams records, so a stream's frames stay in order whatever the others do.
- a transition can be sampled from the moment its next obs is stored (n steps later, or at the
  episode's end) until a frame it reads is overwritten: when a record is overwritten, the
  transitions whose stacks reach back to it leave the selector at once (priority 0 in the sum
  tree or AMPER), so no sample ever mixes frames of different times.

Selectors: "uniform" (uniform over the valid transitions, each drawn on its own with
replacement as in the flat uniform table: a stored record picked at random, kept if it is a
valid transition's, else a draw from a sum tree of 0/1 leaves, which is exact:
frame_storage.draw_uniform), "prioritized" (the compiled sum tree, its numpy reference or another
backend's tree, pearl/replay/prioritized.py; stratified) and "amper".

Writers call `add(streams, obs, actions, rewards, next_obs, terminated, truncated)` once per env
step batch: one row per env; obs and next_obs either the full stacked observations (the table
reads their last frame) or just those newest frames. next_obs is always stored; obs is read only
where a stream begins an episode (its first step, or the step after one that ended), as the
stream's other observations are earlier steps' next_obs. A writer that takes a stream over
(an actor process started or restarted, a resumed run) writes its first step's stream id as ~s
(negative): its episode begins there, and the one the stream's previous writer left unfinished
keeps what it completed (its last n - 1 transitions never complete). No n-step accumulation on
the writer's side: the table does it, and a transition becomes sampleable at the step that
completes it, as with the actors' NStepBuffer.
"""
from __future__ import annotations

from functools import partial

import numpy as np

from pearl.contracts import ReplayTable, implements
from pearl.kernels.cpu import compiled_entry, frame_storage, start_numba_pool, torch_threads_kept
from pearl.kernels.cpu.fast_sumtree import NumbaSumTree
from pearl.kernels.cpu.fast_per import NO_MASS
from pearl.kernels.cpu.fast_storage import importance_weights
from pearl.kernels.cpu.frame_storage import FrameRecords, any_left, draw_uniform, insert_steps
from pearl.replay.base import Batch, CopyOnWriteBlocks, admit_insert, admit_sample
from pearl.replay.prioritized import annealed_beta, make_priority_sampler
from pearl.replay.rate_limiter import RateLimiter

# the gathers on 2 threads (gather_threads) start a numba parallel region (the samples' too: `outputs`)
gather_transitions, gather_windows = (
    torch_threads_kept(kernel) for kernel in (frame_storage.gather_transitions, frame_storage.gather_windows))
# the kernels' records of a table whose selector is not the compiled tree (its tree fields go
# unread): arrays of the compiled tree's types, so the records' type and compiled kernels are one
_NO_TREE = np.zeros(0), np.zeros(0), np.zeros(0), np.zeros(0, np.int64), 0, 2, np.zeros(0, np.int64)

KINDS = ("uniform", "prioritized", "amper")
_INT64, _FLOAT32, _BOOL = np.dtype(np.int64), np.dtype(np.float32), np.dtype(np.bool_)


def _column(values, dtype: np.dtype, count: int) -> np.ndarray:
    """One value per row as a 1-d array of `dtype` (count -1: any length); an array that already
    is one passes as it is (an actor's step batch: ~0.1 us, not the ~0.5 of a conversion), and a
    converted one is reshaped only if it must be (a reshape is ~0.25 us of an insert's ~9)."""
    if type(values) is not np.ndarray or values.dtype is not dtype:
        values = np.asarray(values, dtype=dtype)
    if values.ndim == 1 and (count < 0 or values.shape[0] == count):
        return values
    return values.reshape(count)


def stored_slots(counts, length: int) -> np.ndarray:
    """The slots that hold records, stream after stream (a checkpoint's rows): stream s's ring
    fills slots s x length, s x length + 1, ... and stays full once it has wrapped."""
    filled = np.minimum(np.asarray(counts, np.int64), length)
    return np.concatenate([np.empty(0, np.int64)] + [s * length + np.arange(f) for s, f in enumerate(filled)])


@implements(ReplayTable)
class FrameReplay:
    """Stacked-frame transitions of `streams` env streams, each frame stored once."""

    progress = 0

    def __init__(self, capacity: int, frame_shape: tuple, stack: int, streams: int = 1, n_step: int = 1,
                 gamma: float = 0.99, kind: str = "uniform", frame_dtype=np.uint8, action_dtype=np.int64,
                 action_shape=(), alpha: float = 0.6, beta: float = 0.4, beta_final: float = 1.0,
                 beta_steps: int = 1, priority_eps: float = 1e-6, backend: str = "auto", fanout: int = 16,
                 rate_limiter: RateLimiter | None = None, gather_threads: int = 1):
        if kind not in KINDS:
            raise ValueError(f"frame replay kind {kind!r}: expected one of {KINDS}")
        if not (1 <= stack <= 256 and n_step >= 1 and streams >= 1):  # `back` is a uint8 below stack
            raise ValueError(f"frame replay needs 1 <= stack <= 256, n_step and streams >= 1, got {stack}, "
                             f"{n_step}, {streams}")
        if gather_threads not in (1, 2):
            raise ValueError(f"frame replay gather_threads: 1 or 2, got {gather_threads!r}")
        self.gather_threads = gather_threads
        self.length = capacity // streams  # records per stream (capacity rounds down to streams x length)
        if self.length < stack + n_step:
            raise ValueError(f"frame replay capacity {capacity} leaves {self.length} records per stream "
                             f"for {streams} streams; a transition reads stack + n_step = {stack + n_step}")
        self.capacity = self.length * streams
        self.streams, self.stack, self.n_step, self.gamma = streams, stack, n_step, gamma
        self.frame_shape, self.frame_dtype = tuple(frame_shape), np.dtype(frame_dtype)
        self.obs_shape = (stack, *self.frame_shape)
        self.action_dtype, self.action_shape = np.dtype(action_dtype), tuple(action_shape)
        self.kind, self.prioritized = kind, kind != "uniform"
        self.rate_limiter = rate_limiter
        self.alpha, self.beta0, self.beta_final = alpha, beta, beta_final
        self.beta_steps, self.priority_eps = max(1, beta_steps), priority_eps
        frame_bytes = self.frame_bytes(self.frame_shape, self.frame_dtype)
        action_items = int(np.prod(self.action_shape, dtype=np.int64))
        # np.zeros maps untouched pages lazily: memory grows with the frames written; numpy madvises
        # it for huge pages, so random frame reads of a GB table miss the TLB far less (~10%, measured)
        self._frames = np.zeros((self.capacity, frame_bytes), np.uint8)
        self._actions = np.zeros((self.capacity, action_items), self.action_dtype)
        self._rewards = np.zeros(self.capacity, np.float32)
        self._ends = np.zeros(self.capacity, np.uint8)
        self._back = np.zeros(self.capacity, np.uint8)
        self._valid = np.zeros(self.capacity, np.uint8)
        self._marks = np.zeros(self.capacity, np.int64)
        self._counts = np.zeros(streams, np.int64)  # records written per stream
        self._episode_start = np.zeros(streams, np.int64)
        self._starting = np.ones(streams, np.bool_)  # the stream's next step begins an episode
        self._state = np.zeros(2, np.int64)  # valid transitions, the kernel's listing stamp
        self._changed, self._changed_priorities = np.empty(0, np.int64), np.empty(0, np.float64)
        self._powers = gamma ** np.arange(n_step + 1, dtype=np.float64)
        self.inserted = 0  # env steps ever inserted (one transition each)
        self.backend, self.fanout = backend, fanout
        self._set_selector(self._new_selector())
        self.max_priority = 1.0
        self._snapshots: list[FrameSnapshot] = []  # being written: `add` keeps their frames as they were

    def _new_selector(self):
        """A uniform table's selector is the compiled tree with 0/1 priorities (valid or not): the
        draw of the few first tries that miss (frame_storage.draw_uniform)."""
        if self.kind == "uniform":
            return NumbaSumTree(self.capacity, self.fanout)
        return make_priority_sampler("amper" if self.kind == "amper" else self.backend, self.capacity, self.fanout)

    def __getstate__(self):
        # the outputs' obs and next obs are views of one window buffer: made again in a copy, which
        # also has no snapshot of its own being written
        # (and the kernels' records, which hold the arrays by reference: made again from the copy's)
        state = {**self.__dict__, "_outputs": {}, "_snapshots": []}
        del state["_records"]
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._set_selector(self.tree)

    def _set_selector(self, tree) -> None:
        self.tree = tree
        self._compiled = isinstance(tree, NumbaSumTree)
        self._amper = hasattr(tree, "sample_with_probabilities")
        tree_arrays = (*tree._arrays(), tree._marks) if self._compiled else _NO_TREE
        self._records = FrameRecords(self._frames, self._actions, self._rewards, self._ends, self._back, self._valid,
                                     self._counts, self._episode_start, self._starting, self._state, self._marks,
                                     self.length, self.stack, self.n_step, self._powers, *tree_arrays)
        self._outputs: dict[int, tuple] = {}  # (their compiled samples hold the records)

    # -- reads
    @property
    def size(self) -> int:
        """Transitions that may be sampled now."""
        return int(self._state[0])

    def __len__(self) -> int:
        return self.size

    @property
    def beta(self) -> float:
        return annealed_beta(self.beta0, self.beta_final, self.beta_steps, self.progress)

    @property
    def frames(self) -> np.ndarray:
        """The stored frames, (capacity, *frame_shape): stream s's record T is row s * length + T % length."""
        return self._frames.view(self.frame_dtype).reshape(self.capacity, *self.frame_shape)

    def valid_indices(self) -> np.ndarray:
        return np.flatnonzero(self._valid)

    # -- writes
    def _rows(self, values, name: str, count: int) -> np.ndarray:
        """A step batch's frames as (count, frame bytes) rows, without a copy where possible."""
        if type(values) is not np.ndarray:
            values = np.asarray(values)
        if values.ndim == len(self.obs_shape) + 1:  # full stacks: the newest frame
            values = values[:, -1]
        if values.shape[0] != count or values.shape[1:] != self.frame_shape:
            raise ValueError(f"frame replay {name}: expected {count} frames of shape {self.frame_shape} "
                             f"(or stacks of {self.obs_shape}), got {values.shape}")
        if values.dtype is not self.frame_dtype and values.dtype != self.frame_dtype:
            values = values.astype(self.frame_dtype)
        if not (values.flags.c_contiguous or values[0].flags.c_contiguous):  # (rows may sit apart: a stack's newest)
            values = np.ascontiguousarray(values)
        values = values.reshape(count, -1)
        return values if values.dtype == np.uint8 else values.view(np.uint8)

    def add(self, streams, obs, actions, rewards, next_obs, terminated, truncated) -> np.ndarray:
        """One env step per row: stream ids, observations acted on (read where a stream begins an
        episode), actions, rewards, next observations, terminated, truncated. Returns the slots
        whose transitions became sampleable or left."""
        streams = _column(streams, _INT64, -1)
        count = streams.shape[0]
        if self.rate_limiter is not None:
            admit_insert(self.rate_limiter, count)
        if not count:  # (a replay server's warm-up inserts nothing)
            return self._changed[:0]
        for snapshot in self._snapshots:
            snapshot.before_add(streams)
        obs_rows, next_rows = self._rows(obs, "obs", count), self._rows(next_obs, "next_obs", count)
        actions = np.asarray(actions, dtype=self.action_dtype).reshape(count, -1)
        rewards = _column(rewards, _FLOAT32, count)
        terminated, truncated = _column(terminated, _BOOL, count), _column(truncated, _BOOL, count)
        need = 2 * count * (self.stack + self.n_step + 1)
        if self._changed.shape[0] < need:
            size = max(need, 2 * self._changed.shape[0])
            self._changed, self._changed_priorities = np.empty(size, np.int64), np.empty(size, np.float64)
        top = self.max_priority ** self.alpha if self.prioritized else 1.0
        changed = self._changed
        nodes = self.tree._nodes(changed.shape[0]) if self._compiled else changed
        filled = insert_steps(self._records, streams, obs_rows, actions, rewards, next_rows, terminated, truncated,
                              changed, top, self._changed_priorities, nodes, self._compiled)
        if filled < 0:
            stream = streams[-filled - 1]
            stream = stream if stream >= 0 else ~stream  # (~s: a new writer's first step)
            raise IndexError(f"frame replay stream {stream} out of range [0, {self.streams})")
        self.inserted += count
        changed = changed[:filled]
        if filled and not self._compiled:
            self.tree.update(changed, self._changed_priorities[:filled])
        return changed

    def load_frames(self, first: int, rows: np.ndarray) -> None:
        """Frames of rows first, first + 1, ... of a state loaded without them (a ray shard's,
        sent by the run a bounded call at a time: pearl/runtime/ray_replay.py)."""
        self._frames[stored_slots(self._counts, self.length)[first:first + len(rows)]] = rows

    @staticmethod
    def frame_bytes(frame_shape: tuple, frame_dtype) -> int:
        return np.dtype(frame_dtype).itemsize * int(np.prod(frame_shape, dtype=np.int64))

    @classmethod
    def bytes_needed(cls, capacity: int, frame_shape: tuple, frame_dtype, action_dtype, action_shape) -> int:
        """The bytes a table of `capacity` records allocates for them (the selector's apart): a
        record's frame, action, reward, end, back and valid flags and listing mark (`__init__`)."""
        action = np.dtype(action_dtype).itemsize * int(np.prod(action_shape, dtype=np.int64))
        return int(capacity) * (cls.frame_bytes(frame_shape, frame_dtype) + action + 4 + 3 + 8)

    # -- sampling
    def outputs(self, batch: int) -> tuple:
        """(obs, next obs, actions, returns, discounts, indices, weights, priorities, scratch, shaped,
        draws, compiled sample) for a batch size, made once and reused by the next sample of that
        size. With 1-step transitions obs and next obs are views of one window of stack + 1 frames
        per transition (kernels/cpu/frame_storage.py gather_windows): strided, not C-contiguous. `shaped`: obs,
        actions and next obs as the Batch hands them out, views made here once (making them per
        sample cost ~2.5 us of a ~50 us sample of 32, measured). `draws`: the sample's uniforms,
        (2 x batch of them, their first batch), drawn in place (~0.25 us less than new arrays).
        `compiled sample`: `_compiled_sample`'s, or None."""
        prepared = self._outputs.get(batch)
        if prepared is None:
            frame_bytes = self._frames.shape[1]
            if self.n_step == 1:
                windows = np.empty((batch, self.stack + 1, frame_bytes), np.uint8)
                obs, next_obs = windows[:, :self.stack], windows[:, 1:]
            else:
                obs, next_obs = (np.empty((batch, self.stack, frame_bytes), np.uint8) for _ in range(2))
            actions = np.empty((batch, self._actions.shape[1]), self.action_dtype)
            shaped = (self._as_obs(obs), actions.reshape(-1, *self.action_shape), self._as_obs(next_obs))
            draws = np.empty(2 * batch)
            prepared = (obs, next_obs, actions, np.empty(batch, np.float32), np.empty(batch, np.float32),
                        np.empty(batch, np.int64), np.empty(batch, np.float32), np.empty(batch, np.float64),
                        np.empty(batch, np.float64), shaped, (draws, draws[:batch]))
            prepared = self._outputs[batch] = (*prepared, self._compiled_sample(prepared))
        return prepared

    def _compiled_sample(self, prepared: tuple):
        """A 1-step batch's draw and gather as one compiled call, its arguments fixed here, so that
        a sample skips numba's typing of them (kernels/cpu compiled_entry): a uniform table's as a
        call of the gather threads alone (its uniforms drawn into prepared[10][0] first; the
        threads may change between calls, as replay_pixels.py's columns do), a prioritized table's
        with a compiled tree as sample_prioritized's entry (beta changes between calls too).
        None for the others (n-step, another backend's selector)."""
        if self.n_step != 1 or not self._compiled:
            return None
        obs, _, actions, returns, discounts, indices, weights, priorities, scratch = prepared[:9]
        start_numba_pool()  # (the kernels start a parallel region: its pool first)
        if not self.prioritized:
            entry = compiled_entry(frame_storage.sample_uniform, self._records, prepared[10][0], scratch, indices,
                                   obs.base, actions, returns, discounts, self.gather_threads)
            return partial(entry, self._records, prepared[10][0], scratch, indices, obs.base, actions, returns,
                           discounts)
        return compiled_entry(frame_storage.sample_prioritized, self._records, prepared[10][1], scratch, 0.5, indices,
                              priorities, weights, obs.base, actions, returns, discounts, self.gather_threads)

    def gather(self, indices: np.ndarray) -> Batch:
        """The transitions at `indices` (slots of their first records), into the reused outputs."""
        indices = np.ascontiguousarray(indices, dtype=np.int64)
        obs, next_obs, actions, returns, discounts = self.outputs(indices.shape[0])[:5]
        if self.n_step == 1:
            bad = gather_windows(self._frames, self._actions, self._rewards, self._ends, self._back, self.length,
                                 self.stack, self._powers, indices, obs.base, actions, returns, discounts,
                                 self.gather_threads)
        else:
            bad = gather_transitions(self._frames, self._actions, self._rewards, self._ends, self._back,
                                     self.length, self.stack, self.n_step, self._powers, indices, obs, next_obs,
                                     actions, returns, discounts, self.gather_threads)
        if bad >= 0:
            raise IndexError(f"gather index {indices[bad]} out of range for capacity {self.capacity}")
        return self._batch(self._outputs[indices.shape[0]], indices)

    @staticmethod
    def _batch(prepared: tuple, indices: np.ndarray) -> Batch:
        """A Batch of a batch size's gathered outputs: obs and next obs as (B, stack, *frame_shape) views."""
        obs, actions, next_obs = prepared[9]
        return Batch(obs, actions, prepared[3], next_obs, prepared[4], indices)

    def _as_obs(self, rows: np.ndarray) -> np.ndarray:
        """(B, stack, frame bytes) -> (B, stack, *frame_shape) of the frame dtype, a view."""
        return rows.view(self.frame_dtype).reshape(rows.shape[0], self.stack, *self.frame_shape)

    def sample(self, batch_size: int, rng: np.random.Generator) -> Batch:
        if not self._state[0]:  # (self.size, without its property and int: ~0.15 us)
            raise ValueError("cannot sample from an empty replay (no transition is complete yet)")
        admit_sample(self.rate_limiter, batch_size)
        prepared = self.outputs(batch_size)
        obs, next_obs, actions, returns, discounts, indices, weights, priorities, scratch = prepared[:9]
        tree = self.tree
        if not self.prioritized:  # (a uniform table's tree is always the compiled one)
            uniforms = rng.random(out=prepared[10][0])  # a first try each, and a tree draw where it misses
            if self.n_step == 1:  # draw and gather in one compiled call
                if not prepared[11](self.gather_threads):
                    raise ValueError(NO_MASS)
                return self._batch(prepared, indices)
            if not draw_uniform(tree._sums, tree._prefix, tree.offsets, tree.depth, tree.fanout, uniforms, scratch,
                                self._valid, self._counts, self.length, indices):
                raise ValueError(NO_MASS)
            return self.gather(indices)
        uniforms = rng.random(out=prepared[10][1])
        if self._compiled and self.n_step == 1:  # draw, weights and gather in one compiled call
            if not prepared[11](self._records, uniforms, scratch, float(self.beta), indices, priorities, weights,
                                obs.base, actions, returns, discounts, self.gather_threads):
                raise ValueError(NO_MASS)
            batch = self._batch(prepared, indices)
            batch.weights = weights
            return batch
        if self._compiled:
            tree.sample_into(uniforms, indices, priorities)
        elif self._amper:
            indices[:], priorities[:] = tree.sample_with_probabilities(uniforms)
        else:
            if not tree.total > 0:
                raise ValueError(NO_MASS)
            indices[:] = tree.sample(uniforms)
            priorities[:] = tree.get(indices)
        batch = self.gather(indices)
        if self._amper:  # AMPER's own probabilities q_i: weights (q_i / q_min)^-beta
            weights[:] = (priorities / tree.min_probability()) ** -self.beta
        else:
            importance_weights(priorities, tree.total, tree.min(), self.size, self.beta, weights, scratch)
        batch.weights = weights
        return batch

    def update_priorities(self, indices: np.ndarray, td_errors: np.ndarray) -> None:
        if not self.prioritized:
            return
        indices = np.asarray(indices, dtype=np.int64)
        if self._compiled:
            top = self.tree.update_from_td(indices, td_errors, self.alpha, self.priority_eps)
        else:
            priorities = np.abs(np.asarray(td_errors, dtype=np.float64)) + self.priority_eps
            top = float(priorities.max()) if priorities.size else -np.inf
            self.tree.update(indices, priorities ** self.alpha)
        self.max_priority = max(self.max_priority, top)
        if any_left(self._valid, indices):  # overwritten since they were sampled (a concurrent writer)
            self.tree.update(indices[self._valid[indices] == 0], 0.0)

    # -- checkpoints
    # one value per slot: a checkpoint keeps the slots that hold records (`stored_slots`), so a run
    # that has written 3,000 steps into a 1M-frame table saves 21 MB, not the table's 7 GB
    ROWS = ("frames", "actions", "rewards", "ends", "back", "valid")
    _WHOLE = ("counts", "episode_start", "starting", "state")  # per stream, and the kernel's state

    def state_dict(self, detached: bool = False) -> dict:
        """The table's state; once every ring is full (a long run's), its row arrays are the table's
        own, not a copy of its GBs (the run's checkpoint writes them before the next insert), unless
        `detached` (for a caller that keeps the state while records are written)."""
        slots = stored_slots(self._counts, self.length)
        own = len(slots) == self.capacity and not detached
        state = {name: getattr(self, "_" + name) if own else getattr(self, "_" + name)[slots] for name in self.ROWS}
        return {**state, **self._state_beside_rows(slots)}

    def snapshot(self) -> tuple[dict, "FrameSnapshot"]:
        """(a detached state but for its "frames" rows, those rows as a FrameSnapshot): a checkpoint
        written while records go on (the run's, pearl/checkpoint.py; a replay server's,
        pearl/server/checkpoint.py) copies the frames, 99.8% of an Atari table's bytes, block by
        block, instead of a second copy of the table or a pause of the run while it is written."""
        slots = stored_slots(self._counts, self.length)
        state = {name: getattr(self, "_" + name)[slots] for name in self.ROWS if name != "frames"}
        return {**state, **self._state_beside_rows(slots)}, FrameSnapshot(self, slots)

    def _state_beside_rows(self, slots: np.ndarray) -> dict:
        state = {name: getattr(self, "_" + name).copy() for name in self._WHOLE}
        state.update(inserted=self.inserted, max_priority=self.max_priority, progress=self.progress,
                     priorities=self.tree.get(slots))
        if self.rate_limiter is not None:
            state["rate_limiter"] = self.rate_limiter.state_dict()
        return state

    def slots_written(self, streams) -> np.ndarray:
        """The slots whose frames an `add` of steps on these stream ids (~s too) may overwrite: a
        step writes at most two records (an episode's first observation, then its next one) at
        its stream's next slots."""
        streams = np.asarray(streams, np.int64)
        ids, steps = np.unique(np.where(streams < 0, ~streams, streams), return_counts=True)
        written = [s * self.length + (self._counts[s] + np.arange(min(2 * m, self.length))) % self.length
                   for s, m in zip(ids, steps) if 0 <= s < self.streams]
        return np.concatenate(written) if written else np.empty(0, np.int64)

    def load_state_dict(self, state: dict) -> None:
        """A state_dict's. Its "frames" may also be a frame source as a FrameSnapshot (`blocks`,
        `block(k)`), or left out, to come by `load_frames`."""
        for snapshot in list(self._snapshots):  # (a load while a checkpoint is written: rare)
            snapshot.save_all()
        rows = len(state["actions"])
        # a state of every slot (checkpoints before stored_slots; the same rows once every ring is full)
        slots = np.arange(self.capacity) if rows == self.capacity else stored_slots(state["counts"], self.length)
        if len(slots) != rows:
            raise ValueError(f"frame replay state: {rows} records, but its streams' counts store {len(slots)}")
        if self.inserted:  # a table that held records: the slots the state leaves out hold none
            for name in (*self.ROWS, "marks"):
                getattr(self, "_" + name)[...] = 0
        for name in self.ROWS:
            if name != "frames":
                getattr(self, "_" + name)[slots] = state[name]
        frames = state.get("frames")
        if isinstance(frames, np.ndarray):
            self._frames[slots] = frames
        elif frames is not None:  # a frame source read block by block (a ray run's shards' frames: ShardFrames)
            first = 0
            for block in range(frames.blocks):
                rows = frames.block(block)
                self._frames[slots[first:first + len(rows)]] = rows
                first += len(rows)
        for name in self._WHOLE:
            getattr(self, "_" + name)[...] = state[name]
        self.inserted, self.max_priority = int(state["inserted"]), float(state["max_priority"])
        self.progress = int(state["progress"])
        self._set_selector(self._new_selector())
        priorities = np.asarray(state["priorities"])
        stored = np.flatnonzero(priorities > 0)
        self.tree.update(slots[stored], priorities[stored])
        if self.rate_limiter is not None and "rate_limiter" in state:
            self.rate_limiter.load_state_dict(state["rate_limiter"])


SNAPSHOT_BLOCK_BYTES = 2 << 20  # frames a snapshot copies at once: an add waits for one block's copy at most (~1 ms)


class FrameSnapshot(CopyOnWriteBlocks):
    """The frames of a frame table's stored records (`slots`, in that order) as they were when the
    snapshot was taken, read block by block (SNAPSHOT_BLOCK_BYTES) while `add` goes on: before an
    add overwrites a record of a block not read yet, that block is copied first (copy-on-write),
    so a checkpoint written meanwhile holds the frames of the moment its other state was taken."""

    def __init__(self, table: FrameReplay, slots: np.ndarray):
        self.table, self.slots, self.rows = table, slots, len(slots)
        self.dtype, self.row_shape = table._frames.dtype, table._frames.shape[1:]
        block_rows = max(1, SNAPSHOT_BLOCK_BYTES // table._frames.shape[1])
        super().__init__(-(-len(slots) // block_rows), block_rows)
        self.row_of_slot = np.full(table.capacity, -1, np.int64)
        self.row_of_slot[slots] = np.arange(len(slots))
        if self.pending:  # (a new list: see close)
            table._snapshots = [*table._snapshots, self]

    def __len__(self) -> int:
        return self.rows

    def before_add(self, streams) -> None:
        if self.pending:
            rows = self.row_of_slot[self.table.slots_written(streams)]
            self.save_first(np.unique(rows[rows >= 0] // self.block_rows).tolist())

    def save_all(self) -> None:
        """Copies every block not read yet (before the table is overwritten whole)."""
        self.save_first(sorted(self.pending))

    def close(self) -> None:
        """Stops watching the table's adds (the blocks saved stay readable)."""
        # a new list, not a removal: an add in another thread may be iterating the old one
        self.table._snapshots = [other for other in self.table._snapshots if other is not self]

    _all_copied = close

    def _copy(self, block: int) -> np.ndarray:
        return self.table._frames[self.slots[block * self.block_rows:(block + 1) * self.block_rows]]
