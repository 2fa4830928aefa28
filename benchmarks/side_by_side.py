"""Shared by the end-to-end benchmarks (PEARL vs Stable-Baselines3, side by side in one run).

- `run_alternating(seeds, runners)`: each seed runs both libraries back to back, the order
  alternating per seed (PEARL first on even seeds), so slow drifts of the machine hit both alike.
- `sb3_greedy_returns`: SB3's greedy returns on the initial states PEARL's `agent.evaluate` uses
  (episode i resets with seed `seed + 1_000_003 + i`), so the two returns differ by the policies
  only (a return can depend strongly on the start: Pendulum's ranges from ~-120 near the top to
  ~-360 from the worst angle and speed).
- `print_seed_table`: one seed's rows and the speed ratio.
- `versions(script)`: the library versions both sides run with, or None (and why) without SB3.
- `time_pearl(agent, steps, threads, episodes)`: a PEARL agent's timed training and evaluation row.
- `add_common_arguments(parser, steps, quick_steps)` / `check_common_arguments(parser, args,
  learning_starts, quick_steps)`: the options every end-to-end benchmark takes (seeds, steps,
  torch threads, PEARL's learner kernel, both learners' device, --quick, --json) and their checks.
"""
import argparse
import sys

import gymnasium as gym


def add_common_arguments(p: argparse.ArgumentParser, steps: int, quick_steps: int) -> None:
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds to run (default: 0 1 2)")
    p.add_argument("--steps", type=int, default=steps, help=f"env steps per run (default: {steps})")
    p.add_argument("--threads", type=int, default=1, help="torch threads for both (default: 1)")
    p.add_argument("--learner-kernel", choices=["auto", "fused", "torch"], default="auto",
                   help="PEARL's learner kernel (default: auto)")
    p.add_argument("--device", default="cpu",
                   help="both learners' torch device: cpu or cuda[:N] (default: cpu; PEARL's fused kernel "
                        "runs on the cpu only, so cuda means its torch learner)")
    p.add_argument("--quick", action="store_true", help=f"smoke test: {quick_steps} steps, 1 seed")
    p.add_argument("--json", metavar="PATH", help="write the results as JSON to PATH")


def check_common_arguments(p: argparse.ArgumentParser, args, learning_starts: int, quick_steps: int) -> None:
    if args.quick:
        args.steps, args.seeds = quick_steps, args.seeds[:1]
    if args.steps <= learning_starts:
        p.error(f"--steps: expected more than learning_starts ({learning_starts}), got {args.steps}")
    if args.threads < 1:
        p.error(f"--threads: expected >= 1, got {args.threads}")
    if args.device != "cpu":
        import torch

        if not args.device.startswith("cuda") or not torch.cuda.is_available():
            p.error(f"--device: expected cpu or cuda[:N] with a CUDA GPU torch can see, got {args.device!r}")


def run_alternating(seeds, runners: dict, report) -> list[dict]:
    """`runners` maps "pearl" and "sb3" to `seed -> row dict`; `report(seed, order, rows)` is
    called after each seed. Returns one {"pearl": row, "sb3": row, "order": [...]} per seed."""
    results = []
    for seed in seeds:
        order = ["pearl", "sb3"] if seed % 2 == 0 else ["sb3", "pearl"]
        rows = {name: None for name in order}
        for name in order:
            rows[name] = runners[name](seed)
        rows["order"] = order
        results.append(rows)
        report(seed, order, rows)
    return results


def print_seed_table(seed: int, order: list[str], rows: dict, decimals: int = 0) -> None:
    print(f"\nseed {seed} (ran {' then '.join(order)})")
    print(f"  {'impl':<6} {'env steps':>9} {'updates':>8} {'wall s':>8} {'steps/s':>9} {'updates/s':>9} "
          f"{'eval return':>16}")
    for name in ("pearl", "sb3"):
        r = rows[name]
        print(f"  {name:<6} {r['env_steps']:>9d} {r['updates']:>8d} {r['wall_s']:>8.2f} "
              f"{r['steps_per_s']:>9.{decimals}f} {r['updates_per_s']:>9.{decimals}f} "
              f"{r['eval_mean']:>8.1f} +- {r['eval_std']:<5.1f}")
    tasks = ", ".join(f"{t} {us:.0f}" for t, us in (rows["pearl"].get("task_us") or {}).items())
    print(f"  speedup (steps/s): {rows['pearl']['steps_per_s'] / rows['sb3']['steps_per_s']:.2f}x"
          f"   pearl learner kernel: {rows['pearl']['learner_kernel']}; us per task call: {tasks}")
    sys.stdout.flush()


def sb3_greedy_returns(model, env_id: str, seed: int, episodes: int) -> list[float]:
    env = gym.make(env_id)
    returns = []
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed + 1_000_003 + episode)
        total, done = 0.0, False
        while not done:
            action, _ = model.predict(obs, deterministic=True)
            obs, reward, terminated, truncated, _ = env.step(action)
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    env.close()
    return returns


def versions(script: str) -> dict | None:
    """{"sb3", "torch", "gymnasium": version}; None, with the reason on stderr, when SB3 is
    missing. Imports pearl too, so a broken install fails before any timing."""
    try:
        import stable_baselines3
    except ImportError:
        print(f"{script}: stable_baselines3 is not installed; run `pip install -e .[bench]`", file=sys.stderr)
        return None
    import torch

    import pearl  # noqa: F401

    return {"sb3": stable_baselines3.__version__, "torch": torch.__version__, "gymnasium": gym.__version__}


def time_pearl(agent, steps: int, threads: int, episodes: int) -> dict:
    """Trains `agent` for `steps` (only train() is timed; the lazily built env is built before) and
    evaluates it greedily: the row print_seed_table and the summaries read."""
    import time

    import torch

    torch.set_num_threads(threads)
    _ = agent.actor
    started = time.perf_counter()
    summary = agent.train(steps, time_tasks=True)
    wall = time.perf_counter() - started
    evaluation = agent.evaluate(episodes)
    return {
        "impl": "pearl", "seed": agent.config.seed, "env_steps": summary["env_steps"],
        "updates": summary["updates"], "wall_s": wall, "steps_per_s": summary["env_steps"] / wall,
        "updates_per_s": summary["updates"] / wall, "eval_mean": evaluation["mean"],
        "eval_std": evaluation["std"], "eval_returns": evaluation["returns"],
        "train_mean_return_100": summary["mean_return_100"], "learner_kernel": summary["learner_kernel"],
        "task_us": summary.get("task_us"),
    }
