"""The fused numpy Q-learning step (kernels/cpu/qlearn.py) against the PyTorch reference DQN.

Both start from the same flat weights and see the same float32 batches; losses, |TD| vectors and
weights must agree to float32 rounding (norm-relative error <= 1e-5) after many steps, with and
without importance weights, double and vanilla DQN, and with gradient-norm clipping active in some
steps and not in others.
"""
from __future__ import annotations

import platform

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from threadpoolctl import threadpool_limits

from pearl.algos.dqn import DQN
from pearl.config import DQNConfig
from pearl.kernels.cpu import FusedQLearner, cpu_kernel_mode, paired_products
from pearl.kernels.cpu.bf16_gemm import to_bf16
from pearl.kernels.cpu.mlp import bf16_layers
from pearl.replay import Batch
from pearl.runtime.learners import FusedCPULearner, TorchLearner

REL = 1e-5


@pytest.fixture(autouse=True, scope="module")
def _single_threaded():
    """Tiny matrices: one thread is faster, and torch's and BLAS's thread pools spinning
    against each other on a small or busy machine can slow these tests down 10-30x."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with threadpool_limits(limits=1, user_api="blas"):
            yield
    finally:
        torch.set_num_threads(threads)


def assert_close(actual, expected, rel=REL, atol=1e-6, what=""):
    """||a - b|| <= rel * ||b|| (norm-relative) and elementwise allclose with a small atol."""
    a = np.asarray(actual, dtype=np.float64)
    b = np.asarray(expected, dtype=np.float64)
    assert a.shape == b.shape, what
    scale = np.linalg.norm(b)
    err = np.linalg.norm(a - b)
    assert err <= rel * scale + atol * np.sqrt(max(b.size, 1)), (
        f"{what}: norm-relative error {err / max(scale, 1e-30):.3g} > {rel}")
    np.testing.assert_allclose(a, b, rtol=10 * rel, atol=atol, err_msg=what)


def make_pair(sizes, double=True, max_grad_norm=10.0, lr=1e-3, seed=0, target_noise=0.05):
    """A torch DQN and a FusedQLearner holding the same online and target weights.

    The target net is perturbed away from the online net so that double and vanilla DQN differ.
    """
    obs_dim, *hidden, n_actions = sizes
    cfg = DQNConfig(hidden=list(hidden), lr=lr, double=double, max_grad_norm=max_grad_norm)
    algo = DQN(obs_dim, n_actions, cfg, total_steps=1000, seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in algo.target.parameters():
            p.add_(target_noise * torch.randn(p.shape, generator=gen))
    kernel = FusedQLearner(algo.policy_sizes(), cfg.lr, cfg.double, cfg.max_grad_norm)
    kernel.online[:] = DQN.flat_weights(algo.online)
    kernel.target[:] = DQN.flat_weights(algo.target)
    return algo, kernel


def random_batch(rng, batch, obs_dim, n_actions, weighted, reward_scale=3.0):
    obs = rng.standard_normal((batch, obs_dim)).astype(np.float32)
    next_obs = rng.standard_normal((batch, obs_dim)).astype(np.float32)
    actions = rng.integers(0, n_actions, batch).astype(np.int64)
    rewards = (reward_scale * rng.standard_normal(batch)).astype(np.float32)
    # Mix terminal (0), bootstrapped (gamma^k) transitions.
    discounts = np.where(rng.random(batch) < 0.2, 0.0,
                         0.99 ** rng.integers(1, 4, batch)).astype(np.float32)
    weights = rng.uniform(0.05, 1.0, batch).astype(np.float32) if weighted else None
    return obs, actions, rewards, next_obs, discounts, weights


def torch_update(algo, obs, actions, rewards, next_obs, discounts, weights):
    t = torch.from_numpy
    loss, abs_td = algo.update(t(obs), t(actions), t(rewards), t(next_obs), t(discounts),
                               None if weights is None else t(weights))
    return loss, abs_td.numpy()


@pytest.fixture
def grad_norms(monkeypatch):
    """Records the pre-clipping total gradient norm of every torch update."""
    norms = []
    original = torch.nn.utils.clip_grad_norm_

    def recording(parameters, max_norm, *args, **kwargs):
        total = original(parameters, max_norm, *args, **kwargs)
        norms.append(float(total))
        return total

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", recording)
    return norms


# max_grad_norm 0.25 sits inside the range of gradient norms these batches produce (about 0.1
# to 0.6 for this network), so some steps clip and some do not; 1e3 never clips.
@pytest.mark.parametrize("double", [True, False], ids=["double", "vanilla"])
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("max_grad_norm", [0.25, 1e3], ids=["clip-some", "clip-never"])
def test_fused_matches_torch_over_many_updates(double, weighted, max_grad_norm, grad_norms):
    sizes = [4, 64, 64, 2]
    algo, kernel = make_pair(sizes, double=double, max_grad_norm=max_grad_norm, seed=3)
    rng = np.random.default_rng(11)
    steps = 20
    for step in range(steps):
        batch = random_batch(rng, 64, sizes[0], sizes[-1], weighted)
        loss_t, td_t = torch_update(algo, *batch)
        loss_k, td_k = kernel.update(*batch)
        assert np.isfinite(loss_k)
        assert abs(loss_k - loss_t) <= REL * abs(loss_t) + 1e-7, (step, loss_k, loss_t)
        assert_close(td_k, td_t, what=f"|TD| at step {step}")
        assert td_k.shape == (64,)
    assert kernel.steps == steps
    assert_close(kernel.online, DQN.flat_weights(algo.online), what="online weights")
    # update() never touches the target net
    np.testing.assert_array_equal(kernel.target, DQN.flat_weights(algo.target))

    # Adam moments match torch's as well
    state = algo.optimizer.state
    params = list(algo.online.parameters())
    exp_avg = np.concatenate([state[p]["exp_avg"].reshape(-1).numpy() for p in params])
    exp_avg_sq = np.concatenate([state[p]["exp_avg_sq"].reshape(-1).numpy() for p in params])
    assert_close(kernel.exp_avg, exp_avg, rel=1e-4, atol=1e-8, what="exp_avg")
    assert_close(kernel.exp_avg_sq, exp_avg_sq, rel=1e-4, atol=1e-12, what="exp_avg_sq")

    # The clipping regime really is what the test names claim.
    assert len(grad_norms) == steps
    if max_grad_norm < 1.0:
        assert any(n > max_grad_norm for n in grad_norms), grad_norms
        assert any(n < max_grad_norm for n in grad_norms), grad_norms
    else:
        assert all(n < max_grad_norm for n in grad_norms)


def test_clipping_changes_the_step():
    """Sanity: with a tiny max_grad_norm the weights differ from an unclipped run (the clip is
    not a no-op in the kernel), and both still match torch."""
    sizes = [3, 16, 3]
    results = {}
    for max_grad_norm in (1e-3, 1e3):
        algo, kernel = make_pair(sizes, max_grad_norm=max_grad_norm, lr=1e-2, seed=5)
        rng = np.random.default_rng(2)
        for _ in range(5):
            batch = random_batch(rng, 32, sizes[0], sizes[-1], weighted=True)
            torch_update(algo, *batch)
            kernel.update(*batch)
        assert_close(kernel.online, DQN.flat_weights(algo.online), what=f"mgn={max_grad_norm}")
        results[max_grad_norm] = kernel.online.copy()
    assert np.linalg.norm(results[1e-3] - results[1e3]) > 1e-4


def test_unit_weights_equal_no_weights():
    sizes = [4, 8, 2]
    _, k1 = make_pair(sizes, seed=1)
    _, k2 = make_pair(sizes, seed=1)
    rng = np.random.default_rng(0)
    obs, actions, rewards, next_obs, discounts, _ = random_batch(rng, 16, 4, 2, weighted=False)
    loss1, td1 = k1.update(obs, actions, rewards, next_obs, discounts, None)
    loss2, td2 = k2.update(obs, actions, rewards, next_obs, discounts, np.ones(16, np.float32))
    assert loss1 == pytest.approx(loss2, rel=1e-7)
    np.testing.assert_array_equal(td1, td2)
    np.testing.assert_allclose(k1.online, k2.online, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("tau", [1.0, 0.005, 0.3, 0.75])
def test_update_target_matches_torch_lerp(tau):
    sizes = [4, 32, 32, 2]
    algo, kernel = make_pair(sizes, seed=7)
    algo.config.tau = tau
    rng = np.random.default_rng(4)
    for _ in range(3):  # move the online net away from the target
        batch = random_batch(rng, 32, 4, 2, weighted=False)
        torch_update(algo, *batch)
        kernel.update(*batch)
    online_before = kernel.online.copy()
    target_before = kernel.target.copy()
    assert not np.allclose(online_before, target_before)

    algo.update_target()
    kernel.update_target(tau)
    expected = DQN.flat_weights(algo.target)
    if tau == 1.0:
        np.testing.assert_array_equal(kernel.target, kernel.online)
        assert_close(kernel.target, expected, what="hard copy")
    else:
        assert_close(kernel.target, expected, rel=1e-6, atol=1e-7, what=f"lerp tau={tau}")
        reference = target_before.astype(np.float64) + tau * (
            online_before.astype(np.float64) - target_before.astype(np.float64))
        np.testing.assert_allclose(kernel.target, reference, rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(kernel.online, online_before)  # the online net is untouched


def test_target_update_then_more_learning_stays_in_lockstep():
    sizes = [5, 24, 24, 3]
    algo, kernel = make_pair(sizes, max_grad_norm=0.5, seed=9)
    algo.config.tau = 0.5
    rng = np.random.default_rng(8)
    for step in range(12):
        batch = random_batch(rng, 48, 5, 3, weighted=step % 2 == 0)
        loss_t, td_t = torch_update(algo, *batch)
        loss_k, td_k = kernel.update(*batch)
        assert loss_k == pytest.approx(loss_t, rel=REL)
        assert_close(td_k, td_t, what=f"|TD| at step {step}")
        if step % 4 == 3:
            algo.update_target()
            kernel.update_target(0.5)
    assert_close(kernel.online, DQN.flat_weights(algo.online), what="online")
    assert_close(kernel.target, DQN.flat_weights(algo.target), what="target")


@settings(max_examples=12, deadline=None, derandomize=True)
@given(
    obs_dim=st.integers(1, 8),
    hidden=st.lists(st.integers(1, 24), min_size=1, max_size=3),
    n_actions=st.integers(1, 5),
    batch=st.integers(1, 40),
    double=st.booleans(),
    weighted=st.booleans(),
    max_grad_norm=st.sampled_from([0.05, 1.0, 100.0]),
    seed=st.integers(0, 2**16),
)
def test_single_update_property(obs_dim, hidden, n_actions, batch, double, weighted,
                                max_grad_norm, seed):
    sizes = [obs_dim, *hidden, n_actions]
    algo, kernel = make_pair(sizes, double=double, max_grad_norm=max_grad_norm, seed=seed)
    assert kernel.layout.size == algo.n_params()
    rng = np.random.default_rng(seed)
    data = random_batch(rng, batch, obs_dim, n_actions, weighted)
    loss_t, td_t = torch_update(algo, *data)
    loss_k, td_k = kernel.update(*data)
    assert abs(loss_k - loss_t) <= REL * abs(loss_t) + 1e-7
    assert_close(td_k, td_t, what="|TD|")
    assert_close(kernel.online, DQN.flat_weights(algo.online), what="online weights")


# -- the learner wrappers the runtime uses ---------------------------------------------------------
def _batch(rng, n, obs_dim, n_actions, weighted):
    obs, actions, rewards, next_obs, discounts, weights = random_batch(
        rng, n, obs_dim, n_actions, weighted)
    return Batch(obs=obs, actions=actions, rewards=rewards, next_obs=next_obs,
                 discounts=discounts, indices=np.arange(n), weights=weights)


def test_fused_and_torch_learners_agree_and_share_checkpoints():
    cfg = DQNConfig(hidden=[16, 16], lr=3e-3, max_grad_norm=0.5, tau=0.2)
    fused = FusedCPULearner(DQN(4, 2, cfg, total_steps=100, seed=1))
    torch_learner = TorchLearner(DQN(4, 2, cfg, total_steps=100, seed=1), "cpu")
    assert isinstance(fused, FusedCPULearner) and isinstance(torch_learner, TorchLearner)
    np.testing.assert_array_equal(fused.policy_weights(), torch_learner.policy_weights())

    rng = np.random.default_rng(0)
    for step in range(6):
        batch = _batch(rng, 32, 4, 2, weighted=step % 2 == 1)
        loss_f, td_f = fused.update(batch)
        loss_t, td_t = torch_learner.update(batch)
        assert loss_f == pytest.approx(loss_t, rel=REL)
        assert_close(td_f, td_t, what="|TD|")
        if step == 2:
            fused.update_target()
            torch_learner.update_target()
    assert_close(fused.policy_weights(), torch_learner.policy_weights(), what="policy")

    # A checkpoint written by one learner continues identically in the other.
    fused_state, torch_state = fused.state_dict(), torch_learner.state_dict()
    assert fused_state["steps"] == torch_state["steps"] == 6
    for name in ("online", "target", "exp_avg", "exp_avg_sq"):
        assert_close(fused_state[name], torch_state[name], rel=1e-4, atol=1e-10, what=name)

    fused2 = FusedCPULearner(DQN(4, 2, cfg, total_steps=100, seed=99))
    torch2 = TorchLearner(DQN(4, 2, cfg, total_steps=100, seed=99), "cpu")
    fused2.load_state_dict(torch_state)
    torch2.load_state_dict(fused_state)
    np.testing.assert_array_equal(DQN.flat_weights(fused2.algo.online), torch_state["online"])
    for step in range(4):
        batch = _batch(rng, 32, 4, 2, weighted=True)
        results = [learner.update(batch) for learner in (fused, torch_learner, fused2, torch2)]
        for loss, td in results[1:]:
            assert loss == pytest.approx(results[0][0], rel=REL)
            assert_close(td, results[0][1], what="|TD| after checkpoint")
    reference = fused.policy_weights()
    for learner in (torch_learner, fused2, torch2):
        assert_close(learner.policy_weights(), reference, what="policy after checkpoint")


# -- two threads: the big products in pairs ----------------------------------------------------------
# 128 x 96 at batch 128 (1.6M multiply-adds) pairs; the first and last layers' products run alone
PAIRED_SIZES = [6, 128, 96, 3]


@pytest.mark.parametrize("double", [True, False], ids=["double", "vanilla"])
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
def test_two_threads_match_one_thread_bit_for_bit(double, weighted):
    """Each product of the 2-thread step is the 1-thread step's own BLAS call: the same bits."""
    assert paired_products(PAIRED_SIZES, 128) and not paired_products(PAIRED_SIZES, 32)
    kernels = [make_pair(PAIRED_SIZES, double=double, max_grad_norm=1.0, seed=5)[1] for _ in range(2)]
    kernels[1].threads = 2
    rng = np.random.default_rng(7)
    with cpu_kernel_mode():
        for step in range(12):
            batch = random_batch(rng, 128 if step % 3 else 32, PAIRED_SIZES[0], PAIRED_SIZES[-1], weighted)
            (loss_1, td_1), (loss_2, td_2) = (kernel.update(*batch) for kernel in kernels)
            assert loss_1 == loss_2, step
            np.testing.assert_array_equal(td_1, td_2)
            if step == 5:
                for kernel in kernels:
                    kernel.update_target(1.0)
    for name in ("online", "target", "exp_avg", "exp_avg_sq", "grad"):
        np.testing.assert_array_equal(getattr(kernels[0], name), getattr(kernels[1], name), err_msg=name)


def test_two_threads_match_torch():
    algo, kernel = make_pair(PAIRED_SIZES, double=True, max_grad_norm=10.0, seed=2)
    kernel.threads = 2
    rng = np.random.default_rng(3)
    for step in range(8):
        batch = random_batch(rng, 128, PAIRED_SIZES[0], PAIRED_SIZES[-1], weighted=step % 2 == 1)
        loss_t, td_t = torch_update(algo, *batch)
        loss_k, td_k = kernel.update(*batch)
        assert abs(loss_k - loss_t) <= REL * abs(loss_t) + 1e-7, (step, loss_k, loss_t)
        assert_close(td_k, td_t, what=f"|TD| at step {step}")
    assert_close(kernel.online, DQN.flat_weights(algo.online), what="online weights")


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="x86's MXCSR")
def test_the_pool_thread_takes_the_callers_float_mode():
    """A product on numba's pool thread runs in the caller's floating-point mode (denormals
    flushed under cpu_kernel_mode), as on the caller: else the pairs' bits could differ from the
    1-thread step's, and its denormals ran up to 2x slower."""
    from numba import njit, prange

    from pearl.kernels.cpu.float_mode import apply_float_mode, current_float_mode

    @njit(parallel=True)
    def modes_seen(mode):
        seen = np.zeros(2, np.int64)
        for side in prange(2):
            apply_float_mode(mode)
            seen[side] = current_float_mode()
        return seen

    @njit
    def caller_mode():
        return current_float_mode()

    with cpu_kernel_mode():
        flushing = caller_mode()
    plain = caller_mode()
    assert flushing != plain  # FTZ and DAZ (x86's MXCSR bits 15 and 6) on under cpu_kernel_mode
    for mode in (flushing, plain):
        np.testing.assert_array_equal(modes_seen(mode), [mode, mode])


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="x86's MXCSR")
def test_torchs_intra_op_threads_flush_denormals_under_cpu_kernel_mode_and_not_after():
    """torch's intra-op threads keep the mode of the thread that made them: made here before
    cpu_kernel_mode, they would run their share of a 2-thread op (a learner on 2 torch threads)
    on denormals unflushed unless the mode reaches them too. An elementwise op on 4M denormal
    floats splits over both threads; each thread's share of x * 1.0 stays denormal or becomes 0
    by its own mode."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        x = torch.full((1 << 22,), 1e-39)  # below float32's smallest normal (1.2e-38)

        def denormals_kept():
            return int(((x * 1.0) != 0).sum())

        assert denormals_kept() == x.numel()  # the pool exists now, made without flushing
        with cpu_kernel_mode():
            assert torch.get_num_threads() == 2
            assert denormals_kept() == 0  # the caller's share and the pool thread's
        assert denormals_kept() == x.numel()  # restored on exit, on both
    finally:
        torch.set_num_threads(threads)


# -- precision bf16: the inner hidden layers' products in bfloat16 -----------------------------------
# 64 x 48 and 48 x 32 are inner layers that fit the bf16 tiles (multiples of 16); 6 -> 64 and 32 -> 3 stay float32
BF16_SIZES = [6, 64, 48, 32, 3]


def rounded(x) -> np.ndarray:
    """float32 values rounded to bfloat16, widened to float64 for the reference's sums."""
    return to_bf16(np.asarray(x, np.float32)).astype(np.float64)


def bf16_reference_step(kernel, obs, actions, rewards, next_obs, discounts, weights):
    """(loss, |TD|, gradient) of one step as the bf16 kernel defines it, in float64 with every
    bfloat16 rounding where the kernel has one: a bf16 layer's inputs and weights in the forwards,
    the gradient reaching it and its inputs in its weight gradient, that gradient and its weights
    in the gradient it passes down; every layer's output rounded to float32 as the kernel stores it."""
    batch = obs.shape[0]
    low = bf16_layers(np.array(kernel.layout.shapes), batch)

    def forward(flat, x):
        outputs = [np.asarray(x, np.float64)]
        views = kernel.layout.views(flat)
        for layer, (weight, bias) in enumerate(views):
            inputs = outputs[-1]
            z = (rounded(inputs) @ rounded(weight).T if low[layer] else inputs @ weight.astype(np.float64).T) + bias
            z = z.astype(np.float32).astype(np.float64)
            outputs.append(np.maximum(z, 0.0) if layer < len(views) - 1 else z)
        return outputs

    online = forward(kernel.online, np.concatenate([obs, next_obs]) if kernel.double else obs)
    target_q = forward(kernel.target, next_obs)[-1]
    rows = np.arange(batch)
    q = online[-1][:batch]
    next_q = target_q[rows, online[-1][batch:].argmax(1)] if kernel.double else target_q.max(1)
    td = q[rows, actions] - (rewards + discounts * next_q)
    w = np.ones(batch) if weights is None else weights.astype(np.float64)
    huber = np.where(np.abs(td) <= 1.0, 0.5 * td * td, np.abs(td) - 0.5)
    grad_z = np.zeros_like(q)
    grad_z[rows, actions] = np.clip(td, -1.0, 1.0) * w / batch
    gradient = np.zeros(kernel.layout.size)
    for layer in range(len(kernel.layout.shapes) - 1, -1, -1):
        (n_out, n_in), start = kernel.layout.shapes[layer], kernel.layout.offsets[layer]
        weight = kernel.layout.views(kernel.online)[layer][0].astype(np.float64)
        inputs = online[layer][:batch]
        grad_z = grad_z.astype(np.float32).astype(np.float64)
        gradient[start:start + n_out * n_in] = (rounded(grad_z).T @ rounded(inputs) if low[layer]
                                                else grad_z.T @ inputs).ravel()
        gradient[start + n_out * n_in:start + n_out * n_in + n_out] = grad_z.sum(0)
        if layer:
            grad_z = (rounded(grad_z) @ rounded(weight) if low[layer] else grad_z @ weight) * (inputs > 0)
    return float(np.mean(huber * w)), np.abs(td), gradient


def bf16_kernel(sizes, double, threads=1, seed=0):
    kernel = FusedQLearner(sizes, 1e-3, double, 1e9, threads=threads, precision="bf16")  # clipping never: grad is the gradient
    rng = np.random.default_rng(seed)
    kernel.online[:] = (rng.standard_normal(kernel.layout.size) * 0.2).astype(np.float32)
    kernel.target[:] = kernel.online + (rng.standard_normal(kernel.layout.size) * 0.02).astype(np.float32)
    return kernel


@pytest.mark.parametrize("double", [True, False], ids=["double", "vanilla"])
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
def test_bf16_step_equals_its_reference(double, weighted):
    """Over several steps (weights moving, the target copied once): loss, |TD| and gradient equal
    the reference's to float32 summation order; a layer missed, run in the wrong precision or on
    stale packed weights would be off by bfloat16's 2^-9 or more."""
    kernel = bf16_kernel(BF16_SIZES, double)
    assert list(bf16_layers(np.array(kernel.layout.shapes), 32)) == [0, 1, 1, 0]
    rng = np.random.default_rng(11)
    with cpu_kernel_mode():
        for step in range(6):
            batch = random_batch(rng, 32, BF16_SIZES[0], BF16_SIZES[-1], weighted)
            want_loss, want_td, want_gradient = bf16_reference_step(kernel, *batch)
            loss, td = kernel.update(*batch)
            assert abs(loss - want_loss) <= 1e-5 * abs(want_loss), step
            assert_close(td, want_td, what=f"|TD| at step {step}")
            assert_close(kernel.grad, want_gradient, what=f"gradient at step {step}")
            if step == 2:
                kernel.update_target(1.0)


def test_bf16_differs_from_float32_only_by_its_rounding():
    """The same step in float32 and in bf16: close (bfloat16's rounding through two layers), not equal."""
    rng = np.random.default_rng(2)
    batch = random_batch(rng, 32, BF16_SIZES[0], BF16_SIZES[-1], weighted=False)
    kernels = [bf16_kernel(BF16_SIZES, double=True) for _ in range(2)]
    kernels[0].precision = "fp32"
    for kernel in kernels:
        kernel.update(*batch)
    exact, low = (kernel.grad.astype(np.float64) for kernel in kernels)
    error = np.linalg.norm(low - exact) / np.linalg.norm(exact)
    assert 1e-4 < error < 0.05, error


@pytest.mark.parametrize("double", [True, False], ids=["double", "vanilla"])
def test_bf16_two_threads_match_one_thread_bit_for_bit(double):
    kernels = [bf16_kernel(PAIRED_SIZES, double, threads=threads, seed=4) for threads in (1, 2)]
    assert list(bf16_layers(np.array(kernels[0].layout.shapes), 128)) == [0, 1, 0]
    rng = np.random.default_rng(9)
    with cpu_kernel_mode():
        for step in range(8):
            batch = random_batch(rng, 128, PAIRED_SIZES[0], PAIRED_SIZES[-1], weighted=step % 2 == 1)
            (loss_1, td_1), (loss_2, td_2) = (kernel.update(*batch) for kernel in kernels)
            assert loss_1 == loss_2, step
            np.testing.assert_array_equal(td_1, td_2)
    for name in ("online", "exp_avg", "exp_avg_sq", "grad"):
        np.testing.assert_array_equal(getattr(kernels[0], name), getattr(kernels[1], name), err_msg=name)


def test_bf16_target_packs_follow_the_target_and_checkpoints():
    """The target's packed copy is refreshed after update_target and load_state_dict: a kernel
    restored mid-run steps exactly as the one it was saved from."""
    kernel = bf16_kernel(BF16_SIZES, double=False)
    rng = np.random.default_rng(6)
    batches = [random_batch(rng, 32, BF16_SIZES[0], BF16_SIZES[-1], weighted=False) for _ in range(6)]
    for batch in batches[:3]:
        kernel.update(*batch)
    kernel.update_target(0.5)
    restored = bf16_kernel(BF16_SIZES, double=False, seed=99)
    restored.update(*batches[0])  # packs made for other weights, to be replaced by the load
    restored.load_state_dict(kernel.state_dict())
    for batch in batches[3:]:
        assert kernel.update(*batch)[0] == restored.update(*batch)[0]
    np.testing.assert_array_equal(kernel.online, restored.online)


def test_bf16_for_layers_the_tiles_do_not_take_is_float32():
    """An inner layer of 40 units (not a multiple of 16) or an odd batch runs in float32: bit for
    bit the float32 step."""
    for sizes, batch in (([4, 40, 40, 2], 32), ([4, 64, 64, 2], 30)):
        kernels = [FusedQLearner(sizes, 1e-3, True, 10.0, precision=precision) for precision in ("fp32", "bf16")]
        assert not bf16_layers(np.array(kernels[1].layout.shapes), batch).any()
        for kernel in kernels:
            kernel.online[:] = np.random.default_rng(1).standard_normal(kernel.layout.size).astype(np.float32) * 0.1
        data = random_batch(np.random.default_rng(0), batch, sizes[0], sizes[-1], weighted=False)
        assert kernels[0].update(*data)[0] == kernels[1].update(*data)[0]
        np.testing.assert_array_equal(kernels[0].online, kernels[1].online)
