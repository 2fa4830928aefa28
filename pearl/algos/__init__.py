"""The algorithms, one file each, readable top to bottom like their papers: networks, losses and
update rules in plain PyTorch. An algorithm class names no device and imports no backend; its
`name` is its module's (pearl.algos.<name>) and its config section's, and `family` says which
parts the builder gives it: "discrete" (a Q-network policy, epsilon-greedy actors) or
"continuous" (a numpy actor network with its own exploration, actions scaled to the env's Box).

Each class also declares its cost spec, from shapes alone (no network is built):
`policy_shape(obs_dim, n_actions, hidden)`, `act_cost(obs_dim, n_actions, hidden, envs)` and
`learn_cost(obs_dim, n_actions, hidden, batch, kernel, **options)`, `COST_OPTIONS` naming the
config options learn_cost reads. The estimator (estimator/workload.py) costs every plan with it.
"""
from __future__ import annotations

from importlib import import_module


def algorithm_class(name: str) -> type:
    """The algorithm class of a config's `algo`: the one in pearl.algos.`name` whose `name` it is
    (imported on first use: it imports torch)."""
    module = import_module(f"pearl.algos.{name}")
    return next(value for value in vars(module).values()
                if isinstance(value, type) and getattr(value, "name", None) == name and hasattr(value, "family"))
