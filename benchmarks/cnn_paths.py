"""Which CPU path runs the CNN Q-network's DQN update fastest (issue 16). One update = double DQN's
three forwards (Q(s), Q(s'), Q_target(s')), the backward, gradient clipping and Adam, on a batch of
uint8 frames, through pearl's TorchLearner (the learner a run builds), for the Nature DQN stack on
4x84x84 and MinAtar's on 4x10x10, at 1 and 2 torch threads. Paths:

  fp32            the default: NCHW float32, oneDNN convolutions, torch's fused Adam (pearl.nets.adam)
  fp32_foreach    fp32 with torch's default (foreach) Adam: what Stable-Baselines3's DQN runs
  fp32_cl         channels_last float32 modules
  mkldnn_bf16     float32 modules, oneDNN told it may compute float32 convolutions and matmuls in
                  bfloat16 (torch.backends.mkldnn.{conv,matmul}.fp32_precision = "bf16")
  no_onednn       torch.backends.mkldnn disabled (torch's native convolutions)
  autocast        torch.autocast(cpu, bfloat16) around the float32 update (per-op casts)
  autocast_cl     autocast on channels_last modules
  bf16            learner_precision bf16: bfloat16 channels_last copies of the networks, float32
                  master weights and loss, Adam compiled with the copies' refresh (pearl.nets.BF16Copy,
                  kernels/cpu/bf16_adam.py)
  bf16_torch_step bf16 with session 11's optimizer step as torch ops: the copy's gradients into the
                  masters' float32 ones, clipping, torch's fused Adam, the copy refreshed
  bf16_separate_relu  bf16 with each convolution and its ReLU as two torch ops (before session 14's
                  fused ConvReLU)
  fp32_split, bf16_split  fp32 / bf16 with the batch split in two halves, each half's forwards and
                  backward on a thread of its own (TorchLearner(split_batch=True)); at "1 thread"
                  each of the two threads runs its ops on one: the learner a run with
                  runtime.torch_threads 2 builds
  compile         torch.compile of the networks' forward (float32; --compile, slow to build)

and the input conversion alone: a batch of uint8 frames to float32 NCHW and to bfloat16 channels_last
(torch's, and the bf16 path's compiled pass). The arithmetic: the fp32 update's FLOPs (convolutions
and matrix products, forward and backward, torch's FlopCounterMode), each path's rate at them, and a
1024^3 float32 GEMM's rate at the thread count, which no convolution beats: FLOPs / that rate is a
floor under any float32 update on this CPU (the ceiling of issue 16's Atari row there).

    python benchmarks/cnn_paths.py [--repeats 20] [--nets nature minatar] [--threads 1 2] [--compile]
        [--double 0]   (--double 0: the RL Zoo's update, two forwards; default double DQN's three)

Paths are interleaved (round-robin over the repeats) so that the load of a shared machine falls on
all alike. Prints, per path, the median over the repeats of the wall ms and of the process's CPU ms
(time.process_time: every thread of the process) per update, and the fp32 path's CPU time over the
path's (the speedup).
"""
from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch.utils.flop_counter import FlopCounterMode

from pearl.algos.dqn import DQN
from pearl.config import DQNConfig
from pearl.kernels.cpu.pixels import BF16_OF_BYTE, bytes_to_bf16_nhwc
from pearl.replay import Batch
from pearl.runtime.learners import TorchLearner

sys.path.insert(0, str(Path(__file__).resolve().parent))
from e2e_ddpg import gemm_peak  # noqa: E402  (benchmarks/ is the script's own directory)

NETS = {"nature": ((4, 84, 84), [[32, 8, 4], [64, 4, 2], [64, 3, 1]], [512], 1 / 255, 256),
        "minatar": ((4, 10, 10), [[16, 3, 1]], [128], 1.0, 2)}
PATHS = ("fp32", "fp32_cl", "fp32_foreach", "mkldnn_bf16", "no_onednn", "autocast", "autocast_cl", "bf16",
         "bf16_torch_step", "bf16_separate_relu", "fp32_split", "bf16_split")


@contextlib.contextmanager
def mkldnn_bf16():
    conv, matmul = torch.backends.mkldnn.conv, torch.backends.mkldnn.matmul
    saved = conv.fp32_precision, matmul.fp32_precision
    conv.fp32_precision = matmul.fp32_precision = "bf16"
    try:
        yield
    finally:
        conv.fp32_precision, matmul.fp32_precision = saved


CONTEXTS = {"mkldnn_bf16": mkldnn_bf16, "no_onednn": lambda: torch.backends.mkldnn.flags(enabled=False),
            "autocast": lambda: torch.autocast("cpu", torch.bfloat16),
            "autocast_cl": lambda: torch.autocast("cpu", torch.bfloat16)}


class TorchStepLearner(TorchLearner):
    """The bf16 learner with its optimizer step as torch ops (session 11's), for comparison."""

    def __init__(self, algo, device: str, precision: str):
        super().__init__(algo, device, precision)
        algo.optimizer = torch.optim.Adam(algo.online.parameters(), **{**algo.optimizer.defaults, "fused": True})

    def _update_bf16(self, *tensors, target):
        algo, low = self.algo, self._low["online"]
        loss, abs_td = algo.loss(*tensors, online=low, target=target)
        loss.backward()
        lows, masters = low._pairs
        for master in masters:
            if master.grad is None:
                master.grad = torch.zeros_like(master)
        with torch.no_grad():
            torch._foreach_copy_([master.grad for master in masters], [copy.grad for copy in lows])
            if low._scale != 1.0:
                low._first[1].grad.mul_(low._scale)
        for copy in lows:
            copy.grad = None
        norm = torch.nn.utils.get_total_norm([master.grad for master in masters])
        if bool(algo.config.max_grad_norm / (norm + 1e-6) < 1.0):
            torch.nn.utils.clip_grads_with_norm_(masters, algo.config.max_grad_norm, norm)
        algo.optimizer.step()
        low.refresh()
        return float(loss.detach()), abs_td


def make(net: str, path: str, batch: int, double: bool = True):
    shape, conv, hidden, scale, high = NETS[net]
    algo = DQN(int(np.prod(shape)), 4, DQNConfig(hidden=hidden, conv=conv, double=double), 1000, 0,
               obs_shape=shape, obs_scale=scale)
    if path in ("fp32_cl", "autocast_cl"):
        for module in algo.networks().values():
            module.to(memory_format=torch.channels_last)
    if path == "fp32_foreach":
        algo.optimizer = torch.optim.Adam(algo.online.parameters(), lr=algo.config.lr)
    if path == "compile":
        for module in algo.networks().values():
            module.forward = torch.compile(module.forward)
    precision = "bf16" if path.startswith("bf16") else "fp32"
    learner = (TorchStepLearner(algo, "cpu", precision) if path == "bf16_torch_step" else
               TorchLearner(algo, "cpu", precision, split_batch=path.endswith("split"),
                            threads=2 * torch.get_num_threads()))
    if path == "bf16_separate_relu":
        for low in learner._low.values():
            encoder = low.net.encoder
            encoder.convs = torch.nn.Sequential(*(m for layer in encoder.convs for m in (layer.conv, torch.nn.ReLU())))
    rng = np.random.default_rng(0)
    data = Batch(rng.integers(0, high, (batch, *shape), dtype=np.uint8), rng.integers(0, 4, batch),
                 np.zeros(batch, np.float32), rng.integers(0, high, (batch, *shape), dtype=np.uint8),
                 np.full(batch, 0.99, np.float32), indices=np.arange(batch))
    context = CONTEXTS.get(path, contextlib.nullcontext)

    def update():
        with context():
            learner.update(data)
    return update


def update_flops(net: str, batch: int, double: bool) -> float:
    """FLOPs of one fp32 update (after a warm-up one), as torch counts its convolutions and products."""
    update = make(net, "fp32", batch, double)
    update()
    with FlopCounterMode(display=False) as counter:
        update()
    return float(counter.get_total_flops())


def timed(fn) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def conversions(net: str, batch: int, repeats: int) -> None:
    shape, _, _, scale, high = NETS[net]
    frames = torch.from_numpy(np.random.default_rng(0).integers(0, high, (batch, *shape), dtype=np.uint8))
    c, h, w = shape
    bits = np.empty((batch, h * w, c), np.uint16)
    ways = {"uint8->fp32 NCHW": lambda: frames.to(torch.float32) * scale,
            "uint8->bf16 channels_last (torch)": lambda: frames.to(torch.bfloat16, memory_format=torch.channels_last) * scale,
            # the bf16 path's: integer values, the scale folded into the first layer (pearl.nets.BF16Copy)
            "uint8->bf16 channels_last (kernels/cpu/pixels.py)": lambda: bytes_to_bf16_nhwc(
                frames.numpy().reshape(batch, c, h * w), BF16_OF_BYTE, bits)}
    times = {name: [] for name in ways}
    for _ in range(repeats * 5):
        for name, way in ways.items():
            times[name].append(timed(way)[1])
    print("  input conversion (CPU us per batch): "
          + ", ".join(f"{name} {statistics.median(t) * 1e6:.0f}" for name, t in times.items()))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--nets", nargs="+", choices=list(NETS), default=list(NETS))
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--paths", nargs="+", choices=[*PATHS, "compile"], default=list(PATHS))
    parser.add_argument("--compile", action="store_true", help="add the torch.compile path")
    parser.add_argument("--double", type=int, choices=[0, 1], default=1, help="double DQN (default) or not")
    args = parser.parse_args()
    paths = list(args.paths) + (["compile"] if args.compile and "compile" not in args.paths else [])
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor())
    flags = next((line for line in open("/proc/cpuinfo") if line.startswith("flags")), "").split()
    print(f"# CPU: {cpu}, {os.cpu_count()} cores, {' '.join(f for f in flags if f.startswith(('amx', 'avx512_bf16')))}; "
          f"torch {torch.__version__}; batch {args.batch}; double {bool(args.double)}; load {os.getloadavg()}")
    for net in args.nets:
        for threads in args.threads:
            torch.set_num_threads(threads)
            runs = {}
            for path in paths:
                runs[path] = (make(net, path, args.batch, bool(args.double)), [], [])
                for _ in range(3):  # warm-up (oneDNN primitive creation, compilation)
                    runs[path][0]()
            for _ in range(args.repeats):
                for update, walls, cpus in runs.values():
                    wall, cpu_s = timed(update)
                    walls.append(wall)
                    cpus.append(cpu_s)
            base = statistics.median(runs["fp32"][2]) if "fp32" in runs else None
            flops, peak = update_flops(net, args.batch, bool(args.double)), gemm_peak(threads)
            print(f"{net:8s} threads {threads}  fp32 update {flops / 1e9:.3f} GFLOP; a 1024^3 GEMM {peak / 1e9:.0f} GFLOP/s"
                  f" -> no float32 update below {flops / peak * 1e3:.2f} ms here")
            for path, (_, walls, cpus) in runs.items():
                cpu_ms = statistics.median(cpus) * 1e3
                wall = statistics.median(walls)
                speedup = f"  fp32/this {base * 1e3 / cpu_ms:5.2f}x" if base else ""
                print(f"{net:8s} threads {threads}  {path:18s} update wall {wall * 1e3:8.2f} ms"
                      f"  cpu {cpu_ms:8.2f} ms{speedup}  {flops / wall / 1e9:6.1f} GFLOP/s")
            conversions(net, args.batch, args.repeats)
            print(f"# load {os.getloadavg()}")


if __name__ == "__main__":
    main()
