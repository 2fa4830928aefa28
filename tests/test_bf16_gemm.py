"""The bfloat16 product kernel (kernels/cpu/bf16_gemm.py) against its numpy reference: the packs'
rounding bit for bit against torch's conversion, products of any shape the tiles take to float32
summation order, and the emulation a CPU without AVX-512 BF16 compiles to bit for bit against the
instruction where this CPU has it; on a CPU with AMX, the tile path to the same bound and every
other shape on the vector loop."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pearl.kernels.cpu import bf16_gemm
from pearl.kernels.cpu.bf16_gemm import (LANES, ROWS, bf16_product, bf16_product_reference, fits, pack_columns,
                                         pack_row_pairs, pack_rows, pack_transposed, to_bf16, transpose)

SPECIALS = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, -3e-39, 3.4e38, -3.4e38, 1.0 + 2 ** -8,
                     1.0 + 3 * 2 ** -8, 65504.0, 1.0000001], np.float32)


def torch_bits(x: np.ndarray) -> np.ndarray:
    """torch's float32 -> bfloat16 conversion, as uint16 bits; every NaN as ours (a quiet NaN with
    the input's sign: torch's vectorized conversion picks other signs and payloads, which mean nothing)."""
    bits = torch.from_numpy(np.ascontiguousarray(x)).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    nan = np.isnan(x)
    bits[nan] = np.where(np.signbit(x[nan]), 0xFFC0, 0x7FC0)
    return bits


def pairs_of(bits16: np.ndarray) -> np.ndarray:
    """uint16 (..., 2k) -> uint32 (..., k): element 2j in the low half, 2j+1 in the high half."""
    return bits16.astype(np.uint32)[..., 0::2] | (bits16.astype(np.uint32)[..., 1::2] << 16)


def matrix(rng, rows: int, cols: int) -> np.ndarray:
    x = (rng.standard_normal((rows, cols)) * 10.0 ** rng.integers(-3, 3, (rows, cols))).astype(np.float32)
    flat = x.reshape(-1)
    at = rng.choice(flat.size, size=min(flat.size, SPECIALS.size), replace=False)
    flat[at] = SPECIALS[:at.size]
    return x


def test_packs_round_as_torch_does_and_lay_pairs_out_as_documented():
    rng = np.random.default_rng(0)
    x = matrix(rng, 12, 32)  # K x N for the `b` packs, M x K for the `a` ones
    bits = torch_bits(x)
    out = np.empty((12, 16), np.uint32)
    pack_rows(x, out)
    np.testing.assert_array_equal(out, pairs_of(bits))
    out = np.empty((6, 32), np.uint32)
    pack_row_pairs(x, out)
    np.testing.assert_array_equal(out, pairs_of(bits.T).T)
    scratch = np.empty(12 * 16, np.uint32)
    out = np.empty((16, 12), np.uint32)
    pack_transposed(x, out, scratch)
    np.testing.assert_array_equal(out, pairs_of(bits).T)
    out = np.empty((32, 6), np.uint32)
    pack_columns(x, out, scratch)
    np.testing.assert_array_equal(out, pairs_of(bits.T))
    np.testing.assert_array_equal(to_bf16(x).view(np.uint32) >> 16, bits)


@settings(max_examples=40, deadline=None)
@given(m=st.integers(1, 9), n=st.integers(1, 11), k=st.integers(1, 24), accumulate=st.booleans(), seed=st.integers(0, 99))
def test_product_equals_the_reference(m, n, k, accumulate, seed):
    assert_product_within_float32_summation(bf16_product, ROWS * m, LANES * n, 2 * k, accumulate, seed)


def assert_product_within_float32_summation(product, m, n, k, accumulate, seed):
    rng = np.random.default_rng(seed)
    a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    start = rng.standard_normal((m, n)).astype(np.float32)
    packed_a, packed_b = np.empty((m, k // 2), np.uint32), np.empty((k // 2, n), np.uint32)
    pack_rows(a, packed_a)
    pack_row_pairs(b, packed_b)
    c = start.copy()
    product(c, packed_a, packed_b, accumulate)
    want = bf16_product_reference(a, b).astype(np.float64) + (start if accumulate else 0.0)
    # float32 accumulation over k terms (and the start) against float64: k+1 roundings of 2^-24 of the terms' sizes
    bound = (np.abs(to_bf16(a)).astype(np.float64) @ np.abs(to_bf16(b)) + np.abs(start)) * (k + 1) * 2.0 ** -24
    assert np.all(np.abs(c - want) <= bound + 1e-30)


@pytest.mark.skipif(not bf16_gemm._AMX, reason="needs AMX tiles this process may use")
@settings(max_examples=30, deadline=None)
@given(m=st.integers(1, 5), n=st.integers(1, 5), k=st.integers(1, 6), accumulate=st.booleans(), seed=st.integers(0, 99))
def test_amx_tiles_equal_the_reference(m, n, k, accumulate, seed):
    """Every 32 x 32 block and every K step of 32 on the tiles (a block, a tile or a K step missed or
    crossed would be off by whole products)."""
    m, n, k = bf16_gemm.AMX_BLOCK * m, bf16_gemm.AMX_BLOCK * n, 2 * bf16_gemm.AMX_PAIRS * k
    assert bf16_gemm.amx_fits(m, n, k) and bf16_product is bf16_gemm._amx_or_vector_product
    assert_product_within_float32_summation(bf16_product, m, n, k, accumulate, seed)


@pytest.mark.skipif(not bf16_gemm._AMX, reason="needs AMX tiles this process may use")
def test_shapes_off_the_tiles_take_the_vector_loop_bit_for_bit():
    rng = np.random.default_rng(3)
    for m, n, k in ((36, 32, 32), (32, 48, 32), (32, 32, 40), (4, 16, 2)):
        assert not bf16_gemm.amx_fits(m, n, k)
        packed_a = rng.integers(0, 2 ** 32, (m, k // 2), dtype=np.uint64).astype(np.uint32) & np.uint32(0x3FFF3FFF)
        packed_b = rng.integers(0, 2 ** 32, (k // 2, n), dtype=np.uint64).astype(np.uint32) & np.uint32(0x3FFF3FFF)
        c, want = np.zeros((m, n), np.float32), np.zeros((m, n), np.float32)
        bf16_product(c, packed_a, packed_b, False)
        bf16_gemm._vector_product(want, packed_a, packed_b, False)
        np.testing.assert_array_equal(c, want)


@settings(max_examples=30, deadline=None)
@given(rows=st.integers(1, 50), cols=st.integers(1, 50), seed=st.integers(0, 99))
def test_transpose_equals_numpys(rows, cols, seed):
    """16 x 16 blocks in registers and the edges element by element, any shape."""
    src = np.random.default_rng(seed).integers(0, 2 ** 32, (rows, cols), dtype=np.uint64).astype(np.uint32)
    dst = np.zeros((cols, rows), np.uint32)
    transpose(src, dst)
    np.testing.assert_array_equal(dst, src.T)


def test_the_shapes_the_tiles_take():
    assert fits(4, 16, 2) and fits(64, 256, 256) and fits(256, 48, 64)
    assert not fits(6, 16, 2) and not fits(4, 24, 2) and not fits(4, 16, 3) and not fits(0, 16, 2)


def test_products_of_specials_follow_float32():
    """inf and NaN operands give what float32 products of the rounded values give (no fast-math)."""
    a = np.ones((4, 2), np.float32)
    a[0, 0], a[1, 0], a[2, 0] = np.inf, np.nan, 0.0
    b = np.ones((2, 16), np.float32)
    b[0, 1] = -np.inf
    packed_a, packed_b = np.empty((4, 1), np.uint32), np.empty((1, 16), np.uint32)
    pack_rows(a, packed_a)
    pack_row_pairs(b, packed_b)
    c = np.empty((4, 16), np.float32)
    bf16_product(c, packed_a, packed_b, False)
    with np.errstate(invalid="ignore"):
        want = bf16_product_reference(a, b)
    np.testing.assert_array_equal(c, want)


@pytest.mark.skipif(not bf16_gemm._HARDWARE, reason="needs AVX-512 BF16 to compare the emulation with")
def test_the_emulation_gives_the_instructions_bits(tmp_path):
    """A fresh process compiles the kernel without the instruction (as on a CPU lacking it) into its
    own numba cache; its products equal this process's to the bit."""
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((8, 40)).astype(np.float32), rng.standard_normal((40, 80)).astype(np.float32)
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", b)
    script = textwrap.dedent(f"""
        import numpy as np
        from pearl.kernels.cpu import bf16_gemm
        bf16_gemm._HARDWARE = False
        a, b = np.load({str(tmp_path / 'a.npy')!r}), np.load({str(tmp_path / 'b.npy')!r})
        pa, pb = np.empty((8, 20), np.uint32), np.empty((20, 80), np.uint32)
        bf16_gemm.pack_rows(a, pa)
        bf16_gemm.pack_row_pairs(b, pb)
        c = np.empty((8, 80), np.float32)
        bf16_gemm.bf16_product(c, pa, pb, False)
        np.save({str(tmp_path / 'c.npy')!r}, c)
    """)
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"))
    subprocess.run([sys.executable, "-c", script], check=True, env=env, timeout=300)
    pa, pb = np.empty((8, 20), np.uint32), np.empty((20, 80), np.uint32)
    pack_rows(a, pa)
    pack_row_pairs(b, pb)
    c = np.empty((8, 80), np.float32)
    bf16_product(c, pa, pb, False)
    np.testing.assert_array_equal(np.load(tmp_path / "c.npy"), c)
