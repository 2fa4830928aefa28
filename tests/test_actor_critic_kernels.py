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
