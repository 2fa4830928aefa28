// C-simulation library of the MLP kernels for the Python driver (ctypes). Each handle is one
// compute unit's on-chip state; the kernel bodies are those of the Vitis tops. Not synthesized.
#include <new>

#include "mlp_ops.h"

extern "C" {

int pearl_mlp_limits(int *out) {
    out[0] = PEARL_MLP_MAX_LAYERS;
    out[1] = PEARL_MLP_MAX_WIDTH;
    out[2] = PEARL_MLP_MAX_BATCH;
    return 0;
}

void *pearl_mlp_forward_new() { return new (std::nothrow) pearl::mlp::Weights(); }
void pearl_mlp_forward_free(void *net) { delete static_cast<pearl::mlp::Weights *>(net); }

int pearl_mlp_forward_call(void *net, int load_weights, int n_layers, int batch, const int *sizes,
                           const float *params, const float *obs, float *q) {
    return mlp_forward_run(*static_cast<pearl::mlp::Weights *>(net), load_weights, n_layers, batch, sizes, params,
                           obs, q);
}

struct TrainUnit {
    pearl::mlp::Weights net;
    pearl::mlp::TrainScratch scratch;
};

void *pearl_mlp_train_new() { return new (std::nothrow) TrainUnit(); }
void pearl_mlp_train_free(void *unit) { delete static_cast<TrainUnit *>(unit); }

int pearl_mlp_train_call(void *unit, int n_layers, int batch, const int *sizes, const double *hyper, float *params,
                         float *exp_avg, float *exp_avg_sq, const float *obs, const int *actions,
                         const float *targets, const float *weights, float *abs_td) {
    TrainUnit *u = static_cast<TrainUnit *>(unit);
    return mlp_train_step_run(u->net, u->scratch, n_layers, batch, sizes, hyper, params, exp_avg, exp_avg_sq, obs,
                              actions, targets, weights, abs_td);
}
}
