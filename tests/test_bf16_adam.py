"""The bf16 CNN learner's compiled Adam step (kernels/cpu/bf16_adam.py, pearl.nets.BF16Copy.adam_step)
against numpy and torch: the sum of squares of bfloat16 gradients, one Adam step on a bfloat16 gradient
against torch's fused Adam with the rounding of the new weights to bfloat16 against torch's, and the
whole step of a channels-last CNN copy (clipped and not) against the torch ops it replaces."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from pearl.algos.dqn import DQN
from pearl.config import DQNConfig
from pearl.kernels.cpu.bf16_adam import adam_to_bf16, bf16_sumsq
from pearl.nets import BF16Copy

RTOL = 2e-6  # float32 arithmetic in another order than torch's vectorized kernel


def bf16_bits(values: np.ndarray) -> np.ndarray:
    return torch.from_numpy(np.ascontiguousarray(values, np.float32)).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


def test_bf16_sumsq_against_numpy():
    rng = np.random.default_rng(0)
    values = np.concatenate([rng.normal(scale=3.0, size=999), [0.0, -0.0, 1e-40, -2.5e38]]).astype(np.float32)
    bits = bf16_bits(values)
    want = (bits.astype(np.uint32) << 16).view(np.float32)
    assert bf16_sumsq(bits) == pytest.approx(np.sum(want.astype(np.float64) ** 2), rel=1e-12)


@pytest.mark.parametrize("shape, weight_scale", [((1, 7, 300), 1.0), ((3, 5, 4), 1 / 255)])
def test_adam_to_bf16_against_torch_fused_adam(shape, weight_scale):
    rng = np.random.default_rng(1)
    master = rng.normal(size=shape).astype(np.float32)
    exp_avg, exp_avg_sq = np.zeros(shape, np.float32), np.zeros(shape, np.float32)
    param = torch.nn.Parameter(torch.from_numpy(master.copy()))
    adam = torch.optim.Adam([param], lr=3e-3, betas=(0.9, 0.999), eps=1e-8, fused=True)
    low, row = np.empty(shape, np.uint16), np.empty(shape[2], np.float32)
    for step in range(1, 6):
        grad = rng.normal(size=shape).astype(np.float32)
        grad_scale = 0.37 if step % 2 else 1.0  # a clipping coefficient on odd steps
        grad = (bf16_bits(grad).astype(np.uint32) << 16).view(np.float32)  # a bfloat16 gradient's values
        param.grad = torch.from_numpy(grad * np.float32(grad_scale))
        adam.step()
        adam_to_bf16(bf16_bits(grad), grad_scale, master, exp_avg, exp_avg_sq, low, weight_scale, row,
                     3e-3, 0.9, 0.999, 1e-8, float(step))
        state = adam.state[param]
        np.testing.assert_allclose(master, param.detach().numpy(), rtol=RTOL, atol=1e-7)
        np.testing.assert_allclose(exp_avg, state["exp_avg"].numpy(), rtol=RTOL, atol=1e-9)
        np.testing.assert_allclose(exp_avg_sq, state["exp_avg_sq"].numpy(), rtol=RTOL, atol=1e-12)
        # the copy: this master's weights times the scale, rounded to nearest even exactly as torch
        np.testing.assert_array_equal(low, bf16_bits(master * np.float32(weight_scale)))


def test_adam_to_bf16_keeps_a_nan_a_nan():
    shape = (1, 1, 4)
    master = np.array([[[1.0, np.nan, -2.0, np.inf]]], np.float32)
    low = np.empty(shape, np.uint16)
    adam_to_bf16(np.zeros(shape, np.uint16), 1.0, master, np.zeros(shape, np.float32), np.zeros(shape, np.float32),
                 low, 1.0, np.empty(4, np.float32), 1e-3, 0.9, 0.999, 1e-8, 1.0)
    widened = (low.astype(np.uint32) << 16).view(np.float32).ravel()
    assert widened[0] == 1.0 and np.isnan(widened[1]) and widened[2] == -2.0 and widened[3] == np.inf


@pytest.mark.parametrize("max_norm", [1e-3, 1e6])  # clipped, not clipped
def test_copy_adam_step_against_the_torch_ops(max_norm):
    """BF16Copy.adam_step of a channels-last CNN copy (input scale folded into its first convolution)
    against what it replaces: the copy's gradient to float32 times the scale, clip_grad_norm_, torch's
    fused Adam, the copy refreshed."""
    shape = (4, 10, 10)
    nets = [DQN(400, 4, DQNConfig(conv=[[16, 3, 1], [8, 2, 2]], hidden=[32], lr=1e-3), 100, seed=2,
                obs_shape=shape, obs_scale=1 / 255) for _ in range(2)]
    ours, ref = (BF16Copy(algo.online) for algo in nets)
    ref_adam = torch.optim.Adam(nets[1].online.parameters(), lr=1e-3, fused=True)
    first = next(ref.net.parameters())
    assert first.is_contiguous(memory_format=torch.channels_last)
    rng = np.random.default_rng(3)
    for step in range(3):
        obs = torch.from_numpy(rng.integers(0, 256, (8, *shape), dtype=np.uint8))
        for low in (ours, ref):
            low(obs).square().sum().backward()
        ours.adam_step(nets[0].optimizer, max_norm)
        with torch.no_grad():
            for low, master in zip(ref.net.parameters(), nets[1].online.parameters()):
                # in the master's layout (a fused Adam reads a gradient's memory in the parameter's order)
                master.grad = torch.empty_like(master).copy_(low.grad.float() * (1 / 255 if low is first else 1.0))
                low.grad = None
        torch.nn.utils.clip_grad_norm_(nets[1].online.parameters(), max_norm)
        ref_adam.step()
        ref.refresh()
        for got, want in zip(nets[0].online.parameters(), nets[1].online.parameters()):
            np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=1e-5, atol=1e-7)
        for got, want in zip(ours.net.parameters(), ref.net.parameters()):
            assert got.grad is None
            mismatch = (got.detach().float() != want.detach().float()).float().mean()
            assert mismatch < 0.01  # a master 1 ulp apart may round to the neighbouring bfloat16
        # each step compared alone: the reference restarts from our weights and moments (a weight's
        # bfloat16 neighbour changes the next gradients, and Adam's normalized step of a tiny one)
        with torch.no_grad():
            for got, want in zip(nets[0].online.parameters(), nets[1].online.parameters()):
                want.copy_(got)
                for name in ("exp_avg", "exp_avg_sq"):
                    ref_adam.state[want][name].copy_(nets[0].optimizer.state[got][name])
        ref.refresh()
