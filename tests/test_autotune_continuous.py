"""`pearl autotune` and `pearl profile` on DDPG, TD3 and SAC configs: ranked plans, a Plan YAML the
continuous agents accept, the real loop profiled, one-line errors for what they cannot run."""
from __future__ import annotations

import pytest

import pearl
from pearl.cli import main
from pearl.config import apply_overrides, default_config_path, load_config
from pearl.kernels.cpu.backend import bf16_products
from pearl.plan import load_plan


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PEARL_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def shipped(name: str) -> str:
    return str(default_config_path().with_name(name))


def test_autotune_td3_ranks_plans_and_writes_one_the_td3_agent_accepts(cache, tmp_path, capsys):
    out = tmp_path / "plan.yaml"
    assert main(["autotune", shipped("pendulum_td3.yaml"), "--envs", "1,4", "--batch-sizes", "128,256",
                 "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "learn fused@cpu" in text and "learn torch@cpu" in text and "chosen:" in text
    plan = load_plan(out)
    agent = pearl.TD3(config=apply_overrides(load_config(shipped("pendulum_td3.yaml")),
                                             {"td3.hidden": [16, 16], "eval.interval": 0}), plan=plan)
    assert agent.plan.learner_kernel == plan.learner_kernel and agent.plan.batch_size in (128, 256)
    result = pearl.autotune(shipped("pendulum_td3.yaml"), envs=[1, 4], batches=[128, 256])
    values = [p.steps_per_s for p in result.ranking.predictions]
    # (fused, fused with bf16 products where the cpu has bfloat16 units, torch) x 1 and 2 learner
    # threads (ci_2core's sequential plans leave both cores to the learner) x envs x batches
    learners = 3 if bf16_products() else 2
    assert len(values) == learners * 2 * 2 * 2 and values == sorted(values, reverse=True)


def test_autotune_sac_offers_the_fused_and_torch_learners(cache):
    result = pearl.autotune(shipped("pendulum_sac.yaml"), envs=[1])
    assert {p.candidate.learner_kernel for p in result.ranking.predictions} == {"fused", "torch"}
    assert result.plan.learner_kernel == result.best.candidate.learner_kernel


def test_profile_times_the_continuous_loop_and_autotune_uses_it(cache):
    from pearl import measure
    from pearl.estimator import profile as prof
    from pearl.estimator.model import Candidate

    config = apply_overrides(load_config(shipped("pendulum_ddpg.yaml")),
                             {"ddpg.hidden": [16, 16], "ddpg.learning_starts": 100, "replay.capacity": 5000})
    tables = prof.profile(config, envs=(1, 2), batches=(16,), seconds=0.2, runner=measure)
    for name in ("act@cpu", "insert|uniform@cpu", "sample|uniform@cpu", "learn|fused@cpu", "learn|torch@cpu",
                 "sync_weights|fused@cpu", "overhead|round"):
        assert name in tables, name
    from pearl.devices import cpu_devices

    if cpu_devices()[0]["cores"] > 1:  # the learner thread counts the mapper offers here: their own tables
        assert "learn|fused/t2@cpu" in tables and "learn|torch/t2@cpu" in tables
    result = pearl.autotune(config, envs=[1, 2], batches=[16], use_profile=True)
    assert all(set(p.sources.values()) == {"measured"} for p in result.ranking.predictions)
    assert measure.measure(config, Candidate("uniform", "cpu", "cpu", "torch", 2, 16), 0.1)["steps_per_s"] > 0


@pytest.mark.parametrize("argv, message", [
    (["autotune", shipped("pendulum_sac.yaml"), "--replay-kinds", "prioritized"],
     "replay kinds: sac samples its replay uniform, not prioritized"),
    (["profile", shipped("minatar_breakout_dqn.yaml"), "--kernels", "fused"],  # a CNN learns with torch only
     "--kernels: dqn has the torch learner(s), not 'fused'"),
    (["profile", shipped("pendulum_td3.yaml"), "--replays", "amper"],
     "--replays: td3 samples its replay uniform, not amper"),
    (["profile", shipped("pendulum_ddpg.yaml"), "--replays", "uniform@opencl:0"],
     "--replays: ddpg keeps its replay on the cpu, not opencl:0"),
])
def test_what_a_continuous_agent_cannot_run_is_one_line(cache, capsys, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"pearl: error: {message}"
