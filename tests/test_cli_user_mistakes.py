"""The `pearl` command's answers to a user's mistakes and to runs stopped at awkward moments: one
line, a non-zero exit, no traceback; what can be finished is finished."""
import json
import subprocess
import sys

import numpy as np
import pytest
import yaml

import pearl
from pearl.cli import main
from pearl.config import default_config_path


def one_line(err: str) -> str:
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("pearl: error")]
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize("command", [["profile", "--tasks-only"], ["autotune", "--measure", "1"]])
@pytest.mark.parametrize("seconds", ["nan", "inf", "0"])
def test_seconds_must_be_positive_and_finite(command, seconds, capsys):
    assert main([*command, "--seconds", seconds]) == 2
    assert "--seconds: expected a positive finite number of seconds" in one_line(capsys.readouterr().err)


def short_config(tmp_path, **log) -> str:
    config = yaml.safe_load(default_config_path().read_text())
    config.update(total_steps=1500)
    config["dqn"].update(learning_starts=500, hidden=[16, 16])
    config["eval"] = {"episodes": 2, "interval": 0}
    config.setdefault("log", {}).update(log)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


@pytest.mark.parametrize("left", ["nothing", "an interrupted call's result"])
def test_resume_of_a_run_stopped_in_its_final_evaluation_evaluates_it(tmp_path, capsys, left):
    run_dir = tmp_path / "run"
    assert main(["train", short_config(tmp_path), "--run-dir", str(run_dir), "--quiet"]) == 0
    first = json.loads((run_dir / "result.json").read_text())
    if left == "nothing":  # killed while it evaluated: the checkpoint has every step, no result
        (run_dir / "result.json").unlink()
    else:
        (run_dir / "result.json").write_text(json.dumps({"interrupted": True, "env_steps": 1000}))
    capsys.readouterr()
    assert main(["train", "--resume", str(run_dir), "--quiet"]) == 0
    out, err = capsys.readouterr()
    assert "evaluating now" in err and "result: eval return" in out and "throughput" not in out
    result = json.loads((run_dir / "result.json").read_text())
    assert result["env_steps"] == first["env_steps"] == 1500 and result["updates"] == first["updates"]
    assert result["eval_returns"] == first["eval_returns"]  # the same weights, the same evaluation seed
    assert main(["train", "--resume", str(run_dir)]) == 2
    assert "already finished" in one_line(capsys.readouterr().err)


def test_resume_of_a_run_stopped_before_its_first_checkpoint_says_so(tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(default_config_path().read_text())  # what a run writes first
    assert main(["train", "--resume", str(run_dir)]) == 2
    line = one_line(capsys.readouterr().err)
    assert "stopped before its first checkpoint" in line and f"--run-dir {run_dir}" in line
    assert main(["train", "--resume", str(tmp_path)]) == 2  # not a run directory at all
    assert "no checkpoint.npz there" in one_line(capsys.readouterr().err)


@pytest.mark.parametrize("interval, holds", [(1000, "the checkpoint in"), (20_000, "no checkpoint was written")])
def test_a_diverged_run_says_whether_a_checkpoint_was_written(tmp_path, capsys, monkeypatch, interval, holds):
    build = pearl.api.make_agent

    def diverging_agent(*args, **kwargs):
        agent = build(*args, **kwargs)
        update = agent.learner.update

        def diverging(batch):
            loss, abs_td = update(batch)
            return (np.nan if agent.env_steps >= 1200 else loss), abs_td

        agent.learner.update = diverging
        return agent

    monkeypatch.setattr(pearl.api, "make_agent", diverging_agent)
    run_dir = tmp_path / "run"
    assert main(["train", short_config(tmp_path, checkpoint_interval=interval), "--run-dir", str(run_dir),
                 "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    (line,) = [line for line in err.splitlines() if line.startswith("pearl: training diverged")]
    assert "loss became nan" in line and holds in line
    assert (run_dir / "checkpoint.npz").is_file() == (interval == 1000)


def test_the_installed_command_imports_the_users_module_from_the_current_folder(tmp_path):
    (tmp_path / "my_envs.py").write_text("raise RuntimeError('my_envs was found')\n")
    # -I: no current folder on sys.path, as for the installed `pearl` script (unlike python -m or -c)
    script = "import sys; from pearl.cli import main; sys.exit(main(sys.argv[1:]))"
    done = subprocess.run([sys.executable, "-I", "-c", script, "train", "--import", "my_envs", "--steps", "10"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "importing 'my_envs' failed: RuntimeError: my_envs was found" in one_line(done.stderr)


def test_a_step_count_in_the_rl_zoos_notation(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("total_steps: 1e5\nreplay: {capacity: 5e4}\n")
    config = pearl.config.load_config(path)
    assert (config.total_steps, config.replay.capacity) == (100_000, 50_000)
    path.write_text("total_steps: 1.5e0\n")
    with pytest.raises(pearl.errors.ConfigError, match=r"^total_steps: expected an integer, got '1.5e0'$"):
        pearl.config.load_config(path)


@pytest.mark.parametrize("argv, said", [
    (["autotune", "--power-cap", "50"], "a cap of 50 W ranks plans only with the power_cap metric"),
    (["autotune", "--top", "0"], "--top: expected a number of rows >= 1, got 0"),
    (["autotune", "--top", "-1"], "--top: expected a number of rows >= 1, got -1"),
    (["train", "{tmp}"], "is a directory; expected a config file"),
    (["train", "--plan", "{tmp}/missing.yaml"], "missing.yaml: no such plan file"),
    (["autotune", "--platform", "{tmp}/missing.yaml"], "missing.yaml: no such platform file"),
    (["autotune", "-o", "{tmp}/afile/plan.yaml"], "afile is a file; expected a folder"),
    (["devices", "--write", "{tmp}/afile/p.yaml"], "afile is a file; expected a folder"),
])
def test_what_the_sweep_found_named_as_it_is(argv, said, tmp_path, capsys):
    (tmp_path / "afile").write_text("mine\n")
    assert main([arg.replace("{tmp}", str(tmp_path)) for arg in argv]) == 2
    assert said in one_line(capsys.readouterr().err)
    assert (tmp_path / "afile").read_text() == "mine\n"


def test_a_plan_file_given_as_the_config_is_pointed_to_plan(tmp_path, capsys):
    path = tmp_path / "chosen.yaml"
    path.write_text("plan: {runtime: processes}\n")
    assert main(["train", str(path)]) == 2
    assert "a plan file (its `plan:` section), not a config; give it with --plan" in one_line(capsys.readouterr().err)


def test_a_run_too_short_to_learn_says_so(tmp_path):
    agent = pearl.DQN(env="CartPole-v1", total_steps=400, learning_starts=500, hidden=[8])
    with pytest.warns(UserWarning, match=r"^dqn.learning_starts = 500: training to env step 400 runs no update"):
        agent.learn(400)
    assert agent.updates == 0
