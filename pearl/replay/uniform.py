"""Uniform replay: every stored transition is equally likely, sampled with replacement."""
from __future__ import annotations

import numpy as np

from pearl.replay.base import Batch, Replay


class UniformReplay(Replay):
    def _select(self, batch_size: int, rng: np.random.Generator) -> Batch:
        # A scaled float64 uniform is unbiased to 2^-53 and ~5x cheaper than Generator.integers.
        indices = (rng.random(batch_size) * self.size).astype(np.int64)
        return Batch(**self.gather(indices), indices=indices)
