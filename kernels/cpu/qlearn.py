"""A fused DQN training step for plain ReLU MLPs, compiled with numba.

PyTorch spends ~1.5 ms of dispatch and autograd bookkeeping on a double-DQN update of a 4-64-64-2
network at batch 64 on a 2-core CPU, for a few microseconds of arithmetic. This kernel does the
same step — TD target (double or vanilla), importance-weighted Huber loss, backward pass, gradient
norm clipping and Adam with PyTorch's exact update rule — in one compiled call: the matrix products
go to BLAS (numba's np.dot, sgemm through SciPy's BLAS) and everything between them is fused loops
over preallocated buffers, so no numpy call's overhead remains (a numpy version of the same step,
~50 numpy calls, took 129 us in the e2e benchmark). tests/test_qlearn_kernel.py holds it to the
PyTorch reference in pearl/algos/dqn.py.

On two learner threads (Plan.learner_threads) the step runs its independent products in pairs on
numba's thread pool: the online forward on the caller beside the target forward on the pool's
thread, and each hidden layer's gradient passed down on the caller beside its weight gradient on
the pool's thread (so the online weights, which Adam writes on the caller, are read only there).
Each product is the one-thread kernel's own BLAS call, so the result is the same to the bit, and
the pool's thread takes the caller's floating-point mode first (float_mode.py: a thread keeps
the mode it was made with; without it the update ran up to 3x slower in some processes). A pair pays
only for products of PAIR_FROM_MACS multiply-adds or more (pearl.kernels.cpu.paired_products):
below, the pool's hand-off and end barrier cost more than the half it saves (docs/BENCHMARKS.md
issue 19, session 18).

Precision bf16 (FusedQLearner(precision="bf16")) runs the inner hidden layers' three products in
bfloat16 with float32 accumulation (kernels/cpu/bf16_gemm.py: 64 x 256 x 256 in 37 us against
sgemm's 87 on one Zen 4 core), on operands packed each step and on the online weights' bfloat16
bits, which Adam writes beside them; the step is held to a float64 reference with the same
roundings in tests/test_qlearn_kernel.py.
"""
from __future__ import annotations

import numpy as np
import scipy.linalg.cython_blas  # noqa: F401  (loaded now, so cpu_kernel_mode's BLAS limit covers it)
from numba import njit, prange

from pearl.kernels.cpu import PAIR_FROM_MACS, torch_threads_kept
from pearl.kernels.cpu.bf16_gemm import (bf16_bits, bf16_product, interleave_rows, pack_columns, pack_row_pairs,
                                         pack_rows, transpose)
from pearl.kernels.cpu.float_mode import apply_float_mode, current_float_mode
from pearl.kernels.cpu.mlp import MLPLayout, activation_offsets, bf16_layers, mlp_forward, pack_forward_weights

# error_model "numpy": a division by zero gives inf instead of raising, so numba emits no zero
# check per division and LLVM vectorizes the Adam loop (16 -> 4 us for 4-64-64-2; the same bits)
_NJIT = dict(cache=True, nogil=True, error_model="numpy")


@njit(**_NJIT)
def _forward_side(side, online, target, shapes, offsets, x, next_obs, acts, target_acts, act_offsets, mode, packs):
    """One side of the forward pair (not inlined, so that the parallel compile of _forward_pair
    does not reach mlp_forward's loops)."""
    apply_float_mode(mode)
    low, packed, packed_target, _, scratch, scratch_target, _ = packs
    if side == 0:
        mlp_forward(online, shapes, offsets, x, acts, act_offsets, low, packed, scratch)
    else:
        mlp_forward(target, shapes, offsets, next_obs, target_acts, act_offsets, low, packed_target, scratch_target)


@njit(parallel=True, **_NJIT)
def _forward_pair(online, target, shapes, offsets, x, next_obs, acts, target_acts, act_offsets, mode, packs):
    """The online and the target forward, one per thread of numba's pool, in the float mode `mode`."""
    for side in prange(2):
        _forward_side(side, online, target, shapes, offsets, x, next_obs, acts, target_acts, act_offsets, mode, packs)


@njit(**_NJIT)
def _backward_side(side, grad_z, inputs, weight, grad_weight, grad_below, mode, low, packed_down, scratch):
    """Side 0: the gradient passed down; side 1: the weight gradient; in bfloat16 where `low`
    (`packed_down`: the weight as _pack_online packs it; `scratch`: this side's own)."""
    apply_float_mode(mode)
    batch, n_out = grad_z.shape
    if side == 0:
        if low:
            packed_grad = scratch[:batch * n_out // 2].reshape((batch, n_out // 2))
            pack_rows(grad_z, packed_grad)
            bf16_product(grad_below, packed_grad, packed_down, False)
        else:
            np.dot(grad_z, weight, grad_below)
    elif low:
        n_in = inputs.shape[1]
        packed_grad = scratch[:n_out * batch // 2].reshape((n_out, batch // 2))
        packed_inputs = scratch[n_out * batch // 2:(n_out + n_in) * batch // 2].reshape((batch // 2, n_in))
        pack_columns(grad_z, packed_grad, scratch[(n_out + n_in) * batch // 2:])
        pack_row_pairs(inputs, packed_inputs)
        bf16_product(grad_weight, packed_grad, packed_inputs, False)
    else:
        np.dot(grad_z.T, inputs, grad_weight)


@njit(parallel=True, **_NJIT)
def _backward_pair(grad_z, inputs, weight, grad_weight, grad_below, mode, low, packed_down, scratch, scratch_pool):
    """A layer's weight gradient (on the pool's thread) and the gradient it passes down (on the
    caller: side 0 of prange(2) is the calling thread), in the float mode `mode`. Why this way
    round: the gradient passed down reads the online weights, which the caller's Adam wrote in the
    previous update; read on the pool's thread they crossed between the cores every update, and
    the step took 376-900 us instead of 278-411 at 4-256-256-2, batch 64 (docs/BENCHMARKS.md
    issue 19, session 22)."""
    for side in prange(2):
        _backward_side(side, grad_z, inputs, weight, grad_weight, grad_below, mode, low, packed_down,
                       scratch if side == 0 else scratch_pool)


@njit(**_NJIT)
def _adam_step(online, grad, exp_avg, exp_avg_sq, scale, b1, b2, one_minus_b1, one_minus_b2, c2, eps, step_size, low):
    """Clipping's scale and torch.optim.Adam's step, parameter by parameter (on the caller's thread:
    split between two threads it ran slower, the halves' moments moving between the cores). `low`
    not empty: each new weight's bfloat16 bits too (uint16, as long as `online`), so that the bf16
    layers' packs need no pass of their own over the weights. `grad` keeps the gradient before
    clipping (written back scaled, it cost a fifth of the step's time: 38 -> 30 us at 67.6k parameters)."""
    bits = online.view(np.uint32)
    for p in range(grad.shape[0]):
        g = grad[p] * scale
        m = exp_avg[p] * b1 + one_minus_b1 * g
        v = exp_avg_sq[p] * b2 + (g * g) * one_minus_b2
        exp_avg[p] = m
        exp_avg_sq[p] = v
        online[p] -= (m / (np.sqrt(v) / c2 + eps)) * step_size
        if low.shape[0]:
            low[p] = bf16_bits(bits[p])


@njit(**_NJIT)
def _pack_online(online, shapes, offsets, low, rows, packed, packed_down, rows_current):
    """The bf16 layers' online weights packed for their forward (`packed`) and the gradient they
    pass down (`packed_down`), from their bfloat16 bits in `rows` (uint16, each layer's at the even
    offset 2 * (offset // 2)), which the previous step's Adam wrote: unless `rows_current`, they are
    first rounded from `online` here."""
    for layer in range(shapes.shape[0]):
        if low[layer]:
            n_out, n_in = shapes[layer, 0], shapes[layer, 1]
            start, half = offsets[layer], offsets[layer] // 2
            layer_rows = rows[2 * half:2 * half + n_out * n_in]
            if not rows_current:
                pack_rows(online[start:start + n_out * n_in].reshape((n_out, n_in)),
                          layer_rows.view(np.uint32).reshape((n_out, n_in // 2)))
            transpose(layer_rows.view(np.uint32).reshape((n_out, n_in // 2)),
                      packed[half:half + n_out * n_in // 2].reshape((n_in // 2, n_out)))
            interleave_rows(layer_rows.reshape((n_out, n_in)),
                            packed_down[half:half + n_out * n_in // 2].reshape((n_out // 2, n_in)))


@njit(inline="always")
def _block(acts, act_offsets, layer, rows, width):
    start = act_offsets[layer]
    return acts[start:start + rows * width].reshape((rows, width))


@njit(cache=True, nogil=True, fastmath={"reassoc"})
def _sum_of_squares(grad):
    """sum(grad**2) in float64; reassociated, so LLVM vectorizes it (4 -> 0.7 us for 4.6k
    parameters; only the float64 rounding order differs)."""
    squares = 0.0
    for p in range(grad.shape[0]):
        squares += np.float64(grad[p]) * grad[p]
    return squares


@njit(**_NJIT)
def _dqn_step(online, target, grad, exp_avg, exp_avg_sq, shapes, offsets, obs, actions, rewards,
              next_obs, discounts, weights, double, lr, beta1, beta2, adam_eps, max_grad_norm, step,
              x, acts, target_acts, act_offsets, abs_td, threads, low, packed, packed_target, packed_down, scratch,
              scratch_target, low_bits, rows_current):
    """One gradient step; returns the loss. `weights` empty: unweighted. `x` holds the online
    net's input rows (obs, then next_obs for double DQN); `acts`/`target_acts` the activations;
    `threads` 2: products of PAIR_FROM_MACS or more in pairs. `low` .. `low_bits`
    (FusedQLearner._packs_for; arrays one by one, as a tuple the dispatcher took ~2 us longer): the
    layers that run in bfloat16, the online weights packed for their forward (written here), the
    target's (written when the target changes), for their gradients passed down (written here), two
    scratch buffers, the online weights' bfloat16 bits (written by Adam; `rows_current`: by the
    previous step's, for the weights `online` holds now)."""
    batch = obs.shape[0]
    rows = x.shape[0]
    x[:batch] = obs
    if double:
        x[batch:] = next_obs
    layers = shapes.shape[0]
    widest = 0
    for layer in range(layers):
        widest = max(widest, shapes[layer, 0] * shapes[layer, 1])
    packs = (low, packed, packed_target, packed_down, scratch, scratch_target, low_bits)
    _pack_online(online, shapes, offsets, low, low_bits, packed, packed_down, rows_current)
    mode = current_float_mode()
    if threads > 1 and batch * widest >= PAIR_FROM_MACS:
        _forward_pair(online, target, shapes, offsets, x, next_obs, acts, target_acts, act_offsets, mode, packs)
    else:
        mlp_forward(online, shapes, offsets, x, acts, act_offsets, low, packed, scratch)
        mlp_forward(target, shapes, offsets, next_obs, target_acts, act_offsets, low, packed_target, scratch_target)
    n_actions = shapes[layers - 1, 0]
    out = _block(acts, act_offsets, layers - 1, rows, n_actions)
    target_out = _block(target_acts, act_offsets, layers - 1, batch, n_actions)
    # TD error, Huber loss and its gradient w.r.t. the taken action's Q (the only nonzero dQ)
    dq = np.empty(batch, np.float32)
    loss = 0.0
    for i in range(batch):
        if double:
            best = 0
            for a in range(1, n_actions):
                if out[batch + i, a] > out[batch + i, best]:
                    best = a
            next_q = target_out[i, best]
        else:
            next_q = target_out[i, 0]
            for a in range(1, n_actions):
                next_q = max(next_q, target_out[i, a])
        td = out[i, actions[i]] - (rewards[i] + discounts[i] * next_q)
        magnitude = abs(td)
        abs_td[i] = magnitude
        huber = np.float32(0.5) * td * td if magnitude <= 1.0 else magnitude - np.float32(0.5)
        g = min(max(td, np.float32(-1.0)), np.float32(1.0))
        if weights.shape[0]:
            huber *= weights[i]
            g *= weights[i]
        loss += huber
        dq[i] = g / batch
    # backward: grad_z is dLoss/d(pre-activation) of the current layer, rows < batch only
    grad_z = np.zeros((batch, n_actions), np.float32)
    for i in range(batch):
        grad_z[i, actions[i]] = dq[i]
    for layer in range(layers - 1, -1, -1):
        n_out, n_in = shapes[layer, 0], shapes[layer, 1]
        start = offsets[layer]
        if layer:
            below = act_offsets[layer - 1]
            inputs = acts[below:below + rows * n_in].reshape((rows, n_in))[:batch]
        else:
            inputs = x[:batch]
        grad_weight = grad[start:start + n_out * n_in].reshape((n_out, n_in))
        weight = online[start:start + n_out * n_in].reshape((n_out, n_in))
        grad_below = np.empty((batch, n_in), np.float32)
        if low[layer]:
            down = packed_down[start // 2:start // 2 + n_out * n_in // 2].reshape((n_out // 2, n_in))
        else:
            down = packed_down[:0].reshape((0, 0))
        if layer and threads > 1 and batch * n_out * n_in >= PAIR_FROM_MACS:
            _backward_pair(grad_z, inputs, weight, grad_weight, grad_below, mode, low[layer], down, scratch,
                           scratch_target)
        else:
            _backward_side(1, grad_z, inputs, weight, grad_weight, grad_below, mode, low[layer], down, scratch)
            if layer:
                _backward_side(0, grad_z, inputs, weight, grad_weight, grad_below, mode, low[layer], down, scratch)
        grad_bias = grad[start + n_out * n_in:start + n_out * n_in + n_out]
        # row by row (each bias's sum in the same order): the inner loop runs along a row and vectorizes
        grad_bias[:] = 0.0
        for i in range(batch):
            for j in range(n_out):
                grad_bias[j] += grad_z[i, j]
        if layer:
            grad_z = grad_below
            for i in range(batch):
                for j in range(n_in):
                    if inputs[i, j] <= 0:
                        grad_z[i, j] = 0.0
    # clip_grad_norm_ (torch's rule), then Adam step for step as torch.optim.Adam
    squares = _sum_of_squares(grad)
    coef = max_grad_norm / (np.sqrt(squares) + 1e-6)
    scale = np.float32(coef) if coef < 1.0 else np.float32(1.0)
    bias_correction1 = 1.0 - beta1 ** step
    bias_correction2_sqrt = np.sqrt(1.0 - beta2 ** step)
    b1, b2 = np.float32(beta1), np.float32(beta2)
    one_minus_b1, one_minus_b2 = np.float32(1.0 - beta1), np.float32(1.0 - beta2)
    c2, eps, step_size = np.float32(bias_correction2_sqrt), np.float32(adam_eps), np.float32(lr / bias_correction1)
    start = 0
    for layer in range(layers):  # the bf16 layers' weights with their bits, the rest without
        if low[layer]:
            first, half = offsets[layer], offsets[layer] // 2
            end = first + shapes[layer, 0] * shapes[layer, 1]
            _adam_step(online[start:first], grad[start:first], exp_avg[start:first], exp_avg_sq[start:first],
                       scale, b1, b2, one_minus_b1, one_minus_b2, c2, eps, step_size, low_bits[:0])
            _adam_step(online[first:end], grad[first:end], exp_avg[first:end], exp_avg_sq[first:end], scale,
                       b1, b2, one_minus_b1, one_minus_b2, c2, eps, step_size, low_bits[2 * half:2 * half + end - first])
            start = end
    _adam_step(online[start:], grad[start:], exp_avg[start:], exp_avg_sq[start:], scale, b1, b2, one_minus_b1,
               one_minus_b2, c2, eps, step_size, low_bits[:0])
    return loss / batch


_dqn_step_in_pairs = torch_threads_kept(_dqn_step)  # its pairs start numba parallel regions


class FusedQLearner:
    """Owns online weights, target weights and Adam state as flat float32 vectors."""

    def __init__(self, sizes: list[int], lr: float, double: bool, max_grad_norm: float,
                 betas: tuple[float, float] = (0.9, 0.999), adam_eps: float = 1e-8, threads: int = 1,
                 precision: str = "fp32"):
        """`threads` 2: products run in pairs where they pay (paired_products); the same result.
        `precision` bf16: the inner hidden layers' products in bfloat16 (mlp.bf16_layers), on
        bfloat16 copies of the float32 weights, activations and gradients, accumulated in float32;
        the weights, the loss, Adam and everything else stay float32."""
        if precision not in ("fp32", "bf16"):
            raise ValueError(f"precision: expected fp32 or bf16, got {precision!r}")
        self.layout = MLPLayout(sizes)
        self.threads, self.precision = threads, precision
        self.lr, self.double, self.max_grad_norm = lr, double, max_grad_norm
        self.beta1, self.beta2 = betas
        self.adam_eps = adam_eps
        n = self.layout.size
        self.online = np.zeros(n, dtype=np.float32)
        self.target = np.zeros(n, dtype=np.float32)
        self.grad = np.zeros(n, dtype=np.float32)  # the last step's gradient, before clipping
        self.exp_avg = np.zeros(n, dtype=np.float32)
        self.exp_avg_sq = np.zeros(n, dtype=np.float32)
        self.steps = 0
        self._shapes = np.array(self.layout.shapes, dtype=np.int64)
        self._offsets = np.array(self.layout.offsets, dtype=np.int64)
        self._step_buffers: dict[int, tuple] = {}
        self._packs: dict[int, tuple] = {}  # batch -> packs (_dqn_step's), and whether the target's is current
        self._target_packed: set[int] = set()
        self._rows_at: tuple[int, int] | None = None  # (steps, batch) of the step whose Adam wrote the bf16 bits

    # -- state ---------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"online": self.online.copy(), "target": self.target.copy(),
                "exp_avg": self.exp_avg.copy(), "exp_avg_sq": self.exp_avg_sq.copy(),
                "steps": self.steps}

    def load_state_dict(self, state: dict) -> None:
        for name in ("online", "target", "exp_avg", "exp_avg_sq"):
            np.copyto(getattr(self, name), state[name])
        self.steps = int(state["steps"])
        self._target_packed.clear()
        self._rows_at = None

    def update_target(self, tau: float) -> None:
        self._target_packed.clear()
        if tau >= 1.0:
            np.copyto(self.target, self.online)
        else:
            self.target *= 1.0 - tau
            self.target += tau * self.online

    # -- the step ------------------------------------------------------------------------------
    def _buffers(self, batch: int):
        """Input rows, online and target activations, |TD| for a batch size (made once)."""
        buffers = self._step_buffers.get(batch)
        if buffers is None:
            rows = 2 * batch if self.double else batch
            act_offsets, size = activation_offsets(self._shapes, rows)
            buffers = (np.empty((rows, self.layout.shapes[0][1]), np.float32),
                       np.empty(size, np.float32),
                       np.empty(size, np.float32),  # target: batch rows used
                       act_offsets, np.empty(batch, np.float32))
            self._step_buffers[batch] = buffers
        return buffers

    def _packs_for(self, batch: int) -> tuple:
        """_dqn_step's `packs` at a batch size: float32 everywhere unless precision bf16 (empty
        buffers then); the target's packed weights refreshed after it changed."""
        packs = self._packs.get(batch)
        if packs is None:
            low = bf16_layers(self._shapes, batch) if self.precision == "bf16" else np.zeros(len(self._shapes), np.uint8)
            halves = (self.layout.size + 1) // 2 if low.any() else 0
            widest = max((max(batch * (n_out + n_in), n_out * n_in // 2)
                          for (n_out, n_in), bf16 in zip(self.layout.shapes, low) if bf16), default=0)
            packs = (low, *(np.zeros(halves, np.uint32) for _ in range(3)), *(np.zeros(widest, np.uint32) for _ in range(2)),
                     np.zeros(2 * halves, np.uint16))
            self._packs[batch] = packs
        if batch not in self._target_packed:
            pack_forward_weights(self.target, self._shapes, self._offsets, packs[0], packs[2], packs[4])
            self._target_packed.add(batch)
        return packs

    def update(self, obs, actions, rewards, next_obs, discounts, weights=None):
        """One gradient step on a batch. Returns (loss, |TD error| per sample); the |TD| array is
        reused by the next update of the same batch size."""
        batch = obs.shape[0]
        x, acts, target_acts, act_offsets, abs_td = self._buffers(batch)
        rows_current = self._rows_at == (self.steps, batch)
        self.steps += 1
        step = _dqn_step_in_pairs if self.threads > 1 else _dqn_step
        loss = step(self.online, self.target, self.grad, self.exp_avg, self.exp_avg_sq, self._shapes, self._offsets,
                    _f32(obs), np.ascontiguousarray(actions, dtype=np.int64), _f32(rewards), _f32(next_obs),
                    _f32(discounts), _NO_WEIGHTS if weights is None else _f32(weights), self.double, self.lr,
                    self.beta1, self.beta2, self.adam_eps, self.max_grad_norm, self.steps, x, acts, target_acts,
                    act_offsets, abs_td, self.threads, *self._packs_for(batch), rows_current)
        self._rows_at = (self.steps, batch)
        return float(loss), abs_td


_NO_WEIGHTS = np.zeros(0, np.float32)


def _f32(array) -> np.ndarray:
    if type(array) is np.ndarray and array.dtype == np.float32 and array.flags.c_contiguous:
        return array
    return np.ascontiguousarray(array, dtype=np.float32)
