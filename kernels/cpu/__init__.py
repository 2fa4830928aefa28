"""CPU backend: numpy kernels that avoid the framework overhead that dominates small networks.

The kernels work on matrices of a few thousand elements, where a multi-threaded BLAS only adds
synchronisation: with one other busy process on a 2-core machine, OpenBLAS's second thread made
the fused DQN step 15x slower (4.6 ms instead of 0.32 ms). `cpu_kernel_mode()` pins BLAS to
one thread while the runtime runs (its parallelism comes from running tasks side by side), and
flushes denormal floats to zero on the calling thread: Adam's second moments of tiny
gradients fall into the denormal range, where x86 arithmetic is up to 100x slower (the fused
step went from 237 us to 202 us with flushing on).
"""
from contextlib import contextmanager
from importlib import import_module

# imported on first use: an actor process needs the MLP, not the learner's BLAS (SciPy) or the tree
_EXPORTS = {"MLPLayout": "pearl.kernels.cpu.mlp", "QPolicy": "pearl.kernels.cpu.mlp",
            "FusedQLearner": "pearl.kernels.cpu.qlearn", "SumTree": "pearl.kernels.cpu.sumtree"}


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'pearl.kernels.cpu' has no attribute {name!r}")


def flush_denormals() -> bool:
    """Flushes denormal floats to zero on the calling thread (and only there: the setting is the
    thread's); returns whether the CPU supports it."""
    import torch

    return torch.set_flush_denormal(True)


@contextmanager
def cpu_kernel_mode():
    """One BLAS thread and denormals flushed to zero on this thread, restored on exit."""
    import torch
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="blas"):
        flushing = flush_denormals()
        try:
            yield
        finally:
            if flushing:
                torch.set_flush_denormal(False)
