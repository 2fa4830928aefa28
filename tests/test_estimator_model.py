"""The plan model (estimator/model.py) and task costs (estimator/costs.py) on hand-made tables:
the sequential sum, the overlapped schedule and the paper's formula, power, interpolation,
transfers, and the analytic roofline."""
from __future__ import annotations

import pytest

from pearl.estimator.costs import Costs
from pearl.estimator.model import Candidate, calls_per_step, predict
from pearl.estimator.workload import Workload
from pearl.platforms import load_platform
from pearl.plan import Plan

W = Workload("CartPole-v1", 4, 2, (64, 64), "prioritized", 100_000, 16, 0.25, 1000)

PLATFORM = """name: t
devices:
  - {id: cpu, kind: cpu, name: C, cores: 4, clock_mhz: 2000, peak_gflops: 256, memory_bandwidth_gb_s: 40,
     call_overhead_us: 5, power_w: {idle: 10, tdp: 50}}
  - {id: cuda:0, kind: cuda, name: G, sms: 10, peak_gflops: 10000, memory_bandwidth_gb_s: 1000,
     launch_us: 5, power_w: {idle: 20, tdp: 220}}
  - {id: opencl:0, kind: opencl, name: O, peak_gflops: 500, memory_bandwidth_gb_s: 100, launch_us: 10,
     power_w: {idle: 5, tdp: 25}}
  - {id: opencl:1, kind: opencl, name: P, host: cpu, compute_units: 4, peak_gflops: 256, memory_bandwidth_gb_s: 40}
links:
  - {between: [cpu, cuda:0], kind: pcie, bandwidth_gb_s: 10, latency_us: 10}
  - {between: [cpu, opencl:0], kind: pcie, bandwidth_gb_s: 5, latency_us: 20}
  - {between: [cpu, opencl:1], kind: mem, bandwidth_gb_s: 10, latency_us: 1}
"""


@pytest.fixture
def platform(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text(PLATFORM)
    return load_platform(path)


def tables(replay="prioritized@cpu", learn="fused@cpu", act=40.0, insert=10.0, sample=20.0, learn_us=100.0,
           update=15.0, sync=4.0, round_=3.0, per_update=1.0):
    return {"act@cpu": {"1": act, "4": 4 * act}, f"insert|{replay}": {"1": insert, "4": 2 * insert},
            f"sample|{replay}": {"64": sample, "128": 2 * sample}, f"learn|{learn}": {"64": learn_us, "128": 1.5 * learn_us},
            f"update_priorities|{replay}": {"64": update}, f"sync_weights|{learn}": {"0": sync},
            "overhead|round": {"0": round_}, "overhead|update": {"0": per_update}}


def test_sequential_model_is_the_runtime_loop_per_env_step(platform):
    cand = Candidate("prioritized", "cpu", "cpu", "fused", 1, 64)
    p = predict(cand, Costs(platform, W, tables()))
    u = W.updates_per_step
    step_us = 40 + 10 + u * (20 + 100 + 15 + 4) + 3 + u * 1
    assert p.steps_per_s == pytest.approx(1e6 / step_us)
    assert p.updates_per_s == pytest.approx(u * 1e6 / step_us)
    assert p.bottleneck == "act" and set(p.sources.values()) == {"measured"}
    # Four envs per actor: act and insert once per 4 env steps; uniform replay has no priorities.
    four = predict(Candidate("prioritized", "cpu", "cpu", "fused", 4, 64), Costs(platform, W, tables()))
    assert four.step_us["act"] == pytest.approx(40) and four.step_us["insert"] == pytest.approx(5)
    assert calls_per_step("update_priorities", Candidate("uniform", "cpu", "cpu", "fused", 1, 64), 0.25) == 0
    assert calls_per_step("sync_weights", Candidate("uniform", "cpu", "cpu", "fused", 1, 64, 4), 0.25) == 0.0625


def test_measured_tables_interpolate_between_sizes_and_never_from_one_point(platform):
    costs = Costs(platform, W, tables())
    s, source = costs.task_seconds("sample", Candidate("prioritized", "cpu", "cpu", "fused", 1, 96))
    assert source == "interpolated" and s == pytest.approx(30e-6)  # halfway between 64 (20) and 128 (40)
    s, source = costs.task_seconds("act", Candidate("prioritized", "cpu", "cpu", "fused", 16, 64))
    assert source == "extrapolated" and s == pytest.approx((40 + (160 - 40) * 15 / 3) * 1e-6)  # from 1 and 4 envs
    assert costs.task_seconds("act", Candidate("prioritized", "cpu", "cpu", "fused", 4, 64))[1] == "measured"
    # update_priorities was measured at one batch size only: another size falls back to the model
    _, source = costs.task_seconds("update_priorities", Candidate("prioritized", "cpu", "cpu", "fused", 1, 128))
    assert source == "analytic"


def test_overlapped_schedule_is_the_papers_formula_when_replay_and_learner_are_apart(platform):
    """T_iter = T_sample + max(T_update + T_insert, T_learn), per update (act negligible here)."""
    t = tables(replay="prioritized@opencl:0", learn="torch@cuda:0", act=0.001, round_=0.0, per_update=0.0,
               sync=0.0, insert=30, sample=20, update=50, learn_us=60)
    costs = Costs(platform, W, t)
    cand = Candidate("prioritized", "opencl:0", "cuda:0", "torch", 1, 64)
    u = W.updates_per_step
    # per env step: one insert, u x (sample, update, learn)
    over = predict(cand, costs, "overlapped")
    expected = u * 20 + max(30 + u * 50, u * 60)
    assert 1e6 / over.steps_per_s == pytest.approx(expected, rel=1e-4)
    assert over.bottleneck in ("insert", "update_priorities")
    learn_bound = predict(cand, Costs(platform, W, {**t, "learn|torch@cuda:0": {"64": 400.0}}), "overlapped")
    assert 1e6 / learn_bound.steps_per_s == pytest.approx(u * 20 + u * 400, rel=1e-4)
    assert learn_bound.bottleneck == "learn"
    # All on one device nothing overlaps: the overlapped schedule is the sequential sum.
    same = Candidate("prioritized", "cpu", "cpu", "fused", 1, 64)
    assert (predict(same, Costs(platform, W, tables()), "overlapped").steps_per_s
            == pytest.approx(predict(same, Costs(platform, W, tables())).steps_per_s))
    with pytest.raises(ValueError, match="schedule"):
        predict(same, costs, "parallel")


def test_power_counts_used_devices_idle_plus_dynamic_times_utilisation(platform):
    cpu_only = predict(Candidate("prioritized", "cpu", "cpu", "fused", 1, 64), Costs(platform, W, tables()))
    # The runtime's one thread keeps 1 of 4 cores busy; the GPU and OpenCL card are not used.
    assert cpu_only.device_w == {"cpu": pytest.approx(10 + 40 * 0.25)}
    assert cpu_only.samples_per_j == pytest.approx(cpu_only.steps_per_s / cpu_only.watts)
    t = tables(replay="prioritized@opencl:0")
    card = predict(Candidate("prioritized", "opencl:0", "cpu", "fused", 1, 64), Costs(platform, W, t))
    u = W.updates_per_step
    busy = 10 + u * (20 + 15)  # insert + sample + update_priorities per env step, measured = all active
    util = busy / (1e6 / card.steps_per_s)
    assert card.utilisation["opencl:0"] == pytest.approx(util)
    assert card.device_w["opencl:0"] == pytest.approx(5 + 20 * util)
    # An OpenCL device on the host has no watts of its own: its kernels occupy the host's cores.
    host = predict(Candidate("prioritized", "opencl:1", "cpu", "fused", 1, 64),
                   Costs(platform, W, tables(replay="prioritized@opencl:1")))
    assert "opencl:1" not in host.device_w and host.utilisation["cpu"] > 0.25


def test_analytic_costs_roofline_launches_and_transfers(platform):
    costs = Costs(platform, W)  # nothing measured
    cand = Candidate("prioritized", "cpu", "cuda:0", "torch", 1, 64)
    gpu = platform.device("cuda:0")
    sig = costs.signature("learn", cand)
    seconds, source = costs.task_seconds("learn", cand)
    assert source == "analytic"
    assert seconds == pytest.approx(70 * 5e-6 + max(sig.flops / 1e13, sig.bytes / 1e12))
    assert costs.active_seconds("learn", cand) == pytest.approx(max(sig.flops / 1e13, sig.bytes / 1e12))
    # The batch crosses PCIe to the GPU each update, the |td| come back, the weights go to the actor.
    moves = costs.transfers(cand)
    link = platform.link("cpu", "cuda:0")
    u = W.updates_per_step
    assert moves[("cpu", "cuda:0")] == pytest.approx(u * link.transfer_s(64 * (W.transition_bytes + 16)))
    assert moves[("cuda:0", "cpu")] == pytest.approx(u * (link.transfer_s(64 * 12) + link.transfer_s(W.n_params * 4)))
    p = predict(cand, costs)
    assert p.step_us["transfer cpu->cuda:0"] > 0 and p.device_w["cuda:0"] < gpu.power_w(1.0)
    # A measured end includes the runtime's copy: no transfer is added for it.
    t = tables(learn="torch@cuda:0")
    assert ("cpu", "cuda:0") not in Costs(platform, W, t).transfers(cand)
    # Bigger batches cost more on a roofline; FPGA tasks come from the HLS model, labelled simulated.
    big = Candidate("prioritized", "cpu", "cpu", "fused", 1, 1024)
    assert costs.task_seconds("learn", big)[0] > costs.task_seconds("learn", Candidate("prioritized", "cpu", "cpu", "fused", 1, 64))[0]
    mixed = load_platform("cpu_gpu_fpga")
    s, source = Costs(mixed, W).task_seconds("sample", Candidate("prioritized", "fpga:0", "cpu", "fused", 1, 64))
    assert source == "simulated" and s > 0
    assert predict(Candidate("prioritized", "fpga:0", "cpu", "fused", 1, 64), Costs(mixed, W)).simulated


def test_a_replay_context_table_wins_over_the_context_free_one(platform):
    t = {**tables(), "act@cpu|in prioritized@opencl:1": {"1": 70.0, "4": 100.0}}
    costs = Costs(platform, W, t)
    beside_pocl = Candidate("prioritized", "opencl:1", "cpu", "fused", 1, 64)
    assert costs.task_seconds("act", beside_pocl) == (pytest.approx(70e-6), "measured")
    assert costs.task_seconds("act", Candidate("prioritized", "cpu", "cpu", "fused", 1, 64))[0] == pytest.approx(40e-6)


def test_threaded_schedule_is_the_slower_thread_or_the_measured_contention(platform):
    cand = Candidate("prioritized", "cpu", "cpu", "fused", 1, 64, runtime="threaded")
    u = W.updates_per_step
    actor = 40 + 10 + u * 4 + 3  # act, insert, weight loads, per-round loop overhead
    learner = u * (20 + 100 + 15) + u * 1
    free = predict(cand, Costs(platform, W, tables()))
    assert free.schedule == "threaded" and 1e6 / free.steps_per_s == pytest.approx(max(actor, learner))
    assert free.bottleneck == "act"
    contended = predict(cand, Costs(platform, W, {**tables(), "threaded|fused": {"0": 1.2}}))
    assert 1e6 / contended.steps_per_s == pytest.approx(1.2 * (actor + learner))
    assert cand.to_plan().runtime == "threaded" and "threaded" in cand.label()
    assert Candidate("uniform", "cpu", "cpu", "fused", 1, 64).to_plan().runtime == "sequential"


def test_processes_schedule_is_actors_learner_or_shared_cores(platform, tmp_path):
    """Per env step: actors A = act + ring write + weight loads; learner L = insert of a drained
    run of R transitions (R = the runtime's allowance) / R + the loop's time per pass / (N x R)
    + sample + learn + update_priorities + publish + the loop's per update; the step is
    max(A / min(N, cores), L, (A + L) / cores), x the time-sharing factor when N + 1 > cores."""
    from pearl.runtime.processes import allowance

    t = {**tables(act=60.0), "insert|prioritized@cpu": {"1": 10.0, "4": 16.0},  # 8 + 2 x transitions
         "ring_write": {"1": 5.0, "4": 8.0}}
    u = W.updates_per_step

    def learner(n):
        run = allowance(u, n, 1)
        return (8 + 2 * run) / run + 3 / (n * run) + u * (20 + 100 + 15 + 4) + u * 1

    def actors(n):  # one round per env step at E1; each actor loads every published version
        return 60 + 5 + min(n * u, 1.0) * 4

    def cand(n):
        return Candidate("prioritized", "cpu", "cpu", "fused", 1, 64, runtime="processes", actors=n)

    one = predict(cand(1), Costs(platform, W, t))
    assert one.schedule == "processes" and 1e6 / one.steps_per_s == pytest.approx(actors(1))
    assert one.limiting_side == "actors" and one.bottleneck == "act"
    assert one.sides == pytest.approx({"actors": actors(1), "learner": learner(1),
                                       "cores": (actors(1) + learner(1)) / 4})
    assert one.call_us["insert"] == pytest.approx(8 + 2 * allowance(u, 1, 1))  # a whole run per insert
    two = predict(cand(2), Costs(platform, W, t))  # two actors halve A: the learner limits
    assert 1e6 / two.steps_per_s == pytest.approx(learner(2))
    assert two.limiting_side == "learner" and two.bottleneck == "learn"
    # The cpu's watts count the cores the processes keep busy: (A + L) / T of 4.
    busy = (actors(2) + learner(2)) / learner(2)
    assert two.utilisation["cpu"] == pytest.approx(busy / 4)
    assert two.device_w["cpu"] == pytest.approx(10 + 40 * busy / 4)
    # On 2 cores, 3 actors and the learner time-share them.
    small = tmp_path / "two.yaml"
    small.write_text(PLATFORM.replace("cores: 4, clock_mhz", "cores: 2, clock_mhz"))
    shared = predict(cand(3), Costs(load_platform(small), W, t))
    assert 1e6 / shared.steps_per_s == pytest.approx((actors(3) + learner(3)) / 2)
    assert shared.limiting_side == "cores" and shared.utilisation["cpu"] == pytest.approx(1.0)
    # The measured time-sharing factor applies only where the processes outnumber the cores.
    factor = Costs(platform, W, {**t, "processes|fused": {"0": 1.2}})
    assert 1e6 / predict(cand(2), factor).steps_per_s == pytest.approx(learner(2))
    assert 1e6 / predict(cand(4), factor).steps_per_s == pytest.approx(1.2 * learner(4))
    # Unmeasured, a ring write is RING_WRITE_CALLS calls plus the copy at one core's bandwidth.
    analytic = Costs(platform, W, tables()).ring_write_seconds(cand(1))
    assert analytic == pytest.approx(5e-6 + W.transition_bytes / (40e9 / 4))
    plan = Plan.from_yaml(cand(3).to_plan().to_yaml())
    assert (plan.runtime, plan.actors, plan.envs_per_actor) == ("processes", 3, 1)
    assert "processes x3" in cand(3).label()
