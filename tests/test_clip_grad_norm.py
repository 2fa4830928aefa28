"""pearl.runtime.learners.clip_grad_norm: torch.nn.utils.clip_grad_norm_ bit for bit, within and
beyond the norm."""
from __future__ import annotations

import pytest
import torch

from pearl.runtime.learners import clip_grad_norm


@pytest.mark.parametrize("max_norm", [0.5, 3.0, 1e3])
def test_clip_grad_norm_is_torchs(max_norm):
    torch.manual_seed(0)
    ours, theirs = ([torch.nn.Parameter(torch.zeros(shape)) for shape in ((7, 5), (5,), (3, 2, 2))] for _ in range(2))
    for a, b in zip(ours, theirs):
        a.grad = torch.randn(a.shape)
        b.grad = a.grad.clone()
    clip_grad_norm(ours, max_norm)
    torch.nn.utils.clip_grad_norm_(theirs, max_norm)
    for a, b in zip(ours, theirs):
        assert torch.equal(a.grad, b.grad)
