"""bfloat16 matrix products with float32 accumulation, compiled with numba (AVX-512 BF16).

`bf16_product(c, a, b, accumulate)` computes c (M x N, float32) = [c +] a . b where both operands
hold bfloat16 values in pairs along the product's inner dimension K, one pair per uint32 (the
layout of the `vdpbf16ps` instruction: each 32-bit lane of the result takes two products and their
sum): `a` is M x K/2 (row m's pairs), `b` is K/2 x N (row kp holds the pairs (b[2kp, n], b[2kp+1, n])
for every n). The pack_* functions below write those layouts from float32 arrays, rounding to the
nearest even bfloat16 as torch's conversion does. `bf16_product_reference` is the numpy reference
the kernel is tested against (tests/test_bf16_gemm.py).

Why this exists: the fused DQN step's products (4-256-256-2 at batch 64: 64 x 256 x 256) run at
~95 GFLOP/s in one core's float32 BLAS; this kernel runs them at ~200-225 GFLOP/s on the same core
(docs/BENCHMARKS.md, issue 19, session 23), and torch's own bfloat16 products lose that gain to
their per-call cost at this size (session 22). The kernel tiles c in blocks of 4 rows x 64 columns
(16 zmm accumulators) and walks K once per block. On a CPU without AVX-512 BF16 the same code
compiles to float32 fused multiply-adds of the unpacked values, in the instruction's order (the odd
element of each pair first), so the results are the same there and only the speed differs; the
planner offers bf16 only where the hardware has it (kernels/cpu/backend.py bf16_products).
Shapes: M a multiple of 4, N of 16 (`fits`); callers run other shapes in float32.

On a CPU with AMX (Intel Sapphire / Emerald Rapids and later) whose kernel lets this process use
its tile registers (`_amx_permitted`), products of M and N multiples of 32 and K of 32 run on the
tiles instead (`_AMX_BLOCKS`: 32 x 32 blocks of c as four 16 x 16 float32 tiles, K in steps of 32,
the operands' pair layout being AMX's own). Why: on such a core the AVX-512 BF16 loop above gains
nothing over float32 (its two 512-bit FMA ports already run float32 at the dot product's rate:
46-75 GFLOP/s at the DQN step's shapes), while the tiles run 64 x 256 x 256 at ~230 GFLOP/s and
256 x 64 x 256 at ~420 (docs/BENCHMARKS.md, issue 19, session 30). A tile product sums each K step
in the hardware's order, not the loop's, so its results differ from the other paths' in the last
bits (within the same float32 bound of the reference).
"""
from __future__ import annotations

import ctypes
import platform
import sys

import numpy as np
from llvmlite import binding as llvm
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

_NJIT = dict(cache=True, nogil=True, error_model="numpy")

ROWS, LANES, WIDE = 4, 16, 4  # a tile: ROWS rows x WIDE vectors of LANES float32 columns
_HARDWARE = bool(llvm.get_host_cpu_features().get("avx512bf16", False))


def _amx_permitted() -> bool:
    """Whether this CPU has AMX bfloat16 tiles and Linux lets this process use them: the tile data
    is off until a process asks (arch_prctl ARCH_REQ_XCOMP_PERM), and a tile instruction without
    that permission kills the process (SIGILL). Asked once per process, at import; forked children
    keep it."""
    features = llvm.get_host_cpu_features()
    if not (features.get("amx-bf16", False) and features.get("amx-tile", False)):
        return False
    if sys.platform != "linux" or platform.machine() != "x86_64":
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA) == 0
    except (OSError, AttributeError):
        return False


_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA = 158, 0x1023, 18  # x86_64 Linux
_AMX = _amx_permitted()
AMX_BLOCK, AMX_PAIRS = 32, 16  # c in 32 x 32 blocks (four 16 x 16 tiles); K in steps of 16 pairs
_F32X16 = ir.VectorType(ir.FloatType(), LANES)
_I32X16 = ir.VectorType(ir.IntType(32), LANES)


def fits(m: int, n: int, k: int) -> bool:
    """Whether an m x k by k x n product runs here (else the caller's float32 path)."""
    return m % ROWS == 0 and n % LANES == 0 and k % 2 == 0 and min(m, n, k) > 0


def _pair_products(builder, acc, a, b):
    """acc + a.b pairwise, lane by lane (vdpbf16ps)."""
    if _HARDWARE:
        # LLVM upgrades this i32-vector form of the declaration to its bfloat form when it parses the module
        fn = builder.module.declare_intrinsic("llvm.x86.avx512bf16.dpbf16ps.512",
                                              fnty=ir.FunctionType(_F32X16, [_F32X16, _I32X16, _I32X16]))
        return builder.call(fn, [acc, a, b])
    fma = builder.module.declare_intrinsic("llvm.fma.v16f32", fnty=ir.FunctionType(_F32X16, [_F32X16] * 3))
    high = ir.Constant(_I32X16, [0xFFFF0000] * LANES)
    sixteen = ir.Constant(_I32X16, [16] * LANES)
    odd = [builder.bitcast(builder.and_(v, high), _F32X16) for v in (a, b)]
    even = [builder.bitcast(builder.shl(v, sixteen), _F32X16) for v in (a, b)]
    acc = builder.call(fma, [odd[0], odd[1], acc])
    return builder.call(fma, [even[0], even[1], acc])


def _tile(wide: int, accumulate: bool):
    """An intrinsic: c[m0:m0+ROWS, n0:n0+wide*LANES] (+)= a[m0:m0+ROWS] . b[:, n0:...], its
    accumulators held in registers across the whole K loop."""
    @intrinsic
    def tile(typingctx, c, a, b, m0, n0):
        def codegen(context, builder, sig, args):
            arrays = [context.make_array(ty)(context, builder, value) for ty, value in zip(sig.args[:3], args[:3])]
            c_arr, a_arr, b_arr = arrays
            row0, col0 = args[3], args[4]
            i64 = ir.IntType(64)
            ldc = cgutils.unpack_tuple(builder, c_arr.shape)[1]
            pairs = cgutils.unpack_tuple(builder, a_arr.shape)[1]
            ldb = cgutils.unpack_tuple(builder, b_arr.shape)[1]
            slots = []
            for r in range(ROWS):
                row = []
                for v in range(wide):
                    at = builder.add(builder.mul(builder.add(row0, i64(r)), ldc), builder.add(col0, i64(LANES * v)))
                    pointer = builder.bitcast(builder.gep(c_arr.data, [at]), _F32X16.as_pointer())
                    slot = cgutils.alloca_once(builder, _F32X16)
                    builder.store(builder.load(pointer, align=4) if accumulate else ir.Constant(_F32X16, [0.0] * LANES),
                                  slot)
                    row.append((slot, pointer))
                slots.append(row)
            with cgutils.for_range(builder, pairs) as loop:
                kp = loop.index
                b_vectors = []
                for v in range(wide):
                    at = builder.add(builder.mul(kp, ldb), builder.add(col0, i64(LANES * v)))
                    b_vectors.append(builder.load(builder.bitcast(builder.gep(b_arr.data, [at]), _I32X16.as_pointer()),
                                                  align=4))
                for r in range(ROWS):
                    at = builder.add(builder.mul(builder.add(row0, i64(r)), pairs), kp)
                    pair = builder.load(builder.gep(a_arr.data, [at]))
                    undefined = ir.Constant(_I32X16, ir.Undefined)
                    splat = builder.shuffle_vector(builder.insert_element(undefined, pair, i64(0)), undefined,
                                                   ir.Constant(_I32X16, [0] * LANES))
                    for v in range(wide):
                        slot = slots[r][v][0]
                        builder.store(_pair_products(builder, builder.load(slot), splat, b_vectors[v]), slot)
            for row in slots:
                for slot, pointer in row:
                    builder.store(builder.load(slot), pointer, align=4)
            return context.get_dummy_value()
        return types.void(c, a, b, m0, n0), codegen
    return tile


_TILE_SET, _TILE_ADD = _tile(WIDE, False), _tile(WIDE, True)
_STRIP_SET, _STRIP_ADD = _tile(1, False), _tile(1, True)


_I8, _I16, _I64 = ir.IntType(8), ir.IntType(16), ir.IntType(64)
_BYTES = _I8.as_pointer()


def _tile_op(builder, name: str, *args):
    kinds = [arg.type for arg in args]
    fn = builder.module.declare_intrinsic(f"llvm.x86.{name}", fnty=ir.FunctionType(ir.VoidType(), kinds))
    builder.call(fn, list(args))


@intrinsic
def _AMX_BLOCKS(typingctx, c, a, b, accumulate):
    """c (+)= a . b on AMX tiles: tiles 0-3 hold a 32 x 32 block of c, 4-5 its rows' 16 pairs of
    a, 6-7 the 16 pair rows of b for its two column halves. The tile configuration is loaded and
    released within the call: it is per thread, and the caller's threads are numba's and a pool's."""
    def codegen(context, builder, sig, args):
        c_arr, a_arr, b_arr = (context.make_array(ty)(context, builder, value)
                               for ty, value in zip(sig.args[:3], args[:3]))
        config_type = ir.ArrayType(_I8, 64)
        config = cgutils.alloca_once(builder, config_type)
        builder.store(ir.Constant(config_type, [0] * 64), config)
        config = builder.bitcast(config, _BYTES)
        builder.store(_I8(1), config)  # palette 1; every tile 16 rows of 64 bytes
        for tile in range(8):
            builder.store(_I16(64), builder.bitcast(builder.gep(config, [_I64(16 + 2 * tile)]), _I16.as_pointer()))
            builder.store(_I8(16), builder.gep(config, [_I64(48 + tile)]))
        _tile_op(builder, "ldtilecfg", config)
        m, n = cgutils.unpack_tuple(builder, c_arr.shape)
        pairs = cgutils.unpack_tuple(builder, a_arr.shape)[1]
        ldb = cgutils.unpack_tuple(builder, b_arr.shape)[1]

        def at(array, row, col, width):
            return builder.bitcast(builder.gep(array.data, [builder.add(builder.mul(row, width), col)]), _BYTES)

        def stride(width):
            return builder.mul(width, _I64(4))

        quarters = ((0, 0), (0, 16), (16, 0), (16, 16))
        with cgutils.for_range_slice(builder, _I64(0), m, _I64(AMX_BLOCK)) as (m0, _):
            with cgutils.for_range_slice(builder, _I64(0), n, _I64(AMX_BLOCK)) as (n0, _):
                with builder.if_else(cgutils.is_true(builder, args[3])) as (add, overwrite):
                    with add:
                        for tile, (row, col) in enumerate(quarters):
                            _tile_op(builder, "tileloadd64", _I8(tile),
                                     at(c_arr, builder.add(m0, _I64(row)), builder.add(n0, _I64(col)), n), stride(n))
                    with overwrite:
                        for tile in range(4):
                            _tile_op(builder, "tilezero", _I8(tile))
                with cgutils.for_range_slice(builder, _I64(0), pairs, _I64(AMX_PAIRS)) as (k0, _):
                    _tile_op(builder, "tileloadd64", _I8(4), at(a_arr, m0, k0, pairs), stride(pairs))
                    _tile_op(builder, "tileloadd64", _I8(5), at(a_arr, builder.add(m0, _I64(16)), k0, pairs), stride(pairs))
                    _tile_op(builder, "tileloadd64", _I8(6), at(b_arr, k0, n0, ldb), stride(ldb))
                    _tile_op(builder, "tileloadd64", _I8(7), at(b_arr, k0, builder.add(n0, _I64(16)), ldb), stride(ldb))
                    for tile, (row, col) in enumerate(quarters):
                        _tile_op(builder, "tdpbf16ps", _I8(tile), _I8(4 + row // 16), _I8(6 + col // 16))
                for tile, (row, col) in enumerate(quarters):
                    _tile_op(builder, "tilestored64", _I8(tile),
                             at(c_arr, builder.add(m0, _I64(row)), builder.add(n0, _I64(col)), n), stride(n))
        _tile_op(builder, "tilerelease")
        return context.get_dummy_value()
    return types.void(c, a, b, accumulate), codegen


@njit(inline="always")
def _amx_shape(m, n, pairs):
    return m % AMX_BLOCK == 0 and n % AMX_BLOCK == 0 and pairs % AMX_PAIRS == 0 and min(m, n, pairs) > 0


def amx_fits(m: int, n: int, k: int) -> bool:
    """Whether an m x k by k x n product runs on the AMX tiles here (else on the vector loop)."""
    return _AMX and k % 2 == 0 and _amx_shape(m, n, k // 2)


@njit(**_NJIT)
def _amx_or_vector_product(c, a, b, accumulate):
    if _amx_shape(c.shape[0], c.shape[1], a.shape[1]):
        _AMX_BLOCKS(c, a, b, accumulate)
    else:
        _vector_product(c, a, b, accumulate)


@njit(**_NJIT)
def _vector_product(c, a, b, accumulate):
    """c = a . b (accumulate: c += a . b); c float32 M x N, a uint32 M x K/2, b uint32 K/2 x N,
    all C-contiguous; M a multiple of ROWS, N of LANES."""
    m, n = c.shape
    for m0 in range(0, m, ROWS):
        n0 = 0
        while n0 + WIDE * LANES <= n:
            if accumulate:
                _TILE_ADD(c, a, b, m0, n0)
            else:
                _TILE_SET(c, a, b, m0, n0)
            n0 += WIDE * LANES
        while n0 < n:
            if accumulate:
                _STRIP_ADD(c, a, b, m0, n0)
            else:
                _STRIP_SET(c, a, b, m0, n0)
            n0 += LANES


# (chosen here, not inside one compiled function, so that no process without the permission ever
# compiles or loads tile instructions from numba's cache)
bf16_product = _amx_or_vector_product if _AMX else _vector_product
bf16_product.__doc__ = _vector_product.__doc__


@njit(inline="always")
def _bf16_bits(bits):
    """A float32's bits -> the nearest-even bfloat16's (in the low 16 bits); NaN stays a quiet NaN.
    Each step cast back to uint32: numba widens integer arithmetic to 64 bits, which halves the
    lanes of the vectorized packs (14 -> 6.7 us for a 256 x 256 weight)."""
    u = np.uint32(bits)
    nan = np.uint32(((u >> np.uint32(16)) & np.uint32(0x8000)) | np.uint32(0x7FC0))
    rounded = np.uint32(np.uint32(u + np.uint32(0x7FFF)) + ((u >> np.uint32(16)) & np.uint32(1)))
    return nan if (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000) else np.uint32(rounded >> np.uint32(16))


@njit(inline="always")
def _pair(low, high):
    return np.uint32(_bf16_bits(low) | np.uint32(_bf16_bits(high) << np.uint32(16)))


@njit(**_NJIT)
def pack_rows(x, out):
    """x (M x K float32) -> out (M x K/2): pairs along each row (an operand `a`)."""
    bits = x.view(np.uint32)
    for m in range(out.shape[0]):
        for kp in range(out.shape[1]):
            out[m, kp] = _pair(bits[m, 2 * kp], bits[m, 2 * kp + 1])


@njit(**_NJIT)
def pack_row_pairs(x, out):
    """x (K x N float32) -> out (K/2 x N): rows 2kp and 2kp+1 interleaved (an operand `b`)."""
    bits = x.view(np.uint32)
    for kp in range(out.shape[0]):
        for n in range(out.shape[1]):
            out[kp, n] = _pair(bits[2 * kp, n], bits[2 * kp + 1, n])


@intrinsic
def _transpose_block(typingctx, src, dst, row0, col0):
    """dst[col0:col0+16, row0:row0+16] = src[row0:row0+16, col0:col0+16].T for 2D uint32 arrays:
    16 vector loads, four rounds of pairwise lane shuffles (each swaps the off-diagonal blocks of
    side 8, 4, 2, 1), 16 vector stores."""
    def codegen(context, builder, sig, args):
        source, target = (context.make_array(ty)(context, builder, value) for ty, value in zip(sig.args[:2], args[:2]))
        first_row, first_col = args[2], args[3]
        i64 = ir.IntType(64)
        source_width = cgutils.unpack_tuple(builder, source.shape)[1]
        target_width = cgutils.unpack_tuple(builder, target.shape)[1]
        rows = []
        for r in range(LANES):
            at = builder.add(builder.mul(builder.add(first_row, i64(r)), source_width), first_col)
            rows.append(builder.load(builder.bitcast(builder.gep(source.data, [at]), _I32X16.as_pointer()), align=4))
        for side in (8, 4, 2, 1):
            for r in range(LANES):
                if r & side:
                    continue
                upper = [j if not j & side else LANES + j - side for j in range(LANES)]
                lower = [j + side if not j & side else LANES + j for j in range(LANES)]
                rows[r], rows[r + side] = (builder.shuffle_vector(rows[r], rows[r + side], ir.Constant(_I32X16, mask))
                                           for mask in (upper, lower))
        for c in range(LANES):
            at = builder.add(builder.mul(builder.add(first_col, i64(c)), target_width), first_row)
            builder.store(rows[c], builder.bitcast(builder.gep(target.data, [at]), _I32X16.as_pointer()), align=4)
        return context.get_dummy_value()
    return types.void(src, dst, row0, col0), codegen


@njit(**_NJIT)
def transpose(src, dst):
    """dst = src.T for 2D uint32 arrays (dst C-contiguous): 16 x 16 blocks in registers, the edges
    element by element."""
    rows, cols = src.shape
    whole_rows, whole_cols = rows - rows % LANES, cols - cols % LANES
    for r0 in range(0, whole_rows, LANES):
        for c0 in range(0, whole_cols, LANES):
            _transpose_block(src, dst, r0, c0)
    for r in range(rows):
        for c in range(whole_cols if r < whole_rows else 0, cols):
            dst[c, r] = src[r, c]


@njit(**_NJIT)
def interleave_rows(rows, out):
    """rows (K x N uint16, bfloat16 bits) -> out (K/2 x N): pack_row_pairs of values already rounded."""
    for kp in range(out.shape[0]):
        for n in range(out.shape[1]):
            out[kp, n] = np.uint32(rows[2 * kp, n]) | np.uint32(np.uint32(rows[2 * kp + 1, n]) << np.uint32(16))


@njit(inline="always")
def bf16_bits(bits):
    """A float32's bits (as uint32) -> its nearest-even bfloat16's, as uint16."""
    return np.uint16(_bf16_bits(bits))


@njit(**_NJIT)
def pack_transposed(x, out, scratch):
    """x (N x K float32) -> out (K/2 x N): operand `b` of a product with x's transpose
    (y = inputs . W.T with W stored out x in, as a Linear layer's weight); `scratch` uint32 of at
    least N x K/2 (x packed by rows, then transposed: 60 -> 15 us for 256 x 256 against one pass
    that writes across out's rows)."""
    rows = scratch[:out.size].reshape((out.shape[1], out.shape[0]))
    pack_rows(x, rows)
    transpose(rows, out)


@njit(**_NJIT)
def pack_columns(x, out, scratch):
    """x (K x M float32) -> out (M x K/2): operand `a` of a product with x's transpose (a weight
    gradient grad_z.T . inputs, K the batch); `scratch` uint32 of at least K/2 x M."""
    pairs = scratch[:out.size].reshape((out.shape[1], out.shape[0]))
    pack_row_pairs(x, pairs)
    transpose(pairs, out)


def to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to the nearest-even bfloat16, as float32 (the reference's rounding)."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    nan = (bits & 0x7FFFFFFF) > 0x7F800000
    rounded[nan] = ((bits[nan] >> 16) & 0x8000 | 0x7FC0) << 16
    return rounded.astype(np.uint32).view(np.float32).reshape(np.shape(x))


def bf16_product_reference(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a (M x K) . b (K x N) of float32 arrays with both rounded to bfloat16, summed in float64."""
    return (to_bf16(a).astype(np.float64) @ to_bf16(b).astype(np.float64)).astype(np.float32)
