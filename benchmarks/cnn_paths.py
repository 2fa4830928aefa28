"""Which CPU path runs the CNN Q-network's update and act fastest: the default (NCHW, oneDNN),
channels_last memory format, oneDNN off (torch's native convolution), torch.compile; 1 and 2
threads. One DQN update (double DQN: three forwards, one backward, Adam) on a batch of uint8 frames,
and one act (a single observation), for the Nature DQN stack on 4x84x84 and MinAtar's on 4x10x10.

    python benchmarks/cnn_paths.py [--repeats 30]

Paths are interleaved (round-robin over the repeats) so that the load of a shared machine falls on
all alike; prints the median ms per call.
"""
from __future__ import annotations

import argparse
import contextlib
import platform
import statistics
import time

import numpy as np
import torch

from pearl.algos.dqn import DQN
from pearl.config import DQNConfig

NETS = {"nature 4x84x84": ((4, 84, 84), [[32, 8, 4], [64, 4, 2], [64, 3, 1]], [512], 1 / 255, 255),
        "minatar 4x10x10": ((4, 10, 10), [[16, 3, 1]], [128], 1.0, 2)}


def make(name: str, path: str, batch: int):
    shape, conv, hidden, scale, high = NETS[name]
    algo = DQN(int(np.prod(shape)), 4, DQNConfig(hidden=hidden, conv=conv), 1000, 0, obs_shape=shape, obs_scale=scale)
    if path == "channels_last":
        algo.online.to(memory_format=torch.channels_last)
        algo.target.to(memory_format=torch.channels_last)
    if path == "compile":
        algo.online.forward = torch.compile(algo.online.forward)
        algo.target.forward = torch.compile(algo.target.forward)
    rng = np.random.default_rng(0)
    obs = torch.from_numpy(rng.integers(0, high, (batch, *shape), dtype=np.uint8))
    batch_args = (obs, torch.from_numpy(rng.integers(0, 4, batch)), torch.zeros(batch), obs, torch.full((batch,), 0.99))
    one = obs[:1]

    def update():
        algo.update(*batch_args)

    def act():
        with torch.inference_mode():
            algo.online(one).argmax(1)
    return update, act


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor())
    print(f"# CPU: {cpu}; torch {torch.__version__}; batch {args.batch}; load {open('/proc/loadavg').read().split()[:3]}")
    paths = ("default", "channels_last", "no_onednn", "compile")
    for name in NETS:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            runs = {}
            for path in paths:
                with (no_onednn() if path == "no_onednn" else contextlib.nullcontext()):
                    update, act = make(name, path, args.batch)
                    for _ in range(3):  # warm-up (and compilation)
                        update(); act()
                runs[path] = (update, act, [], [])
            for _ in range(args.repeats):
                for path, (update, act, updates, acts) in runs.items():
                    with (no_onednn() if path == "no_onednn" else contextlib.nullcontext()):
                        t = time.perf_counter(); update(); updates.append(time.perf_counter() - t)
                        t = time.perf_counter(); act(); acts.append(time.perf_counter() - t)
            for path, (_, _, updates, acts) in runs.items():
                print(f"{name:16s} threads {threads}  {path:14s} update {statistics.median(updates) * 1e3:8.2f} ms"
                      f"   act {statistics.median(acts) * 1e3:7.3f} ms")
    print(f"# load after: {open('/proc/loadavg').read().split()[:3]}")


@contextlib.contextmanager
def no_onednn():
    with torch.backends.mkldnn.flags(enabled=False):
        yield


if __name__ == "__main__":
    main()
