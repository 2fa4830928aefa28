"""The K-ary sum tree (plus min tree) of `kernels.cpu.sumtree.SumTree`, compiled with numba.

Same interface and same results as the numpy reference, bit for bit:

    NumbaSumTree(capacity, fanout=16)
    update(indices, priorities)          last duplicate wins
    update_from_td(indices, td, alpha, eps)  priorities (|td| + eps) ** alpha computed in the kernel
                                         (within 2e-13 of np.power: kernels/cpu/fastmath.py);
                                         returns max(|td| + eps) (for the "max priority seen")
    find(prefix_sums)                    leaf whose bracket [c_{j-1}, c_j) holds each prefix sum
    sample(uniforms)                     stratified find((i + u_i) * total / B)
    sample_into(uniforms, out_indices, out_priorities=None)   the same, no allocation
    total, min(), get(indices), capacity, fanout, depth, sums, mins, leaves

Layout: one float64 allocation holds three arrays that share the level offsets (level d starts at
offsets[d], the end of level d - 1 rounded up to a cache line, so a group of 16 children is
exactly two lines):
- `sums`: every node's sum, root first, leaves last, as in the reference;
- `prefix`: for every internal node, the sequential cumulative sum of its sibling group up to and
  including it (np.cumsum of the K children of its parent, exactly what the reference's descent
  computes on the fly). Not stored for the leaves: their group's cumulative sums are summed
  during the descent (two lines the descent reads anyway), so an update never rewrites them and
  a sample + update touches half the leaf-level lines;
- `mins`: the min tree's internal levels only. A leaf's own min is its priority (inf when zero),
  which `sums` already holds.

Why the prefix array: a descent that recomputes K cumulative sums per level costs K dependent
adds and compares per member and level; with the cumulative sums stored, "the first child whose
cumulative sum exceeds the remaining mass" is a branchless binary search, log2(K) loads.

Bit-identical to the reference: a parent is the sum of its K children in numpy's own order
(`ndarray.sum` over a contiguous row is numpy's pairwise summation: below 8 elements a plain loop,
otherwise 8 running partial sums combined as ((r0+r1)+(r2+r3))+((r4+r5)+(r6+r7)) plus the
remainder, recursing above 128); the cumulative sums are the reference's sequential cumsum,
non-decreasing because priorities are >= 0, so counting the sums <= mass gives the reference's
child; the mass left is mass - cumsum[child - 1] as in the reference; the rounding guard (no
child's cumulative sum exceeds the mass: the last child with positive mass) is the same, so a
zero-priority leaf is never returned; mins are exact in any order.

Kernels (`@njit(cache=True, nogil=True)`; no `parallel=True`: a parallel region's start-up is of
the order of a whole batch-256 sample on 2 shared cores).
- sample: level-synchronous descent (every batch member advances one level per pass, so the loads
  of different members are independent and their cache misses overlap), with a software prefetch
  of each member's next-level group issued as soon as its node is known; the top levels (up to
  4096 nodes, cache-resident) in one pass per member. At fanouts 8, 16 and 32 a member's child is
  one vector compare of the group's cumulative sums and a popcount of its mask (an LLVM intrinsic
  below); other fanouts take a branchless binary search. The leaf step can also return each leaf's
  priority and prefetch its transition row for the gather that follows (kernels/cpu/fast_per.py).
- update: write leaves in batch order (last duplicate wins) keeping the min tree exact on the way
  (an ancestor's min is rescanned only when its old min rose), then per level collect each
  touched parent once (sorted input, as a stratified sample's leaves are: by comparing neighbours;
  otherwise with a stamp array, no sort/unique) and recompute its children's cumulative sums and
  its sum from its children (fanout 16: the pairwise sum in vector registers), never from deltas,
  so rounding never drifts.
Measured at capacity 1M, fanout 16, batch 256, sample then update of the sampled leaves through
PrioritizedReplay (2-core VM): 58 -> ~31 us against the previous layout (leaf cumulative sums
stored, every ancestor's min recomputed, unaligned levels, binary search at every level, libm pow;
docs/BENCHMARKS.md, Replay, has the steps and what was tried).
"""
from __future__ import annotations

from functools import partial

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from pearl.kernels.cpu.fastmath import power

_NJIT = dict(cache=True, nogil=True)
LINE_FLOATS = 8  # float64s in a 64-byte cache line


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


def _count_not_above_intrinsic(width):
    @intrinsic
    def count(typingctx, arr, first, mass):
        """How many of the float64s arr[first:first+width] are <= mass: one vector compare and a
        population count of its mask, instead of a binary search's dependent loads."""
        if not isinstance(arr, types.Array) or arr.dtype != types.float64:
            return None

        def codegen(context, builder, signature, args):
            ary = context.make_array(signature.args[0])(context, builder, args[0])
            lanes = ir.VectorType(ir.DoubleType(), width)
            vector = builder.load(builder.bitcast(builder.gep(ary.data, [args[1]]), lanes.as_pointer()),
                                  align=8)
            undefined = ir.Constant(lanes, ir.Undefined)
            first_lane = builder.insert_element(undefined, args[2], ir.Constant(ir.IntType(32), 0))
            splat = builder.shuffle_vector(first_lane, undefined,
                                           ir.Constant(ir.VectorType(ir.IntType(32), width), [0] * width))
            mask = builder.bitcast(builder.fcmp_ordered("<=", vector, splat), ir.IntType(width))
            popcount = builder.module.declare_intrinsic("llvm.ctpop", [ir.IntType(64)])
            return builder.call(popcount, [builder.zext(mask, ir.IntType(64))])

        return types.int64(arr, first, mass), codegen
    return count


_count8_not_above = _count_not_above_intrinsic(8)
_count16_not_above = _count_not_above_intrinsic(16)
_count32_not_above = _count_not_above_intrinsic(32)


@intrinsic
def _pairwise16(typingctx, arr, first):
    """numpy's pairwise sum of the float64s arr[first:first+16], bit for bit, in vector registers:
    r = a[0:8] + a[8:16], then ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7)) as three
    shuffle-and-add steps (each lane pair's sum lands in both lanes; addition is commutative)."""
    if not isinstance(arr, types.Array) or arr.dtype != types.float64:
        return None

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        lanes = ir.VectorType(ir.DoubleType(), 8)
        start = builder.gep(ary.data, [args[1]])
        low = builder.load(builder.bitcast(start, lanes.as_pointer()), align=8)
        high = builder.load(builder.bitcast(builder.gep(start, [ir.Constant(ir.IntType(64), 8)]),
                                            lanes.as_pointer()), align=8)
        vector = builder.fadd(low, high)
        index = ir.VectorType(ir.IntType(32), 8)
        for order in ([1, 0, 3, 2, 5, 4, 7, 6], [2, 3, 0, 1, 6, 7, 4, 5], [4, 5, 6, 7, 0, 1, 2, 3]):
            vector = builder.fadd(vector, builder.shuffle_vector(vector, vector, ir.Constant(index, order)))
        return builder.extract_element(vector, ir.Constant(ir.IntType(32), 0))

    return types.float64(arr, first), codegen


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


# -- descent ----------------------------------------------------------------------------------------
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
    """Prefetches arr[first:first+k] (one hint per 64-byte line: a group of a multiple of 8
    children starts a line, the levels being line-aligned; other groups may straddle one more)."""
    for j in range(0, k, 8):
        _prefetch(arr, first + j)
    if k % 8:
        _prefetch(arr, first + k - 1)


@njit(**_NJIT)
def _descend_internal(sums, prefix, base, k, mass, out, ahead, ahead_base):
    """Every member moves from its node to the child (an internal node, on the level starting at
    `base`) whose bracket of stored cumulative sums holds its mass, and prefetches that child's
    own children in `ahead` (their cumulative sums, or the leaves' priorities on the last step).
    One pass per level, in its own function: with the leaf step in the same function LLVM compiled
    this loop 2x slower (measured)."""
    for i in range(out.shape[0]):
        first = base + out[i] * k
        m = mass[i]
        if k == 16:
            child = _count16_not_above(prefix, first, m)
        elif k == 8:
            child = _count8_not_above(prefix, first, m)
        elif k == 32:
            child = _count32_not_above(prefix, first, m)
        else:
            child = _count_not_above(prefix, first, k, m)
        if child >= k:
            child = _last_positive(sums, first, k)
        mass[i] = m - (prefix[first + child - 1] if child > 0 else 0.0)
        node = out[i] * k + child
        out[i] = node
        _prefetch_group(ahead, ahead_base + node * k, k)


@njit(**_NJIT)
def _descend_cached(sums, prefix, offsets, levels, k, mass, out, ahead, ahead_base):
    """Fanout 8 or 16, the top `levels` levels in one pass: each member takes all its steps through
    them before the next member. Their cumulative sums fit in the L1/L2 caches (at most 4096
    doubles on the lowest of them), so there are no misses to overlap level by level, and one pass
    saves the per-level stores and reloads of each member's node and mass. Prefetches the group
    below, in `ahead`."""
    for i in range(out.shape[0]):
        node = 0
        m = mass[i]
        for level in range(1, levels + 1):
            first = offsets[level] + node * k
            if k == 16:
                child = _count16_not_above(prefix, first, m)
            else:
                child = _count8_not_above(prefix, first, m)
            if child >= k:
                child = _last_positive(sums, first, k)
            m -= prefix[first + child - 1] if child > 0 else 0.0
            node = node * k + child
        mass[i] = m
        out[i] = node
        _prefetch_group(ahead, ahead_base + node * k, k)


@njit(**_NJIT)
def _descend_leaves(sums, base, k, mass, out, priorities, rows):
    """The last step, to a leaf: the leaves' cumulative sums are not stored (an update would have
    to rewrite them, and their lines would double the memory a sample and an update touch), so
    they are summed here in np.cumsum's order, counting those <= mass as the reference does.
    `priorities` (or None) receives each found leaf's priority; `rows` (or None): a (capacity,
    words) array whose row of each found leaf is prefetched at once, for a gather that follows."""
    for i in range(out.shape[0]):
        first = np.uintp(base + out[i] * k)
        m = mass[i]
        c = 0.0
        child = np.int64(0)
        for j in range(k):
            c += sums[first + np.uintp(j)]
            child += np.int64(c <= m)
        if child >= k:
            child = _last_positive(sums, np.int64(first), k)
        out[i] = out[i] * k + child
        if priorities is not None:
            priorities[i] = sums[np.int64(first) + child]
        if rows is not None:
            for word in range(0, rows.shape[1], 2 * LINE_FLOATS):  # 4-byte words: 16 per line
                _prefetch(rows[out[i]], word)


@njit(**_NJIT)
def _descend_pipelined16(sums, prefix, offsets, depth, top, mass, out, priorities, rows, near, far):
    """Fanout 16, depth - 2 == top: three stages software-pipelined in one loop. Member i takes its
    cache-resident steps (levels 1..top) and prefetches its level top + 1 group; member i - near
    takes its step on level top + 1 and prefetches its leaf group; member i - near - far takes
    its leaf step (and prefetches its transition row). Each prefetch has a fixed head start. The
    stages repeat _descend_cached's, _descend_internal's and _descend_leaves' bodies: as inlined
    helpers with array arguments numba keeps reference counts per iteration (measured 1.5x slower
    in the update's loops)."""
    b = out.shape[0]
    base = offsets[depth - 1]
    leaf_base = offsets[depth]
    for i in range(b + near + far):
        if i < b:
            node = 0
            m = mass[i]
            for level in range(1, top + 1):
                first = offsets[level] + node * 16
                child = _count16_not_above(prefix, first, m)
                if child >= 16:
                    child = _last_positive(sums, first, 16)
                m -= prefix[first + child - 1] if child > 0 else 0.0
                node = node * 16 + child
            mass[i] = m
            out[i] = node
            _prefetch(prefix, base + node * 16)
            _prefetch(prefix, base + node * 16 + 8)
        h = i - near
        if 0 <= h < b:
            first = base + out[h] * 16
            m = mass[h]
            child = _count16_not_above(prefix, first, m)
            if child >= 16:
                child = _last_positive(sums, first, 16)
            mass[h] = m - (prefix[first + child - 1] if child > 0 else 0.0)
            node = out[h] * 16 + child
            out[h] = node
            _prefetch(sums, leaf_base + node * 16)
            _prefetch(sums, leaf_base + node * 16 + 8)
        j = i - near - far
        if j >= 0:
            first = np.uintp(leaf_base + out[j] * 16)
            m = mass[j]
            c = 0.0
            child = np.int64(0)
            for t in range(16):
                c += sums[first + np.uintp(t)]
                child += np.int64(c <= m)
            if child >= 16:
                child = _last_positive(sums, np.int64(first), 16)
            out[j] = out[j] * 16 + child
            if priorities is not None:
                priorities[j] = sums[np.int64(first) + child]
            if rows is not None:
                for word in range(0, rows.shape[1], 2 * LINE_FLOATS):
                    _prefetch(rows[out[j]], word)


@njit(**_NJIT)
def _find(sums, prefix, offsets, depth, k, mass, out, priorities=None, rows=None):
    """Level-synchronous descent: `mass` (consumed) -> leaf indices in `out`. Each pass moves every
    member down one level, so the loads of different members are independent and their cache
    misses overlap, and prefetches the group each member reads next."""
    for i in range(out.shape[0]):
        out[i] = 0
    top = 0
    if (k == 16 or k == 8) and depth > 3:
        top = depth - 2  # levels down to 4096 nodes: the cumulative sums the caches hold
        while k ** top > 4096:
            top -= 1
        if k == 16 and top == depth - 2:
            _descend_pipelined16(sums, prefix, offsets, depth, top, mass, out, priorities, rows, 16, 32)
            return out
        _descend_cached(sums, prefix, offsets, top, k, mass, out, prefix, offsets[top + 1])
    for level in range(top + 1, depth - 1):
        _descend_internal(sums, prefix, offsets[level], k, mass, out, prefix, offsets[level + 1])
    if depth > 1:
        _descend_internal(sums, prefix, offsets[depth - 1], k, mass, out, sums, offsets[depth])
    _descend_leaves(sums, offsets[depth], k, mass, out, priorities, rows)
    return out


@njit(**_NJIT)
def _sample(sums, prefix, offsets, depth, k, uniforms, mass, out, priorities=None, rows=None):
    """Stratified sample, level-synchronous: out[i] = find((i + u_i) * total / B)."""
    b = uniforms.shape[0]
    step = sums[0] / b
    for i in range(b):
        mass[i] = (i + uniforms[i]) * step
    return _find(sums, prefix, offsets, depth, k, mass[:b], out, priorities, rows)


# -- update -----------------------------------------------------------------------------------------
@njit(inline="always")
def _parent(node, k, shift):
    """node // k, as a shift when k is a power of two (shift >= 0): an integer division by a
    runtime k costs ~25 cycles, ~4 us per 256-leaf update (measured)."""
    return node >> shift if shift >= 0 else node // k


@njit(inline="always")
def _as_min(priority):
    """A leaf's entry in the min tree: its priority, inf when zero (empty slots never count)."""
    return priority if priority > 0 else np.inf


@njit(**_NJIT)
def _write_leaves(sums, mins, offsets, depth, k, shift, indices, priorities):
    """Writes the leaves in batch order (the last duplicate wins) and keeps the min tree exact as
    it goes: an ancestor changes only if the new value undercuts its min, or if the old value was
    its min and rose (then its children are scanned again); the walk stops at the first ancestor
    that keeps its min, usually the leaf's parent. Mins are exact in any order, so this equals the
    reference's recompute from the children."""
    leaves = offsets[depth]
    n = indices.shape[0]
    parents = offsets[depth - 1]
    for i in range(min(n, 16)):
        _prefetch(mins, parents + _parent(indices[i], k, shift))
    for i in range(n):
        if i + 16 < n:  # a fixed head start: all at once, the prefetches wait for fill buffers
            _prefetch(mins, parents + _parent(indices[i + 16], k, shift))
        node = indices[i]
        new = priorities[i]
        old = sums[leaves + node]
        sums[leaves + node] = new
        new_min = _as_min(new)
        old_min = _as_min(old)
        for level in range(depth - 1, -1, -1):
            parent = _parent(node, k, shift)
            slot = offsets[level] + parent
            current = mins[slot]
            if new_min < current:
                mins[slot] = new_min
            elif old_min == current and new_min > old_min:
                first = offsets[level + 1] + parent * k
                if level + 1 == depth:
                    smallest = np.inf
                    for j in range(k):  # selects, not branches: these would be mispredicted
                        v = _as_min(sums[first + j])
                        smallest = v if v < smallest else smallest
                else:
                    smallest = _min_children(mins, first, k)
                if smallest == current:
                    break
                mins[slot] = smallest
                new_min = smallest
            else:
                break
            old_min = current
            node = parent


@njit(**_NJIT)
def _collect_parents(children, count, k, shift, marks, level_base, stamp, parents, sums, child_base):
    """The distinct parents of children[:count], in first-touch order, into `parents` (which may be
    `children` itself: parent j is written only after child j is read). `marks[level_base + p] ==
    stamp` marks parent p as collected; the stamp advances per update, so marks are never cleared.
    Prefetches each parent's children sums, which its recompute reads next."""
    found = 0
    for i in range(count):
        parent = _parent(children[i], k, shift)
        if marks[level_base + parent] != stamp:
            marks[level_base + parent] = stamp
            parents[found] = parent
            found += 1
            _prefetch_group(sums, child_base + parent * k, k)
    return found


@njit(**_NJIT)
def _collect_sorted_parents(children, count, k, shift, parents, sums, child_base, prefetch):
    """_collect_parents for non-decreasing children (a stratified sample's leaves are): equal
    parents are adjacent, so each is compared with the last one kept, and no marks are touched.
    Branchless (a repeat overwrites its slot): which parents repeat is unpredictable. With
    `prefetch`, each parent's children sums are prefetched (fanout 16's recompute prefetches 16
    nodes ahead itself instead: a fixed head start measured faster)."""
    found = 0
    last = -1
    for i in range(count):
        parent = _parent(children[i], k, shift)
        parents[found] = parent
        found += parent != last
        last = parent
        if prefetch:
            _prefetch_group(sums, child_base + parent * k, k)
    return found


@njit(**_NJIT)
def _recompute_prefix(sums, prefix, child_base, k, nodes, count):
    """Fanouts other than 8, 16, 32: the cumulative sums of each node's K children, sequential as
    np.cumsum, two nodes side by side (each is a chain of K dependent adds; two independent chains
    overlap)."""
    i = 0
    while i + 2 <= count:
        f0 = child_base + nodes[i] * k
        f1 = child_base + nodes[i + 1] * k
        c0 = 0.0
        c1 = 0.0
        for j in range(k):
            c0 += sums[f0 + j]
            c1 += sums[f1 + j]
            prefix[f0 + j] = c0
            prefix[f1 + j] = c1
        i += 2
    if i < count:
        first = child_base + nodes[i] * k
        c = 0.0
        for j in range(k):
            c += sums[first + j]
            prefix[first + j] = c


@njit(inline="always")
def _recompute_node(sums, prefix, base, child_base, node, with_prefix, k):
    first = child_base + node * k
    if with_prefix:
        c = 0.0
        for j in range(k):
            c += sums[first + j]
            prefix[first + j] = c
    sums[base + node] = _pairwise_small(sums, first, k)


@njit(**_NJIT)
def _recompute_nodes16(sums, prefix, base, child_base, nodes, count, with_prefix):
    """Fanout 16: each node's pairwise sum in vector registers (_pairwise16, before the stores:
    they may alias `sums`), then its children's cumulative sums (sequential, as np.cumsum)."""
    for i in range(count):
        if i + 16 < count:  # a fixed head start (all at once, prefetches wait for fill buffers)
            ahead = child_base + nodes[i + 16] * 16
            _prefetch(sums, ahead)
            _prefetch(sums, ahead + 8)
            if with_prefix:
                _prefetch(prefix, ahead)
                _prefetch(prefix, ahead + 8)
        node = nodes[i]
        first = child_base + node * 16
        total = _pairwise16(sums, first)
        if with_prefix:
            c = 0.0
            for j in range(16):
                c += sums[first + j]
                prefix[first + j] = c
        sums[base + node] = total


@njit(**_NJIT)
def _recompute_nodes_const(sums, prefix, base, child_base, nodes, count, with_prefix, k):
    """Fanout 8 or 32: each node's children cumulative sums (when stored) and its pairwise sum, with
    constant trip counts."""
    if k == 32:
        for i in range(count):
            _recompute_node(sums, prefix, base, child_base, nodes[i], with_prefix, 32)
    else:
        for i in range(count):
            _recompute_node(sums, prefix, base, child_base, nodes[i], with_prefix, 8)


@njit(**_NJIT)
def _recompute_sums(sums, base, child_base, k, nodes, count):
    """Fanouts other than 8, 16, 32: each node's sum from its K children in numpy's pairwise order."""
    for i in range(count):
        first = child_base + nodes[i] * k
        if k <= 128:
            sums[base + nodes[i]] = _pairwise_small(sums, first, k)
        else:
            sums[base + nodes[i]] = _pairwise_sum(sums, first, k)


@njit(**_NJIT)
def _write(sums, prefix, mins, offsets, depth, k, indices, ordered, priorities, marks, nodes):
    """Sets the leaves `indices` to `priorities` and recomputes every ancestor once, bottom-up:
    the leaves in order (with the min tree), then per level the distinct touched nodes' children
    cumulative sums and their own sums. Each recompute reads only the children, so nothing drifts.
    `ordered`: the indices are non-decreasing."""
    shift = -1
    if k & (k - 1) == 0:
        shift = 0
        while (1 << shift) < k:
            shift += 1
    stamp = marks[-1] + 1
    marks[-1] = stamp
    _write_leaves(sums, mins, offsets, depth, k, shift, indices, priorities)
    if ordered:
        count = _collect_sorted_parents(indices, indices.shape[0], k, shift, nodes, sums, offsets[depth],
                                        k != 16)
    else:
        count = _collect_parents(indices, indices.shape[0], k, shift, marks, offsets[depth - 1], stamp,
                                 nodes, sums, offsets[depth])
    for level in range(depth - 1, -1, -1):
        if k == 16:
            _recompute_nodes16(sums, prefix, offsets[level], offsets[level + 1], nodes, count,
                               level + 1 < depth)
        elif k == 8 or k == 32:
            _recompute_nodes_const(sums, prefix, offsets[level], offsets[level + 1], nodes, count,
                                   level + 1 < depth, k)
        else:
            if level + 1 < depth:  # the leaves' cumulative sums are not stored (see _descend_leaves)
                _recompute_prefix(sums, prefix, offsets[level + 1], k, nodes, count)
            _recompute_sums(sums, offsets[level], offsets[level + 1], k, nodes, count)
        if level > 0:
            if ordered:  # parents of sorted distinct nodes are sorted too
                count = _collect_sorted_parents(nodes, count, k, shift, nodes, sums, offsets[level], k != 16)
            else:
                count = _collect_parents(nodes, count, k, shift, marks, offsets[level - 1], stamp, nodes,
                                         sums, offsets[level])


@njit(**_NJIT)
def _check_indices(indices, capacity):
    """(the first index out of [0, capacity) or -1, whether the indices are non-decreasing)."""
    descents = 0
    for i in range(indices.shape[0]):
        j = indices[i]
        if j < 0 or j >= capacity:
            return i, False
        if i > 0:
            descents += j < indices[i - 1]
    return -1, descents == 0


@njit(**_NJIT)
def _update(sums, prefix, mins, offsets, depth, k, capacity, indices, priorities, marks, nodes):
    bad, ordered = _check_indices(indices, capacity)
    if bad >= 0:
        return bad
    _write(sums, prefix, mins, offsets, depth, k, indices, ordered, priorities, marks, nodes)
    return -1


@njit(**_NJIT)
def _update_from_td(sums, prefix, mins, offsets, depth, k, capacity, marks, nodes, scratch, indices, td,
                    alpha, eps):
    """Priorities (|td| + eps) ** alpha (via `scratch`, two floats per index); returns (first bad
    index or -1, max(|td| + eps))."""
    n = indices.shape[0]
    raw = scratch[:n]
    priorities = scratch[n:2 * n]
    top = -np.inf
    descents = 0
    for i in range(n):  # _check_indices and |td| + eps in one pass (scratch only: nothing written yet)
        j = indices[i]
        if j < 0 or j >= capacity:
            return i, 0.0
        if i > 0:
            descents += j < indices[i - 1]
        r = abs(np.float64(td[i])) + eps
        top = r if r > top else top
        raw[i] = r
    power(raw, alpha, priorities)
    ordered = descents == 0
    _write(sums, prefix, mins, offsets, depth, k, indices, ordered, priorities, marks, nodes)
    return -1, top


@njit(**_NJIT)
def _fill_uniform(sums, prefix, mins, offsets, depth, k, start, count, capacity, priority, marks,
                  nodes):
    """Sets `count` consecutive leaves from `start` (wrapping at capacity) to one priority: the
    insert path of prioritized replay (new transitions get the max priority)."""
    indices = np.empty(count, np.int64)
    priorities = np.full(count, priority)
    j = start
    for i in range(count):
        indices[i] = j
        j += 1
        if j == capacity:
            j = 0
    _write(sums, prefix, mins, offsets, depth, k, indices, start + count <= capacity, priorities, marks,
           nodes)


# -- the tree ---------------------------------------------------------------------------------------
_INT64, _FLOAT64, _FLOAT32 = np.dtype(np.int64), np.dtype(np.float64), np.dtype(np.float32)
_BOUND_BATCH_SIZES_UP_TO = 65536


def _as_index_array(indices) -> np.ndarray:
    if type(indices) is np.ndarray and indices.dtype is _INT64 and indices.ndim == 1:
        return indices
    return np.ascontiguousarray(np.asarray(indices, dtype=np.int64).reshape(-1))


def _as_float_array(values) -> np.ndarray:
    if type(values) is np.ndarray and values.dtype is _FLOAT64 and values.ndim == 1:
        return values
    return np.ascontiguousarray(np.asarray(values, dtype=np.float64).reshape(-1))


def _line_aligned(values: np.ndarray) -> np.ndarray:
    """A copy of a float64 array whose first element starts a cache line."""
    raw = np.empty(values.shape[0] + LINE_FLOATS, dtype=np.float64)
    start = (-raw.ctypes.data // 8) % LINE_FLOATS
    aligned = raw[start:start + values.shape[0]]
    aligned[:] = values
    return aligned


class NumbaSumTree:
    """`kernels.cpu.sumtree.SumTree`'s interface and results on flat arrays (see the module doc)."""

    def __init__(self, capacity: int, fanout: int = 16):
        if capacity < 1 or fanout < 2:
            raise ValueError(f"sum tree needs capacity >= 1 and fanout >= 2, got {capacity}, {fanout}")
        self.capacity, self.fanout = int(capacity), int(fanout)
        self.depth, self.sizes, self.offsets = self.layout(self.capacity, self.fanout)
        slots, internal = int(self.offsets[-1]), int(self.offsets[self.depth])
        buffer = np.zeros(slots + 2 * internal)  # [sums | prefix | mins], each line-aligned
        buffer[slots + internal:] = np.inf
        self._buffer = _line_aligned(buffer)
        self._views()
        self._marks = np.zeros(internal + 1, dtype=np.int64)  # last entry: the current stamp
        self._scratch_nodes = np.empty(0, dtype=np.int64)
        self._scratch_floats = np.empty(0, dtype=np.float64)
        self._td_kernels: dict[int, partial] = {}

    @staticmethod
    def layout(capacity: int, fanout: int) -> tuple[int, list[int], np.ndarray]:
        """(depth, nodes per level, each level's line-aligned offset; the last: all nodes) of a
        tree whose leaf level is the power of `fanout` that holds `capacity`."""
        depth = 1
        while fanout ** depth < capacity:
            depth += 1
        sizes = [fanout ** d for d in range(depth + 1)]
        offsets = np.zeros(depth + 2, dtype=np.int64)  # offsets[depth + 1]: all slots
        for d, size in enumerate(sizes):
            offsets[d + 1] = -(-(offsets[d] + size) // LINE_FLOATS) * LINE_FLOATS
        return depth, sizes, offsets

    @classmethod
    def bytes_needed(cls, capacity: int, fanout: int = 16) -> int:
        """What the tree allocates: its sums, the inner levels' prefixes and mins, the marks."""
        depth, _, offsets = cls.layout(int(capacity), int(fanout))
        slots, internal = int(offsets[-1]), int(offsets[depth])
        return 8 * (slots + 2 * internal) + 8 * (internal + 1)

    def _views(self) -> None:
        slots, internal = int(self.offsets[-1]), int(self.offsets[self.depth])
        self._sums = self._buffer[:slots]
        self._prefix = self._buffer[slots:slots + internal]
        self._mins = self._buffer[slots + internal:]
        self.sums = [self._sums[self.offsets[d]:self.offsets[d] + size] for d, size in enumerate(self.sizes)]
        self._leaves = self.sums[-1]

    # -- reads
    @property
    def leaves(self) -> np.ndarray:
        return self._leaves

    @property
    def mins(self) -> list[np.ndarray]:
        """The reference's min tree, level by level (the leaf level is computed from the leaves)."""
        internal = [self._mins[self.offsets[d]:self.offsets[d] + self.sizes[d]] for d in range(self.depth)]
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

    def _floats(self, n: int) -> np.ndarray:
        if self._scratch_floats.shape[0] < n:
            self._scratch_floats = np.empty(max(n, 2 * self._scratch_floats.shape[0]), dtype=np.float64)
        return self._scratch_floats

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
        """Sets priorities (|td| + eps) ** alpha (the power by kernels/cpu/fastmath.py, within
        2e-13 of np.power); returns max(|td| + eps) of the batch (-inf when empty)."""
        indices = _as_index_array(indices)
        td = td_errors if (type(td_errors) is np.ndarray and td_errors.ndim == 1 and (
            td_errors.dtype is _FLOAT32 or td_errors.dtype is _FLOAT64)) else _as_float_array(td_errors)
        n = indices.shape[0]
        if n != td.shape[0]:
            raise ValueError(f"{n} indices but {td.shape[0]} TD errors")
        if n == 0:
            return -np.inf
        kernel = self._td_kernels.get(n)
        if kernel is None:  # every array but the batch's own bound once per batch size (~0.5 us a call)
            kernel = partial(_update_from_td, self._sums, self._prefix, self._mins, self.offsets, self.depth,
                             self.fanout, self.capacity, self._marks, self._nodes(n), self._floats(2 * n))
            if n <= _BOUND_BATCH_SIZES_UP_TO:  # a learner's batches, not a bulk reset of priorities
                self._td_kernels[n] = kernel
        bad, top = kernel(indices, td, float(alpha), float(eps))
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
    def find(self, prefix_sums) -> np.ndarray:
        mass = np.array(prefix_sums, dtype=np.float64).reshape(-1)
        out = np.empty(mass.shape[0], dtype=np.int64)
        return _find(self._sums, self._prefix, self.offsets, self.depth, self.fanout, mass, out)

    def sample(self, uniforms) -> np.ndarray:
        uniforms = _as_float_array(uniforms)
        out = np.empty(uniforms.shape[0], dtype=np.int64)
        return _sample(self._sums, self._prefix, self.offsets, self.depth, self.fanout, uniforms,
                       self._floats(uniforms.shape[0]), out)

    def sample_into(self, uniforms, out_indices, out_priorities=None) -> np.ndarray:
        """sample() into a preallocated int64 array (and the sampled leaves' priorities into
        `out_priorities`, float64, when given); no allocation. Returns out_indices."""
        b = uniforms.shape[0]
        if out_priorities is None:
            return _sample(self._sums, self._prefix, self.offsets, self.depth, self.fanout, uniforms,
                           self._floats(b), out_indices)
        return _sample(self._sums, self._prefix, self.offsets, self.depth, self.fanout, uniforms,
                       self._floats(b), out_indices, out_priorities)

    def __getstate__(self):
        state = dict(self.__dict__)
        for name in ("sums", "_sums", "_prefix", "_mins", "_leaves"):
            state.pop(name)
        state["_td_kernels"] = {}  # bound to the buffer's views: rebound after a copy
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._buffer = _line_aligned(self._buffer)
        self._views()

