"""CUDA backend: the prioritized-replay kernels as torch tensor programs that stay on the device.

- `TorchSumTree`: the K-ary sum (and min) tree of `pearl.kernels.cpu.sumtree.SumTree`, same
  interface, with every level in one flat tensor; batched sample and update run as a fixed number
  of device kernels per tree level with no host round trip (so they can be captured in a CUDA
  graph, see `GraphedSampler`).
- `TorchTransitionStorage`: the transition ring of `pearl.replay.base.Replay` on the device.

Nothing here needs CUDA to import or run: the same code runs on CPU tensors (`device="cpu"`),
which is how it is tested on machines without a GPU. Importing the package does not import torch
(the registry imports `backend.py` below it on every run): the kernels load on first use.
"""
from importlib import import_module

_EXPORTS = {"GraphedSampler", "TorchSumTree", "TorchTransitionStorage"}


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(import_module("pearl.kernels.cuda.sumtree"), name)
    raise AttributeError(f"module 'pearl.kernels.cuda' has no attribute {name!r}")
