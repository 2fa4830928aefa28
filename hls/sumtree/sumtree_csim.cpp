// C-simulation library of the sum-tree kernel for the Python driver (kernels/fpga, ctypes).
//
// Hardware has one tree per bitstream; the simulation gives every Python tree its own copy and
// runs the kernel body (sumtree_run, the same code the Vitis top runs) on it. Not synthesized.
#include <new>

#include "sumtree_ops.h"

extern "C" {

int pearl_sumtree_fanout() { return PEARL_SUMTREE_FANOUT; }
int pearl_sumtree_depth() { return PEARL_SUMTREE_DEPTH; }
int pearl_sumtree_max_batch() { return PEARL_SUMTREE_MAX_BATCH; }
int pearl_sumtree_real_bytes() { return (int)sizeof(sumtree_real); }

void *pearl_sumtree_new() {
    SumTreeConfig *tree = new (std::nothrow) SumTreeConfig;
    if (tree) pearl::sumtree::clear(*tree);
    return tree;
}

void pearl_sumtree_free(void *tree) { delete static_cast<SumTreeConfig *>(tree); }

int pearl_sumtree_call(void *tree, int op, int n, const long long *indices, const double *values,
                       long long *out_indices, double *out_values) {
    return sumtree_run(*static_cast<SumTreeConfig *>(tree), op, n, indices, values, out_indices, out_values);
}

// Level `level` (0 = root) of the sums (which = 0) or mins (which = 1) into out (fanout^level).
int pearl_sumtree_read_level(void *tree, int level, int which, double *out) {
    return pearl::sumtree::ReadLevel<sumtree_real, PEARL_SUMTREE_FANOUT, PEARL_SUMTREE_DEPTH,
                                     PEARL_SUMTREE_DEPTH>::run(*static_cast<SumTreeConfig *>(tree), level,
                                                               which, out)
               ? 0
               : -1;
}
}
