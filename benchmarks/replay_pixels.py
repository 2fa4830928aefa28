"""Pixel replay benchmark (issue 16): 4 x 84 x 84 uint8 stacked frames, PEARL's frame table
(pearl/replay/frames.py) vs cpprb and Tianshou at their frame-saving settings, one run.

Each system runs in its own worker process (so its resident memory is its own), which builds and
fills a uniform table of `capacity` transitions (episodes of 1000 steps, frames from a pool of
random ones), then a prioritized one after dropping the first. While a table is alive the
coordinator times it operation by operation, the median of `repeats` calls of
  insert          one env step (the actor's add), in the form each system's writer hands it over:
                  PEARL's actor the step's arrays (pearl/runtime/actor.py `step`: stream ids, the
                  stacks' newest frames, actions, rewards, terminated, truncated; one row each),
                  cpprb the step's fields, Tianshou a Batch of them (its collector's form; the
                  rivals' times move < 5% with arrays instead of scalars, measured)
  uniform_B       uniform sample of B transitions (obs and next obs stacks, actions, rewards, dones)
  per_B           prioritized sample of B + priority update of the B sampled (the learner's path)
each block after one read of every page of the worker's memory (touch_pages), WARMUP_CALLS untimed
calls of each operation and BLOCK_WARMUP_CALLS before each of its later blocks (every system
alike). The systems' tables are
alive side by side and take an operation's repeats in `--blocks` blocks in turn (order reversed
every other block): this shared host changes pace from one second to the next, and systems timed
one after another minutes apart measured its state as much as their own (session 54: PEARL's
worker in a slow phase, the bare copy below 37% slower than in the next round). Where the tables
of all the systems do not fit in memory together (1M: ~7.6 GB each), one system at a time, said
so in the output. Reported: each table's resident set (RSS) growth while built and filled (the
median of the two) against the unique frames' bytes (capacity x 84 x 84). The rivals, each at its
own memory-saving setting:
  cpprb      ReplayBuffer / PrioritizedReplayBuffer with next_of="obs", stack_compress="obs"
             (frames stacked on the last axis, its convention; each frame stored once)
  tianshou   ReplayBuffer / PrioritizedReplayBuffer with stack_num=4, save_only_last_obs=True,
             ignore_obs_next=True (frames stored once, stacks built at sample time)
Rounds (seeds) build fresh tables; ratios are ours / best rival in time (lower is faster), per
round and their median. A system whose table would not fit in the memory available now is skipped
with the reason. The rivals are single-threaded; `--gather-threads 1 2` times PEARL's samples with
`gather_threads` 1 and 2 (replay.gather_threads: the batch's frames copied on numba's 2-thread
pool) on the same tables, each count a job of the blocks, as columns pearl-t1 and pearl-t2 (insert
does not use them: timed once).

Each capacity's report ends with this host's floor for the sample rows: any sampler of B 1-step
transitions copies B windows of STACK + 1 frames from random places of a table far larger than the
caches. PEARL's worker times that copy alone on its own uniform table (`bare_copy_us`:
benchmarks/window_copy.cpp, built here with g++ -O3 -march=native; 8 windows a cache line each in
turn, on PEARL's most gather threads, the second spin-waiting; no draw, no metadata, no Python) in
the blocks of the uniform samples of B, and the report sets it beside the best rival of each
round: where the bare copy takes more than a third of the rival's time, no sampler that copies
the windows reaches 3x on this host.

    python benchmarks/replay_pixels.py --capacity 100000 --rounds 2 --repeats 300 --gather-threads 1 2
    python benchmarks/replay_pixels.py --capacity 1000000 --rounds 1 --repeats 200 --gather-threads 2 --systems pearl cpprb

(the second: cpprb is the best rival of every sample cell, and two 1M tables fit in 23 GB together
where three do not; Tianshou is the insert's best rival, measured at 100k.)
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from functools import lru_cache
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from timing import call_times_us  # noqa: E402  (benchmarks/ is the script's own directory)
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
# Untimed calls at the start of every later block, every system alike: at 1M on the KVM Xeon of
# session 56, in a run without them each block that followed another system's ran 1.5-3x slower
# than the first block for all of its 20 calls, every system alike (cpprb's PER 32: 322 us in block
# 0, 415-605 in the others; PEARL's bare C++ copy 52 -> 100-280 us); in the next run, with 40 first,
# every block ran near the first one's pace (cpprb 301-318, PEARL 71-119). One run each: they take
# out a block's first calls after the switch, not the host's slow phases (docs/BENCHMARKS.md)
BLOCK_WARMUP_CALLS = 40


def rss_bytes() -> int:
    return proc_bytes("/proc/self/status", "VmRSS") or 0


def touch_pages() -> int:
    """Reads one byte of every 4 KiB page of the process's private writable memory (its tables', whatever
    the system) and returns how many pages that read. These KVM hosts make memory that lay unread
    for a while slow to read again, page by page, until each page is read once (a 1M table unread for
    the 150 s a rival takes to fill its own: samples of 32 at ~700 us, ~60 us after this pass;
    docs/BENCHMARKS.md, Pixel replay, sessions 56-57). A table in a run is read without such pauses,
    so every worker pays this before each block, untimed, whatever the system."""
    pages = 0
    with open("/proc/self/maps") as maps:
        regions = [line.split() for line in maps]
    for fields in regions:
        if fields[1] != "rw-p" or (len(fields) > 5 and fields[5] != "[heap]"):
            continue  # (only anonymous private memory: not files, stacks' guards, or shared mappings)
        start, end = (int(x, 16) for x in fields[0].split("-"))
        first_bytes = np.ctypeslib.as_array((ctypes.c_uint8 * (end - start)).from_address(start))[::4096]
        first_bytes.max()
        pages += first_bytes.size
    return pages


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


def serve(system, capacity, batches, seed, commands, reply) -> None:
    """A worker's life: warm up, then one table at a time (uniform, then prioritized) built and
    filled, its RSS growth and huge pages reported (READY), and timing blocks run as the
    coordinator asks (TIMES: the block's us per call), each after touch_pages, until it moves on to
    the next table."""
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
    for kind in ("uniform", "prioritized"):
        before, huge_before = rss_bytes(), huge_page_bytes()
        table = system.make(kind, capacity)
        system.fill(table, Steps(seed, system.last_axis), capacity + STACK)  # full, and wrapped a little
        reply("READY", {"rss": rss_bytes() - before, "huge": huge_page_bytes() - huge_before})
        if kind == "prioritized":
            system.prioritize(table, capacity, rng)
        calls = operations(system, table, kind, batches, seed, rng)
        for command in commands:
            if command["op"] == "next":
                break
            touch_pages()  # the table lay unread while the other systems took their blocks
            reply("TIMES", calls[command["op"]](command["threads"], command["calls"], command["warmup"]))
        del table, calls
        gc.collect()


def operations(system, table, kind, batches, seed, rng) -> dict:
    """{op: run(threads, calls, warmup) -> us per timed call} of a table: insert and uniform_B on
    a uniform table (PEARL's bare_copy_B too), per_B on a prioritized one; `threads` is PEARL's
    gather thread count (the rivals' is 1)."""
    def timed(call):
        def run(threads, calls, warmup):
            if system is Pearl:
                table.gather_threads = threads
            return call_times_us(call, calls, warmup)
        return run

    if kind == "prioritized":
        tds = {b: np.abs(rng.normal(size=b)) for b in batches}
        return {f"per_{b}": timed(lambda b=b: system.sample_update(table, b, tds[b], rng)) for b in batches}
    one = system.step_record(Steps(seed + 1, system.last_axis).step())
    ops = {"insert": timed(lambda: system.insert(table, one))}
    for b in batches:
        ops[f"uniform_{b}"] = timed(lambda b=b: system.sample(table, b, rng))
        if system is Pearl:
            ops[f"bare_copy_{b}"] = lambda threads, calls, warmup, b=b: bare_copy_block(table, b, threads, calls,
                                                                                         warmup, rng)
    return ops


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
    """--worker SYSTEM: serve one system's tables to the coordinator over stdin / stdout, a JSON
    line each way (UNAVAILABLE where the system is not installed)."""
    def reply(kind, value):
        print(kind + " " + json.dumps(value), flush=True)

    try:  # (a rival's import happens at its first table, the warm-up's, before any READY)
        serve(BENCHES[args.worker], args.capacity[0], args.batches, args.seed,
              (json.loads(line) for line in sys.stdin), reply)
    except ImportError as err:
        reply("UNAVAILABLE", f"not installed ({err.name})")
    return 0


class Worker:
    """One system's worker process, its tables alive while the coordinator times them."""

    def __init__(self, system, capacity, batches, seed):
        self.system = system
        command = [sys.executable, __file__, "--worker", system, "--capacity", str(capacity), "--seed", str(seed),
                   "--batches", *map(str, batches)]
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.unavailable, self.grown, self.huge = None, [], []

    def expect(self, kind):
        for line in self.process.stdout:
            head, _, value = line.partition(" ")
            if head == "UNAVAILABLE":
                self.unavailable = json.loads(value)
                return None
            if head == kind:
                return json.loads(value)
        self.ended()
        return None

    def ended(self):
        """A worker gone (an error, or killed: a table larger than memory once it filled)."""
        self.unavailable = f"worker ended (exit {self.process.wait()})"

    def send(self, command) -> bool:
        try:
            self.process.stdin.write(json.dumps(command) + "\n")
            self.process.stdin.flush()
            return True
        except BrokenPipeError:
            self.ended()
            return False

    def ready(self) -> bool:
        """Waits for the next table: False where the system is unavailable."""
        memory = None if self.unavailable else self.expect("READY")
        if memory:
            self.grown.append(memory["rss"])
            self.huge.append(memory["huge"])
        return memory is not None

    def time(self, op, threads, calls, warmup) -> list:
        if self.unavailable or not self.send({"op": op, "threads": threads, "calls": calls, "warmup": warmup}):
            return []
        return self.expect("TIMES") or []

    def next(self):
        if not self.unavailable:
            self.send({"op": "next"})

    def close(self):
        try:
            self.process.stdin.close()
        except BrokenPipeError:
            pass
        self.process.wait()


def jobs(op, workers, threads) -> list:
    """(worker, the worker's operation, key, gather threads) of every system that times `op`: each
    rival once; PEARL once per gather thread count (key op@tN; insert once), and beside its uniform
    samples of B the bare copy of B windows (the floor, timed in the same blocks as the rivals)."""
    out = []
    for w in workers:
        if w.system != "pearl":
            out.append((w, op, op, 1))
        elif op == "insert":
            out.append((w, op, op, max(threads)))
        else:
            out += [(w, op, f"{op}@t{n}", n) for n in threads]
            if op.startswith("uniform_"):
                bare = op.replace("uniform_", "bare_copy_")
                out.append((w, bare, bare, max(threads)))
    return out


def time_interleaved(op, workers, threads, repeats, blocks) -> dict:
    """{(system, key): median us} of `op` on every worker's live table: `repeats` calls in `blocks`
    blocks taken by the systems in turn (order reversed every other block), so that the host's
    changes of pace fall on every system alike; each block after WARMUP_CALLS untimed calls (the
    first) or BLOCK_WARMUP_CALLS (the others)."""
    todo = jobs(op, workers, threads)
    times = {(w.system, key): [] for w, _, key, _ in todo}
    for block in range(blocks):
        for w, worker_op, key, n in todo if block % 2 == 0 else todo[::-1]:
            warmup = WARMUP_CALLS if block == 0 else BLOCK_WARMUP_CALLS
            times[w.system, key] += w.time(worker_op, n, repeats // blocks, warmup)
    return {name: float(np.median(values)) for name, values in times.items() if values}


def run_round(systems, capacity, batches, repeats, blocks, seed, threads) -> dict:
    """One round: each system's worker with its tables, timed side by side in interleaved blocks;
    where the tables of all the systems do not fit in memory together, one system at a time."""
    need = capacity * FRAME_BYTES * 1.15  # one table of one frame per transition, plus headroom
    free = memory_available() - 2 * 2**30
    if need > free:
        return {name: {"unavailable": f"needs ~{need / 2**30:.1f} GiB, {free / 2**30:.1f} GiB available"}
                for name in systems}
    together = len(systems) * need <= free
    groups = [list(systems)] if together else [[name] for name in systems]
    rows = {name: {} for name in systems}
    for group in groups:
        workers = [Worker(name, capacity, batches, seed) for name in group]
        try:
            for kind, ops in (("uniform", ["insert"] + [f"uniform_{b}" for b in batches]),
                              ("prioritized", [f"per_{b}" for b in batches])):
                live = [w for w in workers if w.ready()]
                for op in ops:
                    start = time.perf_counter()
                    for (name, key), us in time_interleaved(op, live, threads, repeats, blocks).items():
                        rows[name][key] = us
                    print(f"  {op}: {time.perf_counter() - start:.0f} s, load {os.getloadavg()[0]:.2f}"
                          + ("" if together else f" ({group[0]} alone)"), flush=True)
                for w in live:
                    w.next()
        finally:
            for w in workers:
                w.close()
        for w in workers:
            if w.unavailable:
                rows[w.system] = {"unavailable": w.unavailable}
            elif w.grown:
                rows[w.system].update(rss_per_table=float(np.median(w.grown)),
                                      huge_pages_per_table=float(np.median(w.huge)))
    if not together:
        print(f"  (the {len(systems)} systems' tables do not fit in memory together: timed one system at a time)")
    return rows


WINDOW_COPY = Path(__file__).with_name("window_copy.cpp")


@lru_cache(maxsize=None)
def window_copy_library() -> ctypes.CDLL:
    """benchmarks/window_copy.cpp built for this host and loaded (pearl.kernels.fpga.build's
    CompilerMissing, one line, where there is no C++ compiler)."""
    from pearl.kernels.fpga.build import compiler

    folder = tempfile.mkdtemp(prefix="pearl-window-copy-")
    try:
        target = os.path.join(folder, "window_copy.so")
        subprocess.run([compiler()[0], "-O3", "-march=native", "-shared", "-fPIC", "-pthread", str(WINDOW_COPY),
                        "-o", target], check=True, capture_output=True, text=True)
        library = ctypes.CDLL(target)
    finally:
        shutil.rmtree(folder)  # (a loaded library stays mapped)
    pointer, long_ = ctypes.c_void_p, ctypes.c_long
    library.time_window_copies.argtypes = [pointer, long_, long_, pointer, ctypes.c_int, ctypes.c_int, pointer,
                                           ctypes.c_int, pointer]
    return library


def bare_copy_us(frames: np.ndarray, first_rows: np.ndarray, batch: int, threads: int,
                 out: np.ndarray | None = None) -> np.ndarray:
    """Wall us of each batch of `batch` windows of STACK + 1 rows of `frames` ((rows, bytes) uint8,
    C-contiguous) copied into `out` by window_copy.cpp on `threads` (1 or 2) threads: the windows
    start at `first_rows`, batch after batch (len(first_rows) // batch batches)."""
    if frames.dtype != np.uint8 or frames.ndim != 2 or not frames.flags.c_contiguous:
        raise ValueError("bare_copy_us: frames must be a C-contiguous (rows, bytes) uint8 array")
    first_rows = np.ascontiguousarray(first_rows, np.int64)
    if first_rows.size and not (0 <= first_rows.min() and first_rows.max() <= frames.shape[0] - STACK - 1):
        raise ValueError(f"bare_copy_us: window starts must lie in [0, {frames.shape[0] - STACK - 1}]")
    if threads not in (1, 2):
        raise ValueError(f"bare_copy_us: threads 1 or 2, got {threads}")
    calls, span = first_rows.shape[0] // batch, (STACK + 1) * frames.shape[1]
    out = np.empty(batch * span, np.uint8) if out is None else out
    if out.dtype != np.uint8 or out.size < batch * span or not out.flags.c_contiguous:
        raise ValueError(f"bare_copy_us: out must be a C-contiguous uint8 array of {batch * span} bytes or more")
    us = np.empty(calls)
    window_copy_library().time_window_copies(frames.ctypes.data, frames.shape[1], span, first_rows.ctypes.data,
                                             calls, batch, out.ctypes.data, threads, us.ctypes.data)
    return us


def bare_copy_block(table, batch: int, threads: int, calls: int, warmup: int, rng) -> list:
    """bare_copy_us of `calls` batches of random valid transitions' windows of PEARL's table, after
    `warmup` untimed ones; none where there is no C++ compiler (no floor is reported)."""
    from pearl.kernels.fpga.build import CompilerMissing

    try:
        window_copy_library()
    except CompilerMissing:
        return []
    frames = table.frames.reshape(table.capacity, -1)
    starts = rng.choice(table.valid_indices(), (warmup + calls) * batch) - (STACK - 1)
    return bare_copy_us(frames, np.clip(starts, 0, table.capacity - STACK - 1), batch, threads)[warmup:].tolist()


def report_floor(batches, rounds: list[dict], summary: dict) -> None:
    """The sample rows' floor on this host, each round's bare copy of the batch's windows (PEARL's
    worker's `bare_copy_B`), beside what 3x over that round's best rival (`report`'s summary) asks for."""
    for b in batches:
        bare = [next((rows[n][f"bare_copy_{b}"] for n in rows if f"bare_copy_{b}" in rows[n]), None)
                for rows in rounds]
        for kind in ("uniform", "per"):
            op = f"{kind}_{b}"
            best = summary.get(op, {}).get("best_rival_us")
            if not best or len(best) != len(rounds) or None in bare:
                continue
            asks = [x / 3 for x in best]
            left = [ask - copy for ask, copy in zip(asks, bare)]
            verdict = ("the copy alone takes more: no sampler that copies the windows reaches 3x here"
                       if max(left) < 0 else f"leaves {' / '.join(f'{x:.1f}' for x in left)} us for the rest")
            print(f"  floor {op:<12} bare copy of {b} windows {' / '.join(f'{x:.1f}' for x in bare)} us per round "
                  f"(= {' / '.join(f'{c / r:.3f}' for c, r in zip(bare, best))} of the best rival); 3x asks for "
                  f"{' / '.join(f'{x:.1f}' for x in asks)} us: {verdict}")
            summary[op]["bare_copy_us"] = bare


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
    parser.add_argument("--blocks", type=int, default=10,
                        help="blocks each operation's repeats are split into, the systems taking them in turn")
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
    results = {"cpu": cpu_model(), "runs": {}}
    for capacity in args.capacity:
        rounds = []
        for r in range(args.rounds):
            print(f"[capacity {capacity:,}, round {r}]", flush=True)
            rows = run_round(args.systems, capacity, args.batches, args.repeats, args.blocks, args.seed + r,
                             args.gather_threads)
            rounds.append(columns(rows, args.gather_threads))
        summary = report(capacity, args.batches, rounds)
        report_floor(args.batches, rounds, summary)
        results["runs"][capacity] = {"rounds": rounds, "summary": summary}
    print(f"load average at the end {os.getloadavg()}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
