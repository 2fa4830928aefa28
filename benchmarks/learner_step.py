"""Learner step: PEARL's fused DQN update vs the same update in PyTorch, side by side in one run.

One double-DQN gradient step (TD target, Huber loss, backward, grad-norm clip, Adam) of a
4-64-64-2 ReLU MLP at batch 64 — the CartPole setup of CONTEXT.md — by
  fused   kernels/cpu/qlearn.py (one numba call; BLAS for the products), on each of `--threads`
          (2: its big products in pairs on numba's pool, the same bits) in each of `--precision`
          (bf16: the inner hidden layers' products in bfloat16, kernels/cpu/bf16_gemm.py)
  torch   pearl/algos/dqn.py, the PyTorch reference the fused step is tested against (what
          Stable-Baselines3 and most libraries run), torch threads 1
Both run inside `cpu_kernel_mode()` (one BLAS thread, denormals flushed), on the same batches: a
pool of 64 random ones in turn (one batch repeated thousands of times drives the network into
its denormal range, which is not a learner's regime). The fused thread counts run interleaved.
Issue target: the fused step <= 100 us on the 2-core CPU machine.

    python benchmarks/learner_step.py
    python benchmarks/learner_step.py --batch 256 --hidden 256 256
    python benchmarks/learner_step.py --hidden 256 256 --vanilla --threads 1 2   # the RL Zoo's CartPole DQN
    python benchmarks/learner_step.py --hidden 256 256 --vanilla --threads 1 2 --precision fp32 bf16
"""
from __future__ import annotations

import argparse
import platform
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from timing import median_us, median_us_interleaved  # noqa: E402  (benchmarks/ is the script's own directory)

from pearl.algos.dqn import DQN  # noqa: E402
from pearl.config import DQNConfig  # noqa: E402
from pearl.kernels.cpu import FusedQLearner, cpu_kernel_mode  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--obs-dim", type=int, default=4)
    parser.add_argument("--hidden", type=int, nargs="+", default=[64, 64])
    parser.add_argument("--actions", type=int, default=2)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2000)
    parser.add_argument("--threads", type=int, nargs="+", default=[1], help="the fused step's threads (1 or 2)")
    parser.add_argument("--precision", nargs="+", choices=["fp32", "bf16"], default=["fp32"],
                        help="the fused step's product precisions (default: fp32)")
    parser.add_argument("--vanilla", action="store_true", help="vanilla DQN targets (default: double DQN)")
    args = parser.parse_args(argv)
    if not set(args.threads) <= {1, 2}:
        parser.error(f"--threads: expected 1 and / or 2, got {args.threads}")

    torch.set_num_threads(1)
    config = DQNConfig(hidden=list(args.hidden), lr=1e-3, double=not args.vanilla, max_grad_norm=10.0)
    algo = DQN(args.obs_dim, args.actions, config, total_steps=1000, seed=0)
    fused = {}
    for precision in args.precision:
        for threads in args.threads:
            kernel = fused[threads, precision] = FusedQLearner(algo.policy_sizes(), config.lr, config.double,
                                                               config.max_grad_norm, threads=threads, precision=precision)
            kernel.online[:] = DQN.flat_weights(algo.online)
            kernel.target[:] = DQN.flat_weights(algo.target)
    rng = np.random.default_rng(0)
    pool = [(rng.standard_normal((args.batch, args.obs_dim)).astype(np.float32),
             rng.integers(0, args.actions, args.batch),
             rng.standard_normal(args.batch).astype(np.float32),
             rng.standard_normal((args.batch, args.obs_dim)).astype(np.float32),
             np.full(args.batch, 0.99, np.float32)) for _ in range(64)]
    turn = {key: 0 for key in (*fused, "torch")}

    def step(key):
        turn[key] += 1
        batch = pool[turn[key] % len(pool)]
        if key == "torch":
            return algo.update(*(torch.from_numpy(np.asarray(a)) for a in batch))
        return fused[key].update(*batch)

    sizes = "-".join(str(s) for s in algo.policy_sizes())
    with cpu_kernel_mode():
        fused_us = median_us_interleaved({t: (lambda t=t: step(t)) for t in fused}, args.repeats)
        torch_us = median_us(lambda: step("torch"), max(100, args.repeats // 10))
    print(f"DQN learner step ({'vanilla' if args.vanilla else 'double'}), MLP {sizes}, batch {args.batch}, "
          f"{platform.processor() or platform.machine()}, torch {torch.__version__}: median us per update")
    for (threads, precision), us in fused_us.items():
        print(f"  fused (PEARL) {precision}, {threads} thread{'s' if threads > 1 else ' '} {us:9.1f}   "
              f"{torch_us / us:.1f}x faster than torch")
    print(f"  torch (reference)               {torch_us:9.1f}")
    for precision in args.precision:
        if len(args.threads) == 2:
            print(f"  fused {precision} 1 thread / 2 threads {fused_us[1, precision] / fused_us[2, precision]:9.2f}x")
    if len(args.precision) == 2:
        for threads in args.threads:
            print(f"  fused {threads} thread(s) fp32 / bf16 {fused_us[threads, 'fp32'] / fused_us[threads, 'bf16']:9.2f}x")
    fused_us = fused_us[args.threads[0], args.precision[0]]
    if (args.obs_dim, args.hidden, args.actions, args.batch, args.vanilla) == (4, [64, 64], 2, 64, False):
        verdict = "ok" if fused_us <= 100 else "NOT met"
        print(f"target fused step <= 100 us at 4-64-64-2, batch 64: {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
