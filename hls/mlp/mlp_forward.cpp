// The Vitis kernel `pearl_mlp_forward`: Q-values of a batch of observations (the actor's
// inference). The weights stay on chip between calls; `load_weights` refreshes them after a
// weight sync, so an inference call moves only observations and Q-values.
#include "mlp_ops.h"

extern "C" void pearl_mlp_forward(int load_weights, int n_layers, int batch, const int *sizes,
                                  const float *params, const float *obs, float *q) {
#pragma HLS INTERFACE mode = m_axi port = sizes offset = slave bundle = gmem0 depth = 8
#pragma HLS INTERFACE mode = m_axi port = params offset = slave bundle = gmem0 depth = 200000 max_read_burst_length = 256
#pragma HLS INTERFACE mode = m_axi port = obs offset = slave bundle = gmem1 depth = 65536 max_read_burst_length = 256
#pragma HLS INTERFACE mode = m_axi port = q offset = slave bundle = gmem1 depth = 65536 max_write_burst_length = 256
#pragma HLS INTERFACE mode = s_axilite port = load_weights
#pragma HLS INTERFACE mode = s_axilite port = n_layers
#pragma HLS INTERFACE mode = s_axilite port = batch
#pragma HLS INTERFACE mode = s_axilite port = return
    static pearl::mlp::Weights net;
#pragma HLS ARRAY_PARTITION variable = net.w complete dim = 3
    mlp_forward_run(net, load_weights, n_layers, batch, sizes, params, obs, q);
}
