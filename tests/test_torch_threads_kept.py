"""numba's `omp` threading layer sets the calling thread's OpenMP thread count to its own when its
pool starts (the process's first parallel region), and torch reads that count: a CNN learner on
one torch thread ran its convolutions on two after its first 2-thread frame gather. The kernels
that start parallel regions keep torch's count (kernels/cpu/__init__.py torch_threads_kept).

Each case runs in a fresh interpreter: only a process's first parallel region moves the count, and
in a test session some earlier test has usually started numba's pool already."""
import os
import subprocess
import sys
import textwrap

import pytest

PREAMBLE = """
import numpy as np, torch
torch.ones(256, 256).sum()  # torch's OpenMP pool up first, as a learner's is
torch.set_num_threads(1)
"""

CASES = {
    "frame gather": """
from pearl.replay.frames import FrameReplay
table = FrameReplay(64, (9, 11), 4, kind="prioritized", gather_threads=2)
rng = np.random.default_rng(0)
for step in range(40):
    frame = rng.integers(0, 256, (1, 9, 11), dtype=np.uint8)
    table.add([0], frame, [0], [1.0], frame, [step % 13 == 12], [False])
table.sample(32, rng)
""",
    "fused DQN pairs": """
from pearl.kernels.cpu.qlearn import FusedQLearner
kernel = FusedQLearner([6, 128, 96, 3], 1e-3, False, 10.0, threads=2)
rng = np.random.default_rng(0)
obs = rng.standard_normal((128, 6)).astype(np.float32)
kernel.update(obs, rng.integers(0, 3, 128), np.ones(128, np.float32), obs, np.ones(128, np.float32))
""",
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_parallel_kernel_leaves_torchs_thread_count_alone(case):
    script = PREAMBLE + textwrap.dedent(CASES[case]) + "print(torch.get_num_threads())\n"
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "NUMBA_NUM_THREADS": "2", "OPENBLAS_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split()[-1] == "1", (result.stdout, result.stderr[-500:])


def test_a_kept_kernel_runs_with_numbas_pool_started():
    """numba starts its pool when it compiles a parallel region or loads a cached parallel=True
    function, not when it loads a cached kernel that calls one: the frame gather then crashed the
    process (a segfault, or LLVM's "Symbol not found: allocate_sched"; numba issue 8578) on a
    cache other processes had filled. A kept kernel runs with the pool started, and torch's count
    still kept."""
    script = PREAMBLE + textwrap.dedent("""
        from numba.np.ufunc import parallel
        from pearl.kernels.cpu import torch_threads_kept
        started = []
        torch_threads_kept(lambda: started.append(parallel._is_initialized))()
        print(started[0], torch.get_num_threads())
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "NUMBA_NUM_THREADS": "2", "OPENBLAS_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split()[-2:] == ["True", "1"], (result.stdout, result.stderr[-500:])


def test_regions_after_the_pools_start_leave_torchs_count_alone():
    """What lets start_numba_pool restore torch's count once instead of after every kernel call:
    only the pool's start moves the calling thread's OpenMP count, not the parallel regions after
    it, on that thread or another."""
    script = PREAMBLE + textwrap.dedent("""
        import threading
        from pearl.kernels.cpu import start_numba_pool
        from pearl.replay.frames import FrameReplay
        start_numba_pool()
        table = FrameReplay(64, (9, 11), 4, kind="uniform", gather_threads=2)
        rng = np.random.default_rng(0)
        for step in range(40):
            frame = rng.integers(0, 256, (1, 9, 11), dtype=np.uint8)
            table.add([0], frame, [0], [1.0], frame, [False], [False])
        counts = []
        for threads in (1, 3):
            torch.set_num_threads(threads)
            for _ in range(5):
                table.sample(32, rng)
            counts.append(torch.get_num_threads())
        def other():
            torch.set_num_threads(1)
            table.sample(32, np.random.default_rng(1))
            counts.append(torch.get_num_threads())
        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
        print(*counts)
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "NUMBA_NUM_THREADS": "2", "OPENBLAS_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split()[-3:] == ["1", "3", "1"], (result.stdout, result.stderr[-500:])
