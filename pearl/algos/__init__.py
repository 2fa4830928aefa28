"""The algorithms, one file each, readable top to bottom like their papers. An algorithm class
names no device and imports no backend; `family` says which parts the builder gives it:
"discrete" (a Q-network policy, epsilon-greedy actors) or "continuous" (a numpy actor network with
its own exploration, actions scaled to the env's Box)."""
from importlib import import_module

ALGORITHMS = {"dqn": "pearl.algos.dqn:DQN", "ddpg": "pearl.algos.ddpg:DDPG", "td3": "pearl.algos.td3:TD3",
              "sac": "pearl.algos.sac:SAC"}


def algorithm_class(name: str) -> type:
    module, _, cls = ALGORITHMS[name].partition(":")
    return getattr(import_module(module), cls)
