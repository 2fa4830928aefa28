"""A binary sum tree in one numpy array, with batched (level-synchronous) sample and update.

Node 1 is the root; node i has children 2i and 2i+1; leaf j is node `leaves + j`. A batch of
samples descends one level at a time for all its members together, so each level is one vectorised
gather; an update rewrites the touched leaves and recomputes their ancestors from their children
(never by adding deltas, so rounding does not drift). float64 keeps prefix sums exact enough that
sampling matches a float64 cumulative-sum search away from bracket boundaries.
"""
from __future__ import annotations

import numpy as np


class SumTree:
    def __init__(self, capacity: int):
        self.capacity = capacity
        self.leaves = 1 << max(0, (capacity - 1).bit_length())
        self.depth = self.leaves.bit_length() - 1
        self.nodes = np.zeros(2 * self.leaves, dtype=np.float64)

    @property
    def total(self) -> float:
        return float(self.nodes[1])

    def get(self, indices: np.ndarray) -> np.ndarray:
        return self.nodes[self.leaves + np.asarray(indices)]

    def update(self, indices: np.ndarray, priorities: np.ndarray) -> None:
        """Sets leaf priorities; with duplicate indices the last one in the batch wins."""
        nodes = np.unique(np.asarray(indices) + self.leaves)
        self.nodes[np.asarray(indices) + self.leaves] = priorities
        for _ in range(self.depth):
            nodes = np.unique(nodes >> 1)
            self.nodes[nodes] = self.nodes[2 * nodes] + self.nodes[2 * nodes + 1]

    def find(self, prefix_sums: np.ndarray) -> np.ndarray:
        """Leaf index whose cumulative-priority bracket [c_{j-1}, c_j) holds each prefix sum."""
        mass = np.array(prefix_sums, dtype=np.float64)
        node = np.ones(mass.shape[0], dtype=np.int64)
        for _ in range(self.depth):
            node <<= 1
            left = self.nodes[node]
            go_right = mass >= left
            mass -= np.where(go_right, left, 0.0)
            node += go_right
        leaf = node - self.leaves
        # Rounding can walk past the last non-empty leaf; step back onto a leaf with mass.
        empty = self.nodes[node] <= 0.0
        if empty.any():
            leaf[empty] = self._last_positive_at_or_before(leaf[empty])
        return leaf

    def _last_positive_at_or_before(self, leaves: np.ndarray) -> np.ndarray:
        positive = np.flatnonzero(self.nodes[self.leaves:self.leaves + self.capacity] > 0.0)
        at = np.searchsorted(positive, leaves, side="right") - 1
        return positive[np.maximum(at, 0)]
