"""The learner's product precision (runtime.learner_precision / a Plan's learner_precision): the
fused DDPG / TD3 learner with bfloat16 products against the float32 autograd reference, within
bfloat16's rounding; the float32 path stays exact (tests/test_continuous.py); config and plan errors."""
import numpy as np
import pytest
import torch

import pearl
from pearl.algos.ddpg import DDPG
from pearl.algos.td3 import TD3
from pearl.config import DDPGConfig, ExperimentConfig, TD3Config, apply_overrides, parse_config
from pearl.errors import ConfigError
from pearl.plan import Plan, reconcile
from pearl.replay import Batch
from pearl.runtime.continuous import ContinuousLearner
from pearl.runtime.fused_actor_critic import FusedActorCriticLearner, relu_, relu_backward

OBS, ACT, B = 3, 2, 64
# bfloat16 keeps 8 significant bits (unit roundoff 2^-9). The loss (float32 output layers) stays
# within ~1e-4 of float32's; a critic's hidden-layer gradient is a batch sum of terms of both signs
# (TD errors), so rounding its factors moves it by ~10% on this batch — as much as torch's own
# bfloat16 path (autocast on the autograd update) moves it. So the bound is relative to autocast's
# error at the same update (a missing or stale piece, such as a layer's gradient not widened or a
# weight copy not refreshed, moves the gradient by far more), plus a direction check.
BF16_LOSS_RTOL = 1e-3
VS_AUTOCAST = 1.3  # our bf16 gradient's error may be this much above autocast's,
BF16_GRADIENT_RTOL = 0.03  # or up to this (a few roundings of 2^-9 through three layers)
MIN_COSINE = 0.98


def batch(seed: int) -> Batch:
    rng = np.random.default_rng(seed)
    arrays = (rng.normal(size=(B, OBS)).astype(np.float32), rng.uniform(-1, 1, size=(B, ACT)).astype(np.float32),
              rng.normal(size=B).astype(np.float32) * 3, rng.normal(size=(B, OBS)).astype(np.float32),
              np.where(rng.random(B) < 0.1, 0.0, 0.99).astype(np.float32))
    return Batch(*arrays, indices=np.arange(B))


def gradients(algo, learner) -> dict[str, np.ndarray]:
    """The last update's actor and critic gradients as flat float32 vectors in parameter order."""
    if isinstance(learner, FusedActorCriticLearner):
        return {name: learner.grads[name].numpy().copy() for name in ("actor", "critic")}
    return {name: torch.cat([p.grad.reshape(-1) for p in getattr(algo, name).parameters()]).numpy().copy()
            for name in ("actor", "critic")}


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


class AutocastLearner(ContinuousLearner):
    """torch's own bfloat16 path: the autograd update under torch.autocast (the yardstick)."""

    def update(self, batch):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return super().update(batch)


CASES = [(DDPG, DDPGConfig(hidden=[64, 48], lr=1e-5)),
         (TD3, TD3Config(hidden=[64, 48], lr=1e-5, policy_delay=1))]


@pytest.mark.parametrize("algo_class,config", CASES)
def test_bf16_update_follows_the_float32_reference(algo_class, config):
    """Each update's loss and gradients (the critic's from the update's start, the actor's through
    the just-stepped critic) against the autograd float32 update from the same weights; a small
    lr keeps the runs' weights together over the updates, so each update is compared alone."""
    algos = {name: algo_class(OBS, ACT, config, seed=3) for name in ("ref", "autocast", "fp32", "bf16")}
    learners = {"ref": ContinuousLearner(algos["ref"], "cpu"), "autocast": AutocastLearner(algos["autocast"], "cpu"),
                "fp32": FusedActorCriticLearner(algos["fp32"]), "bf16": FusedActorCriticLearner(algos["bf16"], "bf16")}
    bf16, fp32 = learners["bf16"], learners["fp32"]
    assert bf16.nets["critic"].low_flat.dtype == torch.bfloat16 and fp32.nets["critic"].low_flat is fp32.nets["critic"].flat
    for step in range(4):
        losses, grads = {}, {}
        for name, learner in learners.items():
            torch.manual_seed(step)  # TD3's smoothing noise alike
            losses[name], _ = learner.update(batch(step))
            grads[name] = gradients(algos[name], learner)
        assert losses["fp32"] == pytest.approx(losses["ref"], rel=1e-5)
        assert losses["bf16"] == pytest.approx(losses["ref"], rel=BF16_LOSS_RTOL)
        for net in ("actor", "critic"):
            ref = grads["ref"][net]
            assert relative_error(grads["fp32"][net], ref) < 1e-4
            error, yardstick = relative_error(grads["bf16"][net], ref), relative_error(grads["autocast"][net], ref)
            assert 1e-5 < error < max(VS_AUTOCAST * yardstick, BF16_GRADIENT_RTOL), (step, net, error, yardstick)
            cosine = grads["bf16"][net] @ ref / (np.linalg.norm(grads["bf16"][net]) * np.linalg.norm(ref))
            assert cosine > MIN_COSINE, (step, net, cosine)
    # the bf16 copies the products read are the master weights rounded
    for net in bf16.nets.values():
        assert_low_copies_are_the_master_rounded(net)


def assert_low_copies_are_the_master_rounded(net):
    """Every bf16 layer the products read (FlatMLPs.stacked) is its float32 master rounded, and the
    copy holds nothing else."""
    low = [w for w, _ in net.stacked if w.dtype == torch.bfloat16]
    assert low
    assert sum(low.numel() for low, _ in net.pairs) == net.low_flat.numel()
    for low, master in net.pairs:
        np.testing.assert_array_equal(low.float().numpy(), master.to(torch.bfloat16).float().numpy())


def test_bf16_relu_on_the_bits_equals_torchs():
    """ReLU and its derivative on bfloat16's int16 bits (relu_, relu_backward) against torch's own
    bfloat16 ops, over signed zeros, subnormals, the largest finite values and random values."""
    special = torch.tensor([0.0, -0.0, 1e-40, -1e-40, 3e38, -3e38, 1.0, -1.0], dtype=torch.bfloat16)
    x = torch.cat([special, torch.randn(4096).bfloat16() * 10])
    want = torch.relu(x)
    got = relu_(x.clone())
    assert torch.equal(got, want) and not (got.view(torch.int16) < 0).any()  # no -0.0 left
    g = torch.randn(x.shape).bfloat16()
    want = torch.ops.aten.threshold_backward(g, want, 0.0)
    assert torch.equal(relu_backward(g.clone(), got), want)


def test_bf16_layers_precision():
    """The first and output layers multiply in float32, the inner ones in bfloat16 (FlatMLPs)."""
    learner = FusedActorCriticLearner(DDPG(OBS, ACT, DDPGConfig(hidden=[16, 16, 8]), seed=0), "bf16")
    for net in (learner.nets["critic"], learner.grad_nets["actor"]):
        for layers in (net.single, net.stacked):
            assert [w.dtype for w, _ in layers] == [torch.float32, torch.bfloat16, torch.bfloat16, torch.float32]


def test_bf16_learner_trains_and_reloads(tmp_path):
    agent = pearl.TD3("Pendulum-v1", total_steps=2000, learning_starts=100, hidden=[32, 32], batch_size=32,
                      learner_precision="bf16")
    assert agent.learner.kernel == "fused" and agent.learner.precision == "bf16"
    agent.train(300)
    assert agent.updates == 200
    agent.save(tmp_path / "bf16.npz")
    restored = pearl.load(tmp_path / "bf16.npz")
    assert restored.learner.precision == "bf16"
    np.testing.assert_array_equal(restored.learner.policy_weights(), agent.learner.policy_weights())
    for net in restored.learner.nets.values():  # the loaded weights reached the bf16 copies
        assert_low_copies_are_the_master_rounded(net)
    restored.train(50)


def test_bf16_dqn_fused_learner_trains_and_reloads(tmp_path):
    agent = pearl.DQN("CartPole-v1", total_steps=2000, learning_starts=64, hidden=[64, 64], batch_size=32,
                      learner_precision="bf16")
    assert agent.learner.kernel == "fused" and agent.learner.precision == "bf16"
    agent.train(300)
    assert agent.updates == (300 - 64) // 4
    agent.save(tmp_path / "bf16.npz")
    restored = pearl.load(tmp_path / "bf16.npz")
    assert restored.learner.precision == restored.plan.learner_precision == "bf16"
    np.testing.assert_array_equal(restored.learner.policy_weights(), agent.learner.policy_weights())
    restored.train(50)


def test_precision_errors():
    with pytest.raises(ConfigError, match=r"^runtime.learner_precision: expected one of 'fp32', 'bf16'"):
        parse_config({"algo": "ddpg", "env": "Pendulum-v1", "runtime": {"learner_precision": "fp16"}})
    with pytest.raises(ConfigError, match=r"^runtime.learner_precision: bf16 products run in the fused cpu learner; "
                                          r"this run's learner is torch"):
        pearl.DDPG("Pendulum-v1", learner_precision="bf16", learner_kernel="torch", hidden=[8])
    config = apply_overrides(ExperimentConfig(algo="td3", env="Pendulum-v1"), {"runtime.learner_precision": "fp32"})
    _, plan = reconcile(config, Plan(learner_precision="bf16"))
    assert plan.learner_precision == "bf16"
    bf16 = apply_overrides(config, {"runtime.learner_precision": "bf16"})
    config, plan = reconcile(bf16, Plan())
    assert plan.learner_precision == config.runtime.learner_precision == "bf16"
    with pytest.raises(ConfigError, match=r"^plan.learner_precision: fp32, but the config's "
                                          r"runtime.learner_precision is bf16"):
        reconcile(bf16, Plan(learner_precision="fp32"))
    # "auto" chooses nothing: a saved plan's resolved precision stands beside its config's auto,
    # and a plan's auto takes the config's value (or stays auto beside the default)
    default = ExperimentConfig(algo="td3", env="Pendulum-v1")
    auto = apply_overrides(default, {"runtime.learner_precision": "auto"})
    for configured, planned, want in ((auto, "bf16", "bf16"), (auto, "fp32", "fp32"), (bf16, "auto", "bf16"),
                                      (default, "auto", "auto")):
        assert reconcile(configured, Plan(learner_precision=planned))[1].learner_precision == want


@pytest.mark.slow
def test_bf16_td3_learns_pendulum():
    """The slow-test setup of tests/test_continuous_learning.py with bf16 products."""
    from pearl.config import default_config_path, load_config

    config = load_config(default_config_path().parent / "pendulum_td3.yaml")
    agent = pearl.TD3(config=config, hidden=[64, 64], total_steps=15_000, learner_precision="bf16")
    agent.train()
    returns = agent.evaluate(30)["returns"]
    assert sum(returns) / len(returns) > -200, returns
