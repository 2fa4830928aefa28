"""Compiled (numba) kernels for the transition ring of `pearl.replay.base.Replay`.

- `ring_insert(cursor, ((dst, src), ...))`: writes a batch at `cursor` into every field of the ring,
  wrapping at capacity (a batch longer than the ring rewrites slots in order, so the last write
  wins, as numpy's fancy assignment does); returns the new cursor. One call for all fields.
- `gather_rows(indices, ((src, out), ...))`: out[i] = src[indices[i]] for every field, one call.
- `importance_weights(priorities_of_batch, total, min_priority, size, beta, out)`: prioritized
  replay's w_i = (N P(i))^-beta / (N P_min)^-beta.

`pairs` is a tuple with one (ring field, batch array) pair per field, any dtypes and ranks, leading
axis = rows; every array must be C-contiguous (rows are copied as flat runs of `row size` elements, with a cast where the
dtypes differ). The tuple is unrolled at compile time (`literal_unroll`), so a field layout
compiles once and then runs as one loop per field. `as_rows` makes a C-contiguous source of the
destination's dtype out of whatever the caller passes (it returns arrays that already fit
unchanged).
"""
from __future__ import annotations

import numpy as np
from numba import literal_unroll, njit

from pearl.kernels.cpu.fast_sumtree import _prefetch

_NJIT = dict(cache=True, nogil=True)


@njit(inline="always")
def _flat(a):
    """A (rows, row size) view of a C-contiguous array of any rank."""
    rows = a.shape[0]
    width = a.size // rows if rows > 0 else 0
    return a.reshape((rows, width))


@njit(**_NJIT)
def _insert_one(cursor, dst, src):
    d = _flat(dst)
    s = _flat(src)
    capacity = d.shape[0]
    count = s.shape[0]
    width = d.shape[1]
    r = cursor
    for i in range(count):
        for j in range(width):
            d[r, j] = s[i, j]
        r += 1
        if r == capacity:
            r = 0


@njit(**_NJIT)
def ring_insert(cursor, pairs):
    """For every (dst, src) of `pairs`: row i of src goes to slot (cursor + i) % capacity of dst.
    Returns the new cursor. All fields hold the same number of rows (checked)."""
    count = pairs[0][1].shape[0]
    capacity = pairs[0][0].shape[0]
    for pair in literal_unroll(pairs):
        if pair[0].shape[0] != capacity or pair[1].shape[0] != count:
            raise ValueError("fields differ in capacity or batch length")
    if capacity == 0:
        return cursor
    cursor = cursor % capacity
    for pair in literal_unroll(pairs):
        _insert_one(cursor, pair[0], pair[1])
    return (cursor + count) % capacity


@njit(**_NJIT)
def _gather_one(indices, src, out):
    s = _flat(src)
    o = _flat(out)
    n = indices.shape[0]
    width = s.shape[1]
    rows = s.shape[0]
    for i in range(n):
        r = indices[i]
        if r < 0 or r >= rows:
            raise IndexError("gather index out of range")
        for j in range(width):
            o[i, j] = s[r, j]


@njit(**_NJIT)
def _prefetch_rows(indices, src):
    s = _flat(src)
    width = s.shape[1]
    for i in range(indices.shape[0]):
        _prefetch(s, indices[i] * width)


@njit(**_NJIT)
def gather_rows(indices, pairs):
    """out[i] = src[indices[i]] for every (src, out) of `pairs`.

    Every row of every field is prefetched before the first copy, so the cache misses of a batch
    of random rows overlap instead of following one another."""
    for pair in literal_unroll(pairs):
        _prefetch_rows(indices, pair[0])
    for pair in literal_unroll(pairs):
        _gather_one(indices, pair[0], pair[1])


@njit(**_NJIT)
def importance_weights(priorities_of_batch, total, min_priority, size, beta, out):
    """out[i] = (N P(i))^-beta / (N P_min)^-beta with P(i) = p_i / total, N = size, computed as
    ((p_i / total) / (p_min / total)) ** -beta (prioritized replay's formula). Without a
    usable minimum (empty tree: inf, or 0), normalised by the batch's largest weight instead."""
    n = priorities_of_batch.shape[0]
    if min_priority > 0 and min_priority < np.inf and total > 0:
        p_min = min_priority / total
        for i in range(n):
            out[i] = ((priorities_of_batch[i] / total) / p_min) ** -beta
        return out
    top = 0.0
    for i in range(n):
        w = (size * (priorities_of_batch[i] / total)) ** -beta
        top = w if w > top else top
    for i in range(n):
        out[i] = ((size * (priorities_of_batch[i] / total)) ** -beta) / top
    return out


def as_rows(values, like: np.ndarray) -> np.ndarray:
    """`values` as a C-contiguous array of `like`'s dtype with `like`'s row shape (scalars and
    single rows broadcast to one row); returned as is when it already fits."""
    if (type(values) is np.ndarray and values.dtype == like.dtype and values.ndim == like.ndim
            and values.flags.c_contiguous and values.shape[1:] == like.shape[1:]):
        return values
    array = np.asarray(values, dtype=like.dtype)
    if array.ndim < like.ndim:
        array = array.reshape((-1, *like.shape[1:]))
    return np.ascontiguousarray(array)


class RingKernels:
    """Holds a ring's field arrays and preallocated gather outputs and calls the kernels with
    them: `insert(*fields) -> first slot written`, `gather(indices) -> tuple of outputs` (reused
    by the next gather of the same batch size)."""

    def __init__(self, fields: tuple[np.ndarray, ...]):
        self.fields = tuple(np.ascontiguousarray(f) for f in fields)
        self.capacity = self.fields[0].shape[0]
        self.cursor = 0
        self._outs: dict[int, tuple[tuple[np.ndarray, ...], tuple]] = {}

    def insert(self, *batch) -> int:
        srcs = tuple(as_rows(b, f) for b, f in zip(batch, self.fields))
        start = self.cursor
        self.cursor = ring_insert(start, tuple(zip(self.fields, srcs)))
        return start

    def _prepared(self, batch: int):
        prepared = self._outs.get(batch)
        if prepared is None:
            outs = tuple(np.empty((batch, *f.shape[1:]), dtype=f.dtype) for f in self.fields)
            prepared = (outs, tuple(zip(self.fields, outs)))
            self._outs[batch] = prepared
        return prepared

    def outputs(self, batch: int) -> tuple[np.ndarray, ...]:
        return self._prepared(batch)[0]

    def gather(self, indices: np.ndarray) -> tuple[np.ndarray, ...]:
        outs, pairs = self._prepared(indices.shape[0])
        gather_rows(indices, pairs)
        return outs


def compile_all(fields: tuple[np.ndarray, ...] | None = None) -> None:
    """Compiles (or loads from the cache) the kernels for the default replay layout: float32
    obs/next_obs (2-D), int64 actions, float32 rewards and discounts."""
    if fields is None:
        fields = (np.zeros((4, 3), np.float32), np.zeros(4, np.int64), np.zeros(4, np.float32),
                  np.zeros((4, 3), np.float32), np.zeros(4, np.float32))
    ring = RingKernels(fields)
    ring.insert(*(f[:2].copy() for f in fields))
    ring.gather(np.array([0, 1], np.int64))
    importance_weights(np.ones(2), 2.0, 1.0, 2, 0.4, np.empty(2, np.float32))
