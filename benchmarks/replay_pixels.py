"""Pixel replay benchmark (issue 16): 4 x 84 x 84 uint8 stacked frames, PEARL's frame table
(pearl/replay/frames.py) vs cpprb and Tianshou at their frame-saving settings, one run.

Each system runs in its own process (so its resident memory is its own): it builds and fills a
uniform table of `capacity` transitions, times it, drops it, and does the same with a prioritized
one (episodes of 1000 steps, frames from a pool of random ones), then times, after WARMUP_CALLS
untimed calls of each operation (every system alike), the median of `repeats` calls of
  insert          one env step (the actor's add), in the form each system's writer hands it over:
                  PEARL's actor the step's arrays (pearl/runtime/actor.py `step`: stream ids, the
                  stacks' newest frames, actions, rewards, terminated, truncated; one row each),
                  cpprb the step's fields, Tianshou a Batch of them (its collector's form; the
                  rivals' times move < 5% with arrays instead of scalars, measured)
  uniform_B       uniform sample of B transitions (obs and next obs stacks, actions, rewards, dones)
  per_B           prioritized sample of B + priority update of the B sampled (the learner's path)
and reports the growth of its resident set (RSS) while building and filling a table (the median of
the two) against the unique frames' bytes
(capacity x 84 x 84). The rivals, each at its own memory-saving setting:
  cpprb      ReplayBuffer / PrioritizedReplayBuffer with next_of="obs", stack_compress="obs"
             (frames stacked on the last axis, its convention; each frame stored once)
  tianshou   ReplayBuffer / PrioritizedReplayBuffer with stack_num=4, save_only_last_obs=True,
             ignore_obs_next=True (frames stored once, stacks built at sample time)
Rounds (seeds) run the systems in turn, interleaved; ratios are ours / best rival in time (lower is
faster), per round and their median. A system whose table would not fit in the memory available
now is skipped with the reason. The rivals are single-threaded; `--gather-threads 1 2` times
PEARL's samples with `gather_threads` 1 and 2 (replay.gather_threads: the batch's frames copied on
numba's 2-thread pool) on the same tables in the same process, the thread counts alternating in
4 blocks of the repeats, as columns pearl-t1 and pearl-t2 (insert does not use them: timed once).

Each capacity's report ends with this host's floor for the sample rows: a batch of B 1-step
transitions reads at least B x (STACK + 1) frames from random places of a table far larger than
the caches, so it cannot take less than those bytes over the host's streaming read bandwidth
(`streaming_read_gbps`: a GB array read in order, copied chunk after chunk into a buffer that
stays in cache, the best of 4 KB and 35 KB chunks, on 1 and 2 threads, before the rounds: random
windows read slower than that). Beside it, the time a 3x over the best rival of each round asks
for: where that is below the floor, no gather on this host reaches 3x.

    python benchmarks/replay_pixels.py --capacity 100000 1000000 --rounds 2
    python benchmarks/replay_pixels.py --capacity 100000 --rounds 1 --repeats 200 --gather-threads 1 2
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numba
import numpy as np
from numba import njit, prange

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from timing import median_us, median_us_interleaved  # noqa: E402  (benchmarks/ is the script's own directory)
from pearl.kernels.cpu.backend import cpu_model, memory_available, proc_bytes  # noqa: E402

FRAME, STACK, EPISODE, POOL = (84, 84), 4, 1000, 256
FRAME_BYTES = FRAME[0] * FRAME[1]
SYSTEMS = ("pearl", "cpprb", "tianshou")
# Untimed calls of each operation before its timed ones, every system alike: after a 7 GB table is
# filled and prioritized, random reads ran 2-10x slow on this VM for its first ~200-400 calls of
# an operation in some runs and not in others (the 2-core EPYC, session 17: PEARL's sample of 32
# at 1M 1,027 -> 88 us over 400 calls, cpprb's 158 vs 807 us in two runs), and 100 timed calls of a
# fast operation fell wholly inside that window
WARMUP_CALLS = 500


def rss_bytes() -> int:
    return proc_bytes("/proc/self/status", "VmRSS") or 0


def huge_page_bytes() -> int:
    """The process's anonymous memory on transparent huge pages: a random 7 KB frame read of a
    GB table on 4 KB pages misses the TLB (numpy madvises arrays of 4 MB and more for huge pages,
    which Linux's default `madvise` THP mode honours; NUMPY_MADVISE_HUGEPAGE=0 turns that off)."""
    return proc_bytes("/proc/self/smaps_rollup", "AnonHugePages") or 0


class Steps:
    """An env stream: stacked uint8 observations whose newest frames come from a random pool."""

    def __init__(self, seed: int, last_axis: bool = False):
        rng = np.random.default_rng(seed)
        self.pool = rng.integers(0, 256, (POOL, *FRAME), dtype=np.uint8)
        self.rng, self.t, self.last_axis = rng, 0, last_axis

    def stack(self, t: int) -> np.ndarray:
        frames = self.pool[[(t - d) % POOL for d in range(STACK - 1, -1, -1)]]
        return np.moveaxis(frames, 0, -1).copy() if self.last_axis else frames

    def step(self):
        """(obs, action, reward, next_obs, done) of the next step."""
        t = self.t
        self.t += 1
        return self.stack(t), int(self.rng.integers(6)), float(self.rng.normal()), self.stack(t + 1), (t + 1) % EPISODE == 0

    def chunk(self, count: int, newest_only: bool = False):
        """The next `count` steps as arrays (obs stacks, actions, rewards, next obs stacks, dones);
        `newest_only`: the stacks' newest frames instead of the stacks."""
        t = self.t + np.arange(count)
        self.t += count
        back = np.arange(0 if newest_only else STACK - 1, -1, -1)
        frames = self.pool[(t[:, None] - back) % POOL]
        next_frames = self.pool[(t[:, None] + 1 - back) % POOL]
        if newest_only:
            frames, next_frames = frames[:, 0], next_frames[:, 0]
        if self.last_axis:
            frames, next_frames = np.moveaxis(frames, 1, -1).copy(), np.moveaxis(next_frames, 1, -1).copy()
        return (frames, self.rng.integers(6, size=count), self.rng.normal(size=count).astype(np.float32),
                next_frames, (t + 1) % EPISODE == 0)


def measure(system, capacity, batches, repeats, seed, threads=(1,)) -> dict:
    """One table at a time (uniform, then prioritized): its RSS growth while built and filled,
    then its operations' median times; PEARL's samples once per gather thread count in `threads`,
    interleaved (keys "op@tN"), the rivals' once."""
    import gc

    rng = np.random.default_rng(seed)
    for kind in ("uniform", "prioritized"):  # warm-up: imports, compiled kernels, first allocations
        small = system.make(kind, 1000)  # small: its freed memory does not feed the measured table
        system.fill(small, Steps(seed, system.last_axis), 600)
        if kind == "prioritized":
            system.prioritize(small, 500, rng)
        for b in batches:
            system.sample(small, b, rng) if kind == "uniform" else system.sample_update(small, b, np.ones(b), rng)
        del small
    out, grown, huge = {}, [], []
    for kind in ("uniform", "prioritized"):
        before, huge_before = rss_bytes(), huge_page_bytes()
        table = system.make(kind, capacity)
        steps = Steps(seed, system.last_axis)
        system.fill(table, steps, capacity + STACK)  # full, and wrapped a little
        grown.append(rss_bytes() - before)
        huge.append(huge_page_bytes() - huge_before)
        if kind == "uniform":
            one = system.step_record(Steps(seed + 1, system.last_axis).step())
            out["insert"] = median_us(lambda: system.insert(table, one), repeats, WARMUP_CALLS)
            for b in batches:
                out.update(timed(system, table, f"uniform_{b}", threads, repeats,
                                 lambda b=b: system.sample(table, b, rng)))
        else:
            system.prioritize(table, capacity, rng)
            for b in batches:
                td = np.abs(rng.normal(size=b))
                out.update(timed(system, table, f"per_{b}", threads, repeats,
                                 lambda b=b, td=td: system.sample_update(table, b, td, rng)))
        del table
        gc.collect()
    out["rss_per_table"] = float(np.median(grown))
    out["huge_pages_per_table"] = float(np.median(huge))
    return out


def timed(system, table, op, threads, repeats, call) -> dict:
    """{op: median us} for a rival; for PEARL {op@tN: median us} per gather thread count N,
    the counts alternating in blocks on the same table."""
    if system is not Pearl:
        return {op: median_us(call, repeats, WARMUP_CALLS)}

    def with_threads(n):
        def run():
            table.gather_threads = n
            call()
        return run

    medians = median_us_interleaved({n: with_threads(n) for n in threads}, repeats, warmup=WARMUP_CALLS)
    return {f"{op}@t{n}": us for n, us in medians.items()}


class Pearl:
    last_axis = False

    @staticmethod
    def make(kind, capacity):
        from pearl.replay import FrameReplay

        return FrameReplay(capacity, FRAME, STACK, kind=kind, n_step=1, gamma=0.99)

    @staticmethod
    def fill(table, steps, count, chunk=1000):
        for start in range(0, count, chunk):
            n = min(chunk, count - start)
            obs, act, rew, next_obs, done = steps.chunk(n, newest_only=True)  # what a frame writer hands over
            table.add(np.zeros(n, np.int64), obs, act, rew, next_obs, done, np.zeros(n, bool))

    @staticmethod
    def step_record(step):
        """What the actor hands the table for one env (`Actor.step`'s frame-table branch)."""
        obs, act, rew, next_obs, done = step
        return (np.zeros(1, np.int64), obs[None][:, -1], np.array([act], np.int64), np.array([rew], np.float32),
                next_obs[None][:, -1], np.array([done]), np.zeros(1, bool))

    @staticmethod
    def insert(table, record):
        table.add(*record)

    @staticmethod
    def sample(table, b, rng):
        return table.sample(b, rng)

    @staticmethod
    def prioritize(table, capacity, rng):
        table.update_priorities(table.valid_indices(), rng.exponential(size=table.size))

    @staticmethod
    def sample_update(table, b, td, rng):
        table.update_priorities(table.sample(b, rng).indices, td)


class Cpprb:
    last_axis = True  # stack_compress stacks on the last axis

    @staticmethod
    def step_record(step):
        return step

    @staticmethod
    def make(kind, capacity):
        import cpprb

        env_dict = {"obs": {"shape": (*FRAME, STACK), "dtype": np.uint8}, "act": {"dtype": np.int64},
                    "rew": {}, "done": {}}
        options = dict(next_of="obs", stack_compress="obs")
        if kind == "uniform":
            return cpprb.ReplayBuffer(capacity, env_dict, **options)
        return cpprb.PrioritizedReplayBuffer(capacity, env_dict, alpha=0.6, **options)

    @staticmethod
    def fill(table, steps, count, chunk=1000):
        # in chunks (one step per call takes ~40 min for 1M on the loaded machine): the frames'
        # episode boundaries are then not exact, which the timed operations do not look at
        for start in range(0, count, chunk):
            n = min(chunk, count - start)
            obs, act, rew, next_obs, done = steps.chunk(n)
            table.add(obs=obs, act=act, rew=rew, next_obs=next_obs, done=done)

    @staticmethod
    def insert(table, step):
        obs, act, rew, next_obs, done = step
        table.add(obs=obs, act=act, rew=rew, next_obs=next_obs, done=done)

    @staticmethod
    def sample(table, b, rng):
        return table.sample(b)

    @staticmethod
    def prioritize(table, capacity, rng):
        table.update_priorities(np.arange(capacity), rng.exponential(size=capacity))

    @staticmethod
    def sample_update(table, b, td, rng):
        table.update_priorities(table.sample(b, beta=0.4)["indexes"], td)


class Tianshou:
    last_axis = False

    @staticmethod
    def step_record(step):
        return step

    @staticmethod
    def make(kind, capacity):
        from tianshou.data import PrioritizedReplayBuffer, ReplayBuffer

        options = dict(stack_num=STACK, save_only_last_obs=True, ignore_obs_next=True)
        if kind == "uniform":
            return ReplayBuffer(capacity, **options)
        return PrioritizedReplayBuffer(capacity, alpha=0.6, beta=0.4, **options)

    @staticmethod
    def batch(step):
        from tianshou.data import Batch

        obs, act, rew, next_obs, done = step
        return Batch(obs=obs, act=act, rew=rew, terminated=done, truncated=False, obs_next=next_obs, info={})

    @classmethod
    def fill(cls, table, steps, count):
        # Tianshou adds one step per call (minutes for 1M): after one add, its storage is handed
        # over whole with its own set_batch (as benchmarks/replay.py does), frames only
        # (save_only_last_obs), and the counters set
        from tianshou.data import Batch

        table.add(cls.batch(steps.step()))
        count = table.maxsize  # set_batch takes whole tables only
        frames = steps.pool[np.arange(count) % POOL]
        done = (np.arange(count) + 1) % EPISODE == 0
        table.set_batch(Batch(obs=frames, act=steps.rng.integers(6, size=count), rew=steps.rng.normal(size=count),
                              terminated=done, truncated=np.zeros(count, bool), done=done, info=Batch()))
        table._size, table._index = count, 0
        if hasattr(table, "init_weight"):
            table.init_weight(np.arange(count))

    @classmethod
    def insert(cls, table, step):
        table.add(cls.batch(step))

    @staticmethod
    def sample(table, b, rng):
        return table.sample(b)

    @staticmethod
    def prioritize(table, capacity, rng):
        table.update_weight(np.arange(capacity), rng.exponential(size=capacity))

    @staticmethod
    def sample_update(table, b, td, rng):
        table.update_weight(table.sample(b)[1], td)


BENCHES = {"pearl": Pearl, "cpprb": Cpprb, "tianshou": Tianshou}


def worker(args) -> int:
    try:
        result = measure(BENCHES[args.worker], args.capacity[0], args.batches, args.repeats, args.seed,
                         tuple(args.gather_threads))
    except ImportError as err:
        result = {"unavailable": f"not installed ({err.name})"}
    print("RESULT " + json.dumps(result))
    return 0


def run_one(system, capacity, batches, repeats, seed, threads=(1,)) -> dict:
    # one table of one frame per transition at a time, plus headroom: skip what cannot fit now
    need = capacity * FRAME_BYTES * 1.15
    free = memory_available()
    if need > free - 2 * 2**30:
        return {"unavailable": f"needs ~{need / 2**30:.1f} GiB, {free / 2**30:.1f} GiB available"}
    command = [sys.executable, __file__, "--worker", system, "--capacity", str(capacity), "--repeats", str(repeats),
               "--seed", str(seed), "--batches", *map(str, batches), "--gather-threads", *map(str, threads)]
    done = subprocess.run(command, capture_output=True, text=True)
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    return {"unavailable": (done.stderr.strip().splitlines() or ["no result"])[-1][:200]}


@njit(parallel=True, nogil=True)
def _copy_in_chunks(table, out, parts):
    chunk = out.shape[1]
    chunks = table.shape[0] // chunk
    for p in prange(parts):
        for c in range(p * chunks // parts, (p + 1) * chunks // parts):
            out[p, :] = table[c * chunk:(c + 1) * chunk]


def streaming_read_gbps(threads: int, table_bytes: int = 2**30, chunks=(4096, (STACK + 1) * FRAME_BYTES)) -> float:
    """GB/s read from memory by `threads` threads copying a table of `table_bytes` (far above the
    caches) in order, chunk after chunk, into a buffer per thread that stays in cache: the best
    chunk size's median of 5 (4 KB chunks, whose buffer stays in L1, read 1.2-1.7x faster than a
    window's 35 KB on the Zen 4 EPYC: docs/BENCHMARKS.md Pixel replay, session 53)."""
    table = np.ones(table_bytes, np.uint8)
    kept = numba.get_num_threads()
    numba.set_num_threads(threads)
    medians = []
    try:
        for chunk in chunks:
            out = np.empty((threads, chunk), np.uint8)
            _copy_in_chunks(table, out, threads)
            times = []
            for _ in range(5):
                start = time.perf_counter()
                _copy_in_chunks(table, out, threads)
                times.append(time.perf_counter() - start)
            medians.append(float(np.median(times)))
    finally:
        numba.set_num_threads(kept)
    return table_bytes / min(medians) / 1e9


def report_floor(batches, bandwidth: dict, summary: dict) -> None:
    """The sample rows' floor on this host (B x (STACK + 1) frames at the best streaming read) beside
    what 3x over each round's best rival (`report`'s summary) asks for."""
    gbps = max(bandwidth.values())
    for b in batches:
        floor_us = b * (STACK + 1) * FRAME_BYTES / gbps / 1e3
        for kind in ("uniform", "per"):
            op = f"{kind}_{b}"
            best = summary.get(op, {}).get("best_rival_us")
            if not best:
                continue
            asks = [x / 3 for x in best]
            verdict = "below the floor: no gather reaches 3x here" if max(asks) < floor_us else "above the floor"
            print(f"  floor {op:<12} {floor_us:.1f} us ({b} x {STACK + 1} frames at {gbps:.1f} GB/s); 3x the best "
                  f"rival asks for {' / '.join(f'{x:.1f}' for x in asks)} us per round: {verdict}")
            summary[op]["floor_us"] = floor_us


def columns(rows: dict, threads) -> dict:
    """PEARL's row split into a column per gather thread count: pearl (one count) or pearl-tN."""
    if "pearl" not in rows or "unavailable" in rows["pearl"]:
        return rows
    pearl = rows.pop("pearl")
    shared = {key: value for key, value in pearl.items() if "@t" not in key}
    split = {}
    for n in threads:
        name = "pearl" if len(threads) == 1 else f"pearl-t{n}"
        split[name] = {**shared, **{key.split("@")[0]: value for key, value in pearl.items()
                                    if key.endswith(f"@t{n}")}}
    return {**split, **rows}


def report(capacity, batches, rounds: list[dict]) -> dict:
    ops = ["insert"] + [f"{kind}_{b}" for b in batches for kind in ("uniform", "per")]
    print(f"\ncapacity {capacity:,} transitions, {STACK}x{FRAME[0]}x{FRAME[1]} uint8: median us per call, "
          f"ours/best rival per round (lower: ours faster)")
    summary = {}
    ours_columns = [n for n in rounds[0] if n.startswith("pearl")]
    for op in ops:
        cells, ratios, best_rival = [], {n: [] for n in ours_columns}, []
        for r, rows in enumerate(rounds):
            rivals = {n: rows[n][op] for n in rows if not n.startswith("pearl") and op in rows[n]}
            cells.append(" ".join(f"{n}={rows[n][op]:.1f}" for n in rows if op in rows[n]))
            if rivals:
                best_rival.append(min(rivals.values()))
            for n in ours_columns:
                if op in rows[n] and rivals:
                    ratios[n].append(rows[n][op] / best_rival[-1])
        summary[op] = {"best_rival_us": best_rival} if best_rival else {}
        text = []
        for n, values in ratios.items():
            if values:
                median = float(np.median(values))
                summary[op][n] = {"ratios": values, "median": median}
                text.append(f"{n} ratios {' '.join(f'{x:.3f}' for x in values)} median {median:.3f}")
        print(f"  {op:<12} " + " | ".join(cells) + ("   " + "; ".join(text) if text else ""))
    unique = capacity * FRAME_BYTES
    for name in rounds[0]:
        grown = [rows[name]["rss_per_table"] for rows in rounds if "rss_per_table" in rows.get(name, {})]
        huge = [rows[name]["huge_pages_per_table"] for rows in rounds if "huge_pages_per_table" in rows.get(name, {})]
        if grown:
            print(f"  memory {name:<9} RSS growth per table {np.median(grown) / 2**30:.2f} GiB = "
                  f"{np.median(grown) / unique:.3f}x the unique frames' {unique / 2**30:.2f} GiB"
                  + (f", {np.median(huge) / 2**30:.2f} GiB of it on huge pages" if huge else ""))
        for rows in rounds:
            if "unavailable" in rows.get(name, {}):
                print(f"  {name}: {rows[name]['unavailable']}")
                break
    return summary


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--capacity", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--batches", type=int, nargs="+", default=[32, 256])
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=SYSTEMS)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--worker", choices=SYSTEMS, help=argparse.SUPPRESS)
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--gather-threads", type=int, nargs="+", default=[1], choices=[1, 2],
                        help="PEARL's replay.gather_threads values, each a column (default: 1)")
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args)
    print(f"CPU: {cpu_model()}; load average {os.getloadavg()}")
    bandwidth = {n: streaming_read_gbps(n) for n in (1, 2)}
    print("streaming read from memory (the best of 4 KB and 35 KB chunks): " + ", ".join(f"{n} thread(s) {g:.1f} GB/s"
                                                                   for n, g in bandwidth.items()))
    results = {"cpu": cpu_model(), "streaming_read_gbps": bandwidth, "runs": {}}
    for capacity in args.capacity:
        rounds = []
        for r in range(args.rounds):
            order = args.systems if r % 2 == 0 else args.systems[::-1]  # interleaved, alternating order
            rows = {}
            for system in order:
                start = time.perf_counter()
                rows[system] = run_one(system, capacity, args.batches, args.repeats, args.seed + r,
                                       args.gather_threads)
                print(f"  [round {r}] {system}: {time.perf_counter() - start:.0f} s, load {os.getloadavg()[0]:.2f}",
                      flush=True)
            rounds.append(columns({name: rows[name] for name in args.systems}, args.gather_threads))
        summary = report(capacity, args.batches, rounds)
        report_floor(args.batches, bandwidth, summary)
        results["runs"][capacity] = {"rounds": rounds, "summary": summary}
    print(f"load average at the end {os.getloadavg()}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
