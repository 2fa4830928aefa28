"""The learner's product precision in the estimator: the cpu backend offers bf16 to the fused DDPG /
TD3 learner only where the cpu has bfloat16 units (/proc/cpuinfo flags), the cost model prices it
(analytic: LEARN_SPEEDUP on the learn's FLOPs; measured: its own profile table), the mapper ranks
it and a ranked bf16 candidate becomes a Plan the agents run."""
from __future__ import annotations

import pytest

from pearl.estimator.costs import LEARN_SPEEDUP, Costs
from pearl.estimator.mapper import candidates
from pearl.estimator.model import Candidate, predict
from pearl.estimator.workload import Workload
from pearl.kernels.cpu import backend as cpu_backend
from pearl.platforms import load_platform

PENDULUM = dict(env="Pendulum-v1", obs_dim=3, n_actions=1, hidden=(400, 300), replay_kind="uniform",
                capacity=100_000, fanout=16, updates_per_step=1.0, learning_starts=100, batch_size=256)
FLAGS = "fpu vme sse2 avx2 avx512f avx512_bf16 amx_bf16 amx_tile"


@pytest.fixture
def bf16_cpu(monkeypatch):
    monkeypatch.setattr(cpu_backend, "cpu_flags", lambda: frozenset(FLAGS.split()))


@pytest.fixture
def plain_cpu(monkeypatch):
    monkeypatch.setattr(cpu_backend, "cpu_flags", lambda: frozenset("fpu vme sse2 avx2 avx512f".split()))


def test_bf16_units_are_read_from_the_cpu_flags(tmp_path):
    assert cpu_backend.bf16_products(frozenset({"avx512_bf16"})) and cpu_backend.bf16_products(frozenset({"amx_bf16"}))
    assert not cpu_backend.bf16_products(frozenset({"avx512f", "avx512_fp16", "amx_tile"}))
    flags = cpu_backend.cpu_flags.__wrapped__()  # this machine's, uncached
    with open("/proc/cpuinfo") as info:
        line = next((line for line in info if line.startswith("flags")), "flags :")
    assert flags == frozenset(line.split(":", 1)[1].split())


def test_mapper_offers_bf16_to_the_fused_learners_on_a_bf16_cpu(bf16_cpu):
    platform = load_platform("ci_2core")
    for algo in ("ddpg", "td3", "sac"):
        cands, _ = candidates(platform, Workload(**PENDULUM, algo=algo), envs=(1,), batches=(256,))
        assert {(c.learner_kernel, c.precision) for c in cands} == {("fused", "fp32"), ("fused", "bf16"),
                                                                    ("torch", "fp32")}
        bf16 = next(c for c in cands if c.precision == "bf16")
        plan = bf16.to_plan()
        assert plan.learner_precision == "bf16" and plan.learner_kernel == "fused" and "bf16" in bf16.label()
    dqn, _ = candidates(platform, Workload("CartPole-v1", 4, 2, (64, 64), "uniform", 1000, 16, 0.25, 100),
                        envs=(1,), batches=(64,))
    assert {(c.learner_kernel, c.precision) for c in dqn} == {("fused", "fp32"), ("fused", "bf16"), ("torch", "fp32")}
    # DQN's fused learner runs bf16 in its inner hidden layers: a Q-network with none offers float32 only
    shallow, _ = candidates(platform, Workload("CartPole-v1", 4, 2, (64,), "uniform", 1000, 16, 0.25, 100),
                            envs=(1,), batches=(64,))
    assert {c.precision for c in shallow} == {"fp32"}


def test_mapper_offers_float32_only_without_bf16_units(plain_cpu):
    cands, _ = candidates(load_platform("ci_2core"), Workload(**PENDULUM, algo="ddpg"), envs=(1,), batches=(256,))
    assert {c.precision for c in cands} == {"fp32"}


def test_analytic_bf16_learn_divides_the_flop_time_and_adds_the_conversions():
    platform = load_platform("ci_2core")
    costs = Costs(platform, Workload(**PENDULUM, algo="ddpg"))
    fp32, bf16 = (Candidate("uniform", "cpu", "cpu", "fused", 1, 256, precision=p) for p in ("fp32", "bf16"))
    device = platform.device("cpu")
    fixed = {c.precision: cpu_backend.CPUBackend().calls("learn", k, "ddpg") * device.call_overhead_us * 1e-6
             for c, k in ((fp32, "fused"), (bf16, "fused/bf16"))}
    learn = {c.precision: costs.task_seconds("learn", c) for c in (fp32, bf16)}
    assert learn["fp32"][1] == learn["bf16"][1] == "analytic"
    assert fixed["bf16"] > fixed["fp32"]
    assert (learn["fp32"][0] - fixed["fp32"]) / (learn["bf16"][0] - fixed["bf16"]) == pytest.approx(
        LEARN_SPEEDUP["fused/bf16"])
    assert predict(bf16, costs).steps_per_s > predict(fp32, costs).steps_per_s


def test_a_profiled_bf16_learn_is_its_own_table():
    platform = load_platform("ci_2core")
    measured = {"learn|fused@cpu": {"256": 5000.0}, "learn|fused/bf16@cpu": {"256": 2500.0}}
    costs = Costs(platform, Workload(**PENDULUM, algo="td3"), measured)
    fp32, bf16 = (Candidate("uniform", "cpu", "cpu", "fused", 1, 256, precision=p) for p in ("fp32", "bf16"))
    assert costs.task_seconds("learn", fp32) == (pytest.approx(5e-3), "measured")
    assert costs.task_seconds("learn", bf16) == (pytest.approx(2.5e-3), "measured")
    # a bf16 learn is never read off the float32 table (nor the torch learner's)
    only_fp32 = Costs(platform, Workload(**PENDULUM, algo="td3"), {"learn|fused@cpu": {"256": 5000.0}})
    assert only_fp32.task_seconds("learn", bf16)[1] == "analytic"


def test_profile_grid_times_bf16_learns_where_offered(bf16_cpu):
    from pearl.estimator.profile import _grid

    grid = _grid([("uniform", "cpu")], (1, 4), (64, 128), ("fused", "torch"), Workload(**PENDULUM, algo="ddpg"))
    assert {(c.learner_kernel, c.precision, c.envs, c.batch) for c in grid if c.precision != "fp32"} == {
        ("fused", "bf16", 1, 64), ("fused", "bf16", 1, 128)}
