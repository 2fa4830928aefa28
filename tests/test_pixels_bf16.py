"""DQN's torch learner with bfloat16 CNN products (runtime.learner_precision: bf16, issue 16): the
update against the float32 update from the same weights (loss and gradients within bfloat16's
rounding, measured against torch's own autocast path as in tests/test_learner_precision.py), the
bfloat16 copies following the float32 masters, learning, checkpoints, and the one-line refusal for
an MLP Q-network."""
from __future__ import annotations

import copy
import dataclasses
import platform
import threading

import numpy as np
import pytest
import torch

import pearl
from pearl.algos.dqn import DQN
from pearl.config import DQNConfig
from pearl.errors import ConfigError
from pearl.nets import BF16Copy, ConvReLU
from pearl.replay import Batch
from pearl.runtime.learners import TorchLearner

NETS = {"nature": ((4, 84, 84), [[32, 8, 4], [64, 4, 2], [64, 3, 1]], [512], 1 / 255, 256),
        "minatar": ((4, 10, 10), [[16, 3, 1]], [128], 1.0, 2)}
B = 32
LOSS_RTOL = 1e-3  # measured ~3e-5: float32 outputs and loss, the rounding averages over the batch
VS_AUTOCAST = 1.5  # our gradient's error may be this much above autocast's at the same update,
GRADIENT_RTOL = 0.05  # or up to this
MIN_COSINE = 0.98
MINATAR = dict(conv=[[16, 3, 1]], hidden=[32], batch_size=8, learning_starts=64, capacity=500,
               target_update_interval=50, updates_per_step=0.25)


def frames(net: str, seed: int) -> Batch:
    shape, _, _, _, high = NETS[net]
    rng = np.random.default_rng(seed)
    return Batch(rng.integers(0, high, (B, *shape), dtype=np.uint8), rng.integers(0, 4, B),
                 rng.normal(size=B).astype(np.float32), rng.integers(0, high, (B, *shape), dtype=np.uint8),
                 np.where(rng.random(B) < 0.1, 0.0, 0.99).astype(np.float32), indices=np.arange(B))


def algorithm(net: str, lr: float = 1e-5) -> DQN:
    shape, conv, hidden, scale, _ = NETS[net]
    return DQN(int(np.prod(shape)), 4, DQNConfig(hidden=hidden, conv=conv, lr=lr), 1000, seed=5,
               obs_shape=shape, obs_scale=scale)


class AutocastLearner(TorchLearner):
    """torch's own bfloat16 path: the float32 update under torch.autocast (the yardstick)."""

    def update(self, batch):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return super().update(batch)


def gradient(learner) -> np.ndarray:
    """The master gradient of the last update: the parameters' .grad, or for the bf16 learner (whose
    compiled Adam step reads the copy's gradient, kernels/cpu/bf16_adam.py) the copy's gradient in
    float32 times the folded input scale, as `record_gradient` saw it."""
    if learner.precision == "bf16":
        return learner.seen_gradient
    return torch.cat([p.grad.reshape(-1) for p in learner.algo.online.parameters()]).numpy().copy()


def record_gradient(learner) -> None:
    low = learner._low["online"]
    step = low.adam_step

    def adam_step(optimizer, max_norm):
        learner.seen_gradient = torch.cat([(p.grad.float() * (low._scale if p is low._first[0] else 1.0)).reshape(-1)
                                           for p in low.net.parameters()]).numpy()
        step(optimizer, max_norm)
    low.adam_step = adam_step


def relative_error(got, want) -> float:
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def assert_copies_are_the_masters_rounded(learner) -> None:
    """Each copy's weight is its master's rounded to bfloat16, the first convolution's after the
    multiplication by the input scale (folded there: the copy reads the frames' integer values)."""
    for name, low in learner._low.items():
        master_net = learner.algo.networks()[name]
        first = master_net.encoder.convs[0].weight
        for copy, master in zip(low.net.parameters(), master_net.parameters()):
            assert copy.dtype == torch.bfloat16
            want = master * master_net.encoder.obs_scale if master is first else master
            np.testing.assert_array_equal(copy.detach().float().numpy(), want.detach().to(torch.bfloat16).float().numpy())


@pytest.mark.parametrize("net", NETS)
def test_bf16_update_follows_the_float32_update(net):
    """Each update's loss and master gradient against the float32 update from the same weights (a
    small lr keeps the runs together, so each update is compared alone); a target update between."""
    algos = {name: algorithm(net) for name in ("fp32", "autocast", "bf16")}
    learners = {"fp32": TorchLearner(algos["fp32"], "cpu"), "autocast": AutocastLearner(algos["autocast"], "cpu"),
                "bf16": TorchLearner(algos["bf16"], "cpu", "bf16")}
    bf16 = learners["bf16"]
    record_gradient(bf16)
    for step in range(4):
        losses, grads, tds = {}, {}, {}
        for name, learner in learners.items():
            losses[name], tds[name] = learner.update(frames(net, step))
            grads[name] = gradient(learner)
        assert tds["bf16"].dtype == np.float32
        assert losses["bf16"] == pytest.approx(losses["fp32"], rel=LOSS_RTOL)
        error, yardstick = relative_error(grads["bf16"], grads["fp32"]), relative_error(grads["autocast"], grads["fp32"])
        assert 1e-5 < error < max(VS_AUTOCAST * yardstick, GRADIENT_RTOL), (step, error, yardstick)
        cosine = grads["bf16"] @ grads["fp32"] / (np.linalg.norm(grads["bf16"]) * np.linalg.norm(grads["fp32"]))
        assert cosine > MIN_COSINE, (step, cosine)
        assert_copies_are_the_masters_rounded(bf16)  # the step reached the copy the next forward reads
        if step == 1:
            for learner in learners.values():
                learner.update_target()
            assert_copies_are_the_masters_rounded(bf16)
    assert all(p.dtype == torch.float32 for p in algos["bf16"].online.parameters())
    assert all(int(state["step"]) == 4 for state in bf16.algo.optimizer.state.values())


@pytest.mark.parametrize("net", NETS)
def test_fused_conv_relu_equals_the_separate_layers(net):
    """The copy's convolutions with their ReLU (pearl.nets.ConvReLU: one fused oneDNN call without
    autograd): the Q-values (with and without autograd) and every gradient of the loss are bit for bit
    those of nn.Conv2d then nn.ReLU on the same bfloat16 weights."""
    algo = algorithm(net)
    fused = BF16Copy(algo.online)
    separate = copy.deepcopy(fused)
    separate.net.encoder.convs = torch.nn.Sequential(*(m for layer in fused.net.encoder.convs
                                                        for m in (copy.deepcopy(layer.conv), torch.nn.ReLU())))
    assert all(isinstance(layer, ConvReLU) for layer in fused.net.encoder.convs)
    batch = frames(net, 0)
    obs, actions = torch.from_numpy(batch.obs), torch.from_numpy(batch.actions)
    with torch.no_grad():
        np.testing.assert_array_equal(fused(obs).numpy(), separate(obs).numpy())
    for low in (fused, separate):
        q = low(obs)
        (q.gather(1, actions.long().unsqueeze(1)).square().mean() + q.mean()).backward()
    for got, want in zip(fused.net.parameters(), separate.net.parameters(), strict=True):
        assert got.grad is not None
        np.testing.assert_array_equal(got.grad.float().numpy(), want.grad.float().numpy())


SPLIT_LEARNERS: list[TorchLearner] = []


@pytest.fixture(autouse=True)
def release_split_learners():
    """A test's split learners give their worker thread back at its end: a thread left alive would
    make a later processes-runtime test start its actors by exec, not fork."""
    yield
    while SPLIT_LEARNERS:
        SPLIT_LEARNERS.pop().release()


def split_and_whole(precision: str, double: bool = False, threads: int = 2) -> list[TorchLearner]:
    """Two learners from the same weights: the whole batch's update and the split batch's (a small
    lr keeps the two runs' weights together, so each update's gradients are compared alone)."""
    learners = []
    for split in (False, True):
        algo = algorithm("minatar")
        algo.config = dataclasses.replace(algo.config, double=double)
        learners.append(TorchLearner(algo, "cpu", precision, split_batch=split, threads=threads))
    SPLIT_LEARNERS.extend(learners)
    return learners


# the split update against the whole batch's: each half's sums summed once more (float32), and in
# bf16 the two halves' bfloat16 gradients summed in bfloat16 (one more rounding, ~2^-9 relative);
# measured: gradients ~1e-7 (fp32) and ~3e-3 (bf16) apart
SPLIT_RTOL = {"fp32": 1e-5, "bf16": 1e-2}
SPLIT_WEIGHTS_RTOL = {"fp32": 1e-4, "bf16": 0.1}


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("double", [False, True])
@pytest.mark.parametrize("weighted", [False, True])
def test_a_split_batch_update_is_the_whole_batchs_up_to_rounding(precision, double, weighted):
    """TorchLearner(split_batch=True) from the same weights as the whole batch's learner: each
    update's loss, gradient (each half's scaled by its share of the batch) and |TD| (in the batch's
    order) within rounding of the whole batch's, over updates with a target update between, with
    and without importance weights; the weights' difference a small part of their movement."""
    learners = split_and_whole(precision, double)
    if precision == "bf16":
        for learner in learners:
            record_gradient(learner)
    start = np.concatenate([p.detach().numpy().ravel() for p in learners[0].algo.online.parameters()])
    rtol = SPLIT_RTOL[precision]
    for step in range(4):
        batch = frames("minatar", step)
        if weighted:
            batch.weights = np.random.default_rng(step).uniform(0.2, 1.0, B).astype(np.float32)
        (loss, td), (split_loss, split_td) = (learner.update(batch) for learner in learners)
        assert split_loss == pytest.approx(loss, rel=rtol)
        assert relative_error(gradient(learners[1]), gradient(learners[0])) < rtol
        np.testing.assert_allclose(split_td, td, rtol=0, atol=rtol * np.abs(td).mean())
        if step == 1:
            for learner in learners:
                learner.update_target()
    assert learners[1]._pool is not None  # the second half did run on the worker
    split, whole = (np.concatenate([p.detach().numpy().ravel() for p in learner.algo.online.parameters()])
                    for learner in learners)
    assert np.linalg.norm(split - whole) < SPLIT_WEIGHTS_RTOL[precision] * np.linalg.norm(whole - start)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_split_batch_update_gives_the_same_bits_every_time(precision):
    """Two split learners from the same weights end with the same bits whichever half ends first
    (a run with plan.deterministic_lag repeats itself), an odd batch's halves of 16 and 17 rows
    included; a batch of one row runs whole."""
    learners = [split_and_whole(precision)[1] for _ in range(2)]
    for step in range(3):
        batch = frames("minatar", step)
        if step == 1:
            batch = Batch(*(np.concatenate([field, field[:1]]) for field in
                            (batch.obs, batch.actions, batch.rewards, batch.next_obs, batch.discounts)),
                          indices=np.arange(B + 1))
        results = [learner.update(batch) for learner in learners]
        assert results[0][0] == results[1][0] and results[0][1].shape == (batch.obs.shape[0],)
        np.testing.assert_array_equal(results[0][1], results[1][1])
    one = Batch(batch.obs[:1], batch.actions[:1], batch.rewards[:1], batch.next_obs[:1], batch.discounts[:1],
                indices=np.arange(1))
    for learner in learners:
        learner.update(one)
    for got, want in zip(learners[0].algo.online.parameters(), learners[1].algo.online.parameters(), strict=True):
        np.testing.assert_array_equal(got.detach().numpy(), want.detach().numpy())


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_each_half_runs_on_half_the_learners_threads(precision):
    """TorchLearner(split_batch=True, threads=t): each half's backward on t // 2 torch threads (at
    least one), on the caller's thread and on the worker; torch's count is put back after each
    update."""
    saved = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        for threads, per_half in ((2, 1), (4, 2)):
            learner = split_and_whole(precision, threads=threads)[1]
            network = learner.algo.online if precision == "fp32" else learner._low["online"].net
            seen = []
            next(network.parameters()).register_hook(
                lambda grad: seen.append((threading.current_thread().name.startswith("pearl-half"),
                                          torch.get_num_threads())))
            for step in range(2):
                learner.update(frames("minatar", step))
                assert torch.get_num_threads() == 3
            assert sorted(seen) == [(False, per_half)] * 2 + [(True, per_half)] * 2
    finally:
        torch.set_num_threads(saved)


def test_a_split_batch_update_from_a_failing_half_raises_after_both_halves_end():
    """An exception in either half reaches the caller, and only once the worker's half is done
    (it writes the gradients): the next update runs."""
    learner = split_and_whole("fp32")[1]
    batch = frames("minatar", 0)
    bad = Batch(batch.obs, batch.actions + 100, batch.rewards, batch.next_obs, batch.discounts, indices=batch.indices)
    with pytest.raises(RuntimeError):
        learner.update(bad)  # actions out of range in both halves' gather
    assert not learner._pool._work_queue.qsize()
    loss, td = learner.update(batch)
    assert np.isfinite(loss) and td.shape == (B,)


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="x86's MXCSR")
def test_the_second_half_takes_the_callers_float_mode():
    """The worker flushes denormals when the learner's thread does (pearl.kernels.cpu.cpu_kernel_mode
    sets it on the calling thread only): a denormal product there costs ~100x."""
    from pearl.kernels.cpu import cpu_kernel_mode
    from pearl.kernels.cpu.float_mode import thread_float_mode

    learner = split_and_whole("bf16")[1]
    learner.update(frames("minatar", 0))  # the worker is made here, outside the mode
    with cpu_kernel_mode():
        caller = thread_float_mode()
        learner.update(frames("minatar", 1))
        worker = learner._pool.submit(thread_float_mode).result()
    assert caller & 0x8040 == 0x8040 and worker == caller  # FTZ and DAZ, on the worker too


def test_bf16_learner_fits_a_fixed_batch_like_float32():
    """Learning: repeated updates on one batch (targets from a frozen target net) cut the loss as the
    float32 learner's do."""
    losses = {}
    for precision in ("fp32", "bf16"):
        learner = TorchLearner(algorithm("minatar", lr=1e-3), "cpu", precision)
        batch = frames("minatar", 0)
        losses[precision] = [learner.update(batch)[0] for _ in range(150)]
    for precision, curve in losses.items():
        assert curve[-1] < 0.05 * curve[0], (precision, curve[0], curve[-1])
    assert losses["bf16"][-1] < 3 * losses["fp32"][-1] + 1e-3


def test_a_loaded_bf16_learner_steps_on_bit_for_bit():
    """A learner that loads another's state mid-run (new moment tensors in the optimizer's state,
    which the compiled Adam step views) continues exactly as the one that saved it."""
    learners = [TorchLearner(algorithm("minatar", lr=1e-3), "cpu", "bf16") for _ in range(2)]
    for seed in range(3):
        learners[0].update(frames("minatar", seed))
    learners[1].update(frames("minatar", 9))  # its own moments, viewed by its step, before the load
    learners[1].load_state_dict(copy.deepcopy(learners[0].state_dict()))
    for seed in range(3, 6):
        losses = [learner.update(frames("minatar", seed))[0] for learner in learners]
        assert losses[0] == losses[1]
    saved = [learner.state_dict() for learner in learners]
    for name, value in saved[0].items():
        np.testing.assert_array_equal(saved[1][name], value, err_msg=name)


def test_minatar_trains_with_bf16_and_reloads(tmp_path):
    agent = pearl.DQN(env="MinAtar/Breakout-v1", seed=3, learner_precision="bf16", **MINATAR)
    assert agent.learner.kernel == "torch" and agent.learner.precision == "bf16"
    agent.train(300)
    assert agent.counters.updates == (300 - 64) // 4
    assert_copies_are_the_masters_rounded(agent.learner)
    agent.save(tmp_path / "bf16.npz")
    restored = pearl.load(tmp_path / "bf16.npz")
    assert restored.learner.precision == "bf16"
    np.testing.assert_array_equal(restored.learner.policy_weights(), agent.learner.policy_weights())
    assert_copies_are_the_masters_rounded(restored.learner)  # the loaded weights reached the copies
    restored.train(50)


def test_bf16_for_an_mlp_q_network_in_the_torch_learner_is_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"^runtime.learner_precision: bf16 products run in DQN's fused learner, "
                                          r"or in its torch learner for a CNN Q-network; CartPole-v1's observations "
                                          r"are flat \(expected runtime.learner_kernel fused or auto"):
        pearl.DQN("CartPole-v1", learner_precision="bf16", learner_kernel="torch", hidden=[8])


@pytest.mark.parametrize("flags, want", [({"avx512f", "amx_bf16", "amx_tile"}, "bf16"), ({"avx512f"}, "fp32")])
def test_auto_precision_is_bf16_where_the_cpu_has_bfloat16_units(monkeypatch, flags, want):
    """learner_precision auto (configs/breakout_dqn.yaml's): bf16 for a CNN Q-network on a cpu with
    bfloat16 units, float32 without them; for an MLP Q-network the fused learner's bf16 where it has
    an inner hidden layer to run in it, float32 where it has none (no refusal)."""
    from pearl.kernels.cpu import backend as cpu_backend

    monkeypatch.setattr(cpu_backend, "cpu_flags", lambda: frozenset(flags))
    agent = pearl.DQN(env="MinAtar/Breakout-v1", seed=3, learner_precision="auto", **MINATAR)
    assert agent.learner.precision == want and agent.plan.learner_precision == want
    assert pearl.DQN("CartPole-v1", learner_precision="auto", hidden=[8]).plan.learner_precision == "fp32"
    mlp = pearl.DQN("CartPole-v1", learner_precision="auto", hidden=[64, 64])
    assert mlp.learner.kernel == "fused" and mlp.plan.learner_precision == want
    assert mlp.learner.kernel_impl.precision == want


def test_a_run_of_auto_precision_loads_and_resumes(monkeypatch, tmp_path):
    """The run's saved plan holds the precision auto resolved to (bf16 here) and its config auto:
    pearl.load and pearl.resume take that pair (they were refused as a conflict)."""
    from pearl.kernels.cpu import backend as cpu_backend

    monkeypatch.setattr(cpu_backend, "cpu_flags", lambda: frozenset({"avx512f", "amx_bf16", "amx_tile"}))
    agent = pearl.DQN(env="MinAtar/Breakout-v1", seed=3, learner_precision="auto", total_steps=300, **MINATAR)
    agent.train(150, run_dir=tmp_path)
    assert agent.plan.learner_precision == "bf16" and agent.config.runtime.learner_precision == "auto"
    assert pearl.load(tmp_path).learner.precision == "bf16"
    resumed, _ = pearl.resume(tmp_path)
    assert resumed.env_steps == 300 and resumed.learner.precision == "bf16"


def test_the_estimator_offers_and_prices_the_bf16_cnn_learner(monkeypatch):
    """On a cpu with bfloat16 units the mapper offers DQN's torch CNN learner in bf16 (an MLP
    Q-network's bf16 is its fused learner's), and its analytic learn divides the FLOP time by the
    measured CNN speedup."""
    from pearl.config import parse_config
    from pearl.estimator.costs import LEARN_SPEEDUP, Costs
    from pearl.estimator.mapper import candidates
    from pearl.estimator.model import Candidate
    from pearl.estimator.workload import Workload, workload_from_config
    from pearl.kernels.cpu import backend as cpu_backend
    from pearl.platforms import load_platform

    monkeypatch.setattr(cpu_backend, "cpu_flags", lambda: frozenset({"avx512f", "amx_bf16", "amx_tile"}))
    platform = load_platform("ci_2core")
    workload = workload_from_config(parse_config({"env": "MinAtar/Breakout-v1",
                                                  "dqn": {"conv": [[16, 3, 1]], "hidden": [128]}}))
    cands, _ = candidates(platform, workload, envs=(1,), batches=(32,))
    assert {(c.learner_kernel, c.precision) for c in cands} == {("torch", "fp32"), ("torch", "bf16")}
    assert next(c for c in cands if c.precision == "bf16").to_plan().learner_precision == "bf16"
    mlp, _ = candidates(platform, Workload("CartPole-v1", 4, 2, (64, 64), "uniform", 1000, 16, 0.25, 100),
                        envs=(1,), batches=(64,))
    assert {(c.learner_kernel, c.precision) for c in mlp} == {("fused", "fp32"), ("fused", "bf16"), ("torch", "fp32")}
    # the Nature CNN's update is FLOP-bound (MinAtar's is bytes- and call-bound)
    costs = Costs(platform, workload_from_config(parse_config({"env": "BreakoutNoFrameskip-v4",
                                                               "dqn": {"hidden": [512]}})))
    fp32, bf16 = (Candidate("uniform", "cpu", "cpu", "torch", 1, 32, precision=p) for p in ("fp32", "bf16"))
    overhead = platform.device("cpu").call_overhead_us * 1e-6
    fixed = {c.precision: cpu_backend.CPUBackend().calls("learn", k, "dqn") * overhead
             for c, k in ((fp32, "torch"), (bf16, "torch/bf16"))}
    learn = {c.precision: costs.task_seconds("learn", c) for c in (fp32, bf16)}
    assert learn["fp32"][1] == learn["bf16"][1] == "analytic" and fixed["bf16"] > fixed["fp32"]
    assert (learn["fp32"][0] - fixed["fp32"]) / (learn["bf16"][0] - fixed["bf16"]) == pytest.approx(
        LEARN_SPEEDUP["torch/bf16"])


def test_bf16_off_the_cpu_is_refused_in_one_line():
    """Its Adam step is a compiled cpu kernel (kernels/cpu/bf16_adam.py)."""
    from pearl.build import Discrete
    from pearl.config import parse_config

    config = parse_config({"env": "MinAtar/Breakout-v1", "dqn": {"conv": [[16, 3, 1]], "hidden": [32]}})
    family = Discrete(config)
    family.check_precision("bf16", "torch", "cpu", config)
    with pytest.raises(ConfigError, match=r"^runtime.learner_precision: bf16 runs on a cpu learn device; got cuda:0"):
        family.check_precision("bf16", "torch", "cuda:0", config)


def test_conv_relu_takes_torchs_convolution_where_onednn_refuses_bfloat16(monkeypatch):
    """On a CPU whose oneDNN raises on a bfloat16 convolution with a post-op (an AMD Zen 3: no
    AVX-512), ConvReLU's no-grad forward runs torch's convolution and ReLU instead: the same values."""
    import pearl.nets as nets

    def refused(*args):
        raise RuntimeError("mkldnn_convolution: bf16 path needs the cpu support avx512bw, avx512vl and avx512dq")

    monkeypatch.setattr(nets, "_fused_bf16_conv", lambda: False)
    monkeypatch.setattr(torch.ops.mkldnn, "_convolution_pointwise", refused)
    layer = ConvReLU(torch.nn.Conv2d(4, 8, 3, stride=2).to(torch.bfloat16))
    x = torch.from_numpy(frames("minatar", 1).obs).to(torch.bfloat16)
    with torch.no_grad():
        np.testing.assert_array_equal(layer(x).float().numpy(), torch.relu(layer.conv(x)).float().numpy())


@pytest.mark.parametrize("flags, warns", [({"avx2"}, True), ({"avx512f", "avx512_bf16"}, False)])
def test_bf16_asked_for_on_a_cpu_without_bfloat16_units_warns_in_one_line(monkeypatch, recwarn, flags, warns):
    from pearl.kernels.cpu import backend as cpu_backend

    monkeypatch.setattr(cpu_backend, "cpu_flags", lambda: frozenset(flags))
    agent = pearl.DQN(env="MinAtar/Breakout-v1", seed=3, learner_precision="bf16", **MINATAR)
    assert agent.plan.learner_precision == "bf16"  # as asked: a warning, not a refusal
    said = [str(w.message) for w in recwarn if "learner_precision" in str(w.message)]
    assert said == (["runtime.learner_precision: bf16 on a CPU without bfloat16 units (AMX or AVX-512 BF16) runs "
                     "emulated, slower than fp32 (auto picks fp32 here)"] if warns else [])
