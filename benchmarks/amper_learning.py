"""Learning quality: DQN with exact prioritized replay vs AMPER-style bucketed sampling.

Trains `pearl.DQN(env=..., replay=kind, seed=s, total_steps=N)` for kind in ("prioritized",
"amper") on CartPole-v1 and Acrobot-v1, 3 seeds each, everything else at PEARL's defaults (same
hyperparameters for both kinds, alpha 0.6, beta 0.4 -> 1), then evaluates each trained agent
greedily (10 episodes, the agent's own evaluation seeds) and prints the final returns side by side
with the per-environment medians.

`replay="amper"` selects the AMPER sampler through the public API (ReplayConfig.kind).

    python benchmarks/amper_learning.py                      # 2 envs x 3 seeds x 2 kinds, 50k steps
    python benchmarks/amper_learning.py --steps 100000 --json amper_learning.json
    python benchmarks/amper_learning.py --smoke              # 2k steps, CartPole, seed 0 (plumbing only)

Runs one agent at a time in this process (a few minutes each on a shared 2-core machine).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import pearl

ENVS = ("CartPole-v1", "Acrobot-v1")
KINDS = ("prioritized", "amper")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--envs", nargs="+", default=list(ENVS))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--kinds", nargs="+", default=list(KINDS), help="replay kinds to compare")
    p.add_argument("--steps", type=int, default=50_000, help="env steps per run (default: 50000)")
    p.add_argument("--eval-episodes", type=int, default=10)
    p.add_argument("--smoke", action="store_true", help="2000 steps, first env and seed only")
    p.add_argument("--json", metavar="PATH", help="write the results as JSON to PATH")
    args = p.parse_args(argv)
    if args.smoke:
        args.steps, args.envs, args.seeds, args.eval_episodes = 2000, args.envs[:1], args.seeds[:1], 2
    return args


def run_one(env: str, kind: str, seed: int, steps: int, episodes: int) -> dict:
    agent = pearl.DQN(env=env, replay=kind, seed=seed, total_steps=steps)
    started = time.perf_counter()
    summary = agent.train()
    wall = time.perf_counter() - started
    result = agent.evaluate(episodes)
    return {"env": env, "kind": kind, "seed": seed, "return": result["mean"], "return_std": result["std"],
            "train_s": wall, "steps_per_s": summary["steps_per_s"]}


def fmt(value) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def main(argv=None) -> None:
    args = parse_args(argv)
    rows = []
    for env in args.envs:
        for seed in args.seeds:
            for kind in args.kinds:
                row = run_one(env, kind, seed, args.steps, args.eval_episodes)
                rows.append(row)
                detail = f"{row['train_s']:.0f} s, {row['steps_per_s']:.0f} steps/s"
                print(f"{env} seed {seed} {kind}: return {fmt(row['return'])} ({detail})", flush=True)
    print(f"\nfinal greedy return ({args.eval_episodes} episodes), {args.steps} env steps per run")
    print(f"{'env':>12} {'seed':>5} " + " ".join(f"{k:>12}" for k in args.kinds))
    for env in args.envs:
        for seed in args.seeds:
            got = {r["kind"]: r["return"] for r in rows if r["env"] == env and r["seed"] == seed}
            print(f"{env:>12} {seed:>5} " + " ".join(f"{fmt(got.get(k)):>12}" for k in args.kinds))
        medians = []
        for k in args.kinds:
            values = [r["return"] for r in rows if r["env"] == env and r["kind"] == k and r["return"] is not None]
            medians.append(statistics.median(values) if values else None)
        print(f"{env:>12} {'med':>5} " + " ".join(f"{fmt(m):>12}" for m in medians))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"steps": args.steps, "eval_episodes": args.eval_episodes, "runs": rows}, f, indent=1)


if __name__ == "__main__":
    main()
