"""User mistakes at the Python API end in one line naming the argument, as the CLI's do: a plan or
config given as a file path or a mapping is read as `pearl train` reads it, an evaluation of no
episodes is refused, and an env whose observations are not of its own space's shape is named
(in this process or in an actor process, and through `pearl train`)."""
import os
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import yaml

import pearl
from pearl.cli import main
from pearl.errors import ConfigError, PearlError
from pearl.plan import Plan

TINY = {"hidden": [16], "learning_starts": 10}
PARENT = os.getpid()  # (an actor process is a fork of this one, or imports this module afresh)


class BadShapeEnv(gym.Env):
    """A Box (3,) observation space; `step()` (or `reset()` too) returns observations of shape (5,),
    or only in a process other than this one (`in_actors`)."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, bad_reset: bool = False, in_actors: bool = False):
        self.bad_reset, self.in_actors = bad_reset, in_actors

    def _obs(self, bad: bool) -> np.ndarray:
        bad = bad and (not self.in_actors or os.getpid() != PARENT)
        return np.zeros(5 if bad else 3, np.float32)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        return self._obs(self.bad_reset), {}

    def step(self, action):
        return self._obs(True), 1.0, False, False, {}


gym.register("BadShapeEnv-v0", entry_point=BadShapeEnv, max_episode_steps=20)
gym.register("BadResetEnv-v0", entry_point=BadShapeEnv, kwargs={"bad_reset": True}, max_episode_steps=20)
gym.register("BadInActorsEnv-v0", entry_point=BadShapeEnv, kwargs={"in_actors": True}, max_episode_steps=20)


def shape_error(env_id: str, call: str) -> str:
    return f"env {env_id}: {call} returned an observation of shape (5,); its observation_space says (3,)"


# -- a plan or config as a path or a mapping ---------------------------------------------------------
def autotuned_plan(tmp_path) -> str:
    """A plan file as `pearl autotune -o` writes it (the plan, and a section for the reader)."""
    path = tmp_path / "chosen.yaml"
    path.write_text(yaml.safe_dump({"plan": Plan(runtime="threaded").to_dict(), "autotune": {"why": "fastest"}}))
    return str(path)


@pytest.mark.parametrize("as_path", [str, Path])
def test_a_plan_file_path_is_loaded_as_pearl_train_loads_it(tmp_path, as_path):
    agent = pearl.DQN(env="CartPole-v1", plan=as_path(autotuned_plan(tmp_path)), **TINY)
    assert agent.plan.runtime == "threaded"


def test_a_plan_mapping_is_checked_as_a_plan_files():
    agent = pearl.DQN(env="CartPole-v1", plan={"runtime": "processes", "actors": 2}, **TINY)
    assert (agent.plan.runtime, agent.plan.actors) == ("processes", 2)
    with pytest.raises(ConfigError, match=r"^plan\.runtime: expected one of .*got 'fast'$"):
        pearl.DQN(env="CartPole-v1", plan={"runtime": "fast"})
    with pytest.raises(ConfigError, match=r"^plan\.actor: unknown key"):
        pearl.DQN(env="CartPole-v1", plan={"actor": 2})


@pytest.mark.parametrize("make", [lambda plan: pearl.DQN(env="CartPole-v1", plan=plan),
                                  lambda plan: pearl.make_agent(pearl.ExperimentConfig(), plan)])
def test_a_plan_of_another_type_is_one_line(make):
    with pytest.raises(ConfigError, match=r"^plan: expected a Plan, a plan file's path or a mapping of plan fields, "
                                          r"got list$"):
        make(["threaded"])


def test_make_agent_reads_a_config_file_and_a_plan_file(tmp_path):
    config = tmp_path / "cfg.yaml"
    config.write_text("algo: sac\nenv: Pendulum-v1\nsac: {hidden: [16]}\n")
    agent = pearl.make_agent(str(config), autotuned_plan(tmp_path))
    assert isinstance(agent, pearl.SAC) and agent.config.sac.hidden == [16] and agent.plan.runtime == "threaded"
    assert pearl.make_agent({"algo": "td3", "env": "Pendulum-v1"}).algo_name == "td3"
    with pytest.raises(ConfigError, match=r"cfg2\.yaml: no such config file$"):
        pearl.make_agent(tmp_path / "cfg2.yaml")
    with pytest.raises(ConfigError, match=r"^config: expected an ExperimentConfig, a config file's path or a mapping "
                                          r"of config sections, got int$"):
        pearl.make_agent(7)


def test_load_takes_a_plan_mapping(tmp_path):
    pearl.DQN(env="CartPole-v1", **TINY).save(tmp_path / "agent")
    assert pearl.load(tmp_path / "agent", plan={"runtime": "threaded"}).plan.runtime == "threaded"


# -- evaluate(episodes) ----------------------------------------------------------------------------
def test_evaluate_takes_a_positive_number_of_episodes_or_the_configs():
    agent = pearl.DQN(env="CartPole-v1", seed=1, **TINY)
    for episodes in (0, -1, 2.5, 2.0, True, "3"):
        with pytest.raises(ConfigError, match=rf"^episodes: expected a positive integer, got {episodes!r}$"):
            agent.evaluate(episodes)
    assert len(agent.evaluate(np.int64(2))["returns"]) == 2
    assert len(agent.evaluate()["returns"]) == agent.config.eval.episodes


# -- an env that breaks its own observation space --------------------------------------------------
@pytest.mark.parametrize("runtime", ["sequential", "threaded", "processes"])
@pytest.mark.parametrize("env_id, call", [("BadShapeEnv-v0", "step()"), ("BadResetEnv-v0", "reset()")])
def test_an_observation_of_another_shape_names_the_env(runtime, env_id, call):
    agent = pearl.DQN(env=env_id, plan=Plan(runtime=runtime), **TINY)
    with pytest.raises(ConfigError) as raised:
        agent.train(100)
    assert str(raised.value) == shape_error(env_id, call)


def test_an_actor_process_reports_it_in_one_line():
    agent = pearl.DQN(env="BadInActorsEnv-v0", plan=Plan(runtime="processes", act_while_actors_start=False), **TINY)
    with pytest.raises(PearlError) as raised:
        agent.train(100)
    assert str(raised.value) == "actor 0 failed: " + shape_error("BadInActorsEnv-v0", "step()")


USER_MODULE = """
import gymnasium as gym
import numpy as np


class CliBadShape(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(3, np.float32), {}

    def step(self, action):
        return np.zeros(5, np.float32), 1.0, False, False, {}


gym.register("CliBadShape-v0", entry_point=CliBadShape, max_episode_steps=20)
"""


def test_pearl_train_prints_it_in_one_line(tmp_path, monkeypatch, capsys):
    (tmp_path / "clibadshape.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    config = tmp_path / "exp.yaml"
    config.write_text("dqn: {hidden: [16], learning_starts: 10}\neval: {episodes: 1}\nlog: {plot: false}\n")
    code = main(["train", str(config), "--import", "clibadshape", "--env", "CliBadShape-v0", "--steps", "100",
                 "--run-dir", str(tmp_path / "run"), "--quiet"])
    err = capsys.readouterr().err
    assert code != 0 and "Traceback" not in err, err
    # what the command says before it trains, then the error
    assert err.splitlines()[1:] == ["pearl: error: " + shape_error("CliBadShape-v0", "step()")], err


def test_loading_with_an_env_of_other_spaces_names_both_envs(tmp_path):
    agent = pearl.DQN(env="CartPole-v1", total_steps=600, learning_starts=500, hidden=[8])
    agent.learn(600)
    agent.save(tmp_path / "cartpole")
    with pytest.raises(PearlError, match=r"^env Acrobot-v1: its spaces do not fit the checkpoint.s, "
                                         r"saved with env CartPole-v1 \("):
        pearl.DQN.load(tmp_path / "cartpole", env="Acrobot-v1")
