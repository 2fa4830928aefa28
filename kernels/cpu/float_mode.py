"""The floating-point mode of the threads a learner's update runs on (x86's MXCSR: rounding and
denormal flushing), and `cpu_kernel_mode`, the mode a run's learner keeps while it runs.

Why flushing: Adam's second moments of tiny gradients fall into the denormal range, where x86
arithmetic is up to 100x slower (the fused DQN step went from 237 us to 202 us with flushing on).
The mode is each thread's own, and a thread keeps the mode of the thread that made it, so setting
it on the learner's thread leaves out every worker made before: the fused DQN step's pair thread
takes it per call in compiled code (`current_float_mode` read on the caller, `apply_float_mode` on
the worker), the CNN learner's second half's thread from Python (`thread_float_mode` on the caller,
`set_thread_float_mode` on the worker), and the OpenMP pool (torch's intra-op threads, which run
half of each product on `runtime.torch_threads: 2`) takes it on entry to `cpu_kernel_mode` and back
on exit (`set_pool_float_mode`).
"""
from __future__ import annotations

from contextlib import contextmanager

from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from pearl.kernels.cpu import X86, flush_denormals, start_numba_pool

_NJIT = dict(cache=True, nogil=True)


def _mxcsr_call(builder, name: str, slot) -> None:
    fn = builder.module.declare_intrinsic(name, fnty=ir.FunctionType(ir.VoidType(), [ir.IntType(8).as_pointer()]))
    builder.call(fn, [builder.bitcast(slot, ir.IntType(8).as_pointer())])


@intrinsic
def current_float_mode(typingctx):
    """The calling thread's floating-point mode (x86's MXCSR, SSE's control and status register);
    0 elsewhere."""
    def codegen(context, builder, sig, args):
        if not X86:
            return ir.Constant(ir.IntType(64), 0)
        slot = builder.alloca(ir.IntType(32))
        _mxcsr_call(builder, "llvm.x86.sse.stmxcsr", slot)
        return builder.zext(builder.load(slot), ir.IntType(64))
    return types.int64(), codegen


@intrinsic
def apply_float_mode(typingctx, mode):
    """Gives the calling thread the floating-point mode `mode` (from current_float_mode)."""
    def codegen(context, builder, sig, args):
        if X86:
            slot = builder.alloca(ir.IntType(32))
            builder.store(builder.trunc(args[0], ir.IntType(32)), slot)
            _mxcsr_call(builder, "llvm.x86.sse.ldmxcsr", slot)
        return context.get_dummy_value()
    return types.void(types.int64), codegen


@njit(**_NJIT)
def thread_float_mode() -> int:
    """The calling thread's floating-point mode, for `set_thread_float_mode` on another thread."""
    return current_float_mode()


@njit(**_NJIT)
def set_thread_float_mode(mode: int) -> None:
    """Gives the calling thread the mode `thread_float_mode` read (a worker thread made before or
    outside `cpu_kernel_mode` takes its caller's denormal flushing so)."""
    apply_float_mode(mode)


@njit(parallel=True, **_NJIT)
def _apply_on_team(mode, threads):
    for _ in prange(threads):  # one iteration a thread: numba splits the range evenly over its team
        apply_float_mode(mode)


def set_pool_float_mode(mode: int) -> None:
    """Gives every thread of the process's OpenMP pool the mode `thread_float_mode` read. Under
    numba's `omp` threading layer a numba parallel region runs on the pool torch's intra-op
    threads are (numba's pool links the libgomp torch loaded), so one region reaches them; under
    another layer it reaches numba's own threads only."""
    import numba

    start_numba_pool()  # (before numba.get_num_threads(), which would start it without keeping torch's count)
    _apply_on_team(mode, numba.get_num_threads())


@contextmanager
def cpu_kernel_mode():
    """One BLAS thread, and denormals flushed to zero on this thread and on the OpenMP pool's;
    both restored on exit. Why one BLAS thread: the kernels work on matrices of a few thousand
    elements, where a multi-threaded BLAS only adds synchronisation (kernels/cpu/__init__.py)."""
    import torch
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="blas"):
        flushing = flush_denormals()
        if flushing:
            set_pool_float_mode(thread_float_mode())
        try:
            yield
        finally:
            if flushing:
                torch.set_flush_denormal(False)
                set_pool_float_mode(thread_float_mode())
