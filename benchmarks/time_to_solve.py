"""Time to solve: wall-clock training time until the greedy return first reaches the solved level,
PEARL vs Stable-Baselines3, both with the RL Zoo's DQN hyperparameters (rl-baselines3-zoo
hyperparams/dqn.yml), side by side in one run.

    CartPole-v1 (solved: mean greedy return >= 475): MLP 256x256, lr 2.3e-3, batch 64, buffer 100k,
        learning_starts 1000, gamma 0.99, target update every 10 env steps (hard), SB3 train_freq 256
        with 128 gradient steps, epsilon 1 -> 0.04 over the first 16% of 50k steps.
    Acrobot-v1 (solved: >= -100): MLP 256x256, lr 6.3e-4, batch 128, buffer 50k, learning_starts 0,
        gamma 0.99, target update every 250 env steps, SB3 train_freq 4 with gradient_steps -1 (4 per
        4 steps), epsilon 1 -> 0.1 over the first 12% of 100k steps.

PEARL takes the same schedule, expressed exactly: `train_freq` and `gradient_steps` (bursts of 128
updates at each multiple of 256 env steps past learning_starts on CartPole, 4 every 4 on
Acrobot) and the target copied on the same env-step crossings (every 10 env steps on CartPole,
which between bursts means once per burst, as in SB3's per-env-step callback). Every
`--eval-every` env steps (default 2000) training pauses and both sides are evaluated by the same function (benchmarks/side_by_side.py:
`greedy_returns`, the same initial states) over `--eval-episodes` greedy episodes; the clock
counts training only (construction and evaluations excluded). The time to solve is the training
time at the first evaluation whose mean reaches the level; a run that does not reach it within
`--max-steps` is reported unsolved. Each side of each seed runs in a fresh Python process, an
untimed warm-up run of that side first, so no side runs beside threads another side's library
left behind (e2e_atari.py found one costing ~0.7 of a core after SB3 at 2 torch threads). Target
(issue 19): PEARL's time <= 1/5 of SB3's (SB3 at its best torch thread count, 1 or 2).

    python benchmarks/time_to_solve.py                      # CartPole, 3 seeds
    python benchmarks/time_to_solve.py --env Acrobot-v1
    python benchmarks/time_to_solve.py --runtime processes  # PEARL's actor processes
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from side_by_side import (greedy_returns, load_average, machine_header, machine_info, run_fresh,  # noqa: E402
                          run_worker, sb3_act, sb3_name, versions, write_json)  # (benchmarks/ is the script's own directory)

ZOO = {  # rl-baselines3-zoo hyperparams/dqn.yml
    "CartPole-v1": dict(solved=475.0, n_timesteps=50_000, lr=2.3e-3, batch=64, buffer=100_000, learning_starts=1000,
                        gamma=0.99, target_update=10, train_freq=256, gradient_steps=128,
                        exploration_fraction=0.16, exploration_final_eps=0.04, hidden=[256, 256]),
    "Acrobot-v1": dict(solved=-100.0, n_timesteps=100_000, lr=6.3e-4, batch=128, buffer=50_000, learning_starts=0,
                       gamma=0.99, target_update=250, train_freq=4, gradient_steps=4,  # -1: as many as env steps
                       exploration_fraction=0.12, exploration_final_eps=0.1, hidden=[256, 256]),
}
TARGET_RATIO = 5.0


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--env", choices=list(ZOO), default="CartPole-v1")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--max-steps", type=int, help="env steps before a run counts as unsolved (default: 2x the zoo's "
                                                "n_timesteps)")
    p.add_argument("--eval-every", type=int, default=2000, help="env steps between evaluations (default: 2000)")
    p.add_argument("--eval-episodes", type=int, default=10, help="greedy episodes per evaluation (default: 10)")
    p.add_argument("--runtime", choices=["sequential", "threaded", "processes"], default="sequential",
                   help="PEARL's runtime (default: sequential)")
    p.add_argument("--threads", type=int, default=1, help="PEARL's learner threads (default: 1)")
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                   help="PEARL's learner product precision (runtime.learner_precision; default: fp32)")
    p.add_argument("--sb3-threads", type=int, nargs="+", default=[1, 2],
                   help="SB3's torch thread counts; its best median time is the rival (default: 1 2)")
    p.add_argument("--warmup-steps", type=int, default=2000, help="untimed warm-up run of each side (default: 2000)")
    p.add_argument("--json", metavar="PATH")
    p.add_argument("--worker", metavar="SIDE", help=argparse.SUPPRESS)  # one side of one seed, in this process
    args = p.parse_args(argv)
    zoo = ZOO[args.env]
    args.max_steps = args.max_steps or 2 * zoo["n_timesteps"]
    if args.max_steps < args.eval_every or args.eval_every < 1 or args.eval_episodes < 1:
        p.error(f"--max-steps / --eval-every / --eval-episodes: expected max-steps >= eval-every >= 1 and "
                f"eval-episodes >= 1, got {args.max_steps} / {args.eval_every} / {args.eval_episodes}")
    if args.threads < 1 or min(args.sb3_threads) < 1:
        p.error(f"--threads / --sb3-threads: expected >= 1, got {args.threads} / {args.sb3_threads}")
    return args


class Stopwatch:
    """Training time: the wall clock minus the evaluations'."""

    def __init__(self):
        self.started, self.paused = time.perf_counter(), 0.0

    def elapsed(self) -> float:
        return time.perf_counter() - self.started - self.paused


def evaluate_into(row: dict, watch: Stopwatch, steps: int, evaluate, solved: float) -> bool:
    """One evaluation at `steps` env steps (its time excluded); records the first solve. True if solved."""
    t0 = time.perf_counter()
    train_s = watch.elapsed()
    mean = float(statistics.fmean(evaluate()))
    row["curve"].append((steps, round(train_s, 3), mean))
    watch.paused += time.perf_counter() - t0
    if mean >= solved and row["solved_s"] is None:
        row["solved_s"], row["solved_steps"] = train_s, steps
    return mean >= solved


def run_pearl(env_id: str, seed: int, args, max_steps: int) -> dict:
    import torch

    import pearl
    from pearl.plan import Plan

    zoo = ZOO[env_id]
    agent = pearl.DQN(
        env=env_id, seed=seed, total_steps=zoo["n_timesteps"], hidden=list(zoo["hidden"]), lr=zoo["lr"],
        # (PEARL samples only once a batch is stored; SB3 with learning_starts 0 samples with repeats)
        gamma=zoo["gamma"], batch_size=zoo["batch"], learning_starts=max(zoo["learning_starts"], zoo["batch"]),
        train_freq=zoo["train_freq"], gradient_steps=zoo["gradient_steps"], target_update_interval=zoo["target_update"],
        tau=1.0, double=False, dueling=False, n_step=1, max_grad_norm=10.0,
        exploration={"initial": 1.0, "final": zoo["exploration_final_eps"], "fraction": zoo["exploration_fraction"]},
        replay="uniform", capacity=zoo["buffer"], envs_per_actor=1, torch_threads=args.threads,
        plan=Plan(batch_size=zoo["batch"], runtime=args.runtime, actors=1, learner_precision=args.precision))
    torch.set_num_threads(args.threads)
    _ = agent.actor
    row = {"impl": "pearl", "seed": seed, "solved_s": None, "solved_steps": None, "curve": []}
    next_eval = [args.eval_every]
    watch = Stopwatch()

    def on_round(agent):
        if agent.env_steps >= next_eval[0]:
            next_eval[0] += args.eval_every
            if evaluate_into(row, watch, agent.env_steps, lambda: greedy_returns(env_id, agent.act, args.eval_episodes,
                                                                                  seed), zoo["solved"]):
                agent.stop_requested = True

    with warnings_quiet():
        agent.train(max_steps, on_round=on_round)
    row["train_s"], row["env_steps"] = watch.elapsed(), agent.env_steps
    return row


def run_sb3(env_id: str, seed: int, args, threads: int, max_steps: int) -> dict:
    import gymnasium as gym
    import torch
    from stable_baselines3 import DQN
    from stable_baselines3.common.callbacks import BaseCallback

    zoo = ZOO[env_id]
    torch.set_num_threads(threads)
    model = DQN("MlpPolicy", gym.make(env_id), learning_rate=zoo["lr"], batch_size=zoo["batch"],
                buffer_size=zoo["buffer"], learning_starts=zoo["learning_starts"], gamma=zoo["gamma"],
                target_update_interval=zoo["target_update"], train_freq=zoo["train_freq"],
                gradient_steps=zoo["gradient_steps"],
                # learn() below sizes the schedule by max_steps: the same decay in env steps as the zoo's
                exploration_fraction=zoo["exploration_fraction"] * zoo["n_timesteps"] / max_steps,
                exploration_final_eps=zoo["exploration_final_eps"],
                policy_kwargs={"net_arch": list(zoo["hidden"])}, verbose=0, seed=seed)
    row = {"impl": "sb3", "seed": seed, "threads": threads, "solved_s": None, "solved_steps": None, "curve": []}

    class Evaluate(BaseCallback):
        def _on_step(self) -> bool:
            if self.num_timesteps % args.eval_every:
                return True
            return not evaluate_into(row, watch, self.num_timesteps,
                                     lambda: greedy_returns(env_id, sb3_act(self.model), args.eval_episodes, seed),
                                     zoo["solved"])

    torch.set_num_threads(threads)
    watch = Stopwatch()
    model.learn(total_timesteps=max_steps, callback=Evaluate(), progress_bar=False)
    row["train_s"], row["env_steps"] = watch.elapsed(), int(model.num_timesteps)
    return row


class warnings_quiet:
    """PEARL warns when training past config.total_steps (the zoo's n_timesteps); expected here."""

    def __enter__(self):
        import warnings

        self._catch = warnings.catch_warnings()
        self._catch.__enter__()
        warnings.simplefilter("ignore", UserWarning)

    def __exit__(self, *exc):
        return self._catch.__exit__(*exc)


def solved_time(row: dict) -> float:
    return row["solved_s"] if row["solved_s"] is not None else float("inf")


def sides(args) -> dict:
    """{side name: run(seed, max_steps)}: PEARL and SB3 at each of its thread counts."""
    out = {"pearl": lambda seed, steps: run_pearl(args.env, seed, args, steps)}
    for threads in args.sb3_threads:
        out[sb3_name(threads)] = lambda seed, steps, t=threads: run_sb3(args.env, seed, args, t, steps)
    return out


def worker(args) -> int:
    """Side `args.worker` of seed `args.seeds[0]` after its untimed warm-up run, its row printed."""
    return run_worker(sides(args)[args.worker], args, args.max_steps)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if args.worker:
        return worker(args)
    found = versions("time_to_solve")
    if found is None:
        return 2
    machine = machine_info()
    print(machine_header())
    zoo = ZOO[args.env]
    print(f"time to solve {args.env} (greedy mean of {args.eval_episodes} episodes >= {zoo['solved']:g}, evaluated "
          f"every {args.eval_every} steps, at most {args.max_steps} steps): both with train_freq "
          f"{zoo['train_freq']}, gradient_steps {zoo['gradient_steps']}, target copy every {zoo['target_update']} "
          f"env steps: PEARL ({args.runtime}, {args.threads} learner thread(s)) vs SB3 {found['sb3']} (torch threads "
          f"{args.sb3_threads}), seeds {args.seeds}; each side of each seed in a fresh process after its own "
          f"untimed warm-up of {args.warmup_steps} steps")
    names, results = list(sides(args)), []
    for k, seed in enumerate(args.seeds):
        order = names[k % len(names):] + names[:k % len(names)]
        rows = {name: run_fresh(__file__, name, seed, argv) for name in order}
        results.append(rows)
        print(f"\nseed {seed} (ran {' then '.join(order)})")
        for name in names:
            r = rows[name]
            solved = (f"solved at {r['solved_steps']:>6d} steps after {r['solved_s']:7.2f} s of training"
                      if r["solved_s"] is not None else f"not solved in {r['env_steps']} steps ({r['train_s']:.1f} s)")
            last = r["curve"][-1][2] if r["curve"] else float("nan")
            print(f"  {name:<8} {solved}   (last eval {last:.1f})", flush=True)

    best = min((n for n in names if n != "pearl"),
               key=lambda n: statistics.median(solved_time(r[n]) for r in results))
    ratios = [solved_time(r[best]) / solved_time(r["pearl"]) for r in results]
    ours = statistics.median(solved_time(r["pearl"]) for r in results)
    theirs = statistics.median(solved_time(r[best]) for r in results)
    print(f"\nsummary over {len(args.seeds)} seed(s); rival {best} (SB3's best thread count here)")
    print(f"  median time to solve   pearl {ours:8.2f} s   {best} {theirs:8.2f} s")
    print(f"  {best}/pearl time per seed " + ", ".join(f"{x:.2f}x" for x in ratios)
          + f"; of the medians {theirs / ours:.2f}x")
    ok = theirs / ours >= TARGET_RATIO
    print(f"{'PASS' if ok else 'FAIL'}: target PEARL's time <= 1/{TARGET_RATIO:g} of SB3's ({theirs / ours:.2f}x)")
    machine["load_average_end"] = load_average()
    print(f"load average at the end: {machine['load_average_end']}")
    if args.json:
        out = {"benchmark": "time_to_solve", "env": args.env, "zoo": zoo, "args": vars(args), "machine": machine,
               "versions": found, "per_seed": results,
               "summary": {"rival": best, "median_s": {"pearl": ours, best: theirs}, "ratios_per_seed": ratios}}
        write_json(args.json, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
