"""What would beat the float32 arithmetic bound of DDPG at 400x300 / batch 256: bfloat16 products.

This machine's cores have AMX / AVX-512 BF16 units. Two measurements, same process, 1 torch thread:

1. Speed potential: the matrix products of one fused-learner DDPG update (captured from a real
   update, as benchmarks/e2e_ddpg.py does) replayed alone with float32 operands and again with
   bfloat16 operands: the arithmetic bound of each precision.
2. Learning: DDPG (or `--algo td3` / `sac`) on Pendulum-v1 (SB3's setup, as in e2e_ddpg.py) trained by
   the fused learner with float32 and with bfloat16 products (runtime.learner_precision: bf16;
   float32 master weights, losses, Adam and output layers: pearl/runtime/fused_actor_critic.py),
   greedy evaluation (the same 10 initial states) every `--eval-every` steps, over seeds; the
   precisions take turns per seed.

    python benchmarks/ddpg_precision.py                 # 2 seeds x 6000 steps
    python benchmarks/ddpg_precision.py --quick
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e_ddpg import BATCH, LEARNING_STARTS, capture_matmuls, make_pearl, matmul_flops, replay_seconds  # noqa: E402
from side_by_side import load_average, machine_header  # noqa: E402

PRECISIONS = ("fp32", "bf16")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--algo", choices=["ddpg", "td3", "sac"], default="ddpg")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--steps", type=int, default=6000)
    p.add_argument("--eval-every", type=int, default=1000)
    p.add_argument("--quick", action="store_true", help="1 seed x 2000 steps")
    args = p.parse_args(argv)
    if args.quick:
        args.seeds, args.steps = args.seeds[:1], 2000
    return args


def product_bounds(algo: str) -> dict:
    import torch

    from pearl.kernels.cpu import cpu_kernel_mode

    torch.set_num_threads(1)
    agent = make_pearl(0, 10_000, 1, "fused", algo=algo)
    agent.train(LEARNING_STARTS + 200)
    batch = agent.replay.sample(BATCH, agent.rng)
    with cpu_kernel_mode():
        calls = capture_matmuls(lambda: agent.learner.update(batch))
        def bf16(value):
            return value.to(torch.bfloat16) if isinstance(value, torch.Tensor) else value
        half = [(func, [bf16(a) for a in args], {k: bf16(v) for k, v in kwargs.items()})
                for func, args, kwargs in calls]
        fp32_s, bf16_s = replay_seconds(calls, half)
    flops = matmul_flops(calls)
    return {"gflop": flops / 1e9, "float32_ms": fp32_s * 1e3, "bfloat16_ms": bf16_s * 1e3,
            "float32_gflops": flops / fp32_s / 1e9, "bfloat16_gflops": flops / bf16_s / 1e9}


def train_curve(seed: int, steps: int, every: int, precision: str, algo: str) -> dict:
    agent = make_pearl(seed, steps, 1, "fused", algo=algo, precision=precision)
    curve, train_s = [], 0.0
    while agent.env_steps < steps:
        started = time.perf_counter()
        agent.train(min(every, steps - agent.env_steps))
        train_s += time.perf_counter() - started
        curve.append((agent.env_steps, agent.evaluate(10)["mean"]))
    return {"curve": curve, "steps_per_s": steps / train_s, "learner": f"{agent.learner.kernel} {agent.learner.precision}"}


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    print(machine_header())
    print(f"{args.algo.upper()} 400x300 batch 256 on Pendulum-v1, torch {torch.__version__}, 1 thread")
    bounds = product_bounds(args.algo)
    print(f"products of one update: {bounds['gflop'] * 1e3:.0f} MFLOP; float32 {bounds['float32_ms']:.2f} ms "
          f"({bounds['float32_gflops']:.0f} GFLOP/s), bfloat16 {bounds['bfloat16_ms']:.2f} ms "
          f"({bounds['bfloat16_gflops']:.0f} GFLOP/s): {bounds['float32_ms'] / bounds['bfloat16_ms']:.2f}x")
    rows = {}
    for k, seed in enumerate(args.seeds):
        for precision in PRECISIONS[k % 2:] + PRECISIONS[:k % 2]:  # the order alternates per seed
            result = train_curve(seed, args.steps, args.eval_every, precision, args.algo)
            rows[(precision, seed)] = result
            curve = "  ".join(f"{step}:{ret:.0f}" for step, ret in result["curve"])
            print(f"{precision:<9} seed {seed} ({result['learner']} learner, {result['steps_per_s']:.0f} steps/s "
                  f"with evaluation excluded, load {load_average()})  greedy return by env step: {curve}")
            sys.stdout.flush()
    for precision in PRECISIONS:
        finals = [rows[(precision, s)]["curve"][-1][1] for s in args.seeds]
        print(f"final greedy return, {precision}: median {statistics.median(finals):.1f} over seeds {args.seeds}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
