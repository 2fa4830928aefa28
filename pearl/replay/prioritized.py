"""Prioritized experience replay (Schaul et al. 2016), proportional variant, on a sum tree.

P(i) = p_i^alpha / sum_k p_k^alpha, sampled stratified (one draw per equal slice of the total
mass); importance weights w_i = (N * P(i))^-beta normalised by the largest possible weight, the
one of the minimum priority; beta anneals linearly to beta_final; new transitions get the maximum
priority seen so far, so each is sampled at least once soon.
"""
from __future__ import annotations

import numpy as np

from pearl.kernels.cpu.sumtree import SumTree
from pearl.replay.base import Batch, Replay


class PrioritizedReplay(Replay):
    prioritized = True

    def __init__(self, capacity: int, obs_dim: int, alpha: float = 0.6, beta: float = 0.4,
                 beta_final: float = 1.0, beta_steps: int = 1, priority_eps: float = 1e-6,
                 **storage_kwargs):
        super().__init__(capacity, obs_dim, **storage_kwargs)
        self.alpha, self.beta0, self.beta_final = alpha, beta, beta_final
        self.beta_steps = max(1, beta_steps)
        self.priority_eps = priority_eps
        self.tree = SumTree(capacity)
        self.max_priority = 1.0

    @property
    def beta(self) -> float:
        fraction = min(1.0, self.progress / self.beta_steps)
        return self.beta0 + fraction * (self.beta_final - self.beta0)

    def add(self, obs, actions, rewards, next_obs, discounts) -> np.ndarray:
        slots = super().add(obs, actions, rewards, next_obs, discounts)
        self.tree.update(slots, np.full(len(slots), self.max_priority ** self.alpha))
        return slots

    def _select(self, batch_size: int, rng: np.random.Generator) -> Batch:
        total = self.tree.total
        indices = self.tree.sample(rng.random(batch_size))
        probabilities = self.tree.get(indices) / total
        min_probability = self.tree.min() / total
        weights = ((probabilities / min_probability) ** -self.beta).astype(np.float32)
        return Batch(**self.gather(indices), indices=indices, weights=weights)

    def update_priorities(self, indices: np.ndarray, td_errors: np.ndarray) -> None:
        priorities = np.abs(np.asarray(td_errors, dtype=np.float64)) + self.priority_eps
        self.max_priority = max(self.max_priority, float(priorities.max()))
        self.tree.update(indices, priorities ** self.alpha)

    def state_dict(self) -> dict:
        state = super().state_dict()
        state.update(priorities=self.tree.get(np.arange(self.size)), max_priority=self.max_priority,
                     progress=self.progress)
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.tree = SumTree(self.capacity, self.tree.fanout)
        self.tree.update(np.arange(self.size), np.asarray(state["priorities"]))
        self.max_priority, self.progress = float(state["max_priority"]), int(state["progress"])
