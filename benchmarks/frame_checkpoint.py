"""What a full frame table's checkpoint costs in memory and time (issue 16): a table of `capacity`
84 x 84 uint8 records, filled, written by the run's own checkpoint code (pearl/checkpoint.py's
`save_checkpoint` of the table's state, as `Agent.checkpoint` writes it) and read back into a fresh
table as `pearl.load` / `--resume` do (`load_checkpoint`, `check_state`, `load_state_dict`), each
in a fresh process, over `--rounds` (the file goes to a temporary directory under --dir, removed
after each round).

And `--server`: the same table filled on a replay server in this process (loopback), whose
checkpoint a client asks for (`pearl replay-server`'s, written while it serves).

And `--run`: what a run's periodic checkpoint costs the run. An agent of configs/breakout_dqn.yaml
(the Nature CNN) with a table of `capacity`, filled, writes its checkpoint as a run did before
(`Agent.checkpoint(path)`: the run waits until the file is on disk) and as it does now
(`checkpoint(path, background=True)`: the frames are written by a thread), interleaved; meanwhile
the caller adds one env step every 2 ms (faster than an Atari run with learning inserts on 2
cores, ~210 env steps/s) until the file is
complete. Reported: the seconds the caller was held ("pause"), until the file was complete, the
adds made meanwhile and the slowest one (an add waits while a block it overwrites is copied).

Reported per step: the process's anonymous memory (RssAnon: what cannot be reclaimed) before, and
its peak, sampled every 5 ms by a thread; ru_maxrss, which also counts file pages the process maps
or touches (the page cache gives those back under pressure); the file's size and the seconds.

And `--ray`: a ray run's checkpoint of a frame table held by a replay shard (pearl/runtime/ray_replay.py
ReplayShard, a Ray actor on a local Ray, the table loaded into it first): the table gathered as
before (the shard's detached state through Ray's object store, merged: "pull") and as now (the
shard's snapshot, then its frames read through `ShardFrames` into the file: "stream"), each
round in a fresh process and a fresh Ray. Memory there is the driver's and the shard's anonymous
memory plus what Ray's object store holds in /dev/shm, sampled together.

    python benchmarks/frame_checkpoint.py --capacity 300000 --rounds 2 [--server | --run | --ray]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from pearl.kernels.cpu.backend import cpu_model, proc_bytes  # noqa: E402

STEPS = ("save", "load")
RUN_STEPS = ("at-once", "background")
RAY_STEPS = ("pull", "stream")
ADD_EVERY_S = 0.002


def anon_gib() -> float:
    return (proc_bytes("/proc/self/status", "RssAnon") or 0) / 2**30


class Peak:
    """The largest value of `measure()` (GiB; default this process's anonymous memory) seen while
    the block runs, sampled every 5 ms."""

    def __init__(self, measure=None):
        self.measure = measure or anon_gib

    def __enter__(self):
        self.peak, self._done = self.measure(), threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def _watch(self):
        while not self._done.wait(0.005):
            self.peak = max(self.peak, self.measure())

    def __exit__(self, *exc):
        self._done.set()
        self._thread.join()
        self.peak = max(self.peak, self.measure())


def table(capacity: int):
    from pearl.replay.frames import FrameReplay

    return FrameReplay(capacity, (84, 84), 4, streams=1)


def fill(replay, capacity: int) -> None:
    rng = np.random.default_rng(0)
    pool = rng.integers(0, 256, (256, 84, 84), dtype=np.uint8)
    rows = 1000
    zeros = np.zeros(rows, np.int64), np.zeros(rows, np.float32), np.zeros(rows, bool)
    for _ in range(0, capacity + rows, rows):  # one ring, past full
        frames = pool[rng.integers(0, 256, rows)]
        replay.add(zeros[0], frames, zeros[0], zeros[1], frames, zeros[2], zeros[2])


def save(capacity: int, path: str) -> dict:
    from pearl.checkpoint import save_checkpoint, split_state

    replay = table(capacity)
    fill(replay, capacity)
    before = anon_gib()
    start = time.perf_counter()
    with Peak() as peak:
        plain, arrays = split_state("replay", replay.state_dict())
        save_checkpoint(path, {"replay": plain}, arrays)
    return {"before": before, "peak": peak.peak, "seconds": time.perf_counter() - start,
            "file_gib": os.path.getsize(path) / 2**30}


def load(capacity: int, path: str) -> dict:
    from pearl.checkpoint import check_state, join_state, load_checkpoint

    replay = table(capacity)
    before = anon_gib()
    start = time.perf_counter()
    with Peak() as peak:
        header, arrays = load_checkpoint(path)
        check_state(path, "replay", header["replay"], arrays, replay.state_dict(), capacity)
        replay.load_state_dict(join_state("replay", header["replay"], arrays))
        del arrays
    seconds = time.perf_counter() - start
    assert replay.inserted >= capacity
    return {"before": before, "peak": peak.peak, "seconds": seconds, "file_gib": os.path.getsize(path) / 2**30}


def server(capacity: int, path: str) -> dict:
    from pearl.server.client import ReplayClient
    from pearl.server.config import ServerConfig, TableConfig
    from pearl.server.server import ReplayServer

    config = ServerConfig(table=TableConfig(capacity=capacity, obs_shape=(84, 84), obs_dtype="uint8", frame_stack=4),
                          bind="tcp://127.0.0.1:0", checkpoint_dir=os.path.dirname(path))
    replay_server = ReplayServer(config).start()
    try:
        fill(replay_server.service.table, capacity)
        client = ReplayClient(replay_server.address, timeout=600)
        before = anon_gib()
        start = time.perf_counter()
        with Peak() as peak:
            info = client.checkpoint()
        seconds = time.perf_counter() - start
        client.close()
    finally:
        replay_server.stop()
    written = sum(f.stat().st_size for f in Path(info["path"]).iterdir())
    return {"before": before, "peak": peak.peak, "seconds": seconds, "file_gib": written / 2**30}


def run(capacity: int, path: str, background: bool) -> dict:
    import pearl
    from pearl.config import parse_config, read_yaml

    settings = read_yaml(Path(__file__).resolve().parent.parent / "configs" / "breakout_dqn.yaml")
    settings["replay"]["capacity"] = capacity
    agent = pearl.make_agent(parse_config(settings))
    replay = agent.parts.replay
    replay.rate_limiter = None  # (the fill stands for a run's history; no learner samples here)
    fill(replay, capacity)
    step = [np.zeros(1, np.int64), np.zeros((1, 84, 84), np.uint8), np.zeros(1, np.int64), np.zeros(1, np.float32),
            np.zeros((1, 84, 84), np.uint8), np.zeros(1, bool), np.zeros(1, bool)]
    adds = []
    before = anon_gib()
    with Peak() as peak:
        start = time.perf_counter()
        agent.checkpoint(path, background=background)
        paused = time.perf_counter() - start
        writing = agent._checkpointing
        while writing is not None and writing.is_alive():
            time.sleep(ADD_EVERY_S)
            began = time.perf_counter()
            replay.add(*step)
            adds.append(time.perf_counter() - began)
        agent.finish_checkpoint()
        seconds = time.perf_counter() - start
    return {"before": before, "peak": peak.peak, "seconds": seconds, "paused": paused, "adds": len(adds),
            "slowest_add_ms": 1e3 * max(adds, default=0.0), "file_gib": os.path.getsize(path) / 2**30}


def shm_gib() -> float:
    stat = os.statvfs("/dev/shm")
    return (stat.f_blocks - stat.f_bfree) * stat.f_frsize / 2**30


def ray_memory(pid: int):
    """This process's and shard process `pid`'s anonymous memory and Ray's object store (/dev/shm)."""
    return lambda: anon_gib() + (proc_bytes(f"/proc/{pid}/status", "RssAnon") or 0) / 2**30 + shm_gib()


def ray_shard(capacity: int, path: str, streaming: bool) -> dict:
    os.environ.update(RAY_USAGE_STATS_ENABLED="0", RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    import ray

    from pearl.checkpoint import save_checkpoint, split_state
    from pearl.runtime.ray_replay import FrameShards, ReplayShard, ShardFrames, server_keys
    from pearl.server.config import TableConfig

    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=int(1.2 * capacity * 7056) + (256 << 20),
             _node_ip_address="127.0.0.1")
    try:
        with tempfile.TemporaryDirectory() as keydir:
            keys = server_keys(keydir)
            config = TableConfig(capacity=capacity, obs_shape=(84, 84), obs_dtype="uint8", frame_stack=4)
            shard = ray.remote(ReplayShard).options(num_cpus=0).remote(config, 64, keys["server"], keys["client"][0])
            _, pid = ray.get(shard.where.remote(), timeout=120)
            source = table(capacity)
            fill(source, capacity)
            ray.get(shard.load.remote(source.state_dict(detached=True), source.inserted), timeout=600)
            del source
            layout = FrameShards(1, capacity, 1)
            time.sleep(1.0)  # (Ray frees the loaded state's object)
            with Peak(ray_memory(pid)) as peak:
                before = peak.peak
                start = time.perf_counter()
                if streaming:
                    state, steps = ray.get(shard.snapshot.remote(0), timeout=600)
                    merged = layout.merge([state], steps, {})
                    frames = ShardFrames([shard], layout, merged["counts"], 0, 84 * 84)
                    plain, arrays = split_state("replay", merged)
                    save_checkpoint(path, {"replay": plain}, arrays, frames)
                else:
                    state, steps = ray.get(shard.state.remote(), timeout=600)
                    plain, arrays = split_state("replay", layout.merge([state], steps, {}))
                    del state
                    save_checkpoint(path, {"replay": plain}, arrays)
                seconds = time.perf_counter() - start
            ray.get(shard.close.remote(), timeout=60)
    finally:
        ray.shutdown()
    return {"before": before, "peak": peak.peak, "seconds": seconds, "file_gib": os.path.getsize(path) / 2**30}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--capacity", type=int, default=300_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="where the checkpoint files go")
    parser.add_argument("--server", action="store_true", help="a replay server's checkpoint instead")
    parser.add_argument("--run", action="store_true", help="a run's checkpoint: at once vs in the background")
    parser.add_argument("--ray", action="store_true", help="a ray shard's table: pulled and merged vs streamed")
    parser.add_argument("--worker", choices=(*STEPS, "server", *RUN_STEPS, *RAY_STEPS), help=argparse.SUPPRESS)
    parser.add_argument("--path", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        result = {"save": save, "load": load, "server": server,
                  "at-once": lambda capacity, path: run(capacity, path, False),
                  "background": lambda capacity, path: run(capacity, path, True),
                  "pull": lambda capacity, path: ray_shard(capacity, path, False),
                  "stream": lambda capacity, path: ray_shard(capacity, path, True)}[args.worker](args.capacity, args.path)
        result["maxrss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        print("RESULT " + json.dumps(result))
        return
    print(f"# frame table checkpoint, capacity {args.capacity:,} x 84x84 uint8; CPU: {cpu_model()}; "
          f"load {os.getloadavg()[0]:.2f}")
    memory = "memory" if args.ray else "anon"  # (--ray: the driver's + the shard's anon + /dev/shm)
    print(f"{'round':>5} {'step':>10} {memory + ' before GiB':>16} {memory + ' peak GiB':>14} {'ru_maxrss GiB':>14} "
          f"{'file GiB':>9} {'seconds':>8}" + (f" {'pause s':>8} {'adds':>6} {'slowest add ms':>15}" if args.run else ""))
    for round_index in range(args.rounds):
        with tempfile.TemporaryDirectory(dir=args.dir) as scratch:
            path = os.path.join(scratch, "checkpoint.npz")
            for step in ("server",) if args.server else RUN_STEPS if args.run else RAY_STEPS if args.ray else STEPS:
                done = subprocess.run([sys.executable, __file__, "--worker", step, "--capacity", str(args.capacity),
                                       "--path", path], capture_output=True, text=True)
                lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
                if not lines:
                    print(f"{round_index:>5} {step:>10} failed: "
                          f"{(done.stderr.strip().splitlines() or ['?'])[-1][:200]}")
                    break
                r = json.loads(lines[0][7:])
                print(f"{round_index:>5} {step:>10} {r['before']:>16.2f} {r['peak']:>14.2f} {r['maxrss']:>14.2f} "
                      f"{r['file_gib']:>9.2f} {r['seconds']:>8.1f}" + (
                          f" {r['paused']:>8.3f} {r['adds']:>6} {r['slowest_add_ms']:>15.2f}" if args.run else ""))


if __name__ == "__main__":
    main()
