"""Learner step: PEARL's fused DQN update vs the same update in PyTorch, side by side in one run.

One double-DQN gradient step (TD target, Huber loss, backward, grad-norm clip, Adam) of a
4-64-64-2 ReLU MLP at batch 64 — the CartPole setup of CONTEXT.md — by
  fused   kernels/cpu/qlearn.py (one numba call; BLAS for the products)
  torch   pearl/algos/dqn.py, the PyTorch reference the fused step is tested against (what
          Stable-Baselines3 and most libraries run), torch threads 1
Both run inside `cpu_kernel_mode()` (one BLAS thread, denormals flushed), on the same batches.
Issue target: the fused step <= 100 us on the 2-core CPU machine.

    python benchmarks/learner_step.py
    python benchmarks/learner_step.py --batch 256 --hidden 256 256
"""
from __future__ import annotations

import argparse
import platform
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from timing import median_us  # noqa: E402  (benchmarks/ is the script's own directory)

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
    args = parser.parse_args(argv)

    torch.set_num_threads(1)
    config = DQNConfig(hidden=list(args.hidden), lr=1e-3, double=True, max_grad_norm=10.0)
    algo = DQN(args.obs_dim, args.actions, config, total_steps=1000, seed=0)
    fused = FusedQLearner(algo.policy_sizes(), config.lr, config.double, config.max_grad_norm)
    fused.online[:] = DQN.flat_weights(algo.online)
    fused.target[:] = DQN.flat_weights(algo.target)
    rng = np.random.default_rng(0)
    batch = (rng.standard_normal((args.batch, args.obs_dim)).astype(np.float32),
             rng.integers(0, args.actions, args.batch),
             rng.standard_normal(args.batch).astype(np.float32),
             rng.standard_normal((args.batch, args.obs_dim)).astype(np.float32),
             np.full(args.batch, 0.99, np.float32))
    tensors = tuple(torch.from_numpy(np.asarray(a)) for a in batch)
    sizes = "-".join(str(s) for s in algo.policy_sizes())
    with cpu_kernel_mode():
        fused_us = median_us(lambda: fused.update(*batch), args.repeats)
        torch_us = median_us(lambda: algo.update(*tensors), max(100, args.repeats // 10))
    print(f"DQN learner step, MLP {sizes}, batch {args.batch}, {platform.processor() or platform.machine()}, "
          f"torch {torch.__version__}: median us per update")
    print(f"  fused (PEARL)     {fused_us:9.1f}")
    print(f"  torch (reference) {torch_us:9.1f}")
    print(f"  ours / theirs     {fused_us / torch_us:9.3f}x time ({torch_us / fused_us:.1f}x faster)")
    if (args.obs_dim, args.hidden, args.actions, args.batch) == (4, [64, 64], 2, 64):
        verdict = "ok" if fused_us <= 100 else "NOT met"
        print(f"target fused step <= 100 us at 4-64-64-2, batch 64: {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
