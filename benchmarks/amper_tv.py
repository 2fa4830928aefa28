"""AMPER vs exact PER: total-variation distance of the sampling distributions, and speed.

Part 1 (exact, no sampling noise): for realistic priority sets (|TD| + eps from several
distributions, raised to alpha = 0.6) the TV distance
    TV = 1/2 * sum_i |q_i - P_i|,   P_i = p_i / sum p  (exact PER),  q_i = AmperSampler.probabilities
for several bucket counts (log spacing on [low, high)), plus linear spacing for comparison (emulated
in numpy: same "bucket mean / total" rule, buckets of equal width on [0, max p]).

Part 2: median time of sample(256 uniforms) and update(256 random slots) at capacity 1M for
kernels.cpu.sumtree.SumTree (numpy reference), kernels.cpu.fast_sumtree.NumbaSumTree (when it
imports) and AmperSampler (defaults), interleaved in the same run.

    python benchmarks/amper_tv.py                # N = 100k items for TV, capacity 1M for speed
    python benchmarks/amper_tv.py --quick        # N = 20k, capacity 100k, fewer repeats
"""
from __future__ import annotations

import argparse
import platform
import statistics

import numpy as np

from pearl.kernels.cpu.amper import AmperSampler
from pearl.kernels.cpu.sumtree import SumTree
from timing import median_us

ALPHA, EPS = 0.6, 1e-6
BUCKET_COUNTS = (16, 32, 64, 128, 256, 512, 1024)


def priority_sets(n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """|TD| samples from a few shapes; 'replay-like' has 20% fresh items at the max priority."""
    exp = rng.exponential(1.0, n)
    fresh = exp.copy()
    fresh[rng.random(n) < 0.2] = exp.max()
    td = {
        "lognormal s=1": rng.lognormal(0.0, 1.0, n),
        "lognormal s=2": rng.lognormal(0.0, 2.0, n),
        "exponential": exp,
        "half-normal": np.abs(rng.normal(0.0, 1.0, n)),
        "replay-like": fresh,
    }
    return {name: (np.abs(v) + EPS) ** ALPHA for name, v in td.items()}


def tv_amper(p: np.ndarray, n_buckets: int, **kwargs) -> float:
    s = AmperSampler(len(p), n_buckets=n_buckets, **kwargs)
    s.update(np.arange(len(p)), p)
    return 0.5 * float(np.abs(s.probabilities(np.arange(len(p))) - p / p.sum()).sum())


def tv_linear(p: np.ndarray, n_buckets: int) -> float:
    b = np.minimum((p / p.max() * n_buckets).astype(np.int64), n_buckets - 1)
    mass = np.bincount(b, weights=p, minlength=n_buckets)
    count = np.bincount(b, minlength=n_buckets)
    q = mass[b] / count[b] / p.sum()
    return 0.5 * float(np.abs(q - p / p.sum()).sum())


def tv_table(n: int, seed: int) -> None:
    sets = priority_sets(n, np.random.default_rng(seed))
    names = list(sets)
    low, high = 1e-6, 1e4
    print(f"TV distance to exact PER, N = {n}, alpha = {ALPHA}, log buckets on [{low:g}, {high:g})")
    print(f"{'buckets':>8} {'ratio r':>8} {'bound':>7} | " + " | ".join(f"{s:>13}" for s in names))
    for nb in BUCKET_COUNTS:
        r = (high / low) ** (1 / nb)
        bound = (r ** 0.5 - 1) / (r ** 0.5 + 1)
        row = [tv_amper(sets[s], nb, low=low, high=high) for s in names]
        print(f"{nb:>8} {r:>8.4f} {bound:>7.4f} | " + " | ".join(f"{v:>13.5f}" for v in row))
    for nb in (256, 1024):
        row = [tv_linear(sets[s], nb) for s in names]
        print(f"{'lin ' + str(nb):>8} {'-':>8} {'-':>7} | " + " | ".join(f"{v:>13.5f}" for v in row))
    print()


def speed(capacity: int, batch: int, reps: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    p = (rng.exponential(1.0, capacity) + EPS) ** ALPHA
    samplers = {"SumTree (numpy)": SumTree(capacity, 16)}
    try:
        from pearl.kernels.cpu.fast_sumtree import NumbaSumTree

        samplers["NumbaSumTree"] = NumbaSumTree(capacity, 16)
    except ImportError as error:
        print(f"(NumbaSumTree not available: {type(error).__name__}: {error})")
    samplers["AmperSampler"] = AmperSampler(capacity)  # defaults: 512 buckets
    samplers["Amper 128 bkt"] = AmperSampler(capacity, n_buckets=128)
    for s in samplers.values():
        s.update(np.arange(capacity), p)
        s.update(rng.integers(0, capacity, batch), rng.random(batch))  # compile / warm up
        s.sample(rng.random(batch))
    results = {name: {"sample": [], "update": []} for name in samplers}
    rounds = 5
    for _ in range(rounds):  # interleaved rounds, so load from other processes hits all alike
        for name, s in samplers.items():
            u = [rng.random(batch) for _ in range(reps)]
            it = iter(u)
            results[name]["sample"].append(median_us(lambda: s.sample(next(it)), reps, warmup=0))
            idx = [rng.integers(0, capacity, batch) for _ in range(reps)]
            pr = [(rng.exponential(1.0, batch) + EPS) ** ALPHA for _ in range(reps)]
            it2 = iter(zip(idx, pr))
            results[name]["update"].append(median_us(lambda: s.update(*next(it2)), reps, warmup=0))
    print(f"speed: capacity {capacity}, batch {batch}, median of {rounds} rounds x {reps} calls "
          f"({platform.processor() or platform.machine()}, shared machine)")
    ref = {k: statistics.median(results["SumTree (numpy)"][k]) for k in ("sample", "update")}
    print(f"{'sampler':>16} {'sample us':>10} {'update us':>10} {'sample x':>9} {'update x':>9}")
    for name, r in results.items():
        su, uu = statistics.median(r["sample"]), statistics.median(r["update"])
        print(f"{name:>16} {su:>10.1f} {uu:>10.1f} {ref['sample'] / su:>9.1f} {ref['update'] / uu:>9.1f}")
    print("(x = speedup over the numpy SumTree)")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=100_000, help="items for the TV table")
    ap.add_argument("--capacity", type=int, default=1_000_000)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--reps", type=int, default=100, help="calls per timing round")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-speed", action="store_true")
    args = ap.parse_args(argv)
    if args.quick:
        args.n, args.capacity, args.reps = 20_000, 100_000, 30
    tv_table(args.n, args.seed)
    if not args.no_speed:
        speed(args.capacity, args.batch, args.reps, args.seed)


if __name__ == "__main__":
    main()
