"""CPU backend: numpy kernels that avoid the framework overhead that dominates small networks.

The kernels work on matrices of a few thousand elements, where a multi-threaded BLAS only adds
synchronisation: with one other busy process on a 2-core machine, OpenBLAS's second thread made
the fused DQN step 15x slower (4.6 ms instead of 0.32 ms). `cpu_kernel_mode()` (float_mode.py)
pins BLAS to one thread while the runtime runs (its parallelism comes from running tasks side by
side, and from the fused DQN step's products side by side on two threads, each a one-thread call),
and flushes denormal floats to zero on the learner's threads.
"""
import functools
import hashlib
import os
import platform
import sys
from importlib import import_module
from pathlib import Path

X86 = platform.machine().lower() in ("x86_64", "amd64")  # the kernels' x86 intrinsics (MXCSR, sfence)


def compiled_cache_folder(sources: Path) -> Path:
    """Where numba caches these kernels: one folder per version of all of `sources`' .py files.
    Why: numba keys a cached function by its own file's text only, so a kernel compiled into its
    caller (the fused DQN step calls bf16_gemm's product) stayed the old one after an update that
    changed the callee's file alone, until the caller's file changed too (seen in session 30: the
    AMX product measured as the old loop). ~1 ms to hash the ~20 files."""
    digest = hashlib.sha256()
    for path in sorted(sources.glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return sources / "__pycache__" / f"numba-{digest.hexdigest()[:16]}"


def _use_compiled_cache_folder() -> None:
    """Points numba's cache at `compiled_cache_folder` unless the user chose NUMBA_CACHE_DIR: by
    the environment before numba is imported (so that the estimator, which loads this package
    without numba, still does not load it), or by numba's config after. A folder of ours in the
    environment (inherited from the process that started this one) is worked out again: the
    sources may have changed since. numba falls back to its own locations where the folder cannot
    be written."""
    sources = Path(__file__).parent
    chosen = os.environ.get("NUMBA_CACHE_DIR")
    if chosen and Path(chosen).parent != sources / "__pycache__":
        return
    folder = str(compiled_cache_folder(sources))
    if "numba" in sys.modules:
        from numba.core import config

        config.CACHE_DIR = folder
    else:
        os.environ["NUMBA_CACHE_DIR"] = folder


_use_compiled_cache_folder()

# imported on first use: an actor process needs the MLP, not the learner's BLAS (SciPy) or the tree
_EXPORTS = {"MLPLayout": "pearl.kernels.cpu.mlp", "QPolicy": "pearl.kernels.cpu.mlp",
            "FusedQLearner": "pearl.kernels.cpu.qlearn", "SumTree": "pearl.kernels.cpu.sumtree",
            "cpu_kernel_mode": "pearl.kernels.cpu.float_mode"}


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'pearl.kernels.cpu' has no attribute {name!r}")


# the fused DQN step on two threads (qlearn.py) runs a product beside its partner from this many
# multiply-adds (batch x in x out) on: below it the pool's hand-off costs more than the half it
# saves (docs/BENCHMARKS.md issue 19, "The fused DQN step on two threads")
PAIR_FROM_MACS = 1 << 20


def paired_products(sizes: list[int], batch: int) -> bool:
    """Whether the fused DQN step on two threads pairs any products for an MLP of `sizes` at
    `batch` (else a second learner thread changes nothing). Here, not in qlearn.py, so that the
    estimator asks without loading numba."""
    return max(batch * n_in * n_out for n_in, n_out in zip(sizes[:-1], sizes[1:])) >= PAIR_FROM_MACS


def flush_denormals() -> bool:
    """Flushes denormal floats to zero on the calling thread (and only there: the setting is the
    thread's); returns whether the CPU supports it."""
    import torch

    return torch.set_flush_denormal(True)


def torch_threads_kept(kernel):
    """`kernel`, a function that may start a numba parallel region, called with numba's thread pool
    started by `start_numba_pool` first: numba starts it when it compiles a parallel region or
    loads a cached `parallel=True` function, not when it loads a cached kernel that only calls one
    (the frame gathers call their 2-thread halves), and that kernel's first call then crashed the
    process (a segfault, or "LLVM ERROR: Symbol not found: allocate_sched"; numba issue 8578) with
    a cache that other processes had filled (seen in session 46, the frame gather's case of
    tests/test_torch_threads_kept.py)."""
    @functools.wraps(kernel)
    def kept(*args):
        if not _numba_pool_started:
            start_numba_pool()
        return kernel(*args)
    return kept


_numba_pool_started = False


def compiled_entry(kernel, *args):
    """The machine code numba compiled of `kernel` (a dispatcher) for exactly these arguments'
    types (compiled or loaded from the cache now if it is not yet), as a callable. Calling it skips
    the dispatcher's typing of each argument: ~0.65 us of the ~1.2 us call of a frame sample with
    9 arguments (measured in session 55). It does not check what it is given, and reads an argument
    of another type as one of these: only for arguments whose types the caller fixes (a table's
    own arrays and scalars of the same kinds)."""
    import numba

    return kernel.compile(tuple(numba.typeof(arg) for arg in args))


def start_numba_pool() -> None:
    """Starts numba's thread pool if it is not running, with torch's thread count on the calling
    thread the same after it. Why: numba's `omp` threading layer sets the calling thread's OpenMP
    thread count to its own when it starts its pool, and torch reads that count (numba's pool
    links the libgomp torch loaded): a CNN learner on `runtime.torch_threads: 1` then ran its
    convolutions on two threads, in the processes runtime on the actor's core (docs/BENCHMARKS.md,
    Pixels end to end, session 20). Only the start moves it, not the regions after it (checked in
    session 55, tests/test_torch_threads_kept.py), so the count is restored here once instead of
    after every kernel call (0.45 us a call). A started pool stays started, in a forked child too,
    as numba's own flag says."""
    global _numba_pool_started
    import numba
    import torch

    threads = torch.get_num_threads()
    numba.get_num_threads()  # starts numba's pool if it is not running
    torch.set_num_threads(threads)
    _numba_pool_started = True
