"""Reverb 0.14 side of benchmarks/replay_server.py (`reverb` mode). Runs in its own environment
(TensorFlow 2.15 + dm-reverb 0.14, see docs/BENCHMARKS.md) and imports nothing of PEARL's.

    REVERB_PYTHON benchmarks/reverb_rival.py ingest --writers 2 --rows 200000 --chunk 100
    REVERB_PYTHON benchmarks/reverb_rival.py latency --capacity 1000000 --rounds 1000

Items are single CartPole-size transitions (obs 4 float32, int64 action, float32 reward, next obs,
float32 discount), written with a TrajectoryWriter in chunks of --chunk steps (the same item size
and chunking as PEARL's writers). Prints one JSON line. Reverb's Python server listens on every
interface (it has no bind-address option): run this inside a network namespace with only loopback
(`unshare -n`), which replay_server.py does when it can.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import time

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def steps(seed: int, rows: int):
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(rows, 4)).astype(np.float32), rng.integers(0, 2, rows).astype(np.int64),
            rng.normal(size=rows).astype(np.float32), rng.normal(size=(rows, 4)).astype(np.float32),
            np.full(rows, 0.99, np.float32))


def write(address: str, table: str, seed: int, rows: int, chunk: int, ready, go, out, item_rows: int = 1) -> None:
    import reverb

    client = reverb.Client(address)
    obs, actions, rewards, next_obs, discounts = steps(seed, rows)
    ready.put(1)
    go.wait()
    if item_rows > 1:  # one item = item_rows transitions appended as one step (a different item size)
        with client.trajectory_writer(num_keep_alive_refs=1) as writer:
            for n, i in enumerate(range(0, rows, item_rows)):
                j = slice(i, i + item_rows)
                writer.append({"obs": obs[j], "action": actions[j], "reward": rewards[j], "next_obs": next_obs[j],
                               "discount": discounts[j]})
                writer.create_item(table, priority=1.0, trajectory={k: v[-1] for k, v in writer.history.items()})
                if (n + 1) % 16 == 0:
                    writer.flush(block_until_num_items=16)
            writer.flush()
        out.put(time.time())
        return
    with client.trajectory_writer(num_keep_alive_refs=1) as writer:
        for i in range(rows):
            writer.append({"obs": obs[i], "action": actions[i], "reward": rewards[i], "next_obs": next_obs[i],
                           "discount": discounts[i]})
            writer.create_item(table, priority=1.0, trajectory={k: v[-1] for k, v in writer.history.items()})
            if (i + 1) % chunk == 0:
                writer.flush(block_until_num_items=chunk * 4)
        writer.flush()
    out.put(time.time())


def make_server(capacity: int, prioritized: bool):
    import reverb

    sampler = reverb.selectors.Prioritized(0.6) if prioritized else reverb.selectors.Uniform()
    table = reverb.Table(name="t", sampler=sampler, remover=reverb.selectors.Fifo(), max_size=capacity,
                         rate_limiter=reverb.rate_limiters.MinSize(1))
    server = reverb.Server(tables=[table])
    return server, f"localhost:{server.port}"


def ingest(args) -> dict:
    import reverb

    server, address = make_server(args.writers * args.rows // args.item_rows + 1, False)
    ctx = mp.get_context("spawn")
    ready, out, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=write, args=(address, "t", w + 1, args.rows, args.chunk, ready, go, out, args.item_rows))
             for w in range(args.writers)]
    for p in procs:
        p.start()
    for _ in procs:
        ready.get(timeout=300)
    start = time.time()
    go.set()
    ends = [out.get(timeout=900) for _ in procs]
    for p in procs:
        p.join(60)
    size = reverb.Client(address).server_info()["t"].current_size * args.item_rows
    server.stop()
    return {"mode": "ingest", "writers": args.writers, "item_rows": args.item_rows, "rows": args.writers * args.rows, "stored": int(size),
            "per_s": args.writers * args.rows / (max(ends) - start)}


def latency(args) -> dict:
    import reverb

    server, address = make_server(args.capacity, True)
    client = reverb.Client(address)
    obs, actions, rewards, next_obs, discounts = steps(0, min(args.capacity, 100_000))
    with client.trajectory_writer(num_keep_alive_refs=1) as writer:
        for i in range(args.capacity):
            j = i % len(rewards)
            writer.append({"obs": obs[j], "action": actions[j], "reward": rewards[j], "next_obs": next_obs[j],
                           "discount": discounts[j]})
            # a one-step trajectory (v[-1:]): the legacy Client.sample needs a time axis
            writer.create_item("t", priority=1.0, trajectory={k: v[-1:] for k, v in writer.history.items()})
            if (i + 1) % 1000 == 0:
                writer.flush()
    rng = np.random.default_rng(1)
    sample_times, round_times = [], []
    keys = None
    for r in range(args.legacy_rounds + 10):
        t0 = time.perf_counter_ns()
        if keys is not None:
            client.mutate_priorities("t", updates=dict(zip(keys, rng.exponential(size=len(keys)).tolist())))
        t1 = time.perf_counter_ns()
        batch = list(client.sample("t", num_samples=256))
        t2 = time.perf_counter_ns()
        keys = [int(s[0].info.key) for s in batch]
        if r >= 10:
            sample_times.append((t2 - t1) / 1e3)
            round_times.append((t2 - t0) / 1e3)
    # the learner's path Reverb recommends: a tf.data TrajectoryDataset (samples kept in flight), batched
    import tensorflow as tf

    dtypes = {"obs": tf.float32, "action": tf.int64, "reward": tf.float32, "next_obs": tf.float32, "discount": tf.float32}
    shapes = {"obs": tf.TensorShape([1, 4]), "action": tf.TensorShape([1]), "reward": tf.TensorShape([1]),
              "next_obs": tf.TensorShape([1, 4]), "discount": tf.TensorShape([1])}
    dataset = reverb.TrajectoryDataset(address, "t", dtypes, shapes, max_in_flight_samples_per_worker=512)
    iterator = iter(dataset.batch(256, drop_remainder=True))
    data_times, data_rounds = [], []
    for r in range(args.rounds + 50):
        t0 = time.perf_counter_ns()
        if r:
            client.mutate_priorities("t", updates=dict(zip(keys, rng.exponential(size=len(keys)).tolist())))
        t1 = time.perf_counter_ns()
        sample = next(iterator)
        t2 = time.perf_counter_ns()
        keys = [int(k) for k in tf.reshape(sample.info.key, [-1]).numpy()]
        if r >= 50:
            data_times.append((t2 - t1) / 1e3)
            data_rounds.append((t2 - t0) / 1e3)
    server.stop()
    s, u = np.array(sample_times), np.array(round_times)
    d, du = np.array(data_times), np.array(data_rounds)
    return {"mode": "latency", "capacity": args.capacity, "sample_p50_us": float(np.percentile(s, 50)),
            "sample_p99_us": float(np.percentile(s, 99)), "round_p50_us": float(np.percentile(u, 50)),
            "round_p99_us": float(np.percentile(u, 99)), "round_mean_us": float(u.mean()),
            "dataset_batch_p50_us": float(np.percentile(d, 50)), "dataset_batch_p99_us": float(np.percentile(d, 99)),
            "dataset_round_p50_us": float(np.percentile(du, 50)), "dataset_round_p99_us": float(np.percentile(du, 99))}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("what", choices=["ingest", "latency"])
    parser.add_argument("--writers", type=int, default=1)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--chunk", type=int, default=100)
    parser.add_argument("--item-rows", type=int, default=1, help="transitions per Reverb item (1 = PEARL's item size)")
    parser.add_argument("--capacity", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=1000)
    parser.add_argument("--legacy-rounds", type=int, default=50, help="rounds of the (slow) Client.sample path")
    args = parser.parse_args()
    import reverb

    result = ingest(args) if args.what == "ingest" else latency(args)
    result["reverb"] = getattr(reverb, "__version__", "0.14")
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
