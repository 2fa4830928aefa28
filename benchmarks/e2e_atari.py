"""End-to-end DQN on Atari: PEARL vs Stable-Baselines3, env steps/s side by side in one run (issue 16).

Both train DQN with RL Baselines3 Zoo's Atari hyperparameters (hyperparams/dqn.yml, `atari`): the
Nature CNN, replay buffer 100k, batch 32, lr 1e-4, one gradient step every 4 env steps, target
update every 1000 steps, exploration_fraction 0.1 to final epsilon 0.01, gamma 0.99, Huber loss,
max gradient norm 10, no double DQN; one env. The Zoo's learning_starts (100k) is lowered equally
for both (--learning-starts, default 1/4 of --steps) so that learning is inside the timed window.

Preprocessing, the same standard steps on both sides on BreakoutNoFrameskip-v4 (no sticky actions):
PEARL's `atari_env` (gymnasium's AtariPreprocessing + reward clipping + FrameStackObservation) and
SB3's `make_atari_env` (its AtariWrapper) + VecFrameStack(4): up to 30 no-ops at reset, frame skip 4
with max-pool, 84x84 grey, rewards clipped, 4 frames stacked, no episode end at a life lost (SB3's
terminal_on_life_loss set False to match; SB3 also presses FIRE at reset, which PEARL does not).

Only `train()` / `learn()` is timed (construction excluded); no greedy evaluation (a greedy Breakout
policy that never presses FIRE plays until the 108k-frame cap). The order rotates per seed, and
each side of each seed runs in a fresh Python process (imports and construction outside the
clock, as before): run in one process, the first PEARL run after an SB3 run with 2 torch threads
paid ~0.7 of a core to a thread SB3's run left behind (docs/BENCHMARKS.md, Atari, session 15).
Replay: PEARL's frame table by default (`--frame-stack 4`, as configs/breakout_dqn.yaml: each frame
stored once, obs and next obs assembled at sample time; 0: whole stacked observations), SB3's
ReplayBuffer with whole observations (optimize_memory_usage=False, its default); same capacity,
batch and uniform sampling. PEARL runs once per `--runtimes` entry (sequential; processes with `--actors` actor processes) at
`--precision` (bf16: the learner's CNN in bfloat16, runtime.learner_precision); SB3 once per
`--sb3-threads` count, its best (highest median env steps/s) the rival the ratios are against.
Target (issue 16): PEARL >= 2x SB3's env steps/s, 2 seeds x >= 50k steps.

    python benchmarks/e2e_atari.py                          # 2 seeds x 50k steps
    python benchmarks/e2e_atari.py --steps 8000 --seeds 0 1 # a shorter window
    python benchmarks/e2e_atari.py --runtimes sequential processes --precision bf16 --sb3-threads 1 2
    python benchmarks/e2e_atari.py --runtimes processes --precision bf16 --threads 2 --omp-wait-policy passive

`--omp-wait-policy` sets OMP_WAIT_POLICY for the whole process (SB3 too) before torch loads: `pearl
train` runs passive, and a PEARL learner on 2 torch threads without it spins on the actor's core.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from side_by_side import (best_rival, median_of, print_result, ratios_per_seed, run_alternating, run_fresh,  # noqa: E402
                          sb3_name, versions)

ENV_ID = "BreakoutNoFrameskip-v4"
BUFFER, BATCH, LR, GAMMA = 100_000, 32, 1e-4, 0.99
TRAIN_FREQ, TARGET_UPDATE = 4, 1000
EPS_FRACTION, EPS_FINAL = 0.1, 0.01
MAX_GRAD_NORM = 10.0
TARGET_SPEEDUP = 2.0


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--steps", type=int, default=50_000)
    p.add_argument("--learning-starts", type=int, default=None, help="both (default: steps // 4)")
    p.add_argument("--threads", type=int, default=1, help="PEARL's torch threads (default: 1)")
    p.add_argument("--sb3-threads", type=int, nargs="+", default=[1],
                   help="SB3's torch thread counts to run; its best is the rival (default: 1)")
    p.add_argument("--runtimes", nargs="+", choices=["sequential", "processes"], default=["sequential"])
    p.add_argument("--actors", type=int, default=1, help="actor processes of the processes runtime")
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32", help="PEARL's learner precision")
    p.add_argument("--actor-priority", choices=["auto", "normal", "low"], default="auto",
                   help="PEARL's runtime.actor_priority (default auto: low with --threads 2 and 1 actor on 2 cores)")
    p.add_argument("--frame-stack", type=int, default=4, help="PEARL's replay.frame_stack (default 4, as "
                   "configs/breakout_dqn.yaml: each frame stored once; 0: whole stacked observations, as SB3)")
    p.add_argument("--omp-wait-policy", choices=["passive", "active"], default=None,
                   help="OMP_WAIT_POLICY for this process, both sides (default: the environment's, else the "
                   "libraries' default); `pearl train` runs passive: with --threads 2 spinning threads cost "
                   "the actor its core")
    p.add_argument("--json", metavar="PATH")
    p.add_argument("--worker", metavar="SIDE", help=argparse.SUPPRESS)  # one side of one seed, in this process
    args = p.parse_args(argv)
    args.learning_starts = args.steps // 4 if args.learning_starts is None else args.learning_starts
    if not 0 <= args.learning_starts < args.steps:
        p.error(f"--learning-starts: expected 0 .. steps - 1, got {args.learning_starts}")
    return args


def run_pearl(seed: int, args, runtime: str) -> dict:
    import pearl
    from pearl.config import ExperimentConfig, apply_overrides
    from pearl.plan import Plan

    config = apply_overrides(ExperimentConfig(algo="dqn", env=ENV_ID), {"replay.frame_stack": args.frame_stack})
    agent = pearl.DQN(
        env=ENV_ID, config=config, seed=seed, total_steps=args.steps, conv=[[32, 8, 4], [64, 4, 2], [64, 3, 1]], hidden=[512],
        lr=LR, gamma=GAMMA, batch_size=BATCH, learning_starts=args.learning_starts,
        updates_per_step=1.0 / TRAIN_FREQ, target_update_interval=TARGET_UPDATE, tau=1.0, double=False,
        n_step=1, max_grad_norm=MAX_GRAD_NORM, exploration={"initial": 1.0, "final": EPS_FINAL, "fraction": EPS_FRACTION},
        replay="uniform", capacity=BUFFER, torch_threads=args.threads, learner_precision=args.precision,
        actor_priority=args.actor_priority,
        plan=Plan(batch_size=BATCH, runtime=runtime, actors=args.actors if runtime == "processes" else 1))
    _ = agent.actor  # the env is built before the clock starts
    started, cpu = time.perf_counter(), cpu_seconds()
    summary = agent.train(args.steps, time_tasks=True)  # the processes runtime joins its actors at the end
    wall, cpu = time.perf_counter() - started, cpu_seconds() - cpu
    return {"impl": "pearl", "seed": seed, "env_steps": summary["env_steps"], "updates": summary["updates"],
            "wall_s": wall, "cpu_s": cpu, "steps_per_s": summary["env_steps"] / wall, "updates_per_s": summary["updates"] / wall,
            "train_mean_return_100": summary["mean_return_100"], "task_us": summary.get("task_us")}


def run_sb3(seed: int, args, threads: int) -> dict:
    import ale_py
    import gymnasium
    import torch
    from stable_baselines3 import DQN
    from stable_baselines3.common.env_util import make_atari_env
    from stable_baselines3.common.vec_env import VecFrameStack

    gymnasium.register_envs(ale_py)  # the Atari ids (as the RL Zoo does)
    torch.set_num_threads(threads)
    env = VecFrameStack(make_atari_env(ENV_ID, n_envs=1, seed=seed, wrapper_kwargs={"terminal_on_life_loss": False}),
                        n_stack=4)
    model = DQN("CnnPolicy", env, learning_rate=LR, buffer_size=BUFFER, learning_starts=args.learning_starts,
                batch_size=BATCH, tau=1.0, gamma=GAMMA, train_freq=TRAIN_FREQ, gradient_steps=1,
                target_update_interval=TARGET_UPDATE, exploration_fraction=EPS_FRACTION,
                exploration_final_eps=EPS_FINAL, max_grad_norm=MAX_GRAD_NORM, optimize_memory_usage=False,
                verbose=0, seed=seed, device="cpu")
    torch.set_num_threads(threads)
    started, cpu = time.perf_counter(), cpu_seconds()
    model.learn(total_timesteps=args.steps, progress_bar=False)
    wall, cpu = time.perf_counter() - started, cpu_seconds() - cpu
    recent = [info["r"] for info in model.ep_info_buffer] if model.ep_info_buffer else []
    env.close()
    return {"impl": "sb3", "seed": seed, "env_steps": int(model.num_timesteps), "updates": int(model._n_updates),
            "wall_s": wall, "cpu_s": cpu, "steps_per_s": model.num_timesteps / wall, "updates_per_s": model._n_updates / wall,
            "train_mean_return_100": float(statistics.fmean(recent)) if recent else None}


def cpu_seconds() -> float:
    """CPU time of this process (every thread) and of its reaped children (actor processes): on a
    shared machine, CPU per env step is the figure load does not scale."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def report(seed: int, order: list[str], rows: dict) -> None:
    print(f"\nseed {seed} (ran {' then '.join(order)}; load {os.getloadavg()[0]:.2f})")
    for name in order:
        r = rows[name]
        print(f"  {name:<16} {r['env_steps']:>7d} steps {r['updates']:>6d} updates {r['wall_s']:>8.1f} s "
              f"{r['steps_per_s']:>7.1f} steps/s {r['updates_per_s']:>6.2f} updates/s "
              f"CPU {r['cpu_s'] / r['env_steps'] * 1e3:6.2f} ms/step "
              f"train return {r['train_mean_return_100']}" + (f"\n    us per task call: {r['task_us']}"
                                                               if r.get("task_us") else ""))
    sys.stdout.flush()


def sides(args) -> dict:
    """Each side's name -> `seed -> row`, run in this process."""
    runners = {f"pearl-{runtime}": (lambda seed, runtime=runtime: run_pearl(seed, args, runtime))
               for runtime in args.runtimes}
    runners.update({sb3_name(threads): (lambda seed, threads=threads: run_sb3(seed, args, threads))
                    for threads in args.sb3_threads})
    return runners


def worker(args) -> int:
    """Runs side `args.worker` of seed `args.seeds[0]` and prints its row."""
    print_result(sides(args)[args.worker](args.seeds[0]))
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if args.omp_wait_policy:  # before torch loads (versions() imports it)
        os.environ["OMP_WAIT_POLICY"] = args.omp_wait_policy.upper()
    if args.worker:
        return worker(args)
    found = versions("e2e_atari")
    if found is None:
        return 2
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor())
    print(f"PEARL vs SB3 {found['sb3']} DQN on {ENV_ID}: {args.steps} steps x seeds {args.seeds}, learning_starts "
          f"{args.learning_starts}, torch {found['torch']}; PEARL {args.threads} thread(s), precision "
          f"{args.precision}, OMP_WAIT_POLICY {os.environ.get('OMP_WAIT_POLICY', 'unset')}, frame_stack {args.frame_stack}, actor_priority {args.actor_priority}, runtimes {args.runtimes} ({args.actors} actor process(es) for processes); SB3 "
          f"threads {args.sb3_threads}; CPU {cpu}, {os.cpu_count()} cores; load {os.getloadavg()}", flush=True)
    runners = {name: (lambda seed, name=name: run_fresh(__file__, name, seed, argv)) for name in sides(args)}
    results = run_alternating(args.seeds, runners, report)
    rival = best_rival(results)
    print(f"\nSB3's best: {rival} ({median_of(results, rival, 'steps_per_s'):.1f} steps/s median)")
    for runtime in args.runtimes:
        ratios = ratios_per_seed(results, f"pearl-{runtime}", rival)
        median = statistics.median(ratios)
        cpu = [r[rival]["cpu_s"] / r[rival]["env_steps"] / (r[f"pearl-{runtime}"]["cpu_s"] / r[f"pearl-{runtime}"]["env_steps"])
               for r in results]
        print(f"pearl-{runtime} / {rival} env steps/s per seed: {', '.join(f'{x:.2f}x' for x in ratios)}; median "
              f"{median:.2f}x ({'meets' if median >= TARGET_SPEEDUP else 'below'} the {TARGET_SPEEDUP:g}x target); "
              f"{rival}'s CPU per env step / pearl-{runtime}'s: {', '.join(f'{x:.2f}x' for x in cpu)}")
    print(f"load {os.getloadavg()}")
    if args.json:
        Path(args.json).write_text(json.dumps({"benchmark": "e2e_atari", "env": ENV_ID, "args": vars(args),
                                               "per_seed": results, "rival": rival}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
