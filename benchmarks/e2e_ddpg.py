"""End-to-end DDPG / TD3 / SAC benchmark: PEARL vs Stable-Baselines3 on Pendulum-v1, identical setup,
one process.

Both agents train with Stable-Baselines3's default setup of the algorithm (`--algo`, default ddpg):

    Pendulum-v1, 1 env, replay buffer 1M, batch 256, learning_starts 100 (uniformly random actions
    before), 1 gradient update per env step (SB3: train_freq=1, gradient_steps=1), tau 0.005,
    gamma 0.99, one Adam lr for every network, MSE critic loss;
    ddpg: actor and critic MLPs 400x300 ReLU (tanh actor output), lr 1e-3, Gaussian action noise
          N(0, 0.1^2) on the [-1, 1]-scaled action;
    td3:  ddpg's, twin critics, policy delay 2, target policy noise 0.2 clipped at 0.5;
    sac:  actor and twin critics 256x256, lr 3e-4, entropy coefficient learned from 1.0 towards
          the target entropy -(action dimensions), no action noise (the policy samples).

SB3's DDPG and TD3 add no action noise unless given one; both sides here get the same 0.1.
PEARL's learner is its fused one for all three (`--learner-kernel auto`; SAC's since session 8).
`--precision bf16`: PEARL's fused learner multiplies in bfloat16 (runtime.learner_precision;
float32 master weights, Adam and losses); SB3 stays float32, as it ships.

Fairness (benchmarks/side_by_side.py): one untimed warm-up run of every side first; then for each
seed the wall time of `train()` / `learn()` alone (construction and evaluation excluded), the sides
back to back in an order rotating per seed; SB3 at 1 and 2 torch threads, its best median the
rival; every trained agent evaluated by the same function on the same 20 greedy initial states.
The speed ratio is the median of the per-seed ratios against that rival.

At 400x300 and batch 256 an update is ~600 MFLOP of matrix products, so the learner's arithmetic
bounds both libraries. The script therefore also measures, in the same process and with the same
thread count: the matrix products one update of each library executes (captured from a real update
and replayed alone, back to back: the time the arithmetic takes on this machine's BLAS), and a
large-GEMM peak for reference (TD3's averaged over a policy-delay cycle of 2 updates, one with the
actor's step). Reported: each library's env steps/s as a fraction of its own arithmetic bound (1 /
time of its products per update), and the ceiling: the ratio PEARL would show if every update took
only its products' time (an upper bound: the learner's own insert, sample and weight sync are not
counted; below 2x, no learner multiplying in that precision meets issue 19's row on this CPU).
Target (issue 6): PEARL >= 1.5x SB3's env steps/s, or >= 95% of the arithmetic bound; (issue 19)
>= 2x SB3 at SB3's best thread count, using the second core (PEARL's `--threads 2`: its fused
learner's products on two threads).

    python benchmarks/e2e_ddpg.py                  # 3 seeds x 5000 steps (~10 min on 2 cores)
    python benchmarks/e2e_ddpg.py --quick          # smoke test: 1 seed x 1500 steps
    python benchmarks/e2e_ddpg.py --threads 2 --json out.json   # PEARL's learner on 2 threads
    # issue 19's row at the RL Zoo's Pendulum budget, where both sides have learned on every seed
    # (at 5000 steps a seed of either library often has not: its returns are a coin toss)
    python benchmarks/e2e_ddpg.py --precision bf16 --runtime processes --threads 2 --seeds 0 1 --steps 20000
"""
from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from side_by_side import (add_common_arguments, best_rival, check_common_arguments,  # noqa: E402
                          load_average, machine_header, machine_info, median_of, print_seed_table,
                          ratios_per_seed, run_alternating, sb3_name, time_pearl, time_sb3, versions,
                          warm_up, write_json, WARMUP_SEED)  # (benchmarks/ is the script's own directory)

ENV_ID = "Pendulum-v1"
HIDDEN = [400, 300]
BUFFER = 1_000_000
BATCH = 256
LEARNING_STARTS = 100
TAU = 0.005
GAMMA = 0.99
LR = 1e-3
ACTION_NOISE = 0.1
# what SB3's defaults change per algorithm (the keys are both libraries' option names)
ALGOS = {"ddpg": {"hidden": HIDDEN, "lr": LR},
         "td3": {"hidden": HIDDEN, "lr": LR, "policy_delay": 2, "target_policy_noise": 0.2, "target_noise_clip": 0.5},
         "sac": {"hidden": [256, 256], "lr": 3e-4}}
TARGET_SPEEDUP = 1.5  # issue 6 (or the bound fraction below); issue 19 asks 2x with both cores
TARGET_BOUND_FRACTION = 0.95


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--algo", choices=sorted(ALGOS), default="ddpg", help="the algorithm (default: ddpg)")
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                   help="PEARL's learner products (runtime.learner_precision; default: fp32)")
    p.add_argument("--runtime", choices=["sequential", "processes"], default="sequential",
                   help="PEARL's runtime: the sequential loop, or an actor process beside the learner "
                        "(default: sequential)")
    add_common_arguments(p, steps=5000, quick_steps=1500, warmup_steps=400)
    args = p.parse_args(argv)
    check_common_arguments(p, args, LEARNING_STARTS, quick_steps=1500)
    if args.precision != "fp32" and args.learner_kernel == "torch":
        p.error(f"--precision {args.precision}: runs in PEARL's fused learner (--learner-kernel auto or fused)")
    return args


def make_pearl(seed: int, steps: int, threads: int, learner_kernel: str, device: str = "cpu", algo: str = "ddpg",
               precision: str = "fp32", runtime: str = "sequential", **overrides):
    """PEARL's agent in SB3's setup of `algo`; `overrides` replace its options (e.g. hidden)."""
    import numpy as np

    import pearl
    from pearl.plan import Plan
    from pearl.sb3 import NormalActionNoise

    # SB3's name takes SB3's noise object (pearl/sb3.py); Pendulum's action has one component
    noise = {} if algo == "sac" else {"action_noise": NormalActionNoise(np.zeros(1), ACTION_NOISE * np.ones(1))}
    return getattr(pearl, algo.upper())(
        env=ENV_ID, seed=seed, total_steps=steps, gamma=GAMMA, tau=TAU,
        learning_starts=LEARNING_STARTS, updates_per_step=1.0, n_step=1, replay="uniform", capacity=BUFFER,
        device=device, learner_kernel=learner_kernel, learner_precision=precision, envs_per_actor=1,
        torch_threads=threads, plan=Plan(runtime=runtime), **noise,
        **{"batch_size": BATCH, **ALGOS[algo], **overrides})


def make_sb3(seed: int, threads: int, device: str = "cpu", algo: str = "ddpg"):
    import gymnasium as gym
    import numpy as np
    import stable_baselines3
    import torch
    from stable_baselines3.common.noise import NormalActionNoise

    torch.set_num_threads(threads)
    env = gym.make(ENV_ID)
    dim = env.action_space.shape[0]
    options = dict(ALGOS[algo])
    hidden, lr = options.pop("hidden"), options.pop("lr")
    if algo != "sac":
        options["action_noise"] = NormalActionNoise(np.zeros(dim), ACTION_NOISE * np.ones(dim))
    model = getattr(stable_baselines3, algo.upper())(
        "MlpPolicy", env, learning_rate=lr, buffer_size=BUFFER, learning_starts=LEARNING_STARTS, batch_size=BATCH,
        tau=TAU, gamma=GAMMA, train_freq=1, gradient_steps=1, policy_kwargs={"net_arch": list(hidden)},
        verbose=0, seed=seed, device=device, **options)
    torch.set_num_threads(threads)
    return model


def run_pearl(seed: int, steps: int, threads: int, learner_kernel: str, device: str = "cpu",
              episodes: int = 20, algo: str = "ddpg", precision: str = "fp32", runtime: str = "sequential") -> dict:
    agent = make_pearl(seed, steps, threads, learner_kernel, device, algo, precision, runtime)
    return {**time_pearl(agent, steps, threads, episodes), "precision": precision, "runtime": runtime}


def run_sb3(seed: int, steps: int, threads: int, device: str = "cpu", episodes: int = 20,
            algo: str = "ddpg") -> dict:
    return time_sb3(make_sb3(seed, threads, device, algo), ENV_ID, seed, steps, threads, episodes)


# -- the arithmetic bound ------------------------------------------------------------------------------
def capture_matmuls(update) -> list:
    """The matrix products (aten mm / addmm, and bmm / baddbmm: the fused learner's twin critics,
    forward and backward) that one call of `update` runs, with copies of their operands (same
    shapes and strides, so transposes are kept)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    # .out: the fused learner writes its products into preallocated buffers
    products = tuple(getattr(getattr(torch.ops.aten, op), overload) for op in ("mm", "addmm", "bmm", "baddbmm")
                     for overload in ("default", "out"))

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
    plain = (torch.ops.aten.mm.default, torch.ops.aten.mm.out, torch.ops.aten.bmm.default, torch.ops.aten.bmm.out)
    for func, args, _ in calls:
        a, b = (args[0], args[1]) if func in plain else (args[1], args[2])  # (add)(b)mm: the bias first
        total += 2.0 * a.shape[:-2].numel() * a.shape[-2] * a.shape[-1] * b.shape[-1]
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


def arithmetic_bound(threads: int, learner_kernel: str, algo: str = "ddpg", precision: str = "fp32") -> dict:
    """FLOPs of one update of each library and how long its products take alone on this machine
    (PEARL's in its own precision: a bf16 learner's products replay in bf16). Averaged over one
    cycle of the policy delay (TD3: 2 updates, the second with the actor's step), as a run is."""
    import torch

    from pearl.kernels.cpu import cpu_kernel_mode

    cycle = ALGOS[algo].get("policy_delay", 1)
    agent = make_pearl(0, 10_000, threads, learner_kernel, algo=algo, precision=precision)
    agent.train(LEARNING_STARTS + 300)  # a filled replay and warm optimizer state
    batch = agent.replay.sample(BATCH, agent.rng)
    torch.set_num_threads(threads)
    with cpu_kernel_mode():
        ours = capture_matmuls(lambda: [agent.learner.update(batch) for _ in range(cycle)])

    model = make_sb3(0, threads, algo=algo)
    model.learn(LEARNING_STARTS + 300)
    torch.set_num_threads(threads)
    theirs = capture_matmuls(lambda: [model.train(gradient_steps=1, batch_size=BATCH) for _ in range(cycle)])

    torch.set_num_threads(threads)
    with cpu_kernel_mode():
        ours_s, theirs_s = (seconds / cycle for seconds in replay_seconds(ours, theirs))

    def per_update(calls, seconds):
        flops = matmul_flops(calls) / cycle
        return {"matmuls": len(calls) / cycle, "gflop_per_update": flops / 1e9, "matmul_s": seconds,
                "matmul_gflops": flops / seconds / 1e9, "bound_updates_per_s": 1.0 / seconds}
    return {"pearl": per_update(ours, ours_s), "sb3": per_update(theirs, theirs_s), "updates_per_cycle": cycle,
            "gemm_1024_gflops": gemm_peak(threads) / 1e9}


# -- report ----------------------------------------------------------------------------------------------
def summarize(results: list[dict], bound: dict) -> dict:
    rival = best_rival(results)
    ratios = ratios_per_seed(results, "pearl", rival)
    ratio = float(statistics.median(ratios))  # each seed's pair ran back to back, under the same load
    ours_ret, sb3_ret = median_of(results, "pearl", "eval_mean"), median_of(results, rival, "eval_mean")
    ours_fraction = median_of(results, "pearl", "updates_per_s") / bound["pearl"]["bound_updates_per_s"]
    sb3_fraction = median_of(results, rival, "updates_per_s") / bound["sb3"]["bound_updates_per_s"]
    speed_ok = ratio >= TARGET_SPEEDUP
    bound_ok = ours_fraction >= TARGET_BOUND_FRACTION
    # The most the row can show on this machine: PEARL's env steps/s if each update took only its
    # products' time (and everything else ran beside it), over the rival's
    steps_per_update = median_of(results, "pearl", "env_steps") / median_of(results, "pearl", "updates")
    ceiling = bound["pearl"]["bound_updates_per_s"] * steps_per_update / median_of(results, rival, "steps_per_s")
    return {
        "rival": rival,
        "median_steps_per_s": {n: median_of(results, n, "steps_per_s") for n in results[0] if n != "order"},
        "median_final_return": {n: median_of(results, n, "eval_mean") for n in results[0] if n != "order"},
        "ratio_steps_per_s": ratio, "ratios_per_seed": ratios,
        "median_final_return_pearl": ours_ret, "median_final_return_sb3": sb3_ret,
        "pearl_fraction_of_bound": ours_fraction, "sb3_fraction_of_bound": sb3_fraction,
        "ceiling_ratio": ceiling, "speed_ok": speed_ok, "bound_ok": bound_ok, "passed": speed_ok or bound_ok,
    }


def print_bound(bound: dict, threads: int) -> None:
    cycle = bound["updates_per_cycle"]
    averaged = f"; per update, averaged over the policy delay's {cycle}" if cycle > 1 else ""
    print(f"\narithmetic bound ({threads} torch thread(s); a large 1024^3 GEMM runs at "
          f"{bound['gemm_1024_gflops']:.0f} GFLOP/s here{averaged})")
    for name in ("pearl", "sb3"):
        b = bound[name]
        print(f"  {name:<6} {b['matmuls']:>4g} matrix products per update, {b['gflop_per_update'] * 1e3:6.1f} MFLOP, "
              f"alone {b['matmul_s'] * 1e3:6.2f} ms ({b['matmul_gflops']:.0f} GFLOP/s) -> bound "
              f"{b['bound_updates_per_s']:6.1f} updates/s")


def print_summary(s: dict, n_seeds: int, steps: int, episodes: int) -> None:
    rival = s["rival"]
    print(f"\nsummary over {n_seeds} seed(s), {steps} env steps each (medians); rival: {rival} "
          f"(SB3's best thread count here)")
    for name, sps in s["median_steps_per_s"].items():
        print(f"  {name:<16} env steps/s {sps:9.1f}   final return {s['median_final_return'][name]:8.1f} "
              f"(greedy, {episodes} episodes)")
    print(f"  pearl/{rival} env steps/s per seed " + ", ".join(f"{r:.2f}x" for r in s["ratios_per_seed"])
          + f", median {s['ratio_steps_per_s']:.2f}x")
    print(f"  of own arithmetic bound   pearl {100 * s['pearl_fraction_of_bound']:5.1f}%   "
          f"sb3 {100 * s['sb3_fraction_of_bound']:5.1f}%")
    print(f"  ceiling: pearl's products alone allow at most {s['ceiling_ratio']:.2f}x {rival} here "
          f"(every update at its arithmetic bound)")
    verdict = "PASS" if s["passed"] else "FAIL"
    print(f"{verdict}: target pearl >= {TARGET_SPEEDUP:g}x {rival} env steps/s ({s['ratio_steps_per_s']:.2f}x: "
          f"{'ok' if s['speed_ok'] else 'no'}) or >= {100 * TARGET_BOUND_FRACTION:.0f}% of the arithmetic bound "
          f"({100 * s['pearl_fraction_of_bound']:.1f}%: {'ok' if s['bound_ok'] else 'no'}); "
          f"issue 19's 2x: {'ok' if s['ratio_steps_per_s'] >= 2 else 'no'}")


def main(argv=None) -> int:
    args = parse_args(argv)
    found = versions("e2e_ddpg")
    if found is None:
        return 2
    machine = machine_info()
    print(machine_header())
    print(f"PEARL ({args.runtime}, {args.threads} torch thread(s), {args.precision} products) vs SB3 {found['sb3']} (torch threads "
          f"{args.sb3_threads}) {args.algo.upper()} on {ENV_ID}: {args.steps} steps x seeds {args.seeds}, torch "
          f"{found['torch']}, gymnasium {found['gymnasium']}")
    runners = {"pearl": lambda seed, steps=args.steps: run_pearl(seed, steps, args.threads, args.learner_kernel,
                                                                 args.device, args.eval_episodes, args.algo,
                                                                 args.precision, args.runtime)}
    for threads in args.sb3_threads:
        runners[sb3_name(threads)] = (lambda seed, steps=args.steps, t=threads:
                                      run_sb3(seed, steps, t, args.device, args.eval_episodes, args.algo))
    warm_up(runners, WARMUP_SEED, args.warmup_steps)
    results = run_alternating(args.seeds, runners,
                              lambda seed, order, rows: print_seed_table(seed, order, rows, decimals=1))

    bound = arithmetic_bound(args.threads, args.learner_kernel, args.algo, args.precision)
    print_bound(bound, args.threads)
    summary = summarize(results, bound)
    print_summary(summary, len(args.seeds), args.steps, args.eval_episodes)
    machine["load_average_end"] = load_average()
    print(f"load average at the end: {machine['load_average_end']}")

    if args.json:
        out = {
            "benchmark": "e2e_ddpg", "env": ENV_ID, "algo": args.algo,
            "setup": {"steps": args.steps, "seeds": args.seeds, "threads": args.threads, **ALGOS[args.algo],
                      "precision": args.precision, "buffer": BUFFER, "batch_size": BATCH,
                      "learning_starts": LEARNING_STARTS, "updates_per_step": 1.0, "tau": TAU, "gamma": GAMMA,
                      "action_noise": None if args.algo == "sac" else ACTION_NOISE, "eval_episodes": args.eval_episodes,
                      "sb3_threads": args.sb3_threads, "warmup_steps": args.warmup_steps,
                      "pearl_learner_kernel": args.learner_kernel, "pearl_runtime": args.runtime},
            "versions": {"python": platform.python_version(), "torch": found["torch"],
                         "gymnasium": found["gymnasium"], "stable_baselines3": found["sb3"]},
            "machine": machine,
            "per_seed": results, "arithmetic_bound": bound, "summary": summary,
        }
        write_json(args.json, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
