"""C-simulation of the HLS MLP kernels (hls/mlp): Q-network inference against QPolicy and a
float64 numpy model, one training step against a float64 numpy model of the step and against
FusedQLearner (kernels/cpu/qlearn.py); the C++ testbench run as `make csim` would.
Relative errors are norm-wise: max |got - want| / max |want| <= 1e-5."""
from __future__ import annotations

import subprocess

import numpy as np
import pytest

from pearl.kernels.fpga import build

if not build.available():
    pytest.skip("no C++ compiler: the HLS C-simulation cannot be built", allow_module_level=True)

from pearl.kernels.cpu import FusedQLearner, MLPLayout, QPolicy  # noqa: E402
from pearl.kernels.fpga import SimDevice  # noqa: E402
from pearl.kernels.fpga.mlp import FPGAQPolicy, FPGAQTrainer  # noqa: E402
from pearl.platforms import load_platform  # noqa: E402

U250 = load_platform("alveo_u250")  # the kernels take a loaded profile: they read no YAML


def rel_err(got, want) -> float:
    want = np.asarray(want, np.float64)
    return float(np.max(np.abs(np.asarray(got, np.float64) - want)) / np.max(np.abs(want)))


def random_params(sizes, rng, scale=0.5):
    return ((rng.random(MLPLayout(sizes).size) - 0.5) * scale).astype(np.float32)


def forward64(sizes, flat, x):
    """float64 activations of every layer (input first), hidden ReLU, linear output."""
    layers = MLPLayout(sizes).views(np.asarray(flat, np.float64))
    acts = [np.asarray(x, np.float64)]
    for i, (w, b) in enumerate(layers):
        z = acts[-1] @ w.T + b
        acts.append(np.maximum(z, 0.0) if i < len(layers) - 1 else z)
    return acts


@pytest.mark.parametrize("sizes", [[4, 64, 64, 2], [6, 64, 64, 3], [8, 256, 4], [3, 17, 5, 9, 2]])
def test_inference_matches_qpolicy_and_float64(sizes):
    rng = np.random.default_rng(len(sizes) * 100 + sizes[1])
    flat = random_params(sizes, rng)
    obs = ((rng.random((300, sizes[0])) - 0.5) * 4).astype(np.float32)  # 300 > max_batch: split
    policy = FPGAQPolicy(sizes, max_batch=128, device=SimDevice(U250))
    policy.load(flat)
    q = policy.q_values(obs)
    reference = QPolicy(MLPLayout(sizes))
    reference.load(flat)
    assert q.shape == (300, sizes[-1]) and q.dtype == np.float32
    assert rel_err(q, forward64(sizes, flat, obs)[-1]) <= 1e-5
    assert rel_err(q, reference.q_values(obs)) <= 1e-5
    np.testing.assert_array_equal(policy.greedy(obs[:5]), q[:5].argmax(axis=1))


def test_weights_stay_on_chip_until_the_next_load():
    device = SimDevice(U250)
    sizes = [4, 64, 64, 2]
    rng = np.random.default_rng(1)
    policy = FPGAQPolicy(sizes, device=device)
    first, second = random_params(sizes, rng), random_params(sizes, rng)
    obs = rng.random((8, 4)).astype(np.float32)
    policy.load(first)
    q1 = policy.q_values(obs)
    policy.flat[:] = second  # host copy changed, not loaded: the kernel still has `first`
    np.testing.assert_array_equal(policy.q_values(obs), q1)
    sent = device.transfer_bytes
    policy.q_values(obs)
    assert device.transfer_bytes - sent == obs.nbytes + 8 * 2 * 4  # only obs in, q out
    policy.load(second)
    assert rel_err(policy.q_values(obs), forward64(sizes, second, obs)[-1]) <= 1e-5


def train_step64(sizes, flat, m, v, step, obs, actions, targets, weights, lr, betas, eps, max_norm):
    """The float64 model of one step: weighted Huber TD loss, backward, clip, Adam (torch rule)."""
    layout = MLPLayout(sizes)
    acts = forward64(sizes, flat, obs)
    batch = len(actions)
    rows = np.arange(batch)
    td = acts[-1][rows, actions] - targets
    grad_z = np.zeros_like(acts[-1])
    grad_z[rows, actions] = np.clip(td, -1, 1) * weights / batch
    grad = np.zeros(layout.size)
    params = layout.views(np.asarray(flat, np.float64))
    for layer in range(len(params) - 1, -1, -1):
        gw, gb = layout.views(grad)[layer]
        gw[:] = grad_z.T @ acts[layer]
        gb[:] = grad_z.sum(axis=0)
        if layer:
            grad_z = (grad_z @ params[layer][0]) * (acts[layer] > 0)
    grad *= min(1.0, max_norm / (np.linalg.norm(grad) + 1e-6))
    b1, b2 = betas
    m = b1 * m + (1 - b1) * grad
    v = b2 * v + (1 - b2) * grad * grad
    new = flat - lr / (1 - b1 ** step) * m / (np.sqrt(v) / np.sqrt(1 - b2 ** step) + eps)
    return new, m, v, np.abs(td)


@pytest.mark.parametrize("sizes,max_norm", [([4, 64, 64, 2], 10.0), ([6, 32, 3], 0.05)])
def test_training_step_matches_float64_model(sizes, max_norm):
    """Three steps (Adam moments carried over); max_norm 0.05 makes the clipping bite."""
    rng = np.random.default_rng(7)
    flat = random_params(sizes, rng)
    trainer = FPGAQTrainer(sizes, lr=1e-3, max_grad_norm=max_norm, max_batch=64, device=SimDevice(U250))
    trainer.load_state(flat)
    params, m, v = flat.astype(np.float64), np.zeros(flat.size), np.zeros(flat.size)
    for step in range(1, 4):
        obs = ((rng.random((64, sizes[0])) - 0.5) * 4).astype(np.float32)
        actions = rng.integers(0, sizes[-1], 64)
        targets = (rng.random(64) * 3 - 1).astype(np.float32)
        weights = (0.5 + rng.random(64)).astype(np.float32)
        abs_td = trainer.step(obs, actions, targets, weights)
        params, m, v, want_td = train_step64(sizes, params, m, v, step, obs, actions, targets, weights,
                                             1e-3, (0.9, 0.999), 1e-8, max_norm)
        assert rel_err(abs_td, want_td) <= 1e-5
        state = trainer.state()
        assert rel_err(state["online"], params) <= 1e-5
        assert rel_err(state["online"] - flat, params - flat) <= 1e-3  # the update itself, not just the weights
        assert rel_err(state["exp_avg"], m) <= 1e-4


def test_training_step_matches_the_fused_cpu_learner():
    """Same weights, same batch, targets computed as FusedQLearner does: same new weights."""
    sizes = [4, 64, 64, 2]
    rng = np.random.default_rng(3)
    learner = FusedQLearner(sizes, lr=1e-3, double=True, max_grad_norm=10.0)
    learner.online[:] = random_params(sizes, rng)
    learner.target[:] = learner.online + random_params(sizes, rng, scale=0.01)
    trainer = FPGAQTrainer(sizes, lr=1e-3, max_grad_norm=10.0, max_batch=64, device=SimDevice(U250))
    trainer.load_state(learner.online)
    for _ in range(3):
        obs, next_obs = (rng.standard_normal((64, 4)).astype(np.float32) for _ in range(2))
        actions = rng.integers(0, 2, 64)
        rewards = rng.random(64).astype(np.float32)
        discounts = np.where(rng.random(64) < 0.1, 0.0, 0.99).astype(np.float32)
        weights = (0.5 + rng.random(64)).astype(np.float32)
        online, target = QPolicy(MLPLayout(sizes)), QPolicy(MLPLayout(sizes))
        online.load(learner.online)
        target.load(learner.target)
        next_q = target.q_values(next_obs)[np.arange(64), online.q_values(next_obs).argmax(axis=1)]
        targets = rewards + discounts * next_q
        abs_td = trainer.step(obs, actions, targets, weights)
        _, want_td = learner.update(obs, actions, rewards, next_obs, discounts, weights)
        assert rel_err(abs_td, want_td) <= 1e-5
        assert rel_err(trainer.state()["online"], learner.online) <= 1e-5


def test_kernel_refuses_out_of_range_calls():
    trainer = FPGAQTrainer([4, 8, 2], lr=1e-3, max_grad_norm=1.0, max_batch=16, device=SimDevice(U250))
    trainer.load_state(np.zeros(MLPLayout([4, 8, 2]).size, np.float32))
    with pytest.raises(ValueError, match="outside"):
        trainer.step(np.zeros((4, 4)), np.array([0, 1, 2, 0]), np.zeros(4))  # action 2 of 2
    with pytest.raises(ValueError, match="batch"):
        trainer.step(np.zeros((17, 4)), np.zeros(17, int), np.zeros(17))
    with pytest.raises(ValueError, match="1 to 4 layers"):
        FPGAQPolicy([4, 8, 8, 8, 8, 2], device=SimDevice(U250))


def test_cpp_testbench_passes():
    exe = build.build("mlp", ["mlp_forward.cpp", "mlp_train.cpp", "mlp_tb.cpp"],
                      {"PEARL_MLP_MAX_WIDTH": 64, "PEARL_MLP_MAX_BATCH": 64}, shared=False)
    result = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "PASS" in result.stdout
