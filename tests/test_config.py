"""Bad experiment configs end in one line naming the field, exit code 2, no traceback."""
import subprocess
import sys

import pytest
import yaml

from pearl.config import default_config_path, load_config, parse_config
from pearl.errors import ConfigError

BAD = [
    # (yaml text, the field the one-line error must name)
    ("dqn: {lrr: 0.001}", "dqn.lrr: unknown key"),
    ("colour: blue", "colour: unknown key"),
    ("dqn: {lr: fast}", "dqn.lr: expected a number"),
    ("dqn: {lr: -0.1}", "dqn.lr: expected a positive number"),
    ("dqn: {gamma: 1.5}", "dqn.gamma: expected a number in [0.0, 1.0]"),
    ("dqn: {batch_size: 0}", "dqn.batch_size: expected an integer >= 1"),
    ("dqn: {batch_size: 6.5}", "dqn.batch_size: expected an integer"),
    ("dqn: {hidden: []}", "dqn.hidden: expected a non-empty list"),
    ("dqn: {hidden: [64, -3]}", "dqn.hidden[1]: expected an integer >= 1"),
    ("dqn: {hidden: 64}", "dqn.hidden: expected a list of an integer"),
    ("dqn: {double: maybe}", "dqn.double: expected true or false"),
    ("dqn: {tau: 0}", "dqn.tau: expected a number in (0, 1]"),
    ("dqn: {n_step: 0}", "dqn.n_step: expected an integer >= 1"),
    ("dqn: {exploration: {final: 2}}", "dqn.exploration.final: expected a number in [0.0, 1.0]"),
    ("dqn: {updates_per_step: 0}", "dqn.updates_per_step: expected a positive number"),
    ("dqn: 3", "dqn: expected a mapping"),
    ("replay: {kind: ring}", "replay.kind: expected one of 'uniform', 'prioritized', 'amper'"),
    ("replay: {capacity: 0}", "replay.capacity: expected an integer >= 1"),
    ("replay: {alpha: 1.2}", "replay.alpha: expected a number in [0.0, 1.0]"),
    ("replay: {capacity: 10}", "dqn.batch_size: expected at most replay.capacity"),
    ("runtime: {device: tpu}", "runtime.device: expected a device like cpu, cuda:0"),
    ("runtime: {learner_kernel: magic}", "runtime.learner_kernel: expected one of"),
    ("algo: ppo", "algo: expected one of 'dqn'"),
    ("total_steps: -5", "total_steps: expected an integer >= 1"),
    ("seed: true", "seed: expected an integer"),
    ("eval: {episodes: 0}", "eval.episodes: expected an integer >= 1"),
    ("dqn: {lr: .nan}", "dqn.lr: expected a number"),
    ("[1, 2, 3]", "expected a mapping of config sections"),
    ("algo: td3\ntd3: {policy_delay: 0}", "td3.policy_delay: expected an integer >= 1"),
    ("algo: td3\ntd3: {tau: 0}", "td3.tau: expected a number in (0, 1]"),
    ("algo: ddpg\nddpg: {actor_lr: 0.1}", "ddpg.actor_lr: unknown key"),
    ("algo: ddpg\nddpg: {action_noise: -1}", "ddpg.action_noise: expected a number in [0.0, 10.0]"),
    ("algo: sac\nsac: {target_entropy: high}", "sac.target_entropy: expected a number"),
    ("algo: sac\nsac: {init_ent_coef: 0}", "sac.init_ent_coef: expected a positive number"),
    ("algo: sac\nsac: {hidden: []}", "sac.hidden: expected a non-empty list"),
    ("algo: sac\nsac: {batch_size: 300}\nreplay: {capacity: 100}", "sac.batch_size: expected at most replay.capacity (100)"),
    ("algo: ddpg\nreplay: {kind: prioritized}", "replay.kind: ddpg samples its replay uniformly"),
    ("algo: a2c", "algo: expected one of 'dqn', 'ddpg', 'td3', 'sac'"),
]


@pytest.mark.parametrize("text,message", BAD)
def test_bad_config_names_the_field(text, message):
    with pytest.raises(ConfigError) as err:
        parse_config(yaml.safe_load(text))
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_shipped_configs_validate():
    config = load_config(default_config_path())
    assert config.env == "CartPole-v1" and config.algo == "dqn"


def test_scientific_notation_without_dot_is_a_number():
    # YAML 1.1 reads `1e-3` as a string; users write it anyway.
    assert parse_config(yaml.safe_load("dqn: {lr: 1e-3}")).dqn.lr == pytest.approx(1e-3)


def run_cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "pearl.cli", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=120)


CLI_BAD = [
    ("dqn: {lrr: 1}\n", [], "dqn.lrr: unknown key"),
    ("env: NoSuchEnv-v9\n", [], "env: unknown Gymnasium environment id 'NoSuchEnv-v9'"),
    ("env: CartPole-v\n", [], "did you mean 'CartPole-v1'"),
    ("dqn: [unclosed\n", [], "not valid YAML"),
    ("env: Pendulum-v1\n", [], "DQN needs Discrete actions"),
    ("seed: 0\n", ["--steps", "-3"], "total_steps: expected an integer >= 1"),
    ("seed: 0\n", ["--device", "cuda:x"], "runtime.device"),
    ("seed: 0\n", ["--replay", "ring"], "replay.kind"),
    # the continuous algorithms' own
    ("algo: td3\nenv: CartPole-v1\n", [], "env: CartPole-v1 has actions Discrete(2); TD3 needs Box actions"),
    ("algo: sac\nsac: {lr: -1}\n", [], "sac.lr: expected a positive number"),
    ("algo: ddpg\nenv: Pendulum-v1\n", ["--replay", "amper"], "replay.kind: ddpg samples its replay uniformly"),
    ("algo: sac\nenv: Pendulum-v1\nruntime: {learner_precision: bf16}\n", ["--learner-kernel", "torch"],
     "runtime.learner_precision: bf16 products run in the fused cpu learner"),
]


@pytest.mark.parametrize("text,extra,message", CLI_BAD)
def test_cli_bad_input_one_line_exit_2(tmp_path, text, extra, message):
    config = tmp_path / "exp.yaml"
    config.write_text(text)
    result = run_cli("train", str(config), "--run-dir", str(tmp_path / "run"), *extra)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert message in lines[0]
    assert not (tmp_path / "run").exists()  # nothing half-written


def test_cli_missing_config_file(tmp_path):
    result = run_cli("train", str(tmp_path / "missing.yaml"))
    assert result.returncode == 2
    assert result.stderr.strip() == f"pearl: error: {tmp_path / 'missing.yaml'}: no such config file"


def test_cli_unknown_flag_is_one_line():
    result = run_cli("train", "--bogus")
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1


def test_cli_bad_plan_file(tmp_path):
    plan = tmp_path / "plan.yaml"
    plan.write_text("plan: {devices: {learn: gpu}}\n")
    result = run_cli("train", "--plan", str(plan), "--steps", "10")
    assert result.returncode == 2
    assert "plan.devices.learn: expected a device like cpu" in result.stderr


def test_cli_cuda_without_gpu(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    result = run_cli("train", "--device", "cuda", "--steps", "10", "--run-dir", str(tmp_path / "r"))
    assert result.returncode == 2 and "torch sees no CUDA GPU" in result.stderr


def test_cli_prints_a_warning_in_one_line(monkeypatch, capsys):
    import warnings

    import pearl.cli as cli

    def warns(args):
        warnings.warn("runtime.learner_precision: bf16 on a CPU without bfloat16 units runs emulated")
        return 0

    monkeypatch.setattr(cli, "_devices", warns)
    assert cli.main(["devices"]) == 0
    assert capsys.readouterr().err == "pearl: warning: runtime.learner_precision: bf16 on a CPU without bfloat16 units runs emulated\n"
