"""The fused continuous learners' elementwise kernels (kernels/cpu/actor_critic.py) against float64
numpy references of the same formulas (pearl/algos/sac.py, ddpg.py); the learners that call them
are held to the autograd updates by tests/test_fused_sac.py and tests/test_continuous.py."""
import math

import numpy as np
import pytest

from pearl.algos.sac import LOG_2PI, LOG_STD_MAX, LOG_STD_MIN
from pearl.kernels.cpu.actor_critic import (min_gradient_shares, min_td_target, smoothed_target_action,
                                            soft_td_target, squared_error_gradient,
                                            squashed_gaussian_output_gradient, squashed_gaussian_sample)

B, D = 64, 2


def f32(a):
    return np.ascontiguousarray(a, dtype=np.float32)


@pytest.fixture
def rng():
    return np.random.default_rng(7)


def test_squared_error_gradient(rng):
    q, y = f32(rng.normal(size=(B, 1)) * 50), f32(rng.normal(size=B) * 50)
    grad = np.empty((B, 1), np.float32)
    loss = squared_error_gradient(q, y, 2.0 / B, grad)
    diff = q[:, 0].astype(np.float64) - y
    assert loss == pytest.approx(np.mean(diff ** 2), rel=1e-12)
    np.testing.assert_allclose(grad[:, 0], 2.0 / B * diff, rtol=1e-6)


def softplus(x):
    return np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20))))


def test_squashed_gaussian_sample(rng):
    # raw log stds across both clamp edges, means large enough that tanh saturates
    out = f32(np.concatenate([rng.normal(size=(B, D)) * 8, rng.uniform(-25, 5, size=(B, D))], axis=1))
    noise = f32(rng.normal(size=(B, D)))
    action, std, log_prob = np.empty((B, D), np.float32), np.empty((B, D), np.float32), np.empty(B, np.float32)
    squashed_gaussian_sample(out, noise, LOG_STD_MIN, LOG_STD_MAX, action, std, log_prob)
    log_std = np.clip(out[:, D:].astype(np.float64), LOG_STD_MIN, LOG_STD_MAX)
    u = out[:, :D] + np.exp(log_std) * noise
    want = (-0.5 * noise.astype(np.float64) ** 2 - log_std - 0.5 * LOG_2PI).sum(1)
    want -= (2.0 * (math.log(2.0) - u - softplus(-2.0 * u))).sum(1)
    np.testing.assert_allclose(action, np.tanh(u), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(std, np.exp(log_std), rtol=1e-6)
    np.testing.assert_allclose(log_prob, want, rtol=1e-6, atol=1e-5)
    assert np.isfinite(log_prob).all() and (np.abs(action) == 1).any()  # finite where tanh(u) rounds to +-1


def test_squashed_gaussian_output_gradient(rng):
    out = f32(np.concatenate([rng.normal(size=(B, D)), rng.uniform(-25, 5, size=(B, D))], axis=1))
    grad_action, action = f32(rng.normal(size=(B, D))), f32(np.tanh(rng.normal(size=(B, D))))
    std, noise = f32(rng.uniform(0.1, 2, size=(B, D))), f32(rng.normal(size=(B, D)))
    scale = 0.3 / B
    grad_out = np.full((B, 2 * D), np.nan, np.float32)
    squashed_gaussian_output_gradient(grad_action, action, std, noise, out, LOG_STD_MIN, LOG_STD_MAX, scale, grad_out)
    a = action.astype(np.float64)
    grad_u = grad_action * (1 - a ** 2) + 2 * scale * a
    inside = (out[:, D:] >= LOG_STD_MIN) & (out[:, D:] <= LOG_STD_MAX)
    assert inside.any() and not inside.all()
    np.testing.assert_allclose(grad_out[:, :D], grad_u, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(grad_out[:, D:], np.where(inside, grad_u * std * noise - scale, 0.0), rtol=1e-6, atol=1e-9)


def test_min_gradient_shares_and_soft_target(rng):
    q1, q2 = f32(rng.normal(size=(B, 1))), f32(rng.normal(size=(B, 1)))
    q2[:5] = q1[:5]  # ties: half each, as torch.minimum's gradient
    g1, g2 = np.empty((B, 1), np.float32), np.empty((B, 1), np.float32)
    min_gradient_shares(q1, q2, -1.0 / B, g1, g2)
    share = np.where(q1 < q2, 1.0, np.where(q1 == q2, 0.5, 0.0))
    np.testing.assert_allclose(g1, -share / B, rtol=1e-7)
    np.testing.assert_allclose(g2, -(1 - share) / B, rtol=1e-7)
    log_prob, rewards = f32(rng.normal(size=B)), f32(rng.normal(size=B))
    discounts = f32(np.where(rng.random(B) < 0.2, 0.0, 0.99))
    y = np.empty(B, np.float32)
    soft_td_target(q1, q2, log_prob, rewards, discounts, 0.2, y)
    want = rewards + discounts * (np.minimum(q1, q2)[:, 0].astype(np.float64) - 0.2 * log_prob)
    np.testing.assert_allclose(y, want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("critics", [1, 2])
def test_min_td_target(rng, critics):
    """DDPG's y = r + d q' (one critic) and TD3's y = r + d min(q1', q2')."""
    q = f32(rng.normal(size=(critics, B, 1)) * 50)
    if critics == 2:
        q[1, :4] = q[0, :4]  # ties
    rewards, discounts = f32(rng.normal(size=B)), f32(np.where(rng.random(B) < 0.2, 0.0, 0.99))
    y = np.empty(B, np.float32)
    min_td_target(q, rewards, discounts, y)
    want = rewards + discounts * q[:, :, 0].astype(np.float64).min(axis=0)
    np.testing.assert_allclose(y, want, rtol=1e-6, atol=1e-6)


def test_smoothed_target_action(rng):
    """TD3's target smoothing: clamp(tanh(out) + clamp(sigma noise, -c, c), -1, 1), with noise past
    the clip and actions past the bounds."""
    out, noise = f32(rng.normal(size=(B, D)) * 3), f32(rng.normal(size=(B, D)) * 2)
    action = np.full((B, D), np.nan, np.float32)
    smoothed_target_action(out, noise, 0.2, 0.5, action)
    eps = np.clip(0.2 * noise.astype(np.float64), -0.5, 0.5)
    raw = np.tanh(out.astype(np.float64)) + eps
    assert (np.abs(0.2 * noise) > 0.5).any() and (np.abs(raw) > 1).any()
    np.testing.assert_allclose(action, np.clip(raw, -1, 1), rtol=1e-6, atol=1e-7)


def mlp_reference(weights, x, g):
    """float64 forward and backward of one ReLU MLP, `weights` [(W (out x in), b)], dL/dy `g`:
    (output, [(dW, db)], dL/dx)."""
    inputs, h = [], x
    for i, (w, b) in enumerate(weights):
        inputs.append(h)
        h = h @ w.T + b
        if i < len(weights) - 1:
            h = np.maximum(h, 0.0)
    out, grads = h, []
    for i in range(len(weights) - 1, -1, -1):
        w, _ = weights[i]
        grads.insert(0, (g.T @ inputs[i], g.sum(0)))
        g = g @ w
        if i > 0:
            g = g * (inputs[i] > 0)
    return out, grads, g


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_stacked_mlps_against_numpy(rng, precision):
    """Two MLPs of one flat tensor (the twin critics' layout: MLP 1 after MLP 0) run as one batch
    (FlatMLPs.stacked, batched products) and MLP 0 alone, forward and backward, against a float64
    numpy reference of each MLP: outputs, weight and bias gradients in the flat gradient's layout,
    and the input gradient summed over the MLPs."""
    import torch

    from pearl.runtime.fused_actor_critic import PRECISIONS, FlatMLPs, MLPBuffers

    sizes, batch, n = [5, 24, 16, 12, 1], 32, 2
    dtype = PRECISIONS[precision]
    tol = dict(rtol=1e-4, atol=1e-5) if precision == "fp32" else dict(rtol=0.05, atol=0.03)
    size = sum(a * b + b for a, b in zip(sizes[:-1], sizes[1:]))
    flat = torch.from_numpy(f32(rng.normal(size=n * size) * 0.3))
    grad_flat = torch.full((n * size,), np.nan)
    net, grads = FlatMLPs(flat, sizes, n, dtype), FlatMLPs(grad_flat, sizes, n, dtype)
    buf = MLPBuffers(sizes, batch, dtype, n)
    x = torch.from_numpy(f32(rng.normal(size=(batch, sizes[0]))))
    g = torch.from_numpy(f32(rng.normal(size=(n, batch, 1))))

    def weights_of(k):  # MLP k's layers from the flat tensor, in parameters() order
        layers, offset = [], k * size
        for a, b in zip(sizes[:-1], sizes[1:]):
            w = flat[offset:offset + a * b].double().numpy().reshape(b, a)
            layers.append((w, flat[offset + a * b:offset + a * b + b].double().numpy()))
            offset += a * b + b
        return layers

    refs = [mlp_reference(weights_of(k), x.double().numpy(), g[k].double().numpy()) for k in range(n)]
    out = buf.forward(net, x, n)
    assert out.shape == (n, batch, 1)
    for k in range(n):
        np.testing.assert_allclose(out[k].numpy(), refs[k][0], **tol)
    cols = slice(3, None)
    grad_x = buf.backward(net, grads, g, input_columns=cols)
    np.testing.assert_allclose(grad_x.numpy(), sum(ref[2][:, cols] for ref in refs), **tol)
    want = np.concatenate([np.concatenate([np.concatenate([dw.ravel(), db]) for dw, db in ref[1]]) for ref in refs])
    assert not torch.isnan(grad_flat).any()
    np.testing.assert_allclose(grad_flat.numpy(), want, **tol)

    # MLP 0 alone, on the same buffers: only MLP 0's gradients move
    grad_flat.fill_(np.nan)
    out = buf.forward(net, x)
    np.testing.assert_allclose(out.numpy(), refs[0][0], **tol)
    buf.backward(net, grads, g[0])
    np.testing.assert_allclose(grad_flat[:size].numpy(), want[:size], **tol)
    assert torch.isnan(grad_flat[size:]).all()
