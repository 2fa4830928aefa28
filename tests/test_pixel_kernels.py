"""kernels/cpu/pixels.py: uint8 frames -> bfloat16 channels-last bits, against its numpy reference
and against torch's own conversion (the layout oneDNN's bf16 convolutions read)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from pearl.kernels.cpu.pixels import BF16_OF_BYTE, bytes_to_bf16_nhwc, bytes_to_bf16_nhwc_reference


def test_the_table_is_torchs_bfloat16_of_every_byte():
    want = torch.arange(256, dtype=torch.float32).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(BF16_OF_BYTE, want)


@pytest.mark.parametrize("shape", [(3, 4, 84, 84), (5, 4, 10, 10), (2, 1, 7, 9)])
def test_conversion_matches_the_reference_and_torch_on_strided_windows(shape):
    n, c, h, w = shape
    rng = np.random.default_rng(c * h)
    windows = rng.integers(0, 256, (n, c + 1, h * w), dtype=np.uint8)
    for frames in (windows[:, :c], windows[:, 1:]):  # the frame replay's obs / next obs views
        out = np.full((n, h * w, c), 0xFFFF, np.uint16)
        bytes_to_bf16_nhwc(frames, BF16_OF_BYTE, out)
        np.testing.assert_array_equal(out, bytes_to_bf16_nhwc_reference(frames))
        got = torch.from_numpy(out).view(torch.bfloat16).view(n, h, w, c).permute(0, 3, 1, 2)
        want = torch.from_numpy(np.ascontiguousarray(frames)).view(n, c, h, w).to(torch.bfloat16)
        assert got.is_contiguous(memory_format=torch.channels_last)
        assert torch.equal(got, want)
