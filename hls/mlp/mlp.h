// Dense ReLU MLPs (Q-networks) on the FPGA: inference, and one DQN training step.
//
// Parameters travel as the flat float32 vector of kernels/cpu/mlp.py (MLPLayout): per layer the
// weight (out x in, row-major) then the bias, layer after layer. On chip each layer's weight is
// a MAX_WIDTH x MAX_WIDTH array whose second dimension is completely partitioned, so one output
// neuron (a MAX_WIDTH-wide dot product summed by an adder tree) completes per cycle; unused rows
// and columns hold zeros, so one bitstream serves every network up to MAX_LAYERS x MAX_WIDTH.
// Hidden layers apply ReLU; the last layer is linear (plain Q-network; no dueling head).
#ifndef PEARL_MLP_H
#define PEARL_MLP_H

#include <cmath>

#include "pearl_hls.h"

#ifndef PEARL_MLP_MAX_LAYERS
#define PEARL_MLP_MAX_LAYERS 4
#endif
#ifndef PEARL_MLP_MAX_WIDTH
#define PEARL_MLP_MAX_WIDTH 256
#endif
#ifndef PEARL_MLP_MAX_BATCH
#define PEARL_MLP_MAX_BATCH 256
#endif

namespace pearl {
namespace mlp {

const int L = PEARL_MLP_MAX_LAYERS;
const int W = PEARL_MLP_MAX_WIDTH;
const int B = PEARL_MLP_MAX_BATCH;

struct Weights {
    int n_layers;
    int sizes[L + 1];
    float w[L][W][W];  // w[layer][out][in]
    float b[L][W];
};

// sum of x[0..N) as a balanced adder tree (N a power of two): log2(N) fadds deep
template <int N>
inline float tree_sum(const float x[N]) {
#pragma HLS INLINE
    float level[N];
#pragma HLS ARRAY_PARTITION variable = level complete
    for (int i = 0; i < N; ++i) {
#pragma HLS UNROLL
        level[i] = x[i];
    }
    for (int width = N / 2; width >= 1; width /= 2) {
#pragma HLS UNROLL
        for (int i = 0; i < width; ++i) {
#pragma HLS UNROLL
            level[i] = level[2 * i] + level[2 * i + 1];
        }
    }
    return level[0];
}

inline bool valid_sizes(int n_layers, const int sizes[]) {
    if (n_layers < 1 || n_layers > L) return false;
    for (int i = 0; i <= n_layers; ++i)
        if (sizes[i] < 1 || sizes[i] > W) return false;
    return true;
}

inline long n_params(int n_layers, const int sizes[]) {
    long n = 0;
    for (int l = 0; l < n_layers; ++l) n += (long)sizes[l + 1] * sizes[l] + sizes[l + 1];
    return n;
}

// flat (MLPLayout) -> on-chip weights; zero padding outside each layer's shape
inline void load_weights_into(Weights &net, int n_layers, const int sizes[], const float *flat) {
    net.n_layers = n_layers;
    for (int l = 0; l <= n_layers; ++l) net.sizes[l] = sizes[l];
    long offset = 0;
    for (int l = 0; l < L; ++l) {
        const int n_in = l < n_layers ? sizes[l] : 0, n_out = l < n_layers ? sizes[l + 1] : 0;
    load_weights:
        for (int o = 0; o < W; ++o) {
            for (int i = 0; i < W; ++i) {
#pragma HLS PIPELINE II = 1
                net.w[l][o][i] = (o < n_out && i < n_in) ? flat[offset + (long)o * n_in + i] : 0.0f;
            }
        }
        offset += (long)n_out * n_in;
        for (int o = 0; o < W; ++o) {
#pragma HLS PIPELINE II = 1
            net.b[l][o] = o < n_out ? flat[offset + o] : 0.0f;
        }
        offset += n_out;
    }
}

// y = W x + b for every output neuron of layer l (ReLU unless it is the last layer)
inline void layer_forward(const Weights &net, int l, const float x[W], float y[W]) {
#pragma HLS INLINE off
    const int n_out = net.sizes[l + 1];
    const bool relu = l + 1 < net.n_layers;
forward_neuron:
    for (int o = 0; o < W; ++o) {
#pragma HLS PIPELINE II = 1
        float prod[W];
#pragma HLS ARRAY_PARTITION variable = prod complete
        for (int i = 0; i < W; ++i) {
#pragma HLS UNROLL
            prod[i] = net.w[l][o][i] * x[i];
        }
        float z = o < n_out ? tree_sum<W>(prod) + net.b[l][o] : 0.0f;
        y[o] = (relu && z < 0.0f) ? 0.0f : z;
    }
}

// activations[l][.] of one sample: l = 0 is the input, l = n_layers the output
inline void forward_sample(const Weights &net, float act[L + 1][W]) {
    for (int l = 0; l < net.n_layers; ++l) layer_forward(net, l, act[l], act[l + 1]);
}

// Q-values of `batch` observations (obs: batch x sizes[0]; q: batch x sizes[n_layers])
inline void forward(const Weights &net, const float *obs, float *q, int batch) {
    const int n_in = net.sizes[0], n_out = net.sizes[net.n_layers];
    float act[L + 1][W];
#pragma HLS ARRAY_PARTITION variable = act complete dim = 2
    for (int s = 0; s < batch; ++s) {
#pragma HLS LOOP_TRIPCOUNT min = 1 max = 256
    load_obs:
        for (int i = 0; i < W; ++i) {
#pragma HLS PIPELINE II = 1
            act[0][i] = i < n_in ? obs[(long)s * n_in + i] : 0.0f;
        }
        forward_sample(net, act);
    store_q:
        for (int o = 0; o < n_out; ++o) {
#pragma HLS PIPELINE II = 1
            q[(long)s * n_out + o] = act[net.n_layers][o];
        }
    }
}

// -- one training step -----------------------------------------------------------------------
// hyper (float64): lr, beta1, beta2, adam_eps, max_grad_norm, step (Adam's step count after
// this update, >= 1).
enum { H_LR = 0, H_BETA1, H_BETA2, H_EPS, H_MAX_NORM, H_STEP, H_COUNT };

struct TrainScratch {
    float act[B][L + 1][W];  // every layer's activations of every sample
    float gz[B][W];          // gradient w.r.t. the current layer's outputs
    float gin[B][W];
    float grad_w[L][W][W];
    float grad_b[L][W];
};

// One DQN gradient step on the online network (kernels/cpu/qlearn.py FusedQLearner.update with
// the TD targets given): q = Q(obs)[action]; td = q - target; loss = mean(weight * Huber(td));
// backward; clip the global gradient norm to max_grad_norm; Adam (torch.optim.Adam's rule).
// Writes |td| per sample; the weights in `net` are updated in place.
inline void train_step(Weights &net, TrainScratch &s, float *exp_avg, float *exp_avg_sq,
                       const float *obs, const int *actions, const float *targets, const float *weights,
                       float *abs_td, int batch, const double hyper[H_COUNT]) {
    const int n_layers = net.n_layers, n_in = net.sizes[0], n_out = net.sizes[n_layers];
    // forward, keeping activations
    for (int b = 0; b < batch; ++b) {
#pragma HLS LOOP_TRIPCOUNT min = 1 max = 256
    load_batch:
        for (int i = 0; i < W; ++i) {
#pragma HLS PIPELINE II = 1
            s.act[b][0][i] = i < n_in ? obs[(long)b * n_in + i] : 0.0f;
        }
        forward_sample(net, s.act[b]);
    }
    // output gradient: d(mean weighted Huber)/dq at the taken action
    const float inv_batch = 1.0f / float(batch);
output_grad:
    for (int b = 0; b < batch; ++b) {
#pragma HLS PIPELINE II = 1
        const int a = actions[b];
        const float td = s.act[b][n_layers][a] - targets[b];
        abs_td[b] = std::fabs(td);
        float dq = td > 1.0f ? 1.0f : (td < -1.0f ? -1.0f : td);
        dq *= weights[b];
        for (int o = 0; o < W; ++o) {
#pragma HLS UNROLL
            s.gz[b][o] = (o == a && o < n_out) ? dq * inv_batch : 0.0f;
        }
    }
    // backward, last layer first
    for (int l = n_layers - 1; l >= 0; --l) {
        const int li = net.sizes[l], lo = net.sizes[l + 1];
        for (int o = 0; o < W; ++o) {
        grad_weight:
            for (int i = 0; i <= W; ++i) {  // i == W: the bias
#pragma HLS PIPELINE II = 1
                float prod[B];
#pragma HLS ARRAY_PARTITION variable = prod complete
                for (int b = 0; b < B; ++b) {
#pragma HLS UNROLL
                    prod[b] = b < batch ? s.gz[b][o] * (i < W ? s.act[b][l][i] : 1.0f) : 0.0f;
                }
                const float g = (o < lo && (i < li || i == W)) ? tree_sum<B>(prod) : 0.0f;
                if (i < W) s.grad_w[l][o][i] = g; else s.grad_b[l][o] = g;
            }
        }
        if (l == 0) break;
        for (int b = 0; b < batch; ++b) {
        backward_input:
            for (int i = 0; i < W; ++i) {
#pragma HLS PIPELINE II = 1
                float prod[W];
#pragma HLS ARRAY_PARTITION variable = prod complete
                for (int o = 0; o < W; ++o) {
#pragma HLS UNROLL
                    prod[o] = s.gz[b][o] * net.w[l][o][i];
                }
                // ReLU: the input of layer l is the (post-ReLU) output of layer l-1
                s.gin[b][i] = (i < li && s.act[b][l][i] > 0.0f) ? tree_sum<W>(prod) : 0.0f;
            }
            for (int i = 0; i < W; ++i) s.gz[b][i] = s.gin[b][i];
        }
    }
    // global gradient norm, in parameter order
    float sq = 0.0f;
    for (int l = 0; l < n_layers; ++l) {
        for (int o = 0; o < net.sizes[l + 1]; ++o) {
        grad_norm:
            for (int i = 0; i < net.sizes[l]; ++i) {
#pragma HLS PIPELINE II = 4
                sq += s.grad_w[l][o][i] * s.grad_w[l][o][i];
            }
        }
        for (int o = 0; o < net.sizes[l + 1]; ++o) sq += s.grad_b[l][o] * s.grad_b[l][o];
    }
    const double norm = std::sqrt(double(sq));
    const double coef = hyper[H_MAX_NORM] / (norm + 1e-6);  // torch clip_grad_norm_'s rule
    const float scale = coef < 1.0 ? float(coef) : 1.0f;
    // Adam, torch's update: p -= lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps)
    const double step = hyper[H_STEP];
    const float b1 = float(hyper[H_BETA1]), b2 = float(hyper[H_BETA2]);
    const float step_size = float(hyper[H_LR] / (1.0 - std::pow(hyper[H_BETA1], step)));
    const float bc2_sqrt = float(std::sqrt(1.0 - std::pow(hyper[H_BETA2], step)));
    const float eps = float(hyper[H_EPS]);
    long p = 0;
    for (int l = 0; l < n_layers; ++l) {
        const int li = net.sizes[l], lo = net.sizes[l + 1];
        for (int o = 0; o < lo; ++o) {
        adam:
            for (int i = 0; i <= li; ++i) {  // the weight row, then (i == li) this row's bias
#pragma HLS PIPELINE II = 1
                const bool bias = i == li;
                const long at = bias ? p + (long)lo * li + o : p + (long)o * li + i;
                float &param = bias ? net.b[l][o] : net.w[l][o][i];
                const float g = (bias ? s.grad_b[l][o] : s.grad_w[l][o][i]) * scale;
                const float m = exp_avg[at] * b1 + (1.0f - b1) * g;
                const float v = exp_avg_sq[at] * b2 + (1.0f - b2) * (g * g);
                exp_avg[at] = m;
                exp_avg_sq[at] = v;
                param -= (m / (std::sqrt(v) / bc2_sqrt + eps)) * step_size;
            }
        }
        p += (long)lo * li + lo;
    }
}

// on-chip weights -> flat (MLPLayout)
inline void store_weights(const Weights &net, float *flat) {
    long offset = 0;
    for (int l = 0; l < net.n_layers; ++l) {
        const int n_in = net.sizes[l], n_out = net.sizes[l + 1];
    store_weights:
        for (int o = 0; o < n_out; ++o)
            for (int i = 0; i < n_in; ++i) {
#pragma HLS PIPELINE II = 1
                flat[offset + (long)o * n_in + i] = net.w[l][o][i];
            }
        offset += (long)n_out * n_in;
        for (int o = 0; o < n_out; ++o) flat[offset + o] = net.b[l][o];
        offset += n_out;
    }
}

}  // namespace mlp
}  // namespace pearl

#endif
