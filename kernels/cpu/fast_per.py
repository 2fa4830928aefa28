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
from pearl.kernels.cpu.fastmath import power
from pearl.kernels.cpu.fast_sumtree import NumbaSumTree
from pearl.kernels.cpu.fast_sumtree import _sample as _tree_sample

_NJIT = dict(cache=True, nogil=True)


@njit(**_NJIT)
def _sample_gather(sums, prefix, mins, offsets, depth, k, uniforms, mass, indices, priorities, size,
                   beta, weights, rows, out, row_offsets, widths):
    _tree_sample(sums, prefix, offsets, depth, k, uniforms, mass, indices, priorities, rows)
    importance_weights(priorities, sums[0], mins[0], size, beta, weights, mass)
    _copy_rows(rows, indices, out, row_offsets, widths)


@njit(**_NJIT)
def _amper_sample_gather(uniforms, mass, comp, count, page_table, pages, shift, mask, indices,
                         probabilities, scratch, beta, weights, rows, out, row_offsets, widths):
    """AMPER's draw with its own probabilities q_i; weights (q_i / q_min)^-beta, the formula of
    PrioritizedReplay's generic path (the power by kernels/cpu/fastmath.py, via `scratch`)."""
    total = _sample(uniforms, mass, comp, count, page_table, pages, shift, mask, indices,
                    probabilities, True)
    for i in range(indices.shape[0]):
        _prefetch_row(rows, indices[i])
    reciprocal = total / _min_mean(mass, comp, count)  # 1 / q_min
    for i in range(indices.shape[0]):
        scratch[i] = probabilities[i] * reciprocal
    power(scratch[:indices.shape[0]], -beta, weights)
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
        self._calls: dict[int, tuple] = {}

    def _call(self, batch: int) -> tuple:
        """(kernel arguments before the uniforms, those between them and `size, beta`, those after,
        outputs) for a batch size: the arrays never change, so a sample passes them as they are
        (each attribute lookup and buffer fetch per call cost ~1 us of a 20 us sample)."""
        call = self._calls.get(batch)
        if call is None:
            indices, priorities, weights, mass = (np.empty(batch, np.int64), np.empty(batch, np.float64),
                                                  np.empty(batch, np.float32), np.empty(batch, np.float64))
            words, views = self.ring.outputs(batch)
            ring, tree = self.ring, self.tree
            tail = (weights, ring.rows, words, ring._row_offsets, ring._widths)
            if self.amper:
                call = ((), (tree._mass, tree._comp, tree._count, tree._page_table, tree._pages,
                             tree._shift, tree._mask, indices, priorities, mass), tail,
                        (indices, weights, views))
            else:
                call = ((tree._sums, tree._prefix, tree._mins, tree.offsets, tree.depth, tree.fanout),
                        (mass, indices, priorities), tail, (indices, weights, views))
            self._calls[batch] = call
        return call

    def sample(self, uniforms: np.ndarray, size: int, beta: float):
        head, middle, tail, outputs = self._call(uniforms.shape[0])
        if self.amper:
            if self.tree.size == 0:
                raise ValueError("AMPER: cannot sample from an empty sampler")
            _amper_sample_gather(uniforms, *middle, beta, *tail)
        else:
            _sample_gather(*head, uniforms, *middle, size, beta, *tail)
        return outputs

    def __getstate__(self):
        # the cached arguments hold views of the tree's buffer, which a copy rebuilds: made again
        return {**self.__dict__, "_calls": {}}
