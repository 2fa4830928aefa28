"""Issue 17: the estimator calibrated per machine and honest about it. The profile cache key
names what changes a cost; `pearl profile` measures the config's own batch; figures between or
beyond profiled sizes say so; a CPU model the platform file does not describe is flagged; the
processes runtime's measured overlap reaches the prediction; platform figures must be finite;
power is modelled unless a sensor (RAPL, NVML) read it."""
from __future__ import annotations

import json
import os
import threading
import time
from types import SimpleNamespace

import pytest

from pearl.config import apply_overrides, default_config_path, load_config
from pearl.errors import ConfigError
from pearl.estimator import profile as prof
from pearl.estimator.costs import Costs
from pearl.estimator.model import Candidate, predict
from pearl.estimator.tune import autotune, format_table, same_cpu_model
from pearl.estimator.workload import workload_from_config
from pearl.platforms import load_platform
from pearl.power import Sensors, rapl_counters


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PEARL_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def config(**overrides):
    return apply_overrides(load_config(default_config_path()),
                           {"dqn.learning_starts": 200, "replay.capacity": 5000, "dqn.n_step": 1,
                            "replay.kind": "prioritized", **overrides})


# -- the cache key and the profile's grid --------------------------------------------------------
def test_the_cache_key_changes_with_everything_that_changes_a_cost():
    base = workload_from_config(config()).key()
    for overrides in ({"dqn.n_step": 3}, {"dqn.batch_size": 32}, {"dqn.hidden": [128, 128]},
                      {"env": "Acrobot-v1"}, {"replay.kind": "uniform"},
                      {"replay.backend": "numpy"}, {"dqn.updates_per_step": 1.0}):
        assert workload_from_config(config(**overrides)).key() != base, overrides
    # obs and action dims are named, not only the env
    assert "|obs4|act2|" in base
    assert workload_from_config(config(**{"eval.episodes": 3})).key() == base  # no cost in it
    # the learner's threads are the plan's: each thread count has its own learn table in one entry
    assert workload_from_config(config(**{"runtime.torch_threads": 2})).key() == base


class FakeRunner:
    """Answers profile runs with fixed per-task figures and records the candidates asked for."""

    def __init__(self, processes_step_us: float | None = None):
        self.asked, self.processes_step_us = [], processes_step_us

    def profile_runs(self, config, cands, seconds):
        self.asked += list(cands)
        out = []
        for cand in cands:
            means = {"act": 30.0 * cand.envs, "insert": 5.0, "sample": 0.1 * cand.batch, "learn": 2.0 * cand.batch,
                     "sync_weights": 3.0}
            if cand.replay_kind != "uniform":
                means["update_priorities"] = 4.0
            out.append((means, {"rounds": 1000, "updates": 250, "wall_s": 0.5, "task_s": 0.45, "steps_per_s": 2000.0}))
        return out

    def ring_write_us(self, config, envs):
        return {str(e): 2.0 + e for e in envs}

    def measure_many(self, config, cands, seconds):
        self.asked += list(cands)
        return [{"steps_per_s": 1e6 / self.processes_step_us} for _ in cands]


def test_profile_measures_the_configs_batch_and_caches_per_n_step(cache):
    runner = FakeRunner()
    one = config(**{"dqn.batch_size": 48, "dqn.n_step": 1})
    tables = prof.profile(one, envs=(1, 4), runner=runner)
    assert {c.batch for c in runner.asked} == {48} and "48" in tables["learn|fused@cpu"]
    assert prof.profile(one, envs=(1, 4), runner=SimpleNamespace()) == tables  # cached: no run
    # a 3-step config does not reuse the 1-step table: it is measured again, under its own key
    runner.asked.clear()
    prof.profile(config(**{"dqn.batch_size": 48, "dqn.n_step": 3}), envs=(1, 4), runner=runner)
    assert runner.asked
    stored = json.loads(prof.cache_path().read_text())["workloads"]
    assert len(stored) == 2 and all(entry["cpu_model"] == prof.this_cpu_model() for entry in stored.values())


# -- measured, interpolated, extrapolated --------------------------------------------------------
def test_figures_between_profiled_sizes_are_interpolated_and_beyond_them_extrapolated(cache):
    cfg = config(**{"replay.kind": "uniform"})
    tables = prof.profile(cfg, envs=(1, 4), batches=(32, 128), runner=FakeRunner())
    costs = Costs(load_platform("ci_2core"), workload_from_config(cfg), tables)
    at = lambda envs, batch: predict(Candidate("uniform", "cpu", "cpu", "fused", envs, batch), costs).sources
    assert at(4, 32)["learn"] == "measured" and at(4, 32)["act"] == "measured"
    assert at(4, 64)["learn"] == "interpolated" and at(2, 32)["act"] == "interpolated"
    assert at(4, 256)["learn"] == "extrapolated" and at(16, 32)["act"] == "extrapolated"
    # the table shows it per task (I, X) and a wider range for the less certain figures
    inside, beyond = (predict(Candidate("uniform", "cpu", "cpu", "fused", 4, b), costs) for b in (32, 256))
    text = format_table([inside, beyond])
    assert "MMMMM" in text.splitlines()[1] and "X" in text.splitlines()[2]
    spread = lambda p: p.steps_range[1] / p.steps_range[0]
    assert spread(beyond) > spread(inside) > 1
    assert inside.steps_range[0] < inside.steps_per_s < inside.steps_range[1]


# -- the processes runtime's measured overlap ----------------------------------------------------
def test_the_processes_overlap_factor_from_the_profile_reaches_the_prediction(cache, monkeypatch):
    cfg = config(**{"replay.kind": "uniform"})
    workload = workload_from_config(cfg)
    runner = FakeRunner()
    tasks = prof.profile(cfg, envs=(1, 4), kernels=("fused",), runner=runner)
    cand = Candidate("uniform", "cpu", "cpu", "fused", 4, 64, runtime="processes", actors=1)
    bound_us = 1e6 / predict(cand, prof._measured_costs(workload, tasks)).steps_per_s
    # the one-actor processes runs take 1.8 x the schedule's bound: the profile keeps that factor
    runner = FakeRunner(processes_step_us=1.8 * bound_us)
    tables = prof.profile(cfg, envs=(1, 4), kernels=("fused",), overlap=True, use_cache=False, runner=runner)
    assert tables["processes1|fused"]["4"] == pytest.approx(1.8, rel=1e-3)
    assert {c.actors for c in runner.asked if c.runtime == "processes"} == {1}  # no time-sharing runs asked
    costs = Costs(load_platform("ci_2core"), workload, tables)
    calibrated = predict(cand, costs)
    assert 1e6 / calibrated.steps_per_s == pytest.approx(1.8 * bound_us, rel=1e-3)
    assert calibrated.factor_source == "measured" and calibrated.summary()["runtime_factor"] == "measured"
    # a kernel not profiled borrows the factor, marked extrapolated; no profile: unmeasured
    assert costs.processes_overlap(Candidate("uniform", "cpu", "cpu", "torch", 4, 64, runtime="processes")) == (
        pytest.approx(tables["processes1|fused"]["4"]), "extrapolated")
    assert predict(cand, Costs(load_platform("ci_2core"), workload)).factor_source == "unmeasured"


# -- which machine -------------------------------------------------------------------------------
def test_cpu_models_are_matched_by_the_platform_names_words():
    assert same_cpu_model("Intel Xeon (KVM guest, 2 vCPUs)", "Intel(R) Xeon(R) Processor")
    assert same_cpu_model("Intel Xeon", "Intel(R) Xeon(R) Platinum 8480+ CPU @ 2.00GHz")
    assert not same_cpu_model("Intel Xeon (KVM guest, 2 vCPUs)", "AMD EPYC 7763 64-Core Processor")
    assert not same_cpu_model("AMD EPYC 7763", "AMD EPYC 9654 96-Core Processor")
    assert not same_cpu_model("(notes only)", "Intel(R) Xeon(R) Processor")


XEON = "Intel(R) Xeon(R) Processor"  # what /proc/cpuinfo says on the machine ci_2core.yaml describes


def test_autotune_flags_a_cpu_model_the_platform_file_does_not_describe(cache, monkeypatch):
    cfg = config()
    monkeypatch.setattr(prof, "this_cpu_model", lambda: XEON)  # whatever CPU runs the tests
    prof.profile(cfg, envs=(1, 4), runner=FakeRunner())
    assert not autotune(cfg, platform="ci_2core").warnings  # the file's Xeon, profiled on it
    monkeypatch.setattr(prof, "this_cpu_model", lambda: "AMD EPYC 7763 64-Core Processor")
    result = autotune(cfg, platform="ci_2core")
    assert any("this machine's CPU model is 'AMD EPYC 7763" in w and "ci_2core.yaml" in w for w in result.warnings)
    # the cached profile records the CPU it was measured on: a file for another CPU is flagged too
    path = prof.cache_path()
    data = json.loads(path.read_text())
    for entry in data["workloads"].values():
        entry["cpu_model"] = "AMD EPYC 7763 64-Core Processor"
    monkeypatch.setattr(prof, "this_cpu_model", lambda: XEON)
    path.write_text(json.dumps(data))
    warnings = autotune(cfg, platform="ci_2core").warnings
    assert len(warnings) == 1 and "the profile was measured on CPU model 'AMD EPYC" in warnings[0]


def test_the_cli_says_so_and_labels_power_modelled(cache, monkeypatch, capsys):
    from pearl.cli import main

    monkeypatch.setattr(prof, "this_cpu_model", lambda: "AMD EPYC 7763 64-Core Processor")
    assert main(["autotune", "--platform", "ci_2core", "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "warning: this machine's CPU model is 'AMD EPYC" in out
    head = next(line for line in out.splitlines() if "plan" in line and "steps/s" in line)
    assert "W modelled" in head and "samples/J modelled" in head and "range" in head
    assert "modelled" in out.split("why:")[1]


# -- platform files ------------------------------------------------------------------------------
PLATFORM = """name: t
devices:
  - id: cpu
    kind: cpu
    name: C
    cores: 2
    clock_mhz: 2000
    peak_gflops: 100
    memory_bandwidth_gb_s: 20
    call_overhead_us: 5
    power_w: {idle: 3, tdp: 12}
links: []
"""


@pytest.mark.parametrize("field,value", [("peak_gflops", ".nan"), ("memory_bandwidth_gb_s", ".inf"),
                                         ("call_overhead_us", "-.inf"), ("peak_gflops", "0"),
                                         ("clock_mhz", "-5"), ("call_overhead_us", ".nan")])
def test_platform_files_with_nan_inf_or_impossible_figures_are_refused_in_one_line(tmp_path, field, value):
    path = tmp_path / "bad.yaml"
    path.write_text("\n".join(f"    {field}: {value}" if line.strip().startswith(f"{field}:") else line
                               for line in PLATFORM.splitlines()))
    with pytest.raises(ConfigError) as err:
        load_platform(path)
    message = str(err.value)
    assert "\n" not in message and str(path) in message and f"devices[0].{field}: expected a" in message
    path.write_text(PLATFORM)
    assert load_platform(path).host.peak_gflops == 100


# -- power sensors -------------------------------------------------------------------------------
def fake_rapl(root, packages=(("package-0", 1_000_000),), wrap=262_143_328_850):
    for i, (name, uj) in enumerate(packages):
        zone = root / f"intel-rapl:{i}"
        zone.mkdir(parents=True)
        (zone / "name").write_text(name + "\n")
        (zone / "energy_uj").write_text(f"{uj}\n")
        (zone / "max_energy_range_uj").write_text(f"{wrap}\n")
        sub = root / f"intel-rapl:{i}:0"  # a subzone (core) is part of the package: never summed
        sub.mkdir()
        (sub / "name").write_text("core\n")
        (sub / "energy_uj").write_text("5\n")
    (root / "intel-rapl-mmio:0").mkdir()  # repeats package 0's counter
    (root / "intel-rapl-mmio:0" / "energy_uj").write_text("7\n")


def test_rapl_package_counters_are_read_summed_and_unwrapped(tmp_path):
    fake_rapl(tmp_path, (("package-0", 1_000_000), ("package-1", 2_000_000)), wrap=10_000_000)
    sensors = Sensors(rapl_counters(tmp_path))
    assert sensors.source == "rapl package-0 + rapl package-1"
    snapshot = sensors.read()
    (tmp_path / "intel-rapl:0" / "energy_uj").write_text("3500000\n")  # +2.5 J
    (tmp_path / "intel-rapl:1" / "energy_uj").write_text("500000\n")  # wrapped: +8.5 J
    assert sensors.joules_since(snapshot) == pytest.approx(2.5 + 8.5)
    assert not Sensors(rapl_counters(tmp_path / "none"))  # no powercap tree: no sensor


def test_measure_reports_the_watts_a_fake_rapl_counter_read(tmp_path, monkeypatch):
    from pearl import measure

    fake_rapl(tmp_path)
    monkeypatch.setenv("PEARL_POWERCAP_ROOT", str(tmp_path))
    energy = tmp_path / "intel-rapl:0" / "energy_uj"
    stop, started = threading.Event(), time.perf_counter()

    def draw_ten_watts():  # the counter rises 10 J per second, as a package drawing 10 W would
        for _ in range(2000):  # bounded: ~20 s at most
            if stop.wait(0.01):
                return
            staged = energy.with_suffix(".new")  # sysfs reads are atomic: so is this fake's update
            staged.write_text(f"{1_000_000 + int(10e6 * (time.perf_counter() - started))}\n")
            os.replace(staged, energy)

    thread = threading.Thread(target=draw_ten_watts, daemon=True)
    thread.start()
    try:
        run = measure.measure_many(config(**{"replay.kind": "uniform"}),
                                   [Candidate("uniform", "cpu", "cpu", "fused", 1, 32)], seconds=0.4)[0]
    finally:
        stop.set()
        thread.join(5)
    assert run["power_source"] == "rapl package-0"
    assert run["watts"] == pytest.approx(10.0, rel=0.3)
    assert run["samples_per_j"] == pytest.approx(run["steps_per_s"] / run["watts"])


# -- the analytic model's cpu regime -------------------------------------------------------------
def test_analytic_cpu_kernels_reach_a_fraction_of_peak_and_n_step_costs_the_insert():
    from pearl.estimator import costs as costs_module
    from pearl.kernels.registry import backend

    platform = load_platform("ci_2core")
    host = platform.host
    big = workload_from_config(config(**{"dqn.hidden": [256, 256], "dqn.batch_size": 128}))
    costs = Costs(platform, big)
    cand = Candidate("uniform", "cpu", "cpu", "fused", 1, 128)
    sig = costs.signature("learn", cand)
    compute = sig.flops / (host.peak_gflops / host.cores * 1e9 * costs_module.CPU_KERNEL_EFFICIENCY)
    assert compute > sig.bytes / (host.memory_bandwidth_gb_s / host.cores * 1e9)  # 256-wide: compute-bound
    calls = backend("cpu").calls("learn", "fused", "dqn")
    assert costs.task_seconds("learn", cand) == (pytest.approx(calls * host.call_overhead_us * 1e-6 + compute),
                                                 "analytic")
    # the n-step buffer's per-round work is the insert's, only when there is one
    one, three = (Costs(platform, workload_from_config(config(**{"dqn.n_step": n}))) for n in (1, 3))
    extra = three.task_seconds("insert", cand)[0] - one.task_seconds("insert", cand)[0]
    assert extra == pytest.approx(costs_module.NSTEP_CALLS_PER_ROUND * host.call_overhead_us * 1e-6)
