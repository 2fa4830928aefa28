"""A learner's thread count chosen while it runs (`runtime.adapt_threads`, on by default): the
plan's count or one thread, whichever updates faster now.

Why: a second learner thread pays only while the cores hand data to each other quickly. On the
2-core EPYC VM of docs/BENCHMARKS.md the host switches, minute to minute, between two states: in
one an 18 KB cross-core copy takes ~2 us and the fused DDPG update 2.9-3.2 ms on two threads
against 4.6-4.9 on one; in the other the copy takes ~8 us and the two-thread update 4.5-4.9 ms,
no faster than one thread. The fused DQN step's pairs have regimes of their own, from one process
to the next whatever the copy's state (the RL Zoo's 256x256 CartPole net at batch 64: 315-383 us
an update in most processes, 869 in one of eight, against 450-481 on one thread). A plan chosen
before the run cannot know which comes.

How: `FIRST_PROBE_S` after its first update, then every `PROBE_EVERY_S` seconds, the learner runs `TRIAL_UPDATES` updates on the other count and
keeps it if their median beats the median of the current count's last `TRIAL_UPDATES` by
`MARGIN`. The updates themselves are the run's own (none is repeated or skipped); the counts give
the same update to the bit where the kernel promises it (the fused DQN step), else within
floating-point summation order, as torch's threads do. The count is set before every update
(~0.1 us), so whatever else set the process's threads in between (an evaluation, a measurement
window, another agent) the update runs on the count chosen here.
"""
from __future__ import annotations

import statistics
import time
from collections import deque
from typing import Callable

from pearl.contracts import Learner, implements

FIRST_PROBE_S = 1.0  # early: a process can start in the slow state, and a short run is over in seconds
PROBE_EVERY_S = 5.0  # the host's state holds for minutes; a trial every 5 s costs < 1% of a run
TRIAL_UPDATES = 16
MARGIN = 0.03  # the other count must be this much faster to take over (medians of 16 differ by ~1-2%)


@implements(Learner)
class AdaptiveThreads:
    """`learner` (any Learner) on `threads` or 1 thread(s), set through `set_threads(n)`; every
    other attribute is the learner's. `updates_on` counts the updates run on each count."""

    def __init__(self, learner, threads: int, set_threads: Callable[[int], None],
                 clock: Callable[[], float] = time.perf_counter, first_probe_s: float = FIRST_PROBE_S,
                 probe_every_s: float = PROBE_EVERY_S, trial_updates: int = TRIAL_UPDATES, margin: float = MARGIN):
        if threads < 2:
            raise ValueError(f"AdaptiveThreads chooses between threads and 1; got threads {threads}")
        self.learner, self.kernel, self.plan_threads = learner, learner.kernel, threads
        self._set_threads, self._clock = set_threads, clock
        self._first_probe_s, self._probe_every_s, self._margin = first_probe_s, probe_every_s, margin
        self.threads = threads  # the count the updates run on, between trials
        self.updates_on = {threads: 0, 1: 0}
        self.switches = 0
        self._recent: deque[float] = deque(maxlen=trial_updates)  # the current count's last update times
        self._trial: list[float] = []
        self._trying: int | None = None  # the count under trial
        self._next_probe: float | None = None

    def __getattr__(self, name):  # only for what this class does not define
        if name == "learner":  # not set yet (a copy being built): no recursion
            raise AttributeError(name)
        return getattr(self.learner, name)

    def update(self, batch):
        count = self._trying or self.threads
        self._set_threads(count)
        started = self._clock()
        result = self.learner.update(batch)
        now = self._clock()
        self.updates_on[count] += 1
        if self._trying is None:
            self._recent.append(now - started)
            if self._next_probe is None:
                self._next_probe = now + self._first_probe_s
            elif now >= self._next_probe and len(self._recent) == self._recent.maxlen:
                self._trying, self._trial = self._other(), []
        else:
            self._trial.append(now - started)
            if len(self._trial) == self._recent.maxlen:
                self._decide(now)
        return result

    def _other(self) -> int:
        return 1 if self.threads > 1 else self.plan_threads

    def _decide(self, now: float) -> None:
        if statistics.median(self._trial) < (1.0 - self._margin) * statistics.median(self._recent):
            self.threads, self.switches = self._trying, self.switches + 1
            self._recent = deque(self._trial, maxlen=self._recent.maxlen)
        self._trying, self._next_probe = None, now + self._probe_every_s

    def update_target(self) -> None:
        self.learner.update_target()

    def policy_weights(self):
        return self.learner.policy_weights()

    def sync_to_algo(self) -> None:
        self.learner.sync_to_algo()

    def state_dict(self) -> dict:
        return self.learner.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.learner.load_state_dict(state)
