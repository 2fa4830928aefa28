/* Dense ReLU MLP inference (the actor's Q-network) on an OpenCL device.
 *
 * Parameters are the flat float32 vector of kernels/cpu/mlp.py (MLPLayout): per layer the weight
 * (out x in, row-major) then the bias. One launch per layer, one work-item per (sample, output
 * neuron); the layers of a forward pass chain in an in-order queue, activations staying on the
 * device. Accumulation is float32, input order.
 */

__kernel void dense(__global const float *x, __global const float *params, const long w_offset,
                    const long b_offset, __global float *y, const int n_in, const int n_out,
                    const int relu, const int batch)
{
    const int o = get_global_id(0);
    const int s = get_global_id(1);
    if (o >= n_out || s >= batch) return;
    __global const float *w = params + w_offset + (long)o * n_in;
    __global const float *row = x + (long)s * n_in;
    float acc = 0.0f;
    for (int i = 0; i < n_in; ++i) acc += w[i] * row[i];
    acc += params[b_offset + o];
    y[(long)s * n_out + o] = (relu && acc < 0.0f) ? 0.0f : acc;
}

/* Dueling head: q = value + advantage - mean(advantage), per sample. */
__kernel void dueling(__global const float *value, __global const float *advantage, __global float *q,
                      const int n_actions, const int batch)
{
    const int s = get_global_id(0);
    if (s >= batch) return;
    __global const float *a = advantage + (long)s * n_actions;
    float mean = 0.0f;
    for (int j = 0; j < n_actions; ++j) mean += a[j];
    mean /= (float)n_actions;
    for (int j = 0; j < n_actions; ++j) q[(long)s * n_actions + j] = (value[s] + a[j]) - mean;
}
