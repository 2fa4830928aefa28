// The Vitis kernel `pearl_mlp_train_step`: one DQN gradient step of a ReLU MLP (forward,
// weighted Huber TD loss against host-computed targets, backward, global-norm clipping, Adam).
// Parameters and Adam moments live in device memory and are updated in place.
#include "mlp_ops.h"

extern "C" void pearl_mlp_train_step(int n_layers, int batch, const int *sizes, const double *hyper,
                                     float *params, float *exp_avg, float *exp_avg_sq, const float *obs,
                                     const int *actions, const float *targets, const float *weights,
                                     float *abs_td) {
#pragma HLS INTERFACE mode = m_axi port = sizes offset = slave bundle = gmem0 depth = 8
#pragma HLS INTERFACE mode = m_axi port = hyper offset = slave bundle = gmem0 depth = 8
#pragma HLS INTERFACE mode = m_axi port = params offset = slave bundle = gmem0 depth = 200000 max_read_burst_length = 256
#pragma HLS INTERFACE mode = m_axi port = exp_avg offset = slave bundle = gmem1 depth = 200000 max_read_burst_length = 256
#pragma HLS INTERFACE mode = m_axi port = exp_avg_sq offset = slave bundle = gmem2 depth = 200000 max_read_burst_length = 256
#pragma HLS INTERFACE mode = m_axi port = obs offset = slave bundle = gmem3 depth = 65536 max_read_burst_length = 256
#pragma HLS INTERFACE mode = m_axi port = actions offset = slave bundle = gmem3 depth = 256
#pragma HLS INTERFACE mode = m_axi port = targets offset = slave bundle = gmem3 depth = 256
#pragma HLS INTERFACE mode = m_axi port = weights offset = slave bundle = gmem3 depth = 256
#pragma HLS INTERFACE mode = m_axi port = abs_td offset = slave bundle = gmem3 depth = 256
#pragma HLS INTERFACE mode = s_axilite port = n_layers
#pragma HLS INTERFACE mode = s_axilite port = batch
#pragma HLS INTERFACE mode = s_axilite port = return
    static pearl::mlp::Weights net;
    static pearl::mlp::TrainScratch scratch;
#pragma HLS ARRAY_PARTITION variable = net.w complete dim = 3
#pragma HLS ARRAY_PARTITION variable = scratch.act complete dim = 1
#pragma HLS ARRAY_PARTITION variable = scratch.gz complete dim = 2
    mlp_train_step_run(net, scratch, n_layers, batch, sizes, hyper, params, exp_avg, exp_avg_sq, obs, actions,
                       targets, weights, abs_td);
}
