"""The predicted-vs-measured pipeline of issue 5's acceptance, reduced (slow; ~2 min on 2 cores):
profile, predict, measure and compare end to end on this machine. The accuracy itself (median
error <= 15%, pick within 10% of the best) is a speed figure: it is measured by
benchmarks/autotune_accuracy.py and recorded in docs/BENCHMARKS.md, not asserted here, where a
loaded CI machine would decide it (a run under load average 2.4 measured 21%)."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from pearl.estimator.model import Candidate


def _benchmark():
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "autotune_accuracy.py"
    spec = importlib.util.spec_from_file_location("autotune_accuracy", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_profile_predict_measure_and_compare_end_to_end(tmp_path, monkeypatch):
    monkeypatch.setenv("PEARL_CACHE_DIR", str(tmp_path))
    bench = _benchmark()
    fixed = [Candidate("uniform", "cpu", "cpu", "fused", 1, 64), Candidate("uniform", "cpu", "cpu", "fused", 16, 64),
             Candidate("prioritized", "cpu", "cpu", "fused", 1, 64),
             Candidate("prioritized", "cpu", "cpu", "fused", 16, 64),
             Candidate("amper", "cpu", "cpu", "fused", 4, 64)]
    report = bench.run(seconds=2.0, profile_seconds=1.0, replays=[("uniform", "cpu"), ("prioritized", "cpu"),
                                                                  ("amper", "cpu")],
                       envs=(1, 4, 16), batches=(64,), fixed=fixed, kernels=("fused",), threaded=(),
                       processes=[Candidate("uniform", "cpu", "cpu", "fused", 4, 64, runtime="processes", actors=2)],
                       continuous={"td3": [Candidate("uniform", "cpu", "cpu", "torch", 4, 64)]})
    table = bench.markdown(report)
    print(table)
    assert len(report["rows"]) >= 5 and "median |error|" in table
    assert 0.0 <= report["median_abs_error"] < float("inf")
    assert 0.0 < report["pick_vs_best"] <= 1.0  # the pick is one of the measured plans
    assert any(r["runtime"] == "processes" for r in report["rows"]) and report["processes_median_abs_error"] >= 0
    assert any(r.get("algo") == "td3" for r in report["rows"]) and 0.0 < report["continuous_pick_vs_best"]["td3"] <= 1.0
    assert "per-algorithm plans (TD3)" in table


@pytest.mark.slow
def test_the_held_out_set_is_profiled_ranked_measured_and_reported_apart(tmp_path, monkeypatch):
    """benchmarks/autotune_accuracy.py --heldout on one small workload: the profile a user would
    take, autotune's top plans over sequential and processes, the analytic model alone beside."""
    monkeypatch.setenv("PEARL_CACHE_DIR", str(tmp_path))
    bench = _benchmark()
    workloads = {"TD3 Pendulum-v1 32x32 B32": (
        "pendulum_td3.yaml", {"td3.hidden": [32, 32], "td3.batch_size": 32, "td3.learning_starts": 200,
                              "replay.capacity": 5000},
        [Candidate("uniform", "cpu", "cpu", "fused", 4, 32, runtime="processes", actors=1)])}
    monkeypatch.setattr(bench, "TOP", 2)
    report = bench.heldout(seconds=0.8, profile_seconds=0.4, workloads=workloads)
    table = bench.heldout_markdown(report)
    print(table)
    rows = [r for r in report["rows"] if "error" in r]
    # autotune's top 2 and the fixed processes plan, which may be one of them
    fixed = workloads["TD3 Pendulum-v1 32x32 B32"][2][0].label()
    assert len(rows) >= 2 and any(r["plan"] == fixed and r["runtime"] == "processes" for r in rows)
    assert sum(r.get("rank") is not None for r in rows) == 2
    assert all(r["low"] < r["predicted"] < r["high"] and r["analytic"] > 0 for r in rows)
    assert 0.0 < report["pick_vs_best_of_top"]["TD3 Pendulum-v1 32x32 B32"] <= 1.0
    assert "analytic model alone: median |error|" in table and report["profile_s"]
    # --reprice: the same model prices a saved report's analytic column as the run did
    again = bench.reprice_analytic(json.loads(json.dumps(report)), workloads)
    assert [r["analytic"] for r in again["rows"] if "error" in r] == pytest.approx([r["analytic"] for r in rows])


def test_the_new_plan_choices_are_reported_apart():
    bench = _benchmark()
    both = Candidate("uniform", "cpu", "cpu", "fused", 4, 128, precision="bf16", threads=2)
    assert bench.new_choice(both) == "bf16 t2"
    assert bench.new_choice(Candidate("uniform", "cpu", "cpu", "fused", 4, 64, env_engine="envpool")) == "envpool"
    assert bench.new_choice(Candidate("uniform", "cpu", "cpu", "fused", 4, 64)) == ""
    rows = [{"new_choice": "bf16", "error": 0.10}, {"new_choice": "bf16 t2", "error": -0.30},
            {"new_choice": "t2", "error": 0.20}, {"new_choice": "envpool", "error": 0.05},
            {"new_choice": "", "error": 0.40}, {"error": -0.02}]
    medians = bench.new_choice_medians(rows)
    assert medians["new_choice_plans"] == 4 and medians["new_choice_median_abs_error"] == pytest.approx(0.15)
    assert medians["new_choice_medians"] == {"bf16": (pytest.approx(0.2), 2), "envpool": (0.05, 1),
                                             "t2": (pytest.approx(0.25), 2)}
    assert medians["default_choice_median_abs_error"] == pytest.approx(0.21)
    assert "median |error| 15.0% over 4 (bf16 20.0% over 2, envpool 5.0% over 1, t2 25.0% over 2)" in \
        bench.new_choice_summary(medians)
    assert bench.new_choice_medians([{"error": 0.1}]) == {}


def test_each_median_names_the_plans_it_is_over():
    """The summary's counts are the rows its medians were taken over: the acceptance set's DQN
    CartPole plans per runtime (not the per-algorithm DQN plans), every sequential plan."""
    bench = _benchmark()

    def row(runtime, error, **more):
        return {"plan": "p", "runtime": runtime, "predicted": 1.0, "measured": 1.0, "measured_mean": 1.0,
                "error": error, "bottleneck": "learn", "pick": False, **more}

    rows = [row("sequential", 0.10, engine="gymnasium"), row("sequential", 0.50, engine="gymnasium"),
            row("sequential", 0.90, engine="envpool"), row("processes", 0.20, engine="gymnasium"),
            row("sequential", 0.01, algo="dqn"), row("sequential", 0.02, algo="dqn"),
            row("sequential", 0.03, algo="td3"), row("processes", 0.70, algo="td3")]
    assert [r["error"] for r in bench.acceptance_rows(rows, "sequential")] == [0.10, 0.50]
    assert [r["error"] for r in bench.acceptance_rows(rows, "processes")] == [0.20]
    assert [r["error"] for r in bench.every_sequential(rows)] == [0.10, 0.50, 0.01, 0.02, 0.03]
    report = {"rows": rows, "median_abs_error": 0.30, "processes_median_abs_error": 0.20, "pick_vs_best": 1.0,
              "continuous_median_abs_error": 0.025, "all_median_abs_error": 0.03,
              "continuous_pick_vs_best": {"dqn": 1.0, "td3": 1.0}, "load_before": 0.0, "load_after": 0.0,
              "wall_s": 1.0, "when": "now"}
    table = bench.markdown(report)
    assert "median |error| 30.0% over 2 sequential plans (reported apart: processes 20.0% over 1)" in table
    assert "every sequential plan: median |error| 3.0% over 5 plans" in table
