"""Dense ReLU MLPs over one flat float32 parameter vector.

The flat vector holds each Linear layer's weight (out x in, row-major) then its bias, in the order
of the PyTorch module's `parameters()`, so weights move between a torch network, a fused learner
and an actor's policy as one contiguous copy.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from pearl.kernels.cpu.bf16_gemm import bf16_product, fits, pack_rows, pack_transposed

_NJIT = dict(cache=True, nogil=True)


class MLPLayout:
    """Where each layer's weight and bias sit in the flat parameter vector.

    `sizes` are the trunk widths (input first). A plain net's last trunk layer is the output; a
    dueling net adds a value head (1 output) and an advantage head (`n_actions` outputs).
    """

    def __init__(self, sizes: list[int], dueling_actions: int = 0):
        shapes = list(zip(sizes[1:], sizes[:-1]))
        if dueling_actions:
            shapes += [(1, sizes[-1]), (dueling_actions, sizes[-1])]
        self.shapes = shapes
        self.dueling = bool(dueling_actions)
        self.offsets = []
        offset = 0
        for n_out, n_in in shapes:
            self.offsets.append(offset)
            offset += n_out * n_in + n_out
        self.size = offset

    def views(self, flat: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
        """(weight, bias) views into `flat`; writing them writes `flat`."""
        out = []
        for (n_out, n_in), offset in zip(self.shapes, self.offsets):
            weight = flat[offset:offset + n_out * n_in].reshape(n_out, n_in)
            bias = flat[offset + n_out * n_in:offset + n_out * n_in + n_out]
            out.append((weight, bias))
        return out


@njit(**_NJIT)
def mlp_forward(params, shapes, offsets, x, acts, act_offsets, bf16_layers=None, packed=None, scratch=None):
    """Runs the MLP on x (rows, in): layer l's output (after ReLU except the last) goes to
    acts[act_offsets[l]:...] as a (rows, out_l) block. Returns the last block.
    `bf16_layers` (a learner's): where nonzero, layer l's product runs in bfloat16 on its weight
    packed by `pack_forward_weights` into `packed`, the inputs packed into `scratch` (uint32)."""
    rows = x.shape[0]
    layers = shapes.shape[0]
    inputs = x
    out = x
    for layer in range(layers):
        n_out, n_in = shapes[layer, 0], shapes[layer, 1]
        start = offsets[layer]
        weight = params[start:start + n_out * n_in].reshape((n_out, n_in))
        bias = params[start + n_out * n_in:start + n_out * n_in + n_out]
        out = acts[act_offsets[layer]:act_offsets[layer] + rows * n_out].reshape((rows, n_out))
        if bf16_layers is not None and bf16_layers[layer]:
            packed_inputs = scratch[:rows * (n_in // 2)].reshape((rows, n_in // 2))
            pack_rows(inputs, packed_inputs)
            bf16_product(out, packed_inputs, packed[start // 2:start // 2 + n_out * n_in // 2].reshape((n_in // 2, n_out)),
                         False)
        else:
            np.dot(inputs, weight.T, out)
        add_bias(out, bias, layer < layers - 1)
        inputs = out
    return out


@njit(inline="always")
def add_bias(out, bias, relu):
    """out += bias row by row, then ReLU where `relu`."""
    for i in range(out.shape[0]):
        for j in range(out.shape[1]):
            v = out[i, j] + bias[j]
            out[i, j] = v if (not relu or v > 0) else np.float32(0.0)


def bf16_layers(shapes: np.ndarray, batch: int) -> np.ndarray:
    """Per layer, 1 where a learner at `batch` runs its products in bfloat16: the inner layers (the
    input's and the output's layers are small and stay float32) whose forward, weight gradient and
    gradient passed down all fit bf16_product's tiles."""
    layers = len(shapes)
    return np.array([0 < layer < layers - 1 and fits(batch, n_out, n_in) and fits(batch, n_in, n_out)
                     and fits(n_out, n_in, batch) for layer, (n_out, n_in) in enumerate(shapes)], dtype=np.uint8)


@njit(**_NJIT)
def pack_forward_weights(params, shapes, offsets, bf16_layers, packed, scratch):
    """The bf16 layers' weights as their forward products take them (pack_transposed, in
    `scratch`'s room), each at half its offset in `packed` (uint32, half the parameter vector's length)."""
    for layer in range(shapes.shape[0]):
        if bf16_layers[layer]:
            n_out, n_in = shapes[layer, 0], shapes[layer, 1]
            start = offsets[layer]
            pack_transposed(params[start:start + n_out * n_in].reshape((n_out, n_in)),
                            packed[start // 2:start // 2 + n_out * n_in // 2].reshape((n_in // 2, n_out)), scratch)


def activation_offsets(shapes: np.ndarray, rows: int) -> tuple[np.ndarray, int]:
    """Where `mlp_forward` puts each layer's (rows, out) block in its activation buffer, and its size."""
    widths = shapes[:, 0]
    return np.concatenate(([0], np.cumsum(widths * rows)[:-1])).astype(np.int64), int(widths.sum()) * rows


@njit(**_NJIT)
def _greedy(params, shapes, offsets, obs, acts, act_offsets, actions):
    q = mlp_forward(params, shapes, offsets, obs, acts, act_offsets)
    for i in range(q.shape[0]):
        actions[i] = np.argmax(q[i])


@njit(**_NJIT)
def _greedy_into(params, meta, obs, acts, actions):
    """`_greedy` with the network's int64 tables packed in one array, `meta` = (layers, shapes
    (layers x 2), offsets, activation offsets): each array argument costs the dispatcher a type
    check and an unboxing, and for one observation those are most of the call."""
    layers = meta[0]
    shapes = meta[1:1 + 2 * layers].reshape((layers, 2))
    offsets = meta[1 + 2 * layers:1 + 3 * layers]
    act_offsets = meta[1 + 3 * layers:1 + 4 * layers]
    _greedy(params, shapes, offsets, obs, acts, act_offsets, actions)


@njit(cache=True, nogil=True, fastmath=True)
def _greedy_row(params, meta, obs, acts, actions):
    """`_greedy_into` for one observation with loops instead of BLAS calls: each output a dot
    product over the weight row (contiguous), which fastmath lets LLVM vectorise (a reassociated
    sum: the Q-values differ from BLAS's in the last bits, as BLAS's differ between kernels)."""
    layers = meta[0]
    inputs = obs[0]
    for layer in range(layers):
        n_out, n_in = meta[1 + 2 * layer], meta[2 + 2 * layer]
        start = meta[1 + 2 * layers + layer]
        at = meta[1 + 3 * layers + layer]
        out = acts[at:at + n_out]
        for j in range(n_out):
            row = params[start + j * n_in:start + (j + 1) * n_in]
            total = params[start + n_out * n_in + j]
            for i in range(n_in):
                total += row[i] * inputs[i]
            out[j] = total if (layer == layers - 1 or total > 0) else np.float32(0.0)
        inputs = out
    best = 0
    for a in range(1, inputs.shape[0]):
        if inputs[a] > inputs[best]:
            best = a
    actions[0] = best


class QPolicy:
    """Q-values of a batch of observations with numpy: the actor's copy of the learner's network."""

    def __init__(self, layout: MLPLayout):
        self.layout = layout
        self.flat = np.zeros(layout.size, dtype=np.float32)
        layers = [(weight.T, bias) for weight, bias in layout.views(self.flat)]  # views of flat
        n_heads = 2 if layout.dueling else 1
        self._hidden, self._heads = layers[:-n_heads], layers[-n_heads:]
        self._shapes = np.array(layout.shapes, dtype=np.int64)
        self._offsets = np.array(layout.offsets, dtype=np.int64)
        self._activations: dict[int, tuple] = {}  # rows -> (buffer, offsets) for the compiled path
        self._packed: dict[int, tuple] = {}  # rows -> (packed tables, buffer) for greedy_into

    def load(self, flat: np.ndarray) -> None:
        np.copyto(self.flat, flat)

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        h = obs
        for weight_t, bias in self._hidden:
            h = h @ weight_t
            h += bias
            np.maximum(h, 0.0, out=h)
        if not self.layout.dueling:
            ((weight_t, bias),) = self._heads
            q = h @ weight_t
            q += bias
            return q
        (w_value, b_value), (w_adv, b_adv) = self._heads
        advantage = h @ w_adv + b_adv
        return (h @ w_value + b_value) + advantage - advantage.mean(axis=-1, keepdims=True)

    def greedy(self, obs: np.ndarray) -> np.ndarray:
        """argmax_a Q(obs, a) per row; one compiled call for a plain net on float32 rows (numpy's
        three products and their temporaries cost ~6 us a call on one observation, the compiled
        forward pass ~2 us)."""
        if self.layout.dueling or obs.ndim != 2 or obs.dtype != np.float32 or not obs.flags.c_contiguous:
            return self.q_values(obs).argmax(axis=-1)
        rows = obs.shape[0]
        buffers = self._activations.get(rows)
        if buffers is None:
            offsets, size = activation_offsets(self._shapes, rows)
            buffers = self._activations[rows] = (np.empty(size, np.float32), offsets)
        actions = np.empty(rows, np.int64)
        _greedy(self.flat, self._shapes, self._offsets, obs, buffers[0], buffers[1], actions)
        return actions

    def greedy_into(self, obs: np.ndarray, actions: np.ndarray) -> None:
        """`greedy` written into `actions` (int64, one per row of a 2-D `obs`): an actor's hot path.
        A dueling net takes `greedy`'s path; any other rows the compiled pass takes as they are
        (numba compiles one version per dtype and layout)."""
        if self.layout.dueling:
            actions[:] = self.greedy(obs)
            return
        rows = obs.shape[0]
        packed = self._packed.get(rows)
        if packed is None:
            act_offsets, size = activation_offsets(self._shapes, rows)
            meta = np.concatenate(([len(self._shapes)], self._shapes.ravel(), self._offsets, act_offsets))
            packed = self._packed[rows] = (meta.astype(np.int64), np.empty(size, np.float32))
        # one observation: loops beat BLAS's per-call cost (1.3 vs 2.3 us for 4-64-64-2)
        (_greedy_row if rows == 1 else _greedy_into)(self.flat, packed[0], obs, packed[1], actions)
