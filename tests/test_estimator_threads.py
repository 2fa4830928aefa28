"""The learner's threads as a plan choice (Plan.learner_threads, issue 19): the mapper offers more
than one only onto cores the learner can have while it learns and only to learners whose products
split (torch's threads; the fused DQN step's pairs, at 2), the cost model prices each thread count
from its own profile table (analytic: the FLOP time divided by product_thread_speedup), the
processes model charges the learn once per thread on the shared cores, the profile's grid times
them, and a ranked candidate becomes a Plan that sets the learner's threads."""
from __future__ import annotations

import pytest

from pearl.estimator import costs as costs_module
from pearl.estimator.costs import Costs, product_thread_speedup
from pearl.estimator.mapper import candidates, learner_threads
from pearl.estimator.model import Candidate, predict
from pearl.estimator.workload import Workload
from pearl.plan import Plan
from pearl.platforms import load_platform

PENDULUM = dict(env="Pendulum-v1", obs_dim=3, n_actions=1, hidden=(400, 300), replay_kind="uniform",
                capacity=100_000, fanout=16, updates_per_step=1.0, learning_starts=100, batch_size=256, algo="ddpg")
CARTPOLE = dict(env="CartPole-v1", obs_dim=4, n_actions=2, hidden=(64, 64), replay_kind="uniform", capacity=1000,
                fanout=16, updates_per_step=0.25, learning_starts=100)


def test_learner_threads_go_only_onto_cores_the_learner_can_have():
    ddpg, dqn = Workload(**PENDULUM), Workload(**CARTPOLE)
    # sequential: the actor waits for the learner, every core is free
    assert learner_threads(2, ddpg, "cpu", "fused", "sequential") == [1, 2]
    assert learner_threads(8, ddpg, "cpu", "torch", "sequential") == [1, 2, 3, 4, 6, 8]
    # the threaded runtime's actor thread keeps a core; actor processes wait once ahead, and the
    # model charges a learner's threads on the shared cores (the test below on the processes model)
    assert learner_threads(2, ddpg, "cpu", "fused", "threaded") == [1]
    assert learner_threads(4, ddpg, "cpu", "fused", "threaded") == [1, 2, 3]
    assert learner_threads(2, ddpg, "cpu", "fused", "processes") == [1, 2]
    assert learner_threads(4, ddpg, "cpu", "fused", "processes") == [1, 2, 3, 4]
    # the fused DQN learner takes a second thread only where its products pair, and never a third;
    # DQN's torch learner splits its products
    assert learner_threads(2, dqn, "cpu", "fused", "sequential") == [1]
    assert learner_threads(2, dqn, "cpu", "torch", "sequential") == [1, 2]
    zoo_dqn = Workload(**{**CARTPOLE, "hidden": (256, 256), "batch_size": 64})
    assert learner_threads(2, zoo_dqn, "cpu", "fused", "sequential") == [1, 2]
    assert learner_threads(8, zoo_dqn, "cpu", "fused", "sequential") == [1, 2]
    assert learner_threads(2, zoo_dqn, "cpu", "fused", "threaded") == [1]
    assert learner_threads(2, zoo_dqn, "cpu", "fused", "processes") == [1, 2]
    assert learner_threads(2, Workload(**{**CARTPOLE, "hidden": (256, 256), "batch_size": 64, "dueling": True}),
                           "cpu", "fused", "sequential") == [1]
    # a GPU learner, a ray plan: one
    assert learner_threads(2, ddpg, "cuda:0", "torch", "sequential") == [1]
    assert learner_threads(2, ddpg, "cpu", "fused", "ray") == [1]
    assert learner_threads(1, ddpg, "cpu", "fused", "sequential") == [1]


def test_the_mapper_offers_thread_counts_by_runtime():
    platform = load_platform("ci_2core")
    cands, _ = candidates(platform, Workload(**PENDULUM), envs=(1,), batches=(256,),
                          runtimes=("sequential", "threaded", "processes"))
    threads = {(c.runtime, c.learner_kernel, c.actors): set() for c in cands}
    for c in cands:
        threads[(c.runtime, c.learner_kernel, c.actors)].add(c.threads)
    assert threads[("sequential", "fused", 1)] == threads[("sequential", "torch", 1)] == {1, 2}
    assert threads[("processes", "fused", 1)] == threads[("processes", "fused", 2)] == {1, 2}
    assert all(ts == {1} for key, ts in threads.items() if key[0] == "threaded")
    dqn, _ = candidates(platform, Workload(**CARTPOLE), envs=(1,), batches=(64,))
    assert {(c.learner_kernel, c.threads) for c in dqn} == {("fused", 1), ("torch", 1), ("torch", 2)}


def test_a_thread_candidate_becomes_a_plan_that_round_trips():
    cand = Candidate("uniform", "cpu", "cpu", "fused", 1, 256, precision="bf16", threads=2)
    plan = cand.to_plan()
    assert plan.learner_threads == 2 and plan.learner_precision == "bf16" and cand.label().endswith("bf16 t2")
    assert Plan.from_yaml(plan.to_yaml()) == plan
    assert Candidate("uniform", "cpu", "cpu", "fused", 1, 256).to_plan().learner_threads == 1
    assert " t" not in Candidate("uniform", "cpu", "cpu", "fused", 1, 256).label()


def test_predictions_differ_by_threads_as_profiled():
    platform = load_platform("ci_2core")
    measured = {"learn|fused@cpu": {"256": 6000.0}, "learn|fused/t2@cpu": {"256": 5500.0},
                "learn|fused/bf16@cpu": {"256": 4500.0}, "learn|fused/bf16/t2@cpu": {"256": 4800.0},
                "act@cpu": {"1": 60.0}, "insert|uniform@cpu": {"1": 5.0}, "sample|uniform@cpu": {"256": 40.0},
                "sync_weights|fused@cpu": {"0": 20.0}, "overhead|round": {"0": 10.0}, "overhead|update": {"0": 5.0}}
    costs = Costs(platform, Workload(**PENDULUM), measured)
    pred = {(p, t): predict(Candidate("uniform", "cpu", "cpu", "fused", 1, 256, precision=p, threads=t), costs)
            for p in ("fp32", "bf16") for t in (1, 2)}
    learns = {("fp32", 1): 6000.0, ("fp32", 2): 5500.0, ("bf16", 1): 4500.0, ("bf16", 2): 4800.0}
    for (p, t), expected in learns.items():
        assert pred[(p, t)].call_us["learn"] == pytest.approx(expected) and pred[(p, t)].sources["learn"] == "measured"
    # the rest of the step is the same: the difference between thread counts is the learn's
    for p in ("fp32", "bf16"):
        gap = 1e6 / pred[(p, 1)].steps_per_s - 1e6 / pred[(p, 2)].steps_per_s
        assert gap == pytest.approx(pred[(p, 1)].call_us["learn"] - pred[(p, 2)].call_us["learn"])
    assert pred[("fp32", 2)].steps_per_s > pred[("fp32", 1)].steps_per_s
    assert pred[("bf16", 2)].steps_per_s < pred[("bf16", 1)].steps_per_s  # a second thread that loses, as measured
    # a thread count never reads another's table
    one = Costs(platform, Workload(**PENDULUM), {"learn|fused@cpu": {"256": 6000.0}})
    assert one.task_seconds("learn", Candidate("uniform", "cpu", "cpu", "fused", 1, 256, threads=2))[1] == "analytic"


def test_processes_charge_the_learners_threads_on_the_shared_cores():
    """A processes plan's learner on t threads takes t cores while it learns: the cores' side of
    the step counts its learn t times, so a second thread pays where the actors leave the cores
    idle (a learner-bound DDPG) and loses where they keep them busy."""
    platform = load_platform("ci_2core")

    def step_us(act_us, threads):
        measured = {"learn|fused@cpu": {"256": 5000.0}, "learn|fused/t2@cpu": {"256": 3600.0},
                    "act@cpu": {"1": act_us}, "insert|uniform@cpu": {"1": 5.0}, "sample|uniform@cpu": {"256": 40.0},
                    "sync_weights|fused@cpu": {"0": 20.0}}
        cand = Candidate("uniform", "cpu", "cpu", "fused", 1, 256, runtime="processes", actors=1, threads=threads)
        prediction = predict(cand, Costs(platform, Workload(**PENDULUM), measured))
        return 1e6 / prediction.steps_per_s, prediction.sides

    light_1, _ = step_us(100.0, 1)
    light_2, sides = step_us(100.0, 2)
    assert light_2 < light_1 and sides["cores"] == pytest.approx(
        (sides["actors"] + sides["learner"] + 3600.0) / 2, rel=0.05)
    busy_1, _ = step_us(4000.0, 1)
    busy_2, _ = step_us(4000.0, 2)
    assert busy_2 > busy_1


def test_analytic_threads_divide_the_flop_time(monkeypatch):
    from pearl.kernels.cpu.backend import CPUBackend

    monkeypatch.setattr(costs_module, "PRODUCT_THREAD_GAIN", 0.5)
    platform = load_platform("ci_2core")
    costs = Costs(platform, Workload(**PENDULUM))
    fixed = CPUBackend().calls("learn", "fused", "ddpg") * platform.device("cpu").call_overhead_us * 1e-6
    flop_s = {t: costs.task_seconds("learn", Candidate("uniform", "cpu", "cpu", "fused", 1, 256, threads=t))[0] - fixed
              for t in (1, 2)}
    assert product_thread_speedup(2) == 1.5 and flop_s[1] / flop_s[2] == pytest.approx(1.5)


def test_analytic_fused_dqn_gains_only_where_its_products_pair():
    from pearl.kernels.cpu.backend import CPUBackend

    platform = load_platform("ci_2core")
    costs = Costs(platform, Workload(**{**CARTPOLE, "hidden": (256, 256)}))
    fixed = CPUBackend().calls("learn", "fused", "dqn") * platform.device("cpu").call_overhead_us * 1e-6

    def flop_s(batch, threads):
        cand = Candidate("uniform", "cpu", "cpu", "fused", 1, batch, threads=threads)
        return costs.task_seconds("learn", cand)[0] - fixed

    # 256 x 256 pairs at batch 64 (4.2M multiply-adds), not at batch 8 (0.5M)
    assert flop_s(64, 1) / flop_s(64, 2) == pytest.approx(1 + costs_module.PAIRED_PRODUCT_GAIN)
    assert flop_s(8, 2) == pytest.approx(flop_s(8, 1))
    assert product_thread_speedup(2, pairs=True) == product_thread_speedup(4, pairs=True) > 1.0
    assert product_thread_speedup(2, pairs=False) == 1.0


def test_profile_grid_times_each_offered_thread_count(monkeypatch):
    from pearl import devices
    from pearl.estimator.profile import _grid

    monkeypatch.setattr(devices, "cpu_devices", lambda: [{"cores": 2, "name": "test", "memory_gib": 1}])
    grid = _grid([("uniform", "cpu")], (1, 4), (64, 128), ("fused", "torch"), Workload(**PENDULUM))
    assert {(c.learner_kernel, c.envs, c.batch) for c in grid if c.threads == 2} == {
        ("fused", 1, 64), ("fused", 1, 128), ("torch", 1, 64), ("torch", 1, 128)}
    monkeypatch.setattr(devices, "cpu_devices", lambda: [{"cores": 1, "name": "test", "memory_gib": 1}])
    grid = _grid([("uniform", "cpu")], (1, 4), (64, 128), ("fused", "torch"), Workload(**PENDULUM))
    assert {c.threads for c in grid} == {1}


class EngineRunner:
    """Profile runs whose learn is slower beside Gymnasium than beside EnvPool (as a loaded machine
    times them: the actor thread of an EnvPool plan sleeps, and the scheduler favours it)."""

    def profile_runs(self, config, cands, seconds):
        out = []
        for cand in cands:
            pool = cand.env_engine == "envpool"
            means = {"act": (60.0 if pool else 20.0) * cand.envs, "insert": 5.0 if pool else 6.0, "sample": 8.0,
                     "learn": 70.0 if pool else 180.0, "sync_weights": 2.0}
            out.append((means, {"rounds": 1000, "updates": 250, "wall_s": 0.5, "task_s": 0.45, "steps_per_s": 2000.0}))
        return out


def test_a_run_beside_another_env_engine_prices_only_its_own_engines_plans(tmp_path, monkeypatch):
    from pearl.config import apply_overrides, default_config_path, load_config
    from pearl.estimator import mapper
    from pearl.estimator import profile as prof
    from pearl.estimator.workload import workload_from_config

    monkeypatch.setenv("PEARL_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(mapper, "env_engines", lambda workload, measured=None: ("gymnasium", "envpool"))
    config = apply_overrides(load_config(default_config_path()), {"dqn.n_step": 1, "replay.kind": "uniform"})
    tables = prof.profile(config, envs=(1, 4), kernels=("fused",), runner=EngineRunner())
    assert tables["learn|fused@cpu"] == {"64": 180.0} and tables["insert|uniform@cpu"] == {"1": 6.0, "4": 6.0}
    assert tables["learn|fused@cpu|in uniform@cpu envpool"] == {"64": 70.0}
    costs = Costs(load_platform("ci_2core"), workload_from_config(config), tables)
    gym, pool = (Candidate("uniform", "cpu", "cpu", "fused", 4, 64, env_engine=e) for e in ("gymnasium", "envpool"))
    assert predict(gym, costs).call_us["learn"] == pytest.approx(180.0)
    assert predict(pool, costs).call_us["learn"] == pytest.approx(70.0)
    assert predict(pool, costs).call_us["act"] == pytest.approx(240.0)
    assert predict(pool, costs).call_us["insert"] == pytest.approx(5.0)


def test_measure_sets_each_agents_threads_before_its_window():
    import torch

    import pearl
    from pearl import measure

    before = torch.get_num_threads()
    try:
        agents = [pearl.DQN("CartPole-v1", plan=Plan(learner_threads=t), learner_kernel="torch", learning_starts=50)
                  for t in (2, 1)]
        assert torch.get_num_threads() == 1  # the last agent built set the process's threads
        for agent, threads in zip(agents, (2, 1)):
            assert measure._window(agent, 0.05, time_tasks=False)["steps"] > 0
            assert torch.get_num_threads() == threads
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("preset, expected", [(None, "PASSIVE"), ("ACTIVE", "ACTIVE")])
def test_the_cli_makes_openmp_threads_sleep_unless_the_user_chose(preset, expected):
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if preset:
        env["OMP_WAIT_POLICY"] = preset
    probe = "import os; from pearl.cli import main; main(['devices']); print(os.environ['OMP_WAIT_POLICY'])"
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == expected
