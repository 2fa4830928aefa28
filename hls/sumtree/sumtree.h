// The replay manager's K-ary sum tree (plus min tree) as an HLS dataflow pipeline.
//
// Same layout and same results as the numpy reference kernels/cpu/sumtree.py: level 0 is the
// root, level L holds K^L nodes, node n of level L has children n*K .. n*K+K-1; the first
// `capacity` nodes of level D are the leaves.
//
// Hardware structure (the PEARL paper's replay manager): every tree level is its own on-chip
// memory, owned by one pipeline stage; a batch streams through the stages, one level per stage.
// - sample / find, root to leaves: stage 0 reads the total and forms each prefix; stage L
//   (1..D) reads the K children of the member's node on level L (the level is partitioned
//   cyclically by K, so the K reads are one cycle), forms their sequential cumulative sums,
//   picks the first child whose cumulative sum exceeds the remaining mass and subtracts the
//   cumulative sum before it. While stage L works on member i, stage L+1 works on member i-1.
// - update, leaves to root: stage D writes a leaf (batch order, so the last duplicate wins),
//   reads the leaf's K siblings and passes the parent's new sum and min to stage D-1, which
//   writes them into level D-1 and does the same one level up. Every node is recomputed from its
//   children (no running deltas, so rounding never drifts), and each stage touches only its own
//   level, so the stages overlap like the sample stages do. Processing the updates in order
//   gives every ancestor the value the reference's batch recompute gives it: the last update
//   below a node recomputes it after every leaf under it has its final value.
//
// Precision: `R` is the node type. float64 makes every node, total, min and sampled index
// bit-identical to the reference (node sums use numpy's pairwise order, `pairwise_sum`).
// float32 (the hardware default, see hls/README.md) halves on-chip memory and adder cost; then
// indices agree with the float64 reference except for prefixes within ~1e-6 x total of a bracket
// boundary, and a zero-priority leaf is still never returned (the overflow rule below).
#ifndef PEARL_SUMTREE_H
#define PEARL_SUMTREE_H

#include <limits>

#include "pearl_hls.h"

namespace pearl {
namespace sumtree {

typedef long long index_t;

enum Op { OP_CLEAR = 0, OP_UPDATE = 1, OP_SAMPLE = 2, OP_FIND = 3, OP_GET = 4, OP_ROOT = 5, OP_INFO = 6 };

template <typename R>
inline R infinity() { return std::numeric_limits<R>::infinity(); }

// One level's memories. A leaf's min is its priority (inf when zero), derived from the leaf sum
// on the fly, so the leaf level stores no min array.
template <typename R, int K, int D, int L>
struct Level {
    static const long nodes = ipow(K, L);
    R sum[nodes];
    R min[L < D ? nodes : 1];
};

template <typename R, int K, int D, int L = D>
struct Levels {
    Levels<R, K, D, L - 1> upper;
    Level<R, K, D, L> level;
};
template <typename R, int K, int D>
struct Levels<R, K, D, 0> {
    Level<R, K, D, 0> level;
};

// Level L of a Levels<..., Top> (compile-time walk, no hardware).
template <int L, int Top>
struct At {
    template <class T>
    static auto &get(T &levels) { return At<L, Top - 1>::get(levels.upper); }
};
template <int L>
struct At<L, L> {
    template <class T>
    static auto &get(T &levels) { return levels.level; }
};

template <typename R, int K, int D>
struct Tree {
    static_assert(K >= 2 && K <= 64 && (K & (K - 1)) == 0, "fanout must be a power of two in [2, 64]");
    static_assert(D >= 1, "depth must be >= 1");
    static const int fanout = K;
    static const int depth = D;
    static const long leaves = ipow(K, D);
    Levels<R, K, D> levels;
};

template <typename R, int K>
inline R min_of(const R m[K]) {
#pragma HLS INLINE
    R best = m[0];
    for (int j = 1; j < K; ++j) {
#pragma HLS UNROLL
        best = m[j] < best ? m[j] : best;
    }
    return best;
}

template <typename R>
inline R leaf_min(R priority) { return priority > R(0) ? priority : infinity<R>(); }

// -- clear ----------------------------------------------------------------------------------
template <typename R, int K, int D, int L>
struct ClearLevels {
    static void run(Tree<R, K, D> &tree) {
        auto &lv = At<L, D>::get(tree.levels);
    clear_level:
        for (long n = 0; n < lv.nodes; ++n) {
#pragma HLS PIPELINE II = 1
            lv.sum[n] = R(0);
            if (L < D) lv.min[n] = infinity<R>();
        }
        ClearLevels<R, K, D, L - 1>::run(tree);
    }
};
template <typename R, int K, int D>
struct ClearLevels<R, K, D, -1> {
    static void run(Tree<R, K, D> &) {}
};

template <typename R, int K, int D>
void clear(Tree<R, K, D> &tree) { ClearLevels<R, K, D, D>::run(tree); }

// -- update: leaves to root ------------------------------------------------------------------
template <typename R>
struct NodeValue {
    index_t node;  // on the level the receiving stage owns
    R sum;
    R min;
};

// Stage D: write the leaves in batch order, recompute each leaf's parent from its K siblings.
template <typename R, int K, int D>
void update_leaves(Tree<R, K, D> &tree, const index_t indices[], const R priorities[], int n,
                   hls::stream<NodeValue<R> > &out) {
#pragma HLS INLINE off
    auto &lv = At<D, D>::get(tree.levels);
#pragma HLS ARRAY_PARTITION variable = lv.sum cyclic factor = K
#pragma HLS BIND_STORAGE variable = lv.sum type = ram_2p impl = uram
update_leaf:
    for (int i = 0; i < n; ++i) {
// II 3, not 1: the next update may read the sibling group this one writes, a read-after-write
// through the level's memory (write + read latency); declared in hls/timing.json
#pragma HLS PIPELINE II = 3
#pragma HLS LOOP_TRIPCOUNT min = 1 max = 4096
        const index_t leaf = indices[i];
        const R priority = priorities[i];
        lv.sum[leaf] = priority;
        const index_t base = leaf - leaf % K;
        R c[K], m[K];
#pragma HLS ARRAY_PARTITION variable = c complete
#pragma HLS ARRAY_PARTITION variable = m complete
        for (int j = 0; j < K; ++j) {
#pragma HLS UNROLL
            // the written leaf is forwarded rather than read back, so the group read does not
            // wait on the write
            c[j] = (base + j == leaf) ? priority : lv.sum[base + j];
            m[j] = leaf_min(c[j]);
        }
        NodeValue<R> parent = {leaf / K, pairwise_sum<R, K>(c), min_of<R, K>(m)};
        out.write(parent);
    }
}

// Stage L (0 < L < D): write the node values coming up from level L+1, pass the parents on.
template <typename R, int K, int D, int L>
void update_level(Tree<R, K, D> &tree, hls::stream<NodeValue<R> > &in, hls::stream<NodeValue<R> > &out,
                  int n) {
#pragma HLS INLINE off
    auto &lv = At<L, D>::get(tree.levels);
#pragma HLS ARRAY_PARTITION variable = lv.sum cyclic factor = K
#pragma HLS ARRAY_PARTITION variable = lv.min cyclic factor = K
update_node:
    for (int i = 0; i < n; ++i) {
#pragma HLS PIPELINE II = 3  // the same read-after-write as update_leaf
#pragma HLS LOOP_TRIPCOUNT min = 1 max = 4096
        const NodeValue<R> v = in.read();
        lv.sum[v.node] = v.sum;
        lv.min[v.node] = v.min;
        const index_t base = v.node - v.node % K;
        R c[K], m[K];
#pragma HLS ARRAY_PARTITION variable = c complete
#pragma HLS ARRAY_PARTITION variable = m complete
        for (int j = 0; j < K; ++j) {
#pragma HLS UNROLL
            const bool self = base + j == v.node;
            c[j] = self ? v.sum : lv.sum[base + j];
            m[j] = self ? v.min : lv.min[base + j];
        }
        NodeValue<R> parent = {v.node / K, pairwise_sum<R, K>(c), min_of<R, K>(m)};
        out.write(parent);
    }
}

// Stage 0: the root.
template <typename R, int K, int D>
void update_root(Tree<R, K, D> &tree, hls::stream<NodeValue<R> > &in, int n) {
#pragma HLS INLINE off
    auto &lv = At<0, D>::get(tree.levels);
update_root:
    for (int i = 0; i < n; ++i) {
#pragma HLS PIPELINE II = 1
#pragma HLS LOOP_TRIPCOUNT min = 1 max = 4096
        const NodeValue<R> v = in.read();
        lv.sum[0] = v.sum;
        lv.min[0] = v.min;
    }
}

template <typename R, int K, int D, int L>
struct UpdateChain {
    static void run(Tree<R, K, D> &tree, hls::stream<NodeValue<R> > &in, int n) {
#pragma HLS INLINE
        hls::stream<NodeValue<R> > out("update_up");
#pragma HLS STREAM variable = out depth = 8
        update_level<R, K, D, L>(tree, in, out, n);
        UpdateChain<R, K, D, L - 1>::run(tree, out, n);
    }
};
template <typename R, int K, int D>
struct UpdateChain<R, K, D, 0> {
    static void run(Tree<R, K, D> &tree, hls::stream<NodeValue<R> > &in, int n) {
#pragma HLS INLINE
        update_root<R, K, D>(tree, in, n);
    }
};

// Sets leaf `indices[i]` to `priorities[i]`, i in batch order (the last duplicate wins).
template <typename R, int K, int D>
void update(Tree<R, K, D> &tree, const index_t indices[], const R priorities[], int n) {
#pragma HLS DATAFLOW
    hls::stream<NodeValue<R> > up("update_leaves");
#pragma HLS STREAM variable = up depth = 8
    update_leaves<R, K, D>(tree, indices, priorities, n, up);
    UpdateChain<R, K, D, D - 1>::run(tree, up, n);
}

// -- sample / find: root to leaves -----------------------------------------------------------
template <typename R>
struct Walk {
    index_t node;  // on the level above the receiving stage
    R mass;        // prefix mass left below that node
};

// Stage 0: the prefixes. Stratified sampling: (i + u_i) * (total / n), the reference's
// association; `find` passes the prefixes through.
template <typename R, int K, int D>
void prefixes(Tree<R, K, D> &tree, const R values[], int n, bool stratified, hls::stream<Walk<R> > &out) {
#pragma HLS INLINE off
    const R step = At<0, D>::get(tree.levels).sum[0] / R(n);
make_prefix:
    for (int i = 0; i < n; ++i) {
#pragma HLS PIPELINE II = 1
#pragma HLS LOOP_TRIPCOUNT min = 1 max = 4096
        Walk<R> w = {0, stratified ? (R(i) + values[i]) * step : values[i]};
        out.write(w);
    }
}

// The child of `node` whose bracket holds `mass`, given its K children: the first whose
// sequential cumulative sum exceeds the mass; when rounding leaves none, the last child with any
// mass (so a zero-priority leaf is never chosen). `mass` becomes the mass left inside the child.
template <typename R, int K>
inline int choose_child(const R c[K], R &mass) {
#pragma HLS INLINE
    R cum[K];
#pragma HLS ARRAY_PARTITION variable = cum complete
    R running = c[0];
    cum[0] = running;
    for (int j = 1; j < K; ++j) {
#pragma HLS UNROLL
        running += c[j];
        cum[j] = running;
    }
    int child = 0;
    for (int j = 0; j < K; ++j) {
#pragma HLS UNROLL
        child += cum[j] <= mass ? 1 : 0;  // cum is non-decreasing: a count is a search
    }
    if (child >= K) {
        int last = K - 1;
        bool found = false;
        for (int j = K - 1; j >= 0; --j) {
#pragma HLS UNROLL
            if (!found && c[j] > R(0)) {
                last = j;
                found = true;
            }
        }
        child = last;
    }
    if (child > 0) mass -= cum[child - 1];
    return child;
}

// Stage L (1 <= L < D): one level of the descent for every member.
template <typename R, int K, int D, int L>
void descend_level(Tree<R, K, D> &tree, hls::stream<Walk<R> > &in, hls::stream<Walk<R> > &out, int n) {
#pragma HLS INLINE off
    auto &lv = At<L, D>::get(tree.levels);
#pragma HLS ARRAY_PARTITION variable = lv.sum cyclic factor = K
descend_level:
    for (int i = 0; i < n; ++i) {
#pragma HLS PIPELINE II = 1
#pragma HLS LOOP_TRIPCOUNT min = 1 max = 4096
        Walk<R> w = in.read();
        R c[K];
#pragma HLS ARRAY_PARTITION variable = c complete
        for (int j = 0; j < K; ++j) {
#pragma HLS UNROLL
            c[j] = lv.sum[w.node * K + j];
        }
        const int child = choose_child<R, K>(c, w.mass);
        w.node = w.node * K + child;
        out.write(w);
    }
}

// Stage D: the leaf level; writes the chosen leaf and its priority.
template <typename R, int K, int D>
void descend_leaves(Tree<R, K, D> &tree, hls::stream<Walk<R> > &in, index_t out_indices[],
                    R out_priorities[], int n) {
#pragma HLS INLINE off
    auto &lv = At<D, D>::get(tree.levels);
#pragma HLS ARRAY_PARTITION variable = lv.sum cyclic factor = K
descend_leaf:
    for (int i = 0; i < n; ++i) {
#pragma HLS PIPELINE II = 1
#pragma HLS LOOP_TRIPCOUNT min = 1 max = 4096
        Walk<R> w = in.read();
        R c[K];
#pragma HLS ARRAY_PARTITION variable = c complete
        for (int j = 0; j < K; ++j) {
#pragma HLS UNROLL
            c[j] = lv.sum[w.node * K + j];
        }
        const int child = choose_child<R, K>(c, w.mass);
        out_indices[i] = w.node * K + child;
        out_priorities[i] = c[child];
    }
}

template <typename R, int K, int D, int L>
struct DescendChain {
    static void run(Tree<R, K, D> &tree, hls::stream<Walk<R> > &in, index_t out_indices[],
                    R out_priorities[], int n) {
#pragma HLS INLINE
        hls::stream<Walk<R> > out("descend");
#pragma HLS STREAM variable = out depth = 8
        descend_level<R, K, D, L>(tree, in, out, n);
        DescendChain<R, K, D, L + 1>::run(tree, out, out_indices, out_priorities, n);
    }
};
template <typename R, int K, int D>
struct DescendChain<R, K, D, D> {
    static void run(Tree<R, K, D> &tree, hls::stream<Walk<R> > &in, index_t out_indices[],
                    R out_priorities[], int n) {
#pragma HLS INLINE
        descend_leaves<R, K, D>(tree, in, out_indices, out_priorities, n);
    }
};

// stratified: values are uniforms in [0, 1) and member i looks up (i + u_i) * total / n;
// otherwise values are the prefix sums themselves.
template <typename R, int K, int D>
void descend(Tree<R, K, D> &tree, const R values[], bool stratified, index_t out_indices[],
             R out_priorities[], int n) {
#pragma HLS DATAFLOW
    hls::stream<Walk<R> > walks("prefixes");
#pragma HLS STREAM variable = walks depth = 8
    prefixes<R, K, D>(tree, values, n, stratified, walks);
    DescendChain<R, K, D, 1>::run(tree, walks, out_indices, out_priorities, n);
}

template <typename R, int K, int D>
void get(Tree<R, K, D> &tree, const index_t indices[], R out[], int n) {
    auto &lv = At<D, D>::get(tree.levels);
get_leaf:
    for (int i = 0; i < n; ++i) {
#pragma HLS PIPELINE II = 1
#pragma HLS LOOP_TRIPCOUNT min = 1 max = 4096
        out[i] = lv.sum[indices[i]];
    }
}

template <typename R, int K, int D>
R total(Tree<R, K, D> &tree) { return At<0, D>::get(tree.levels).sum[0]; }

template <typename R, int K, int D>
R minimum(Tree<R, K, D> &tree) { return At<0, D>::get(tree.levels).min[0]; }

// Copies level L's sums (which = 0) or mins (which = 1; leaf mins derived) to `out` (K^L
// values): for tests that compare every node with the reference.
template <typename R, int K, int D, int L>
struct ReadLevel {
    static bool run(Tree<R, K, D> &tree, int level, int which, double out[]) {
        if (level != L) return ReadLevel<R, K, D, L - 1>::run(tree, level, which, out);
        auto &lv = At<L, D>::get(tree.levels);
        for (long n = 0; n < lv.nodes; ++n) {
            const R value = which == 0 ? lv.sum[n] : (L < D ? lv.min[n] : leaf_min(lv.sum[n]));
            out[n] = double(value);
        }
        return true;
    }
};
template <typename R, int K, int D>
struct ReadLevel<R, K, D, -1> {
    static bool run(Tree<R, K, D> &, int, int, double[]) { return false; }
};

}  // namespace sumtree
}  // namespace pearl

#endif
