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

3. `--learn-ab REV`, alone: the fused learner's update of this tree against the one at git
   revision REV (its pearl/runtime/fused_actor_critic.py loaded beside this one), same batches,
   the two taking turns in blocks, CPU time of each call (time.thread_time: robust to other
   processes' load, which wall time is not); per algorithm and precision, at `--hidden` / `--batch`.

    python benchmarks/ddpg_precision.py                 # 2 seeds x 6000 steps
    python benchmarks/ddpg_precision.py --quick
    python benchmarks/ddpg_precision.py --learn-ab 8eadf46 --algos ddpg td3 sac --hidden 64 64 --batch 64
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
    p.add_argument("--learn-ab", metavar="REV", help="only the learn call's CPU time: this tree against git REV")
    p.add_argument("--algos", choices=["ddpg", "td3", "sac"], nargs="+", default=["ddpg", "td3", "sac"],
                   help="--learn-ab's algorithms")
    p.add_argument("--hidden", type=int, nargs="+", help="--learn-ab's hidden widths (default: SB3's for each)")
    p.add_argument("--batch", type=int, default=BATCH, help="--learn-ab's batch size")
    p.add_argument("--blocks", type=int, default=15, help="--learn-ab's blocks of 20 calls per side")
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


def learner_at(rev: str):
    """The fused learners' module as it was at git revision `rev`, loaded under another name."""
    import importlib.util
    import subprocess
    import tempfile

    root = Path(__file__).resolve().parent.parent
    source = subprocess.run(["git", "show", f"{rev}:pearl/runtime/fused_actor_critic.py"], cwd=root, check=True,
                            capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / "fused_actor_critic_at_rev.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("fused_actor_critic_at_rev", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def learn_ab(args, algo: str, precision: str, old) -> tuple[float, float]:
    """Median CPU ms of one update: (REV's learner, this tree's), interleaved on the same batches."""
    import torch

    from pearl.kernels.cpu import cpu_kernel_mode

    torch.set_num_threads(1)
    options = {"hidden": args.hidden} if args.hidden else {}
    agents = []
    for module in (old, None):
        agent = make_pearl(0, 10_000, 1, "fused", algo=algo, precision=precision, batch_size=args.batch, **options)
        if module is not None:
            agent.learner = (module.FusedSACLearner if algo == "sac" else module.FusedActorCriticLearner)(
                agent.algo, precision)
        agent.train(LEARNING_STARTS + 300)
        agents.append(agent)
    agents[0].replay.rate_limiter = None  # sampling more batches than the replay ratio allows
    batches = [agents[0].replay.sample(args.batch, agents[0].rng) for _ in range(20)]
    times = ([], [])
    with cpu_kernel_mode():
        for agent in agents:
            for b in batches:
                agent.learner.update(b)
        for block in range(args.blocks):
            for side in ((0, 1) if block % 2 else (1, 0)):
                update = agents[side].learner.update
                for b in batches:
                    started = time.thread_time()
                    update(b)
                    times[side].append(time.thread_time() - started)
    return statistics.median(times[0]) * 1e3, statistics.median(times[1]) * 1e3


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    if args.learn_ab:
        old = learner_at(args.learn_ab)
        print(machine_header())
        print(f"fused learn call, CPU ms per update (median of {args.blocks} x 20 calls a side, interleaved), "
              f"hidden {args.hidden or 'SB3 defaults'}, batch {args.batch}, torch {torch.__version__}, 1 thread")
        for algo in args.algos:
            for precision in PRECISIONS:
                before, now = learn_ab(args, algo, precision, old)
                print(f"  {algo:<4} {precision}: {args.learn_ab} {before:7.3f}   this tree {now:7.3f}   "
                      f"ratio {now / before:.3f}   (load {load_average()})")
                sys.stdout.flush()
        return 0

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
