// The bodies of the MLP kernels on given on-chip state: the Vitis tops (mlp_forward.cpp,
// mlp_train.cpp) run them on static on-chip memories, the C-simulation library (mlp_csim.cpp) on
// state it allocates, so the simulated code is the synthesized code.
#ifndef PEARL_MLP_OPS_H
#define PEARL_MLP_OPS_H

#include "mlp.h"

// Q-values of `batch` observations; with load_weights the on-chip weights are first replaced by
// `params` (after a weight sync), otherwise the ones loaded by an earlier call are used.
// Returns 0, or -1 for sizes or a batch outside the build's limits (nothing is computed).
inline int mlp_forward_run(pearl::mlp::Weights &net, int load_weights, int n_layers, int batch, const int *sizes,
                           const float *params, const float *obs, float *q) {
#pragma HLS INLINE
    using namespace pearl::mlp;
    if (batch < 1 || batch > B) return -1;
    if (load_weights) {
        if (!valid_sizes(n_layers, sizes)) return -1;
        load_weights_into(net, n_layers, sizes, params);
    }
    forward(net, obs, q, batch);
    return 0;
}

// One training step of the network in `params` (read, updated, written back together with the
// Adam moments). Returns 0, or -1 for sizes, a batch or an action outside the limits.
inline int mlp_train_step_run(pearl::mlp::Weights &net, pearl::mlp::TrainScratch &scratch, int n_layers, int batch,
                              const int *sizes, const double *hyper, float *params, float *exp_avg,
                              float *exp_avg_sq, const float *obs, const int *actions, const float *targets,
                              const float *weights, float *abs_td) {
#pragma HLS INLINE
    using namespace pearl::mlp;
    if (batch < 1 || batch > B || !valid_sizes(n_layers, sizes) || hyper[H_STEP] < 1.0) return -1;
    for (int b = 0; b < batch; ++b)
        if (actions[b] < 0 || actions[b] >= sizes[n_layers]) return -1;
    load_weights_into(net, n_layers, sizes, params);
    train_step(net, scratch, exp_avg, exp_avg_sq, obs, actions, targets, weights, abs_td, batch, hyper);
    store_weights(net, params);
    return 0;
}

#endif
