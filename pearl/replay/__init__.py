"""Experience replay: preallocated transition storage plus a sampler (uniform or prioritized)."""
from pearl.replay.base import Batch, Replay  # noqa: F401
from pearl.replay.nstep import NStepAccumulator, NStepBuffer  # noqa: F401
from pearl.replay.prioritized import PrioritizedReplay  # noqa: F401
from pearl.replay.rate_limiter import RateLimiter, RateLimitExceeded, RateLimitTimeout  # noqa: F401
from pearl.replay.uniform import UniformReplay  # noqa: F401


def make_replay(config, obs_dim: int, action_dtype=None, action_shape=(), total_steps: int = 1,
                rate_limiter: RateLimiter | None = None, device: str = "cpu"):
    """The replay that `config` (a ReplayConfig) asks for; `device` 'opencl:N' puts a prioritized
    replay's sum tree on that OpenCL device (storage stays in host memory); 'cuda:N' puts the
    whole table (storage and tree) on that GPU (pearl/replay/device.py)."""
    import numpy as np

    kwargs = dict(capacity=config.capacity, obs_dim=obs_dim, rate_limiter=rate_limiter,
                  action_dtype=action_dtype or np.int64, action_shape=action_shape)
    if device.startswith("cuda"):
        from pearl.replay.device import DeviceReplay

        return DeviceReplay(**kwargs, device=device, prioritized=config.kind == "prioritized",
                            alpha=config.alpha, beta=config.beta, beta_final=config.beta_final,
                            beta_steps=total_steps, priority_eps=config.priority_eps, fanout=config.fanout)
    if config.kind == "uniform":
        return UniformReplay(**kwargs)
    return PrioritizedReplay(**kwargs, alpha=config.alpha, beta=config.beta,
                             beta_final=config.beta_final, beta_steps=total_steps,
                             priority_eps=config.priority_eps, fanout=config.fanout,
                             backend=("amper" if config.kind == "amper" else
                                      device if device.startswith("opencl") else config.backend))
