"""What a full frame table's checkpoint costs in memory and time (issue 16): a table of `capacity`
84 x 84 uint8 records, filled, then `state_dict` + `np.savez` as pearl/checkpoint.py writes a run's
checkpoint, in a fresh process per way, the ways interleaved over `--rounds`:
  own       the state's rows are the table's own arrays (FrameReplay.state_dict(): a full table)
  detached  a copy of them (state_dict(detached=True): the replay server's snapshot; every state
            was a copy before session 27)
Reported: the process's RSS before the checkpoint, its peak (ru_maxrss), the file's size and the
seconds state_dict + savez took (the file goes to a temporary directory under --dir, removed after).

    python benchmarks/frame_checkpoint.py --capacity 300000 --rounds 2
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from pearl.kernels.cpu.backend import cpu_model, proc_bytes  # noqa: E402

WAYS = ("own", "detached")


def rss_gib() -> float:
    return (proc_bytes("/proc/self/status", "VmRSS") or 0) / 2**30


def worker(capacity: int, way: str, directory: str) -> dict:
    from pearl.replay.frames import FrameReplay

    table = FrameReplay(capacity, (84, 84), 4, streams=1)
    rng = np.random.default_rng(0)
    pool = rng.integers(0, 256, (256, 84, 84), dtype=np.uint8)
    rows = 1000
    zeros = np.zeros(rows, np.int64), np.zeros(rows, np.float32), np.zeros(rows, bool)
    for _ in range(0, capacity + rows, rows):  # one ring, past full
        frames = pool[rng.integers(0, 256, rows)]
        table.add(zeros[0], frames, zeros[0], zeros[1], frames, zeros[2], zeros[2])
    before = rss_gib()
    with tempfile.TemporaryDirectory(dir=directory) as scratch:
        path = os.path.join(scratch, "checkpoint.npz")
        start = time.perf_counter()
        state = table.state_dict(detached=way == "detached")
        np.savez(path, **{name: value for name, value in state.items() if isinstance(value, np.ndarray)})
        seconds = time.perf_counter() - start
        size = os.path.getsize(path)
    return {"rss_before_gib": before, "peak_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
            "file_gib": size / 2**30, "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--capacity", type=int, default=300_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="where the checkpoint files go")
    parser.add_argument("--worker", choices=WAYS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print("RESULT " + json.dumps(worker(args.capacity, args.worker, args.dir)))
        return
    print(f"# frame table checkpoint, capacity {args.capacity:,} x 84x84 uint8; CPU: {cpu_model()}; "
          f"load {os.getloadavg()[0]:.2f}")
    print(f"{'round':>5} {'way':>9} {'RSS before GiB':>15} {'peak GiB':>9} {'file GiB':>9} {'seconds':>8}")
    for round_index in range(args.rounds):
        for way in WAYS if round_index % 2 == 0 else WAYS[::-1]:
            done = subprocess.run([sys.executable, __file__, "--worker", way, "--capacity", str(args.capacity),
                                   "--dir", args.dir], capture_output=True, text=True)
            lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
            if not lines:
                print(f"{round_index:>5} {way:>9} failed: {(done.stderr.strip().splitlines() or ['?'])[-1][:200]}")
                continue
            r = json.loads(lines[0][7:])
            print(f"{round_index:>5} {way:>9} {r['rss_before_gib']:>15.2f} {r['peak_gib']:>9.2f} {r['file_gib']:>9.2f} "
                  f"{r['seconds']:>8.1f}")


if __name__ == "__main__":
    main()
