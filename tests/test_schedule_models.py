"""The runtimes' schedule models (pearl/schedule/models.py): one per runtime, lanes naming the
tasks, and the combination rules on hand-made figures."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pearl.plan import TASK_NAMES
from pearl.runtime import CLUSTER_RUNTIMES, RUNTIMES
from pearl.schedule import allowance
from pearl.schedule.models import MODELS, StepFigures


def test_every_runtime_has_a_model_whose_lanes_hold_its_tasks():
    runtimes = (*RUNTIMES, *CLUSTER_RUNTIMES)
    assert set(runtimes) <= set(MODELS) and set(MODELS) - set(runtimes) == {"overlapped"}
    for name in runtimes:
        lanes = MODELS[name].lanes
        placed = [task for tasks in lanes.values() for task in tasks if task in TASK_NAMES]
        assert sorted(placed) == sorted(TASK_NAMES), name  # every task on exactly one lane


def figures():
    call = {"act": 40.0, "insert": 10.0, "sample": 20.0, "learn": 100.0, "sync_weights": 4.0}
    step = {"act": 40.0, "insert": 10.0, "sample": 5.0, "learn": 25.0, "sync_weights": 1.0, "overhead": 3.0}
    return StepFigures(call, step, {"cpu": sum(step.values())}, 0.25)


CAND = SimpleNamespace(envs=1, actors=2, sync_interval=1, replay_device="cpu", device_of=lambda task: "cpu", threads=1)


def test_sequential_and_threaded_combinations():
    step = MODELS["sequential"].step(figures(), CAND, None)
    assert step.total_us == pytest.approx(84.0) and step.bottleneck == "act" and not step.sides
    costs = SimpleNamespace(overhead_parts_us=lambda cand: (2.0, 1.0), threaded_factor=lambda cand: 0.6)
    step = MODELS["threaded"].step(figures(), CAND, costs)
    actor, learner = 2.0 + 40 + 10 + 1, 1.0 + 5 + 25
    assert step.sides == pytest.approx({"actor": actor, "learner": learner, "contention": 0.6 * (actor + learner)})
    assert step.total_us == pytest.approx(actor) and step.bottleneck == "act"


def test_processes_model_runs_actors_beside_the_learner_on_the_hosts_cores():
    model = MODELS["processes"]
    run, pass_envs = model.insert_run(CAND, 0.25)
    assert run == allowance(0.25, 2, 1) and pass_envs == 2 * run
    costs = SimpleNamespace(ring_write_seconds=lambda cand: 2e-6, processes_factor=lambda cand: 1.5,
                            processes_overlap=lambda cand: (1.0, "unmeasured"),
                            platform=SimpleNamespace(host=SimpleNamespace(cores=2)))
    f = figures()
    step = model.step(f, CAND, costs)
    actors = 40 + 2 + min(2 * 0.25, 1.0) * 4.0  # act, ring write, weight loads
    learner = 10 + 5 + 25 + 1 + 3
    assert step.sides == pytest.approx({"actors": actors / 2, "learner": learner, "cores": (actors + learner) / 2})
    # three processes on two cores: time-shared, c = 1.5
    assert step.total_us == pytest.approx(1.5 * learner) and step.bottleneck == "learn"
    assert step.host_busy_cores == pytest.approx((actors + learner) / learner)
    # the measured one-actor overlap f multiplies every processes plan's step, alone or time-shared
    costs.processes_overlap = lambda cand: (1.3, "measured")
    assert model.step(figures(), CAND, costs).total_us == pytest.approx(1.3 * 1.5 * learner)
    one = SimpleNamespace(**{**vars(CAND), "actors": 1})
    bound = max(model.step(figures(), one, costs).sides.values())
    step = model.step(figures(), one, costs)
    assert step.total_us == pytest.approx(1.3 * bound) and step.factor_source == "measured"


def test_processes_plans_wait_for_the_host_cores_a_pocl_replay_takes():
    from pearl.platforms import load_platform

    model = MODELS["processes"]
    platform = load_platform("ci_2core")  # opencl:0 is PoCL on the same 2 cores
    costs = SimpleNamespace(ring_write_seconds=lambda cand: 2e-6, processes_factor=lambda cand: 1.0,
                            processes_overlap=lambda cand: (1.0, "unmeasured"), platform=platform)
    on_cpu = SimpleNamespace(**{**vars(CAND), "actors": 1})
    on_pocl = SimpleNamespace(**{**vars(on_cpu), "replay_device": "opencl:0",
                                 "device_of": lambda task: "opencl:0" if task in ("insert", "sample", "update_priorities")
                                 else "cpu"})
    f = figures()
    replay_us = f.step_us["insert"] + f.step_us["sample"]
    cores = model.step(figures(), on_cpu, costs).sides["cores"]
    # its kernels take both cores while they run: the replay's time counts twice on the cores' side
    assert model.step(figures(), on_pocl, costs).sides["cores"] == pytest.approx(cores + replay_us / 2)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2000), st.sampled_from([0.01, 0.25, 0.37, 1.0, 3.0]), st.integers(0, 10**6),
       st.sampled_from([None, 4, 64]), st.integers(1, 16))
def test_next_increase_is_the_first_step_with_more_updates_due(learning_starts, ratio, env_steps, train_freq, gradient_steps):
    from pearl.schedule import Schedule

    schedule = Schedule(learning_starts, ratio if train_freq is None else gradient_steps / train_freq, 32,
                        train_freq=train_freq, gradient_steps=gradient_steps if train_freq else 1)
    found = schedule.next_increase(env_steps)
    already = schedule.due(env_steps)
    assert found > env_steps and schedule.due(found) > already
    assert all(schedule.due(step) == already for step in range(env_steps + 1, found))


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2000), st.sampled_from([0.01, 0.25, 0.37, 1.0, 3.0]), st.integers(0, 10**5),
       st.integers(0, 10**4), st.integers(0, 3000), st.integers(0, 5000), st.sampled_from([None, 4, 64]),
       st.integers(1, 16))
def test_a_restarted_schedule_goes_on_from_the_counts_once_the_table_refills(
        learning_starts, ratio, at, updates, stored, later, train_freq, gradient_steps):
    """Restarted at env step `at` with `updates` made and `stored` transitions in the table: none due
    until the table holds learning_starts again, then the ratio from there, as a fresh run's
    schedule counts from its start; next_increase agrees with due."""
    from pearl.schedule import Schedule

    fresh = Schedule(learning_starts, ratio if train_freq is None else gradient_steps / train_freq, 32,
                     train_freq=train_freq, gradient_steps=gradient_steps if train_freq else 1)
    restarted = fresh.restarted(at, updates, stored, learning_starts)
    wait = max(0, learning_starts - stored)
    assert restarted.due(at) == updates and restarted.due(at + wait) == updates
    if train_freq is None:  # (bursts fall on multiples of train_freq counted from step 0)
        assert restarted.due(at + wait + later) == updates + Schedule(0, fresh.updates_per_step, 32).due(later)
    else:
        assert restarted.due(at + wait + later) - updates == \
            Schedule(at + wait, fresh.updates_per_step, 32, train_freq=train_freq, gradient_steps=gradient_steps).due(
                at + wait + later)
    step = at + later
    found = restarted.next_increase(step)
    assert found > step and restarted.due(found) > restarted.due(step)
    assert all(restarted.due(s) == restarted.due(step) for s in range(step + 1, min(found, step + 5000)))
