"""Shared by the end-to-end benchmarks (PEARL vs Stable-Baselines3, side by side in one run).

What makes the comparison fair, and where it is done:
- `warm_up(runners, seed, steps)`: one short untimed run of every side before the timed seeds, so
  no side's first timed seed pays for first imports, numba's cache loads, torch's thread pool or
  cold file caches while the other's does not.
- `run_alternating(seeds, runners, report)`: each seed runs every side back to back, the order
  rotating per seed, so slow drifts of the machine hit all sides alike.
- `greedy_returns(env_id, act, episodes, seed)`: the one evaluation both libraries go through
  (pearl.envs.episode_returns on the same initial states: episode i resets with seed
  `seed + 1_000_003 + i`), so two returns differ by the policies only (a return can depend
  strongly on the start: Pendulum's ranges from ~-120 near the top to ~-360 from the worst angle).
- SB3 runs at each torch thread count of `--sb3-threads` (default 1 and 2): its best (highest
  median env steps/s) is the rival (`best_rival`), and the per-seed ratios are against it.
- `machine_header()`: the CPU model, core count and load average printed at the top (and the load
  again at the end), since the machine may be shared.
- `print_seed_table`: one seed's rows and its speed ratios.
- `versions(script)`: the library versions both sides run with, or None (and why) without SB3.
- `time_pearl(agent, steps, threads, episodes)`: a PEARL agent's timed training and evaluation row.
- `add_common_arguments(parser, steps, quick_steps)` / `check_common_arguments(parser, args,
  learning_starts, quick_steps)`: the options every end-to-end benchmark takes (seeds, steps,
  torch threads, PEARL's learner kernel, both learners' device, warm-up, --quick, --json).
"""
import argparse
import os
import platform
import statistics
import sys
import time

import gymnasium as gym  # noqa: F401  (imported before timing: both sides use it)
from pearl.kernels.cpu.backend import cpu_model  # noqa: E402

EVAL_SEED_OFFSET = 1_000_003  # evaluation envs' seeds: apart from every training seed
EVAL_EPISODES = 20
WARMUP_SEED = 10_000  # the untimed warm-up run's seed: apart from every timed seed


def add_common_arguments(p: argparse.ArgumentParser, steps: int, quick_steps: int, warmup_steps: int) -> None:
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds to run (default: 0 1 2)")
    p.add_argument("--steps", type=int, default=steps, help=f"env steps per run (default: {steps})")
    p.add_argument("--threads", type=int, default=1, help="PEARL's torch threads (default: 1)")
    p.add_argument("--sb3-threads", type=int, nargs="+", default=[1, 2],
                   help="SB3's torch thread counts to run; its best is the rival (default: 1 2)")
    p.add_argument("--learner-kernel", choices=["auto", "fused", "torch"], default="auto",
                   help="PEARL's learner kernel (default: auto)")
    p.add_argument("--device", default="cpu",
                   help="both learners' torch device: cpu or cuda[:N] (default: cpu; PEARL's fused kernel "
                        "runs on the cpu only, so cuda means its torch learner)")
    p.add_argument("--warmup-steps", type=int, default=warmup_steps,
                   help=f"env steps of the untimed warm-up run of every side before the timed seeds "
                        f"(default: {warmup_steps}; 0: none)")
    p.add_argument("--eval-episodes", type=int, default=EVAL_EPISODES,
                   help=f"greedy evaluation episodes per run, the same initial states for both (default: {EVAL_EPISODES})")
    p.add_argument("--quick", action="store_true", help=f"smoke test: {quick_steps} steps, 1 seed")
    p.add_argument("--json", metavar="PATH", help="write the results as JSON to PATH")


def check_common_arguments(p: argparse.ArgumentParser, args, learning_starts: int, quick_steps: int) -> None:
    if args.quick:
        args.steps, args.seeds = quick_steps, args.seeds[:1]
        args.warmup_steps = min(args.warmup_steps, learning_starts + 200)
    if args.steps <= learning_starts:
        p.error(f"--steps: expected more than learning_starts ({learning_starts}), got {args.steps}")
    if args.threads < 1 or min(args.sb3_threads) < 1:
        p.error(f"--threads / --sb3-threads: expected >= 1, got {args.threads} / {args.sb3_threads}")
    if args.warmup_steps < 0 or args.eval_episodes < 1:
        p.error(f"--warmup-steps / --eval-episodes: expected >= 0 / >= 1, got {args.warmup_steps} / "
                f"{args.eval_episodes}")
    if args.device != "cpu":
        import torch

        if not args.device.startswith("cuda") or not torch.cuda.is_available():
            p.error(f"--device: expected cpu or cuda[:N] with a CUDA GPU torch can see, got {args.device!r}")




def load_average() -> str:
    try:
        return "/".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def machine_header() -> str:
    return f"machine: {cpu_model()}, {os.cpu_count()} logical cores; load average (1/5/15 min) {load_average()}"


def machine_info() -> dict:
    return {"platform": platform.platform(), "cpu": cpu_model(), "cores": os.cpu_count(),
            "load_average_start": load_average()}


def sb3_name(threads: int) -> str:
    return f"sb3@{threads}t"


RESULT_PREFIX = "RESULT "


def print_result(row: dict) -> None:
    """A worker's row, as `run_fresh` reads it back from the worker's output."""
    import json

    print(RESULT_PREFIX + json.dumps(row, default=str), flush=True)


def run_fresh(script: str, side: str, seed: int, argv: list[str]) -> dict:
    """One side of one seed of `script` in a fresh Python process (the same arguments otherwise):
    the script runs `--worker SIDE` with `--seeds SEED` and prints its row as `RESULT <json>`. Run
    in one process, a side after SB3 with 2 torch threads paid ~0.7 of a core to a thread SB3's run
    left behind (docs/BENCHMARKS.md, Atari, session 15)."""
    import json
    import subprocess

    command = [sys.executable, script, *argv, "--seeds", str(seed), "--worker", side]
    done = subprocess.run(command, stdout=subprocess.PIPE, text=True)
    for line in done.stdout.splitlines():
        if line.startswith(RESULT_PREFIX):
            return json.loads(line[len(RESULT_PREFIX):])
    raise RuntimeError(f"{side} seed {seed}: no result (exit code {done.returncode})")


def run_worker(run, args, steps: int) -> int:
    """A `--worker` process: side `run` (seed, steps) -> row of seed `args.seeds[0]` after its own
    untimed warm-up run of `args.warmup_steps`, its row printed for `run_fresh`."""
    if args.warmup_steps:
        run(WARMUP_SEED, args.warmup_steps)
    print_result(run(args.seeds[0], steps))
    return 0


def write_json(path: str, out: dict) -> None:
    """A benchmark's results as JSON at `path` (its folder made if missing)."""
    import json
    from pathlib import Path

    path = Path(path)
    if path.parent != Path(""):
        path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2, default=str) + "\n")
    print(f"wrote {path}")


def warm_up(runners: dict, seed: int, steps: int) -> None:
    """One untimed run of every side (`runners`: name -> (seed, steps) -> row) before the timed seeds."""
    if steps <= 0:
        return
    started = time.perf_counter()
    for run in runners.values():
        run(seed, steps)
    print(f"warm-up: {steps} steps of every side, untimed ({time.perf_counter() - started:.1f} s)", flush=True)


def run_alternating(seeds, runners: dict, report) -> list[dict]:
    """`runners` maps each side's name to `seed -> row dict`; `report(seed, order, rows)` is called
    after each seed. The order rotates per seed. Returns one {name: row, ..., "order": [...]} per seed."""
    names = list(runners)
    results = []
    for k, seed in enumerate(seeds):
        order = names[k % len(names):] + names[:k % len(names)]
        rows = {}
        for name in order:
            rows[name] = runners[name](seed)
        rows["order"] = order
        results.append(rows)
        report(seed, order, rows)
    return results


def sides(results: list[dict]) -> list[str]:
    return [name for name in results[0] if name != "order"]


def median_of(results: list[dict], name: str, key: str) -> float:
    return float(statistics.median(r[name][key] for r in results))


def best_rival(results: list[dict], prefix: str = "sb3") -> str:
    """The rival side (name starting with `prefix`) with the highest median env steps/s."""
    return max((n for n in sides(results) if n.startswith(prefix)), key=lambda n: median_of(results, n, "steps_per_s"))


def ratios_per_seed(results: list[dict], ours: str, theirs: str, key: str = "steps_per_s") -> list[float]:
    """Each seed's ratio (its sides ran back to back, under the same load)."""
    return [r[ours][key] / r[theirs][key] for r in results]


def print_seed_table(seed: int, order: list[str], rows: dict, decimals: int = 0) -> None:
    print(f"\nseed {seed} (ran {' then '.join(order)})")
    print(f"  {'impl':<16} {'env steps':>9} {'updates':>8} {'wall s':>8} {'steps/s':>9} {'updates/s':>9} "
          f"{'eval return':>16}")
    names = sorted(order, key=lambda n: (not n.startswith("pearl"), n))
    for name in names:
        r = rows[name]
        print(f"  {name:<16} {r['env_steps']:>9d} {r['updates']:>8d} {r['wall_s']:>8.2f} "
              f"{r['steps_per_s']:>9.{decimals}f} {r['updates_per_s']:>9.{decimals}f} "
              f"{r['eval_mean']:>8.1f} +- {r['eval_std']:<5.1f}")
    ours = rows["pearl"]
    ratios = ", ".join(f"vs {n} {ours['steps_per_s'] / rows[n]['steps_per_s']:.2f}x" for n in names if n != "pearl")
    tasks = ", ".join(f"{t} {us:.0f}" for t, us in (ours.get("task_us") or {}).items())
    print(f"  pearl speedup (steps/s): {ratios}")
    # runtime.adapt_threads: the updates run on each learner thread count
    counts = ", ".join(f"{n} thread(s) {u}" for n, u in (ours.get("learner_threads") or {}).items())
    print(f"  pearl learner kernel: {ours['learner_kernel']}; us per task call: {tasks}"
          + (f"; updates on {counts}" if counts else ""))
    sys.stdout.flush()


def greedy_returns(env_id: str, act, episodes: int, seed: int) -> list[float]:
    """The evaluation of every side: `episodes` greedy episodes from the initial states of
    seeds `seed + EVAL_SEED_OFFSET + i`, acting with `act(observation) -> env action`."""
    from pearl.envs import episode_returns

    return episode_returns(env_id, act, episodes, seed + EVAL_SEED_OFFSET)


def sb3_act(model):
    def act(obs):
        action, _ = model.predict(obs, deterministic=True)
        return action.item() if action.ndim == 0 else action
    return act


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


def eval_row(returns: list[float]) -> dict:
    return {"eval_mean": float(statistics.fmean(returns)), "eval_std": float(statistics.pstdev(returns)),
            "eval_returns": [float(r) for r in returns]}


def time_pearl(agent, steps: int, threads: int, episodes: int) -> dict:
    """Trains `agent` for `steps` (only train() is timed; the lazily built env is built before) and
    evaluates it greedily: the row print_seed_table and the summaries read."""
    import torch

    torch.set_num_threads(threads)
    _ = agent.actor
    started = time.perf_counter()
    summary = agent.train(steps, time_tasks=True)
    wall = time.perf_counter() - started
    returns = greedy_returns(agent.config.env, agent.act, episodes, agent.config.seed)
    return {
        "impl": "pearl", "seed": agent.config.seed, "env_steps": summary["env_steps"],
        "updates": summary["updates"], "wall_s": wall, "steps_per_s": summary["env_steps"] / wall,
        "updates_per_s": summary["updates"] / wall, **eval_row(returns),
        "train_mean_return_100": summary["mean_return_100"], "learner_kernel": summary["learner_kernel"],
        "task_us": summary.get("task_us"), "threads": threads, "learner_threads": summary.get("learner_threads"),
    }


def time_sb3(model, env_id: str, seed: int, steps: int, threads: int, episodes: int) -> dict:
    """Trains an SB3 `model` for `steps` (only learn() is timed) and evaluates it as time_pearl does."""
    import torch

    torch.set_num_threads(threads)
    started = time.perf_counter()
    model.learn(total_timesteps=steps, progress_bar=False)
    wall = time.perf_counter() - started
    returns = greedy_returns(env_id, sb3_act(model), episodes, seed)
    env_steps, updates = int(model.num_timesteps), int(model._n_updates)
    recent = [info["r"] for info in model.ep_info_buffer] if model.ep_info_buffer else []
    return {
        "impl": "sb3", "seed": seed, "env_steps": env_steps, "updates": updates,
        "wall_s": wall, "steps_per_s": env_steps / wall, "updates_per_s": updates / wall, **eval_row(returns),
        "train_mean_return_100": float(statistics.fmean(recent)) if recent else None, "threads": threads,
    }
