"""A built wheel alone provides pearl, pearl.kernels, pearl.estimator, pearl.configs and the CLI."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

CHECK = """
import json, pathlib, sys
import pearl, pearl.kernels.cpu, pearl.estimator, pearl.configs
from pearl.config import default_config_path
target = pathlib.Path(sys.argv[1]).resolve()
for module in (pearl, pearl.kernels, pearl.estimator, pearl.configs):
    assert target in pathlib.Path(module.__file__).resolve().parents, (module, module.__file__)
assert default_config_path().is_file()
agent = pearl.DQN("CartPole-v1", total_steps=1500, learning_starts=500)
print(json.dumps(agent.train()))
"""


@pytest.mark.slow
def test_built_wheel_installs_and_trains(tmp_path):
    dist, target = tmp_path / "dist", tmp_path / "site"
    try:  # build with the installed setuptools when there is one (Python 3.12 venvs have none)
        import setuptools  # noqa: F401
        isolation = ["--no-build-isolation"]
    except ImportError:
        isolation = []
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", *isolation,
                    "-w", str(dist), str(ROOT)], check=True, capture_output=True)
    (wheel,) = dist.glob("pearl_rl-*.whl")
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(target),
                    str(wheel)], check=True, capture_output=True)
    # Run from an empty directory with only the wheel's files ahead of site-packages, so
    # neither the source tree nor the editable install can satisfy the imports.
    env = {**os.environ, "PYTHONPATH": str(target)}
    work = tmp_path / "work"
    work.mkdir()
    result = subprocess.run([sys.executable, "-c", CHECK, str(target)], cwd=work, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    cli = subprocess.run([sys.executable, "-m", "pearl.cli", "train", "--steps", "1200", "--quiet",
                          "--run-dir", str(work / "run")], cwd=work, env=env, capture_output=True,
                         text=True, timeout=300)
    assert cli.returncode == 0, cli.stderr
    assert "throughput:" in cli.stdout and (work / "run" / "checkpoint.npz").is_file()
    assert (target / "bin" / "pearl").is_file()  # the console script is in the wheel
