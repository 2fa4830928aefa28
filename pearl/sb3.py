"""Stable-Baselines3's constructor, names and defaults, for `pearl.DQN("MlpPolicy", env, ...)`
(and DDPG, TD3, SAC): an SB3 script runs after changing its imports (README, "Coming from
Stable-Baselines3").

`sb3_overrides(algo, options, policy, n_envs)` takes SB3's keyword names out of an agent's
options and returns them as dotted config keys; built SB3-style (a policy name first), the agent
starts from SB3's own defaults instead of PEARL's (CnnPolicy's for images); `fit_observations`
checks the policy name against the env and makes `optimize_memory_usage=True` the frame table.
What PEARL cannot do the SB3 way (a learning rate schedule, train_freq in episodes,
state-dependent exploration, Ornstein-Uhlenbeck noise, a custom replay buffer class, ...) is one
line naming the argument.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from pearl.callbacks import evaluate_policy  # SB3's stable_baselines3.common.evaluation.evaluate_policy
from pearl.vec_env import DummyVecEnv  # SB3's stable_baselines3.common.vec_env.DummyVecEnv
from pearl.config import OptimizerConfig
from pearl.errors import ConfigError

POLICIES = ("MlpPolicy", "CnnPolicy")
# SB3's CnnPolicy reads an image with NatureCNN: the Nature convolutions (PEARL's default `conv`) and
# a 512-wide layer, then the policy's net_arch (its CnnPolicy defaults: none for DQN, 256-256 for
# DDPG and TD3, whose MlpPolicy has 400-300, and for SAC)
NATURE_FEATURES = 512
CNN_NET_ARCH = {"dqn": [], "ddpg": [256, 256], "td3": [256, 256], "sac": [256, 256]}

# SB3 2.x's defaults, as dotted PEARL config keys (where PEARL's own defaults differ): SB3's DQN is
# not double DQN and bootstraps one step; its continuous algorithms add no action noise by default
_SHARED = {"replay.capacity": 1_000_000, "replay.kind": "uniform", "learning_starts": 100, "gamma": 0.99,
           "train_freq": 1, "gradient_steps": 1, "n_step": 1}
SB3_DEFAULTS = {
    "dqn": {**_SHARED, "lr": 1e-4, "batch_size": 32, "tau": 1.0, "train_freq": 4, "target_update_interval": 10_000,
            "exploration.fraction": 0.1, "exploration.initial": 1.0, "exploration.final": 0.05,
            "max_grad_norm": 10.0, "hidden": [64, 64], "double": False, "dueling": False},
    "ddpg": {**_SHARED, "lr": 1e-3, "batch_size": 256, "tau": 0.005, "hidden": [400, 300], "action_noise": 0.0},
    "td3": {**_SHARED, "lr": 1e-3, "batch_size": 256, "tau": 0.005, "hidden": [400, 300], "action_noise": 0.0,
            "policy_delay": 2, "target_policy_noise": 0.2, "target_noise_clip": 0.5},
    "sac": {**_SHARED, "lr": 3e-4, "batch_size": 256, "tau": 0.005, "hidden": [256, 256],
            "autotune": True, "init_ent_coef": 1.0, "target_entropy": None},
}

# SB3 name -> the algorithm section's key (same name when not listed)
_RENAMED = {"learning_rate": "lr", "exploration_fraction": "exploration.fraction",
            "exploration_initial_eps": "exploration.initial", "exploration_final_eps": "exploration.final"}
_SECTION_NAMES = {
    "dqn": {"learning_rate", "learning_starts", "batch_size", "tau", "gamma", "target_update_interval",
            "exploration_fraction", "exploration_initial_eps", "exploration_final_eps", "max_grad_norm"},
    "ddpg": {"learning_rate", "learning_starts", "batch_size", "tau", "gamma"},
    "td3": {"learning_rate", "learning_starts", "batch_size", "tau", "gamma", "policy_delay",
            "target_policy_noise", "target_noise_clip"},
    "sac": {"learning_rate", "learning_starts", "batch_size", "tau", "gamma"},
}
# SB3's hyperparameter attributes (model.learning_rate, ...) that PEARL's agents answer from their config
HYPERPARAMETERS = ("learning_rate", "gamma", "batch_size", "buffer_size", "learning_starts", "tau",
                   "target_update_interval", "exploration_fraction", "exploration_initial_eps",
                   "exploration_final_eps", "max_grad_norm", "policy_delay", "target_policy_noise",
                   "target_noise_clip", "seed")


def hyperparameter_key(algo: str, name: str) -> str | None:
    """The dotted config key that holds SB3's attribute `name` of a model of `algo` (the names
    sb3_overrides takes, the other way), or None if SB3's model of that algorithm has none."""
    if name in _SECTION_NAMES[algo]:
        return _key(algo, _RENAMED.get(name, name))
    return {"buffer_size": "replay.capacity", "seed": "seed"}.get(name)


# arguments accepted only at SB3's default (PEARL has no other behaviour for them)
_ONLY_DEFAULT = {"replay_buffer_class": None, "replay_buffer_kwargs": None,
                 "use_sde": False, "sde_sample_freq": -1, "use_sde_at_warmup": False, "stats_window_size": 100,
                 "_init_setup_model": True, "create_eval_env": False}


class NormalActionNoise:
    """SB3's Gaussian action noise, N(mean, sigma) per action dimension, added to the actor's action
    in [-1, 1] units (half the action range), as SB3 adds it."""

    def __init__(self, mean, sigma, dtype=np.float32):
        self._mu, self._sigma = np.asarray(mean), np.asarray(sigma)
        self.dtype = dtype

    def __call__(self) -> np.ndarray:
        return np.random.normal(self._mu, self._sigma).astype(self.dtype)

    def reset(self) -> None:
        pass

    def __repr__(self) -> str:
        return f"NormalActionNoise(mu={self._mu}, sigma={self._sigma})"


class OrnsteinUhlenbeckActionNoise:
    """SB3's Ornstein-Uhlenbeck process (temporally correlated noise). A usable noise process; the
    agents refuse it: PEARL's actors add independent Gaussian noise (NormalActionNoise)."""

    def __init__(self, mean, sigma, theta: float = 0.15, dt: float = 1e-2, initial_noise=None, dtype=np.float32):
        self._mu, self._sigma = np.asarray(mean, dtype), np.asarray(sigma, dtype)
        self._theta, self._dt, self.initial_noise, self.dtype = theta, dt, initial_noise, dtype
        self.reset()

    def __call__(self) -> np.ndarray:
        noise = (self.noise_prev + self._theta * (self._mu - self.noise_prev) * self._dt
                 + self._sigma * np.sqrt(self._dt) * np.random.normal(size=self._mu.shape))
        self.noise_prev = noise
        return noise.astype(self.dtype)

    def reset(self) -> None:
        self.noise_prev = np.zeros_like(self._mu) if self.initial_noise is None else np.asarray(self.initial_noise)


def is_policy(value) -> bool:
    """Whether a first positional argument is SB3's policy name rather than PEARL's env."""
    return isinstance(value, str) and value.endswith("Policy")


def check_policy(policy: str) -> None:
    if policy not in POLICIES:
        raise ConfigError(f"policy: expected 'MlpPolicy' (flat observations) or 'CnnPolicy' (images), got {policy!r}")


def fit_observations(config, policy: str | None, frames_once: bool):
    """The config once SB3's policy name is checked against the env's observations ('MlpPolicy'
    flat, 'CnnPolicy' images: SB3's MlpPolicy would flatten an image, PEARL reads one with its CNN)
    and `optimize_memory_usage=True` made PEARL's frame table (replay.frame_stack: each frame stored
    once) for observations stacked by gymnasium's FrameStackObservation, as Atari ids are."""
    if not isinstance(frames_once, bool):
        raise ConfigError(f"optimize_memory_usage: expected True or False, got {frames_once!r}")
    if policy is None and not frames_once:
        return config
    from pearl.config import apply_overrides
    from pearl.envs import make_env, observation_layout
    from pearl.nets import is_image

    probe = make_env(config.env, kwargs=config.env_kwargs)
    try:
        shape = observation_layout(probe, config.env, config.algo)[0]
        stack = _frame_stack(probe)
    finally:
        probe.close()
    if policy is not None and is_image(shape) != (policy == "CnnPolicy"):
        raise ConfigError(f"policy: {config.env}'s observations {shape} are "
                          + ("images: use 'CnnPolicy' (PEARL reads images with a CNN; SB3's MlpPolicy would "
                             "flatten them)" if is_image(shape) else "flat: 'CnnPolicy' reads images; use 'MlpPolicy'"))
    if not frames_once:
        return config
    if config.algo != "dqn":
        raise ConfigError(f"optimize_memory_usage: PEARL's frame table feeds DQN; {config.algo.upper()} stores whole "
                          f"observations")
    if stack is None or shape[0] != stack:
        raise ConfigError(f"optimize_memory_usage: PEARL stores each frame once for observations stacked by "
                          f"gymnasium's FrameStackObservation (padding 'reset'), as Atari ids are; {config.env}'s "
                          f"observations {shape} are not")
    return apply_overrides(config, {"replay.frame_stack": stack})


def _frame_stack(env) -> int | None:
    """The stack size of a FrameStackObservation (padding 'reset': the frame table's) wrapping `env`."""
    import gymnasium as gym

    while isinstance(env, gym.Wrapper):
        if isinstance(env, gym.wrappers.FrameStackObservation):
            return env.stack_size if env.padding_type == "reset" else None
        env = env.env
    return None


def sb3_overrides(algo: str, options: dict, policy: str | None, n_envs: int) -> dict:
    """Removes SB3's names from `options` (PEARL's own stay) and returns them as dotted config keys,
    over SB3's defaults for `policy` if the agent is built SB3's way. `n_envs`: the vector env's
    size (SB3 counts train_freq in vector steps; PEARL in env steps)."""
    section = _SECTION_NAMES[algo]
    dotted = {_key(algo, k): v for k, v in SB3_DEFAULTS[algo].items()} if policy is not None else {}
    if policy == "CnnPolicy":
        dotted[f"{algo}.hidden"] = [NATURE_FEATURES, *CNN_NET_ARCH[algo]]
    for name in list(options):
        value = options[name]
        if name in section:
            dotted[_key(algo, _RENAMED.get(name, name))] = _number(name, value)
        elif name in _ONLY_DEFAULT:
            if value != _ONLY_DEFAULT[name] and not (name == "replay_buffer_kwargs" and value == {}):
                raise ConfigError(f"{name}: PEARL supports only SB3's default ({_ONLY_DEFAULT[name]!r}), got {value!r}")
        elif name == "train_freq":
            dotted[f"{algo}.train_freq"] = _train_freq(value) * n_envs
        elif name == "gradient_steps":
            dotted[f"{algo}.gradient_steps"] = value
        elif name == "buffer_size":
            dotted["replay.capacity"] = _number(name, value, integer=True)
        elif name == "policy_kwargs":
            dotted.update(_policy_kwargs(algo, value, policy == "CnnPolicy"))
        elif name == "action_noise":
            dotted[f"{algo}.action_noise"] = _action_noise(algo, value)
        elif name == "ent_coef" and algo == "sac":
            dotted.update(_ent_coef(value))
        elif name == "target_entropy" and algo == "sac":
            dotted["sac.target_entropy"] = None if value == "auto" else _number(name, value)
        elif name == "target_update_interval" and algo == "sac":
            if value != 1:
                raise ConfigError(f"target_update_interval: PEARL's SAC moves its targets every update "
                                  f"(SB3's default 1), got {value!r}")
        elif name == "device":
            dotted["runtime.device"] = "cpu" if value == "auto" else value
        elif name == "seed":
            if value is not None:
                dotted["seed"] = value
        else:
            continue
        del options[name]
    if dotted.get(f"{algo}.gradient_steps") == -1:  # SB3: as many updates as env steps collected
        dotted[f"{algo}.gradient_steps"] = dotted.get(f"{algo}.train_freq", 1)
    return dotted


def _key(algo: str, name: str) -> str:
    return name if name.startswith(("replay.", "runtime.")) or name == "seed" else f"{algo}.{name}"


def _number(name: str, value, integer: bool = False):
    """SB3 scripts write sizes as 1e6; the config takes integers (a float of an integer is one)."""
    if callable(value):
        raise ConfigError(f"{name}: PEARL takes a constant, not a schedule (a callable), for {name}")
    if integer and isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _train_freq(value) -> int:
    if isinstance(value, (tuple, list)) or hasattr(value, "unit"):
        frequency, unit = (value.frequency, value.unit) if hasattr(value, "unit") else tuple(value)
        if str(getattr(unit, "value", unit)) != "step":
            raise ConfigError(f"train_freq: PEARL trains every N env steps; expected an integer or (N, 'step'), "
                              f"got {value!r}")
        value = frequency
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"train_freq: expected an integer >= 1 or (N, 'step'), got {value!r}")
    return value


# config.OptimizerConfig's options, which torch's optimizers name alike
OPTIMIZER_KWARGS = tuple(option.name for option in dataclasses.fields(OptimizerConfig) if option.name != "kind")


def _policy_kwargs(algo: str, kwargs, cnn: bool) -> dict:
    """`cnn`: SB3's CnnPolicy, whose net_arch follows NatureCNN's 512 features."""
    import torch

    if not isinstance(kwargs, dict):
        raise ConfigError(f"policy_kwargs: expected a dict such as dict(net_arch=[64, 64]), got {kwargs!r}")
    out = {}
    for name, value in kwargs.items():
        if name == "net_arch":
            if isinstance(value, dict):  # SB3's separate actor (pi) and critic (qf) widths
                widths = {tuple(v) for v in value.values()}
                if set(value) - {"pi", "qf"} or len(widths) != 1:
                    raise ConfigError(f"policy_kwargs.net_arch: PEARL's actor and critics share their widths; "
                                      f"expected a list or dict(pi=W, qf=W) with one W, got {value!r}")
                value = list(widths.pop())
            value = list(value) if isinstance(value, (list, tuple)) else value
            out[f"{algo}.hidden"] = [NATURE_FEATURES, *value] if cnn and isinstance(value, list) else value
        elif name == "activation_fn":
            if value is not torch.nn.ReLU:
                raise ConfigError(f"policy_kwargs.activation_fn: PEARL's networks use ReLU, got {value!r}")
        elif name == "n_critics" and algo in ("td3", "sac"):
            if value != 2:
                raise ConfigError(f"policy_kwargs.n_critics: {algo.upper()} in PEARL has 2 critics, got {value!r}")
        elif name == "optimizer_class" and algo == "dqn":
            kinds = {torch.optim.Adam: "adam", torch.optim.RMSprop: "rmsprop"}
            if value not in kinds:
                raise ConfigError(f"policy_kwargs.optimizer_class: PEARL's DQN steps torch.optim.Adam or "
                                  f"torch.optim.RMSprop, got {value!r}")
            out["dqn.optimizer.kind"] = kinds[value]
        elif name == "optimizer_kwargs" and algo == "dqn":
            if not isinstance(value, dict) or set(value) - set(OPTIMIZER_KWARGS):
                raise ConfigError(f"policy_kwargs.optimizer_kwargs: expected a dict of {', '.join(OPTIMIZER_KWARGS)}, "
                                  f"got {value!r}")
            out.update({f"dqn.optimizer.{key}": option for key, option in value.items()})
        else:
            extra = {"dqn": ", optimizer_class, optimizer_kwargs"}.get(algo, ", n_critics=2" if algo in ("td3", "sac") else "")
            raise ConfigError(f"policy_kwargs.{name}: not supported by PEARL (it takes net_arch, "
                              f"activation_fn=nn.ReLU{extra})")
    return out


def _action_noise(algo: str, noise) -> float:
    if algo not in ("ddpg", "td3"):
        raise ConfigError(f"action_noise: PEARL's {algo.upper()} explores with its own policy; "
                          f"action noise is for DDPG and TD3")
    if noise is None:
        return 0.0
    if isinstance(noise, NormalActionNoise):
        sigma = np.unique(noise._sigma)
        if np.any(noise._mu != 0) or len(sigma) != 1:
            raise ConfigError(f"action_noise: PEARL adds zero-mean Gaussian noise with one sigma for every "
                              f"action dimension, got {noise!r}")
        return float(sigma[0])
    raise ConfigError(f"action_noise: PEARL's actors add independent Gaussian noise; expected "
                      f"NormalActionNoise (pearl.sb3) or None, got {type(noise).__name__}")


def _ent_coef(value) -> dict:
    if isinstance(value, str):
        if value == "auto":
            return {"sac.autotune": True, "sac.init_ent_coef": 1.0}
        if value.startswith("auto_"):
            try:
                return {"sac.autotune": True, "sac.init_ent_coef": float(value[5:])}
            except ValueError:
                pass
        raise ConfigError(f"ent_coef: expected 'auto', 'auto_<initial value>' or a number, got {value!r}")
    return {"sac.autotune": False, "sac.init_ent_coef": _number("ent_coef", value)}


def vector_env(env):
    """(a single-env form of `env`, n_envs) for a Gymnasium vector env or an SB3 VecEnv;
    (env, 1) for anything else."""
    import gymnasium as gym

    if isinstance(env, gym.vector.VectorEnv):
        spec = getattr(env, "spec", None)
        vector_only = {"num_envs", "vectorization_mode", "vector_kwargs", "max_episode_steps"}
        if spec is not None and spec.id in gym.registry and not spec.kwargs.keys() - vector_only:
            return spec.id, env.num_envs
        fns = getattr(env, "env_fns", None)
        if fns:
            return fns[0], env.num_envs
        raise ConfigError("env: a vector env PEARL cannot remake (no registered spec, no env_fns); "
                          "pass its id or a function that makes one env")
    if hasattr(env, "num_envs") and hasattr(env, "envs"):  # SB3's DummyVecEnv
        first = env.envs[0]
        spec = getattr(getattr(first, "unwrapped", first), "spec", None)
        return (spec.id if spec is not None and spec.id in gym.registry else first), env.num_envs
    if hasattr(env, "num_envs"):
        raise ConfigError(f"env: a {type(env).__name__} runs its envs in other processes; pass the env id or "
                          f"a function that makes one env (PEARL runs its own actor processes)")
    return env, 1


__all__ = ["DummyVecEnv", "NormalActionNoise", "OrnsteinUhlenbeckActionNoise", "evaluate_policy"]
