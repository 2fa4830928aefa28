"""Run lifecycle: periodic atomic checkpoints, resume after kill -9, Ctrl-C that finishes
cleanly, a diverged loss that stops the run with its last good checkpoint intact."""
import csv
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import pearl
from pearl.checkpoint import load_checkpoint
from pearl.errors import ConfigError, TrainingDiverged

FAST = dict(learning_starts=500, target_update_interval=200, hidden=[32, 32], replay="prioritized")


def checkpoint_steps(run_dir: Path) -> int:
    try:
        header, _ = load_checkpoint(run_dir / "checkpoint.npz")
    except Exception:  # not written yet
        return -1
    return header["counters"]["env_steps"]


def metrics(run_dir: Path) -> list[dict]:
    with open(run_dir / "metrics.csv", newline="") as f:
        return list(csv.DictReader(f))


def test_periodic_checkpoints_and_rng_state(tmp_path):
    agent = pearl.DQN("CartPole-v1", total_steps=3000, checkpoint_interval=1000, **FAST)
    seen = []
    original = agent.checkpoint

    def spy(path, **how):
        seen.append(agent.env_steps)
        return original(path, **how)

    agent.checkpoint = spy
    agent.train(run_dir=tmp_path)
    assert seen == [1000, 2000, 3000, 3000]  # periodic, then the end of the run
    restored = pearl.load(tmp_path)
    assert restored.rng.bit_generator.state == agent.rng.bit_generator.state
    assert restored.parts.actor_rng_state == agent.actor.rng.bit_generator.state


@pytest.mark.parametrize("every", [dict(checkpoint_interval=700), dict(checkpoint_seconds=0.05)])
def test_the_threaded_learner_is_paused_while_a_checkpoint_is_written(tmp_path, every):
    """A checkpoint round that logs nothing (700 steps, not a multiple of the 1,000-step rows; or
    one due by wall time) is written with the learner thread between updates: weights, optimizer
    and priorities of one moment."""
    agent = pearl.DQN("CartPole-v1", total_steps=3000, plan=pearl.Plan(runtime="threaded"), **FAST, **every)
    learner, updating, torn = agent.learner, [False], []
    update, state_dict = learner.update, learner.state_dict

    def slow_update(batch):
        updating[0] = True
        try:
            time.sleep(0.001)  # most of the learner thread's time is inside an update
            return update(batch)
        finally:
            updating[0] = False

    def checked_state_dict():
        torn.append(updating[0])
        return state_dict()

    learner.update, learner.state_dict = slow_update, checked_state_dict
    agent.train(run_dir=tmp_path)
    assert len(torn) >= 3 and not any(torn)


SHIPPED = sorted((Path(__file__).resolve().parent.parent / "configs").glob("*.yaml"))


@pytest.mark.parametrize("path", SHIPPED, ids=lambda path: path.stem)
def test_every_shipped_config_saves_and_loads(path, tmp_path):
    """Each shipped config's agent (its table shrunk) loads back as it was built: the plan its build
    resolved (learner_precision auto's bf16 on a CPU with bfloat16 units, Breakout's) beside its
    config (auto) is one run, not a conflict."""
    from pearl.config import apply_overrides, load_config

    agent = pearl.make_agent(apply_overrides(load_config(path), {"replay.capacity": 2000}))
    agent.save(tmp_path / "agent")
    back = pearl.load(tmp_path / "agent.npz")
    assert back.plan == agent.plan and back.learner.precision == agent.learner.precision


SCRIPT = """
import json, sys, pearl
agent = pearl.DQN("CartPole-v1", total_steps={total}, checkpoint_interval=500, seed=2,
                  learning_starts=500, target_update_interval=200, hidden=[32, 32], replay="prioritized",
                  plan=pearl.Plan(runtime="{runtime}"))
summary = agent.train(run_dir=sys.argv[1])
print(json.dumps({{"env_steps": summary["env_steps"], "interrupted": summary["interrupted"]}}))
"""


def start_run(run_dir: Path, total: int, runtime: str = "sequential") -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-c", SCRIPT.format(total=total, runtime=runtime), str(run_dir)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def wait_for_checkpoint(run_dir: Path, proc: subprocess.Popen, at_least: int, timeout: float = 120.0):
    deadline = time.monotonic() + timeout
    while checkpoint_steps(run_dir) < at_least:
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline, "no checkpoint in time"
        time.sleep(0.05)


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
        except (OSError, ValueError):
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.parametrize("runtime", ["sequential", "threaded", "processes"])
@pytest.mark.parametrize("algo", ["dqn", "sac"])
def test_an_agent_saved_without_its_replay_refills_it_before_it_updates_again(tmp_path, runtime, algo):
    """save(exclude=["replay_buffer"]): the loaded agent's table starts empty; no update is due until
    it holds learning_starts transitions, then the ratio goes on from the saved counts (no burst of
    the updates its env steps would make due); a checkpoint of the run keeps that schedule."""
    from pearl.plan import Plan

    make = {"dqn": lambda: pearl.DQN("CartPole-v1", learning_starts=100, hidden=[16], updates_per_step=0.25),
            "sac": lambda: pearl.SAC("Pendulum-v1", learning_starts=100, hidden=[16], updates_per_step=0.5)}[algo]
    agent = make()
    agent.train(500)
    agent.save(tmp_path / "model", exclude=["replay_buffer"])
    header, _ = load_checkpoint(tmp_path / "model.npz")
    assert "replay" not in header and not any(name.startswith("replay.") for name in _)
    plan = Plan(runtime=runtime, actors=1) if runtime == "processes" else Plan(runtime=runtime)
    loaded = pearl.load(tmp_path / "model", plan=plan)
    ratio, made = loaded.config.algo_config.updates_per_step, agent.updates
    assert loaded.replay.size == 0 and loaded.updates == made and loaded.env_steps == 500
    loaded.train(100, run_dir=tmp_path / "run")  # the table refills: no update
    assert loaded.updates == made and loaded.replay.size >= 100 - loaded.n_envs
    loaded.train(200, run_dir=tmp_path / "run")
    assert loaded.updates == made + int(200 * ratio)
    again = pearl.load(tmp_path / "run")  # the run's checkpoint: its table and its schedule
    assert again.replay.size == loaded.replay.size and again.parts.schedule == loaded.parts.schedule
    again.train(100)
    assert again.updates == made + int(300 * ratio)


@pytest.mark.parametrize("runtime", ["sequential", "processes"])
def test_kill_9_then_resume_continues_from_the_checkpoint(tmp_path, runtime):
    total = 20_000
    proc = start_run(tmp_path, total, runtime)
    wait_for_checkpoint(tmp_path, proc, 1500)
    orphans = children(proc.pid)  # the processes runtime's actors (and any helper process)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 30
    while any(alive(pid) for pid in orphans):  # actors notice their learner is gone and exit
        assert time.monotonic() < deadline, "actor processes outlived their learner"
        time.sleep(0.1)
    at = checkpoint_steps(tmp_path)
    assert 1500 <= at < total
    saved = pearl.load(tmp_path)  # what the checkpoint holds: the replay contents among it
    assert len(saved.replay) == at
    resumed, summary = pearl.resume(tmp_path)
    assert summary["env_steps"] == resumed.env_steps == total
    assert resumed.updates == int((total - 500) * 0.25)  # the replay ratio over the whole run
    assert resumed.replay.inserted == total
    np.testing.assert_array_equal(resumed.replay.storage["obs"][:at], saved.replay.storage["obs"][:at])
    steps = [int(r["env_steps"]) for r in metrics(tmp_path)]  # integers, also the rows rewritten at the resume
    assert steps == sorted(set(steps)) and steps[-1] == total  # no duplicated rows after the resume
    with pytest.raises(ConfigError, match="already finished"):
        pearl.resume(tmp_path)
    with pytest.raises(ConfigError, match="no checkpoint"):
        pearl.resume(tmp_path / "nothing-here")


@pytest.mark.parametrize("runtime", ["sequential", "processes"])
def test_ctrl_c_stops_cleanly_with_a_consistent_checkpoint(tmp_path, runtime):
    proc = start_run(tmp_path, 200_000, runtime)
    wait_for_checkpoint(tmp_path, proc, 1000)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["interrupted"] and summary["env_steps"] < 200_000
    assert checkpoint_steps(tmp_path) == summary["env_steps"]  # written at the stop, not before
    agent = pearl.load(tmp_path)
    assert agent.updates == int((agent.env_steps - 500) * 0.25)


def test_diverged_loss_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path):
    agent = pearl.DQN("CartPole-v1", total_steps=5000, checkpoint_interval=1000, **FAST)
    update = agent.learner.update

    def diverging(batch):
        loss, abs_td = update(batch)
        if agent.env_steps >= 2500:
            agent.learner.policy_weights()[:] = np.nan  # what a blown-up step leaves behind
            return math.nan, abs_td
        return loss, abs_td

    agent.learner.update = diverging
    with pytest.raises(TrainingDiverged, match="loss became nan"):
        agent.train(run_dir=tmp_path)
    kept = pearl.load(tmp_path)
    assert kept.env_steps == 2000  # the last periodic checkpoint before the divergence
    assert np.isfinite(kept.learner.policy_weights()).all()
    assert agent.checkpoint(tmp_path / "checkpoint.npz") is False  # non-finite weights: not written
    assert pearl.load(tmp_path).env_steps == 2000


def test_cli_kill_9_then_train_resume(tmp_path, capsys):
    import yaml

    from pearl.cli import main
    from pearl.config import default_config_path

    config = yaml.safe_load(default_config_path().read_text())
    config["total_steps"] = 8000
    config.setdefault("log", {})["checkpoint_interval"] = 1000
    config.setdefault("eval", {})["episodes"] = 2
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "pearl.cli", "train", str(path), "--run-dir", str(run_dir),
                             "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_checkpoint(run_dir, proc, 2000)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert main(["train", str(path), "--run-dir", str(run_dir)]) == 2  # a run is there: resume it
    assert "--resume" in capsys.readouterr().err
    assert main(["train", "--resume", str(run_dir), "--steps", "10"]) == 2
    assert "drop --steps" in capsys.readouterr().err
    assert main(["train", "--resume", str(tmp_path / "missing")]) == 2
    assert main(["train", "--resume", str(run_dir), "--quiet"]) == 0
    result = json.loads((run_dir / "result.json").read_text())
    assert result["env_steps"] == 8000 and not result["interrupted"]
    assert main(["train", "--resume", str(run_dir)]) == 2  # finished
    err = capsys.readouterr().err
    assert "already finished" in err and "Traceback" not in err
