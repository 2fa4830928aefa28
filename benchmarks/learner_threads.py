"""Learner threads and precision: PEARL's fused DDPG (or TD3, SAC) update (pearl/runtime/fused_actor_critic.py)
on 1 vs 2 threads, with float32 and bfloat16 products, at Stable-Baselines3's defaults (Pendulum-v1,
400x300, batch 256), side by side in one run.

The fused learner's matrix products are torch calls writing into preallocated buffers, so torch's
intra-op threads split them: `runtime.torch_threads: 2` (or the benchmarks' `--threads 2`) puts
both cores on the learner while the actor waits for it (sequential runtime). The variants take
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
    parser.add_argument("--precisions", nargs="+", choices=["fp32", "bf16"], default=["fp32", "bf16"],
                        help="the learner's product precisions (runtime.learner_precision; default: both)")
    parser.add_argument("--algo", choices=["ddpg", "td3", "sac"], default="ddpg")
    parser.add_argument("--blocks", type=int, default=10, help="blocks per variant (default: 10)")
    parser.add_argument("--block", type=int, default=40, help="updates per block (default: 40)")
    parser.add_argument("--hidden", type=int, nargs="+", default=[400, 300])
    parser.add_argument("--batch", type=int, default=256)
    args = parser.parse_args(argv)

    import pearl

    print(machine_header())
    agents = {}
    for precision in args.precisions:
        agent = getattr(pearl, args.algo.upper())(
            env="Pendulum-v1", seed=0, total_steps=10_000, hidden=list(args.hidden), batch_size=args.batch,
            learning_starts=100, updates_per_step=1.0, replay="uniform", capacity=100_000, learner_kernel="fused",
            learner_precision=precision)
        agent.train(400)  # a filled replay and warm optimizer state
        agents[precision] = (agent, agent.replay.sample(args.batch, agent.rng))
    variants = [(t, p) for t in args.threads for p in args.precisions]
    wall = {v: [] for v in variants}
    cpu = {v: [] for v in variants}  # process CPU time (all threads): what the update costs the cores
    with cpu_kernel_mode():
        for threads, precision in variants:  # warm-up of each variant
            torch.set_num_threads(threads)
            agent, batch = agents[precision]
            for _ in range(5):
                agent.learner.update(batch)
        for _ in range(args.blocks):
            for threads, precision in variants:
                torch.set_num_threads(threads)
                agent, batch = agents[precision]
                times, cpus = [], []
                for _ in range(args.block):
                    started, cpu_started = time.perf_counter(), time.process_time()
                    agent.learner.update(batch)
                    times.append(time.perf_counter() - started)
                    cpus.append(time.process_time() - cpu_started)
                wall[(threads, precision)].append(statistics.median(times))
                cpu[(threads, precision)].append(statistics.median(cpus))
    print(f"fused {args.algo.upper()} update, MLPs {args.hidden}, batch {args.batch}: ms per update (median of each "
          f"block of {args.block}, {args.blocks} blocks per variant, interleaved)")
    base = statistics.median(wall[variants[0]])
    for v in variants:
        median = statistics.median(wall[v])
        print(f"  {v[0]} thread(s) {v[1]}: wall median {1e3 * median:7.2f} ms (blocks {min(wall[v]) * 1e3:.2f}-"
              f"{max(wall[v]) * 1e3:.2f}), process CPU {1e3 * statistics.median(cpu[v]):7.2f} ms;  speed-up over "
              f"{variants[0][0]} thread(s) {variants[0][1]}: {base / median:.2f}x")
    print(f"load average at the end: {load_average()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
