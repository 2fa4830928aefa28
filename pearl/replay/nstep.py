"""Turns one environment's stream of steps into n-step transitions.

A transition from step t carries R = r_t + g r_{t+1} + ... + g^{k-1} r_{t+k-1}, the observation
k steps later and discount g^k, with k = n, or fewer when the episode ends first. On termination
the discount is 0 (nothing to bootstrap); on truncation (time limit) it stays g^k and the learner
bootstraps from the last observation, as the time limit is not part of the task.
"""
from __future__ import annotations

from collections import deque


class NStepAccumulator:
    def __init__(self, n: int, gamma: float):
        self.n, self.gamma = n, gamma
        self.pending: deque = deque()  # (obs, action, reward) not yet emitted

    def step(self, obs, action, reward: float, next_obs, terminated: bool, truncated: bool) -> list:
        """Feeds one step; returns the transitions (obs, action, R, next_obs, discount) now complete."""
        self.pending.append((obs, action, reward))
        out = []
        if terminated or truncated:
            while self.pending:
                out.append(self._emit(next_obs, 0.0 if terminated else None))
        elif len(self.pending) == self.n:
            out.append(self._emit(next_obs, None))
        return out

    def _emit(self, next_obs, discount_override):
        ret, scale = 0.0, 1.0
        for _, _, reward in self.pending:
            ret += scale * reward
            scale *= self.gamma
        obs, action, _ = self.pending.popleft()
        discount = scale if discount_override is None else discount_override
        return obs, action, ret, next_obs, discount
