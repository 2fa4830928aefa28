"""The processes runtime (pearl/runtime/processes.py) keeps the sequential runtime's semantics:
the exact replay ratio at the end and a bounded lead of the actors during the run, every
transition inserted once, target updates and weight syncs; a killed actor is restarted and the run
goes on; an actor's exception stops the run with its message; continuous-action agents run too."""
import os
import threading
import signal

import numpy as np
import pytest

import pearl
from pearl.errors import ConfigError, PearlError
from pearl.plan import Plan
from pearl.runtime import processes
from pearl.schedule import MAX_LAG, allowance

FAST = dict(total_steps=4000, learning_starts=500, target_update_interval=200, hidden=[32, 32])


def in_processes(**plan):
    # the actor processes do every step: what these tests check is their pipeline (a run short
    # enough for a test could otherwise be done by the learner's own actor while they start)
    return Plan(runtime="processes", act_while_actors_start=False, **plan)


def due(agent, ratio, learning_starts=500):
    return int(max(0, agent.env_steps - learning_starts) * ratio)


@pytest.fixture(params=["fork", "exec"])
def start(request, monkeypatch):
    """How the actor processes start (`_ActorProcesses.start`): as forks of the learner's process
    (the default on Linux) or as fresh interpreters (elsewhere, and for what fork does not suit)."""
    if request.param == "exec":
        monkeypatch.setattr(processes, "fork_actors", lambda parts: False)
    return request.param


def started_as(pid: int) -> str:
    """'exec' for a fresh interpreter running ACTOR_BOOT, 'fork' for a copy of this process."""
    command = open(f"/proc/{pid}/cmdline", "rb").read()
    return "exec" if b"actor_main" in command else "fork"


@pytest.mark.parametrize("ratio,actors,envs,replay", [(0.25, 1, 1, "uniform"), (1.0, 2, 1, "prioritized"),
                                                      (0.5, 2, 3, "uniform"), (2.0, 1, 2, "amper")])
def test_replay_ratio_exact_at_the_end_and_actors_lead_bounded(ratio, actors, envs, replay, start):
    agent = pearl.DQN("CartPole-v1", plan=in_processes(actors=actors, envs_per_actor=envs), replay=replay,
                      **{**FAST, "updates_per_step": ratio})
    seen = []

    def watch(a):
        # the actors' own env steps, which may be ahead of what the learner took in
        seen.append((sum(c.totals()[2] for c in a.actor_processes.channels), a.updates))

    summary = agent.train(3000)
    quota = -(-3000 // (actors * envs)) * envs
    assert agent.env_steps == actors * quota
    assert agent.updates == due(agent, ratio)
    assert agent.replay.inserted == agent.env_steps  # 1-step transitions: none lost
    stored = agent.replay.storage["obs"][:agent.replay.inserted]
    assert len(np.unique(stored, axis=0)) == len(stored)  # none duplicated
    assert summary["actor_restarts"] == 0
    ahead = allowance(ratio, actors, envs)
    # the actors share the learner's scheduling group (its session's autogroup): on a machine that
    # other sessions load they may run only while the learner waits, so a zero lead is legitimate
    assert 0 <= agent.actor_lead <= actors * ahead
    # while running, over the actors' own steps: the updates trail the count due by at most the
    # actors' allowances (MAX_LAG updates, at least a round each), so within 2% of the configured
    # ratio once 50x that many updates are due
    bound = int(np.ceil(actors * ahead * ratio))
    assert bound <= max(MAX_LAG["processes"], int(np.ceil(actors * envs * ratio)))
    run = max(4000, 500 + int(75 * bound / ratio))  # 1.5x the steps it takes to settle
    agent2 = pearl.DQN("CartPole-v1", plan=in_processes(actors=actors, envs_per_actor=envs), replay=replay,
                       **{**FAST, "updates_per_step": ratio, "total_steps": run})
    agent2.train(run, on_round=watch)
    lags = [int(max(0, produced - 500) * ratio) - updates for produced, updates in seen]
    assert 0 <= max(lags) <= bound
    settled = [updates / ((produced - 500) * ratio) for produced, updates in seen
               if (produced - 500) * ratio >= 50 * bound]
    assert len(settled) > 10 and max(abs(r - 1) for r in settled) < 0.02


def test_n_step_transitions_cross_the_rings_intact():
    agent = pearl.DQN("CartPole-v1", plan=in_processes(actors=2, envs_per_actor=2), n_step=3, **FAST)
    agent.train(2000)
    inserted, steps = agent.replay.inserted, agent.env_steps
    # each env still holds at most n_step - 1 steps whose returns are not known yet
    assert steps - 4 * 2 <= inserted <= steps
    storage = {k: v[:inserted] for k, v in agent.replay.storage.items()}
    assert set(np.unique(storage["actions"])) <= {0, 1}
    # discounts are gamma^k for k <= 3 steps, or 0 at a termination; CartPole's returns are sums of 1s
    gamma = agent.config.dqn.gamma
    allowed = {0.0, *(np.float32(gamma ** k) for k in (1, 2, 3))}
    assert set(np.unique(storage["discounts"]).tolist()) <= {float(x) for x in allowed}
    expected_returns = {float(np.float32(sum(gamma ** i for i in range(k)))) for k in (1, 2, 3)}
    assert set(np.unique(storage["rewards"]).tolist()) <= expected_returns


@pytest.mark.parametrize("lag", [None, 40])
def test_a_killed_actor_is_restarted_and_training_goes_on(capfd, start, lag):
    """Also in a deterministic run: the restarted actor (a new seed) goes on from its ring's rounds."""
    agent = pearl.DQN("CartPole-v1", plan=in_processes(actors=2, deterministic_lag=lag), **FAST)
    killed = []

    def kill_once(a):
        if a.env_steps >= 1200 and not killed:
            pid = a.actor_processes.processes[1].pid
            assert started_as(pid) == start
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    agent.train(4000, on_round=kill_once)
    assert killed
    assert agent.actor_restarts == 1
    assert agent.env_steps == 4000
    assert agent.updates == due(agent, 0.25)
    # only what the killed actor was still assembling (its unfinished 1-step transitions: none) is lost
    assert agent.replay.inserted == agent.env_steps
    assert "actor 1 died (exit code -9); restarting it" in capfd.readouterr().err


def test_an_actor_exception_stops_the_run_with_its_message(start):
    from actor_faults import ActorThatRaises

    agent = pearl.DQN("CartPole-v1", plan=in_processes(), **FAST)
    recipe = agent.parts.actor_recipe
    agent.parts.actor_recipe = processes.ActorRecipe(ActorThatRaises, recipe.policy_factory, recipe.kwargs)
    with pytest.raises(PearlError, match="actor 0 failed:(.|\n)*lost its licence"):
        agent.train(3000)
    assert agent.actor_processes is None  # actors stopped, shared memory released


def test_an_actor_that_cannot_start_stops_the_run(monkeypatch, start):
    import dataclasses
    import shutil
    import sys

    from actor_faults import ExitsBeforeReporting

    agent = pearl.DQN("CartPole-v1", plan=in_processes(), **FAST)
    if start == "exec":
        monkeypatch.setattr(sys, "executable", shutil.which("false"))  # exits 1 at once, reads nothing
    else:
        recipe = agent.parts.actor_recipe
        agent.parts.actor_recipe = ExitsBeforeReporting(**{f.name: getattr(recipe, f.name)
                                                           for f in dataclasses.fields(recipe)})
    with pytest.raises(PearlError, match="actor 0 exited with code 1 before it could report"):
        agent.train(2000)
    assert agent.actor_restarts == 0


def test_checkpoint_of_a_processes_run_loads_and_trains_on(tmp_path):
    agent = pearl.DQN("CartPole-v1", plan=in_processes(actors=2), replay="prioritized", **FAST)
    agent.train(1200)
    agent.save(tmp_path / "agent.npz")
    restored = pearl.load(tmp_path / "agent.npz")
    assert (restored.plan.runtime, restored.plan.actors) == ("processes", 2)
    assert (restored.env_steps, restored.updates) == (agent.env_steps, agent.updates)
    restored.train(400)
    assert restored.updates == due(restored, 0.25)
    # the actor processes never built an actor in the learner's process
    assert restored.parts._actor is None and agent.parts._actor is None


def test_continuous_agents_run_in_actor_processes():
    agent = pearl.TD3("Pendulum-v1", plan=in_processes(actors=2), total_steps=1200, learning_starts=300,
                      hidden=[32, 32], batch_size=32)
    agent.train()
    assert agent.env_steps == 1200 and agent.updates == 1200 - 300
    actions = agent.replay.storage["actions"][:agent.replay.inserted]
    assert actions.shape[1] == 1 and np.abs(actions).max() <= 1.0


def test_several_actors_need_the_processes_runtime():
    with pytest.raises(ConfigError, match="plan.actors: the sequential runtime runs 1 actor"):
        pearl.DQN("CartPole-v1", plan=Plan(actors=2), **FAST)


def test_cli_train_with_actor_processes(tmp_path, capsys):
    import json

    from pearl.cli import main

    run_dir = tmp_path / "run"
    assert main(["train", "--steps", "2000", "--runtime", "processes", "--actors", "2", "--run-dir",
                 str(run_dir), "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "processes runtime, 2 actors" in err
    result = json.loads((run_dir / "result.json").read_text())
    assert result["env_steps"] == 2000 and result["actor_restarts"] == 0
    tasks = set(result["task_us"])  # the actor processes' rounds, or the learner's own while they started
    assert {"insert", "sample", "learn"} <= tasks and ({"act", "act_wait", "act_cpu"} <= tasks
                                                       or "act_in_learner" in tasks)
    assert pearl.load(run_dir).plan.actors == 2
    assert main(["train", "--actors", "0"]) == 2
    assert capsys.readouterr().err.strip() == "pearl: error: --actors: expected an integer >= 1, got 0"


def test_cli_trains_a_deterministic_run_twice_alike(tmp_path, capsys):
    from pearl.cli import main

    for name in ("a", "b"):
        assert main(["train", "--steps", "2500", "--runtime", "processes", "--deterministic-lag", "32",
                     "--run-dir", str(tmp_path / name), "--quiet"]) == 0
    first, second = pearl.load(tmp_path / "a"), pearl.load(tmp_path / "b")
    assert first.plan.deterministic_lag == 32
    np.testing.assert_array_equal(first.parts.learner.policy_weights(), second.parts.learner.policy_weights())
    capsys.readouterr()
    assert main(["train", "--deterministic-lag", "-1", "--runtime", "processes"]) == 2
    assert capsys.readouterr().err.strip() == ("pearl: error: plan.deterministic_lag: expected an integer >= 0 "
                                               "(env steps) or null, got -1")


@pytest.mark.parametrize("replay", ["uniform", "prioritized"])
def test_prefetching_learner_keeps_the_counts(replay):
    agent = pearl.DQN("CartPole-v1", plan=in_processes(actors=2, prefetch=True), replay=replay,
                      **{**FAST, "updates_per_step": 1.0})
    summary = agent.train(3000, time_tasks=True)
    assert agent.updates == due(agent, 1.0) and agent.replay.inserted == agent.env_steps
    calls = agent.task_timer.calls
    assert calls["learn"] == calls["sample"] == agent.updates  # no batch drawn that was not learned
    if replay == "prioritized":
        assert calls["update_priorities"] == agent.updates  # every batch's priorities land
        priorities = agent.replay.tree.get(np.arange(agent.replay.size))
        assert len(np.unique(priorities)) > 100  # updated from the TD errors, not the insert default
    assert summary["updates_per_s"] > 0


def test_prefetch_needs_the_processes_runtime():
    with pytest.raises(ConfigError, match="plan.prefetch: the processes runtime prefetches"):
        Plan(prefetch=True).check()


def test_actors_infer_on_an_opencl_device():
    pytest.importorskip("pyopencl")
    from pearl.devices import opencl_devices

    if not opencl_devices():
        pytest.skip("no OpenCL device")
    plan = in_processes(actors=2, devices={**Plan().devices, "act": "opencl:0"})
    agent = pearl.DQN("CartPole-v1", plan=plan, **FAST)
    factory = agent.parts.actor_recipe.policy_factory
    assert factory.func.__name__ == "device_policy" and factory.args[-1] == "opencl:0"
    agent.train(2500)
    assert agent.env_steps == 2500 and agent.updates == due(agent, 0.25)
    assert agent.replay.inserted == agent.env_steps
    # the sequential runtime's actor on the same device acts like the cpu policy on the same weights
    sequential = pearl.DQN("CartPole-v1", plan=Plan(devices={**Plan().devices, "act": "opencl:0"}), **FAST)
    obs = np.random.default_rng(0).standard_normal((64, 4)).astype(np.float32)
    np.testing.assert_array_equal(sequential.actor.policy.greedy(obs), sequential.policy.greedy(obs))


def test_act_device_is_checked():
    with pytest.raises(ConfigError, match="plan.devices.act: cuda:0 has no act kernel for dqn"):
        pearl.DQN("CartPole-v1", plan=Plan(devices={**Plan().devices, "act": "cuda:0"}), **FAST)
    with pytest.raises(ConfigError, match="opencl:9: no such OpenCL device"):
        pearl.DQN("CartPole-v1", plan=Plan(devices={**Plan().devices, "act": "opencl:9"}), **FAST)


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("replay_on_gpu", [False, True])
def test_actor_processes_feed_a_gpu_learner(replay_on_gpu):
    gpu = {"learn": "cuda:0"}
    if replay_on_gpu:
        gpu.update(sample="cuda:0", insert="cuda:0", update_priorities="cuda:0")
    agent = pearl.DQN("CartPole-v1", plan=in_processes(actors=2, devices={**Plan().devices, **gpu}),
                      replay="prioritized", **FAST)
    agent.train(2500)
    assert agent.env_steps == 2500 and agent.updates == due(agent, 0.25)
    assert len(agent.replay) == agent.env_steps


def test_the_learner_acts_while_the_actor_processes_start():
    """plan.act_while_actors_start (the default): the learner's own actor steps until every actor
    process has committed its first round, then hands over at a multiple of actors x envs steps;
    the run keeps the counts of one without it (none lost or duplicated, the exact ratio)."""
    agent = pearl.DQN("CartPole-v1", plan=Plan(runtime="processes", actors=2), **{**FAST, "updates_per_step": 0.5})
    summary = agent.train(3001, time_tasks=True)
    assert agent.env_steps == 3002  # the first multiple of 2 actors x 1 env at or past 3001
    assert agent.updates == due(agent, 0.5)
    assert agent.replay.inserted == agent.env_steps
    stored = agent.replay.storage["obs"][:agent.replay.inserted]
    assert len(np.unique(stored, axis=0)) == len(stored)
    assert "act_in_learner" in summary["task_us"]  # the actors cannot be up at the first round


@pytest.mark.parametrize("fault", ["raises", "cannot_start"])
def test_an_actor_that_fails_while_the_learner_acts_still_fails_the_run(fault, monkeypatch):
    import shutil
    import sys

    from actor_faults import ActorThatCannotStart

    agent = pearl.DQN("CartPole-v1", plan=Plan(runtime="processes"), **FAST)
    if fault == "raises":
        recipe = agent.parts.actor_recipe
        agent.parts.actor_recipe = processes.ActorRecipe(ActorThatCannotStart, recipe.policy_factory, recipe.kwargs)
        expected = "actor 0 failed:(.|\n)*no licence server"
    else:
        monkeypatch.setattr(processes, "fork_actors", lambda parts: False)
        monkeypatch.setattr(sys, "executable", shutil.which("false"))
        expected = "actor 0 exited with code 1 before it could report"
    with pytest.raises(PearlError, match=expected):
        agent.train(200)  # over before the actor could have started


def test_actors_up_while_a_slow_learner_actor_steps_end_the_run_at_the_same_count():
    """One actor process is up and could run ahead while the other still starts and the learner's
    own actor steps (slowed here): the run still ends at the count it would without the learner's
    actor."""
    import time

    import dataclasses

    from actor_faults import SecondActorSlowToStart

    agent = pearl.DQN("CartPole-v1", plan=Plan(runtime="processes", actors=2), **{**FAST, "updates_per_step": 0.5})
    recipe = agent.parts.actor_recipe
    agent.parts.actor_recipe = SecondActorSlowToStart(**{f.name: getattr(recipe, f.name)
                                                         for f in dataclasses.fields(recipe)})
    local = agent.parts.actor
    step = local.step

    def slow_step(epsilon):
        time.sleep(0.002)
        return step(epsilon)

    local.step = slow_step
    agent.train(2001)
    assert agent.env_steps == 2002  # the first multiple of 2 actors x 1 env at or past 2001
    assert agent.updates == due(agent, 0.5)
    assert agent.replay.inserted == agent.env_steps


# An actor process's way to start (actor_main): SciPy's BLAS bindings alone, then a batched
# compiled greedy pass (np.dot through those bindings) against numpy, then a user's import of the
# whole scipy.linalg. In a fresh interpreter, as an actor is: this process has scipy.linalg already.
BLAS_ALONE_CHILD = """
import sys
import numpy as np
from pearl.runtime.processes import BLAS_BINDINGS, load_blas_bindings_alone
assert load_blas_bindings_alone()
assert BLAS_BINDINGS in sys.modules and "scipy.linalg" not in sys.modules
from pearl.kernels.cpu import MLPLayout, QPolicy
policy = QPolicy(MLPLayout([4, 16, 3]))
rng = np.random.default_rng(0)
policy.load(rng.standard_normal(policy.layout.size).astype(np.float32))
obs = rng.standard_normal((5, 4)).astype(np.float32)
actions = np.zeros(5, np.int64)
policy.greedy_into(obs, actions)  # 5 rows: the kernel with np.dot; numba's first load checks its BLAS
assert (actions == policy.q_values(obs).argmax(axis=1)).all(), (actions, policy.q_values(obs))
assert "scipy.linalg" not in sys.modules
import scipy.linalg
assert scipy.linalg.cython_blas is sys.modules[BLAS_BINDINGS]
assert np.allclose(scipy.linalg.expm(np.zeros((2, 2))), np.eye(2))
print("ok")
"""


def test_an_actor_loads_scipys_blas_bindings_alone_and_a_later_scipy_linalg_import_works():
    import subprocess
    import sys

    child = subprocess.run([sys.executable, "-I", "-c", BLAS_ALONE_CHILD], capture_output=True, text=True,
                           timeout=120, env={**os.environ, **processes.ONE_BLAS_THREAD})
    assert child.returncode == 0 and child.stdout.strip() == "ok", child.stderr
    import scipy.linalg  # noqa: F401 (here it is loaded as usual: nothing to do)

    assert not processes.load_blas_bindings_alone()


def test_each_actor_process_reports_its_start_up_cpu():
    agent = pearl.DQN("CartPole-v1", plan=in_processes(actors=2), **FAST)
    agent.train(600)
    booted = agent.counters.actor_boot_cpu
    assert len(booted) == 2 and all(0 < seconds < 60 for seconds in booted)  # CPU from exec to ready


def test_forked_actors_drop_the_learners_signal_handlers_and_ignore_ctrl_c(capfd):
    """A forked actor keeps none of the learner's Python signal handlers (a SIGTERM kills it, and
    the learner restarts it), ignores SIGINT (a Ctrl-C in the terminal acts through the learner),
    and does not write again what the learner had buffered but not yet written."""
    import sys

    agent = pearl.DQN("CartPole-v1", plan=in_processes(actors=2), **FAST)
    handled = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: handled.append(signum))
    signaled = []

    def signal_once(a):
        if a.env_steps >= 1200 and not signaled:
            first, second = (p.pid for p in a.actor_processes.processes)
            assert started_as(first) == started_as(second) == "fork"
            os.kill(first, signal.SIGINT)
            os.kill(second, signal.SIGTERM)
            signaled.append((first, second))

    try:
        print("buffered in the learner", end="")  # no newline: still in sys.stdout's buffer
        agent.train(4000, on_round=signal_once)
        sys.stdout.flush()
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert signaled and not handled
    assert agent.actor_restarts == 1  # the SIGTERMed actor; the SIGINTed one went on
    assert agent.env_steps == 4000 and agent.updates == due(agent, 0.25)
    assert agent.replay.inserted == agent.env_steps
    out, err = capfd.readouterr()
    assert "actor 1 died (exit code -15); restarting it" in err and "actor 0 died" not in err
    assert out.count("buffered in the learner") == 1


def test_an_actor_restarted_while_the_prefetcher_runs_starts_as_a_fresh_interpreter():
    """Another Python thread may hold a lock a fork's child would need: with the prefetcher's
    thread running, a restart execs; the first starts, before that thread, fork."""
    agent = pearl.DQN("CartPole-v1", plan=in_processes(actors=2, prefetch=True), **FAST)
    ways = []

    def kill_once(a):
        processes_ = a.actor_processes.processes
        if a.env_steps >= 1200 and not ways:
            ways.append([started_as(p.pid) for p in processes_])
            os.kill(processes_[1].pid, signal.SIGKILL)
        elif len(ways) == 1 and a.actor_processes.restarts == 1 and processes_[1].poll() is None:
            ways.append(started_as(processes_[1].pid))

    agent.train(4000, on_round=kill_once)
    assert ways[0] == ["fork", "fork"] and ways[1:] == ["exec"]
    assert agent.env_steps == 4000 and agent.updates == due(agent, 0.25)
    assert agent.replay.inserted == agent.env_steps


def test_actors_that_act_with_torch_or_a_device_start_as_fresh_interpreters():
    from types import SimpleNamespace

    def parts(image, act):
        return SimpleNamespace(family=SimpleNamespace(image=image), plan=Plan(devices={**Plan().devices, "act": act}))

    assert processes.fork_actors(parts(False, "cpu"))
    assert not processes.fork_actors(parts(True, "cpu"))  # a CNN policy acts with torch
    assert not processes.fork_actors(parts(False, "opencl:0"))


def test_the_learner_loads_an_actors_kernels_before_its_first_fork_only(monkeypatch):
    """The throwaway actor that loads the compiled kernels before a fork is built once per process
    and kind of actor, not once per train call."""
    monkeypatch.setattr(processes, "_WARM_ACTORS", set())
    learner, built = os.getpid(), []
    build = processes.ActorRecipe.build

    def counted(recipe, *args, **kwargs):
        if os.getpid() == learner:
            built.append(recipe.kwargs.get("env_id"))
        return build(recipe, *args, **kwargs)

    monkeypatch.setattr(processes.ActorRecipe, "build", counted)
    agent = pearl.DQN("CartPole-v1", plan=in_processes(actors=2), **FAST)
    agent.train(1000)
    agent.train(1000)
    pearl.DQN("CartPole-v1", plan=in_processes(actors=1), **FAST).train(600)
    assert built == ["CartPole-v1"]
    assert agent.env_steps == 2000 and agent.replay.inserted == 2000


def test_the_fork_warning_filter_matches_cpython_312s_text():
    """The learner silences Python >= 3.12's warning at its fork (processes.FORK_WARNING); this
    machine's torch runs on 3.11, where the warning never comes, so the pattern is held to the text
    CPython 3.12.1 printed here (os.fork with a second thread running) and must not hide others."""
    import warnings

    cpython_312 = "This process (pid=3710) is multi-threaded, use of fork() may lead to deadlocks in the child."
    for message, hidden in ((cpython_312, True), ("fork() is deprecated here", False)):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            warnings.filterwarnings("ignore", message=processes.FORK_WARNING, category=DeprecationWarning)
            warnings.warn(message, DeprecationWarning)
        assert (not seen) is hidden, message


# -- deterministic runs (Plan.deterministic_lag) ------------------------------------------------

def dqn_weights(runtime: str, seed: int = 3, **plan) -> tuple[np.ndarray, dict]:
    agent = pearl.DQN(env="CartPole-v1", seed=seed, updates_per_step=0.5, batch_size=32, capacity=10000,
                      learner_kernel="fused", envs_per_actor=plan.pop("envs", 1), n_step=plan.pop("n_step", 1),
                      replay=plan.pop("replay", "uniform"), plan=Plan(runtime=runtime, **plan), **FAST)
    summary = agent.train()
    return agent.parts.learner.policy_weights().copy(), summary


@pytest.mark.parametrize("setup", [dict(), dict(envs=3, sync_interval=4), dict(replay="prioritized", n_step=3)])
def test_lag_zero_is_the_sequential_run_bit_for_bit(setup, start):
    """At lag 0 with one actor, each round acts with the weights and epsilon the sequential runtime's
    actor would, and the learner inserts and learns in its order: the same weights at the end."""
    sequential, counts = dqn_weights("sequential", **setup)
    together, counted = dqn_weights("processes", deterministic_lag=0, **setup)
    np.testing.assert_array_equal(together, sequential)
    assert (counted["env_steps"], counted["updates"], counted["episodes"]) == \
        (counts["env_steps"], counts["updates"], counts["episodes"])


def test_a_lagged_run_is_reproducible_whatever_the_timing(monkeypatch):
    """Two actors 40 env steps ahead: the same seed gives the same weights and episodes, with the
    actors forked and with them started as fresh interpreters while a busy thread in the learner's
    process slows it down (other interleavings of the same rounds)."""
    first, counts = dqn_weights("processes", seed=7, actors=2, envs=2, deterministic_lag=40)
    busy = threading.Event()

    def spin():
        while not busy.is_set():
            sum(range(1000))
    spinner = threading.Thread(target=spin, daemon=True)
    spinner.start()  # (another Python thread: the actors start as fresh interpreters, `_ActorProcesses.start`)
    try:
        second, counted = dqn_weights("processes", seed=7, actors=2, envs=2, deterministic_lag=40)
    finally:
        busy.set()
        spinner.join()
    np.testing.assert_array_equal(second, first)
    assert counted["episodes"] == counts["episodes"] and counted["updates"] == counts["updates"]
    other, _ = dqn_weights("processes", seed=7, actors=2, envs=2, deterministic_lag=0)
    assert not np.array_equal(other, first)  # the lag is part of the run's definition


def test_continuous_lag_zero_is_the_sequential_run():
    def run(runtime, **plan):
        agent = pearl.DDPG(env="Pendulum-v1", seed=2, total_steps=600, learning_starts=200, hidden=[32, 32],
                           batch_size=32, plan=Plan(runtime=runtime, **plan))
        agent.train()
        return agent.parts.learner.policy_weights().copy()
    np.testing.assert_array_equal(run("processes", deterministic_lag=0), run("sequential"))


@pytest.mark.parametrize("plan,expected", [
    (dict(runtime="sequential", deterministic_lag=0), "plan.deterministic_lag: an option of the processes runtime"),
    (dict(runtime="processes", deterministic_lag=-1), "plan.deterministic_lag: expected an integer >= 0"),
    (dict(runtime="processes", deterministic_lag=True), "plan.deterministic_lag: expected an integer >= 0"),
])
def test_deterministic_lag_is_checked(plan, expected):
    with pytest.raises(ConfigError, match=expected):
        Plan(**plan).check()


def test_lag_zero_is_the_sequential_run_with_a_cnn_on_minatar():
    """The CNN's torch learner and actors started as fresh interpreters (a torch policy does not fork)."""
    def run(runtime, **plan):
        agent = pearl.DQN(env="MinAtar/Breakout-v1", seed=1, total_steps=700, learning_starts=300, batch_size=16,
                          capacity=2000, target_update_interval=200, conv=[[16, 3, 1]], hidden=[64],
                          plan=Plan(runtime=runtime, **plan))
        agent.train()
        return agent.parts.learner.policy_weights().copy()
    np.testing.assert_array_equal(run("processes", deterministic_lag=0), run("sequential"))


def niceness_of_threads(pid: int) -> set[int]:
    """The niceness of each thread of process `pid` (a thread takes its creator's; field 19 of its stat)."""
    tasks = f"/proc/{pid}/task"
    return {int(open(f"{tasks}/{tid}/stat").read().rpartition(")")[2].split()[16]) for tid in os.listdir(tasks)}


@pytest.mark.parametrize("priority,threads,cores,nicer", [("low", 1, 2, processes.LOW_PRIORITY_NICENESS),
                                                          ("normal", 2, 2, 0), ("auto", 2, 2, processes.LOW_PRIORITY_NICENESS),
                                                          ("auto", 2, 4, 0), ("auto", 1, 1, 0)])
def test_actor_processes_run_at_the_priority_asked(monkeypatch, start, priority, threads, cores, nicer):
    """runtime.actor_priority: every thread of every actor process runs `nicer` than the learner
    (auto: low only where the learner's threads and the actors outnumber the cores)."""
    import pearl.devices

    monkeypatch.setattr(pearl.devices, "cpu_devices", lambda: [{"id": "cpu", "kind": "cpu", "cores": cores}])
    agent = pearl.DQN("CartPole-v1", plan=in_processes(actors=2), actor_priority=priority, torch_threads=threads,
                      adapt_threads=False, **FAST)
    seen = {}

    def look(a):
        if a.env_steps >= 1000 and not seen:
            seen.update({p.pid: niceness_of_threads(p.pid) for p in a.actor_processes.processes})

    learner = os.getpriority(os.PRIO_PROCESS, 0)
    agent.train(2000, on_round=look)
    assert len(seen) == 2 and all(values == {min(19, learner + nicer)} for values in seen.values()), seen
    assert os.getpriority(os.PRIO_PROCESS, 0) == learner  # the learner's own is untouched


def test_actor_processes_run_on_one_thread(start):
    """An actor process runs no BLAS worker threads: a fork's OpenBLAS restarts its pool when its
    thread count is set, and those workers spin beside the actor (`one_blas_thread_in_fork`); a fresh
    interpreter starts with OPENBLAS_NUM_THREADS=1. The learner's OpenBLAS pool is made for 2
    threads here (as on any machine with 2 cores or more), whatever count the run then sets.
    Counted at the run's last round: at its 1,000th step one actor could still be in its first
    milliseconds, between the limit that restarts the workers and their stop (seen once in CI,
    session 55: ('fork', 3) for the second actor), and the workers, once started, stay."""
    from threadpoolctl import threadpool_limits

    agent = pearl.DQN("CartPole-v1", plan=in_processes(actors=2), **FAST)
    seen = {}

    def look(a):
        if a.env_steps >= 1000:
            seen.clear()
            seen.update({p.pid: (started_as(p.pid), len(os.listdir(f"/proc/{p.pid}/task")))
                         for p in a.actor_processes.processes})

    with threadpool_limits(limits=2, user_api="blas"):
        agent.train(2000, on_round=look)
    assert len(seen) == 2 and set(seen.values()) == {(start, 1)}, seen


def test_actor_priority_is_checked():
    with pytest.raises(ConfigError, match="runtime.actor_priority: expected one of 'auto', 'normal', 'low'"):
        pearl.DQN("CartPole-v1", actor_priority="lowest", **FAST)
