"""The workload (estimator/workload.py) and the algorithms' cost spec it delegates to: analytic costs
of DQN, DDPG, TD3 and SAC against FLOPs counted by hand and by torch's FLOP counter, and the plans
the mapper generates for the continuous algorithms."""
from __future__ import annotations

import pytest

from pearl.config import default_config_path, load_config
from pearl.errors import ConfigError
from pearl.estimator.costs import Costs
from pearl.estimator.mapper import candidates, rank
from pearl.estimator.workload import Workload, workload_from_config
from pearl.platforms import load_platform

B = 32  # batch


def pendulum(algo: str, **options) -> Workload:
    """Pendulum's sizes (3 observations, 1 action) with a 64x64 actor and critic(s)."""
    return Workload("Pendulum-v1", 3, 1, (64, 64), "uniform", 10_000, 16, 1.0, 500, double=False, algo=algo,
                    **options)


# Counted by hand: a forward of widths s is, per row, sum(2 in x out) + sum(2 out) (bias, activation).
ACTOR_ROW = 2 * (3 * 64 + 64 * 64 + 64 * 1) + 2 * (64 + 64 + 1)  # 3-64-64-1: 8962
SAC_ACTOR_ROW = 2 * (3 * 64 + 64 * 64 + 64 * 2) + 2 * (64 + 64 + 2)  # 3-64-64-2 (mean, log std): 9092
CRITIC_ROW = 2 * (4 * 64 + 64 * 64 + 64 * 1) + 2 * (64 + 64 + 1)  # [s, a] 4-64-64-1: 9090
ACTOR_PARAMS = 3 * 64 + 64 + 64 * 64 + 64 + 64 + 1  # 4481
SAC_ACTOR_PARAMS = 3 * 64 + 64 + 64 * 64 + 64 + 64 * 2 + 2  # 4546
CRITIC_PARAMS = 4 * 64 + 64 + 64 * 64 + 64 + 64 + 1  # 4545
ADAM, LERP = 10, 3  # FLOPs per parameter
# the actor's loss back through the frozen critic: input gradients only, one product per layer;
# the fused kernel's first layer only for the action's column, autograd's for all four inputs
INTO_CRITIC_FUSED = 2 * (1 * 64 + 64 * 64 + 64 * 1)
INTO_CRITIC_TORCH = 2 * (4 * 64 + 64 * 64 + 64 * 1)


def test_ddpg_update_flops_per_kernel():
    critic_step = B * (ACTOR_ROW + 2 * CRITIC_ROW + 2 * CRITIC_ROW) + ADAM * CRITIC_PARAMS
    actor_step = (B * (ACTOR_ROW + CRITIC_ROW + 2 * ACTOR_ROW) + ADAM * ACTOR_PARAMS
                  + LERP * (CRITIC_PARAMS + ACTOR_PARAMS))
    w = pendulum("ddpg")
    assert w.learn_cost(B, "fused").flops == pytest.approx(critic_step + actor_step + B * INTO_CRITIC_FUSED)
    assert w.learn_cost(B, "torch").flops == pytest.approx(critic_step + actor_step + B * INTO_CRITIC_TORCH)


def test_td3_update_flops_count_twin_critics_and_the_delayed_actor():
    critic_step = B * (ACTOR_ROW + 4 * CRITIC_ROW + 2 * 2 * CRITIC_ROW) + ADAM * 2 * CRITIC_PARAMS
    actor_step = (B * (ACTOR_ROW + CRITIC_ROW + INTO_CRITIC_FUSED + 2 * ACTOR_ROW) + ADAM * ACTOR_PARAMS
                  + LERP * (2 * CRITIC_PARAMS + ACTOR_PARAMS))
    assert pendulum("td3", policy_delay=2).learn_cost(B, "fused").flops == pytest.approx(critic_step + actor_step / 2)
    assert pendulum("td3", policy_delay=1).learn_cost(B, "fused").flops == pytest.approx(critic_step + actor_step)


def test_sac_update_flops_through_both_critics_with_critic_targets_only():
    critic_step = B * (SAC_ACTOR_ROW + 4 * CRITIC_ROW + 2 * 2 * CRITIC_ROW) + ADAM * 2 * CRITIC_PARAMS
    actor_step = (B * (SAC_ACTOR_ROW + 2 * (CRITIC_ROW + INTO_CRITIC_TORCH) + 2 * SAC_ACTOR_ROW)
                  + ADAM * SAC_ACTOR_PARAMS)
    w = pendulum("sac")
    assert w.learn_cost(B, "torch").flops == pytest.approx(critic_step + actor_step + LERP * 2 * CRITIC_PARAMS)
    assert w.sizes == [3, 64, 64, 2] and w.n_params == SAC_ACTOR_PARAMS  # sync_weights ships the policy


def test_act_transitions_and_keys_of_continuous_workloads():
    # act: the policy MLP per observation plus its head (DDPG: tanh, noise, clip; SAC: exp, scale, add, tanh)
    assert pendulum("ddpg").act_cost(4).flops == 4 * ACTOR_ROW + 4 * 3
    assert pendulum("sac").act_cost(4).flops == 4 * SAC_ACTOR_ROW + 4 * 5
    # a transition: obs, next obs, the float32 action vector, reward, discount
    assert pendulum("td3").transition_bytes == (3 + 3 + 1 + 2) * 4
    keys = {pendulum(a).key() for a in ("ddpg", "td3", "sac")}
    assert len(keys) == 3 and all(k.split("|")[0] in ("ddpg", "td3", "sac") for k in keys)
    dqn = Workload("CartPole-v1", 4, 2, (64, 64), "prioritized", 100_000, 16, 0.25, 1000)
    assert dqn.key() == "CartPole-v1|obs4|act2|h64x64|f32|cap100000|k16|u0.25|n1|b64|prioritized|auto|double"
    assert dqn.transition_bytes == (2 * 4 + 3) * 4


def test_workload_from_the_shipped_td3_config():
    w = workload_from_config(load_config(default_config_path().with_name("pendulum_td3.yaml")))
    assert (w.algo, w.obs_dim, w.n_actions, w.policy_delay, w.sizes) == ("td3", 3, 1, 2, [3, 400, 300, 1])
    assert w.learner_kernels == ("fused", "torch") and w.replay_kinds == ("uniform",)
    # the fused kernel's own docs put a DDPG update at 400x300, batch 256 at ~620 MFLOP
    ddpg = workload_from_config(load_config(default_config_path().with_name("pendulum_ddpg.yaml")))
    assert 600e6 < ddpg.learn_cost(256, "fused").flops < 650e6


def test_mapper_plans_for_continuous_algorithms_are_ones_the_agent_builds():
    """A uniform replay on the cpu only (even where a GPU could hold it), the fused learner for DDPG,
    TD3 and SAC on the cpu, the torch learner on the cpu or a GPU."""
    platform = load_platform("workstation_a100")
    sac, _ = candidates(platform, pendulum("sac"), envs=(1,))
    td3, _ = candidates(platform, pendulum("td3"), envs=(1,))
    for cands in (sac, td3):
        assert {(c.replay_kind, c.replay_device) for c in cands} == {("uniform", "cpu")}
    for cands in (sac, td3):
        assert {(c.learn_device, c.learner_kernel) for c in cands} == {("cpu", "fused"), ("cpu", "torch"),
                                                                      ("cuda:0", "torch")}
    with pytest.raises(ConfigError, match="^replay kinds: sac samples its replay uniform, not prioritized$"):
        rank(Costs(platform, pendulum("sac")), replay_kinds=["prioritized"])


def test_analytic_ranking_is_learner_bound_and_prefers_the_fused_kernel_on_the_cpu():
    costs = Costs(load_platform("ci_2core"), pendulum("td3", policy_delay=2))
    ranking = rank(costs, batches=[128])
    assert ranking.best.candidate.learner_kernel == "fused" and ranking.best.bottleneck == "learn"
    assert all(p.sources["learn"] == "analytic" for p in ranking.predictions)


# -- the algorithms' cost spec (pearl/algos/*.py), which the workload hands the shapes ------------
def cartpole(**options) -> Workload:
    return Workload("CartPole-v1", 4, 2, (64, 64), "uniform", 100_000, 16, 1.0, 1000, **options)


def test_dqn_spec_follows_the_shapes_and_options():
    from pearl.estimator import mlp_forward_cost, mlp_parameter_count
    from pearl.estimator.model import Candidate

    w = cartpole()
    small, big = w.learn_cost(32, "fused"), w.learn_cost(128, "fused")
    assert big.flops == pytest.approx(4 * small.flops, rel=0.05)  # Adam's per-parameter part does not scale
    for envs in (1, 4):
        assert w.act_cost(envs) == mlp_forward_cost([4, 64, 64, 2], envs)
    # sync_weights ships the flat float32 vector of the policy's parameters
    assert w.sizes == [4, 64, 64, 2] and w.n_params == mlp_parameter_count([4, 64, 64, 2])
    cand = Candidate("uniform", "cpu", "cuda:0", "torch", 1, 64)
    transfers = Costs(load_platform("workstation_a100"), w).transfers(cand)
    sync = load_platform("workstation_a100").link("cuda:0", "cpu").transfer_s(4 * w.n_params)
    assert transfers[("cuda:0", "cpu")] == pytest.approx(sync * w.updates_per_step / cand.sync_interval)
    assert cartpole(double=False).learn_cost(64, "fused").flops < cartpole(double=True).learn_cost(64, "fused").flops


def test_the_workload_asks_the_algorithm_class_for_its_spec():
    from pearl.algos.dqn import DQN
    from pearl.algos.td3 import TD3

    assert cartpole().learn_cost(64, "torch") == DQN.learn_cost(4, 2, (64, 64), 64, "torch", double=True)
    w = pendulum("td3", policy_delay=3)
    assert w.learn_cost(64, "torch") == TD3.learn_cost(3, 1, (64, 64), 64, "torch", policy_delay=3)
    assert w.act_cost(2) == TD3.act_cost(3, 1, (64, 64), 2)


@pytest.mark.parametrize("algo", ["dqn", "ddpg", "td3", "sac"])
def test_the_spec_counts_what_the_autograd_update_computes(algo):
    """torch's FLOP counter on the algorithm's own update (its matrix products) against the spec
    of the autograd kernel: the spec adds only bias, activation, Adam and target lerp FLOPs, a few
    percent at these sizes. A spec that back-propagated the actor's loss into the frozen critic's
    weights (4-13% more) would fail this."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from pearl.algos import algorithm_class
    from pearl.config import ExperimentConfig

    batch, cfg = 256, getattr(ExperimentConfig(algo=algo), algo)
    cls = algorithm_class(algo)
    obs_dim, n_actions = (4, 2) if algo == "dqn" else (3, 1)
    agent = cls(obs_dim, n_actions, cfg, total_steps=1000) if algo == "dqn" else cls(obs_dim, n_actions, cfg)
    torch.manual_seed(0)
    actions = (torch.randint(0, n_actions, (batch,)) if algo == "dqn" else torch.rand(batch, n_actions) * 2 - 1)
    batch_args = (torch.randn(batch, obs_dim), actions, torch.randn(batch), torch.randn(batch, obs_dim),
                  torch.full((batch,), 0.99))
    updates = getattr(cfg, "policy_delay", 1)  # TD3: one actor step in policy_delay updates
    with FlopCounterMode(display=False) as counter:
        for _ in range(updates):
            agent.update(*batch_args)
    counted = counter.get_total_flops() / updates
    options = {name: getattr(cfg, name) for name in cls.COST_OPTIONS}
    spec = cls.learn_cost(obs_dim, n_actions, cfg.hidden, batch, "torch", **options).flops
    assert counted <= spec <= 1.05 * counted
