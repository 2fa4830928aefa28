"""End-to-end DDPG benchmark: PEARL vs Stable-Baselines3 on Pendulum-v1, identical setup, one process.

Both agents train with Stable-Baselines3's default DDPG setup:

    Pendulum-v1, 1 env, actor and critic MLPs 400x300 ReLU (tanh actor output), replay buffer 1M,
    batch 256, learning_starts 100 (uniformly random actions before), 1 gradient update per env
    step (SB3: train_freq=1, gradient_steps=1), tau 0.005, gamma 0.99, Adam lr 1e-3 for both
    networks, Gaussian action noise N(0, 0.1^2) on the [-1, 1]-scaled action, MSE critic loss.

For each seed the wall time of `train()` / `learn()` alone is measured (construction and
evaluation excluded), giving env steps/s and learner updates/s; then each trained agent is
evaluated greedily over the same 10 initial states. The order alternates per seed (PEARL first on
even seeds); the speed ratio is the median of the per-seed ratios.

At 400x300 and batch 256 an update is ~600 MFLOP of matrix products, so the learner's arithmetic
bounds both libraries. The script therefore also measures, in the same process and with the same
thread count: the matrix products one update of each library executes (captured from a real update
and replayed alone, back to back: the time the arithmetic takes on this machine's BLAS), and a
large-GEMM peak for reference. Reported: each library's env steps/s as a fraction of its own
arithmetic bound (1 / time of its products per update). Target (issue 6): PEARL >= 1.5x SB3's env
steps/s, or >= 95% of the arithmetic bound.

    python benchmarks/e2e_ddpg.py                  # 3 seeds x 5000 steps (~10 min on 2 cores)
    python benchmarks/e2e_ddpg.py --quick          # smoke test: 1 seed x 1500 steps
    python benchmarks/e2e_ddpg.py --threads 2 --json out.json
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from side_by_side import (add_common_arguments, check_common_arguments, print_seed_table,  # noqa: E402
                          run_alternating, sb3_greedy_returns, time_pearl, versions)  # (benchmarks/ is the script's own directory)

ENV_ID = "Pendulum-v1"
HIDDEN = [400, 300]
BUFFER = 1_000_000
BATCH = 256
LEARNING_STARTS = 100
TAU = 0.005
GAMMA = 0.99
LR = 1e-3
ACTION_NOISE = 0.1
EVAL_EPISODES = 10
TARGET_SPEEDUP = 1.5
TARGET_BOUND_FRACTION = 0.95


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_arguments(p, steps=5000, quick_steps=1500)
    args = p.parse_args(argv)
    check_common_arguments(p, args, LEARNING_STARTS, quick_steps=1500)
    return args


def make_pearl(seed: int, steps: int, threads: int, learner_kernel: str, device: str = "cpu"):
    import pearl

    return pearl.DDPG(
        env=ENV_ID, seed=seed, total_steps=steps, hidden=list(HIDDEN), lr=LR, gamma=GAMMA, tau=TAU,
        batch_size=BATCH, learning_starts=LEARNING_STARTS, updates_per_step=1.0, n_step=1,
        action_noise=ACTION_NOISE, replay="uniform", capacity=BUFFER, device=device,
        learner_kernel=learner_kernel, envs_per_actor=1, torch_threads=threads)


def make_sb3(seed: int, threads: int, device: str = "cpu"):
    import gymnasium as gym
    import numpy as np
    import torch
    from stable_baselines3 import DDPG
    from stable_baselines3.common.noise import NormalActionNoise

    torch.set_num_threads(threads)
    env = gym.make(ENV_ID)
    dim = env.action_space.shape[0]
    model = DDPG("MlpPolicy", env, learning_rate=LR, buffer_size=BUFFER, learning_starts=LEARNING_STARTS,
                 batch_size=BATCH, tau=TAU, gamma=GAMMA, train_freq=1, gradient_steps=1,
                 action_noise=NormalActionNoise(np.zeros(dim), ACTION_NOISE * np.ones(dim)),
                 policy_kwargs={"net_arch": list(HIDDEN)}, verbose=0, seed=seed, device=device)
    torch.set_num_threads(threads)
    return model


def run_pearl(seed: int, steps: int, threads: int, learner_kernel: str, device: str = "cpu") -> dict:
    agent = make_pearl(seed, steps, threads, learner_kernel, device)
    return time_pearl(agent, steps, threads, EVAL_EPISODES)


def run_sb3(seed: int, steps: int, threads: int, device: str = "cpu") -> dict:
    model = make_sb3(seed, threads, device)
    started = time.perf_counter()
    model.learn(total_timesteps=steps, progress_bar=False)
    wall = time.perf_counter() - started
    returns = sb3_greedy_returns(model, ENV_ID, seed, EVAL_EPISODES)
    env_steps, updates = int(model.num_timesteps), int(model._n_updates)
    recent = [info["r"] for info in model.ep_info_buffer] if model.ep_info_buffer else []
    return {
        "impl": "sb3", "seed": seed, "env_steps": env_steps, "updates": updates,
        "wall_s": wall, "steps_per_s": env_steps / wall, "updates_per_s": updates / wall,
        "eval_mean": float(statistics.fmean(returns)), "eval_std": float(statistics.pstdev(returns)),
        "eval_returns": [float(r) for r in returns],
        "train_mean_return_100": float(statistics.fmean(recent)) if recent else None,
    }


# -- the arithmetic bound ------------------------------------------------------------------------------
def capture_matmuls(update) -> list:
    """The matrix products (aten mm / addmm, forward and backward) that one call of `update` runs,
    with copies of their operands (same shapes and strides, so transposes are kept)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    # .out: the fused learner writes its products into preallocated buffers
    products = (torch.ops.aten.mm.default, torch.ops.aten.addmm.default,
                torch.ops.aten.mm.out, torch.ops.aten.addmm.out)

    class Capture(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.calls = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func in products:
                copies = [a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args]
                self.calls.append((func, copies, dict(kwargs)))
            return func(*args, **kwargs)

    with Capture() as capture:
        update()
    return capture.calls


def matmul_flops(calls) -> float:
    import torch

    total = 0.0
    for func, args, _ in calls:
        is_mm = func in (torch.ops.aten.mm.default, torch.ops.aten.mm.out)
        a, b = (args[0], args[1]) if is_mm else (args[1], args[2])
        total += 2.0 * a.shape[0] * a.shape[1] * b.shape[1]
    return total


def replay_seconds(*call_lists, repeats: int = 30) -> list[float]:
    """Median wall time of running each list of captured products alone, back to back. The lists
    take turns, so a load that comes and goes on the machine hits them alike."""
    def run(calls):
        for func, args, kwargs in calls:
            func(*args, **kwargs)
    samples = [[] for _ in call_lists]
    for _ in range(3):
        for calls in call_lists:
            run(calls)
    for _ in range(repeats):
        for calls, times in zip(call_lists, samples):
            started = time.perf_counter()
            run(calls)
            times.append(time.perf_counter() - started)
    return [statistics.median(times) for times in samples]


def gemm_peak(threads: int, n: int = 1024, repeats: int = 20) -> float:
    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(n, n), torch.randn(n, n)
    for _ in range(3):
        a @ b
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        a @ b
        samples.append(time.perf_counter() - started)
    return 2.0 * n ** 3 / statistics.median(samples)


def arithmetic_bound(threads: int, learner_kernel: str) -> dict:
    """FLOPs of one update of each library and how long its products take alone on this machine."""
    import torch

    from pearl.kernels.cpu import cpu_kernel_mode

    agent = make_pearl(0, 10_000, threads, learner_kernel)
    agent.train(LEARNING_STARTS + 300)  # a filled replay and warm optimizer state
    batch = agent.replay.sample(BATCH, agent.rng)
    torch.set_num_threads(threads)
    with cpu_kernel_mode():
        ours = capture_matmuls(lambda: agent.learner.update(batch))

    model = make_sb3(0, threads)
    model.learn(LEARNING_STARTS + 300)
    torch.set_num_threads(threads)
    theirs = capture_matmuls(lambda: model.train(gradient_steps=1, batch_size=BATCH))

    torch.set_num_threads(threads)
    with cpu_kernel_mode():
        ours_s, theirs_s = replay_seconds(ours, theirs)
    return {
        "pearl": {"matmuls": len(ours), "gflop_per_update": matmul_flops(ours) / 1e9, "matmul_s": ours_s,
                  "matmul_gflops": matmul_flops(ours) / ours_s / 1e9, "bound_updates_per_s": 1.0 / ours_s},
        "sb3": {"matmuls": len(theirs), "gflop_per_update": matmul_flops(theirs) / 1e9, "matmul_s": theirs_s,
                "matmul_gflops": matmul_flops(theirs) / theirs_s / 1e9, "bound_updates_per_s": 1.0 / theirs_s},
        "gemm_1024_gflops": gemm_peak(threads) / 1e9,
    }


# -- report ----------------------------------------------------------------------------------------------
def summarize(results: list[dict], bound: dict) -> dict:
    def median(impl, key):
        return float(statistics.median(r[impl][key] for r in results))

    ours_sps, sb3_sps = median("pearl", "steps_per_s"), median("sb3", "steps_per_s")
    ratios = [r["pearl"]["steps_per_s"] / r["sb3"]["steps_per_s"] for r in results]
    ratio = float(statistics.median(ratios))  # each seed's pair ran back to back, under the same load
    ours_ret, sb3_ret = median("pearl", "eval_mean"), median("sb3", "eval_mean")
    ours_fraction = median("pearl", "updates_per_s") / bound["pearl"]["bound_updates_per_s"]
    sb3_fraction = median("sb3", "updates_per_s") / bound["sb3"]["bound_updates_per_s"]
    speed_ok = ratio >= TARGET_SPEEDUP
    bound_ok = ours_fraction >= TARGET_BOUND_FRACTION
    return {
        "median_steps_per_s_pearl": ours_sps, "median_steps_per_s_sb3": sb3_sps, "ratio_steps_per_s": ratio,
        "ratios_per_seed": ratios,
        "median_final_return_pearl": ours_ret, "median_final_return_sb3": sb3_ret,
        "pearl_fraction_of_bound": ours_fraction, "sb3_fraction_of_bound": sb3_fraction,
        "speed_ok": speed_ok, "bound_ok": bound_ok, "passed": speed_ok or bound_ok,
    }


def print_bound(bound: dict, threads: int) -> None:
    print(f"\narithmetic bound ({threads} torch thread(s); a large 1024^3 GEMM runs at "
          f"{bound['gemm_1024_gflops']:.0f} GFLOP/s here)")
    for name in ("pearl", "sb3"):
        b = bound[name]
        print(f"  {name:<6} {b['matmuls']:>3} matrix products per update, {b['gflop_per_update'] * 1e3:6.1f} MFLOP, "
              f"alone {b['matmul_s'] * 1e3:6.2f} ms ({b['matmul_gflops']:.0f} GFLOP/s) -> bound "
              f"{b['bound_updates_per_s']:6.1f} updates/s")


def print_summary(s: dict, n_seeds: int, steps: int) -> None:
    print(f"\nsummary over {n_seeds} seed(s), {steps} env steps each (medians)")
    print(f"  env steps/s   pearl {s['median_steps_per_s_pearl']:9.1f}   sb3 {s['median_steps_per_s_sb3']:9.1f}"
          f"   ratio pearl/sb3 per seed " + ", ".join(f"{r:.2f}x" for r in s["ratios_per_seed"])
          + f", median {s['ratio_steps_per_s']:.2f}x")
    print(f"  of own arithmetic bound   pearl {100 * s['pearl_fraction_of_bound']:5.1f}%   "
          f"sb3 {100 * s['sb3_fraction_of_bound']:5.1f}%")
    print(f"  final return  pearl {s['median_final_return_pearl']:9.1f}   sb3 {s['median_final_return_sb3']:9.1f}"
          f"   (greedy, {EVAL_EPISODES} episodes)")
    verdict = "PASS" if s["passed"] else "FAIL"
    print(f"{verdict}: target pearl >= {TARGET_SPEEDUP:g}x sb3 env steps/s ({s['ratio_steps_per_s']:.2f}x: "
          f"{'ok' if s['speed_ok'] else 'no'}) or >= {100 * TARGET_BOUND_FRACTION:.0f}% of the arithmetic bound "
          f"({100 * s['pearl_fraction_of_bound']:.1f}%: {'ok' if s['bound_ok'] else 'no'})")


def main(argv=None) -> int:
    args = parse_args(argv)
    found = versions("e2e_ddpg")
    if found is None:
        return 2
    print(f"PEARL vs SB3 {found['sb3']} DDPG on {ENV_ID}: {args.steps} steps x seeds {args.seeds}, "
          f"torch {found['torch']} with {args.threads} thread(s), gymnasium {found['gymnasium']}")
    results = run_alternating(args.seeds, {
        "pearl": lambda seed: run_pearl(seed, args.steps, args.threads, args.learner_kernel, args.device),
        "sb3": lambda seed: run_sb3(seed, args.steps, args.threads, args.device)},
        lambda seed, order, rows: print_seed_table(seed, order, rows, decimals=1))

    bound = arithmetic_bound(args.threads, args.learner_kernel)
    print_bound(bound, args.threads)
    summary = summarize(results, bound)
    print_summary(summary, len(args.seeds), args.steps)

    if args.json:
        out = {
            "benchmark": "e2e_ddpg", "env": ENV_ID,
            "setup": {"steps": args.steps, "seeds": args.seeds, "threads": args.threads, "hidden": HIDDEN,
                      "buffer": BUFFER, "batch_size": BATCH, "learning_starts": LEARNING_STARTS,
                      "updates_per_step": 1.0, "tau": TAU, "gamma": GAMMA, "lr": LR,
                      "action_noise": ACTION_NOISE, "eval_episodes": EVAL_EPISODES,
                      "pearl_learner_kernel": args.learner_kernel},
            "versions": {"python": platform.python_version(), "torch": found["torch"],
                         "gymnasium": found["gymnasium"], "stable_baselines3": found["sb3"]},
            "machine": {"platform": platform.platform(), "processor": platform.processor()},
            "per_seed": results, "arithmetic_bound": bound, "summary": summary,
        }
        path = Path(args.json)
        if path.parent != Path(""):
            path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(out, indent=2) + "\n")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
