"""The parts' contracts, as code: what an algorithm, a learner, a replay table, an actor and a
runtime are (typing.Protocol: a class implements one by having its members, and says so with
`implements`; tests/test_contracts.py runs every registered implementation through the same
checks). The backend's contract lives with the backends (pearl.kernels.registry.Backend).

How the parts meet (docs/ARCHITECTURE.md): the builder (pearl/build.py) turns a config and a
Plan into `Parts`; a Runtime advances the parts by N env steps, keeping the counters and calling
the hooks; the schedule it keeps is pearl.schedule's.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class Algorithm(Protocol):
    """The paper's pseudo-code in PyTorch: networks, the act schedule and the update rule. Names no
    device and imports no backend; its cost spec (FLOPs, bytes per act / learn call) is what the
    estimator's workload reads."""

    config: Any

    def epsilon(self, step: int) -> float:
        """The act schedule: exploration at env step `step` (1 = uniformly random actions)."""

    def networks(self) -> dict[str, Any]:
        """Its torch modules by name (online, target, actor, critic, ...)."""

    def policy_sizes(self) -> list[int]:
        """Layer widths of the network the actors run (and sync_weights ships)."""


@dataclass
class Batch:
    """A sampled batch: what a ReplayTable's `sample` returns and a Learner's `update` takes (its
    home is here, not in pearl.replay, so that a process that only moves transitions, such as a
    ray node agent, imports no replay kernel)."""

    obs: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    next_obs: np.ndarray
    discounts: np.ndarray  # gamma^k of the bootstrap, 0 where the episode terminated
    indices: np.ndarray
    weights: np.ndarray | None = None  # importance-sampling weights (prioritized replay only)


@runtime_checkable
class Learner(Protocol):
    """Runs the algorithm's `learn` task on the plan's learn device with one kernel. Optional:
    `release()`, which stops threads the learner started (a later update starts them again),
    called when a train call ends."""

    kernel: str  # "fused" | "torch" | a backend's name

    def update(self, batch) -> tuple[float, np.ndarray | None]:
        """One gradient update on a sampled batch: (loss, |TD| per sample for prioritized replay or None)."""

    def update_target(self) -> None:
        """The target network's update (DQN's interval; the continuous learners' move inside update)."""

    def policy_weights(self) -> np.ndarray:
        """The actors' network as one flat float32 vector in torch parameters() order."""

    def sync_to_algo(self) -> None:
        """Writes the kernel's weights into the algorithm's torch networks (save, evaluate)."""

    def state_dict(self) -> dict:
        """Weights, optimizer state, counts: a copy, which later updates leave alone (a run's
        checkpoint is written while the learner goes on)."""

    def load_state_dict(self, state: dict) -> None: ...


@runtime_checkable
class ReplayTable(Protocol):
    """Storage + selector (uniform, prioritized, AMPER) + rate limiter, in this process or on a device.
    Optional: `takes_frames` and `add_frame(frame, offsets, count)`, the same insert from one block of
    bytes (pearl/replay/base.py), which the replay server and the processes runtime's learner use
    where `takes_frames` holds: a table that changes what `add` does changes `add_frame` alike."""

    capacity: int
    prioritized: bool
    progress: int  # env steps so far (prioritized replay's beta anneals on it)

    def add(self, obs, actions, rewards, next_obs, discounts): ...

    def sample(self, batch_size: int, rng: np.random.Generator): ...

    def update_priorities(self, indices, td_errors) -> None: ...

    def state_dict(self, detached: bool = False) -> dict:
        """The stored rows, priorities and counters; its arrays may be the table's own (a
        checkpoint written before the next insert) unless `detached`."""

    def load_state_dict(self, state: dict) -> None: ...


@runtime_checkable
class Actor(Protocol):
    """Steps its envs once per call with its copy of the policy: (transitions or None, finished
    episodes as (return, length))."""

    policy: Any
    n_envs: int  # envs stepped per call

    def step(self, epsilon: float) -> tuple[tuple | None, list[tuple[float, int]]]: ...

    def close(self) -> None: ...


@runtime_checkable
class Runtime(Protocol):
    """Runs the built parts for a number of env steps. A runtime module of pearl/runtime/ exposes
    one as `RUNTIME`; its schedule model for the estimator is pearl.schedule.models[name]."""

    name: str
    max_lag: int  # updates the learner may trail the count due during the run (0: never)

    def run(self, parts, counters, steps: int, hooks) -> None:
        """Advances `counters` by `steps` env steps (a runtime that acts in rounds of several env
        steps ends at the first round boundary at or past it)."""


def implements(*contracts: type) -> Callable[[type], type]:
    """Class decorator: declares the contracts a class implements (checked by the contract tests)."""

    def mark(cls: type) -> type:
        cls.__contracts__ = tuple(getattr(cls, "__contracts__", ())) + contracts
        return cls

    return mark
