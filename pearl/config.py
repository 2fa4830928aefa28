"""Experiment configuration: YAML -> typed dataclasses, with one-line errors naming the field.

Every section is a dataclass; `load_config` walks the YAML against the type hints, so an unknown
key, a wrong type or an out-of-range value is reported as `field.path: what was expected`.
"""
from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from pearl.errors import ConfigError


MAX_INT = 2**53
MAX_SEED = 2**32 - 1  # numpy's and torch's seeds and Gymnasium's env seeds all take it
MAX_WIDTH = 2**16  # units per hidden layer; beyond that one layer's weights alone outgrow a machine


@dataclass
class ExplorationConfig:
    initial: float = 1.0
    final: float = 0.05
    fraction: float = 0.1  # of total_steps over which epsilon decays linearly
    # where the decay begins: at step 0 (Stable-Baselines3's schedule), or at learning_starts, once
    # the replay holds its uniformly random start (Dopamine's and the MinAtar paper's)
    decay_from: Literal["start", "learning_starts"] = "start"

    def check(self, at: str) -> None:
        _in_range(at + ".initial", self.initial, 0.0, 1.0)
        _in_range(at + ".final", self.final, 0.0, 1.0)
        _in_range(at + ".fraction", self.fraction, 0.0, 1.0)


@dataclass
class OptimizerConfig:
    """DQN's optimizer (pearl.nets.make_optimizer): torch's Adam, or torch's RMSprop as the DQN
    papers ran it (Mnih et al. 2015 and the MinAtar paper: centered, with momentum). Adam learns
    with every learner kernel; RMSprop with the torch learner in float32."""
    kind: Literal["adam", "rmsprop"] = "adam"
    eps: float = 1e-8  # added to the denominator (torch's defaults for both)
    alpha: float = 0.99  # rmsprop: the squared gradient's smoothing constant
    momentum: float = 0.0  # rmsprop: momentum of the step
    centered: bool = False  # rmsprop: divide by the gradient's variance estimate, not its raw second moment

    def check(self, at: str) -> None:
        _positive(at + ".eps", self.eps)
        _in_range(at + ".alpha", self.alpha, 0.0, 1.0)
        _in_range(at + ".momentum", self.momentum, 0.0, 1.0)
        if self.kind == "adam":
            for name in RMSPROP_ONLY:
                if getattr(self, name) != OptimizerConfig.__dataclass_fields__[name].default:
                    raise ConfigError(f"{at}.{name}: an option of kind rmsprop; expected kind: rmsprop "
                                      f"or no {name} with kind adam")


RMSPROP_ONLY = ("alpha", "momentum", "centered")  # OptimizerConfig's options that Adam has not


@dataclass
class DQNConfig:
    hidden: list[int] = field(default_factory=lambda: [64, 64])
    lr: float = 1e-3
    gamma: float = 0.99
    batch_size: int = 64
    learning_starts: int = 1000  # env steps of uniformly random actions before learning starts
    updates_per_step: float = 0.25  # the replay ratio: gradient updates per env step
    # or Stable-Baselines3's bursts: gradient_steps updates every train_freq env steps (then
    # updates_per_step is set to their ratio)
    train_freq: int | None = None
    gradient_steps: int | None = None
    target_update_interval: int = 500  # env steps between target updates
    tau: float = 1.0  # 1.0 = hard copy, < 1 = Polyak averaging at each target update
    double: bool = True
    dueling: bool = False
    n_step: int = 1
    max_grad_norm: float | None = 10.0  # null: no clipping (the DQN papers' own code clips none)
    exploration: ExplorationConfig = field(default_factory=ExplorationConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)  # at the learning rate `lr`
    # image observations: conv layers [out channels, kernel, stride] before the `hidden` fc layers
    # (pearl/nets.py; default the Nature DQN's); flat observations ignore it
    conv: list[list[int]] = field(default_factory=lambda: [[32, 8, 4], [64, 4, 2], [64, 3, 1]])

    def check(self, at: str) -> None:
        _check_learning(at, self)
        _at_least(at + ".target_update_interval", self.target_update_interval, 1)
        if self.max_grad_norm is not None:
            _positive(at + ".max_grad_norm", self.max_grad_norm)
        self.exploration.check(at + ".exploration")
        self.optimizer.check(at + ".optimizer")

    @property
    def grad_clip(self) -> float:
        """The gradient norm the learners clip to (inf: max_grad_norm null)."""
        return math.inf if self.max_grad_norm is None else self.max_grad_norm


@dataclass
class ContinuousConfig:
    """What DDPG, TD3 and SAC share. Defaults are Stable-Baselines3 2.9's for DDPG and TD3."""
    hidden: list[int] = field(default_factory=lambda: [400, 300])  # actor and critic widths
    lr: float = 1e-3  # Adam, actor and critic alike
    gamma: float = 0.99
    tau: float = 0.005  # Polyak factor of the target networks, applied at every target update
    batch_size: int = 256
    learning_starts: int = 100  # env steps of uniformly random actions before learning starts
    updates_per_step: float = 1.0  # the replay ratio: gradient updates per env step
    train_freq: int | None = None  # bursts, as dqn.train_freq / dqn.gradient_steps
    gradient_steps: int | None = None
    n_step: int = 1
    # image observations: the conv layers [out channels, kernel, stride] of the encoder the actor
    # and critics share (pearl/nets.py); flat observations ignore it
    conv: list[list[int]] = field(default_factory=lambda: [[32, 8, 4], [64, 4, 2], [64, 3, 1]])

    def check(self, at: str) -> None:
        _check_learning(at, self)


@dataclass
class DDPGConfig(ContinuousConfig):
    action_noise: float = 0.1  # std of the Gaussian exploration noise, in units of half the action range

    def check(self, at: str) -> None:
        super().check(at)
        _in_range(at + ".action_noise", self.action_noise, 0.0, 10.0)


@dataclass
class TD3Config(DDPGConfig):
    policy_delay: int = 2  # critic updates per actor (and target) update
    target_policy_noise: float = 0.2  # std of the target policy smoothing noise
    target_noise_clip: float = 0.5

    def check(self, at: str) -> None:
        super().check(at)
        _at_least(at + ".policy_delay", self.policy_delay, 1)
        _in_range(at + ".target_policy_noise", self.target_policy_noise, 0.0, 10.0)
        _in_range(at + ".target_noise_clip", self.target_noise_clip, 0.0, 10.0)


@dataclass
class SACConfig(ContinuousConfig):
    hidden: list[int] = field(default_factory=lambda: [256, 256])  # SB3's SAC defaults
    lr: float = 3e-4
    init_ent_coef: float = 1.0  # the entropy coefficient alpha at the start (or throughout, if not autotune)
    autotune: bool = True  # learn alpha so that the policy's entropy tracks target_entropy
    target_entropy: float | None = None  # None: -(action dimensions)

    def check(self, at: str) -> None:
        super().check(at)
        _positive(at + ".init_ent_coef", self.init_ent_coef)


CONTINUOUS_ALGOS = ("ddpg", "td3", "sac")
# whose fused learner runs bfloat16 products (pearl/runtime/fused_actor_critic.py, kernels/cpu/qlearn.py)
BF16_ALGOS = ("dqn", "ddpg", "td3", "sac")


@dataclass
class ReplayConfig:
    kind: Literal["uniform", "prioritized", "amper"] = "uniform"  # amper: approximate PER
    capacity: int = 50_000
    alpha: float = 0.6  # prioritization exponent
    beta: float = 0.4  # importance-sampling exponent at the start, annealed to beta_final
    beta_final: float = 1.0
    priority_eps: float = 1e-6
    backend: Literal["auto", "numba", "numpy"] = "auto"  # the CPU sum tree's kernels
    fanout: int = 16  # children per sum-tree node
    # > 0: observations are stacks of this many frames (axis 0, as gymnasium's FrameStackObservation
    # makes them) and the table stores each frame once (pearl/replay/frames.py); 0: whole observations
    frame_stack: int = 0
    # the frame table's sample copies a batch's frames on this many threads (numba's OpenMP pool):
    # 2 pays only where the second core is otherwise idle (docs/ARCHITECTURE.md, the frame table)
    gather_threads: int = 1

    def check(self, at: str) -> None:
        _at_least(at + ".capacity", self.capacity, 1)
        _at_least(at + ".frame_stack", self.frame_stack, 0)
        _at_least(at + ".gather_threads", self.gather_threads, 1, 2)
        if self.gather_threads != 1 and not self.frame_stack:
            raise ConfigError(f"{at}.gather_threads: {self.gather_threads} is for the frame table "
                              f"({at}.frame_stack > 0); whole observations are gathered on 1 thread")
        _at_least(at + ".fanout", self.fanout, 2)
        _in_range(at + ".alpha", self.alpha, 0.0, 1.0)
        _in_range(at + ".beta", self.beta, 0.0, 1.0)
        _in_range(at + ".beta_final", self.beta_final, 0.0, 1.0)
        _positive(at + ".priority_eps", self.priority_eps)


@dataclass
class RuntimeConfig:
    device: str = "cpu"  # where the learner runs: cpu, cuda, cuda:N (a Plan's devices.learn)
    learner_kernel: Literal["auto", "fused", "torch"] = "auto"
    # the learner's matrix products: float32, or bfloat16 operands accumulated in float32 with
    # float32 master weights, Adam state and losses (the fused DQN / DDPG / TD3 / SAC learners, and
    # DQN's torch learner for a CNN Q-network; pearl/build.py refuses the rest; a Plan's learner_precision);
    # auto: bf16 where the learn device has bfloat16 units and the learner runs bf16, else fp32
    learner_precision: Literal["fp32", "bf16", "auto"] = "fp32"
    envs_per_actor: int = 1
    torch_threads: int = 1
    # with torch_threads > 1, the learner's count while it runs: torch_threads or 1, whichever
    # updates faster now (pearl/runtime/adaptive_threads.py); false: always torch_threads
    adapt_threads: bool = True
    # the processes runtime's actor processes: low = niced below the learner, so that the kernel
    # preempts an actor rather than a learner thread where they share a core; auto: low where the
    # learner's torch_threads (> 1) and the actors outnumber the cores (pearl/runtime/processes.py
    # actor_niceness), else normal
    actor_priority: Literal["auto", "normal", "low"] = "auto"

    def check(self, at: str) -> None:
        from pearl.kernels.registry import parse_device

        parse_device(self.device, f"{at}.device")
        _at_least(at + ".envs_per_actor", self.envs_per_actor, 1)
        _at_least(at + ".torch_threads", self.torch_threads, 1)


@dataclass
class EvalConfig:
    episodes: int = 10
    interval: int = 0  # env steps between periodic evaluations; 0 = only at the end

    def check(self, at: str) -> None:
        _at_least(at + ".episodes", self.episodes, 1)
        _at_least(at + ".interval", self.interval, 0)


@dataclass
class LogConfig:
    run_dir: str = "runs"
    interval: int = 1000  # env steps between metric rows
    plot: bool = True
    # env steps between checkpoints in the run directory (0: only at the end); `pearl train
    # --resume RUN_DIR` continues from the latest
    checkpoint_interval: int = 20_000
    # and every this many seconds of wall time (0: by env steps only), so a slow run loses little
    checkpoint_seconds: float = 600.0
    # TensorBoard scalars under Stable-Baselines3's names in the run directory (the tensorboard extra)
    tensorboard: bool = False

    def check(self, at: str) -> None:
        if not self.run_dir:
            raise ConfigError(f"{at}.run_dir: expected a directory path")
        _at_least(at + ".interval", self.interval, 1)
        _at_least(at + ".checkpoint_interval", self.checkpoint_interval, 0)
        _in_range(at + ".checkpoint_seconds", self.checkpoint_seconds, 0.0, math.inf)


@dataclass
class ExperimentConfig:
    algo: Literal["dqn", "ddpg", "td3", "sac"] = "dqn"
    env: str = "CartPole-v1"
    # keyword arguments every env of the run is made with (the RL Zoo's env_kwargs): gymnasium.make's,
    # e.g. ALE's repeat_action_probability; for ALE ids also the Atari preprocessing's (terminal_on_life_loss,
    # noop_max, frame_skip, screen_size, clip_rewards, frame_stack; pearl/envs.py atari_env)
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    total_steps: int = 100_000
    # modules imported before the env is made, here and in actor processes (they register custom
    # environments with gymnasium.register); `pearl train --import MODULE` adds one
    imports: list[str] = field(default_factory=list)
    dqn: DQNConfig = field(default_factory=DQNConfig)
    ddpg: DDPGConfig = field(default_factory=DDPGConfig)
    td3: TD3Config = field(default_factory=TD3Config)
    sac: SACConfig = field(default_factory=SACConfig)
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    log: LogConfig = field(default_factory=LogConfig)

    def check(self, at: str = "") -> None:
        _at_least(_join(at, "seed"), self.seed, 0, MAX_SEED)
        _at_least(_join(at, "total_steps"), self.total_steps, 1)
        if not self.env:
            raise ConfigError(f"{_join(at, 'env')}: expected a Gymnasium environment id")
        for i, name in enumerate(self.imports):
            if not all(part.isidentifier() for part in name.split(".")):
                raise ConfigError(f"{_join(at, 'imports')}[{i}]: expected a module name like mypackage.envs, "
                                  f"got {name!r}")
        for name in ("dqn", *CONTINUOUS_ALGOS, "replay", "runtime", "eval", "log"):
            getattr(self, name).check(_join(at, name))
        batch_size = self.algo_config.batch_size
        if batch_size > self.replay.capacity:
            raise ConfigError(
                f"{self.algo}.batch_size: expected at most replay.capacity ({self.replay.capacity}), "
                f"got {batch_size}")
        if self.algo in CONTINUOUS_ALGOS:
            if self.replay.kind != "uniform":
                raise ConfigError(f"replay.kind: {self.algo} samples its replay uniformly; expected "
                                  f"'uniform', got {self.replay.kind!r}")

    @property
    def algo_config(self):
        """The section of the chosen algorithm (dqn, ddpg, td3 or sac)."""
        return getattr(self, self.algo)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _check_conv(at: str, conv: list[list[int]]) -> None:
    if not conv:
        raise ConfigError(f"{at}: expected a non-empty list of [channels, kernel, stride] layers")
    for i, layer in enumerate(conv):
        if len(layer) != 3:
            raise ConfigError(f"{at}[{i}]: expected [channels, kernel, stride], got {layer}")
        for name, value in zip(("channels", "kernel", "stride"), layer):
            _at_least(f"{at}[{i}] {name}", value, 1, MAX_WIDTH)


def _check_learning(at: str, section) -> None:
    """What every algorithm section has: the networks, the optimizer's step, the return, the replay
    ratio and its start, the n-step return."""
    if not section.hidden:
        raise ConfigError(f"{at}.hidden: expected a non-empty list of layer widths")
    for i, width in enumerate(section.hidden):
        _at_least(f"{at}.hidden[{i}]", width, 1, MAX_WIDTH)
    _check_conv(at + ".conv", section.conv)
    _positive(at + ".lr", section.lr)
    _in_range(at + ".gamma", section.gamma, 0.0, 1.0)
    if not 0.0 < section.tau <= 1.0:
        raise ConfigError(f"{at}.tau: expected a number in (0, 1], got {section.tau}")
    _at_least(at + ".batch_size", section.batch_size, 1)
    _at_least(at + ".learning_starts", section.learning_starts, 0)
    _positive(at + ".updates_per_step", section.updates_per_step)
    _check_bursts(at, section)
    _at_least(at + ".n_step", section.n_step, 1)


def _check_bursts(at: str, section) -> None:
    """train_freq / gradient_steps (Stable-Baselines3's names): `gradient_steps` updates (default
    1) every `train_freq` env steps; their ratio becomes the section's updates_per_step, which the
    estimator and the rate limiter read (pearl.schedule.Schedule.due makes the bursts)."""
    if section.train_freq is None:
        if section.gradient_steps is not None:
            raise ConfigError(f"{at}.gradient_steps: needs {at}.train_freq (gradient_steps updates every "
                              f"train_freq env steps); without it use {at}.updates_per_step")
        return
    _at_least(at + ".train_freq", section.train_freq, 1, MAX_INT)
    if section.gradient_steps is None:
        section.gradient_steps = 1
    _at_least(at + ".gradient_steps", section.gradient_steps, 1, MAX_INT)
    section.updates_per_step = section.gradient_steps / section.train_freq


def _join(at: str, name: str) -> str:
    return f"{at}.{name}" if at else name


def _positive(at: str, value: float) -> None:
    if not value > 0:
        raise ConfigError(f"{at}: expected a positive number, got {value}")


def _at_least(at: str, value: int, low: int, high: int | None = None) -> None:
    if value < low:
        raise ConfigError(f"{at}: expected an integer >= {low}, got {value}")
    if high is not None and value > high:
        raise ConfigError(f"{at}: expected an integer <= {high}, got {value}")


def _in_range(at: str, value: float, low: float, high: float) -> None:
    if not low <= value <= high:
        raise ConfigError(f"{at}: expected a number in [{low}, {high}], got {value}")


def _describe(expected: Any) -> str:
    origin = typing.get_origin(expected)
    if origin is Literal:
        return "one of " + ", ".join(repr(v) for v in typing.get_args(expected))
    if origin is list:
        return f"a list of {_describe(typing.get_args(expected)[0])}"
    if origin is dict:
        return "a mapping of names to values"
    if dataclasses.is_dataclass(expected):
        return "a mapping"
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(
        expected, str(expected))


def _convert(value: Any, expected: Any, at: str) -> Any:
    """Checks `value` against the type hint `expected`; returns it converted (dicts -> dataclasses)."""
    origin = typing.get_origin(expected)
    wrong = ConfigError(f"{at}: expected {_describe(expected)}, got {value!r}")
    if dataclasses.is_dataclass(expected):
        if not isinstance(value, dict):
            raise wrong
        return from_dict(expected, value, at)
    if origin is Literal:
        if value not in typing.get_args(expected) or isinstance(value, bool):
            raise wrong
        return value
    if origin is list:
        if not isinstance(value, list):
            raise wrong
        (item_type,) = typing.get_args(expected)
        return [_convert(v, item_type, f"{at}[{i}]") for i, v in enumerate(value)]
    if origin is dict:  # keyword arguments handed on as they are (the env's own constructor checks them)
        if not isinstance(value, dict):
            raise wrong
        for key in value:
            if not (isinstance(key, str) and key.isidentifier()):
                raise ConfigError(f"{at}: expected keyword names, got {key!r}")
        return dict(value)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in typing.get_args(expected):
            return None
        (inner,) = [t for t in typing.get_args(expected) if t is not type(None)]
        return _convert(value, inner, at)
    if expected is bool:
        if not isinstance(value, bool):
            raise wrong
        return value
    if expected is int:
        # YAML 1.1 reads 1e5 (the RL Zoo's way to write a step count) as a string; a quoted "4" stays one
        if isinstance(value, str) and "e" in value.lower():
            try:
                value = float(value)
            except ValueError:
                raise wrong from None
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise wrong
        if abs(value) > MAX_INT:  # beyond float64's exact integers: no count or size here is that big
            raise ConfigError(f"{at}: expected an integer of at most 2**53, got {value}")
        return value
    if expected is float:
        if isinstance(value, str):  # YAML 1.1 reads 1e-3 (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                raise wrong from None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise wrong
        return float(value)
    if expected is str:
        if not isinstance(value, str):
            raise wrong
        return value
    raise TypeError(f"unsupported config type {expected!r} at {at}")


def from_dict(cls: type, data: dict[str, Any], at: str = "") -> Any:
    """Builds dataclass `cls` from a mapping, rejecting unknown keys and wrong types."""
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    for key in data:
        if key not in known:
            where = _join(at, str(key))
            raise ConfigError(f"{where}: unknown key (expected one of {', '.join(sorted(known))})")
    kwargs = {key: _convert(value, hints[key], _join(at, key)) for key, value in data.items()}
    return cls(**kwargs)


def parse_config(data: Any, source: str = "config") -> ExperimentConfig:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping of config sections, got {type(data).__name__}")
    if "plan" in data:  # (a config has no `plan` key)
        raise ConfigError(f"{source}: a plan file (its `plan:` section), not a config; give it with --plan "
                          f"(or plan= in Python)")
    config = from_dict(ExperimentConfig, data)
    config.check()
    for name in ("dqn", *CONTINUOUS_ALGOS):  # bursts set updates_per_step: a different one given beside them
        section, given = getattr(config, name), data.get(name)
        if (section.train_freq is not None and isinstance(given, dict) and "updates_per_step" in given
                and not math.isclose(float(given["updates_per_step"]), section.updates_per_step)):
            raise ConfigError(f"{name}.updates_per_step: {given['updates_per_step']} disagrees with "
                              f"{name}.gradient_steps / {name}.train_freq = {section.gradient_steps} / "
                              f"{section.train_freq}; give one or the other")
    return config


class _UniqueKeyLoader(yaml.SafeLoader):
    """safe_load that refuses a key given twice in one mapping (PyYAML keeps the last silently)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, typing.Hashable) and key in seen:
                raise ConfigError(f"duplicate key {key!r} (line {key_node.start_mark.line + 1})")
            seen.add(key)
        return super().construct_mapping(node, deep)


def parse_yaml(data: bytes, source: str) -> Any:
    """A config, plan or platform file's bytes -> its YAML data; one line naming `source` for
    binary or non-UTF-8 input, invalid YAML, a duplicate key or a file with nothing in it."""
    if b"\0" in data:
        raise ConfigError(f"{source}: a binary file; expected YAML text")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(f"{source}: not UTF-8 text (byte {err.start}); expected YAML") from None
    try:
        parsed = yaml.load(text, Loader=_UniqueKeyLoader)
    except ConfigError as err:
        raise ConfigError(f"{source}: {err}") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise ConfigError(f"{source}: not valid YAML{where}") from None
    if parsed is None:
        raise ConfigError(f"{source}: empty file; expected YAML settings")
    return parsed


def read_yaml(path: str | Path, kind: str = "config") -> Any:
    """A YAML file's contents; `kind` (config, plan, platform) names the file in the errors."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{path}: is a directory; expected a {kind} file")
    if not path.is_file():
        raise ConfigError(f"{path}: no such {kind} file")
    try:
        data = path.read_bytes()
    except OSError as err:
        raise ConfigError(f"{path}: cannot read it ({err.strerror})") from None
    return parse_yaml(data, str(path))


def load_config(path: str | Path) -> ExperimentConfig:
    return parse_config(read_yaml(path), str(path))


def apply_overrides(config: ExperimentConfig, overrides: dict[str, Any]) -> ExperimentConfig:
    """Returns a validated copy of `config` with dotted keys (e.g. 'dqn.lr') replaced."""
    data = config.to_dict()
    for dotted, value in overrides.items():
        *section, leaf = dotted.split(".")
        if leaf in ("train_freq", "gradient_steps") and f"{section[0]}.updates_per_step" not in overrides:
            data[section[0]].pop("updates_per_step", None)  # the bursts given now set it afresh
        node = data
        *parents, leaf = dotted.split(".")
        for part in parents:
            node = node[part]
        node[leaf] = value
    return parse_config(data)


def default_config_path() -> Path:
    from importlib import resources

    return Path(str(resources.files("pearl.configs").joinpath("cartpole_dqn.yaml")))


def _keyword_overrides(kwargs: dict, algo: str) -> dict:
    """Maps an agent's keyword options (lr=..., replay='prioritized', device='cuda') to dotted config keys."""
    top_level = {f.name for f in dataclasses.fields(ExperimentConfig)} - {"algo", "replay", "dqn", *CONTINUOUS_ALGOS}
    section = {f.name for f in dataclasses.fields(type(getattr(ExperimentConfig(), algo)))}
    out = {}
    for key, value in kwargs.items():
        if key in top_level:
            out[key] = value
        elif key in section:
            out[f"{algo}.{key}"] = value
        elif key == "replay":
            out["replay.kind"] = value
        elif key in ("capacity", "buffer_size"):
            out["replay.capacity"] = value
        elif key in ("checkpoint_interval", "checkpoint_seconds"):
            out[f"log.{key}"] = value
        elif key in ("device", "learner_kernel", "learner_precision", "envs_per_actor", "torch_threads",
                     "adapt_threads", "actor_priority"):
            out[f"runtime.{key}"] = value
        else:
            raise ConfigError(f"{key}: unknown {algo.upper()} option")
    return out


def resolve_config(algo: str, env, config: ExperimentConfig | None, options: dict,
                   default_env: str) -> ExperimentConfig:
    """The validated config of an agent built as `Agent(env, config=..., **options)`."""
    if config is None:
        config = ExperimentConfig(algo=algo, env=default_env)
    elif config.algo != algo:
        raise ConfigError(f"algo: the config is for {config.algo}, not {algo} (pearl.make_agent(config) builds the agent a config names)")
    if env is not None:
        if not isinstance(env, str):  # a factory or instance: made through an id registered for it
            from pearl.envs import register_source

            if options.get("env_kwargs", config.env_kwargs):
                raise ConfigError("env_kwargs: applies to an env id; an env factory or instance takes its "
                                  "arguments itself (functools.partial)")
            env = register_source(env)
        options = {**options, "env": env}
    if options:
        return apply_overrides(config, _keyword_overrides(options, algo))
    return parse_config(config.to_dict())

