/* PEARL prioritized replay on OpenCL: a K-ary sum tree plus a min tree, and a row gather.

   The host prepends (see sumtree.py, `_program`):
     #define FANOUT K          the tree's fanout, a compile-time constant so loops unroll
     #define USE_DOUBLE 0/1    float64 when the device has cl_khr_fp64, else float32
     #define NODE_SUM(c) ...   sum of c[0..K-1] in numpy's pairwise order (straight-line code
                               generated on the host), so every internal node equals, bit for
                               bit, what the numpy reference computes with .sum(axis=1)

   Layout (same as kernels/cpu/sumtree.py): the whole tree is one buffer, level by level; level 0
   is the root, level d holds K^d nodes and starts at offset (K^d - 1) / (K - 1); node n of level
   d has children n*K .. n*K+K-1 on level d+1; the last level's first `capacity` nodes are the
   leaves. `mins` has the same layout, with +inf for empty (zero-priority) leaves.
*/
#pragma OPENCL FP_CONTRACT OFF

#if USE_DOUBLE
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
typedef double real;
#else
typedef float real;
#endif

/* The leaf whose bracket [c_{j-1}, c_j) holds `mass`, descending one root-to-leaf path.
   Per level: the first child whose running (sequential, as np.cumsum) sum exceeds the remaining
   mass. Rounding can leave none (mass >= the node's recomputed sum): then the last child with
   any mass, exactly as the reference does, so a non-negative prefix never lands on a
   zero-priority leaf while the total is positive. */
inline long descend(__global const real *sums, const int depth, real mass)
{
    long node = 0, offset = 0, width = 1;
    for (int level = 1; level <= depth; ++level) {
        offset += width;
        width *= FANOUT;
        __global const real *c = sums + offset + node * FANOUT;
        real cumulative = (real)0, before = (real)0;
        int child = FANOUT;
        for (int j = 0; j < FANOUT; ++j) {
            const real next = cumulative + c[j];
            if (next > mass) { child = j; before = cumulative; break; }
            cumulative = next;
        }
        if (child == FANOUT) {  /* rounding guard */
            child = FANOUT - 1;
            for (int j = FANOUT - 1; j >= 0; --j) {
                if (c[j] > (real)0) { child = j; break; }
            }
            before = (real)0;
            for (int j = 0; j < child; ++j) before += c[j];
        }
        mass -= before;
        node = node * FANOUT + child;
    }
    return node;
}

/* out[i] = leaf holding prefixes[i]. */
__kernel void find(__global const real *sums, const int depth,
                   __global const real *prefixes, __global long *out, const long n)
{
    const long i = get_global_id(0);
    if (i >= n) return;
    out[i] = descend(sums, depth, prefixes[i]);
}

/* Stratified sampling: out[i] = leaf holding (i + u_i) * total / n, total read from the root. */
__kernel void sample(__global const real *sums, const int depth,
                     __global const real *uniforms, __global long *out, const long n)
{
    const long i = get_global_id(0);
    if (i >= n) return;
    const real step = sums[0] / (real)n;
    out[i] = descend(sums, depth, ((real)i + uniforms[i]) * step);
}

/* The level-by-level path, for large batches (same `packed` layout as update_fused below):
   writes the n unique leaves packed[start ..] to the values stored at packed[values_start ..]. */
__kernel void set_leaves(__global real *sums, __global real *mins, const long leaf_offset,
                         __global const long *packed, const long start, const long values_start,
                         const long n)
{
    const long i = get_global_id(0);
    if (i >= n) return;
    const long leaf = leaf_offset + packed[start + i];
    const real v = ((__global const real *)(packed + values_start))[i];
    sums[leaf] = v;
    mins[leaf] = v > (real)0 ? v : (real)INFINITY;
}

/* One level of an update: recomputes the (unique) parents nodes[start .. start+n) of that level
   from their children, which the previous launch (in the same in-order queue) finished. */
__kernel void recompute(__global real *sums, __global real *mins, const long level_offset,
                        const long child_offset, __global const long *nodes, const long start,
                        const long n)
{
    const long i = get_global_id(0);
    if (i >= n) return;
    const long parent = nodes[start + i];
    __global const real *c = sums + child_offset + parent * FANOUT;
    __global const real *m = mins + child_offset + parent * FANOUT;
    real smallest = m[0];
    for (int j = 1; j < FANOUT; ++j) smallest = fmin(smallest, m[j]);
    sums[level_offset + parent] = NODE_SUM(c);
    mins[level_offset + parent] = smallest;
}

/* A whole update in ONE launch of ONE work-group, for small batches (where the launch latency
   of the level-by-level path dominates). `packed` (one upload) holds:
     packed[0 .. depth+1]      segment boundaries: segment s = packed[packed[s] .. packed[s+1]),
                               s = 0 the unique leaves, s = 1 .. depth their unique ancestors,
                               bottom up (s = depth is the root)
     packed[packed[depth+1] ..] the leaf values (raw bits of `real`, 8-byte aligned)
   The work-items stride over each segment; a work-group barrier with a global fence between the
   levels makes each level's writes visible to the next (the only grid-wide barrier OpenCL has is
   a launch boundary, so this is why it is a single work-group). */
__kernel void update_fused(__global real *sums, __global real *mins,
                           __global const long *packed, const int depth)
{
    const long lid = get_local_id(0), step = get_local_size(0);
    __global const real *values = (__global const real *)(packed + packed[depth + 1]);
    long offset = 0, width = 1;  /* offset of the leaf level */
    for (int level = 0; level < depth; ++level) { offset += width; width *= FANOUT; }
    const long first = packed[0], count = packed[1] - packed[0];
    for (long i = lid; i < count; i += step) {
        const long leaf = offset + packed[first + i];
        const real v = values[i];
        sums[leaf] = v;
        mins[leaf] = v > (real)0 ? v : (real)INFINITY;
    }
    for (int s = 1; s <= depth; ++s) {
        barrier(CLK_GLOBAL_MEM_FENCE);
        width /= FANOUT;
        const long child_offset = offset;
        offset -= width;  /* now the offset of level depth - s */
        const long begin = packed[s], end = packed[s + 1];
        for (long i = begin + lid; i < end; i += step) {
            const long parent = packed[i];
            __global const real *c = sums + child_offset + parent * FANOUT;
            __global const real *m = mins + child_offset + parent * FANOUT;
            real smallest = m[0];
            for (int j = 1; j < FANOUT; ++j) smallest = fmin(smallest, m[j]);
            sums[offset + parent] = NODE_SUM(c);
            mins[offset + parent] = smallest;
        }
    }
}

/* out[i] = leaf priority at nodes[i]. */
__kernel void get_leaves(__global const real *sums, const long leaf_offset,
                         __global const long *nodes, __global real *out, const long n)
{
    const long i = get_global_id(0);
    if (i >= n) return;
    out[i] = sums[leaf_offset + nodes[i]];
}

/* Transition storage gather: dst row i = src row index[i], rows of `words` 32-bit words
   (2-D range: batch x words). Indices outside [0, rows) leave the output row untouched. */
__kernel void gather_rows_u32(__global const uint *src, __global uint *dst,
                              __global const long *index, const long n, const long words,
                              const long rows)
{
    const long i = get_global_id(0), w = get_global_id(1);
    if (i >= n || w >= words) return;
    const long row = index[i];
    if (row < 0 || row >= rows) return;
    dst[i * words + w] = src[row * words + w];
}

/* The same for rows whose size is not a multiple of 4 bytes. */
__kernel void gather_rows_u8(__global const uchar *src, __global uchar *dst,
                             __global const long *index, const long n, const long bytes,
                             const long rows)
{
    const long i = get_global_id(0), b = get_global_id(1);
    if (i >= n || b >= bytes) return;
    const long row = index[i];
    if (row < 0 || row >= rows) return;
    dst[i * bytes + b] = src[row * bytes + b];
}
