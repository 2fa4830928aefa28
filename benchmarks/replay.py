"""Replay benchmark: PEARL's replays and sum-tree kernels vs cpprb, Tianshou and TorchRL, one run.

Capacity 1M (filled), batch 256, obs dim 4 and 17. For each system, the median over many calls of:
  insert_1        add one transition
  insert_256      add 256 transitions in one call
  uniform_sample  draw 256 indices uniformly and gather the transitions
  per_sample      prioritized sample of 256 (indices, importance weights, gathered transitions)
  per_update      priority update of 256 sampled indices
  per_sample_update  per_sample followed by per_update (the learner's critical path)
Each priority update writes fresh |TD| values, as a learner's does: drawn before the timed region
(a pool of batches, cycled) from a realistic spread (log-normal, sigma 1.5: a few large errors,
many small ones), never the same batch twice in a row; the stored priorities start from the same
spread.
Kernel rows (tree only, no transitions) show each backend's sum tree: sample(256) + update(256).
The pearl-amper column is PEARL's approximate AMPER sampler (docs/AMPER.md) in the same replay.
Rivals that are not installed or do not load are listed with the reason. Ratios are ours / theirs
in time (lower is faster), against the best rival of the same operation.

    python benchmarks/replay.py                    # full run (a few minutes on 2 cores)
    python benchmarks/replay.py --capacity 100000 --repeats 200   # quicker
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from timing import median_us  # noqa: E402  (benchmarks/ is the script's own directory)

BATCH = 256
TD_POOL = 64  # batches of fresh |TD| values each timed update cycles through


def fresh_td(rng, convert=lambda a: a):
    """A function returning the next of TD_POOL pre-drawn |TD| batches (float32, as a learner's)."""
    pool = [convert(rng.lognormal(0.0, 1.5, BATCH).astype(np.float32)) for _ in range(TD_POOL)]
    return itertools.cycle(pool).__next__


def transitions(rng, count: int, obs_dim: int):
    return (rng.normal(size=(count, obs_dim)).astype(np.float32), rng.integers(0, 4, count),
            rng.normal(size=count).astype(np.float32), rng.normal(size=(count, obs_dim)).astype(np.float32),
            np.full(count, 0.99, np.float32))


def fill(add, capacity: int, obs_dim: int, rng, chunk: int = 65536):
    for start in range(0, capacity, chunk):
        add(*transitions(rng, min(chunk, capacity - start), obs_dim))


# -- ours ------------------------------------------------------------------------------------------
def bench_pearl(capacity, obs_dim, repeats, backend):
    from pearl.replay import PrioritizedReplay, UniformReplay

    rng = np.random.default_rng(0)
    one, many = transitions(rng, 1, obs_dim), transitions(rng, BATCH, obs_dim)
    uniform = UniformReplay(capacity, obs_dim)
    fill(uniform.add, capacity, obs_dim, rng)
    per = PrioritizedReplay(capacity, obs_dim, backend=backend)
    fill(per.add, capacity, obs_dim, rng)
    per.update_priorities(np.arange(capacity), rng.lognormal(0.0, 1.5, capacity))
    td = fresh_td(rng)
    sampled = per.sample(BATCH, rng).indices.copy()

    def sample_update():
        batch = per.sample(BATCH, rng)
        per.update_priorities(batch.indices, td())

    return {
        "insert_1": median_us(lambda: uniform.add(*one), repeats),
        "insert_256": median_us(lambda: uniform.add(*many), repeats),
        "uniform_sample": median_us(lambda: uniform.sample(BATCH, rng), repeats),
        "per_sample": median_us(lambda: per.sample(BATCH, rng), repeats),
        "per_update": median_us(lambda: per.update_priorities(sampled, td()), repeats),
        "per_sample_update": median_us(sample_update, repeats),
    }


def tree_backends(capacity):
    """(name, tree, to_native) for every sum-tree backend importable here."""
    from pearl.kernels.cpu.sumtree import SumTree

    found = [("numpy (reference)", SumTree(capacity, 16), lambda a: a)]
    try:
        from pearl.kernels.cpu.fast_sumtree import NumbaSumTree
        found.append(("cpu numba", NumbaSumTree(capacity, 16), lambda a: a))
    except ImportError as err:
        print(f"  (cpu numba tree unavailable: {err})")
    try:
        from pearl.kernels.opencl import OpenCLSumTree, available
        if available():
            found.append(("opencl (PoCL on CPU)", OpenCLSumTree(capacity, 16), lambda a: a))
    except ImportError as err:
        print(f"  (opencl tree unavailable: {err})")
    try:
        import torch

        from pearl.kernels.cuda import TorchSumTree
        device = "cuda" if torch.cuda.is_available() else "cpu"
        label = "cuda" if device == "cuda" else "cuda backend on CPU tensors"
        found.append((label, TorchSumTree(capacity, 16, device=device),
                      lambda a, d=device: torch.as_tensor(a, device=d)))
    except ImportError as err:
        print(f"  (cuda tree unavailable: {err})")
    return found


def bench_trees(capacity, repeats):
    rng = np.random.default_rng(1)
    priorities = rng.exponential(size=capacity)
    rows = {}
    for name, tree, native in tree_backends(capacity):
        tree.update(native(np.arange(capacity)), native(priorities))
        uniforms = native(rng.random(BATCH))
        new = native(rng.exponential(size=BATCH))

        def both(tree=tree, uniforms=uniforms, new=new):
            tree.update(tree.sample(uniforms), new)

        rows[name] = {"tree_sample": median_us(lambda: tree.sample(uniforms), repeats),
                      "tree_sample_update": median_us(both, repeats)}
    return rows


# -- rivals ----------------------------------------------------------------------------------------
def bench_cpprb(capacity, obs_dim, repeats):
    import cpprb

    rng = np.random.default_rng(0)
    env_dict = {"obs": {"shape": obs_dim}, "act": {}, "rew": {}, "next_obs": {"shape": obs_dim}, "done": {}}

    def as_kwargs(t):
        return dict(obs=t[0], act=t[1], rew=t[2], next_obs=t[3], done=t[4])

    one, many = as_kwargs(transitions(rng, 1, obs_dim)), as_kwargs(transitions(rng, BATCH, obs_dim))
    uniform = cpprb.ReplayBuffer(capacity, env_dict)
    per = cpprb.PrioritizedReplayBuffer(capacity, env_dict, alpha=0.6)
    for rb in (uniform, per):
        fill(lambda *t, rb=rb: rb.add(**as_kwargs(t)), capacity, obs_dim, rng)
    td = fresh_td(rng, lambda a: a.astype(np.float64))
    sampled = per.sample(BATCH, beta=0.4)["indexes"].copy()

    def sample_update():
        per.update_priorities(per.sample(BATCH, beta=0.4)["indexes"], td())

    return {
        "insert_1": median_us(lambda: uniform.add(**one), repeats),
        "insert_256": median_us(lambda: uniform.add(**many), repeats),
        "uniform_sample": median_us(lambda: uniform.sample(BATCH), repeats),
        "per_sample": median_us(lambda: per.sample(BATCH, beta=0.4), repeats),
        "per_update": median_us(lambda: per.update_priorities(sampled, td()), repeats),
        "per_sample_update": median_us(sample_update, repeats),
    }


def bench_tianshou(capacity, obs_dim, repeats):
    from tianshou.data import Batch, PrioritizedReplayBuffer, ReplayBuffer

    rng = np.random.default_rng(0)
    uniform = ReplayBuffer(capacity)
    per = PrioritizedReplayBuffer(capacity, alpha=0.6, beta=0.4)

    def batch_of(t):
        return Batch(obs=t[0], act=t[1], rew=t[2], obs_next=t[3], terminated=t[4] == 0,
                     truncated=np.zeros(len(t[2]), bool), info={})

    def one_of(t):  # tianshou adds a single transition as an unbatched Batch
        return Batch(obs=t[0][0], act=t[1][0], rew=t[2][0], obs_next=t[3][0], terminated=False,
                     truncated=False, info={})

    one = one_of(transitions(rng, 1, obs_dim))
    for rb in (uniform, per):
        # Tianshou adds one transition per call; filling 1M that way takes minutes, so the
        # storage is handed over whole with its own set_batch, then the counters are set.
        filled = batch_of(transitions(rng, capacity, obs_dim))
        filled.done = filled.terminated
        rb.set_batch(filled)
        rb._size, rb._index = capacity, 0
    per.init_weight(np.arange(capacity))
    per.update_weight(np.arange(capacity), rng.lognormal(0.0, 1.5, capacity))
    td = fresh_td(rng)

    sampled = per.sample(BATCH)[1].copy()

    def sample_update():
        _, indices = per.sample(BATCH)
        per.update_weight(indices, td())

    return {
        "insert_1": median_us(lambda: uniform.add(one), repeats),
        "uniform_sample": median_us(lambda: uniform.sample(BATCH), repeats),
        "per_sample": median_us(lambda: per.sample(BATCH), repeats),
        "per_update": median_us(lambda: per.update_weight(sampled, td()), repeats),
        "per_sample_update": median_us(sample_update, repeats),
    }


def bench_torchrl(capacity, obs_dim, repeats):
    import torch
    from tensordict import TensorDict
    from torchrl.data import LazyTensorStorage, ReplayBuffer
    from torchrl.data import PrioritizedReplayBuffer as TorchRLPER

    rng = np.random.default_rng(0)

    def td_of(t):
        return TensorDict({"obs": torch.from_numpy(t[0]), "action": torch.from_numpy(t[1]),
                           "reward": torch.from_numpy(t[2]), "next_obs": torch.from_numpy(t[3]),
                           "discount": torch.from_numpy(t[4])}, batch_size=[len(t[2])])

    one, many = td_of(transitions(rng, 1, obs_dim)), td_of(transitions(rng, BATCH, obs_dim))
    uniform = ReplayBuffer(storage=LazyTensorStorage(capacity), batch_size=BATCH)
    fill(lambda *t: uniform.extend(td_of(t)), capacity, obs_dim, rng)
    out = {
        "insert_1": median_us(lambda: uniform.extend(one), repeats),
        "insert_256": median_us(lambda: uniform.extend(many), repeats),
        "uniform_sample": median_us(lambda: uniform.sample(), repeats),
    }
    try:
        per = TorchRLPER(alpha=0.6, beta=0.4, storage=LazyTensorStorage(capacity), batch_size=BATCH)
    except RuntimeError as err:  # its C++ sum tree does not load with every torch
        out["per_unavailable"] = str(err).splitlines()[0]
        return out
    fill(lambda *t: per.extend(td_of(t)), capacity, obs_dim, rng)
    td = fresh_td(rng, torch.from_numpy)

    def sample_update():
        _, info = per.sample(return_info=True)
        per.update_priority(info["index"], td())

    out["per_sample"] = median_us(lambda: per.sample(), repeats)
    out["per_sample_update"] = median_us(sample_update, repeats)
    return out


RIVALS = {"cpprb": bench_cpprb, "tianshou": bench_tianshou, "torchrl": bench_torchrl}
OPS = ("insert_1", "insert_256", "uniform_sample", "per_sample", "per_update", "per_sample_update")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--capacity", type=int, default=1_000_000)
    parser.add_argument("--obs-dims", type=int, nargs="+", default=[4, 17])
    parser.add_argument("--repeats", type=int, default=500)
    parser.add_argument("--backend", default="auto", help="PEARL's CPU tree backend: auto, numba, numpy")
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)

    from pearl.kernels.cpu import cpu_kernel_mode

    from side_by_side import load_average, machine_header, machine_info

    print(machine_header())
    results = {"capacity": args.capacity, "batch": BATCH, "machine": machine_info(), "runs": {}}
    with cpu_kernel_mode():
        for obs_dim in args.obs_dims:
            print(f"\ncapacity {args.capacity:,}, batch {BATCH}, obs dim {obs_dim}: median us per call")
            rows = {"pearl": bench_pearl(args.capacity, obs_dim, args.repeats, args.backend),
                    "pearl-amper": bench_pearl(args.capacity, obs_dim, args.repeats, "amper")}
            for name, bench in RIVALS.items():
                try:
                    rows[name] = bench(args.capacity, obs_dim, args.repeats)
                except ImportError as err:
                    rows[name] = {"unavailable": f"not installed ({err.name})"}
            results["runs"][obs_dim] = rows
            print_table(rows)
        print(f"\nsum-tree kernels, capacity {args.capacity:,}, fanout 16, batch {BATCH}: median us")
        trees = bench_trees(args.capacity, args.repeats)
        results["trees"] = trees
        for name, row in trees.items():
            print(f"  {name:<30} sample {row['tree_sample']:9.1f}   sample+update {row['tree_sample_update']:9.1f}")
    results["machine"]["load_average_end"] = load_average()
    print(f"load average at the end: {results['machine']['load_average_end']}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


def print_table(rows: dict) -> None:
    names = list(rows)
    print("  " + f"{'operation':<20}" + "".join(f"{n:>12}" for n in names) + f"{'ours/best rival':>18}")
    for op in OPS:
        cells, rivals = [], []
        for name in names:
            value = rows[name].get(op)
            cells.append(f"{value:12.1f}" if value is not None else f"{'-':>12}")
            if not name.startswith("pearl") and value is not None:
                rivals.append(value)
        ours = rows["pearl"].get(op)
        ratio = f"{ours / min(rivals):17.2f}x" if ours is not None and rivals else f"{'':>18}"
        print("  " + f"{op:<20}" + "".join(cells) + ratio)
    for name in names:
        for key in ("unavailable", "per_unavailable"):
            if key in rows[name]:
                print(f"  {name}: {key.replace('_', ' ')}: {rows[name][key]}")


if __name__ == "__main__":
    sys.exit(main())
