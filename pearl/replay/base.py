"""Transition storage in preallocated numpy rings, and the interface every replay implements."""
from __future__ import annotations

import threading
from abc import ABC, abstractmethod

import numpy as np

from pearl.contracts import Batch  # noqa: F401 (the replays' modules take it from here)
from pearl.kernels.cpu.fast_storage import RowRing
from pearl.replay.rate_limiter import RateLimiter, RateLimitExceeded


FIELDS = ("obs", "actions", "rewards", "next_obs", "discounts")


def admit_insert(rate_limiter: RateLimiter | None, count: int) -> None:
    """Records an insert of `count` with the table's rate limiter, or raises if it refuses."""
    if rate_limiter is not None:
        if not rate_limiter.can_insert(count):
            raise RateLimitExceeded(f"insert of {count} refused: the learner is behind "
                                    f"(samples/insert {rate_limiter.samples_per_insert})")
        rate_limiter.record_insert(count)


def admit_sample(rate_limiter: RateLimiter | None, batch_size: int) -> None:
    """Records a sample of `batch_size` with the table's rate limiter, or raises if it refuses."""
    if rate_limiter is not None:
        if not rate_limiter.can_sample(batch_size):
            raise RateLimitExceeded(f"sample of {batch_size} refused: the learner is ahead "
                                    f"(samples/insert {rate_limiter.samples_per_insert})")
        rate_limiter.record_sample(batch_size)


class CopyOnWriteBlocks(ABC):
    """Rows of a table as they were when taken, in `blocks` blocks of `block_rows` rows, each read
    once (`block`) while writes go on: a writer first calls `save_first` with the blocks it is
    about to change, which are copied then if they were not read yet. Reads and copies hold
    `lock`, so a write waits for one block's copy at most. Subclasses say what a block is (`_copy`)."""

    def __init__(self, blocks: int, block_rows: int):
        self.blocks, self.block_rows = blocks, block_rows
        self.pending, self.saved = set(range(blocks)), {}
        self.lock = threading.Lock()
        self.copied_first = 0  # blocks copied before a write changed them

    def block(self, block: int):
        """Block `block`'s rows (from row block x block_rows), as they were."""
        with self.lock:
            if block in self.saved:
                rows = self.saved.pop(block)
            else:
                self.pending.remove(block)
                rows = self._copy(block)
        if not self.pending:
            self._all_copied()
        return rows

    def save_first(self, blocks) -> None:
        """Copies those of `blocks` not read yet, before a write changes them."""
        with self.lock:
            for block in blocks:
                if block in self.pending:
                    self.saved[block] = self._copy(block)
                    self.pending.remove(block)
                    self.copied_first += 1
        if not self.pending:
            self._all_copied()

    @abstractmethod
    def _copy(self, block: int):
        """A copy of block `block`'s rows."""

    def _all_copied(self) -> None:
        """Every block is copied or read: writes can no longer change what is left to read."""


class Replay(ABC):
    """A ring of `capacity` transitions. Subclasses choose which indices `sample` returns.

    `add` takes a batch of transitions (leading axis = count) and overwrites the oldest on
    wrap-around. `sample` gathers into preallocated arrays that the next `sample` reuses, so a
    caller that keeps a batch must copy it.
    """

    prioritized = False
    progress = 0  # env steps so far; schedules (e.g. prioritized replay's beta) read it

    def __init__(self, capacity: int, obs_dim: int | tuple, action_dtype=np.int64, action_shape=(),
                 rate_limiter: RateLimiter | None = None, obs_dtype=np.float32):
        # `obs_dim`: a vector's length, or an observation's shape (an image: (4, 84, 84)); the
        # observations are stored in `obs_dtype` as given (uint8 frames stay uint8: the network's
        # input converts them)
        self.capacity = capacity
        self.rate_limiter = rate_limiter
        self.obs_shape = (int(obs_dim),) if np.ndim(obs_dim) == 0 else tuple(int(d) for d in obs_dim)
        self.obs_dim = int(np.prod(self.obs_shape))
        self.obs_dtype = np.dtype(obs_dtype)
        # one row per transition (kernels/cpu/fast_storage.py); `storage[name]` are numpy views
        self._ring = RowRing(capacity, self.layout(self.obs_shape, self.obs_dtype, action_dtype, action_shape))
        self.cursor = 0  # next slot to write
        self.size = 0
        self.inserted = 0  # transitions ever inserted

    @property
    def storage(self) -> dict[str, np.ndarray]:
        return self._ring.fields

    @staticmethod
    def layout(obs_shape: tuple, obs_dtype, action_dtype, action_shape) -> tuple:
        """A transition's row: (name, dtype, shape) of each field."""
        return (("obs", obs_dtype, tuple(obs_shape)), ("actions", action_dtype, tuple(action_shape)),
                ("rewards", np.float32, ()), ("next_obs", obs_dtype, tuple(obs_shape)), ("discounts", np.float32, ()))

    @classmethod
    def bytes_needed(cls, capacity: int, obs_shape: tuple, obs_dtype, action_dtype, action_shape) -> int:
        """The bytes a table of `capacity` transitions allocates for them (the selector's apart)."""
        return RowRing.bytes_needed(capacity, cls.layout(obs_shape, obs_dtype, action_dtype, action_shape))

    def __len__(self) -> int:
        return self.size

    def add(self, obs, actions, rewards, next_obs, discounts) -> np.ndarray:
        """Inserts a batch; returns the slots written."""
        count = len(rewards)
        if self.rate_limiter is not None:
            admit_insert(self.rate_limiter, count)
        start = self.cursor
        self._ring.insert(start, count, (obs, actions, rewards, next_obs, discounts))
        self._advance(count)
        slots = np.arange(start, start + count)
        return slots if start + count <= self.capacity else slots % self.capacity

    @property
    def takes_frames(self) -> bool:
        """Whether add_frame applies: every field of a row is whole 4-byte words."""
        return self._ring.word_rows

    def add_frame(self, frame: np.ndarray, offsets: np.ndarray, count: int) -> None:
        """add() of `count` transitions lying in one block of bytes (a replay server's INSERT
        message, an actor channel's shared memory): the fields, in order, each exactly its stored
        dtype and shape in C order, start at byte `offsets` (multiples of 4) of `frame` (uint8);
        one compiled copy into the ring, no array per field. Only when `takes_frames`."""
        if self.rate_limiter is not None:
            admit_insert(self.rate_limiter, count)
        self._ring.insert_frame(self.cursor, count, frame, offsets)
        self._advance(count)

    def _advance(self, count: int) -> None:
        self.cursor = (self.cursor + count) % self.capacity
        self.size = min(self.size + count, self.capacity)
        self.inserted += count

    def gather(self, indices: np.ndarray) -> dict[str, np.ndarray]:
        return dict(zip(FIELDS, self._ring.gather(indices)))

    def sample(self, batch_size: int, rng: np.random.Generator) -> Batch:
        """A batch of `batch_size` stored transitions, chosen by this replay's selector."""
        if not self.size:
            raise ValueError("cannot sample from an empty replay")
        if self.rate_limiter is not None:
            admit_sample(self.rate_limiter, batch_size)
        return self._select(batch_size, rng)

    @abstractmethod
    def _select(self, batch_size: int, rng: np.random.Generator) -> Batch:
        """The selector: which stored transitions make up the batch."""

    def update_priorities(self, indices: np.ndarray, td_errors: np.ndarray) -> None:
        """Uniform replays ignore priorities; prioritized ones override this."""

    def state_dict(self, detached: bool = False) -> dict:
        """The table's state: its stored rows are views of the table, not a copy (the run's
        checkpoint writes them before the next insert), unless `detached` (for a caller that keeps
        the state while rows are written)."""
        state = {"storage": {k: v[:self.size].copy() if detached else v[:self.size] for k, v in self.storage.items()},
                 "cursor": self.cursor, "size": self.size, "inserted": self.inserted}
        if self.rate_limiter is not None:
            state["rate_limiter"] = self.rate_limiter.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        size = int(state["size"])
        for name, values in state["storage"].items():
            self.storage[name][:size] = values
        self.cursor, self.size, self.inserted = int(state["cursor"]), size, int(state["inserted"])
        if self.rate_limiter is not None and "rate_limiter" in state:
            self.rate_limiter.load_state_dict(state["rate_limiter"])
