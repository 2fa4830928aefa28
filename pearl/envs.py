"""Gymnasium environments: checked ids and spaces, with errors a user can act on."""
from __future__ import annotations

import copy
import difflib
import functools
import importlib
import itertools
import re
import warnings

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
    if env_id in gym.registry or _register_known(env_id):
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


def make_env(env_id: str, seed: int | None = None, field: str = "env", kwargs: dict | None = None) -> gym.Env:
    """`env_id` made with `kwargs` (a config's env_kwargs) and PEARL's standard wrappers."""
    check_env_id(env_id, field)
    name = env_id.rpartition(":")[2]
    kwargs = kwargs or {}
    # MinAtar's v0 and v1 are two action sets (all 6 actions, the MinAtar paper's; or the game's
    # minimal set), not an old and a new version: made from its spec, a v0 id skips Gymnasium's
    # "out of date, upgrade to v1" notice, which would send users to a different experiment
    target = gym.spec(env_id) if env_id.startswith("MinAtar/") else env_id
    try:
        env = atari_env(name, **kwargs) if is_atari(name) else gym.make(target, disable_env_checker=True, **kwargs)
    except gym.error.DependencyNotInstalled as err:
        raise ConfigError(f"{field}: {env_id} needs an extra package ({err})") from None
    except ConfigError:
        raise
    except TypeError as err:
        if kwargs:  # most likely an argument the env does not take (Gymnasium appends all its kwargs)
            reason = _first_line(err).partition(" was raised from the environment creator")[0]
            raise ConfigError(f"env_kwargs: making {env_id} with {kwargs} failed: {reason}") from None
        raise ConfigError(f"{field}: making {env_id} failed: {_first_line(err)}") from None
    except Exception as err:  # the user's environment failed to construct
        raise ConfigError(f"{field}: making {env_id} failed: {_first_line(err)}") from None
    env = standard_wrappers(env, name)
    if seed is not None:
        env.action_space.seed(seed)
    return env


class _IntDiscrete(gym.spaces.Discrete):
    """A Discrete space whose `contains` answers a Python int on a short path: the same answer
    as Discrete's (an int within [start, start + n) is in range of the int64 dtype and casts to
    it), without its np.iinfo, dtype cast and np.can_cast (~2 us of a CartPole step's ~8, which
    the env's own `assert action_space.contains(action)` pays every step). Anything else takes
    Discrete's own check."""

    def contains(self, x) -> bool:
        if type(x) is int:
            start = int(self.start)
            return start <= x < start + int(self.n)
        return super().contains(x)


def env_stepper(env: gym.Env):
    """`env.step`, or for the chain `gym.make` builds (TimeLimit over OrderEnforcing over the env
    itself, exactly those classes) a function doing what those two wrappers' steps do - the env's
    own step, then TimeLimit's count and truncation - without their three Python frames (~1 us of
    a CartPole step's ~8). The env must have been reset through `env` (OrderEnforcing's check,
    TimeLimit's count restart), as an actor always does. An env's Discrete action space (exactly
    that class, int64) becomes an `_IntDiscrete` in place: its state and RNG stay, the actors
    hand it Python ints."""
    from gymnasium.wrappers import OrderEnforcing, TimeLimit

    space = env.unwrapped.action_space
    if type(space) is gym.spaces.Discrete and space.dtype == np.int64:
        space.__class__ = _IntDiscrete
    inner = getattr(env, "env", None)
    if not (type(env) is TimeLimit and type(inner) is OrderEnforcing and not isinstance(inner.env, gym.Wrapper)):
        return env.step
    limit, own_step, max_steps = env, inner.env.step, env._max_episode_steps

    def step(action):
        obs, reward, terminated, truncated, info = own_step(action)
        limit._elapsed_steps += 1
        if limit._elapsed_steps >= max_steps:
            truncated = True
        return obs, reward, terminated, truncated, info

    return step


# -- EnvPool: an actor's envs as one pool of C++ envs (plan.env_engine: envpool) ------------------
ENV_ENGINES = ("gymnasium", "envpool")
ENVPOOL_EXTRA = "pip install 'pearl-rl[envpool]'"


def check_envpool(field: str = "plan.env_engine") -> None:
    """One line if EnvPool is not installed (found without importing it)."""
    import importlib.util

    if importlib.util.find_spec("envpool") is None:
        raise ConfigError(f"{field}: envpool is not installed ({ENVPOOL_EXTRA})")


def envpool_has(env_id: str) -> bool:
    """Whether EnvPool is installed and has `env_id`."""
    import importlib.util

    if importlib.util.find_spec("envpool") is None:
        return False
    import envpool

    return env_id.rpartition(":")[2] in envpool.list_all_envs()


def envpool_envs(env_id: str, n_envs: int, seed: int, field: str = "plan.env_engine"):
    """`n_envs` of `env_id` as one EnvPool in sync mode (every step steps them all), seeded `seed`
    (EnvPool seeds its env i from it: not the initial states of Gymnasium's seed + i), with
    Gymnasium's time limit for the id. Vector observations only: EnvPool's image envs preprocess
    differently from `atari_env`."""
    check_envpool(field)
    import envpool

    name = env_id.rpartition(":")[2]
    if not envpool_has(name):
        raise ConfigError(f"{field}: EnvPool has no {name!r} (envpool.list_all_envs() lists its ids); "
                          f"use env_engine: gymnasium")
    spec = gym.registry.get(name)
    limit = {} if spec is None or spec.max_episode_steps is None else {"max_episode_steps": spec.max_episode_steps}
    with warnings.catch_warnings():  # its spaces' float64 bounds, which Gymnasium casts to float32
        warnings.simplefilter("ignore", UserWarning)
        # one worker thread: the other cores are the learner's and the other actors'. EnvPool seeds
        # env i with seed + i, an int32: a processes-runtime actor's seed is any uint32
        pool = envpool.make_gymnasium(name, num_envs=n_envs, batch_size=n_envs, num_threads=1,
                                      seed=seed % (2 ** 31 - n_envs), **limit)
        _ = pool.observation_space, pool.action_space  # made (and cached by EnvPool) under the filter
    if len(pool.observation_space.shape) != 1:
        pool.close()
        raise ConfigError(f"{field}: envpool runs vector-observation envs here; {name} has observations "
                          f"{pool.observation_space.shape}: use env_engine: gymnasium")
    return pool


# -- pixels: Atari (ale-py), MinAtar, and image observations in general ----------------------------
ATARI_EXTRA = "pip install 'pearl-rl[atari]'"


def _register_known(env_id: str) -> bool:
    """Registers the ids of the image-env packages Gymnasium 1.x no longer loads as plugins (ale-py's
    ALE/... and ...NoFrameskip-v4, MinAtar/...) when `env_id` is one of theirs; True if it now is."""
    if env_id.startswith("MinAtar/"):
        try:
            import logging

            logging.getLogger().disabled, was = True, logging.getLogger().disabled  # its seaborn warning
            try:
                from minatar.gym import register_envs
            finally:
                logging.getLogger().disabled = was
        except ModuleNotFoundError:
            raise ConfigError(f"env: {env_id} needs the minatar package ({ATARI_EXTRA})") from None
        register_envs()
    else:  # ale-py's ids: ALE/Pong-v5, PongNoFrameskip-v4, Pong-v4, ...
        try:
            import ale_py  # noqa: F401  (importing it registers its ids)
        except ModuleNotFoundError:
            if env_id.startswith("ALE/") or env_id.endswith("NoFrameskip-v4"):
                raise ConfigError(f"env: {env_id} needs ale-py ({ATARI_EXTRA})") from None
            return False
    return env_id in gym.registry


def is_atari(env_id: str) -> bool:
    spec = gym.registry.get(env_id)
    return spec is not None and spec.entry_point == "ale_py.env:AtariEnv"


def atari_env(env_id: str, noop_max: int = 30, frame_skip: int = 4, screen_size: int = 84,
              terminal_on_life_loss: bool = False, clip_rewards: bool = True, frame_stack: int = 4,
              **make_kwargs) -> gym.Env:
    """An ALE game with the standard DQN preprocessing (Mnih et al. 2015; Machado et al. 2018):
    up to `noop_max` no-ops at reset, each action repeated `frame_skip` times with the max of the
    last two frames, `screen_size`^2 grey frames, optionally an episode end at each life lost,
    rewards clipped to their sign (the score stays in info['score'] for the episode returns), and
    the last `frame_stack` frames stacked on the first axis: observations (4, 84, 84) uint8.
    Gymnasium's own wrappers do each step. v5 ids keep their sticky actions (p = 0.25).

    `make_env` makes every ALE id through it, with a config's `env_kwargs` as its arguments (the
    preprocessing's by name, the rest gymnasium.make's), e.g. `env_kwargs: {terminal_on_life_loss:
    true, repeat_action_probability: 0.0}`.
    Gymnasium's terminal_on_life_loss ends the episode at a life lost, and the next reset starts a
    new game (not the SB3 / Dopamine variant that resumes the game)."""
    from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation

    if "frameskip" in make_kwargs:
        raise ConfigError(f"env_kwargs.frameskip: the Atari preprocessing repeats each action; give frame_skip "
                          f"instead (now {frame_skip})")
    env = gym.make(env_id, frameskip=1, disable_env_checker=True, **make_kwargs)  # AtariPreprocessing skips
    try:
        env = AtariPreprocessing(env, noop_max=noop_max, frame_skip=frame_skip, screen_size=screen_size,
                                 terminal_on_life_loss=terminal_on_life_loss, grayscale_obs=True, scale_obs=False)
    except gym.error.DependencyNotInstalled:
        raise ConfigError(f"env: {env_id}'s preprocessing needs opencv ({ATARI_EXTRA})") from None
    if clip_rewards:
        env = ScoreKeepingClip(env)
    return FrameStackObservation(env, frame_stack) if frame_stack > 1 else env


SCORE = "score"  # info key: the unclipped reward of a step whose reward the env clipped


class ScoreKeepingClip(gym.RewardWrapper):
    """Rewards clipped to their sign (DQN's reward clipping); the raw reward goes to info['score']
    so that the episode returns PEARL reports are game scores."""

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        info[SCORE] = reward
        return obs, float(np.sign(reward)), terminated, truncated, info


class ChannelsFirst(gym.ObservationWrapper):
    """(H, W, C) images -> (C, H, W), the convolutional networks' layout; boolean boards
    (MinAtar's) -> uint8 0/1."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        space = env.observation_space
        dtype = np.uint8 if space.dtype == np.bool_ else space.dtype
        low = np.transpose(space.low, (2, 0, 1)).astype(dtype)
        high = np.transpose(space.high, (2, 0, 1)).astype(dtype)
        self.observation_space = gym.spaces.Box(low, high, dtype=dtype)

    def observation(self, obs):
        return np.ascontiguousarray(np.transpose(obs, (2, 0, 1)), dtype=self.observation_space.dtype)


def _channels_last(space, env_id: str) -> bool:
    """An (H, W, C) image: MinAtar's boards (10x10xC, C up to 10), else any whose last axis (grey,
    RGB) is smaller than both others (Stable-Baselines3 guesses the same way)."""
    if not (isinstance(space, gym.spaces.Box) and len(space.shape) == 3):
        return False
    return env_id.startswith("MinAtar/") or space.shape[2] < min(space.shape[:2])


def standard_wrappers(env: gym.Env, env_id: str) -> gym.Env:
    """What every PEARL env of an image kind gets beside the Atari preprocessing (`make_env` makes
    ALE ids through `atari_env`): channels-last images (MinAtar's 10x10xC boards, CarRacing's
    frames) channels first."""
    if _channels_last(env.observation_space, env_id):
        return ChannelsFirst(env)
    return env


def observation_layout(env: gym.Env, env_id: str, algo: str, field: str = "env"):
    """(shape, dtype, scale) of the observations a run stores and learns from: a flat Box (float32)
    or an image Box (C, H, W) or (H, W), uint8 images kept uint8 (others float32);
    `scale` multiplies the observation at the network's input (1 / the Box's high for uint8).
    Anything else (Dict, Tuple, Discrete observations, more than 3 axes) is refused in one line."""
    space = env.observation_space
    if not isinstance(space, gym.spaces.Box) or not 1 <= len(space.shape) <= 3:
        raise ConfigError(f"{field}: {env_id} has observations {space}; {algo.upper()} needs a flat Box "
                          f"or an image Box (C, H, W)")
    if space.dtype == np.uint8 and len(space.shape) > 1:
        return tuple(space.shape), np.dtype(np.uint8), 1.0 / max(1.0, float(np.max(space.high)))
    return tuple(space.shape), np.dtype(np.float32), 1.0


def discrete_spaces(env: gym.Env, env_id: str, field: str = "env") -> tuple[int, int]:
    """(observation size, action count) for a Box-observation, Discrete-action environment."""
    obs_space, action_space = env.observation_space, env.action_space
    observation_layout(env, env_id, "dqn", field)
    if not isinstance(action_space, gym.spaces.Discrete):
        raise ConfigError(f"{field}: {env_id} has actions {action_space}; DQN needs Discrete actions")
    return int(np.prod(obs_space.shape)), int(action_space.n)


def box_spaces(env: gym.Env, env_id: str, algo: str, field: str = "env") -> tuple[int, int]:
    """(observation size, action size) for a Box-observation, bounded-Box-action environment."""
    obs_space, action_space = env.observation_space, env.action_space
    name = algo.upper()
    observation_layout(env, env_id, algo, field)
    if not isinstance(action_space, gym.spaces.Box) or len(action_space.shape) != 1:
        raise ConfigError(f"{field}: {env_id} has actions {action_space}; {name} needs Box actions")
    if not (np.all(np.isfinite(action_space.low)) and np.all(np.isfinite(action_space.high))):
        raise ConfigError(f"{field}: {env_id} has unbounded actions {action_space}; {name} needs finite bounds")
    return int(np.prod(obs_space.shape)), int(action_space.shape[0])


def episode_returns(env_id: str, act, episodes: int, seed: int, kwargs: dict | None = None) -> list[float]:
    """The returns of `episodes` episodes of a fresh env (made with `kwargs`) seeded `seed`,
    `seed + 1`, ..., acting with `act(observation) -> the env's action`."""
    env = make_env(env_id, seed, kwargs=kwargs)
    returns = []
    try:
        for episode in range(episodes):
            obs, _ = env.reset(seed=seed + episode)
            total, done = 0.0, False
            while not done:
                obs, reward, terminated, truncated, info = env.step(act(obs))
                total += float(info.get(SCORE, reward))
                done = terminated or truncated
            returns.append(total)
    finally:
        env.close()
    return returns

