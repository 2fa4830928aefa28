"""Greedy returns over many seeds, PEARL against Stable-Baselines3, in benchmarks/e2e_ddpg.py's setup
(SB3's defaults of DDPG / TD3 / SAC on Pendulum-v1): learning, not speed.

At 5000 steps a run of either library sometimes has not learned yet (TD3: SB3's seed 3 ends at
-1023.8, docs/BENCHMARKS.md issue 19, session 22), so "the same returns" is a statement about the
two distributions, not a seed's pair: this prints every seed's greedy mean (20 episodes, the same
initial states for both: side_by_side.py `greedy_returns`), the medians, how many runs ended below
`--failed-below`, and a Mann-Whitney U test of each PEARL side against SB3. Each run is a fresh
process (side_by_side.py `run_fresh`); `--jobs 2` runs two at once, fine for returns (PEARL
sequential on one thread and SB3 on one thread are deterministic per seed), never for speeds.

    python benchmarks/continuous_returns.py --algo td3 --seeds 0 1 2 3 4 5 6 7 8 9 10 11 --jobs 2
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import e2e_ddpg  # noqa: E402  (benchmarks/ is the script's own directory)
from side_by_side import machine_header, print_result, run_fresh  # noqa: E402

SIDES = ("pearl-fp32", "pearl-bf16", "sb3")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--algo", choices=sorted(e2e_ddpg.ALGOS), default="td3")
    p.add_argument("--seeds", type=int, nargs="+", default=list(range(8)))
    p.add_argument("--steps", type=int, default=5000, help="env steps per run (default: 5000)")
    p.add_argument("--sides", nargs="+", choices=SIDES, default=list(SIDES))
    p.add_argument("--jobs", type=int, default=1, help="runs at once (default: 1)")
    p.add_argument("--failed-below", type=float, default=-600.0,
                   help="a greedy mean below this counts as not learned (default: -600)")
    p.add_argument("--json", metavar="PATH")
    p.add_argument("--worker", choices=SIDES, help=argparse.SUPPRESS)  # one side of one seed, in this process
    args = p.parse_args(argv)
    if args.steps <= e2e_ddpg.LEARNING_STARTS or args.jobs < 1:
        p.error(f"--steps / --jobs: expected steps > {e2e_ddpg.LEARNING_STARTS} and jobs >= 1, "
                f"got {args.steps} / {args.jobs}")
    return args


def worker(args) -> int:
    seed = args.seeds[0]
    if args.worker == "sb3":
        row = e2e_ddpg.run_sb3(seed, args.steps, 1, algo=args.algo)
    else:
        row = e2e_ddpg.run_pearl(seed, args.steps, 1, "auto", algo=args.algo, precision=args.worker.split("-")[1])
    print_result(row)
    return 0


def main(argv=None) -> int:
    from scipy.stats import mannwhitneyu

    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if args.worker:
        return worker(args)
    print(machine_header())
    print(f"{args.algo} on {e2e_ddpg.ENV_ID}, {args.steps} steps, greedy mean of 20 episodes, seeds {args.seeds}, "
          f"sides {args.sides}, {args.jobs} run(s) at once")
    runs = [(side, seed) for seed in args.seeds for side in args.sides]
    with ThreadPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(lambda run: run_fresh(__file__, run[0], run[1], argv), runs))
    means = {side: {} for side in args.sides}
    for (side, seed), row in zip(runs, rows):
        means[side][seed] = row["eval_mean"]
    print(f"\n{'side':<11}" + "".join(f"{seed:>9}" for seed in args.seeds) + f"{'median':>9}  below {args.failed_below:g}")
    for side, by_seed in means.items():
        values = list(by_seed.values())
        failed = sum(v < args.failed_below for v in values)
        print(f"{side:<11}" + "".join(f"{by_seed[seed]:9.1f}" for seed in args.seeds)
              + f"{statistics.median(values):9.1f}  {failed} of {len(values)}")
    tests = {}
    if "sb3" in means:
        for side in (s for s in args.sides if s != "sb3"):
            tests[side] = float(mannwhitneyu(list(means[side].values()), list(means["sb3"].values())).pvalue)
            print(f"Mann-Whitney U, {side} against sb3: p = {tests[side]:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "means": means, "mann_whitney_p": tests},
                                              indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
