"""Gymnasium environments: checked ids and spaces, with errors a user can act on."""
from __future__ import annotations

import copy
import difflib
import functools
import importlib
import itertools
import re

import gymnasium as gym
import numpy as np

from pearl.errors import ConfigError


def _first_line(err: Exception) -> str:
    """An exception from the user's code as one line (the CLI prints one line per mistake)."""
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0]}" if text else type(err).__name__


def import_module(name: str, field: str) -> None:
    """Imports a user's module (one that registers custom environments); one line if it fails."""
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as err:
        raise ConfigError(f"{field}: no module named {err.name!r} (importing {name!r})") from None
    except Exception as err:  # the user's module raised while it was imported
        raise ConfigError(f"{field}: importing {name!r} failed: {_first_line(err)}") from None


def import_modules(names, field: str = "imports") -> None:
    for i, name in enumerate(names):
        import_module(name, f"{field}[{i}]")


def check_env_id(env_id: str, field: str = "env") -> None:
    """A registered id, or Gymnasium's 'module:EnvId' (the module is imported, then the id made)."""
    module, _, name = env_id.rpartition(":")
    if module:
        import_module(module, field)
        env_id = name
    if env_id in gym.registry:
        return
    close = difflib.get_close_matches(env_id, list(gym.registry), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ConfigError(f"{field}: unknown Gymnasium environment id {env_id!r}{hint}")


_FACTORIES: dict[str, object] = {}  # ids registered by `register_source` -> their factory
_NUMBERS = itertools.count(1)


def register_source(env) -> str:
    """An env factory (a callable returning a gymnasium.Env) or an env instance given in Python ->
    the Gymnasium id that makes it (an instance: a deep copy of it each time, so the training,
    probing and evaluation envs are separate). Actor processes get the factory pickled."""
    if isinstance(env, gym.Env):
        factory, name = functools.partial(copy.deepcopy, env), type(env).__name__
    elif callable(env):
        factory, name = env, getattr(env, "__qualname__", type(env).__name__)
    else:
        raise ConfigError(f"env: expected a Gymnasium id, an env factory or an env instance, got {env!r}")
    env_id = f"pearl/{re.sub(r'[^A-Za-z0-9_.]', '_', name)}-v{next(_NUMBERS)}"
    gym.register(env_id, entry_point=factory)
    _FACTORIES[env_id] = factory
    return env_id


def env_factory(env_id: str):
    """The factory `register_source` registered `env_id` with, or None for any other id."""
    return _FACTORIES.get(env_id)


def env_module(env_id: str) -> str | None:
    """The module that defines `env_id`'s environment: an actor process imports it before making
    the env, and finds it where the learner did. '__main__' when the user's script defined it
    (no other process can import that)."""
    spec = gym.registry.get(env_id.rpartition(":")[2])
    if spec is None:
        return None
    if isinstance(spec.entry_point, str):  # Gymnasium's "module:Class" form
        return spec.entry_point.partition(":")[0]
    return getattr(spec.entry_point, "__module__", None)


def make_env(env_id: str, seed: int | None = None, field: str = "env") -> gym.Env:
    check_env_id(env_id, field)
    try:
        env = gym.make(env_id, disable_env_checker=True)
    except gym.error.DependencyNotInstalled as err:
        raise ConfigError(f"{field}: {env_id} needs an extra package ({err})") from None
    except Exception as err:  # the user's environment failed to construct
        raise ConfigError(f"{field}: making {env_id} failed: {_first_line(err)}") from None
    if seed is not None:
        env.action_space.seed(seed)
    return env


def discrete_spaces(env: gym.Env, env_id: str, field: str = "env") -> tuple[int, int]:
    """(observation size, action count) for a Box-observation, Discrete-action environment."""
    obs_space, action_space = env.observation_space, env.action_space
    if not isinstance(obs_space, gym.spaces.Box) or len(obs_space.shape) != 1:
        raise ConfigError(f"{field}: {env_id} has observations {obs_space}; DQN needs a flat Box")
    if not isinstance(action_space, gym.spaces.Discrete):
        raise ConfigError(f"{field}: {env_id} has actions {action_space}; DQN needs Discrete actions")
    return int(np.prod(obs_space.shape)), int(action_space.n)


def box_spaces(env: gym.Env, env_id: str, algo: str, field: str = "env") -> tuple[int, int]:
    """(observation size, action size) for a flat-Box-observation, bounded-Box-action environment."""
    obs_space, action_space = env.observation_space, env.action_space
    name = algo.upper()
    if not isinstance(obs_space, gym.spaces.Box) or len(obs_space.shape) != 1:
        raise ConfigError(f"{field}: {env_id} has observations {obs_space}; {name} needs a flat Box")
    if not isinstance(action_space, gym.spaces.Box) or len(action_space.shape) != 1:
        raise ConfigError(f"{field}: {env_id} has actions {action_space}; {name} needs Box actions")
    if not (np.all(np.isfinite(action_space.low)) and np.all(np.isfinite(action_space.high))):
        raise ConfigError(f"{field}: {env_id} has unbounded actions {action_space}; {name} needs finite bounds")
    return int(obs_space.shape[0]), int(action_space.shape[0])


def episode_returns(env_id: str, act, episodes: int, seed: int) -> list[float]:
    """The returns of `episodes` episodes of a fresh env seeded `seed`, `seed + 1`, ..., acting
    with `act(observation) -> the env's action`."""
    env = make_env(env_id, seed)
    returns = []
    try:
        for episode in range(episodes):
            obs, _ = env.reset(seed=seed + episode)
            total, done = 0.0, False
            while not done:
                obs, reward, terminated, truncated, _ = env.step(act(obs))
                total += float(reward)
                done = terminated or truncated
            returns.append(total)
    finally:
        env.close()
    return returns

