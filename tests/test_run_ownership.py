"""Run directories are owned (one run at a time, a dead owner's lock recovered, temp files of a
killed write removed at the next start); interrupts never lose a run; summaries count the
resumed part only; the public API is listed; training past total_steps says the schedules end."""
import os
import random
import signal
import subprocess
import sys
import time
import warnings

import pytest
import yaml

import pearl
from pearl.checkpoint import load_checkpoint
from pearl.cli import main
from pearl.errors import PearlError
from pearl.io import LOCK_NAME, TEMP_SUFFIX, atomic_write, interrupts_deferred, owned_run_dir

TINY = dict(total_steps=2000, learning_starts=200, hidden=[16], checkpoint_interval=0)


def test_dir_lists_the_public_api():
    listed = dir(pearl)
    for name in ("DQN", "TD3", "load", "resume", "make_agent", "Plan", "load_config", "autotune", "__version__"):
        assert name in listed
    assert "import_module" not in listed


def test_training_past_total_steps_warns_once():
    agent = pearl.DQN("CartPole-v1", total_steps=500, learning_starts=100, hidden=[8])
    with pytest.warns(UserWarning, match="sized for config.total_steps = 500 steps"):
        agent.train(600)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        agent.train(100)  # once per agent
    quiet = pearl.DQN("CartPole-v1", total_steps=500, learning_starts=100, hidden=[8])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        quiet.train(500)


def test_second_owner_refused_naming_the_pid_and_stale_lock_recovered(tmp_path):
    script = ("import sys, time; from pearl.io import owned_run_dir\n"
              "with owned_run_dir(sys.argv[1]):\n    print('held', flush=True); time.sleep(60)\n")
    holder = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(pearl.PearlError, match=f"in use by another run \\(pid {holder.pid}\\)"):
            with owned_run_dir(tmp_path):
                pass
    finally:
        holder.kill()
        holder.wait()
    with owned_run_dir(tmp_path):  # the dead owner's lock file is still there; its lock is not
        with owned_run_dir(tmp_path):  # nested holds in one process share it
            pass
    assert (tmp_path / LOCK_NAME).read_text().strip() == str(os.getpid())


def test_two_concurrent_cli_runs_the_second_refused_the_first_intact(tmp_path, capsys):
    config = tmp_path / "exp.yaml"
    config.write_text(yaml.safe_dump({"total_steps": 10**6, "dqn": {"hidden": [16], "learning_starts": 100},
                                      "log": {"checkpoint_interval": 500}, "eval": {"episodes": 1}}))
    run_dir = tmp_path / "run"
    first = subprocess.Popen([sys.executable, "-m", "pearl.cli", "train", str(config), "--run-dir", str(run_dir),
                              "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (run_dir / "checkpoint.npz").is_file():
            assert first.poll() is None and time.monotonic() < deadline, first.stderr.read()
            time.sleep(0.05)
        written = {p.name: p.read_bytes() for p in (run_dir / "config.yaml", run_dir / "plan.yaml")}
        for argv in (["train", str(config), "--run-dir", str(run_dir)], ["train", "--resume", str(run_dir)]):
            assert main(argv) == 2
            err = capsys.readouterr().err
            assert err.count("\n") == 1 and f"in use by another run (pid {first.pid})" in err, err
        assert {name: (run_dir / name).read_bytes() for name in written} == written
    finally:
        first.send_signal(signal.SIGINT)
        first.communicate(timeout=60)
    assert first.returncode == 130
    load_checkpoint(run_dir / "checkpoint.npz")


WRITER = """
import os, sys, time
import numpy as np
from pearl.checkpoint import save_checkpoint
if sys.argv[2] == "stall":  # announce being inside a write, then wait there for the kill
    def stalled_fsync(fd):
        print("inside", flush=True)
        time.sleep(60)
    os.fsync = stalled_fsync
print("ready", flush=True)
i = 0
while True:
    i += 1
    save_checkpoint(sys.argv[1] + "/checkpoint.npz", {"i": i}, {"a": np.full(1_000_000, i, np.float32)})
"""


def kill_writer(run_dir, mode, delay=0.0):
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(run_dir), mode], stdout=subprocess.PIPE, text=True)
    assert writer.stdout.readline().strip() == "ready"
    if mode == "stall":
        assert writer.stdout.readline().strip() == "inside"
    time.sleep(delay)
    writer.kill()
    writer.wait()


def test_kill_9_inside_a_write_leaves_a_temp_file_the_next_owner_removes(tmp_path):
    kill_writer(tmp_path, "stall")
    assert not (tmp_path / "checkpoint.npz").exists()
    assert len(list(tmp_path.glob(f".*{TEMP_SUFFIX}"))) == 1
    with owned_run_dir(tmp_path):
        assert not list(tmp_path.glob(f".*{TEMP_SUFFIX}"))


def test_kill_9_at_random_times_leaves_one_whole_checkpoint(tmp_path):
    rng = random.Random(0)
    started = time.monotonic()
    for _ in range(20):
        kill_writer(tmp_path, "run", rng.uniform(0.02, 0.2))
        if (tmp_path / "checkpoint.npz").exists():
            header, arrays = load_checkpoint(tmp_path / "checkpoint.npz")
            assert (arrays["a"] == header["i"]).all()  # one write's arrays with its own header
        with owned_run_dir(tmp_path):
            assert not list(tmp_path.glob(f".*{TEMP_SUFFIX}"))
    assert time.monotonic() - started < 60


def test_a_write_that_fails_is_one_line_naming_the_file_and_keeps_the_previous_one(tmp_path):
    """A full disk (or a read-only directory) while a checkpoint or plan is written: one line
    naming the file and why, the previous file as it was, no temporary file left."""
    import errno

    def full(handle):
        handle.write(b"half")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    path = tmp_path / "checkpoint.npz"
    with pytest.raises(PearlError, match=r"checkpoint\.npz: could not be written \(No space left on device\); "
                                         r"nothing was written$") as refused:
        atomic_write(path, full)
    assert "\n" not in str(refused.value) and not path.exists()
    atomic_write(path, lambda handle: handle.write(b"whole"))
    with pytest.raises(PearlError, match="; the previous file is kept$"):
        atomic_write(path, full)
    assert path.read_bytes() == b"whole" and not list(tmp_path.glob(f".*{TEMP_SUFFIX}"))


@pytest.fixture
def ctrl_c():
    """SIGINT raises KeyboardInterrupt here, as at a terminal, even when the suite was started with
    SIGINT ignored (a background job of a non-interactive shell inherits SIG_IGN)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.mark.usefixtures("ctrl_c")
def test_interrupts_deferred_act_after_the_block():
    with pytest.raises(KeyboardInterrupt):
        with interrupts_deferred():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.01)
            finished = True
    assert finished


@pytest.mark.usefixtures("ctrl_c")
@pytest.mark.parametrize("runtime", ["sequential", "processes"])
def test_two_quick_ctrl_c_still_end_in_a_checkpoint(tmp_path, runtime):
    agent = pearl.DQN("CartPole-v1", plan=pearl.Plan(runtime=runtime), **{**TINY, "checkpoint_interval": 10**5})
    save = agent.save

    def interrupted_save(path):  # the second Ctrl-C lands while the checkpoint is written
        os.kill(os.getpid(), signal.SIGINT)
        save(path)

    def first_ctrl_c(a):
        if a.env_steps >= 300:
            a.save = interrupted_save
            os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(KeyboardInterrupt):
        agent.train(run_dir=tmp_path, on_round=first_ctrl_c)
    header, _ = load_checkpoint(tmp_path / "checkpoint.npz")
    assert 300 <= header["counters"]["env_steps"] == agent.env_steps < 2000


def test_checkpoints_by_wall_time(tmp_path):
    agent = pearl.DQN("CartPole-v1", **{**TINY, "checkpoint_seconds": 1e-9})
    written = []
    checkpoint = agent.checkpoint
    agent.checkpoint = lambda path, **how: written.append(agent.env_steps) or checkpoint(path, **how)
    agent.train(run_dir=tmp_path)
    assert len(written) > 10 and written[-1] == 2000
    assert pearl.DQN("CartPole-v1").config.log.checkpoint_seconds == 600


def test_resumed_summary_counts_the_resumed_steps(tmp_path, capsys):
    config = tmp_path / "exp.yaml"
    config.write_text(yaml.safe_dump({"total_steps": 3000, "dqn": {"hidden": [16], "learning_starts": 100},
                                      "log": {"checkpoint_interval": 1000, "plot": False},
                                      "eval": {"episodes": 1}}))
    agent = pearl.make_agent(pearl.load_config(config))
    agent.train(1000, run_dir=tmp_path / "run")
    assert main(["train", "--resume", str(tmp_path / "run"), "--quiet"]) == 0
    assert "(2,000 steps in" in capsys.readouterr().out
