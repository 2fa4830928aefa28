"""PEARL: deep reinforcement learning trained as fast as mixed CPU / GPU / FPGA hardware allows.

Names are imported on first use, so `import pearl` (and a CLI that rejects a bad config) does not
pay for importing torch.
"""
from importlib import import_module

__version__ = "0.1.0"

_EXPORTS = {
    "DQN": "pearl.api", "load": "pearl.api", "make_agent": "pearl.api", "resume": "pearl.api",
    "DDPG": "pearl.api", "TD3": "pearl.api", "SAC": "pearl.api",
    "ExperimentConfig": "pearl.config", "load_config": "pearl.config",
    "ConfigError": "pearl.errors", "PearlError": "pearl.errors",
    "Plan": "pearl.plan", "load_plan": "pearl.plan",
    "autotune": "pearl.estimator.tune",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'pearl' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The public API, loaded or not (the lazy names are not in the module's dict until used)."""
    return sorted({*globals(), *_EXPORTS} - {"import_module"})
