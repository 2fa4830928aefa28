"""`pearl profile` (cache per machine), `pearl autotune` (table, chosen plan, Plan YAML,
--measure) and `pearl.autotune` from Python; bad input ends in one line and exit code 2."""
from __future__ import annotations

import json

import pytest
import yaml

import pearl
from pearl import measure
from pearl.cli import main
from pearl.config import apply_overrides, default_config_path, load_config
from pearl.plan import load_plan


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PEARL_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def small_config():
    return apply_overrides(load_config(default_config_path()),
                           {"dqn.n_step": 1, "dqn.learning_starts": 200, "replay.capacity": 5000})


def test_profile_measures_the_real_loop_and_caches_per_machine(cache):
    from types import SimpleNamespace

    from pearl.estimator import profile as prof
    from pearl.estimator.workload import workload_from_config

    config = small_config()
    tables = prof.profile(config, [("prioritized", "cpu")], envs=(1, 2), batches=(32,), kernels=("fused",),
                          seconds=0.2, runner=measure)
    for name in ("act@cpu", "insert|prioritized@cpu", "sample|prioritized@cpu", "learn|fused@cpu",
                 "update_priorities|prioritized@cpu", "sync_weights|fused@cpu", "overhead|round"):
        assert name in tables, name
    assert set(tables["act@cpu"]) == {"1", "2"} and all(v > 0 for v in tables["act@cpu"].values())
    path = prof.cache_path()
    assert path.parent == cache and prof.machine_fingerprint() in path.name
    stored = json.loads(path.read_text())
    assert stored["workloads"][workload_from_config(config).key()]["tables"] == tables
    assert not list(cache.glob(".*.tmp"))  # atomic write left no temporary behind

    def no_measuring(*args, **kwargs):
        raise AssertionError("the cached table should have been used")

    runner = SimpleNamespace(profile_runs=no_measuring)
    assert prof.profile(config, [("prioritized", "cpu")], envs=(1, 2), batches=(32,), kernels=("fused",),
                        runner=runner) == tables
    with pytest.raises(AssertionError):  # a cell the cache lacks is measured
        prof.profile(config, [("prioritized", "cpu")], envs=(1, 2), batches=(64,), kernels=("fused",), runner=runner)
    # A damaged cache is not trusted.
    path.write_text("{not json")
    assert prof.load_cached(workload_from_config(config).key()) is None


def test_autotune_cli_prints_the_ranking_and_writes_a_plan_the_runtime_loads(cache, tmp_path, capsys):
    out = tmp_path / "plan.yaml"
    assert main(["autotune", "--platform", "cpu_gpu_fpga", "--metric", "efficiency", "-o", str(out),
                 "--replay-kinds", "prioritized", "--top", "5"]) == 0
    text = capsys.readouterr().out
    assert "samples/J" in text and "bottleneck" in text and "chosen:" in text and "why:" in text
    plan = load_plan(out)
    doc = yaml.safe_load(out.read_text())
    assert doc["autotune"]["metric"] == "efficiency" and doc["autotune"]["predicted"]["samples_per_j"] > 0
    assert plan.devices["sample"] == "cpu"  # tests/test_estimator_mapper.py explains why


@pytest.mark.parametrize("kind,runtime", [("prioritized", "processes"), ("amper", "sequential")])
def test_pearl_train_with_the_plan_autotune_wrote_runs_that_plan(cache, tmp_path, capsys, kind, runtime):
    """`pearl autotune CONFIG -o p.yaml`, then `pearl train CONFIG --plan p.yaml`: the run uses the
    replay kind, envs per actor, batch size, learner kernel and runtime the plan names, with no
    other flag (the plan is complete)."""
    config_path, out, run_dir = tmp_path / "c.yaml", tmp_path / "p.yaml", tmp_path / "run"
    config_path.write_text(yaml.safe_dump(small_config().to_dict()))
    assert main(["autotune", str(config_path), "--replay-kinds", kind, "--envs", "4", "--batch-sizes", "32",
                 "--runtimes", runtime, *(["--actors", "1"] if runtime == "processes" else []),
                 "-o", str(out)]) == 0
    assert f"plan written to {out}\n" in capsys.readouterr().out  # no conflict with the config to report
    plan = load_plan(out)
    assert (plan.replay, plan.envs_per_actor, plan.batch_size, plan.runtime) == (kind, 4, 32, runtime)
    assert main(["train", str(config_path), "--plan", str(out), "--steps", "600", "--quiet",
                 "--run-dir", str(run_dir)]) == 0
    assert load_plan(run_dir / "plan.yaml") == plan
    ran = load_config(run_dir / "config.yaml")
    assert (ran.replay.kind, ran.runtime.envs_per_actor, ran.dqn.batch_size) == (kind, 4, 32)
    result = json.loads((run_dir / "result.json").read_text())
    assert result["learner_kernel"] == plan.learner_kernel and result["env_steps"] >= 600


def test_autotune_says_when_the_config_itself_set_what_the_plan_changes(cache, tmp_path, capsys):
    """A config that chose prioritized replay, a plan of amper: training would refuse the
    conflict (pearl.plan.reconcile), and autotune says so where it writes the plan."""
    config_path, out = tmp_path / "c.yaml", tmp_path / "p.yaml"
    config_path.write_text(yaml.safe_dump(apply_overrides(small_config(), {"replay.kind": "prioritized"}).to_dict()))
    assert main(["autotune", str(config_path), "--replay-kinds", "amper", "--envs", "4", "-o", str(out)]) == 0
    assert (f"plan written to {out} (with this config, pearl train --plan stops: plan.replay: amper, but the "
            f"config's replay.kind is prioritized" in capsys.readouterr().out)
    assert main(["train", str(config_path), "--plan", str(out), "--steps", "100", "--quiet",
                 "--run-dir", str(tmp_path / "run")]) == 2


def test_autotune_measure_sets_prediction_against_measurement(cache, tmp_path, capsys):
    config_path = tmp_path / "c.yaml"
    config_path.write_text(yaml.safe_dump(small_config().to_dict()))
    assert main(["profile", str(config_path), "--replays", "uniform", "--envs", "1,4", "--batch-sizes", "32",
                 "--kernels", "fused", "--seconds", "0.2", "--tasks-only"]) == 0
    capsys.readouterr()
    assert main(["autotune", str(config_path), "--platform", "ci_2core", "--envs", "1,4",
                 "--batch-sizes", "32", "--measure", "1", "--seconds", "0.3"]) == 0
    text = capsys.readouterr().out
    assert "MMMMM" in text  # every task's cost came from the profile of this machine
    compared = text.split("predicted vs measured")[1].splitlines()[2]
    assert "%" in compared  # predicted, measured and the error on one row
    # a watt is modelled unless a sensor read it, and the table says which
    assert "W modelled" in text and "samples/J modelled" in text
    assert "no sensor" in compared or "rapl" in compared or "nvml" in compared


def test_python_api_takes_an_agent_or_a_config(cache):
    agent = pearl.DQN(env="CartPole-v1", replay="prioritized")
    result = pearl.autotune(agent, platform="cpu_gpu_fpga", metric="throughput")
    assert result.best.steps_per_s > 0 and result.plan.devices["sample"] == result.best.candidate.replay_device
    assert result.replay_kind in ("prioritized", "amper")
    frugal = pearl.autotune(agent.config, platform="cpu_gpu_fpga", metric="efficiency")
    assert frugal.best.samples_per_j >= result.best.samples_per_j
    with pytest.raises(pearl.ConfigError, match="expected an agent"):
        pearl.autotune(42)


@pytest.mark.parametrize("argv,message", [
    (["autotune", "--platform", "nowhere"], "platform 'nowhere': no such profile"),
    (["autotune", "--metric", "speed"], "metric: expected one of throughput, efficiency, power_cap"),
    (["autotune", "--metric", "power_cap"], "needs a positive cap"),
    (["autotune", "--envs", "1,x"], "--envs: expected comma-separated integers"),
    (["autotune", "--batch-sizes", "0"], "--batch-sizes: expected integers >= 1"),
    (["autotune", "--replay-kinds", "fifo"], "--replay-kinds: 'fifo' is not a replay kind"),
    (["autotune", "--schedule", "async"], "--schedule: expected one of sequential, threaded, processes, overlapped"),
    (["autotune", "--runtimes", "sequential,rllib"],
     "--runtimes: expected a comma-separated list of sequential, threaded, processes, ray, got 'rllib'"),
    (["autotune", "--runtimes", "sequential,ray"], "--runtimes: ray plans need a platform with a nodes: section"),
    (["autotune", "--runtimes", "processes", "--actors", "2,x"], "--actors: expected comma-separated integers"),
    (["autotune", "--actors", "2"], "--actors: only processes or ray plans run several actors"),
    (["autotune", "missing.yaml"], "missing.yaml: no such config file"),
    (["profile", "--replays", "heap"], "--replays: 'heap' is not a replay kind"),
    (["profile", "--kernels", "cuda"], "--kernels: expected fused and/or torch"),
])
def test_bad_autotune_input_is_one_line_and_exit_2(cache, capsys, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


def test_one_iteration_timeline_adds_up_to_the_predicted_step_time_and_plots(cache, tmp_path):
    from pearl.estimator.tune import autotune, iteration_segments, plot_gantt, plot_predicted_vs_measured

    result = autotune(small_config(), platform="cpu_gpu_fpga", metric="throughput", replay_kinds=["prioritized"],
                      envs=[4], use_profile=False)
    best = result.best
    segments = iteration_segments(best)
    # 4 envs x 0.25 updates per step = one update per act round: the iteration is one round.
    assert sum(length for *_, length in segments) == pytest.approx(4 * 1e6 / best.steps_per_s)
    assert {device for device, *_ in segments} >= {"cpu", best.candidate.replay_device}
    plot_gantt(best, tmp_path / "gantt.png")
    plot_predicted_vs_measured([{"plan": "uniform@cpu x", "predicted": 90.0, "measured": 100.0},
                                {"plan": "amper@cpu y", "predicted": 210.0, "measured": 200.0}], tmp_path / "s.png")
    assert (tmp_path / "gantt.png").read_bytes()[:4] == b"\x89PNG" and (tmp_path / "s.png").stat().st_size > 1000


def test_n_step_plans_with_many_envs_are_ranked_and_run(cache):
    """n_step 3 with 4+ envs per actor: each env holds n_step - 1 transitions back, which the
    runtime's rate limiter allows for, so these plans are ranked, accepted and measured."""
    from pearl.estimator.model import Candidate
    from pearl.estimator.tune import autotune, runtime_accepts

    config = apply_overrides(small_config(), {"dqn.n_step": 3})
    result = autotune(config, platform="ci_2core", envs=[1, 2, 4, 16])
    assert result.ranking.refused == 0 and {p.candidate.envs for p in result.ranking.predictions} >= {4, 16}
    many = Candidate("uniform", "cpu", "cpu", "fused", 16, 64)
    assert runtime_accepts(config, many)
    assert measure.measure(config, many, 0.1)["steps_per_s"] > 0


def test_plans_the_runtime_would_refuse_are_not_ranked(cache, monkeypatch):
    """autotune never writes a plan whose samples the runtime's own rate limiter would refuse
    (here a limiter that needs more transitions than the run ever inserts before learning): the
    agent and runtime_accepts both take the band from pearl.schedule.rate_limit."""
    from pearl import schedule
    from pearl.errors import PearlError
    from pearl.estimator.model import Candidate
    from pearl.estimator.tune import autotune, runtime_accepts

    config = small_config()
    band = schedule.rate_limit

    def strict_for_many_envs(runtime, batch, updates_per_step, learning_starts, n_step, envs, actors=1, burst=1):
        limit = band(runtime, batch, updates_per_step, learning_starts, n_step, envs, actors, burst)
        return schedule.RateLimit(limit.samples_per_insert, 10**9, limit.error_buffer) if envs >= 4 else limit

    monkeypatch.setattr(schedule, "rate_limit", strict_for_many_envs)
    result = autotune(config, platform="ci_2core", envs=[1, 2, 4, 16])
    assert result.ranking.refused > 0 and {p.candidate.envs for p in result.ranking.predictions} <= {1, 2}
    ok, refused = Candidate("uniform", "cpu", "cpu", "fused", 2, 64), Candidate("uniform", "cpu", "cpu", "fused", 4, 64)
    assert runtime_accepts(config, ok) and not runtime_accepts(config, refused)
    assert measure.measure(config, ok, 0.1)["steps_per_s"] > 0
    with pytest.raises(PearlError, match="refused"):
        measure.measure(config, refused, 0.1)


def test_autotune_searches_actor_processes_and_writes_their_plan(cache, tmp_path):
    """With the processes runtime asked for, the ranking holds every actor count of the platform
    (1 and 2 on ci_2core), the plan written carries `runtime: processes` and `actors`, and the
    reason names the side that sets the step."""
    from pearl.estimator.tune import autotune, explain

    result = autotune(small_config(), platform="ci_2core", envs=[1, 4], runtimes=("sequential", "processes"),
                      use_profile=False)
    processes = [p.candidate for p in result.ranking.predictions if p.candidate.runtime == "processes"]
    assert {c.actors for c in processes} == {1, 2}
    best = next(p for p in result.ranking.predictions if p.candidate.runtime == "processes")
    result.ranking.predictions.insert(0, best)  # whatever the model prefers here, write this one
    out = tmp_path / "plan.yaml"
    result.save(out)
    plan = load_plan(out)
    assert (plan.runtime, plan.actors, plan.envs_per_actor) == ("processes", best.candidate.actors, best.candidate.envs)
    assert yaml.safe_load(out.read_text())["autotune"]["predicted"]["sides_us"].keys() == {"actors", "learner", "cores"}
    assert "is set by the" in explain(result.ranking, "throughput")


def test_ring_write_is_timed_on_the_runtimes_own_ring():
    times = measure.ring_write_us(small_config(), (1, 4), rounds=50)
    assert set(times) == {"1", "4"} and all(us > 0 for us in times.values())


@pytest.mark.slow
def test_profile_processes_measures_steady_runs_and_the_time_sharing_factor(cache):
    """`pearl profile --processes`: the ring write and, per learner kernel, the time-sharing
    factor; a processes plan's measured window starts once its actor processes are up."""
    from pearl.estimator import profile as prof
    from pearl.estimator.model import Candidate
    from pearl.estimator.tune import autotune

    config = small_config()
    tables = prof.profile(config, [("uniform", "cpu")], envs=(1, 4), batches=(32,), kernels=("fused",),
                          seconds=0.4, processes=True, runner=measure)
    assert set(tables["ring_write"]) == {"1", "4"} and tables["processes|fused"]["0"] >= 1.0
    plan = Candidate("uniform", "cpu", "cpu", "fused", 4, 32, runtime="processes", actors=2)
    run = measure.measure(config, plan, 0.4)
    assert run["steps_per_s"] > 0 and run["wall_s"] >= 0.4 * 0.9
    result = autotune(config, platform="ci_2core", envs=[1, 4], batches=[32], runtimes=("processes",),
                      use_profile=True)
    assert all(p.sources["act"] == "measured" for p in result.ranking.predictions if p.candidate.replay_kind == "uniform")


def test_a_processes_plan_gets_a_row_per_process_whose_learner_row_is_its_side(cache, tmp_path):
    """The timeline of a processes plan: an actor row per process and the learner's row, whose
    length is the learner's predicted time for the env steps one pass takes in."""
    from pearl.estimator.tune import autotune, iteration_segments, plot_gantt
    from pearl.schedule import allowance

    result = autotune(small_config(), platform="ci_2core", envs=[4], runtimes=("processes",), actors=[2],
                      use_profile=False)
    best = result.best
    segments = iteration_segments(best)
    assert {row for row, *_ in segments} == {"actor 1", "actor 2", "learner"}
    u = best.updates_per_s / best.steps_per_s
    steps = 2 * allowance(u, 2, 4)
    learner = sum(length for row, _, _, length in segments if row == "learner")
    assert learner == pytest.approx(best.sides["learner"] * steps, rel=0.02)
    plot_gantt(best, tmp_path / "gantt.png")
    assert (tmp_path / "gantt.png").read_bytes()[:4] == b"\x89PNG"


def test_a_frame_table_config_gets_ray_plans_whose_shards_hold_whole_streams(cache):
    """A frame table's shards hold whole env streams: for a config with replay.frame_stack autotune
    ranks ray plans of every placement with at most one shard per stream (the builder refuses more)."""
    from pathlib import Path

    pytest.importorskip("ale_py")
    config = apply_overrides(load_config(Path(__file__).parents[1] / "configs" / "breakout_dqn.yaml"),
                             {"replay.capacity": 5000})
    assert config.replay.frame_stack
    result = autotune_of(config, ("sequential", "ray"))
    ray_plans = [p.candidate for p in result.ranking.predictions if p.candidate.runtime == "ray"]
    assert {c.placement for c in ray_plans} == {"learner", "server", "node"}
    assert all(c.shards <= c.nodes * c.actors * c.envs for c in ray_plans) and result.ranking.refused > 0
    whole = autotune_of(apply_overrides(config, {"replay.frame_stack": 0}), ("sequential", "ray"))
    assert {p.candidate.placement for p in whole.ranking.predictions if p.candidate.runtime == "ray"} >= {
        "learner", "server", "node"}


def autotune_of(config, runtimes):
    from pearl.estimator.tune import autotune

    return autotune(config, platform="local_cluster", runtimes=runtimes, use_profile=False)
