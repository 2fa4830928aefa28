"""Q-network inference on an OpenCL device: the interface of kernels/cpu/mlp.py's QPolicy
(`load(flat)`, `q_values(obs)`, `greedy(obs)`), plain or dueling heads.

`load` uploads the flat parameters once; `q_values` uploads the observations, runs one `dense`
launch per layer (plus `dueling` for a dueling net) in an in-order queue and reads back only the
Q-values. Works on any OpenCL device: PoCL on the CPU in tests, GPUs, and FPGAs whose toolchain
compiles OpenCL C. float32 throughout.
"""
from __future__ import annotations

from importlib import resources

import numpy as np

from pearl.kernels.cpu.mlp import MLPLayout
from pearl.kernels.opencl.devices import cl as _cl
from pearl.kernels.opencl.sumtree import default_context, default_queue

_PROGRAMS: dict = {}


def mlp_kernel_source() -> str:
    return resources.files(__package__).joinpath("mlp.cl").read_text(encoding="utf-8")


def _program(context):
    key = context.int_ptr
    if key not in _PROGRAMS:
        cl = _cl()
        program = cl.Program(context, mlp_kernel_source()).build()
        dense = cl.Kernel(program, "dense")
        dense.set_scalar_arg_dtypes([None, None, np.int64, np.int64, None, np.int32, np.int32, np.int32, np.int32])
        dueling = cl.Kernel(program, "dueling")
        dueling.set_scalar_arg_dtypes([None, None, None, np.int32, np.int32])
        _PROGRAMS[key] = (program, dense, dueling)
    return _PROGRAMS[key]


class OpenCLQPolicy:
    def __init__(self, layout: MLPLayout, context=None, queue=None):
        cl = _cl()
        self.layout = layout
        self.context = context or (queue.context if queue is not None else default_context())
        self.queue = queue or default_queue(self.context)
        _, self._dense, self._dueling = _program(self.context)
        self.flat = np.zeros(layout.size, np.float32)
        self._params = cl.Buffer(self.context, cl.mem_flags.READ_ONLY, max(4, layout.size * 4))
        self._batch = 0
        self._acts: list = []

    def load(self, flat: np.ndarray) -> None:
        np.copyto(self.flat, flat)
        _cl().enqueue_copy(self.queue, self._params, self.flat, is_blocking=True)

    def _buffers(self, batch: int) -> None:
        """Activation buffers for `batch` samples (input, every layer's output), reused."""
        if batch <= self._batch:
            return
        cl = _cl()
        widths = [self.layout.shapes[0][1]] + [n_out for n_out, _ in self.layout.shapes]
        self._acts = [cl.Buffer(self.context, cl.mem_flags.READ_WRITE, batch * w * 4) for w in widths]
        if self.layout.dueling:
            n_actions = self.layout.shapes[-1][0]
            self._q = cl.Buffer(self.context, cl.mem_flags.READ_WRITE, batch * n_actions * 4)
        self._batch = batch

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        cl = _cl()
        n_in = self.layout.shapes[0][1]
        obs = np.ascontiguousarray(obs, dtype=np.float32).reshape(-1, n_in)
        batch = obs.shape[0]
        self._buffers(batch)
        cl.enqueue_copy(self.queue, self._acts[0], obs, is_blocking=False)
        shapes = self.layout.shapes
        n_heads = 2 if self.layout.dueling else 1
        trunk = len(shapes) - n_heads
        for layer in range(trunk):
            self._layer(layer, self._acts[layer], self._acts[layer + 1], batch, relu=True)
        if not self.layout.dueling:
            self._layer(trunk, self._acts[trunk], self._acts[trunk + 1], batch, relu=False)
            out_buffer, n_out = self._acts[trunk + 1], shapes[trunk][0]
        else:
            value, advantage = self._acts[trunk + 1], self._acts[trunk + 2]
            self._layer(trunk, self._acts[trunk], value, batch, relu=False)
            self._layer(trunk + 1, self._acts[trunk], advantage, batch, relu=False)
            n_out = shapes[-1][0]
            self._dueling(self.queue, (_round_up(batch),), None, value, advantage, self._q, n_out, batch)
            out_buffer = self._q
        out = np.empty((batch, n_out), np.float32)
        cl.enqueue_copy(self.queue, out, out_buffer, is_blocking=True)
        return out

    def _layer(self, layer: int, x, y, batch: int, relu: bool) -> None:
        n_out, n_in = self.layout.shapes[layer]
        w_offset = self.layout.offsets[layer]
        self._dense(self.queue, (_round_up(n_out), batch), None, x, self._params, w_offset,
                    w_offset + n_out * n_in, y, n_in, n_out, int(relu), batch)

    def greedy(self, obs: np.ndarray) -> np.ndarray:
        return self.q_values(obs).argmax(axis=-1)


def _round_up(n: int, multiple: int = 16) -> int:
    return max(multiple, -(-n // multiple) * multiple)
