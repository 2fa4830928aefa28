"""Experience replay: preallocated transition storage plus a sampler (uniform or prioritized); the
frame table for stacked-frame observations (frames.py)."""
from pearl.replay.base import Batch, Replay  # noqa: F401
from pearl.replay.frames import FrameReplay  # noqa: F401
from pearl.replay.nstep import NStepAccumulator, NStepBuffer  # noqa: F401
from pearl.replay.prioritized import PrioritizedReplay  # noqa: F401
from pearl.replay.rate_limiter import RateLimiter, RateLimitExceeded, RateLimitTimeout  # noqa: F401
from pearl.replay.uniform import UniformReplay  # noqa: F401


def table_bytes(config, obs_shape: tuple, obs_dtype, action_dtype, action_shape=()) -> int:
    """About what the table `make_replay` builds for `config` (a ReplayConfig) takes in memory once
    full: its rows (a frame table's step records, one frame each) and its selector's slots."""
    if config.frame_stack:
        rows = FrameReplay.bytes_needed(config.capacity, tuple(obs_shape)[1:], obs_dtype, action_dtype, action_shape)
    else:
        rows = Replay.bytes_needed(config.capacity, obs_shape, obs_dtype, action_dtype, action_shape)
    if config.kind == "uniform" and not config.frame_stack:
        return rows  # uniform draws of whole transitions need no selector
    # the compiled sum tree's (prioritized; a frame table's 0/1 uniform); AMPER's and the numpy
    # reference tree's are of its order
    from pearl.kernels.cpu.fast_sumtree import NumbaSumTree

    return rows + NumbaSumTree.bytes_needed(config.capacity, config.fanout)


def check_table_fits(field: str, config, obs_shape: tuple, obs_dtype, action_dtype, action_shape=()) -> None:
    """Refuses, in one line naming `field`, a table larger than the memory this machine has free
    now (np.zeros would map it and the run be killed once it filled, or numpy fail with a traceback)."""
    import numpy as np

    from pearl.kernels.cpu.backend import memory_available
    from pearl.errors import ConfigError

    size, free = table_bytes(config, obs_shape, obs_dtype, action_dtype, action_shape), memory_available()
    if size > free:
        obs = "x".join(map(str, tuple(obs_shape)[config.frame_stack > 0:]))
        what = f"records of one {obs} {np.dtype(obs_dtype).name} frame" if config.frame_stack else \
            f"transitions of {obs} {np.dtype(obs_dtype).name} observations"
        raise ConfigError(f"{field}: {config.capacity:,} {what} need about {size / 2**30:,.1f} GiB; this machine "
                          f"has {free / 2**30:,.1f} GiB available")


def make_replay(config, obs_dim: int | tuple, action_dtype=None, action_shape=(), total_steps: int = 1,
                rate_limiter: RateLimiter | None = None, device: str = "cpu", obs_dtype=None, streams: int = 1,
                n_step: int = 1, gamma: float = 0.99):
    """The replay that `config` (a ReplayConfig) asks for, its priority structure on `device`
    (the plan's sample device, pearl.placement.replay_device): the cpu's per `config.backend`;
    another kind's sum tree with storage in host memory (opencl:N, fpga:N); or, for a backend
    that keeps the whole table on its device (cuda:N), storage and tree there
    (pearl/replay/device.py). `obs_dim`: a vector's length or an observation's shape, stored in
    `obs_dtype` (default float32). With `config.frame_stack`, the frame table of `streams` env
    streams, which makes the `n_step` transitions itself (pearl/replay/frames.py)."""
    import numpy as np

    from pearl.kernels.registry import backend, parse_device

    obs_dtype = np.dtype(obs_dtype or np.float32)
    where = parse_device(device, "plan.devices.sample")
    kind = backend(where.kind)
    if config.frame_stack:
        return make_frame_replay(config, obs_dim, obs_dtype, action_dtype or np.int64, action_shape, total_steps,
                                 rate_limiter, where, kind, streams, n_step, gamma)
    kwargs = dict(capacity=config.capacity, obs_dim=obs_dim, rate_limiter=rate_limiter,
                  action_dtype=action_dtype or np.int64, action_shape=action_shape)
    if kind.table_on_device:
        from pearl.replay.device import DeviceReplay

        return DeviceReplay(**kwargs, device=str(where), kernels=kind, prioritized=config.kind == "prioritized",
                            alpha=config.alpha, beta=config.beta, beta_final=config.beta_final,
                            beta_steps=total_steps, priority_eps=config.priority_eps, fanout=config.fanout)
    kwargs["obs_dtype"] = obs_dtype
    if config.kind == "uniform":
        return UniformReplay(**kwargs)
    return PrioritizedReplay(**kwargs, alpha=config.alpha, beta=config.beta,
                             beta_final=config.beta_final, beta_steps=total_steps,
                             priority_eps=config.priority_eps, fanout=config.fanout,
                             backend=("amper" if config.kind == "amper" else
                                      config.backend if where.kind == "cpu" else device))


def make_frame_replay(config, obs_shape, obs_dtype, action_dtype, action_shape, total_steps, rate_limiter,
                      where, kind, streams: int, n_step: int, gamma: float):
    """The frame table for `config.frame_stack`, or a one-line ConfigError naming what does not fit."""
    from pearl.errors import ConfigError

    obs_shape = (obs_shape,) if isinstance(obs_shape, int) else tuple(obs_shape)
    stack = config.frame_stack
    if len(obs_shape) < 2 or obs_shape[0] != stack:
        raise ConfigError(f"replay.frame_stack: {stack} frames per observation, but the env's observations "
                          f"have shape {obs_shape} (expected ({stack}, ...): a stack of frames on axis 0)")
    if kind.table_on_device:
        raise ConfigError(f"replay.frame_stack: the frame table lives in host memory; plan.devices.sample "
                          f"{where} keeps its table on the device")
    if config.capacity // streams < stack + n_step:
        raise ConfigError(f"replay.capacity: {config.capacity} leaves {config.capacity // streams} records for "
                          f"each of {streams} env streams; at least frame_stack + n_step = {stack + n_step} needed")
    backend = config.backend if where.kind == "cpu" else str(where)
    return FrameReplay(config.capacity, obs_shape[1:], stack, streams=streams, n_step=n_step, gamma=gamma,
                       kind=config.kind, frame_dtype=obs_dtype, action_dtype=action_dtype,
                       action_shape=action_shape, alpha=config.alpha, beta=config.beta,
                       beta_final=config.beta_final, beta_steps=total_steps, priority_eps=config.priority_eps,
                       backend=backend, fanout=config.fanout, rate_limiter=rate_limiter,
                       gather_threads=config.gather_threads)
