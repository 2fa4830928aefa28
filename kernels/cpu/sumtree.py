"""A K-ary sum tree (plus a min tree) in numpy, with batched, level-synchronous sample and update.

This is the reference every backend's sum tree (numba CPU threads, CUDA, OpenCL, FPGA HLS) is
tested against, and the interface they all implement:

    SumTree(capacity, fanout)
    update(indices, priorities)   set leaf priorities (already raised to alpha); last duplicate wins
    find(prefix_sums)             leaf j whose bracket [c_{j-1}, c_j) holds each prefix sum
    sample(uniforms)              stratified: find((i + u_i) * total / B) for a batch of B uniforms
    total                         sum of all priorities
    min()                         smallest priority of a filled leaf (inf when empty)
    get(indices)                  leaf priorities

Layout: level 0 is the root, level d holds fanout^d nodes, node n of level d has children
n*K .. n*K+K-1 on level d+1; the last level's first `capacity` nodes are the leaves. A batch
descends one level at a time for all its members together (one gather of K children each), so a
wide fanout means few levels and few dependent memory accesses. Updates recompute each touched
ancestor from its children (no delta accumulation, so rounding never drifts). float64 throughout.
"""
from __future__ import annotations

import numpy as np


def checked_leaf_indices(indices, capacity: int) -> np.ndarray:
    """`indices` as a flat int64 array, or IndexError: a device tree reads whatever index it is
    handed, so the backends that copy indices to a device check them here first."""
    indices = np.asarray(indices)
    if indices.size and not np.issubdtype(indices.dtype, np.integer):
        raise IndexError(f"sum tree indices must be integers, got {indices.dtype}")
    indices = np.ascontiguousarray(indices, dtype=np.int64).ravel()
    if indices.size and (indices.min() < 0 or indices.max() >= capacity):
        raise IndexError(f"sum tree index out of range [0, {capacity})")
    return indices


class SumTree:
    def __init__(self, capacity: int, fanout: int = 16):
        if capacity < 1 or fanout < 2:
            raise ValueError(f"sum tree needs capacity >= 1 and fanout >= 2, got {capacity}, {fanout}")
        self.capacity, self.fanout = capacity, fanout
        self.depth = 1
        while fanout ** self.depth < capacity:
            self.depth += 1
        self.sums = [np.zeros(fanout ** d) for d in range(self.depth + 1)]
        self.mins = [np.full(fanout ** d, np.inf) for d in range(self.depth + 1)]

    @property
    def leaves(self) -> np.ndarray:
        return self.sums[-1]

    @property
    def total(self) -> float:
        return float(self.sums[0][0])

    def min(self) -> float:
        return float(self.mins[0][0])

    def get(self, indices) -> np.ndarray:
        return self.leaves[np.asarray(indices)]

    def update(self, indices, priorities) -> None:
        indices = np.asarray(indices, dtype=np.int64)
        priorities = np.asarray(priorities, dtype=np.float64)
        self.sums[-1][indices] = priorities  # numpy assigns in order: the last duplicate wins
        self.mins[-1][indices] = np.where(priorities > 0, priorities, np.inf)
        nodes = np.unique(indices)
        k = self.fanout
        for level in range(self.depth - 1, -1, -1):
            nodes = np.unique(nodes // k)
            children = nodes[:, None] * k + np.arange(k)
            self.sums[level][nodes] = self.sums[level + 1][children].sum(axis=1)
            self.mins[level][nodes] = self.mins[level + 1][children].min(axis=1)

    def find(self, prefix_sums) -> np.ndarray:
        mass = np.array(prefix_sums, dtype=np.float64)
        node = np.zeros(mass.shape[0], dtype=np.int64)
        k = self.fanout
        for level in range(1, self.depth + 1):
            children = self.sums[level][node[:, None] * k + np.arange(k)]
            cumulative = np.cumsum(children, axis=1)
            # first child whose cumulative sum exceeds the remaining mass; rounding can leave
            # none, then take the last child that has any mass
            child = (cumulative <= mass[:, None]).sum(axis=1)
            overflow = child >= k
            if overflow.any():
                child[overflow] = k - 1 - np.argmax(children[overflow][:, ::-1] > 0, axis=1)
            before = np.where(child > 0, cumulative[np.arange(len(node)), np.maximum(child - 1, 0)], 0.0)
            mass -= before
            node = node * k + child
        return node

    def sample(self, uniforms) -> np.ndarray:
        uniforms = np.asarray(uniforms, dtype=np.float64)
        batch = uniforms.shape[0]
        return self.find((np.arange(batch) + uniforms) * (self.total / batch))
