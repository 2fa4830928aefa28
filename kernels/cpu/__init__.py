"""CPU backend: numpy kernels that avoid the framework overhead that dominates small networks.

The kernels work on matrices of a few thousand elements, where a multi-threaded BLAS only adds
synchronisation: with one other busy process on a 2-core machine, OpenBLAS's second thread made
the fused DQN step 15x slower (4.6 ms instead of 0.32 ms). `single_threaded_blas()` pins BLAS to
one thread; the runtime calls it and gets its parallelism from running tasks side by side.
"""
from pearl.kernels.cpu.mlp import MLPLayout, QPolicy  # noqa: F401
from pearl.kernels.cpu.qlearn import FusedQLearner  # noqa: F401
from pearl.kernels.cpu.sumtree import SumTree  # noqa: F401


def single_threaded_blas() -> None:
    """Limits numpy's BLAS to one thread for the rest of the process."""
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=1, user_api="blas")
