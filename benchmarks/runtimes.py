"""PEARL's runtimes side by side on one config: sequential (the reference), threaded, processes
with 1..N actors, processes with the prefetching learner. Prints env steps/s, each runtime's
ratio to the sequential one, the per-task times and the greedy return, so which runtime suits a
workload is decided by measurement.

    python benchmarks/runtimes.py                          # CartPole DQN, e2e_dqn's setup (actor-bound)
    python benchmarks/runtimes.py --replay prioritized --updates-per-step 1 --batch 256   # learner-bound
    python benchmarks/runtimes.py --steps 20000 --actors 1 2 --json out.json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--env", default="CartPole-v1")
    p.add_argument("--steps", type=int, default=30_000, help="env steps per run (default 30000)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1], help="seeds (default 0 1)")
    p.add_argument("--replay", default="uniform", choices=["uniform", "prioritized", "amper"])
    p.add_argument("--updates-per-step", type=float, default=0.25)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--actors", type=int, nargs="+", default=[1, 2], help="actor counts for processes (default 1 2)")
    p.add_argument("--no-threaded", action="store_true", help="skip the threaded runtime")
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args(argv)
    if args.steps <= 1000:
        p.error(f"--steps: expected more than the 1000 warm-up steps, got {args.steps}")
    if min(args.actors) < 1:
        p.error(f"--actors: expected counts >= 1, got {args.actors}")
    return args


def variants(args) -> list[tuple[str, dict]]:
    out = [("sequential", {"runtime": "sequential"})]
    if not args.no_threaded:
        out.append(("threaded", {"runtime": "threaded"}))
    for actors in args.actors:
        out.append((f"processes x{actors}", {"runtime": "processes", "actors": actors}))
        out.append((f"processes x{actors} prefetch", {"runtime": "processes", "actors": actors, "prefetch": True}))
    return out


def run_one(args, seed: int, plan_fields: dict) -> dict:
    import pearl
    from pearl.plan import Plan

    agent = pearl.DQN(env=args.env, seed=seed, total_steps=args.steps, hidden=[64, 64], lr=2e-3,
                      batch_size=args.batch, learning_starts=1000, updates_per_step=args.updates_per_step,
                      target_update_interval=500, tau=1.0, double=False, n_step=1, replay=args.replay,
                      capacity=max(args.steps, 50_000), plan=Plan(batch_size=args.batch, **plan_fields))
    summary = agent.train(time_tasks=True)
    return {"steps_per_s": summary["steps_per_s"], "updates": summary["updates"],
            "task_us": summary["task_us"], "eval": agent.evaluate(10)["mean"]}


def main(argv=None) -> int:
    args = parse_args(argv)
    print(f"PEARL runtimes on {args.env}: {args.steps} steps x seeds {args.seeds}, replay {args.replay}, "
          f"{args.updates_per_step:g} updates/step, batch {args.batch}; {os.cpu_count()} cores, "
          f"load average before {os.getloadavg()[0]:.2f}")
    rows = []
    for name, fields in variants(args):
        runs = [run_one(args, seed, fields) for seed in args.seeds]
        rows.append({"runtime": name, "plan": fields, "runs": runs,
                     "median_steps_per_s": statistics.median(r["steps_per_s"] for r in runs)})
    base = rows[0]["median_steps_per_s"]
    print(f"\n{'runtime':<26} {'steps/s':>9} {'vs sequential':>14}  {'eval':>7}  us per task call (first seed)")
    for row in rows:
        tasks = ", ".join(f"{t} {us:.0f}" for t, us in row["runs"][0]["task_us"].items())
        evals = statistics.median(r["eval"] for r in row["runs"])
        print(f"{row['runtime']:<26} {row['median_steps_per_s']:>9,.0f} {row['median_steps_per_s'] / base:>13.2f}x"
              f"  {evals:>7.1f}  {tasks}")
    print(f"load average after {os.getloadavg()[0]:.2f}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"benchmark": "runtimes", "args": vars(args), "machine": platform.platform(),
                       "rows": rows}, out, indent=2)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
