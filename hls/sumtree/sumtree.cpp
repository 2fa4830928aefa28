// The Vitis kernel `pearl_sumtree`: one on-chip sum tree, driven by an operation code.
//
// The tree lives in static on-chip memories, so it persists between kernel calls (Vitis HLS
// keeps static arrays across invocations); the host only moves each call's batch. Host I/O is
// float64/int64 whatever the on-chip precision, so the driver is the same for every build.
//
//   op OP_CLEAR   every sum 0, every min +inf
//   op OP_UPDATE  leaves indices[0..n) = values[0..n) (batch order, the last duplicate wins);
//                 then out_values[0] = total, out_values[1] = min, as for OP_ROOT
//   op OP_SAMPLE  out_indices[i] = leaf holding (i + values[i]) * total / n; out_values[i] = its
//                 priority (stratified prioritized sampling; values are uniforms in [0, 1))
//   op OP_FIND    out_indices[i] = leaf holding prefix values[i]; out_values[i] = its priority
//   op OP_GET     out_values[i] = priority of leaf indices[i]
//   op OP_ROOT    out_values[0] = total, out_values[1] = min (inf when no leaf is positive)
//   op OP_INFO    out_values[0..3] = fanout, depth, bytes per node value, max batch: the
//                 build configuration, so the driver can check a bitstream against a plan
// A call with n outside [0, PEARL_SUMTREE_MAX_BATCH] or an unknown op does nothing (the
// driver checks both before it starts the kernel).
#include "sumtree_ops.h"

extern "C" void pearl_sumtree(int op, int n, const long long *indices, const double *values,
                              long long *out_indices, double *out_values) {
#pragma HLS INTERFACE mode = m_axi port = indices offset = slave bundle = gmem0 depth = 4096 max_read_burst_length = 64
#pragma HLS INTERFACE mode = m_axi port = values offset = slave bundle = gmem1 depth = 4096 max_read_burst_length = 64
#pragma HLS INTERFACE mode = m_axi port = out_indices offset = slave bundle = gmem0 depth = 4096 max_write_burst_length = 64
#pragma HLS INTERFACE mode = m_axi port = out_values offset = slave bundle = gmem1 depth = 4096 max_write_burst_length = 64
#pragma HLS INTERFACE mode = s_axilite port = op
#pragma HLS INTERFACE mode = s_axilite port = n
#pragma HLS INTERFACE mode = s_axilite port = return
    static SumTreeConfig tree;
    sumtree_run(tree, op, n, indices, values, out_indices, out_values);
}
