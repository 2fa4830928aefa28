"""The algorithms, one file each, readable top to bottom like their papers. An algorithm class
names no device and imports no backend; its `name` is its module's (pearl.algos.<name>) and the
config section of its hyperparameters, and `family` says which parts the builder gives it:
"discrete" (a Q-network policy, epsilon-greedy actors) or "continuous" (a numpy actor network with
its own exploration, actions scaled to the env's Box)."""
from importlib import import_module


def algorithm_class(name: str) -> type:
    """The algorithm class of module pearl.algos.`name` (the one whose `name` it is)."""
    module = import_module(f"pearl.algos.{name}")
    return next(value for value in vars(module).values()
                if isinstance(value, type) and getattr(value, "name", None) == name and hasattr(value, "family"))
