"""A rate limiter that keeps samples per insert within a band (Reverb's SampleToInsertRatio idea).

Counts are in transitions: a sampled batch of 64 counts 64. With r = samples_per_insert,
    diff = inserts * r - samples
must stay within [min_diff, max_diff], where
    min_diff = r * min_size_to_sample - error_buffer,  max_diff = r * min_size_to_sample + error_buffer.
Sampling is refused until `min_size_to_sample` transitions were inserted and while it would push
diff below min_diff (the learner is ahead of the actors); inserting is refused while it would push
diff above max_diff (the actors are ahead of the learner). The runtime either asks
(`can_sample` / `can_insert`, for a loop that decides itself what to do next) or waits
(`await_sample` / `await_insert`, for concurrent actors and learners); the replay table records
every insert and sample and raises `RateLimitExceeded` on one the limiter would refuse.
"""
from __future__ import annotations

import threading
import time


class RateLimitTimeout(TimeoutError):
    """`await_*` gave up: the other side made no progress within the timeout."""


class RateLimitExceeded(RuntimeError):
    """A replay was asked to insert or sample beyond the band: the runtime broke the replay ratio."""


class RateLimiter:
    def __init__(self, samples_per_insert: float, min_size_to_sample: int = 1, error_buffer: float | None = None):
        if samples_per_insert <= 0:
            raise ValueError(f"samples_per_insert must be positive, got {samples_per_insert}")
        if min_size_to_sample < 1:
            raise ValueError(f"min_size_to_sample must be >= 1, got {min_size_to_sample}")
        self.samples_per_insert = samples_per_insert
        self.min_size_to_sample = min_size_to_sample
        # Default band: enough slack for one batch either way at any ratio.
        self.error_buffer = max(1.0, samples_per_insert) * min_size_to_sample if error_buffer is None else error_buffer
        if self.error_buffer < 0:
            raise ValueError(f"error_buffer must be >= 0, got {self.error_buffer}")
        self.min_diff = samples_per_insert * min_size_to_sample - self.error_buffer
        self.max_diff = samples_per_insert * min_size_to_sample + self.error_buffer
        self.inserts = 0
        self.samples = 0
        self._changed = threading.Condition()

    @property
    def diff(self) -> float:
        return self.inserts * self.samples_per_insert - self.samples

    def can_sample(self, count: int) -> bool:
        return self.inserts >= self.min_size_to_sample and self.diff - count >= self.min_diff

    def can_insert(self, count: int) -> bool:
        # Before sampling may start, inserting is always allowed (otherwise nothing could begin).
        return self.inserts + count <= self.min_size_to_sample or \
            self.diff + count * self.samples_per_insert <= self.max_diff

    def record_insert(self, count: int) -> None:
        with self._changed:
            self.inserts += count
            self._changed.notify_all()

    def record_sample(self, count: int) -> None:
        with self._changed:
            self.samples += count
            self._changed.notify_all()

    def await_sample(self, count: int, timeout: float | None = None) -> None:
        """Blocks until `count` transitions may be sampled (the replay records the sample)."""
        with self._changed:
            self._await(lambda: self.can_sample(count), timeout, "sample")

    def await_insert(self, count: int, timeout: float | None = None) -> None:
        """Blocks until `count` transitions may be inserted (the replay records the insert)."""
        with self._changed:
            self._await(lambda: self.can_insert(count), timeout, "insert")

    def _await(self, allowed, timeout: float | None, what: str) -> None:
        """Waits (holding the condition's lock on return) until `allowed()`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not allowed():
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise RateLimitTimeout(f"rate limiter: no room to {what} within {timeout} s "
                                       f"(inserts {self.inserts}, samples {self.samples})")
            self._changed.wait(remaining)

    def state_dict(self) -> dict:
        return {"inserts": self.inserts, "samples": self.samples}

    def load_state_dict(self, state: dict) -> None:
        self.inserts, self.samples = int(state["inserts"]), int(state["samples"])
