"""uint8 frames -> the bfloat16 channels-last input of a bf16 CNN learner (runtime.learner_precision:
bf16; pearl/runtime/learners.py), in one compiled pass.

Why: torch's `frames.to(torch.bfloat16, memory_format=torch.channels_last)` on a batch of 32 4x84x84
frames took ~2.0 ms of CPU (the conversion to bfloat16 alone ~0.2 ms: the rest is the generic
strided copy into the 4-channel interleaved layout), twice per DQN update (obs and next obs), and
oneDNN's bf16 convolutions want channels-last: an NCHW input made the first convolution ~0.65 ms
slower (a reorder inside). Every byte 0-255 is an integer with at most 8 significant bits, so its
bfloat16 (8 bits of mantissa) is exact: the high 16 bits of its float32; a 256-entry table holds
them, and the loop writes each output element once, contiguously. The 1/255 scale is not applied
here: pearl.nets.BF16Copy folds it into the first layer's weights.
"""
from __future__ import annotations

import numpy as np
from numba import njit

# bfloat16 bit patterns (as uint16) of the floats 0.0 .. 255.0: the float32's high half, exact
BF16_OF_BYTE = (np.arange(256, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)


@njit(cache=True, nogil=True)
def bytes_to_bf16_nhwc(src, table, out):
    """out[n, p, c] = table[src[n, c, p]]: (N, C, H*W) bytes (any strides: the frame replay's
    obs / next obs are views of one window per transition) -> (N, H*W, C) bfloat16 bits."""
    n, c, hw = src.shape
    for i in range(n):
        for k in range(c):  # channel-major: each source row read once in order (0.32 ms for a batch
            for p in range(hw):  # of 32 4x84x84; pixel-major order took 0.77 ms)
                out[i, p, k] = table[src[i, k, p]]


def bytes_to_bf16_nhwc_reference(src: np.ndarray) -> np.ndarray:
    """numpy reference: float32 values, rounded to bfloat16 by truncation (exact for integers
    0-255), as (N, H*W, C) bits."""
    bits = src.astype(np.float32).view(np.uint32) >> 16
    return np.ascontiguousarray(bits.astype(np.uint16).transpose(0, 2, 1))
