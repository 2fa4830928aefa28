"""Uniform replay: every stored transition is equally likely, sampled with replacement."""
from __future__ import annotations

import numpy as np

from pearl.contracts import ReplayTable, implements
from pearl.replay.base import Batch, Replay


@implements(ReplayTable)
class UniformReplay(Replay):
    def _select(self, batch_size: int, rng: np.random.Generator) -> Batch:
        indices, (obs, actions, rewards, next_obs, discounts) = self._ring.sample_uniform(
            rng.random(batch_size), self.size)
        return Batch(obs, actions, rewards, next_obs, discounts, indices)
