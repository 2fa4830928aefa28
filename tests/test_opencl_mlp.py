"""OpenCL Q-network inference (kernels/opencl/mlp.cl) against QPolicy and a float64 model, on
PoCL in CI. Skipped when pyopencl or an OpenCL device is missing."""
from __future__ import annotations

import os
import warnings

import numpy as np
import pytest

pytest.importorskip("pyopencl")
from pearl.kernels import opencl as ocl  # noqa: E402

if not ocl.available():
    pytest.skip("no OpenCL platform/device", allow_module_level=True)

from pearl.kernels.cpu import MLPLayout, QPolicy  # noqa: E402

warnings.filterwarnings("ignore", module="pyopencl")


def rel_err(got, want):
    want = np.asarray(want, np.float64)
    return float(np.max(np.abs(np.asarray(got, np.float64) - want)) / np.max(np.abs(want)))


def forward64(layout, flat, obs):
    layers = [(w.astype(np.float64), b.astype(np.float64)) for w, b in layout.views(flat)]
    n_heads = 2 if layout.dueling else 1
    h = obs.astype(np.float64)
    for w, b in layers[:-n_heads]:
        h = np.maximum(h @ w.T + b, 0.0)
    if not layout.dueling:
        w, b = layers[-1]
        return h @ w.T + b
    (wv, bv), (wa, ba) = layers[-2:]
    advantage = h @ wa.T + ba
    return (h @ wv.T + bv) + advantage - advantage.mean(axis=1, keepdims=True)


@pytest.mark.parametrize("sizes,dueling", [([4, 64, 64, 2], 0), ([6, 64, 64, 3], 0), ([8, 33, 5], 0),
                                           ([4, 64, 64], 3)])
def test_q_values_match_qpolicy(sizes, dueling):
    assert os.environ.get("POCL_CACHE_DIR")  # set per process by the backend
    layout = MLPLayout(sizes, dueling_actions=dueling)
    rng = np.random.default_rng(sum(sizes))
    flat = ((rng.random(layout.size) - 0.5) * 0.5).astype(np.float32)
    policy, reference = ocl.OpenCLQPolicy(layout), QPolicy(layout)
    policy.load(flat)
    reference.load(flat)
    for batch in (1, 64, 200):
        obs = ((rng.random((batch, sizes[0])) - 0.5) * 4).astype(np.float32)
        q = policy.q_values(obs)
        assert q.shape == reference.q_values(obs).shape and q.dtype == np.float32
        assert rel_err(q, reference.q_values(obs)) <= 1e-5
        assert rel_err(q, forward64(layout, flat, obs)) <= 1e-5
    np.testing.assert_array_equal(policy.greedy(obs), q.argmax(axis=1))


def test_reload_replaces_the_weights():
    layout = MLPLayout([4, 16, 2])
    rng = np.random.default_rng(0)
    policy = ocl.OpenCLQPolicy(layout)
    obs = rng.random((5, 4)).astype(np.float32)
    first, second = (rng.standard_normal(layout.size).astype(np.float32) for _ in range(2))
    policy.load(first)
    q1 = policy.q_values(obs)
    policy.load(second)
    assert rel_err(policy.q_values(obs), forward64(layout, second, obs)) <= 1e-5
    assert not np.allclose(q1, policy.q_values(obs))
    assert "__kernel void dense" in ocl.mlp_kernel_source()
