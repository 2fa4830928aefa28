"""Experience replay: preallocated transition storage plus a sampler (uniform or prioritized)."""
from pearl.replay.base import Batch, Replay  # noqa: F401
from pearl.replay.nstep import NStepAccumulator, NStepBuffer  # noqa: F401
from pearl.replay.prioritized import PrioritizedReplay  # noqa: F401
from pearl.replay.rate_limiter import RateLimiter, RateLimitExceeded, RateLimitTimeout  # noqa: F401
from pearl.replay.uniform import UniformReplay  # noqa: F401


def make_replay(config, obs_dim: int, action_dtype=None, action_shape=(), total_steps: int = 1,
                rate_limiter: RateLimiter | None = None, device: str = "cpu"):
    """The replay that `config` (a ReplayConfig) asks for, its priority structure on `device`
    (the plan's sample device, pearl.placement.replay_device): the cpu's per `config.backend`;
    another kind's sum tree with storage in host memory (opencl:N, fpga:N); or, for a backend
    that keeps the whole table on its device (cuda:N), storage and tree there
    (pearl/replay/device.py)."""
    import numpy as np

    from pearl.kernels.registry import backend, parse_device

    kwargs = dict(capacity=config.capacity, obs_dim=obs_dim, rate_limiter=rate_limiter,
                  action_dtype=action_dtype or np.int64, action_shape=action_shape)
    where = parse_device(device, "plan.devices.sample")
    kind = backend(where.kind)
    if kind.table_on_device:
        from pearl.replay.device import DeviceReplay

        return DeviceReplay(**kwargs, device=str(where), kernels=kind, prioritized=config.kind == "prioritized",
                            alpha=config.alpha, beta=config.beta, beta_final=config.beta_final,
                            beta_steps=total_steps, priority_eps=config.priority_eps, fanout=config.fanout)
    if config.kind == "uniform":
        return UniformReplay(**kwargs)
    return PrioritizedReplay(**kwargs, alpha=config.alpha, beta=config.beta,
                             beta_final=config.beta_final, beta_steps=total_steps,
                             priority_eps=config.priority_eps, fanout=config.fanout,
                             backend=("amper" if config.kind == "amper" else
                                      config.backend if where.kind == "cpu" else device))
