"""The mapper (estimator/mapper.py): placements the runtime accepts, pruning, the metrics, and a
CPU+GPU+FPGA platform where throughput and efficiency pick different plans (analytic model)."""
from __future__ import annotations

import pytest

from pearl.errors import ConfigError
from pearl.estimator.costs import Costs
from pearl.estimator.mapper import actor_counts, candidates, rank
from pearl.estimator.workload import Workload
from pearl.platforms import load_platform

CARTPOLE = Workload("CartPole-v1", 4, 2, (64, 64), "prioritized", 100_000, 16, 0.25, 1000)


def test_candidates_are_placements_the_runtime_accepts():
    mixed = load_platform("cpu_gpu_fpga")
    cands, _ = candidates(mixed, CARTPOLE, ["uniform", "prioritized", "amper"], (1, 4), (64,))
    for c in cands:
        plan = c.to_plan("cpu_gpu_fpga")
        plan.check()
        assert c.act_device == "cpu"
        if c.replay_kind == "amper":
            assert c.replay_device == "cpu"
        if c.replay_kind == "uniform":
            assert not c.replay_device.startswith(("fpga", "opencl"))
        if c.replay_device.startswith("cuda"):
            assert c.learn_device == c.replay_device
        if c.learner_kernel == "fused":
            assert c.learn_device == "cpu"
    placements = {(c.replay_kind, c.replay_device, c.learn_device, c.learner_kernel) for c in cands}
    assert ("prioritized", "fpga:0", "cuda:0", "torch") in placements
    assert ("prioritized", "cuda:0", "cuda:0", "torch") in placements
    assert ("uniform", "cuda:0", "cpu", "fused") not in placements
    # A dueling head has no fused kernel.
    dueling = Workload("CartPole-v1", 4, 2, (64, 64), "uniform", 1000, 16, 0.25, 100, dueling=True)
    assert all(c.learner_kernel == "torch" for c in candidates(mixed, dueling)[0])


def test_interchangeable_gpus_are_pruned():
    node = load_platform("h100_node")
    cands, pruned = candidates(node, CARTPOLE, ["prioritized"], (1,), (64,))
    assert pruned == 7
    assert {c.learn_device for c in cands} == {"cpu", "cuda:0"}


def test_throughput_and_efficiency_choose_different_plans_on_cpu_gpu_fpga():
    """CartPole-sized DQN, prioritized replay, analytic + simulated FPGA costs. The FPGA sum tree
    shortens each step a little (the tree walks leave the CPU's interpreter), so throughput puts
    the replay on fpga:0; but the card's static watts cost more than those steps/s earn, so
    efficiency keeps everything on the CPU. Neither uses the A100: 70 kernel launches per update
    make a 4-64-64-2 learner slower there than the fused CPU kernel."""
    costs = Costs(load_platform("cpu_gpu_fpga"), CARTPOLE)
    fast = rank(costs, "throughput", replay_kinds=["prioritized"], batches=[64])
    frugal = rank(costs, "efficiency", replay_kinds=["prioritized"], batches=[64])
    assert fast.best.candidate != frugal.best.candidate
    assert fast.best.candidate.replay_device == "fpga:0" and fast.best.simulated
    assert frugal.best.candidate.replay_device == "cpu"
    assert fast.best.steps_per_s > frugal.best.steps_per_s
    assert frugal.best.samples_per_j > fast.best.samples_per_j
    assert fast.best.watts > frugal.best.watts
    assert "fpga:0" in fast.best.device_w and "fpga:0" not in frugal.best.device_w
    assert all(p.candidate.learn_device == "cpu" for p in (fast.best, frugal.best))


def test_bigger_networks_move_the_learner_to_the_gpu():
    wide = Workload("CartPole-v1", 4, 2, (512, 512), "prioritized", 100_000, 16, 0.25, 1000)
    best = rank(Costs(load_platform("cpu_gpu_fpga"), wide), "throughput", batches=[512]).best
    assert best.candidate.learn_device == "cuda:0" and best.bottleneck == "learn"


def test_power_cap_keeps_plans_under_the_cap_and_refuses_an_impossible_one():
    costs = Costs(load_platform("cpu_gpu_fpga"), CARTPOLE)
    unlimited = rank(costs, "throughput", replay_kinds=["prioritized"])
    capped = rank(costs, "power_cap", 60.0, replay_kinds=["prioritized"])
    assert all(p.watts <= 60.0 for p in capped.predictions) and capped.over_cap > 0
    assert capped.best.steps_per_s <= unlimited.best.steps_per_s
    with pytest.raises(ConfigError, match="no plan fits under 5 W"):
        rank(costs, "power_cap", 5.0)
    with pytest.raises(ConfigError, match="needs a positive cap"):
        rank(costs, "power_cap")
    with pytest.raises(ConfigError, match="metric: expected one of"):
        rank(costs, "speed")


CPU_ONLY = """name: cpu{cores}
devices:
  - {{id: cpu, kind: cpu, name: C, cores: {cores}, clock_mhz: 2000, peak_gflops: 256, memory_bandwidth_gb_s: 40,
     call_overhead_us: 5, power_w: {{idle: 10, tdp: 50}}}}
links: []
"""


def measured(act_us_per_env: float, learn_us: float) -> dict:
    """A profile table for uniform replay on the cpu with the fused learner: act costs the same
    per env at any envs per actor (so more envs do not hide it), the rest a few microseconds."""
    return {"act@cpu": {str(e): act_us_per_env * e for e in (1, 4)}, "insert|uniform@cpu": {"1": 5.0, "4": 8.0},
            "sample|uniform@cpu": {"64": 10.0}, "learn|fused@cpu": {"64": learn_us},
            "sync_weights|fused@cpu": {"0": 3.0}, "overhead|round": {"0": 5.0}, "overhead|update": {"0": 1.0}}


@pytest.mark.parametrize("cores,fewest_actors", [(2, 2), (4, 4), (16, 8)])
def test_mapper_adds_actors_while_acting_limits_and_cores_allow(tmp_path, cores, fewest_actors):
    path = tmp_path / f"cpu{cores}.yaml"
    path.write_text(CPU_ONLY.format(cores=cores))
    uniform = Workload("CartPole-v1", 4, 2, (64, 64), "uniform", 100_000, 16, 0.25, 1000)
    costs = Costs(load_platform(path), uniform, measured(act_us_per_env=200.0, learn_us=80.0))
    ranking = rank(costs, replay_kinds=["uniform"], envs=(1, 4), batches=[64], runtimes=("sequential", "processes"))
    explored = {p.candidate.actors for p in ranking.predictions if p.candidate.runtime == "processes"}
    assert explored == set(actor_counts(cores)) and max(explored) == cores
    assert {p.candidate.actors for p in ranking.predictions if p.candidate.runtime == "sequential"} == {1}
    fused = [p for p in ranking.predictions if p.candidate.learner_kernel == "fused"]
    best = fused[0]
    # acting (~200 us per env step) is the bottleneck, so actors are added while the cores
    # allow: every core on 2 and 4 (the N + 1 processes time-share them); on 16 at least up to
    # where the learner (~26 us per env step) limits instead (more actors then only shave its
    # loop's time per pass: each pass drains more)
    assert best.candidate.runtime == "processes" and best.candidate.actors >= fewest_actors
    assert best.limiting_side == ("learner" if cores == 16 else "cores")
    if cores == 16:
        assert best.sides["actors"] <= best.sides["learner"]
    # A learner-bound workload gains nothing from actors: one actor ranks first (ties keep the fewer).
    slow_learner = Costs(load_platform(path), uniform, measured(act_us_per_env=10.0, learn_us=2000.0))
    best = [p for p in rank(slow_learner, replay_kinds=["uniform"], envs=(1, 4), batches=[64],
                            runtimes=("processes",)).predictions if p.candidate.learner_kernel == "fused"][0]
    assert best.candidate.actors == 1 and best.limiting_side == "learner"


def test_actor_counts_cover_small_hosts_and_ladder_big_ones():
    assert actor_counts(1) == [1] and actor_counts(2) == [1, 2] and actor_counts(4) == [1, 2, 3, 4]
    assert actor_counts(64) == [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 63, 64]
    node = load_platform("h100_node")
    cands, _ = candidates(node, CARTPOLE, ["prioritized"], (1,), (64,), runtimes=("processes",), actors=(2, 5))
    assert {c.actors for c in cands} == {2, 5} and all(c.to_plan().actors == c.actors for c in cands)
