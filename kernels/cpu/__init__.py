"""CPU backend: numpy kernels that avoid the framework overhead that dominates small networks.

The kernels work on matrices of a few thousand elements, where a multi-threaded BLAS only adds
synchronisation: with one other busy process on a 2-core machine, OpenBLAS's second thread made
the fused DQN step 15x slower (4.6 ms instead of 0.32 ms). `prepare_cpu_thread()` pins BLAS to
one thread; the runtime calls it and gets its parallelism from running tasks side by side. It
also flushes denormal floats to zero on the calling thread: Adam's second moments of tiny
gradients fall into the denormal range, where x86 arithmetic is up to 100x slower (the fused
step went from 237 us to 202 us with flushing on).
"""
from pearl.kernels.cpu.mlp import MLPLayout, QPolicy  # noqa: F401
from pearl.kernels.cpu.qlearn import FusedQLearner  # noqa: F401
from pearl.kernels.cpu.sumtree import SumTree  # noqa: F401


def prepare_cpu_thread() -> None:
    """One BLAS thread for the rest of the process; denormals flushed to zero on this thread."""
    import torch
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=1, user_api="blas")
    torch.set_flush_denormal(True)
