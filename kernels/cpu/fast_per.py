"""Prioritized replay's sample as one compiled call: the selector's draw (exact sum-tree descent,
kernels/cpu/fast_sumtree.py, or AMPER's bucket draw, kernels/cpu/amper.py), the importance
weights and the gather of the sampled rows (kernels/cpu/fast_storage.py).

One call instead of three saves two dispatches (~1-2 us each at batch 256), and the rows are
prefetched as soon as the descent has found them, so their cache misses overlap the weights'
arithmetic instead of each other.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from pearl.kernels.cpu.amper import AmperSampler, _min_mean, _sample
from pearl.kernels.cpu.fast_storage import RowRing, _copy_rows, _prefetch_row, importance_weights
from pearl.kernels.cpu.fast_sumtree import NumbaSumTree
from pearl.kernels.cpu.fast_sumtree import _sample as _tree_sample

_NJIT = dict(cache=True, nogil=True)


@njit(**_NJIT)
def _sample_gather(sums, prefix, mins, offsets, depth, k, uniforms, mass, indices, priorities, size,
                   beta, weights, rows, out, row_offsets, widths):
    _tree_sample(sums, prefix, offsets, depth, k, uniforms, mass, indices, rows)
    leaf = offsets[depth]
    for i in range(indices.shape[0]):
        priorities[i] = sums[leaf + indices[i]]
    importance_weights(priorities, sums[0], mins[0], size, beta, weights, mass)
    _copy_rows(rows, indices, out, row_offsets, widths)


@njit(**_NJIT)
def _amper_sample_gather(uniforms, mass, comp, count, page_table, pages, shift, mask, indices,
                         probabilities, beta, weights, rows, out, row_offsets, widths):
    """AMPER's draw with its own probabilities q_i; weights (q_i / q_min)^-beta, the formula of
    PrioritizedReplay's generic path."""
    total = _sample(uniforms, mass, comp, count, page_table, pages, shift, mask, indices,
                    probabilities, True)
    for i in range(indices.shape[0]):
        _prefetch_row(rows, indices[i])
    q_min = _min_mean(mass, comp, count) / total
    for i in range(indices.shape[0]):
        weights[i] = (probabilities[i] / q_min) ** -beta
    _copy_rows(rows, indices, out, row_offsets, widths)


class PrioritizedSampler:
    """Samples a batch from a NumbaSumTree or an AmperSampler over a RowRing (the selector's slot i
    is the ring's row i): `sample(uniforms, size, beta) -> (indices, weights, field outputs)`, all
    preallocated per batch size and reused by the next sample of that size."""

    def __init__(self, selector: NumbaSumTree | AmperSampler, ring: RowRing):
        if selector.capacity != ring.capacity:
            raise ValueError(f"selector capacity {selector.capacity} != ring capacity {ring.capacity}")
        self.tree, self.ring = selector, ring
        self.amper = isinstance(selector, AmperSampler)
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
        if self.amper:
            if tree.size == 0:
                raise ValueError("AMPER: cannot sample from an empty sampler")
            _amper_sample_gather(uniforms, tree._mass, tree._comp, tree._count, tree._page_table,
                                 tree._pages, tree._shift, tree._mask, indices, priorities, beta, weights,
                                 ring.rows, words, ring._row_offsets, ring._widths)
            return indices, weights, views
        _sample_gather(tree._sums, tree._prefix, tree._mins, tree.offsets, tree.depth, tree.fanout,
                       uniforms, mass, indices, priorities, size, beta, weights, ring.rows, words,
                       ring._row_offsets, ring._widths)
        return indices, weights, views
