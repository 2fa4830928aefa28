"""The K-ary sum tree (plus min tree) of `kernels.cpu.sumtree.SumTree`, compiled with numba.

Same interface and same results as the numpy reference, bit for bit:

    NumbaSumTree(capacity, fanout=16)
    update(indices, priorities)          last duplicate wins
    update_from_td(indices, td, alpha, eps)  priorities (|td| + eps) ** alpha computed in the kernel;
                                         returns max(|td| + eps) (for the "max priority seen")
    find(prefix_sums)                    leaf whose bracket [c_{j-1}, c_j) holds each prefix sum
    sample(uniforms)                     stratified find((i + u_i) * total / B)
    sample_into(uniforms, out_indices, out_priorities=None)   the same, no allocation
    total, min(), get(indices), capacity, fanout, depth, sums, mins, leaves

Layout: one float64 allocation holds three arrays that share the level offsets (level d starts at
offsets[d] = (K^d - 1) / (K - 1)):
- `sums`: every node's sum, root first, leaves last, as in the reference;
- `prefix`: for every node, the sequential cumulative sum of its sibling group up to and
  including it (np.cumsum of the K children of its parent, exactly what the reference's descent
  computes on the fly);
- `mins`: the min tree's internal levels only. A leaf's own min is its priority (inf when zero),
  which `sums` already holds, so the parents of the leaves take their min straight from the leaf
  sums and an update never touches a separate min-leaf line.

Why the prefix array: a descent that recomputes K cumulative sums per level costs K dependent
adds and compares per member and level; with the cumulative sums stored, "the first child whose
cumulative sum exceeds the remaining mass" is a branchless binary search, log2(K) loads. Measured
at capacity 1M, fanout 16, batch 256 (2-core VM): 18 -> 9 us warm, 23 -> 15 us cold.

Bit-identical to the reference: a parent is the sum of its K children in numpy's own order
(`ndarray.sum` over a contiguous row is numpy's pairwise summation: below 8 elements a plain loop,
otherwise 8 running partial sums combined as ((r0+r1)+(r2+r3))+((r4+r5)+(r6+r7)) plus the
remainder, recursing above 128); the stored cumulative sums are the reference's sequential cumsum,
non-decreasing because priorities are >= 0, so counting the sums <= mass by binary search gives
the reference's child; the mass left is mass - cumsum[child - 1] as in the reference; the
rounding guard (no child's cumulative sum exceeds the mass: the last child with positive mass) is
the same, so a zero-priority leaf is never returned.

Kernels (`@njit(cache=True, nogil=True)`; no `parallel=True`: a parallel region's start-up is of
the order of a whole batch-256 sample on 2 shared cores).
- sample: level-synchronous descent (every batch member advances one level per pass, so the loads
  of different members are independent and their cache misses overlap), with a software prefetch
  of each member's next-level group issued as soon as its node is known.
- update: write leaves in batch order (last duplicate wins), then per level collect each touched
  parent once (a stamp array, no sort/unique) and recompute its group's cumulative sums, its sum
  and its min from its children.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

_NJIT = dict(cache=True, nogil=True)


@intrinsic
def _prefetch(typingctx, arr, index):
    """llvm.prefetch(&arr[index], read, locality 3, data): a hint, no bounds check, no effect on
    results."""
    if not isinstance(arr, types.Array) or not isinstance(index, types.Integer):
        return None
    sig = types.void(arr, index)

    def codegen(context, builder, signature, args):
        aryty = signature.args[0]
        ary = context.make_array(aryty)(context, builder, args[0])
        ptr = builder.gep(ary.data, [args[1]])
        i8p = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
        fn = builder.module.declare_intrinsic("llvm.prefetch", [i8p], fnty)
        builder.call(fn, [builder.bitcast(ptr, i8p), i32(0), i32(3), i32(1)])
        return context.get_dummy_value()

    return sig, codegen


# -- summation in numpy's order -------------------------------------------------------------------
@njit(inline="always")
def _pairwise_small(a, start, n):
    """numpy's pairwise_sum (loops_utils.h) of a[start:start+n] for n <= 128: same association,
    same result."""
    if n < 8:
        res = -0.0
        for i in range(n):
            res += a[start + i]
        return res
    else:
        r0 = a[start]
        r1 = a[start + 1]
        r2 = a[start + 2]
        r3 = a[start + 3]
        r4 = a[start + 4]
        r5 = a[start + 5]
        r6 = a[start + 6]
        r7 = a[start + 7]
        full = n - n % 8
        i = 8
        while i < full:
            j = start + i
            r0 += a[j]
            r1 += a[j + 1]
            r2 += a[j + 2]
            r3 += a[j + 3]
            r4 += a[j + 4]
            r5 += a[j + 5]
            r6 += a[j + 6]
            r7 += a[j + 7]
            i += 8
        res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
        while i < n:
            res += a[start + i]
            i += 1
        return res
    return 0.0  # pragma: no cover  (n > 128 goes through _pairwise_sum)


@njit(**_NJIT)
def _pairwise_sum(a, start, n):
    """numpy's pairwise_sum for any n: blocks above 128 split in halves rounded to 8."""
    if n <= 128:
        return _pairwise_small(a, start, n)
    n2 = n // 2
    n2 -= n2 % 8
    return _pairwise_sum(a, start, n2) + _pairwise_sum(a, start + n2, n - n2)


@njit(inline="always")
def _min_children(a, start, k):
    """Smallest of a[start:start+k]; min is exact in any order, so 4 independent chains."""
    m0 = a[start]
    m1 = m0
    m2 = m0
    m3 = m0
    j = 1
    while j + 4 <= k:
        v0 = a[start + j]
        v1 = a[start + j + 1]
        v2 = a[start + j + 2]
        v3 = a[start + j + 3]
        m0 = v0 if v0 < m0 else m0
        m1 = v1 if v1 < m1 else m1
        m2 = v2 if v2 < m2 else m2
        m3 = v3 if v3 < m3 else m3
        j += 4
    while j < k:
        v0 = a[start + j]
        m0 = v0 if v0 < m0 else m0
        j += 1
    m0 = m1 if m1 < m0 else m0
    m2 = m3 if m3 < m2 else m2
    return m2 if m2 < m0 else m0


# -- descent --------------------------------------------------------------------------------------
@njit(inline="always")
def _count_not_above(prefix, first, k, mass):
    """How many of the non-decreasing prefix[first:first+k] are <= mass: a branchless binary search
    (the range [base, base + n] always holds the answer; the loop length depends on k only, so its
    branches are predicted). Unsigned indices: numba then emits no negative-index wraparound."""
    base = np.uintp(first)
    n = np.uintp(k)
    one = np.uintp(1)
    while n > one:
        half = n >> one
        base = base + half if prefix[base + half - one] <= mass else base
        n -= half
    return np.int64(base) - first + (1 if prefix[base] <= mass else 0)


@njit(**_NJIT)
def _last_positive(sums, first, k):
    """The reference's rounding fallback, when no child's cumulative sum exceeds the mass: the last
    child with positive mass (all zero: the last). A plain call at the use site: inlined, or behind
    an inline="always" helper, it made the descent 3-4x slower (measured)."""
    for j in range(k - 1, -1, -1):
        if sums[first + j] > 0:
            return j
    return k - 1


@njit(inline="always")
def _prefetch_group(arr, first, k):
    """Prefetches arr[first:first+k] (one hint per 64-byte line)."""
    for j in range(0, k, 8):
        _prefetch(arr, first + j)
    _prefetch(arr, first + k - 1)


@njit(**_NJIT)
def _find_sync(sums, prefix, offsets, depth, k, mass, out):
    """Level-synchronous descent: `mass` (consumed) -> leaf indices in `out`. Each pass moves every
    member down one level and prefetches the member's next group as soon as its node is known, so
    the loads of the next pass are already in flight."""
    b = mass.shape[0]
    for i in range(b):
        out[i] = 0
    for level in range(1, depth + 1):
        base = offsets[level]
        nxt = offsets[level + 1]
        last = level == depth
        for i in range(b):
            first = base + out[i] * k
            m = mass[i]
            if k == 16:
                child = _count_not_above(prefix, first, 16, m)
            else:
                child = _count_not_above(prefix, first, k, m)
            if child >= k:
                child = _last_positive(sums, first, k)
            mass[i] = m - (prefix[first + child - 1] if child > 0 else 0.0)
            node = out[i] * k + child
            out[i] = node
            if not last:
                _prefetch_group(prefix, nxt + node * k, k)
            else:  # the leaf's own priority, which callers read next (for importance weights)
                _prefetch(sums, base + node)
    return out


@njit(**_NJIT)
def _sample_sync(sums, prefix, offsets, depth, k, uniforms, mass, out):
    """Stratified sample, level-synchronous: out[i] = find((i + u_i) * total / B)."""
    b = uniforms.shape[0]
    step = sums[0] / b
    for i in range(b):
        mass[i] = (i + uniforms[i]) * step
    return _find_sync(sums, prefix, offsets, depth, k, mass[:b], out)


@njit(**_NJIT)
def _sample_sync_prio(sums, prefix, offsets, depth, k, uniforms, mass, out, out_prio):
    _sample_sync(sums, prefix, offsets, depth, k, uniforms, mass, out)
    leaf = offsets[depth]
    for i in range(uniforms.shape[0]):
        out_prio[i] = sums[leaf + out[i]]
    return out


@njit(**_NJIT)
def _sample_member(sums, prefix, offsets, depth, k, uniforms, out):
    """Per-member descent (one member root to leaf, then the next): the slower alternative, kept
    for the comparison in the benchmark."""
    b = uniforms.shape[0]
    step = sums[0] / b
    for i in range(b):
        m = (i + uniforms[i]) * step
        node = 0
        for level in range(1, depth + 1):
            first = offsets[level] + node * k
            child = _count_not_above(prefix, first, k, m)
            if child >= k:
                child = _last_positive(sums, first, k)
            m = m - (prefix[first + child - 1] if child > 0 else 0.0)
            node = node * k + child
        out[i] = node
    return out


# -- update ---------------------------------------------------------------------------------------
@njit(inline="always")
def _parent(node, k, shift):
    """node // k, as a shift when k is a power of two (shift >= 0): an integer division by a
    runtime k costs ~25 cycles, ~4 us per 256-leaf update (measured)."""
    return node >> shift if shift >= 0 else node // k


@njit(**_NJIT)
def _propagate(sums, prefix, mins, offsets, depth, k, indices, marks, nodes):
    """Recomputes every ancestor of the leaves `indices` once, bottom-up, from its children.
    `marks[g] == stamp` marks internal node g (global id) as already collected in this call; the
    stamp lives in marks[-1] and advances per call, so marks never need clearing."""
    stamp = marks[-1] + 1
    marks[-1] = stamp
    n = indices.shape[0]
    shift = -1
    if k & (k - 1) == 0:
        shift = 0
        while (1 << shift) < k:
            shift += 1
    # parents of the leaves, each once, in first-touch order
    base = offsets[depth - 1]
    m = 0
    for i in range(n):
        p = _parent(indices[i], k, shift)
        g = base + p
        if marks[g] != stamp:
            marks[g] = stamp
            nodes[m] = p
            m += 1
    # what the two lowest levels' recompute reads and a sample did not touch (it walks the
    # cumulative sums): the leaves' sibling groups and their parents' (sums and mins)
    for i in range(m):
        _prefetch_group(sums, offsets[depth] + nodes[i] * k, k)
        if depth >= 2:
            first = _parent(nodes[i], k, shift) * k
            _prefetch_group(sums, base + first, k)
            _prefetch_group(mins, base + first, k)
    for level in range(depth - 1, -1, -1):
        # each touched node from its K children: their cumulative sums (sequential, as np.cumsum),
        # its sum (numpy's pairwise order) and its min (a leaf's min is its priority, inf when 0).
        # Written out here rather than in a helper: a non-inlined call per node costs a refcount
        # round trip per array argument, which tripled the update's time (measured)
        base = offsets[level]
        child_base = offsets[level + 1]
        leaf_children = level + 1 == depth
        # the cumulative sums in a pass of their own, two nodes interleaved: each is a chain of k
        # dependent adds, and two independent chains run side by side (measured faster than one
        # fused pass per node)
        i = 0
        while i + 2 <= m:
            f0 = child_base + nodes[i] * k
            f1 = child_base + nodes[i + 1] * k
            c0 = sums[f0]
            c1 = sums[f1]
            prefix[f0] = c0
            prefix[f1] = c1
            for j in range(1, k):
                c0 = c0 + sums[f0 + j]
                c1 = c1 + sums[f1 + j]
                prefix[f0 + j] = c0
                prefix[f1 + j] = c1
            i += 2
        if i < m:
            first = child_base + nodes[i] * k
            c = sums[first]
            prefix[first] = c
            for j in range(1, k):
                c = c + sums[first + j]
                prefix[first + j] = c
        for i in range(m):
            node = nodes[i]
            first = child_base + node * k
            if k <= 128:
                sums[base + node] = _pairwise_small(sums, first, k)
            else:
                sums[base + node] = _pairwise_sum(sums, first, k)
            if leaf_children:
                smallest = np.inf
                for j in range(k):  # selects, not branches: these would be mispredicted
                    v = sums[first + j]
                    v = v if v > 0 else np.inf
                    smallest = v if v < smallest else smallest
                mins[base + node] = smallest
            else:
                mins[base + node] = _min_children(mins, first, k)
        if level > 0:
            up = offsets[level - 1]
            mm = 0
            for i in range(m):
                p = _parent(nodes[i], k, shift)
                g = up + p
                if marks[g] != stamp:
                    marks[g] = stamp
                    nodes[mm] = p  # mm <= i: overwrites only entries already consumed
                    mm += 1
            m = mm


@njit(**_NJIT)
def _check_indices(indices, capacity):
    for i in range(indices.shape[0]):
        j = indices[i]
        if j < 0 or j >= capacity:
            return i
    return -1


@njit(**_NJIT)
def _update(sums, prefix, mins, offsets, depth, k, capacity, indices, priorities, marks, nodes):
    bad = _check_indices(indices, capacity)
    if bad >= 0:
        return bad
    leaf = offsets[depth]
    for i in range(indices.shape[0]):
        sums[leaf + indices[i]] = priorities[i]
    _propagate(sums, prefix, mins, offsets, depth, k, indices, marks, nodes)
    return -1


@njit(**_NJIT)
def _update_from_td(sums, prefix, mins, offsets, depth, k, capacity, indices, td, alpha, eps, marks,
                    nodes):
    """Priorities (|td| + eps) ** alpha; returns (first bad index or -1, max(|td| + eps))."""
    bad = _check_indices(indices, capacity)
    if bad >= 0:
        return bad, 0.0
    leaf = offsets[depth]
    top = -np.inf
    for i in range(indices.shape[0]):
        raw = abs(np.float64(td[i])) + eps
        if raw > top:
            top = raw
        sums[leaf + indices[i]] = raw ** alpha
    _propagate(sums, prefix, mins, offsets, depth, k, indices, marks, nodes)
    return -1, top


@njit(**_NJIT)
def _fill_uniform(sums, prefix, mins, offsets, depth, k, start, count, capacity, priority, marks,
                  nodes):
    """Sets `count` consecutive leaves from `start` (wrapping at capacity) to one priority: the
    insert path of prioritized replay (new transitions get the max priority) without building
    index/priority arrays."""
    idx = np.empty(count, np.int64)
    leaf = offsets[depth]
    j = start
    for i in range(count):
        idx[i] = j
        sums[leaf + j] = priority
        j += 1
        if j == capacity:
            j = 0
    _propagate(sums, prefix, mins, offsets, depth, k, idx, marks, nodes)


# -- the tree -------------------------------------------------------------------------------------
def _as_index_array(indices) -> np.ndarray:
    if type(indices) is np.ndarray and indices.dtype == np.int64 and indices.ndim == 1:
        return indices
    return np.ascontiguousarray(np.asarray(indices, dtype=np.int64).reshape(-1))


def _as_float_array(values) -> np.ndarray:
    if type(values) is np.ndarray and values.dtype == np.float64 and values.ndim == 1:
        return values
    return np.ascontiguousarray(np.asarray(values, dtype=np.float64).reshape(-1))


class NumbaSumTree:
    """`kernels.cpu.sumtree.SumTree`'s interface and results on flat arrays (see the module doc)."""

    def __init__(self, capacity: int, fanout: int = 16):
        if capacity < 1 or fanout < 2:
            raise ValueError(f"sum tree needs capacity >= 1 and fanout >= 2, got {capacity}, {fanout}")
        self.capacity, self.fanout = int(capacity), int(fanout)
        self.depth = 1
        while fanout ** self.depth < capacity:
            self.depth += 1
        sizes = [fanout ** d for d in range(self.depth + 1)]
        self.offsets = np.zeros(self.depth + 2, dtype=np.int64)  # offsets[depth + 1] = node count
        self.offsets[1:] = np.cumsum(sizes)
        nodes, internal = int(self.offsets[-1]), int(self.offsets[self.depth])
        self._buffer = np.zeros(2 * nodes + internal, dtype=np.float64)  # [sums | prefix | mins]
        self._buffer[2 * nodes:] = np.inf
        self._views()
        self._marks = np.zeros(internal + 1, dtype=np.int64)  # last entry: the current stamp
        self._scratch_nodes = np.empty(0, dtype=np.int64)
        self._scratch_mass = np.empty(0, dtype=np.float64)

    def _views(self) -> None:
        nodes = int(self.offsets[-1])
        self._sums = self._buffer[:nodes]
        self._prefix = self._buffer[nodes:2 * nodes]
        self._mins = self._buffer[2 * nodes:]
        self.sums = [self._sums[self.offsets[d]:self.offsets[d + 1]] for d in range(self.depth + 1)]
        self._leaves = self.sums[-1]

    # -- reads
    @property
    def leaves(self) -> np.ndarray:
        return self._leaves

    @property
    def mins(self) -> list[np.ndarray]:
        """The reference's min tree, level by level (the leaf level is computed from the leaves)."""
        internal = [self._mins[self.offsets[d]:self.offsets[d + 1]] for d in range(self.depth)]
        return internal + [np.where(self._leaves > 0, self._leaves, np.inf)]

    @property
    def total(self) -> float:
        return float(self._sums[0])

    def min(self) -> float:
        return float(self._mins[0])

    def get(self, indices) -> np.ndarray:
        return self._leaves[np.asarray(indices)]

    # -- writes
    def _nodes(self, n: int) -> np.ndarray:
        if self._scratch_nodes.shape[0] < n:
            self._scratch_nodes = np.empty(max(n, 2 * self._scratch_nodes.shape[0]), dtype=np.int64)
        return self._scratch_nodes

    def _arrays(self):
        return self._sums, self._prefix, self._mins, self.offsets, self.depth, self.fanout

    def update(self, indices, priorities) -> None:
        indices, priorities = _as_index_array(indices), _as_float_array(priorities)
        if indices.shape[0] != priorities.shape[0]:
            if priorities.shape[0] != 1:
                raise ValueError(f"{indices.shape[0]} indices but {priorities.shape[0]} priorities")
            priorities = np.full(indices.shape[0], priorities[0])
        if indices.shape[0] == 0:
            return
        bad = _update(*self._arrays(), self.capacity, indices, priorities, self._marks,
                      self._nodes(indices.shape[0]))
        if bad >= 0:
            raise IndexError(f"index {indices[bad]} out of range for capacity {self.capacity}")

    def update_from_td(self, indices, td_errors, alpha: float, eps: float) -> float:
        """Sets priorities (|td| + eps) ** alpha; returns max(|td| + eps) of the batch (-inf when
        empty). Equal to update(indices, (abs(td) + eps) ** alpha) up to the last bit of pow."""
        indices = _as_index_array(indices)
        td = td_errors if (type(td_errors) is np.ndarray and td_errors.ndim == 1
                           and td_errors.dtype in (np.float32, np.float64)) else _as_float_array(td_errors)
        if indices.shape[0] != td.shape[0]:
            raise ValueError(f"{indices.shape[0]} indices but {td.shape[0]} TD errors")
        if indices.shape[0] == 0:
            return -np.inf
        bad, top = _update_from_td(*self._arrays(), self.capacity, indices, td, float(alpha), float(eps),
                                   self._marks, self._nodes(indices.shape[0]))
        if bad >= 0:
            raise IndexError(f"index {indices[bad]} out of range for capacity {self.capacity}")
        return top

    def fill(self, start: int, count: int, priority: float) -> None:
        """update((start + arange(count)) % capacity, priority), without the arrays."""
        if count <= 0:
            return
        if not 0 <= start < self.capacity:
            raise IndexError(f"start {start} out of range for capacity {self.capacity}")
        count = min(int(count), self.capacity)  # more than capacity rewrites the same leaves
        _fill_uniform(*self._arrays(), int(start), count, self.capacity, float(priority), self._marks,
                      self._nodes(count))

    # -- sampling
    def _mass(self, n: int) -> np.ndarray:
        if self._scratch_mass.shape[0] < n:
            self._scratch_mass = np.empty(max(n, 2 * self._scratch_mass.shape[0]), dtype=np.float64)
        return self._scratch_mass

    def find(self, prefix_sums) -> np.ndarray:
        mass = np.array(prefix_sums, dtype=np.float64).reshape(-1)
        out = np.empty(mass.shape[0], dtype=np.int64)
        return _find_sync(self._sums, self._prefix, self.offsets, self.depth, self.fanout, mass, out)

    def sample(self, uniforms) -> np.ndarray:
        uniforms = _as_float_array(uniforms)
        out = np.empty(uniforms.shape[0], dtype=np.int64)
        return _sample_sync(self._sums, self._prefix, self.offsets, self.depth, self.fanout, uniforms,
                            self._mass(uniforms.shape[0]), out)

    def sample_into(self, uniforms, out_indices, out_priorities=None) -> np.ndarray:
        """sample() into a preallocated int64 array (and the sampled leaves' priorities into
        `out_priorities`, float64, when given); no allocation. Returns out_indices."""
        b = uniforms.shape[0]
        if out_priorities is None:
            return _sample_sync(self._sums, self._prefix, self.offsets, self.depth, self.fanout, uniforms,
                                self._mass(b), out_indices)
        return _sample_sync_prio(self._sums, self._prefix, self.offsets, self.depth, self.fanout,
                                 uniforms, self._mass(b), out_indices, out_priorities)

    def sample_per_member(self, uniforms) -> np.ndarray:
        """sample() by per-member descent (same result; the slower variant, for benchmarks)."""
        uniforms = _as_float_array(uniforms)
        out = np.empty(uniforms.shape[0], dtype=np.int64)
        return _sample_member(self._sums, self._prefix, self.offsets, self.depth, self.fanout, uniforms,
                              out)

    def __getstate__(self):
        state = dict(self.__dict__)
        for name in ("sums", "_sums", "_prefix", "_mins", "_leaves"):
            state.pop(name)
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._views()


def compile_all() -> None:
    """Compiles (or loads from the cache) every kernel of the float64/int64 signatures."""
    tree = NumbaSumTree(5, 2)
    tree.update(np.arange(5), np.arange(1.0, 6.0))
    tree.update_from_td(np.arange(2), np.ones(2), 0.6, 1e-6)
    tree.update_from_td(np.arange(2), np.ones(2, np.float32), 0.6, 1e-6)
    tree.fill(3, 4, 1.0)
    tree.find(np.array([0.5]))
    tree.sample(np.array([0.5, 0.25]))
    out = np.empty(2, np.int64)
    tree.sample_into(np.array([0.5, 0.25]), out)
    tree.sample_into(np.array([0.5, 0.25]), out, np.empty(2))
    tree.sample_per_member(np.array([0.5]))
