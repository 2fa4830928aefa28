"""Transition storage for the CPU replays: every field of a transition in one row, and the compiled
(numba) insert, gather and importance-weight kernels.

Why rows: a batch of 256 random transitions read from one array per field (obs, actions, rewards,
next_obs, discounts) costs 5 cache misses per transition; with the fields of a transition side by
side in one row it costs one (obs dim 4: 48 bytes padded to a 64-byte line) or three (obs dim 17:
152 bytes in 192). Rows start on 64-byte boundaries and a row of 64 bytes or less never straddles
two lines.

- `RowRing(capacity, layout)`: the ring. `layout` is ((name, dtype, shape), ...); `fields[name]` is
  a numpy view (capacity, *shape) into the rows, so numpy code reads and writes fields as usual.
  `insert(start, count, values)` writes a batch at `start` (wrapping; a batch longer than the ring
  keeps its last `capacity` rows, as sequential writes would); a batch of arrays of exactly the
  fields' dtypes, C-contiguous, is written by one compiled call (`insert_rows`), anything else by
  numpy's casting assignment. `gather(indices)` copies the rows into per-field C-contiguous outputs
  (one preallocated block per batch size, reused by the next gather of that size) in one compiled
  call; `sample_uniform(uniforms, size)` does the same for rows floor(u * size).
- `gather_rows(rows, indices, out, row_offsets, widths)`: the gather kernel, in 4-byte words.
  Fields wider than 8 words (observation vectors) are copied as 8-word vector loads and stores.
- `importance_weights(priorities_of_batch, total, min_priority, size, beta, out, scratch)`:
  prioritized replay's w_i = (N P(i))^-beta / (N P_min)^-beta.
"""
from __future__ import annotations

from functools import partial

import numpy as np
from llvmlite import ir
from numba import literal_unroll, njit, types
from numba.extending import intrinsic

from pearl.kernels.cpu.fast_sumtree import _prefetch
from pearl.kernels.cpu.fastmath import power

_NJIT = dict(cache=True, nogil=True)
LINE = 64  # bytes in a cache line


@njit(inline="always")
def _prefetch_row(rows, index):
    """Prefetches every cache line of row `index` of a (capacity, words) uint32 array."""
    width = rows.shape[1]
    for word in range(0, width, LINE // 4):
        _prefetch(rows[index], word)


def _word_copy(count):
    """An intrinsic copy(dst, dst_index, src, src_index): dst.flat[dst_index:dst_index + count] =
    src.flat[src_index:src_index + count] for C-contiguous uint32 or uint8 arrays of one dtype, as
    one load and one store (no bounds check; flat indices, so no per-access index arithmetic on
    2-d rows)."""

    def copy(typingctx, dst, dst_index, src, src_index):
        if not (isinstance(dst, types.Array) and isinstance(src, types.Array) and dst.layout == "C"
                and src.layout == "C" and dst.dtype == src.dtype and dst.dtype in (types.uint32, types.uint8)):
            return None
        bits = dst.dtype.bitwidth

        def codegen(context, builder, signature, args):
            lanes = (ir.VectorType(ir.IntType(bits), count) if count > 1 else ir.IntType(bits)).as_pointer()
            target = context.make_array(signature.args[0])(context, builder, args[0])
            source = context.make_array(signature.args[2])(context, builder, args[2])
            value = builder.load(builder.bitcast(builder.gep(source.data, [args[3]]), lanes), align=bits // 8)
            builder.store(value, builder.bitcast(builder.gep(target.data, [args[1]]), lanes), align=bits // 8)
            return context.get_dummy_value()

        return types.void(dst, dst_index, src, src_index), codegen

    return intrinsic(copy)


_copy1 = _word_copy(1)
_copy8 = _word_copy(8)

STREAM_BYTES = 16  # one non-temporal store: the widest whose alignment a frame row keeps (16-byte rows)


@intrinsic
def _stream_store(typingctx, dst_address, src_address):
    """STREAM_BYTES from src_address (any alignment) stored at dst_address (STREAM_BYTES-aligned)
    past the caches: a non-temporal store, which does not read the destination's line first.
    Such stores are ordered only by a fence: `_store_fence` after them."""
    if not (isinstance(dst_address, types.Integer) and isinstance(src_address, types.Integer)):
        return None

    def codegen(context, builder, signature, args):
        lanes = ir.VectorType(ir.IntType(8), STREAM_BYTES).as_pointer()
        value = builder.load(builder.inttoptr(args[1], lanes), align=1)
        store = builder.store(value, builder.inttoptr(args[0], lanes), align=STREAM_BYTES)
        store.set_metadata("nontemporal", builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)]))
        return context.get_dummy_value()

    return types.void(dst_address, src_address), codegen


@intrinsic
def _store_fence(typingctx):
    """A full fence (x86: mfence), which orders the non-temporal stores before it."""
    def codegen(context, builder, signature, args):
        builder.fence("seq_cst")
        return context.get_dummy_value()

    return types.void(), codegen


@njit(inline="always")
def _stream_row(dst, src):
    """dst[:] = src for 1-d uint8 rows of a length that is a multiple of STREAM_BYTES, contiguous,
    dst STREAM_BYTES-aligned, by non-temporal stores (`_store_fence` before the rows are read
    elsewhere)."""
    to, of = dst.ctypes.data, src.ctypes.data
    for k in range(0, dst.shape[0], STREAM_BYTES):
        _stream_store(to + k, of + k)


@njit(inline="always")
def _copy_words(dst, dst_index, src, src_index, width):
    """dst.flat[dst_index:dst_index + width] = src.flat[src_index:src_index + width]: 8-word vector
    copies, then word by word. LLVM does not vectorize a copy of a runtime length as short as a
    row's field (17 words: 17 scalar moves)."""
    full = width - width % 8
    for w in range(0, full, 8):
        _copy8(dst, dst_index + w, src, src_index + w)
    for w in range(full, width):
        _copy1(dst, dst_index + w, src, src_index + w)


@njit(inline="always")
def _copy_field(rows, indices, out, dst, offset, width):
    """out[dst + i * width + w] = rows[indices[i], offset + w]. Widths of 1, 2, 4 and 8 words (a
    float32 scalar, an int64 or a float64, small vectors) copy with constant trip counts: a loop
    of a runtime length per row cost 4 of the 7 us of a batch-256 gather (measured)."""
    b = indices.shape[0]
    if width == 1:
        for i in range(b):
            out[dst + i] = rows[indices[i], offset]
    elif width == 2:
        for i in range(b):
            for w in range(2):
                out[dst + 2 * i + w] = rows[indices[i], offset + w]
    elif width == 4:
        for i in range(b):
            for w in range(4):
                out[dst + 4 * i + w] = rows[indices[i], offset + w]
    elif width == 8:
        for i in range(b):
            for w in range(8):
                out[dst + 8 * i + w] = rows[indices[i], offset + w]
    else:  # obs vectors: 8-word vector copies (obs dim 17: a 16.7 -> 8.7 us gather, measured)
        stride = rows.shape[1]
        for i in range(b):
            _copy_words(out, dst + i * width, rows, indices[i] * stride + offset, width)


@njit(inline="always")
def _copy_rows(rows, indices, out, row_offsets, widths):
    """out holds each field's batch block after the previous one: block f is (B, widths[f]) words
    starting at B * sum(widths[:f])."""
    block = 0
    for f in range(widths.shape[0]):
        _copy_field(rows, indices, out, block, row_offsets[f], widths[f])
        block += indices.shape[0] * widths[f]


@njit(**_NJIT)
def gather_rows(rows, indices, out, row_offsets, widths):
    """Copies rows[indices] field by field into `out` (see _copy_rows). Every row is prefetched
    first, so the misses of a batch of random rows overlap. Returns the first index out of range,
    or -1."""
    capacity = rows.shape[0]
    for i in range(indices.shape[0]):
        j = indices[i]
        if j < 0 or j >= capacity:
            return i
        _prefetch_row(rows, j)
    _copy_rows(rows, indices, out, row_offsets, widths)
    return -1


@njit(**_NJIT)
def gather_uniform_rows(rows, indices, out, row_offsets, widths, uniforms, size):
    """indices[i] = floor(uniforms[i] * size) (a float64 uniform in [0, 1) scaled: unbiased to
    2^-53, ~5x cheaper than Generator.integers), then gather_rows of them."""
    for i in range(indices.shape[0]):
        j = np.int64(uniforms[i] * size)
        indices[i] = j
        _prefetch_row(rows, j)
    _copy_rows(rows, indices, out, row_offsets, widths)


@njit(**_NJIT)
def importance_weights(priorities_of_batch, total, min_priority, size, beta, out, scratch):
    """out[i] = (N P(i))^-beta / (N P_min)^-beta with P(i) = p_i / total, N = size, computed as
    (p_i / p_min) ** -beta, within a few float64 ulps of the formula (the power by
    kernels/cpu/fastmath.py, `scratch` a float64 array as long as the batch; one multiply by
    1 / p_min instead of two divisions per weight: ~0.3 us of a batch of 256). Without a usable
    minimum (empty tree: inf, or 0), normalised by the batch's largest weight instead."""
    n = priorities_of_batch.shape[0]
    if min_priority > 0 and min_priority < np.inf and total > 0:
        reciprocal = 1.0 / min_priority
        for i in range(n):
            scratch[i] = priorities_of_batch[i] * reciprocal
        power(scratch[:n], -beta, out)
        return out
    top = 0.0
    for i in range(n):
        w = (size * (priorities_of_batch[i] / total)) ** -beta
        top = w if w > top else top
    for i in range(n):
        out[i] = ((size * (priorities_of_batch[i] / total)) ** -beta) / top
    return out


@njit(**_NJIT)
def _write_words(rows, offset, width, words, start, count):
    """rows[(start + i) % capacity, offset:offset + width] = words[i * width:(i + 1) * width].
    Scalar fields (1 or 2 words) with constant trip counts (measured ~10% faster)."""
    capacity = rows.shape[0]
    slot = start
    if width == 1:
        for i in range(count):
            rows[slot, offset] = words[i]
            slot += 1
            if slot == capacity:
                slot = 0
    elif width == 2:
        for i in range(count):
            for w in range(2):
                rows[slot, offset + w] = words[2 * i + w]
            slot += 1
            if slot == capacity:
                slot = 0
    else:
        stride = rows.shape[1]
        for i in range(count):
            _copy_words(rows, slot * stride + offset, words, i * width, width)
            slot += 1
            if slot == capacity:
                slot = 0


@njit(**_NJIT)
def insert_rows(rows, row_offsets, widths, values, start, count):
    """Writes `count` transitions at slots start, start + 1, ... (mod capacity): `values` holds one
    C-contiguous array per field, in layout order, of exactly the field's dtype with `count` rows.
    Field by field: one pass per field, the rows stay in L1 after the first."""
    f = 0
    for value in literal_unroll(values):
        _write_words(rows, row_offsets[f], widths[f], value.reshape(-1).view(np.uint32), start, count)
        f += 1


@njit(**_NJIT)
def insert_frame(rows, row_offsets, widths, frame, offsets, start, count):
    """insert_rows from one received message: field f's `count` rows are the C-order bytes at
    frame[offsets[f]:] (frame a uint8 array, each offset a multiple of 4), copied word for word
    without an array per field (a replay server's INSERT: ~4 us of views and a tuple dispatch less)."""
    for f in range(widths.shape[0]):
        at = offsets[f]
        _write_words(rows, row_offsets[f], widths[f], frame[at:at + 4 * count * widths[f]].view(np.uint32),
                     start, count)


def _aligned_words(rows: int, words: int) -> np.ndarray:
    """A (rows, words) uint32 array whose first byte is on a cache-line boundary."""
    raw = np.zeros(rows * words * 4 + LINE, dtype=np.uint8)
    start = (-raw.ctypes.data) % LINE
    return raw[start:start + rows * words * 4].view(np.uint32).reshape(rows, words)


class RowRing:
    """A ring of `capacity` transitions stored as rows (see the module doc)."""

    def __init__(self, capacity: int, layout):
        self.capacity = int(capacity)
        self.layout = tuple((name, np.dtype(dtype), tuple(shape)) for name, dtype, shape in layout)
        offsets, stride = self.row_plan(self.layout)
        self.row_bytes = stride
        self.rows = _aligned_words(self.capacity, stride // 4)
        self._make_views()
        self._row_offsets = np.array([offsets[name] // 4 for name, _, _ in self.layout], dtype=np.int64)
        self._widths = np.array([-(-self.fields[name][0].nbytes // 4) for name, _, _ in self.layout],
                                dtype=np.int64)
        padded = any(self.fields[name][0].nbytes % 4 for name, _, _ in self.layout)
        self.word_rows = not padded  # every field is whole words: insert_frame applies
        # (dtype, strides of a C-contiguous (n, *shape) array, items per row) per field; with a
        # padded field, insert_rows's word copies do not apply (numpy's assignment writes it)
        self._row_arrays = None if padded else tuple(
            (dtype, np.empty((2, *shape), dtype).strides, int(np.prod(shape, dtype=np.int64)))
            for _, dtype, shape in self.layout)

    def _make_views(self) -> None:
        """`fields` (numpy views of the rows), and no output buffers or bound kernels yet."""
        offsets, _ = self.row_plan(self.layout)
        as_bytes = self.rows.view(np.uint8)
        self.fields = {}
        for name, dtype, shape in self.layout:
            nbytes = dtype.itemsize * int(np.prod(shape, dtype=np.int64))
            view = as_bytes[:, offsets[name]:offsets[name] + nbytes].view(dtype)
            self.fields[name] = view.reshape(self.capacity, *shape)
        self._outputs = {}
        self._uniform_calls = {}

    def __getstate__(self):
        # a copy of a view is an array of its own: the fields, the batch outputs' views of their
        # word buffers and the kernels bound to them are made again from the copied rows
        state = dict(self.__dict__)
        for name in ("fields", "_outputs", "_uniform_calls"):
            state.pop(name)
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        rows = _aligned_words(self.capacity, self.rows.shape[1])
        rows[:] = self.rows
        self.rows = rows
        self._make_views()

    @staticmethod
    def row_plan(layout) -> tuple[dict, int]:
        """(each field's byte offset in a row, the row's stride in bytes) for a layout of
        (name, dtype, shape) fields."""
        layout = [(name, np.dtype(dtype), tuple(shape)) for name, dtype, shape in layout]
        offsets, cursor = {}, 0
        # widest items first keeps every field aligned to its own item size inside the row
        for name, dtype, shape in sorted(layout, key=lambda field: -field[1].itemsize):
            nbytes = dtype.itemsize * int(np.prod(shape, dtype=np.int64))
            # rows hold whole 4-byte words: a field of another size (3 uint8) is padded
            offsets[name], cursor = cursor, cursor + -(-nbytes // 4) * 4
        row_bytes = max(cursor, 4)
        # a power of two up to a line (rows never straddle lines), whole lines above
        return offsets, 1 << (row_bytes - 1).bit_length() if row_bytes <= LINE else -(-row_bytes // LINE) * LINE

    @classmethod
    def bytes_needed(cls, capacity: int, layout) -> int:
        """The bytes a ring of `capacity` rows of `layout` allocates."""
        return int(capacity) * cls.row_plan(layout)[1]

    def insert(self, start: int, count: int, values) -> None:
        """Writes `count` transitions (a value per field, in layout order: rows on a leading axis,
        or one value for every row; numpy casts and broadcasts as in `field[a:b] = value`) at
        slots start, start + 1, ... (mod capacity)."""
        if count <= self.capacity and self._as_rows(count, values):
            insert_rows(self.rows, self._row_offsets, self._widths, tuple(values), start, count)
            return
        skip = max(0, count - self.capacity)  # those rows would be overwritten by later ones
        start = (start + skip) % self.capacity
        n = count - skip
        head = min(n, self.capacity - start)
        for (name, _, shape), value in zip(self.layout, values):
            array = np.asarray(value)
            if array.ndim > len(shape):
                array = array[skip:]
                first, rest = array[:head], array[head:]
            else:
                first = rest = array
            field = self.fields[name]
            field[start:start + head] = first
            if n > head:
                field[:n - head] = rest

    def insert_frame(self, start: int, count: int, frame: np.ndarray, offsets: np.ndarray) -> None:
        """insert() of `count` rows whose fields (layout order, each exactly its
        field's dtype and shape, C order) start at byte `offsets` (int64, multiples of 4) of
        `frame` (uint8): one compiled copy. Only for a ring of `word_rows`."""
        insert_frame(self.rows, self._row_offsets, self._widths, frame, offsets, start, count)

    def _as_rows(self, count: int, values) -> bool:
        """Whether every value is a C-contiguous array of its field's dtype with `count` rows, which
        insert_rows copies word for word (~2x faster than numpy's per-field strided assignment);
        anything else (other dtypes, broadcasting) takes numpy's assignment, which casts. The
        strides of a C-contiguous (count, *shape) array do not depend on count, and with them the
        size fixes the shape."""
        if self._row_arrays is None:
            return False
        for value, (dtype, strides, items) in zip(values, self._row_arrays):
            if not (type(value) is np.ndarray and value.dtype is dtype and value.strides == strides
                    and value.size == count * items):
                return False
        return True

    def outputs(self, batch: int) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
        """(word buffer, per-field C-contiguous views of it) for a batch size, made once."""
        prepared = self._outputs.get(batch)
        if prepared is None:
            words = np.empty(batch * int(self._widths.sum()), dtype=np.uint32)
            views, start = [], 0
            for (name, dtype, shape), width in zip(self.layout, self._widths):
                block = words[start:start + batch * width]
                nbytes = dtype.itemsize * int(np.prod(shape, dtype=np.int64))
                # a padded field's batch is a strided view that skips each row's padding
                rows = block.view(np.uint8).reshape(batch, 4 * width)[:, :nbytes]
                views.append(rows.view(dtype).reshape(batch, *shape))
                start += batch * width
            prepared = (words, tuple(views))
            self._outputs[batch] = prepared
        return prepared

    def sample_uniform(self, uniforms: np.ndarray, size: int) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
        """(indices, field views) of rows floor(uniforms * size), uniforms float64 in [0, 1) and
        size <= capacity; both preallocated per batch size and reused by the next call."""
        batch = uniforms.shape[0]
        call = self._uniform_calls.get(batch)
        if call is None:  # the arrays bound once (as in PrioritizedSampler.bind)
            indices = np.empty(batch, np.int64)
            words, views = self.outputs(batch)
            call = (partial(gather_uniform_rows, self.rows, indices, words, self._row_offsets, self._widths),
                    (indices, views))
            self._uniform_calls[batch] = call
        kernel, outputs = call
        kernel(uniforms, size)
        return outputs

    def gather(self, indices: np.ndarray) -> tuple[np.ndarray, ...]:
        words, views = self.outputs(indices.shape[0])
        bad = gather_rows(self.rows, indices, words, self._row_offsets, self._widths)
        if bad >= 0:
            raise IndexError(f"gather index {indices[bad]} out of range for capacity {self.capacity}")
        return views
