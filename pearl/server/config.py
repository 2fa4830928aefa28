"""The replay server's configuration: the table (a pearl.config.ReplayConfig plus the transition
schema), the replay ratio it enforces, its bounds, where it binds and how peers authenticate.

A YAML file holds the same keys as `ServerConfig` (nested `table`, `ratio`, `rate_limiter`,
`auth`); an unknown key, a wrong type or an out-of-range value is a ConfigError naming the field.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pearl.errors import ConfigError

LOOPBACK = "tcp://127.0.0.1:5555"
STANDALONE_SPIN_US = 0.0  # `pearl replay-server`'s spin_us when neither the file nor --spin-us sets it
MAX_SPIN_US = 100_000.0


@dataclass
class TableConfig:
    kind: str = "uniform"            # uniform | prioritized | amper
    capacity: int = 1_000_000
    obs_dim: int = 4                 # a vector observation's length (when obs_shape is empty)
    obs_shape: tuple = ()            # an observation's shape, e.g. [4, 10, 10] (MinAtar); (): (obs_dim,)
    obs_dtype: str = "float32"       # float32, or uint8 (images: converted only at the network's input)
    # > 0: a frame table (pearl/replay/frames.py): each frame stored once per env stream; inserts are
    # step records (stream id first), obs_shape one frame's; the table makes the n-step transitions
    frame_stack: int = 0
    streams: int = 1                 # a frame table's env streams (each a ring of capacity // streams records)
    n_step: int = 1                  # a frame table's return horizon
    gamma: float = 0.99              # a frame table's discount
    action_dtype: str = "int64"      # int64 (discrete) or float32 (Box actions)
    action_shape: tuple = ()
    alpha: float = 0.6
    beta: float = 0.4
    beta_final: float = 1.0
    beta_steps: int = 1              # env steps over which beta anneals to beta_final
    priority_eps: float = 1e-6
    fanout: int = 16
    backend: str = "auto"

    def check(self) -> None:
        if self.kind not in ("uniform", "prioritized", "amper"):
            raise ConfigError(f"table.kind: {self.kind!r} (expected uniform, prioritized or amper)")
        for name in ("capacity", "obs_dim", "fanout", "beta_steps", "streams", "n_step"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ConfigError(f"table.{name}: expected a positive integer, got {getattr(self, name)!r}")
        if not isinstance(self.frame_stack, int) or not 0 <= self.frame_stack <= 256:
            raise ConfigError(f"table.frame_stack: expected an integer 0 .. 256, got {self.frame_stack!r}")
        if not 0 < self.gamma <= 1:
            raise ConfigError(f"table.gamma: expected 0 < gamma <= 1, got {self.gamma!r}")
        frame_keys = {"streams": 1, "n_step": 1, "gamma": 0.99}
        for name, default in frame_keys.items():
            if not self.frame_stack and getattr(self, name) != default:
                raise ConfigError(f"table.{name}: a frame table's key (with frame_stack > 0); a table of whole "
                                  f"transitions takes them as its writers assembled them")
        if self.frame_stack and self.capacity // self.streams < self.frame_stack + self.n_step:
            raise ConfigError(f"table.capacity: {self.capacity} leaves {self.capacity // self.streams} records for "
                              f"each of {self.streams} streams; a transition reads frame_stack + n_step = "
                              f"{self.frame_stack + self.n_step}")
        if self.action_dtype not in ("int64", "float32"):
            raise ConfigError(f"table.action_dtype: {self.action_dtype!r} (expected int64 or float32)")
        if self.obs_dtype not in ("float32", "uint8"):
            raise ConfigError(f"table.obs_dtype: {self.obs_dtype!r} (expected float32 or uint8)")
        if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in self.obs_shape):
            raise ConfigError(f"table.obs_shape: expected a list of positive integers, got {list(self.obs_shape)!r}")
        self.obs_shape = tuple(self.obs_shape)
        self.action_shape = tuple(int(d) for d in self.action_shape)

    @property
    def observation_shape(self) -> tuple:
        """The stored shape of one observation."""
        return self.obs_shape or (self.obs_dim,)


@dataclass
class RatioConfig:
    """Updates per env step kept by the server: a sample request is one learner update; it is
    served only while updates < floor((env_steps - learning_starts) x updates_per_step), and
    writers commit env steps only against credit, so updates trail that count by <= max_lag."""

    updates_per_step: float = 0.25
    learning_starts: int = 0
    max_lag: int = 8

    def check(self) -> None:
        if not self.updates_per_step > 0:
            raise ConfigError(f"ratio.updates_per_step: expected > 0, got {self.updates_per_step!r}")
        if self.learning_starts < 0 or self.max_lag < 1:
            raise ConfigError("ratio: learning_starts >= 0 and max_lag >= 1 expected")


@dataclass
class RateLimiterConfig:
    """pearl.replay.RateLimiter's band on the table (samples per inserted transition)."""

    samples_per_insert: float = 1.0
    min_size_to_sample: int = 1
    error_buffer: float | None = None


@dataclass
class AuthConfig:
    """CURVE: the server's secret certificate and the allow-list of client public keys (a directory
    of zmq public certificates, or z85 keys). plaintext: no authentication, no encryption - only
    for a private fabric where every host that can reach the port is trusted."""

    server_secret: str | None = None   # path of the server's *.key_secret certificate
    allow: list = field(default_factory=list)  # directories of *.key files and/or z85 public keys
    plaintext: bool = False

    def check(self) -> None:
        if self.plaintext and self.server_secret:
            raise ConfigError("auth: plaintext and server_secret are exclusive")
        if not self.plaintext and not self.server_secret:
            raise ConfigError("auth: give server_secret (+ allow) for CURVE, or plaintext: true for a "
                              "private fabric")
        if self.server_secret and not self.allow:
            raise ConfigError("auth.allow: empty allow-list (every client would be refused)")


@dataclass
class ServerConfig:
    table: TableConfig = field(default_factory=TableConfig)
    bind: str = LOOPBACK
    ratio: RatioConfig | None = None
    rate_limiter: RateLimiterConfig | None = None
    auth: AuthConfig = field(default_factory=lambda: AuthConfig(plaintext=True))
    max_chunk_rows: int = 65_536     # rows of one insert
    max_batch: int = 65_536          # rows of one sample
    seed: int = 0
    checkpoint_dir: str | None = None
    checkpoint_every_s: float = 0.0  # 0: only on request
    restore: bool = True             # start from checkpoint_dir's latest checkpoint if there is one
    # after a burst of requests the server thread spins up to this long for the next one before it
    # blocks (server.spin_wait). 0 here: an embedded server's spin would hold the GIL from its
    # host's threads; `pearl replay-server` (its own process) defaults to STANDALONE_SPIN_US.
    spin_us: float = 0.0

    def check(self) -> None:
        self.table.check()
        self.auth.check()
        if self.ratio is not None:
            self.ratio.check()
        if not self.bind.startswith(("tcp://", "ipc://", "inproc://")):
            raise ConfigError(f"bind: {self.bind!r} (expected tcp://HOST:PORT, ipc://PATH or inproc://NAME)")
        if self.bind.startswith("tcp://") and self.bind[6:].split(":")[0] in ("*", "0.0.0.0", "::", ""):
            raise ConfigError(f"bind: {self.bind!r} binds every interface; name one address")
        if not 0 <= self.spin_us <= MAX_SPIN_US:
            raise ConfigError(f"spin_us: {self.spin_us!r} (expected 0 .. {MAX_SPIN_US} microseconds)")
        if not 1 <= self.max_chunk_rows <= self.table.capacity:
            self.max_chunk_rows = min(max(1, self.max_chunk_rows), self.table.capacity)

    def schema(self) -> list:
        from pearl.server.wire import Column

        t = self.table
        obs = Column(np.dtype(t.obs_dtype), t.observation_shape)
        action, scalar = Column(np.dtype(t.action_dtype), tuple(t.action_shape)), Column(np.dtype(np.float32), ())
        if t.frame_stack:  # step records: stream, newest frames, action, reward, next frames, how the step ended
            flag = Column(np.dtype(np.bool_), ())
            return [Column(np.dtype(np.int64), ()), obs, action, scalar, obs, flag, flag]
        return [obs, action, scalar, obs, scalar]


_NESTED = {"table": TableConfig, "ratio": RatioConfig, "rate_limiter": RateLimiterConfig, "auth": AuthConfig}


def _build(cls, data, at: str):
    if not isinstance(data, dict):
        raise ConfigError(f"{at}: expected a mapping, got {type(data).__name__}")
    names = {f.name: f for f in dataclasses.fields(cls)}
    if cls is TableConfig and "obs_dim" in data and "obs_shape" in data:
        raise ConfigError(f"{at}: give obs_dim (a vector's length) or obs_shape, not both")
    kwargs = {}
    for key, value in data.items():
        if key not in names:
            raise ConfigError(f"{at}{'.' if at else ''}{key}: unknown key (expected one of {sorted(names)})")
        if key in _NESTED and cls is ServerConfig:
            value = None if value is None else _build(_NESTED[key], value, key)
        elif key in ("action_shape", "obs_shape"):
            if not isinstance(value, (list, tuple)):
                raise ConfigError(f"{at}.{key}: expected a list of integers, got {value!r}")
            value = tuple(value)
        else:
            default = getattr(cls(), key) if cls is not ServerConfig else names[key].default
            if isinstance(default, bool) and not isinstance(value, bool):
                raise ConfigError(f"{at}.{key}: expected true or false, got {value!r}")
            if isinstance(default, (int, float)) and not isinstance(default, bool) and \
                    (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise ConfigError(f"{at}.{key}: expected a number, got {value!r}")
            if isinstance(default, int) and not isinstance(default, bool) and isinstance(value, float):
                raise ConfigError(f"{at}.{key}: expected an integer, got {value!r}")
        kwargs[key] = value
    return cls(**kwargs)


def load_config(source: str | Path | dict) -> ServerConfig:
    """A checked ServerConfig from a YAML path or a mapping."""
    if not isinstance(source, dict):
        import yaml

        path = Path(source)
        if not path.is_file():
            raise ConfigError(f"{path}: no such config file")
        source = yaml.safe_load(path.read_text()) or {}
    config = _build(ServerConfig, source, "")
    config.check()
    return config
