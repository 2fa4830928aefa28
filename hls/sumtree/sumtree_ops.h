// The body of the `pearl_sumtree` kernel on a given tree: the Vitis top (sumtree.cpp) runs it on
// its static on-chip tree, the C-simulation library (sumtree_csim.cpp) on trees it allocates, so
// the simulated code is the synthesized code.
#ifndef PEARL_SUMTREE_OPS_H
#define PEARL_SUMTREE_OPS_H

#include "sumtree_config.h"

inline int sumtree_run(SumTreeConfig &tree, int op, int n, const long long *indices, const double *values,
                       long long *out_indices, double *out_values) {
#pragma HLS INLINE
    using namespace pearl::sumtree;
    if (n < 0 || n > PEARL_SUMTREE_MAX_BATCH) return -1;

    index_t index_buf[PEARL_SUMTREE_MAX_BATCH];
    sumtree_real real_buf[PEARL_SUMTREE_MAX_BATCH];
    index_t out_index_buf[PEARL_SUMTREE_MAX_BATCH];
    sumtree_real out_real_buf[PEARL_SUMTREE_MAX_BATCH];

    switch (op) {
    case OP_CLEAR:
        clear(tree);
        return 0;
    case OP_UPDATE:
    load_update:
        for (int i = 0; i < n; ++i) {
#pragma HLS PIPELINE II = 1
#pragma HLS LOOP_TRIPCOUNT min = 1 max = 4096
            index_buf[i] = indices[i];
            real_buf[i] = sumtree_real(values[i]);
        }
        update(tree, index_buf, real_buf, n);
        // the new root rides back with every update, so the host never asks for total / min
        out_values[0] = double(total(tree));
        out_values[1] = double(minimum(tree));
        return 0;
    case OP_SAMPLE:
    case OP_FIND:
    load_values:
        for (int i = 0; i < n; ++i) {
#pragma HLS PIPELINE II = 1
#pragma HLS LOOP_TRIPCOUNT min = 1 max = 4096
            real_buf[i] = sumtree_real(values[i]);
        }
        descend(tree, real_buf, op == OP_SAMPLE, out_index_buf, out_real_buf, n);
    store_found:
        for (int i = 0; i < n; ++i) {
#pragma HLS PIPELINE II = 1
#pragma HLS LOOP_TRIPCOUNT min = 1 max = 4096
            out_indices[i] = out_index_buf[i];
            out_values[i] = double(out_real_buf[i]);
        }
        return 0;
    case OP_GET:
    load_get:
        for (int i = 0; i < n; ++i) {
#pragma HLS PIPELINE II = 1
#pragma HLS LOOP_TRIPCOUNT min = 1 max = 4096
            index_buf[i] = indices[i];
        }
        get(tree, index_buf, out_real_buf, n);
    store_get:
        for (int i = 0; i < n; ++i) {
#pragma HLS PIPELINE II = 1
#pragma HLS LOOP_TRIPCOUNT min = 1 max = 4096
            out_values[i] = double(out_real_buf[i]);
        }
        return 0;
    case OP_ROOT:
        out_values[0] = double(total(tree));
        out_values[1] = double(minimum(tree));
        return 0;
    case OP_INFO:
        out_values[0] = PEARL_SUMTREE_FANOUT;
        out_values[1] = PEARL_SUMTREE_DEPTH;
        out_values[2] = sizeof(sumtree_real);
        out_values[3] = PEARL_SUMTREE_MAX_BATCH;
        return 0;
    default:
        return -1;
    }
}

#endif
