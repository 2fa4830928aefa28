"""Prioritized replay's sample as one compiled call: the selector's draw (exact sum-tree descent,
kernels/cpu/fast_sumtree.py, or AMPER's bucket draw, kernels/cpu/amper.py), the importance
weights and the gather of the sampled rows (kernels/cpu/fast_storage.py).

One call instead of three saves two dispatches (~1-2 us each at batch 256), and the rows are
prefetched as soon as the descent has found them, so their cache misses overlap the weights'
arithmetic instead of each other.
"""
from __future__ import annotations

from functools import partial

import numpy as np
from numba import njit

from pearl.kernels.cpu.amper import AmperSampler, _min_mean, _sample
from pearl.kernels.cpu.fast_storage import RowRing, _copy_rows, _prefetch_row, importance_weights
from pearl.kernels.cpu.fastmath import power
from pearl.kernels.cpu.fast_sumtree import NumbaSumTree
from pearl.kernels.cpu.fast_sumtree import _sample as _tree_sample

_NJIT = dict(cache=True, nogil=True)
NO_MASS = "cannot sample: no stored transition has a positive priority"


@njit(**_NJIT)
def _sample_gather(sums, prefix, mins, offsets, depth, k, mass, indices, priorities, weights, rows,
                   out, row_offsets, widths, uniforms, size, beta):
    """Returns whether it sampled: the tree has mass (otherwise the outputs are undefined)."""
    if not sums[0] > 0:
        return False
    _tree_sample(sums, prefix, offsets, depth, k, uniforms, mass, indices, priorities, rows)
    importance_weights(priorities, sums[0], mins[0], size, beta, weights, mass)
    _copy_rows(rows, indices, out, row_offsets, widths)
    return True


@njit(**_NJIT)
def _amper_sample_gather(state, mass, comp, count, page_table, pages, shift, mask, indices, probabilities,
                         scratch, weights, rows, out, row_offsets, widths, uniforms, size, beta):
    """AMPER's draw with its own probabilities q_i; weights (q_i / q_min)^-beta, the formula of
    PrioritizedReplay's generic path (the power by kernels/cpu/fastmath.py, via `scratch`).
    `size` is unused: AMPER's probabilities are its own. Returns whether it sampled (False: no
    stored priority is positive)."""
    if state[1] == 0:  # AmperSampler.size
        return False
    total = _sample(uniforms, mass, comp, count, page_table, pages, shift, mask, indices,
                    probabilities, True)
    for i in range(indices.shape[0]):
        _prefetch_row(rows, indices[i])
    reciprocal = total / _min_mean(mass, comp, count)  # 1 / q_min
    for i in range(indices.shape[0]):
        scratch[i] = probabilities[i] * reciprocal
    power(scratch[:indices.shape[0]], -beta, weights)
    _copy_rows(rows, indices, out, row_offsets, widths)
    return True


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

    def bind(self, batch: int) -> tuple:
        """(kernel(uniforms, size, beta), outputs) for a batch size: the kernel with every array
        it reads or writes bound (they never change; rebuilding the argument list per call cost
        ~1 us of a 15 us sample), and the outputs it fills, (indices, weights, field views)."""
        call = self._calls.get(batch)
        if call is None:
            indices, priorities, weights, mass = (np.empty(batch, np.int64), np.empty(batch, np.float64),
                                                  np.empty(batch, np.float32), np.empty(batch, np.float64))
            words, views = self.ring.outputs(batch)
            ring, tree = self.ring, self.tree
            gather = (ring.rows, words, ring._row_offsets, ring._widths)
            if self.amper:
                kernel = partial(_amper_sample_gather, tree._state, tree._mass, tree._comp, tree._count,
                                 tree._page_table, tree._pages, tree._shift, tree._mask, indices,
                                 priorities, mass, weights, *gather)
            else:
                kernel = partial(_sample_gather, tree._sums, tree._prefix, tree._mins, tree.offsets,
                                 tree.depth, tree.fanout, mass, indices, priorities, weights, *gather)
            call = (kernel, (indices, weights, views))
            self._calls[batch] = call
        return call

    def sample(self, uniforms: np.ndarray, size: int, beta: float):
        kernel, outputs = self.bind(uniforms.shape[0])
        if not kernel(uniforms, size, beta):
            raise ValueError(NO_MASS)
        return outputs

    def __getstate__(self):
        # the bound kernels hold views of the tree's buffer, which a copy rebuilds: made again
        return {**self.__dict__, "_calls": {}}
