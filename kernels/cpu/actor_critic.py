"""The elementwise steps of the fused continuous learners (pearl/runtime/fused_actor_critic.py)
between their matrix products, each one compiled loop over the batch.

Why: written as torch ops, SAC's squashed-Gaussian sample, its log-probability, the actor's output
gradient and the losses are ~60 calls per update on (batch, 1) tensors, each ~3-5 us of dispatch
for a few hundred flops; one compiled call over the same preallocated arrays takes ~1-2 us. The
arithmetic is float64 inside a row and stored as float32 (torch's float32 ops round at every
step; the two agree to float32's rounding: tests/test_actor_critic_kernels.py holds each kernel to
a numpy reference, tests/test_fused_sac.py and tests/test_continuous.py the learners to the
autograd updates).
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

_NJIT = dict(cache=True, nogil=True)

LOG_2 = math.log(2.0)
SOFTPLUS_THRESHOLD = 20.0  # torch.nn.functional.softplus's: above it, softplus(x) = x


@njit(**_NJIT)
def squared_error_gradient(q, y, scale, grad):
    """grad[i, 0] = scale * (q[i, 0] - y[i]); returns the mean of (q - y)^2 (the MSE loss)."""
    total = 0.0
    n = y.shape[0]
    for i in range(n):
        diff = np.float64(q[i, 0]) - y[i]
        total += diff * diff
        grad[i, 0] = scale * diff
    return total / n


@njit(**_NJIT)
def squashed_gaussian_sample(out, noise, log_std_min, log_std_max, action, std, log_prob):
    """SAC's policy sample from the actor's output `out` = [mean, raw log std] (batch x 2d) and the
    standard normal draws `noise` (batch x d): u = mean + exp(clamp(raw log std)) * noise,
    action = tanh(u), std = exp(clamped log std), log_prob[i] = the Gaussian's log-density of u
    minus log |d tanh(u) / du| (its softplus form: 2 (log 2 - u - softplus(-2u))), summed over the
    action's components (pearl/algos/sac.py SquashedGaussianActor.sample)."""
    batch, d = noise.shape
    half_log_2pi = 0.5 * math.log(2.0 * math.pi)
    for i in range(batch):
        total = 0.0
        for j in range(d):
            log_s = min(max(np.float64(out[i, d + j]), log_std_min), log_std_max)
            s = math.exp(log_s)
            e = np.float64(noise[i, j])
            u = out[i, j] + s * e
            x = -2.0 * u
            softplus = x if x > SOFTPLUS_THRESHOLD else math.log1p(math.exp(x))
            total += -0.5 * e * e - log_s - half_log_2pi - 2.0 * (LOG_2 - u - softplus)
            std[i, j] = s
            action[i, j] = math.tanh(u)
        log_prob[i] = total


@njit(**_NJIT)
def squashed_gaussian_output_gradient(grad_action, action, std, noise, out, log_std_min, log_std_max,
                                      entropy_scale, grad_out):
    """dL/d(actor output) for L = mean(alpha log pi - Q(s, tanh(u))) given dL/d(action)
    `grad_action` (batch x d, the critics' part) and `entropy_scale` = alpha / batch: through tanh
    (1 - a^2), log pi's own dependence on u (d/du of -2 (log 2 - u - softplus(-2u)) is 2 tanh(u)),
    u = mean + std * noise, log pi's -log std, and the clamp of log std (gradient only inside it)."""
    batch, d = grad_action.shape
    for i in range(batch):
        for j in range(d):
            a = np.float64(action[i, j])
            grad_u = grad_action[i, j] * (1.0 - a * a) + 2.0 * entropy_scale * a
            grad_out[i, j] = grad_u
            raw = out[i, d + j]
            inside = log_std_min <= raw <= log_std_max
            grad_out[i, d + j] = grad_u * std[i, j] * noise[i, j] - entropy_scale if inside else 0.0


@njit(**_NJIT)
def min_gradient_shares(q1, q2, scale, grad1, grad2):
    """The gradient `scale` of min(q1, q2) split between its arguments as torch.minimum's is: all to
    the smaller, half each on a tie; returns nothing, writes grad1 and grad2 (batch x 1)."""
    for i in range(q1.shape[0]):
        a, b = q1[i, 0], q2[i, 0]
        share = 1.0 if a < b else (0.5 if a == b else 0.0)
        grad1[i, 0] = scale * share
        grad2[i, 0] = scale * (1.0 - share)


@njit(**_NJIT)
def soft_td_target(q1, q2, log_prob, rewards, discounts, alpha, y):
    """y = rewards + discounts * (min(q1, q2) - alpha log_prob), SAC's target."""
    for i in range(y.shape[0]):
        y[i] = rewards[i] + discounts[i] * (min(np.float64(q1[i, 0]), q2[i, 0]) - alpha * log_prob[i])


@njit(**_NJIT)
def min_td_target(q, rewards, discounts, y):
    """y = rewards + discounts * min_k q[k, :, 0], DDPG's target (one critic, q: 1 x batch x 1) and
    TD3's (the smaller of the twin target critics, q: 2 x batch x 1)."""
    for i in range(y.shape[0]):
        smallest = np.float64(q[0, i, 0])
        for k in range(1, q.shape[0]):
            smallest = min(smallest, np.float64(q[k, i, 0]))
        y[i] = rewards[i] + discounts[i] * smallest


@njit(**_NJIT)
def smoothed_target_action(out, noise, sigma, clip, action):
    """TD3's target policy smoothing: action = clamp(tanh(out) + clamp(sigma * noise, -clip, clip),
    -1, 1), `out` the target actor's last layer (pre-tanh), `noise` standard normal draws."""
    batch, d = out.shape
    for i in range(batch):
        for j in range(d):
            eps = min(max(sigma * np.float64(noise[i, j]), -clip), clip)
            action[i, j] = min(max(math.tanh(np.float64(out[i, j])) + eps, -1.0), 1.0)
