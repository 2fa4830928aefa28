"""Algorithms: networks, losses and update rules in plain PyTorch, with no device decisions.

Each algorithm class also declares its cost spec, from shapes alone (no network is built):
`policy_shape(obs_dim, n_actions, hidden)`, `act_cost(obs_dim, n_actions, hidden, envs)` and
`learn_cost(obs_dim, n_actions, hidden, batch, kernel, **options)`, `COST_OPTIONS` naming the
config options learn_cost reads. The estimator (estimator/workload.py) costs every plan with it.
"""
from __future__ import annotations

from importlib import import_module

# a config's `algo` -> the class of the module pearl/algos/<algo>.py
ALGORITHMS = {"dqn": "DQN", "ddpg": "DDPG", "td3": "TD3", "sac": "SAC"}


def algorithm_class(name: str) -> type:
    """The algorithm class of a config's `algo` (imported on first use: it imports torch)."""
    return getattr(import_module(f"pearl.algos.{name}"), ALGORITHMS[name])
