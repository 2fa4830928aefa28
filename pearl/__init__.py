"""PEARL: deep reinforcement learning trained as fast as mixed CPU / GPU / FPGA hardware allows."""
from pearl.api import DQN, load  # noqa: F401
from pearl.config import ExperimentConfig, load_config  # noqa: F401
from pearl.errors import ConfigError, PearlError  # noqa: F401
from pearl.protocol import Plan, load_plan  # noqa: F401

__version__ = "0.1.0"
