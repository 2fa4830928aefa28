"""CPU backend: numpy kernels that avoid the framework overhead that dominates small networks."""
from pearl.kernels.cpu.mlp import MLPLayout, QPolicy  # noqa: F401
from pearl.kernels.cpu.qlearn import FusedQLearner  # noqa: F401
from pearl.kernels.cpu.sumtree import SumTree  # noqa: F401
