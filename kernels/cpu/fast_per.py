"""Prioritized replay's sample as one compiled call: sum-tree descent, importance weights and the
gather of the sampled rows (kernels/cpu/fast_sumtree.py + fast_storage.py).

One call instead of three saves two dispatches (~1-2 us each at batch 256), and the rows are
prefetched as soon as the descent has found them, so their cache misses overlap the weights'
arithmetic instead of each other.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from pearl.kernels.cpu.fast_storage import RowRing, _copy_rows, _prefetch_row, importance_weights
from pearl.kernels.cpu.fast_sumtree import NumbaSumTree, _sample_sync

_NJIT = dict(cache=True, nogil=True)


@njit(**_NJIT)
def _sample_gather(sums, prefix, mins, offsets, depth, k, uniforms, mass, indices, priorities, size,
                   beta, weights, rows, out, row_offsets, widths):
    _sample_sync(sums, prefix, offsets, depth, k, uniforms, mass, indices)
    for i in range(indices.shape[0]):
        _prefetch_row(rows, indices[i])
    leaf = offsets[depth]
    for i in range(indices.shape[0]):
        priorities[i] = sums[leaf + indices[i]]
    importance_weights(priorities, sums[0], mins[0], size, beta, weights)
    _copy_rows(rows, indices, out, row_offsets, widths)


class PrioritizedSampler:
    """Samples a batch from a NumbaSumTree over a RowRing (the tree's leaf i is the ring's row i):
    `sample(uniforms, size, beta) -> (indices, weights, field outputs)`, all preallocated per batch
    size and reused by the next sample of that size."""

    def __init__(self, tree: NumbaSumTree, ring: RowRing):
        if tree.capacity != ring.capacity:
            raise ValueError(f"tree capacity {tree.capacity} != ring capacity {ring.capacity}")
        self.tree, self.ring = tree, ring
        self._buffers: dict[int, tuple[np.ndarray, ...]] = {}

    def _outputs(self, batch: int):
        buffers = self._buffers.get(batch)
        if buffers is None:
            buffers = (np.empty(batch, np.int64), np.empty(batch, np.float64), np.empty(batch, np.float32),
                       np.empty(batch, np.float64))
            self._buffers[batch] = buffers
        return buffers

    def sample(self, uniforms: np.ndarray, size: int, beta: float):
        indices, priorities, weights, mass = self._outputs(uniforms.shape[0])
        words, views = self.ring.outputs(uniforms.shape[0])
        tree, ring = self.tree, self.ring
        _sample_gather(tree._sums, tree._prefix, tree._mins, tree.offsets, tree.depth, tree.fanout,
                       uniforms, mass, indices, priorities, size, beta, weights, ring.rows, words,
                       ring._row_offsets, ring._widths)
        return indices, weights, views
