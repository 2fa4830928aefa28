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
"""
import sys

import gymnasium as gym


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
