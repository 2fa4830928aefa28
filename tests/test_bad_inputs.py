"""Bad input of every kind ends the same way: exit code 2, exactly one line on stderr naming the
field or file and what was expected, no traceback, nothing written or changed on disk.

Cases run in-process through pearl.cli.main (argparse's own errors included); the checkpoint
cases tamper with a copy of one small run directory made once."""
import io
import json
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest
import yaml

import pearl
from pearl.cli import main

TINY = "dqn: {hidden: [16], learning_starts: 100}\neval: {episodes: 1}\nlog: {plot: false}\n"


def snapshot(root: Path) -> dict:
    """Every file below `root` but Python's bytecode cache of a user module the run imported
    (the interpreter's, written unless PYTHONDONTWRITEBYTECODE is set, not PEARL's)."""
    return {p: p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}


def refused(argv, capsys, where: Path, *names: str) -> str:
    """Runs the CLI; checks the one-line refusal names each of `names` and `where` is unchanged."""
    before = snapshot(where)
    try:
        code = main([str(a) for a in argv])
    except SystemExit as stop:  # argparse's usage errors
        code = stop.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.endswith("\n") and err.count("\n") == 1 and "Traceback" not in err, err
    for name in names:
        assert str(name) in err, err
    assert snapshot(where) == before, "something was written"
    return err


# -- experiment configs ----------------------------------------------------------------------
CONFIGS = [
    ("dqn: {lrr: 1}", "dqn.lrr: unknown key"),
    ("algo: ppo", "algo: expected one of"),
    ("seed: -1", "seed: expected an integer >= 0"),
    ("seed: 100000000000000000000000", "seed: expected an integer of at most 2**53"),
    ("seed: 1e23", "seed: expected an integer"),
    ("seed: 8589934592", "seed: expected an integer <= 4294967295"),
    ("seed: true", "seed: expected an integer"),
    ("total_steps: 0", "total_steps: expected an integer >= 1"),
    ("total_steps: many", "total_steps: expected an integer"),
    ("env: 3", "env: expected a string"),
    ("env: ''", "env: expected a Gymnasium environment id"),
    ("env: NoSuchEnv-v9", "env: unknown Gymnasium environment id"),
    ("env: Pendulum-v1", "DQN needs Discrete actions"),
    ("env: FrozenLake-v1", "DQN needs a flat Box"),
    ("env: no_such_module_x:Thing-v0", "env: no module named 'no_such_module_x'"),
    ("imports: [no_such_module_y]", "imports[0]: no module named 'no_such_module_y'"),
    ("imports: ['not a module']", "imports[0]: expected a module name"),
    ("imports: no_such_module_z", "imports: expected a list of a string"),
    ("dqn: {hidden: []}", "dqn.hidden: expected a non-empty list"),
    ("dqn: {hidden: [16, -3]}", "dqn.hidden[1]: expected an integer >= 1"),
    ("dqn: {hidden: [1e11]}", "dqn.hidden[0]: expected an integer"),
    ("dqn: {hidden: [100000000000]}", "dqn.hidden[0]: expected an integer <= 65536"),
    ("dqn: {hidden: [60000, 60000, 60000]}", "dqn.hidden: networks of widths"),
    ("dqn: {hidden: 16}", "dqn.hidden: expected a list"),
    ("dqn: {lr: -1}", "dqn.lr: expected a positive number"),
    ("dqn: {lr: .nan}", "dqn.lr: expected a number"),
    ("dqn: {gamma: 1.5}", "dqn.gamma: expected a number in"),
    ("dqn: {tau: 0}", "dqn.tau: expected a number in (0, 1]"),
    ("dqn: {batch_size: 0}", "dqn.batch_size: expected an integer >= 1"),
    ("dqn: {batch_size: 100000}", "dqn.batch_size: expected at most replay.capacity"),
    ("dqn: {n_step: 0}", "dqn.n_step: expected an integer >= 1"),
    ("dqn: {double: maybe}", "dqn.double: expected true or false"),
    ("dqn: {exploration: {final: 2}}", "dqn.exploration.final: expected a number in"),
    ("dqn: {exploration: 0.1}", "dqn.exploration: expected a mapping"),
    ("dqn: [1, 2]", "dqn: expected a mapping"),
    ("replay: {kind: ring}", "replay.kind: expected one of"),
    ("replay: {capacity: 0}", "replay.capacity: expected an integer >= 1"),
    ("replay: {capacity: 100000000000000}", "replay.capacity: 100,000,000,000,000 transitions of 4 float32"),
    ("replay: {capacity: 1e-3}", "replay.capacity: expected an integer"),
    ("replay: {alpha: 2}", "replay.alpha: expected a number in"),
    ("replay: {fanout: 1}", "replay.fanout: expected an integer >= 2"),
    ("replay: {backend: gpu}", "replay.backend: expected one of"),
    ("runtime: {device: gpu}", "runtime.device"),
    ("runtime: {device: 'cpu:3'}", "runtime.device: cpu:3: no such device"),
    ("runtime: {device: 'cuda:7'}", "runtime.device: cuda"),
    ("runtime: {learner_kernel: fast}", "runtime.learner_kernel: expected one of"),
    ("runtime: {envs_per_actor: 0}", "runtime.envs_per_actor: expected an integer >= 1"),
    ("runtime: {torch_threads: 0}", "runtime.torch_threads: expected an integer >= 1"),
    ("eval: {episodes: 0}", "eval.episodes: expected an integer >= 1"),
    ("log: {interval: 0}", "log.interval: expected an integer >= 1"),
    ("log: {checkpoint_interval: -5}", "log.checkpoint_interval: expected an integer >= 0"),
    ("log: {checkpoint_seconds: -1}", "log.checkpoint_seconds: expected a number in"),
    ("log: {run_dir: ''}", "log.run_dir: expected a directory path"),
    ("algo: td3\nreplay: {kind: prioritized}", "replay.kind: td3 samples its replay uniformly"),
    ("algo: dqn\nruntime: {learner_precision: bf16, learner_kernel: torch}",
     "runtime.learner_precision: bf16 products run in DQN's fused learner, or in its torch learner for a CNN "
     "Q-network; CartPole-v1's observations"),
    ("algo: td3\ntd3: {policy_delay: 0}", "td3.policy_delay: expected an integer >= 1"),
    ("algo: td3\nenv: CartPole-v1", "TD3 needs Box actions"),
    ("[1, 2, 3]", "expected a mapping of config sections"),
    ("just words", "expected a mapping of config sections"),
    ("dqn: [unclosed", "not valid YAML"),
    ("seed: 1\nseed: 2", "duplicate key 'seed' (line 2)"),
    ("dqn: {lr: 0.1, lr: 0.2}", "duplicate key 'lr'"),
    ("", "empty file"),
    ("# only a comment\n", "empty file"),
]


@pytest.mark.parametrize("text,message", CONFIGS)
def test_bad_config(tmp_path, capsys, text, message):
    config = tmp_path / "exp.yaml"
    config.write_text(text + "\n")
    refused(["train", config, "--run-dir", tmp_path / "run", "--quiet"], capsys, tmp_path, message)


@pytest.mark.parametrize("data,message", [(b"\x00\x01\x02binary", "a binary file"),
                                          (b"seed: \xff\xfe\n", "not UTF-8 text"),
                                          (b"\xef\xbb\xbfseed: 1\nseed: 2\n", "duplicate key")])
def test_config_bytes(tmp_path, capsys, data, message):
    config = tmp_path / "exp.yaml"
    config.write_bytes(data)
    refused(["train", config, "--run-dir", tmp_path / "run"], capsys, tmp_path, config, message)


def test_missing_and_unreadable_config(tmp_path, capsys):
    refused(["train", tmp_path / "missing.yaml"], capsys, tmp_path, "missing.yaml: no such config file")
    refused(["train", tmp_path], capsys, tmp_path, "is a directory; expected a config file")


# -- CLI arguments ---------------------------------------------------------------------------
ARGS = [
    (["--steps", "0"], "total_steps: expected an integer >= 1"),
    (["--steps", "abc"], "--steps: invalid int value"),
    (["--seed", "-1"], "seed: expected an integer >= 0"),
    (["--seed", str(2**40)], "seed: expected an integer <= 4294967295"),
    (["--actors", "0", "--runtime", "processes"], "--actors: expected an integer >= 1"),
    (["--actors", "2"], "plan.actors: the sequential runtime runs 1 actor"),
    (["--runtime", "warp"], "--runtime: invalid choice"),
    (["--device", "cuda:x"], "runtime.device"),
    (["--device", "cpu:3"], "runtime.device: cpu:3: no such device"),
    (["--device", "tpu"], "runtime.device"),
    (["--replay", "ring"], "replay.kind"),
    (["--learner-kernel", "fast"], "runtime.learner_kernel"),
    (["--algo", "ppo"], "algo: expected one of"),
    (["--env", "NoSuch-v0"], "env: unknown Gymnasium environment id"),
    (["--env", "CartPole-v"], "did you mean 'CartPole-v1'"),
    (["--env", "no_such_module_q:Foo-v0"], "env: no module named 'no_such_module_q'"),
    (["--import", "no_such_module_r"], "imports[0]: no module named 'no_such_module_r'"),
    (["--import", "bad name"], "imports[0]: expected a module name"),
    (["--bogus"], "unrecognized arguments: --bogus"),
    (["--plan", "missing-plan.yaml"], "missing-plan.yaml: no such plan file"),
]


@pytest.mark.parametrize("extra,message", ARGS)
def test_bad_train_arguments(tmp_path, capsys, extra, message):
    config = tmp_path / "exp.yaml"
    config.write_text(TINY)
    refused(["train", config, "--run-dir", tmp_path / "run", *extra], capsys, tmp_path, message)


OTHER_COMMANDS = [
    (["autotune", "--metric", "speed"], "metric"),
    (["autotune", "--runtimes", "warp"], "--runtimes: expected a comma-separated list"),
    (["autotune", "--envs", "0"], "--envs: expected integers >= 1"),
    (["autotune", "--batch-sizes", "a,b"], "--batch-sizes: expected comma-separated integers"),
    (["autotune", "--replay-kinds", "ring"], "--replay-kinds: 'ring' is not a replay kind"),
    (["autotune", "--measure", "-1"], "--measure: expected K >= 0"),
    (["autotune", "--actors", "2"], "--actors: only processes or ray plans run several actors"),
    (["autotune", "--schedule", "weekly"], "--schedule: expected one of"),
    (["autotune", "-o", "{tmp}/missing/plan.yaml"], "-o {tmp}/missing/plan.yaml: no folder"),
    (["autotune", "-o", "{tmp}"], "is a directory; expected a file name"),
    (["autotune", "-o", "/proc/plan.yaml"], "folder /proc is not writable"),
    (["autotune", "--platform", "no_such_platform"], "platform 'no_such_platform': no such profile"),
    (["autotune", "--platform", "{tmp}/missing.yaml"], "missing.yaml"),
    (["devices", "--write", "{tmp}/missing/p.yaml"], "--write {tmp}/missing/p.yaml: no folder"),
    (["devices", "--write", "{tmp}/p.txt"], "expected a .yaml file name"),
    (["devices", "--write", "/proc/p.yaml"], "folder /proc is not writable"),
    (["profile", "--kernels", "fast"], "--kernels: expected fused and/or torch"),
    (["profile", "--seconds", "0"], "--seconds: expected a positive finite number"),
    (["profile", "--envs", "x"], "--envs: expected comma-separated integers"),
    (["profile", "{tmp}/missing.yaml"], "no such config file"),
    (["frobnicate"], "invalid choice"),
    ([], "the following arguments are required"),
]


@pytest.mark.parametrize("argv,message", OTHER_COMMANDS)
def test_bad_other_commands(tmp_path, capsys, argv, message):
    argv = [a.format(tmp=tmp_path) for a in argv]
    refused(argv, capsys, tmp_path, message.format(tmp=tmp_path))


# -- run directories -------------------------------------------------------------------------
def test_run_dir_problems(tmp_path, capsys):
    config = tmp_path / "exp.yaml"
    config.write_text(TINY)
    (tmp_path / "a-file").write_text("mine")
    refused(["train", config, "--run-dir", tmp_path / "a-file"], capsys, tmp_path, "a-file: ", "is a file")
    refused(["train", config, "--run-dir", tmp_path / "a-file" / "run"], capsys, tmp_path, "is a file")
    refused(["train", config, "--run-dir", "/proc/pearl-run"], capsys, tmp_path, "/proc is not writable")
    refused(["train", "--resume", tmp_path / "nothing"], capsys, tmp_path, "nothing: no checkpoint.npz")
    refused(["train", "--resume", tmp_path / "a-file"], capsys, tmp_path, "a-file: no checkpoint.npz")


# -- plans and platform profiles -------------------------------------------------------------
PLANS = [
    ("plan: {devices: {learn: gpu}}", "plan.devices.learn: expected a device like cpu"),
    ("plan: {devices: {think: cpu}}", "plan.devices.think: unknown task"),
    ("plan: {devices: {learn: 'cpu:3'}}", "plan.devices.learn: cpu:3: no such device"),
    ("plan: {devices: [cpu]}", "plan.devices: expected a mapping"),
    ("plan: {actors: 0}", "plan.actors: expected an integer >= 1"),
    ("plan: {actors: 2}", "plan.actors: the sequential runtime runs 1 actor"),
    ("plan: {runtime: warp}", "plan.runtime: expected one of"),
    ("plan: {prefetch: true}", "plan.prefetch: the processes runtime prefetches"),
    ("plan: {batch_size: 0}", "plan.batch_size: expected an integer >= 1"),
    ("plan: {envs_per_actor: -1}", "plan.envs_per_actor: expected an integer >= 1"),
    ("plan: {learner_kernel: fast}", "plan.learner_kernel: expected one of"),
    ("plan: {replay: ring}", "plan.replay: expected one of"),
    ("plan: {speed: 11}", "plan.speed: unknown key"),
    ("plan: {replay: amper}\n", None),  # fine alone; conflicts with the config below
    ("devices: {learn: cpu}", "expected a mapping with a 'plan' section"),
    ("plan: {actors: 1, actors: 2}", "duplicate key 'actors'"),
    ("", "empty file"),
    ("plan: [", "not valid YAML"),
    ("plan: {devices: {sample: 'fpga:0'}, platform: nowhere}", "plan.platform"),
]


@pytest.mark.parametrize("text,message", [case for case in PLANS if case[1]])
def test_bad_plan(tmp_path, capsys, text, message):
    config, plan = tmp_path / "exp.yaml", tmp_path / "plan.yaml"
    config.write_text(TINY)
    plan.write_text(text + "\n")
    refused(["train", config, "--plan", plan, "--run-dir", tmp_path / "run"], capsys, tmp_path, message)


def test_plan_conflicting_with_the_config(tmp_path, capsys):
    config, plan = tmp_path / "exp.yaml", tmp_path / "plan.yaml"
    config.write_text(TINY + "replay: {kind: prioritized}\n")
    plan.write_text("plan: {replay: amper}\n")
    refused(["train", config, "--plan", plan, "--run-dir", tmp_path / "run"], capsys, tmp_path,
            "plan.replay: amper, but the config's replay.kind is prioritized")


PLATFORMS = [
    ("name: x\ndevices: []\n", "devices"),
    ("name: x\nspeed: 3\n", "speed: unknown key"),
    ("[1, 2]", "expected a mapping with name, devices and links"),
    ("", "empty file"),
    ("name: a\nname: b\n", "duplicate key 'name'"),
]


@pytest.mark.parametrize("text,message", PLATFORMS)
def test_bad_platform_profile(tmp_path, capsys, text, message):
    profile = tmp_path / "platform.yaml"
    profile.write_text(text)
    refused(["autotune", "--platform", profile], capsys, tmp_path, "platform.yaml", message)


def test_binary_platform_profile(tmp_path, capsys):
    profile = tmp_path / "platform.yaml"
    profile.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    refused(["autotune", "--platform", profile], capsys, tmp_path, "platform.yaml: a binary file")


# -- checkpoints and run directories to resume -----------------------------------------------
@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two stopped runs to copy: DQN and TD3, 200 of 400 steps."""
    root = tmp_path_factory.mktemp("runs")
    small = dict(hidden=[16], learning_starts=100, total_steps=400, checkpoint_interval=0)
    pearl.DQN("CartPole-v1", **small).train(200, run_dir=root / "dqn")
    pearl.TD3("Pendulum-v1", **small).train(200, run_dir=root / "td3")
    for run in ("dqn", "td3"):
        (root / run / ".pearl.lock").unlink()
    return root


def read(path: Path) -> tuple[dict, dict]:
    with np.load(path, allow_pickle=False) as data:
        arrays = {name: data[name] for name in data.files}
    return json.loads(arrays.pop("__header__").tobytes()), arrays


def write(path: Path, header, arrays: dict) -> None:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    buffer = io.BytesIO()
    np.savez(buffer, __header__=np.frombuffer(raw, dtype=np.uint8), **arrays)
    path.write_bytes(buffer.getvalue())


def edit(change):
    def apply(path: Path):
        header, arrays = read(path)
        change(header, arrays, path)
        write(path, header, arrays)
    return apply


def first(arrays, prefix):
    return sorted(name for name in arrays if name.startswith(prefix))[0]


def set_config(dotted, value):
    """Edits the checkpoint's own config (a run dir's config.yaml would disagree first: it goes)."""
    def change(header, arrays, path):
        path.with_name("config.yaml").unlink()
        node = header["config"]
        *parents, leaf = dotted.split(".")
        for part in parents:
            node = node[part]
        node[leaf] = value
    return change


def _reshape(arrays, prefix):
    name = first(arrays, prefix)
    arrays[name] = arrays[name].reshape(-1)[:-1]


def _retype(arrays, prefix):
    name = first(arrays, prefix)
    arrays[name] = arrays[name].astype(np.float64)


CHECKPOINTS = [
    ("empty file", lambda p: p.write_bytes(b""), "not a PEARL checkpoint"),
    ("garbage", lambda p: p.write_bytes(b"PK\x03\x04 not really a zip"), "not a PEARL checkpoint"),
    ("truncated", lambda p: p.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 2]), "not a PEARL checkpoint"),
    ("zip without a header", lambda p: zipfile.ZipFile(p, "w").close(), "not a PEARL checkpoint"),
    ("header not JSON", lambda p: write(p, b"{nope", read(p)[1]), "not a PEARL checkpoint"),
    ("header not UTF-8", lambda p: write(p, b"\xff\xfe", read(p)[1]), "not a PEARL checkpoint"),
    ("header a list", lambda p: write(p, [1, 2], read(p)[1]), "checkpoint"),
    ("other format", edit(lambda h, a, p: h.update(format="other/9")), "checkpoint format 'other/9'"),
    ("no learner", edit(lambda h, a, p: h.pop("learner")), "header.learner: missing"),
    ("no counters", edit(lambda h, a, p: h.pop("counters")), "header.counters: missing"),
    ("no config", edit(lambda h, a, p: h.pop("config")), "header.config: missing"),
    ("plan a list", edit(lambda h, a, p: h.update(plan=[1])), "header.plan: missing or not a mapping"),
    ("counter a string", edit(lambda h, a, p: h["counters"].update(env_steps="200")), "header.counters.env_steps"),
    ("counter negative", edit(lambda h, a, p: h["counters"].update(updates=-1)), "header.counters.updates"),
    ("counter a float", edit(lambda h, a, p: h["counters"].update(episodes=1.5)), "header.counters.episodes"),
    ("counter missing", edit(lambda h, a, p: h["counters"].pop("episodes")), "header.counters.episodes"),
    ("rng garbage", edit(lambda h, a, p: h.update(rng={"agent": {"state": 1}, "actor": None})), "header.rng"),
    ("rng a string", edit(lambda h, a, p: h.update(rng="seed")), "header.rng"),
    ("schedule a list", edit(lambda h, a, p: h.update(schedule=[1])), "header.schedule: expected a mapping"),
    ("schedule negative", edit(lambda h, a, p: h["schedule"].update(updates_before=-1)),
     "header.schedule.updates_before: expected an integer >= 0"),
    ("replay size a string", edit(lambda h, a, p: h["replay"].update(size="200")), "header.replay.size"),
    ("replay key missing", edit(lambda h, a, p: h["replay"].pop("cursor")), "header.replay.cursor: missing"),
    ("learner array reshaped", edit(lambda h, a, p: _reshape(a, "learner.")), "learner."),
    ("learner array retyped", edit(lambda h, a, p: _retype(a, "learner.")), "expected float32"),
    ("replay array reshaped", edit(lambda h, a, p: a.update({first(a, "replay.storage.obs"): np.zeros((3, 9), np.float32)})),
     "replay.storage.obs: expected float32 (N, 4)"),
    ("learner array missing", edit(lambda h, a, p: a.pop(first(a, "learner."))), "missing array"),
    ("extra array", edit(lambda h, a, p: a.update({"learner.surprise": np.zeros(3)})), "learner.surprise: unexpected array"),
    ("hidden edited", edit(set_config("dqn.hidden", [32])), "(the checkpoint does not match its config)"),
    ("hidden deepened", edit(set_config("dqn.hidden", [16, 16])), "(the checkpoint does not match its config)"),
    ("env edited", edit(set_config("env", "Acrobot-v1")), "(the checkpoint does not match its config)"),
    ("dueling switched on", edit(set_config("dqn.dueling", True)), "(the checkpoint does not match its config)"),
    ("config with an unknown key", edit(set_config("dqn.speed", 3)), "header.config.dqn.speed: unknown key"),
    ("config value out of range", edit(set_config("dqn.gamma", 7)), "dqn.gamma: expected a number in"),
    ("config env unknown", edit(set_config("env", "Nope-v0")), "env: unknown Gymnasium environment id"),
    ("plan unknown runtime", edit(lambda h, a, p: h["plan"].update(runtime="warp")), "header.plan.runtime: expected one of"),
    ("config.yaml disagrees", edit(lambda h, a, p: h["config"]["dqn"].update(lr=0.5)), "config.yaml: dqn.lr is"),
]


@pytest.mark.parametrize("name,tamper,message", CHECKPOINTS, ids=[c[0] for c in CHECKPOINTS])
def test_bad_checkpoint(runs, tmp_path, capsys, name, tamper, message):
    run = tmp_path / "run"
    shutil.copytree(runs / "dqn", run)
    tamper(run / "checkpoint.npz")
    refused(["train", "--resume", run], capsys, tmp_path, "checkpoint.npz", message)


def test_checkpoint_from_another_run_copied_in(runs, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(runs / "dqn", run)
    shutil.copy(runs / "td3" / "checkpoint.npz", run / "checkpoint.npz")
    refused(["train", "--resume", run], capsys, tmp_path, "config.yaml: algo is 'dqn' but checkpoint.npz holds "
                                                          "a run with 'td3'")


def test_config_yaml_edited_in_a_run_dir(runs, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(runs / "dqn", run)
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["dqn"]["lr"] = 0.5
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    refused(["train", "--resume", run], capsys, tmp_path, "config.yaml: dqn.lr is 0.5")
    (run / "config.yaml").write_bytes(b"\x00")
    refused(["train", "--resume", run], capsys, tmp_path, "config.yaml: a binary file")


# -- environments ----------------------------------------------------------------------------
ENV_MODULES = [
    ("raise RuntimeError('boom')", "imports[0]: importing 'user_envs' failed: RuntimeError: boom"),
    ("import no_such_dependency_w", "imports[0]: no module named 'no_such_dependency_w'"),
    ("def broken(:\n    pass", "imports[0]: importing 'user_envs' failed: SyntaxError"),
    ("import gymnasium as gym\n"
     "class Bad(gym.Env):\n    def __init__(self):\n        raise ValueError('cannot build')\n"
     "gym.register('UserBad-v0', entry_point=Bad)", "env: making UserBad-v0 failed: ValueError: cannot build"),
    ("import gymnasium as gym\nfrom gymnasium.envs.classic_control.pendulum import PendulumEnv\n"
     "gym.register('UserBox-v0', entry_point=PendulumEnv)", "env: UserBox-v0 has actions"),
]


@pytest.mark.parametrize("source,message", ENV_MODULES)
def test_bad_user_environment(tmp_path, capsys, monkeypatch, source, message):
    import sys

    (tmp_path / "user_envs.py").write_text(source + "\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "user_envs", raising=False)
    config = tmp_path / "exp.yaml"
    env = message.split()[2] if message.startswith("env: making") else (
        "UserBox-v0" if "UserBox" in message else "CartPole-v1")
    config.write_text(TINY + f"env: {env}\nimports: [user_envs]\n")
    refused(["train", config, "--run-dir", tmp_path / "run"], capsys, tmp_path, message)
