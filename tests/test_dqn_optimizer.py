"""DQN's optimizer choice (dqn.optimizer: Adam or the DQN papers' centered RMSprop with momentum),
its gradient clip switched off (dqn.max_grad_norm null) and the epsilon decay begun at
learning_starts (dqn.exploration.decay_from): the update against a numpy reference of RMSprop, the
optimizer's state through a checkpoint, the learners and precisions that can run it, config errors."""
import copy
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import pearl
from pearl.algos.dqn import DQN
from pearl.config import DQNConfig, OptimizerConfig, parse_config
from pearl.errors import ConfigError
from pearl.estimator.workload import workload_of
from pearl.kernels.registry import backend
from pearl.runtime.learners import load_optimizer_state, optimizer_state

OBS, ACTIONS, B = 5, 3, 32
PAPERS_RMSPROP = OptimizerConfig(kind="rmsprop", alpha=0.95, eps=0.01, momentum=0.95, centered=True)


def batch(seed: int):
    rng = np.random.default_rng(seed)
    return (torch.from_numpy(rng.normal(size=(B, OBS)).astype(np.float32)),
            torch.from_numpy(rng.integers(0, ACTIONS, B)),
            torch.from_numpy(rng.normal(size=B).astype(np.float32)),
            torch.from_numpy(rng.normal(size=(B, OBS)).astype(np.float32)),
            torch.from_numpy(np.where(rng.random(B) < 0.1, 0.0, 0.99).astype(np.float32)))


def rmsprop_dqn(**options) -> DQN:
    config = DQNConfig(hidden=[16, 16], lr=1e-2, max_grad_norm=None, optimizer=PAPERS_RMSPROP, **options)
    return DQN(OBS, ACTIONS, config, total_steps=10_000, seed=1)


def test_rmsprop_update_matches_a_numpy_reference():
    algo = rmsprop_dqn()
    settings = algo.config.optimizer
    weights = [p.detach().numpy().astype(np.float64) for p in algo.online.parameters()]
    square_avg = [np.zeros_like(w) for w in weights]
    grad_avg = [np.zeros_like(w) for w in weights]
    momentum = [np.zeros_like(w) for w in weights]
    for step in range(4):
        tensors = batch(step)
        probe = copy.deepcopy(algo.online)  # the gradient at the current weights, taken beside
        loss, _ = algo.loss(*tensors, online=probe)
        loss.backward()
        for i, p in enumerate(probe.parameters()):
            g = p.grad.numpy().astype(np.float64)
            square_avg[i] = settings.alpha * square_avg[i] + (1 - settings.alpha) * g * g
            grad_avg[i] = settings.alpha * grad_avg[i] + (1 - settings.alpha) * g
            momentum[i] = settings.momentum * momentum[i] + g / (np.sqrt(square_avg[i] - grad_avg[i] ** 2) + settings.eps)
            weights[i] = weights[i] - algo.config.lr * momentum[i]
        algo.update(*tensors)
        for want, got in zip(weights, algo.online.parameters()):
            np.testing.assert_allclose(got.detach().numpy(), want, rtol=1e-4, atol=1e-6)


def test_no_clip_when_max_grad_norm_is_null(monkeypatch):
    clipped = []
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", lambda *args, **kw: clipped.append(args))
    rmsprop_dqn().update(*batch(0))
    assert clipped == []
    DQN(OBS, ACTIONS, DQNConfig(hidden=[16]), total_steps=100).update(*batch(0))
    assert len(clipped) == 1


@pytest.mark.parametrize("settings", [OptimizerConfig(), PAPERS_RMSPROP,
                                      OptimizerConfig(kind="rmsprop", momentum=0.0, centered=False)])
def test_optimizer_state_round_trip_continues_the_same_run(settings):
    config = DQNConfig(hidden=[16], lr=1e-2, optimizer=settings)
    ran, resumed = (DQN(OBS, ACTIONS, config, total_steps=100, seed=2) for _ in range(2))
    for step in range(3):
        ran.update(*batch(step))
    state = optimizer_state(ran.optimizer)
    assert state["steps"] == 3
    resumed.online.load_state_dict(ran.online.state_dict())
    load_optimizer_state(resumed.optimizer, state)
    for step in range(3, 6):
        ran.update(*batch(step))
        resumed.update(*batch(step))
    for a, b in zip(ran.online.parameters(), resumed.online.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_a_checkpoint_of_another_optimizer_is_refused():
    adam, rmsprop = DQN(OBS, ACTIONS, DQNConfig(hidden=[16]), 100), rmsprop_dqn()
    adam.update(*batch(0))
    with pytest.raises(ConfigError, match=r"^dqn\.optimizer: the checkpoint holds no square_avg state"):
        load_optimizer_state(rmsprop.optimizer, optimizer_state(adam.optimizer))


def test_epsilon_decays_from_learning_starts_when_asked():
    def epsilon_at(decay_from, step):
        config = parse_config({"dqn": {"learning_starts": 1000, "exploration": {
            "initial": 1.0, "final": 0.1, "fraction": 0.1, "decay_from": decay_from}}}).dqn
        return DQN(OBS, ACTIONS, config, total_steps=10_000).epsilon(step)

    assert epsilon_at("learning_starts", 999) == 1.0
    assert epsilon_at("learning_starts", 1000) == pytest.approx(1.0)
    assert epsilon_at("learning_starts", 1500) == pytest.approx(0.55)
    assert epsilon_at("learning_starts", 2000) == pytest.approx(0.1)
    assert epsilon_at("start", 1500) == pytest.approx(0.1)
    assert epsilon_at("start", 500) == 1.0


def test_rmsprop_learns_with_the_torch_kernel_in_float32_only():
    config = parse_config({"env": "CartPole-v1", "dqn": {"optimizer": {"kind": "rmsprop"}}})
    workload = workload_of(config, 4, 2)
    cpu = backend("cpu")
    assert cpu.learner_kernels(workload) == ("torch",)
    assert cpu.learner_precisions(workload, "torch") == ("fp32",)
    assert cpu.learner_kernels(workload_of(parse_config({"env": "CartPole-v1"}), 4, 2)) == ("fused", "torch")
    assert workload.key() != workload_of(parse_config({"env": "CartPole-v1"}), 4, 2).key()
    with pytest.raises(ConfigError, match=r"^runtime\.learner_kernel: cpu has no fused learner for dqn stepping rmsprop"):
        pearl.DQN(env="CartPole-v1", optimizer={"kind": "rmsprop"}, learner_kernel="fused")


def test_rmsprop_refuses_bf16_products():
    pytest.importorskip("minatar")
    with pytest.raises(ConfigError, match=r"^runtime\.learner_precision: bf16 learners step Adam; dqn\.optimizer\.kind "
                                          r"rmsprop learns in fp32"):
        pearl.DQN(env="MinAtar/Breakout-v1", conv=[[16, 3, 1]], hidden=[32], optimizer={"kind": "rmsprop"},
                  learner_precision="bf16")


@pytest.mark.parametrize("section, message", [
    ({"optimizer": {"kind": "adam", "momentum": 0.9}},
     r"^dqn\.optimizer\.momentum: an option of kind rmsprop; expected kind: rmsprop or no momentum with kind adam$"),
    ({"optimizer": {"kind": "sgd"}}, r"^dqn\.optimizer\.kind: expected one of"),
    ({"optimizer": {"kind": "rmsprop", "alpha": 1.5}}, r"^dqn\.optimizer\.alpha: expected a number in \[0\.0, 1\.0\]"),
    ({"optimizer": {"eps": 0}}, r"^dqn\.optimizer\.eps: expected a positive number"),
    ({"max_grad_norm": -1}, r"^dqn\.max_grad_norm: expected a positive number"),
    ({"exploration": {"decay_from": "end"}}, r"^dqn\.exploration\.decay_from: expected one of"),
])
def test_bad_optimizer_settings_name_the_field(section, message):
    with pytest.raises(ConfigError, match=message):
        parse_config({"dqn": section})


def test_minatar_v0_makes_without_gymnasiums_out_of_date_notice():
    pytest.importorskip("minatar")
    from pearl.envs import make_env

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make_env("MinAtar/Breakout-v1").close()  # registers MinAtar's ids
        env = make_env("MinAtar/Breakout-v0")
    assert env.action_space.n == 6  # the full action set, the MinAtar paper's
    env.close()
    assert not [w for w in caught if "out of date" in str(w.message)]


def test_sb3s_optimizer_class_and_kwargs_map_to_the_optimizer_section():
    agent = pearl.DQN("MlpPolicy", "CartPole-v1", policy_kwargs=dict(
        optimizer_class=torch.optim.RMSprop, optimizer_kwargs=dict(alpha=0.95, eps=0.01, momentum=0.95, centered=True)))
    assert agent.config.dqn.optimizer == PAPERS_RMSPROP
    assert isinstance(agent.parts.algo.optimizer, torch.optim.RMSprop)
    with pytest.raises(ConfigError, match=r"^policy_kwargs\.optimizer_kwargs: expected a dict of eps, alpha, momentum, "
                                          r"centered, got \{'weight_decay': 0\.1\}$"):
        pearl.DQN("MlpPolicy", "CartPole-v1", policy_kwargs=dict(optimizer_kwargs=dict(weight_decay=0.1)))
    with pytest.raises(ConfigError, match=r"^policy_kwargs\.optimizer_class: PEARL's DQN steps torch\.optim\.Adam or "
                                          r"torch\.optim\.RMSprop"):
        pearl.DQN("MlpPolicy", "CartPole-v1", policy_kwargs=dict(optimizer_class=torch.optim.SGD))


def test_the_shipped_minatar_config_trains_saves_and_resumes_with_rmsprop(tmp_path):
    pytest.importorskip("minatar")
    from pearl.config import load_config

    config = load_config(Path(pearl.__file__).resolve().parent.parent / "configs" / "minatar_breakout_dqn.yaml")
    agent = pearl.DQN(config=config, seed=2, total_steps=300, learning_starts=100, capacity=1000, batch_size=16)
    assert isinstance(agent.parts.algo.optimizer, torch.optim.RMSprop) and agent.parts.learner.kernel == "torch"
    assert agent.parts.algo.n_actions == 6  # v0: the full action set
    agent.train(200)
    assert agent.counters.updates == 100
    agent.save(tmp_path / "minatar.npz")
    restored = pearl.load(tmp_path / "minatar.npz")
    saved = optimizer_state(agent.parts.algo.optimizer)
    assert set(saved) == {"square_avg", "momentum_buffer", "grad_avg", "steps"} and saved["steps"] == 100
    for name, values in optimizer_state(restored.parts.algo.optimizer).items():
        np.testing.assert_array_equal(values, saved[name])
    restored.train(50)
    assert restored.counters.updates == 150


def test_adams_eps_reaches_every_adam_the_learners_run():
    agent = pearl.DQN("CartPole-v1", optimizer={"eps": 1e-5})
    assert agent.parts.learner.kernel == "fused" and agent.parts.learner.kernel_impl.adam_eps == 1e-5
    assert agent.parts.algo.optimizer.param_groups[0]["eps"] == 1e-5
