"""Learner threads: PEARL's fused DDPG update (pearl/runtime/fused_actor_critic.py) on 1 vs 2
threads, at Stable-Baselines3's defaults (Pendulum-v1, 400x300, batch 256), side by side in one run.

The fused learner's matrix products are torch calls writing into preallocated buffers, so torch's
intra-op threads split them: `runtime.torch_threads: 2` (or the benchmarks' `--threads 2`) puts
both cores on the learner while the actor waits for it (sequential runtime). The thread counts take
turns in blocks of `--block` updates on the same batch, so a load that comes and goes on a
shared machine hits both alike; reported are each block's median and the ratio of the medians.

    python benchmarks/learner_threads.py
    python benchmarks/learner_threads.py --threads 1 2 --blocks 10 --block 50
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from side_by_side import load_average, machine_header  # noqa: E402  (benchmarks/ is the script's own directory)

from pearl.kernels.cpu import cpu_kernel_mode  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--blocks", type=int, default=10, help="blocks per thread count (default: 10)")
    parser.add_argument("--block", type=int, default=40, help="updates per block (default: 40)")
    parser.add_argument("--hidden", type=int, nargs="+", default=[400, 300])
    parser.add_argument("--batch", type=int, default=256)
    args = parser.parse_args(argv)

    import pearl

    print(machine_header())
    agent = pearl.DDPG(env="Pendulum-v1", seed=0, total_steps=10_000, hidden=list(args.hidden), batch_size=args.batch,
                       learning_starts=100, updates_per_step=1.0, replay="uniform", capacity=100_000,
                       learner_kernel="fused")
    agent.train(400)  # a filled replay and warm optimizer state
    batch = agent.replay.sample(args.batch, agent.rng)  # (one: the replay's rate limiter admits one per step)
    samples = {t: [] for t in args.threads}
    with cpu_kernel_mode():
        for threads in args.threads:  # warm-up of each thread count's pool
            torch.set_num_threads(threads)
            for _ in range(5):
                agent.learner.update(batch)
        for _ in range(args.blocks):
            for threads in args.threads:
                torch.set_num_threads(threads)
                times = []
                for _ in range(args.block):
                    started = time.perf_counter()
                    agent.learner.update(batch)
                    times.append(time.perf_counter() - started)
                samples[threads].append(statistics.median(times))
    print(f"fused DDPG update, MLPs {args.hidden}, batch {args.batch}, learner kernel {agent.learner.kernel}: "
          f"ms per update (median of each block of {args.block}, {args.blocks} blocks per thread count)")
    base = statistics.median(samples[args.threads[0]])
    for threads in args.threads:
        median = statistics.median(samples[threads])
        print(f"  {threads} thread(s): median {1e3 * median:7.2f} ms  (blocks {min(samples[threads]) * 1e3:.2f}"
              f"-{max(samples[threads]) * 1e3:.2f})   speed-up over {args.threads[0]}: {base / median:.2f}x")
    print(f"load average at the end: {load_average()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
