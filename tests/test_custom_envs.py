"""Custom environments: registered in a user's module, trained from the CLI (--import,
module:EnvId) and from Python, in-process and in actor processes; actor processes never run
code from the working directory."""
import subprocess
import sys

import pytest

import pearl
from pearl.cli import main

MODULE = """
import gymnasium as gym
from gymnasium.envs.classic_control.cartpole import CartPoleEnv


class {name}(CartPoleEnv):
    pass


gym.register("{name}-v0", entry_point={name}, max_episode_steps=100)
"""
SMALL = ["--steps", "600", "--quiet"]


def user_module(folder, name):
    (folder / f"{name.lower()}.py").write_text(MODULE.format(name=name))
    return name.lower()


def small_config(folder):
    path = folder / "exp.yaml"
    path.write_text("dqn: {hidden: [16], learning_starts: 100}\neval: {episodes: 1}\nlog: {plot: false}\n")
    return str(path)


@pytest.mark.parametrize("runtime", ["sequential", "processes"])
def test_cli_import_and_module_env_id(tmp_path, monkeypatch, runtime):
    module = user_module(tmp_path, f"CliPole{runtime.title()}")
    monkeypatch.syspath_prepend(str(tmp_path))
    config = small_config(tmp_path)
    assert main(["train", config, "--import", module, "--env", f"CliPole{runtime.title()}-v0", "--runtime", runtime,
                 "--run-dir", str(tmp_path / "a"), *SMALL]) == 0
    assert pearl.load(tmp_path / "a").config.imports == [module]  # a resumed run imports it again
    assert main(["train", config, "--env", f"{module}:CliPole{runtime.title()}-v0", "--runtime", runtime,
                 "--run-dir", str(tmp_path / "b"), *SMALL]) == 0


@pytest.mark.parametrize("runtime", ["sequential", "processes"])
def test_python_api_with_a_registered_env(tmp_path, monkeypatch, runtime):
    module = user_module(tmp_path, f"PyPole{runtime.title()}")
    monkeypatch.syspath_prepend(str(tmp_path))
    agent = pearl.DQN(f"PyPole{runtime.title()}-v0", imports=[module], hidden=[16], learning_starts=100,
                      total_steps=600, plan=pearl.Plan(runtime=runtime))
    assert agent.train()["env_steps"] == 600
    assert agent.parts.actor_recipe.modules == (module,)


STRING_ENTRY = """
import gymnasium as gym

gym.register("TextPole-v0", entry_point="textpole_impl:TextPole", max_episode_steps=100)
"""


@pytest.mark.parametrize("env_args", [["--import", "cwdpole", "--env", "CwdPole-v0"], ["--env", "cwdpole:CwdPole-v0"],
                                      ["--import", "textpole", "--env", "TextPole-v0"]])
def test_cli_subprocess_module_in_the_working_directory(tmp_path, env_args):
    """`python -m` puts the cwd on the learner's path; the actors get the module's folder back,
    whether the env is registered with a class or with Gymnasium's 'module:Class' string."""
    user_module(tmp_path, "CwdPole")
    (tmp_path / "textpole.py").write_text(STRING_ENTRY)
    (tmp_path / "textpole_impl.py").write_text(MODULE.format(name="TextPole").split("gym.register")[0])
    result = subprocess.run([sys.executable, "-m", "pearl.cli", "train", small_config(tmp_path), *env_args,
                             "--runtime", "processes", "--run-dir", "run", *SMALL],
                            cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_env_registered_by_the_main_script_is_refused_for_actor_processes(monkeypatch):
    import gymnasium as gym
    from gymnasium.envs.classic_control.cartpole import CartPoleEnv

    main_class = type("MainPole", (CartPoleEnv,), {"__module__": "__main__"})
    gym.register("MainPole-v0", entry_point=main_class, max_episode_steps=100)
    agent = pearl.DQN("MainPole-v0", hidden=[16], learning_starts=100, total_steps=200)
    agent.train()  # in this process: fine
    agent = pearl.DQN("MainPole-v0", hidden=[16], learning_starts=100, total_steps=200,
                      plan=pearl.Plan(runtime="processes"))
    with pytest.raises(pearl.PearlError, match="registered by the main script; actor processes cannot import it"):
        agent.train()


def test_actor_processes_do_not_import_from_the_working_directory(tmp_path, monkeypatch):
    marker = tmp_path / "imported"
    (tmp_path / "gymnasium.py").write_text(f"open({str(marker)!r}, 'w').write('yes')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend("")  # as `python -c` / `-m` / the prompt put it
    agent = pearl.DQN("CartPole-v1", hidden=[16], learning_starts=100, total_steps=400,
                      plan=pearl.Plan(runtime="processes", actors=2))
    assert agent.train()["env_steps"] == 400
    assert not marker.exists()


def test_bad_imports_are_one_line(tmp_path, monkeypatch):
    (tmp_path / "broken_envs.py").write_text("raise RuntimeError('no such thing\\nsecond line')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(pearl.ConfigError, match=r"^imports\[0\]: no module named 'nowhere_envs'"):
        pearl.DQN("CartPole-v1", imports=["nowhere_envs"])
    with pytest.raises(pearl.ConfigError, match=r"^imports\[0\]: importing 'broken_envs' failed: "
                                                r"RuntimeError: no such thing$"):
        pearl.DQN("CartPole-v1", imports=["broken_envs"])
    with pytest.raises(pearl.ConfigError, match=r"^env: no module named 'nowhere_envs'"):
        pearl.DQN("nowhere_envs:Thing-v0")


FACTORY = """
from gymnasium.envs.classic_control.cartpole import CartPoleEnv
from gymnasium.wrappers import TimeLimit


def short_pole():
    return TimeLimit(CartPoleEnv(), 100)
"""


@pytest.mark.parametrize("runtime", ["sequential", "processes"])
def test_env_factories_and_instances_from_python(tmp_path, monkeypatch, runtime):
    from gymnasium.envs.classic_control.cartpole import CartPoleEnv

    (tmp_path / "pole_factories.py").write_text(FACTORY)
    monkeypatch.syspath_prepend(str(tmp_path))
    import pole_factories

    for env in (pole_factories.short_pole, CartPoleEnv()):
        agent = pearl.DQN(env, hidden=[16], learning_starts=100, total_steps=400, plan=pearl.Plan(runtime=runtime))
        assert agent.train()["env_steps"] == 400
        assert agent.evaluate(1)["mean"] > 0


def test_unpicklable_env_factory_refused_for_actor_processes():
    from gymnasium.envs.classic_control.cartpole import CartPoleEnv

    agent = pearl.DQN(lambda: CartPoleEnv(), hidden=[16], learning_starts=100, total_steps=200)
    agent.train()  # in this process: fine
    agent = pearl.DQN(lambda: CartPoleEnv(), hidden=[16], learning_starts=100, total_steps=200,
                      plan=pearl.Plan(runtime="processes"))
    with pytest.raises(pearl.PearlError, match="^env: actor processes need a picklable env factory"):
        agent.train()
    with pytest.raises(pearl.ConfigError, match="^env: expected a Gymnasium id, an env factory or an env instance"):
        pearl.DQN(42)
