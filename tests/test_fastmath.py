"""kernels/cpu/fastmath.power against numpy's float64 power."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pearl.kernels.cpu.fastmath import power


@settings(max_examples=200, deadline=None, derandomize=True)
@given(x=st.lists(st.floats(2.3e-308, 1.7e308), min_size=1, max_size=40),
       y=st.floats(-1.0, 1.0))
def test_power_matches_numpy_within_2e_13(x, y):
    x = np.array(x)
    expected = np.power(x, y)
    got = power(x, y, np.empty_like(x))
    np.testing.assert_allclose(got, expected, rtol=2e-13, atol=0)


def test_priority_and_weight_ranges_are_tight():
    """The ranges replay uses (TD errors + eps to alpha, priority ratios to -beta): ~1e-15."""
    rng = np.random.default_rng(0)
    x = np.concatenate((rng.random(10_000) * 10.0 ** rng.integers(-6, 4, 10_000), [1.0, 1e-6]))
    for y in (0.6, 0.5, 1.0, 0.0, -0.4, -1.0):
        np.testing.assert_allclose(power(x, y, np.empty_like(x)), x ** y, rtol=5e-15, atol=0)


@np.errstate(divide="ignore", over="ignore")
def test_outside_the_fast_range_takes_libm():
    odd = np.array([0.0, 5e-324, 1e-310, np.inf, np.nan])
    for y in (0.6, -0.4, 0.0):
        np.testing.assert_array_equal(power(odd, y, np.empty_like(odd)), odd ** y)
    x = np.array([0.0, 1e-310, 3.0, 2.0, 1e200])
    for y in (2.5, -3.0):  # |y| > 1: all by libm
        np.testing.assert_array_equal(power(x, y, np.empty_like(x)), x ** y)
    near = np.array([2.3e-308, 1e-307, 1.7e308])  # results at the edge of the normal range
    np.testing.assert_allclose(power(near, 1.0, np.empty(3)), near, rtol=2e-13)
    np.testing.assert_allclose(power(near, -1.0, np.empty(3)), near ** -1.0, rtol=2e-13)


def test_float32_output():
    x = np.array([0.5, 2.0, 7.0])
    out = power(x, -0.4, np.empty(3, np.float32))
    np.testing.assert_array_equal(out, (x ** -0.4).astype(np.float32))
