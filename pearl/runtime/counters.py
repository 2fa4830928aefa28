"""What a run counts and how it reports: the counters a runtime advances, the hooks it calls, and
the per-task timer. The agent owns one Counters across runs (checkpoints save it)."""
from __future__ import annotations

import math
import signal
import threading
from contextlib import contextmanager
from collections import deque
from dataclasses import dataclass
from typing import Callable

import numpy as np

from pearl.errors import TrainingDiverged


class TaskTimer:
    """Wall time spent in each protocol task, so measured costs can be set against estimates."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}

    def add(self, task: str, seconds: float, calls: int = 1) -> None:
        if calls:
            self.seconds[task] = self.seconds.get(task, 0.0) + seconds
            self.calls[task] = self.calls.get(task, 0) + calls

    def mean_us(self) -> dict[str, float]:
        return {t: 1e6 * s / self.calls[t] for t, s in self.seconds.items()}


class Counters:
    """Env steps, updates, episodes, the last 100 episode returns and the loss since it was last
    taken; `stop_requested` (Ctrl-C, a profile window) ends a run at the end of its round."""

    def __init__(self):
        self.env_steps = self.updates = self.episodes = 0
        self.recent_returns: deque = deque(maxlen=100)
        self._loss_sum, self._loss_count = 0.0, 0
        self.stop_requested = False
        self.task_timer = TaskTimer()
        # the processes runtime's live actors while it runs (tests and hooks look at them), and
        # what its last run saw: actor restarts, the most env steps the actors were ahead
        self.actor_processes = None
        self.actor_restarts = self.actor_lead = 0
        # the processes runtime's last run: each actor process's CPU seconds from its fork or exec until ready to act
        self.actor_boot_cpu: tuple[float, ...] = ()

    def record_episodes(self, finished: list[tuple[float, int]]) -> None:
        for episode_return, _ in finished:
            self.recent_returns.append(episode_return)
            self.episodes += 1

    def record_loss(self, loss: float) -> None:
        if not math.isfinite(loss):
            raise TrainingDiverged(f"loss became {loss} at update {self.updates + 1} (env step "
                                   f"{self.env_steps}): training stopped")
        self._loss_sum += loss
        self._loss_count += 1

    def take_mean_loss(self) -> float | None:
        if not self._loss_count:
            return None
        mean = self._loss_sum / self._loss_count
        self._loss_sum, self._loss_count = 0.0, 0
        return mean

    def mean_return(self) -> float | None:
        return float(np.mean(self.recent_returns)) if self.recent_returns else None

    def state(self) -> dict:
        return {"env_steps": self.env_steps, "updates": self.updates, "episodes": self.episodes}

    def load(self, state: dict) -> None:
        self.env_steps, self.updates, self.episodes = state["env_steps"], state["updates"], state["episodes"]


@dataclass
class Hooks:
    """What a runtime calls besides the parts: `on_round()` after each act round (logging,
    evaluation, checkpoints); `quiet(previous, env_steps)` says whether that round's on_round needs
    the learner paused (it evaluates or logs, and must see one consistent set of weights);
    `timer` (or None) takes each task's wall time."""

    on_round: Callable[[], None] | None = None
    quiet: Callable[[int, int], bool] = lambda previous, env_steps: False
    timer: TaskTimer | None = None


@contextmanager
def stop_on_interrupt(counters: Counters):
    """While training: the first Ctrl-C asks the runtime to stop at the end of its round (so the
    checkpoint is consistent), a second one interrupts at once. Only the main thread can take
    signals; elsewhere Ctrl-C keeps its default behaviour."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        if counters.stop_requested:
            raise KeyboardInterrupt
        counters.stop_requested = True

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
