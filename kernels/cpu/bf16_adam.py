"""The optimizer step of a bfloat16 CNN learner (runtime.learner_precision: bf16; pearl.nets.BF16Copy,
pearl/runtime/learners.py) in two compiled passes over each parameter: the bfloat16 gradient's sum of
squares (for the clipping norm), then Adam on the float32 master weights and moments, reading the
bfloat16 gradient and writing the master's new bfloat16 copy in the same pass.

Why: done as torch ops, the step was four passes over the Nature CNN's 1.7M weights (gradients
widened into the master's, the norm, the fused Adam, the bfloat16 refresh), ~5 ms of a ~17 ms update
on this VM's cores (the fused Adam alone ~2.4 ms); the passes are bound by their memory and
arithmetic, not by torch's per-op overhead (one flat tensor instead of ten parameters was no faster).
The gradient is read as bfloat16 by both passes (until session 46 the first pass widened it into a
kept float32 buffer that the second read: 6 more bytes of traffic a weight and 6.4 MB for the Nature
fc layer; the update's time did not change measurably).

Layouts: every array is a (rows, positions, channels) view of one parameter in the bfloat16 copy's
memory order (a channels-last convolution weight (O, I, H, W) is (O, H*W, I) there; a matrix is
(1, out, in); a bias (1, 1, n)); the gradient and the copy are contiguous in it, the master and the
moments are views of their flat (parameter-order) spans in the same order.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit


@njit(cache=True, nogil=True, fastmath=True, error_model="numpy")
def bf16_sumsq(bits) -> float:
    """The sum of squares (float64; any summation order) of the bfloat16 values whose bits
    (uint16, flat) are given."""
    total = 0.0
    for i in range(bits.size):
        wide = np.uint32(np.uint32(bits[i]) << np.uint32(16)).view(np.float32)
        total += np.float64(wide) * wide
    return total


# error_model numpy: python's zero-division checks kept the loop scalar (4.1 ms on the Nature fc
# layer's 1.6M weights against ~1.5); these fast-math flags (no NaN / infinity assumptions, so a NaN
# still reaches the copy) were within ~7% of full fast-math; the tests hold it to torch's Adam
@njit(cache=True, nogil=True, fastmath={"nsz", "contract", "arcp"}, error_model="numpy")
def adam_to_bf16(grad_bits, grad_scale, master, exp_avg, exp_avg_sq, low_bits, weight_scale, row,
                 lr, beta1, beta2, eps, step):
    """One Adam step of `master` on the gradient grad x grad_scale, grad the bfloat16 values whose bits
    (uint16) `grad_bits` holds (torch.optim.Adam's fused kernel:
    no weight decay, amsgrad or maximize; its float32 arithmetic and lerp form of the first moment),
    then low_bits = bfloat16(master x weight_scale), rounded to nearest even (NaN stays NaN).
    weight_scale: the copy's weights are the master's times the learner's input scale (so the
    master's gradient is the copy's times it: part of grad_scale, with the clipping coefficient).
    `row`: a float32 scratch of at least `grad_bits.shape[2]` entries. `step`: the step's number (from 1)."""
    f32 = np.float32
    b2, c1, c2 = f32(beta2), f32(1.0 - beta1), f32(1.0 - beta2)
    step_size = f32(lr / (1.0 - beta1 ** step))
    bc2_sqrt = f32(math.sqrt(1.0 - beta2 ** step))
    e, gs, ws = f32(eps), f32(grad_scale), f32(weight_scale)
    rows, positions, channels = grad_bits.shape
    out = row[:channels]
    out_bits = out.view(np.uint32)
    for a in range(rows):
        for b in range(positions):
            for c in range(channels):
                g = np.uint32(np.uint32(grad_bits[a, b, c]) << np.uint32(16)).view(np.float32) * gs
                m = exp_avg[a, b, c]
                m = m + c1 * (g - m)
                v = b2 * exp_avg_sq[a, b, c] + c2 * g * g
                exp_avg[a, b, c] = m
                exp_avg_sq[a, b, c] = v
                p = master[a, b, c] - step_size * m / (np.sqrt(v) / bc2_sqrt + e)
                master[a, b, c] = p
                out[c] = p * ws
            for c in range(channels):
                u = out_bits[c]
                if (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000):
                    low_bits[a, b, c] = np.uint16(0x7FC0)
                else:
                    low_bits[a, b, c] = np.uint16((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))
                                                  >> np.uint32(16))
