// C-simulation testbench of `pearl_mlp_forward` and `pearl_mlp_train_step` (the csim step of
// hls/Makefile, and run by tests/test_hls_mlp.py): a 4-64-64-2 Q-network (configs/cartpole_dqn
// .yaml) against a float64 model written out loop by loop. Exit status 0 when the outputs and the
// weights after 3 training steps agree within 1e-5 relative (norm-wise).
#include <cmath>
#include <cstdio>
#include <vector>

#include "mlp.h"

extern "C" void pearl_mlp_forward(int load_weights, int n_layers, int batch, const int *sizes,
                                  const float *params, const float *obs, float *q);
extern "C" void pearl_mlp_train_step(int n_layers, int batch, const int *sizes, const double *hyper,
                                     float *params, float *exp_avg, float *exp_avg_sq, const float *obs,
                                     const int *actions, const float *targets, const float *weights,
                                     float *abs_td);

static unsigned long long rng_state = 0x2545F4914F6CDD1DULL;
static double uniform() {
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return double((rng_state * 2685821657736338717ULL) >> 11) / 9007199254740992.0;
}

static const int n_layers = 3;
static const int sizes[n_layers + 1] = {4, 64, 64, 2};

// float64 model: activations of one sample (layer 0 = input)
static void model_forward(const std::vector<double> &p, const double *x, std::vector<std::vector<double> > &act) {
    act.assign(n_layers + 1, std::vector<double>());
    act[0].assign(x, x + sizes[0]);
    long off = 0;
    for (int l = 0; l < n_layers; ++l) {
        const int ni = sizes[l], no = sizes[l + 1];
        act[l + 1].assign(no, 0.0);
        for (int o = 0; o < no; ++o) {
            double z = p[off + (long)ni * no + o];
            for (int i = 0; i < ni; ++i) z += p[off + (long)o * ni + i] * act[l][i];
            act[l + 1][o] = (l + 1 < n_layers && z < 0) ? 0.0 : z;
        }
        off += (long)ni * no + no;
    }
}

static double rel_err(const std::vector<float> &got, const std::vector<double> &want) {
    double diff = 0, norm = 0;
    for (size_t i = 0; i < want.size(); ++i) {
        diff = std::fmax(diff, std::fabs(double(got[i]) - want[i]));
        norm = std::fmax(norm, std::fabs(want[i]));
    }
    return diff / norm;
}

int main() {
    long n_params = 0;
    for (int l = 0; l < n_layers; ++l) n_params += (long)sizes[l] * sizes[l + 1] + sizes[l + 1];
    const int batch = 64;
    std::vector<float> params(n_params), m(n_params, 0.0f), v(n_params, 0.0f), obs(batch * sizes[0]);
    std::vector<double> pd(n_params), md(n_params, 0.0), vd(n_params, 0.0);
    for (long i = 0; i < n_params; ++i) pd[i] = params[i] = float((uniform() - 0.5) * 0.5);
    for (int i = 0; i < batch * sizes[0]; ++i) obs[i] = float((uniform() - 0.5) * 4.0);
    int failures = 0;

    // inference
    std::vector<float> q(batch * sizes[n_layers]);
    pearl_mlp_forward(1, n_layers, batch, sizes, params.data(), obs.data(), q.data());
    std::vector<double> q_model;
    std::vector<std::vector<double> > act;
    for (int b = 0; b < batch; ++b) {
        std::vector<double> x(obs.begin() + b * sizes[0], obs.begin() + (b + 1) * sizes[0]);
        model_forward(pd, x.data(), act);
        q_model.insert(q_model.end(), act[n_layers].begin(), act[n_layers].end());
    }
    const double forward_err = rel_err(q, q_model);
    failures += forward_err > 1e-5;

    // three training steps against the float64 model of the same step
    std::vector<int> actions(batch);
    std::vector<float> targets(batch), weights(batch), abs_td(batch);
    const double lr = 1e-3, b1 = 0.9, b2 = 0.999, eps = 1e-8, max_norm = 10.0;
    double train_err = 0;
    for (int step = 1; step <= 3; ++step) {
        for (int b = 0; b < batch; ++b) {
            actions[b] = int(uniform() * sizes[n_layers]);
            targets[b] = float(uniform() * 3.0 - 1.0);
            weights[b] = float(0.5 + uniform());
        }
        const double hyper[6] = {lr, b1, b2, eps, max_norm, double(step)};
        pearl_mlp_train_step(n_layers, batch, sizes, hyper, params.data(), m.data(), v.data(), obs.data(),
                             actions.data(), targets.data(), weights.data(), abs_td.data());
        // model: gradient of mean_b w_b * Huber(q_b[a_b] - y_b)
        std::vector<double> grad(n_params, 0.0);
        for (int b = 0; b < batch; ++b) {
            std::vector<double> x(obs.begin() + b * sizes[0], obs.begin() + (b + 1) * sizes[0]);
            model_forward(pd, x.data(), act);
            const double td = act[n_layers][actions[b]] - targets[b];
            std::vector<double> gz(sizes[n_layers], 0.0);
            gz[actions[b]] = std::fmax(-1.0, std::fmin(1.0, td)) * weights[b] / batch;
            long off = n_params;
            for (int l = n_layers - 1; l >= 0; --l) {
                const int ni = sizes[l], no = sizes[l + 1];
                off -= (long)ni * no + no;
                std::vector<double> gin(ni, 0.0);
                for (int o = 0; o < no; ++o) {
                    for (int i = 0; i < ni; ++i) {
                        grad[off + (long)o * ni + i] += gz[o] * act[l][i];
                        gin[i] += gz[o] * pd[off + (long)o * ni + i];
                    }
                    grad[off + (long)ni * no + o] += gz[o];
                }
                for (int i = 0; i < ni; ++i) gin[i] = act[l][i] > 0 ? gin[i] : 0.0;
                gz = gin;
            }
        }
        double sq = 0;
        for (double g : grad) sq += g * g;
        const double coef = std::fmin(1.0, max_norm / (std::sqrt(sq) + 1e-6));
        for (long i = 0; i < n_params; ++i) {
            const double g = grad[i] * coef;
            md[i] = b1 * md[i] + (1 - b1) * g;
            vd[i] = b2 * vd[i] + (1 - b2) * g * g;
            pd[i] -= lr / (1 - std::pow(b1, step)) * md[i] / (std::sqrt(vd[i]) / std::sqrt(1 - std::pow(b2, step)) + eps);
        }
        train_err = std::fmax(train_err, rel_err(params, pd));
    }
    failures += train_err > 1e-5;
    std::printf("mlp csim: 4-64-64-2, batch %d: forward rel err %.2e, weights after 3 steps rel err %.2e: %s\n",
                batch, forward_err, train_err, failures ? "FAIL" : "PASS");
    return failures ? 1 : 0;
}
