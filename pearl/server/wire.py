"""The replay server's wire format: a versioned fixed little-endian header + raw column buffers.

One message = ZeroMQ frames [header, column 0, column 1, ...] (the server's ROUTER socket adds the
peer's routing id in front). Nothing is ever unpickled: the header is parsed with `struct`, column
buffers are viewed with `np.frombuffer` after their dtype, shape and byte length were checked.

Header (HEADER.size = 56 bytes, little-endian, 8-byte fields 8-byte aligned):
    magic    4s   b"PRLR"
    version  u16  VERSION
    op       u16  Op
    flags    u16  request flags (FLAG_*)
    ncols    u16  column descriptors that follow the header (and column frames after it)
    table    u32  table id (a server holds table 0)
    writer   u32  the writer's id (inserts, credits) or 0
    rows     u32  rows of every column of the message
    status   u32  0 = OK in replies; an ErrorCode otherwise
    (4 bytes reserved, zero)
    seq      u64  the writer's sequence number (inserts) / the acknowledged one (replies)
    arg0     u64  op argument: insert -> env steps this chunk commits; sample -> batch size;
                  ACK replies -> credit (env steps the writer may still commit);
                  BATCH replies -> the server's env-step count
    arg1     u64  ACK replies -> highest sequence number covered by the last checkpoint;
                  BATCH replies -> updates served under the ratio
Column descriptor (COLUMN.size = 20 bytes): dtype code u8, ndim u8 (per-row dims, <= 4), 2 pad
bytes, 4 x u32 dims (unused = 0). Column i's frame holds exactly rows x prod(dims) x itemsize bytes (with FLAG_INLINE, a small
message's columns instead follow the descriptors in the first frame, each starting at a multiple
of 8 bytes from the frame's start, and the message is that one frame) - except the last column of a
BATCH reply to a FLAG_MASSES sample, one meta row [total mass, min mass, beta, size, env steps].
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum

import numpy as np

MAGIC = b"PRLR"
VERSION = 2  # 2: HELLO's info names the observation's shape and dtype and the insert's columns
HEADER = struct.Struct("<4sHHHHIIII4xQQQ")
COLUMN = struct.Struct("<BBxx4I")
MAX_DIMS = 4
MAX_COLUMNS = 16


class Op(IntEnum):
    HELLO = 1           # -> server info (JSON) : schema, table kind, capacity
    INSERT = 2          # writer, seq, rows, arg0 = env steps; columns = the table's schema
    SAMPLE = 3          # arg0 = batch; reply: schema columns + indices + weights [+ masses, meta]
    UPDATE = 4          # columns: indices int64 (rows), |td| float32|float64 (rows)
    UPDATE_SAMPLE = 5   # UPDATE's columns, then a sample of arg0 rows in the same reply
    STATS = 6           # -> JSON
    CHECKPOINT = 7      # -> JSON manifest of the checkpoint written
    CREDIT = 8          # writer asks for arg0 env steps of credit; the reply waits until granted (0: gives its credit back)
    WRITER = 9          # writer (re)connects: reply seq = its highest acknowledged chunk, arg0 = credit
    ACK = 32            # reply to INSERT / UPDATE / CREDIT / WRITER
    BATCH = 33          # reply to SAMPLE / UPDATE_SAMPLE
    INFO = 34           # reply carrying one uint8 column of UTF-8 JSON (HELLO, STATS, CHECKPOINT)
    ERROR = 35          # status = ErrorCode, one uint8 column: a one-line UTF-8 message


REQUESTS = frozenset({Op.HELLO, Op.INSERT, Op.SAMPLE, Op.UPDATE, Op.UPDATE_SAMPLE, Op.STATS,
                      Op.CHECKPOINT, Op.CREDIT, Op.WRITER})

FLAG_MASSES = 1  # sample: also return each row's selector mass and [total, min mass, beta, size, progress]
# insert: no ACK unless refused - acks are cumulative, a later chunk's (or a WRITER request's) covers it
FLAG_NO_ACK = 2
FLAG_INLINE = 0x8000  # the column buffers follow the descriptors in the header frame (8-byte aligned)


class ErrorCode(IntEnum):
    OK = 0
    BAD_FRAME = 1        # header: magic, version, size, column count, frame count
    UNKNOWN_OP = 2
    BAD_COLUMN = 3       # dtype / shape / byte length against the table's schema
    BAD_VALUE = 4        # non-finite or negative priority, index out of range, empty table
    TOO_LARGE = 5        # row count or batch over the server's bounds
    NO_CREDIT = 6        # an insert over the writer's credit
    SEQUENCE_GAP = 7     # a chunk after a missing one: resend from acknowledged + 1
    RATE_LIMITED = 8     # the table's rate limiter refused the insert: retry later
    UNKNOWN_TABLE = 9
    INTERNAL = 10


class WireError(Exception):
    """A frame the server refuses: `code` goes back in the ERROR reply with the one-line message."""

    def __init__(self, code: ErrorCode, message: str):
        super().__init__(message)
        self.code = code


DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float16,
          7: np.float32, 8: np.float64, 9: np.uint16, 10: np.uint32, 11: np.uint64, 12: np.bool_}
CODES = {np.dtype(t): code for code, t in DTYPES.items()}


def dtype_code(dtype) -> int:
    try:
        return CODES[np.dtype(dtype)]
    except KeyError:
        raise ValueError(f"dtype {np.dtype(dtype)} has no wire code") from None


@dataclass(frozen=True)
class Column:
    dtype: np.dtype
    shape: tuple  # per row

    @property
    def row_bytes(self) -> int:
        n = self.dtype.itemsize
        for d in self.shape:
            n *= d
        return n


@dataclass
class Header:
    op: int
    flags: int = 0
    ncols: int = 0
    table: int = 0
    writer: int = 0
    seq: int = 0
    rows: int = 0
    status: int = 0
    arg0: int = 0
    arg1: int = 0


INLINE_BYTES = 1 << 16  # messages up to this size go as one frame (fewer zmq parts per message)


def _descriptor(array: np.ndarray) -> bytes:
    dims = tuple(array.shape[1:])
    if len(dims) > MAX_DIMS:
        raise ValueError(f"a column has {len(dims)} per-row dims (at most {MAX_DIMS})")
    return COLUMN.pack(dtype_code(array.dtype), len(dims), *(dims + (0,) * (MAX_DIMS - len(dims))))


_PADDING = [b"\0" * n for n in range(8)]
# (dtype, shape) of each column -> (descriptor bytes, total column bytes, padding before each column
# of an inline frame): a writer's chunks repeat one layout, so each is worked out once
_PACKED: dict[tuple, tuple] = {}


def _packed_layout(columns: list, key: tuple) -> tuple:
    descriptors = b"".join([_descriptor(a) for a in columns])
    offset, pads = HEADER.size + len(descriptors), []
    for array in columns:
        pads.append(_PADDING[-offset % 8])
        offset += -offset % 8 + array.nbytes
    found = (descriptors, sum(a.nbytes for a in columns), pads)
    if key is not None and len(_PACKED) < 256:
        _PACKED[key] = found
    return found


def pack(header: Header, columns: list[np.ndarray] | tuple = (), inline: bool | None = None) -> list:
    """The frames of one message: the header (with column descriptors) and the column buffers.
    Each column's leading axis is the message's `rows`; arrays are sent as C-contiguous buffers.
    `inline` (default: when the columns total <= INLINE_BYTES): one bytes frame, each column
    copied once into it after the header (bytes.join reads the arrays' buffers directly)."""
    columns = [a if a.flags.c_contiguous else np.ascontiguousarray(a) for a in columns]
    key = tuple([(a.dtype, a.shape) for a in columns])
    layout = _PACKED.get(key)
    descriptors, nbytes, pads = layout if layout is not None else _packed_layout(columns, key)
    if inline is None:
        inline = bool(columns) and nbytes <= INLINE_BYTES
    flags = header.flags | FLAG_INLINE if inline else header.flags & ~FLAG_INLINE
    head = HEADER.pack(MAGIC, VERSION, header.op, flags, len(columns), header.table, header.writer, header.rows,
                       header.status, header.seq, header.arg0, header.arg1) + descriptors
    if not inline:
        return [head] + columns
    parts = [head]
    for pad, array in zip(pads, columns):
        if pad:
            parts.append(pad)
        parts.append(array)
    return [b"".join(parts)]


class Packer:
    """pack() of inline messages whose columns always have the dtypes and shapes of `example`
    (C-contiguous, <= INLINE_BYTES): the descriptors and padding worked out once, so a message
    costs the header's struct and one bytes.join (a 256-row BATCH reply: ~1.1 us against
    pack's ~4.5, which works out the layout's key from the arrays every call). The caller
    guarantees the layout: a table's reused sample outputs, a learner's update of one batch size."""

    def __init__(self, example):
        if not all(a.flags.c_contiguous for a in example) or sum(a.nbytes for a in example) > INLINE_BYTES:
            raise ValueError("Packer: columns must be C-contiguous and fit one inline frame")
        descriptors, _, pads = _packed_layout(list(example), None)
        self.descriptors, self.ncols = descriptors, len(example)
        # the frame's parts after the header: padding (where needed) and a slot per column
        self.parts, self.slots = [None], []
        for pad in pads:
            if pad:
                self.parts.append(pad)
            self.slots.append(len(self.parts))
            self.parts.append(None)

    def pack(self, header: Header, columns) -> list:
        parts = self.parts.copy()
        parts[0] = HEADER.pack(MAGIC, VERSION, header.op, header.flags | FLAG_INLINE, self.ncols, header.table,
                               header.writer, header.rows, header.status, header.seq, header.arg0,
                               header.arg1) + self.descriptors
        for slot, array in zip(self.slots, columns):
            parts[slot] = array
        return [b"".join(parts)]


class Columns(list):
    """A message's column descriptors (a list of Column), parsed once per distinct descriptor
    bytes (unpack_header's cache), with what is derived from them kept beside them: the layout of
    an inline message per row count, and the schema they were last checked against."""

    def __init__(self, items=()):
        super().__init__(items)
        self.layouts: dict = {}
        self.checked = None  # the schema (list of Column) these columns equal, once checked

    def layout(self, rows: int, last_rows: int | None) -> tuple:
        """(total bytes, [(dtype, items, byte offset, shape), ...], the byte offsets as an int64
        array) of an inline message's frame; shape None for a column of scalars (np.frombuffer's
        1-D view is already its shape)."""
        key = (rows, last_rows)
        found = self.layouts.get(key)
        if found is not None:
            return found
        offset = HEADER.size + len(self) * COLUMN.size
        parts = []
        for i, column in enumerate(self):
            offset += -offset % 8
            n = rows if last_rows is None or i < len(self) - 1 else last_rows
            items = n * column.row_bytes // column.dtype.itemsize
            parts.append((column.dtype, items, offset, (n,) + column.shape if column.shape else None))
            offset += n * column.row_bytes
        found = (offset, parts, np.array([part[2] for part in parts], np.int64))
        if len(self.layouts) < 64:
            self.layouts[key] = found
        return found


def message_arrays(frames, header: Header, columns: Columns, last_rows: int | None = None) -> list:
    """Every column of a message as an array (rows, *shape) viewing its buffer (no copy; writable
    only if the buffer is): frames 1.. or, with FLAG_INLINE, slices of the first frame. Checks the
    frame count and every byte length (inline: the first frame's exact total). `last_rows`: rows
    of the last column when they are not the header's (a FLAG_MASSES batch's meta row)."""
    rows = header.rows
    if not header.flags & FLAG_INLINE:
        if len(frames) != 1 + len(columns):
            raise WireError(ErrorCode.BAD_FRAME, f"{len(frames) - 1} column frames for {len(columns)} "
                                                 f"column descriptors")
        last = len(columns) - 1
        return [column_array(frames[i + 1], c, last_rows if last_rows is not None and i == last else rows, i)
                for i, c in enumerate(columns)]
    frame, parts, _ = _inline(frames, header, columns, last_rows)
    return [np.frombuffer(frame, dtype, items, offset) if shape is None else
            np.frombuffer(frame, dtype, items, offset).reshape(shape) for dtype, items, offset, shape in parts]


def inline_columns(frames, header: Header, columns: Columns) -> tuple[np.ndarray, np.ndarray]:
    """An inline message's frame as a uint8 array and the byte offset of each column in it (int64),
    after message_arrays's checks: for one compiled copy of every column (Replay.add_frame)."""
    frame, _, offsets = _inline(frames, header, columns, None)
    return np.frombuffer(frame, np.uint8), offsets


def _inline(frames, header: Header, columns: Columns, last_rows: int | None) -> tuple:
    """(the frame, the column layout, the columns' byte offsets) of an inline message whose frame
    count and byte length were checked."""
    if len(frames) != 1:
        raise WireError(ErrorCode.BAD_FRAME, f"an inline message with {len(frames) - 1} extra frames")
    frame = frames[0]
    total, parts, offsets = columns.layout(header.rows, last_rows)
    nbytes = memoryview(frame).nbytes
    if total != nbytes:
        raise WireError(ErrorCode.BAD_COLUMN, f"inline columns: {nbytes} bytes, the descriptors and "
                                              f"{header.rows} rows need {total}")
    return frame, parts, offsets


def check_columns(columns: Columns, schema: list, what: str) -> None:
    """Each column's dtype and per-row shape equal the schema's (once per distinct descriptors)."""
    if columns.checked is schema:
        return
    if len(columns) != len(schema):
        raise WireError(ErrorCode.BAD_COLUMN, f"{what}: {len(columns)} columns (expected {len(schema)})")
    for index, (column, expected) in enumerate(zip(columns, schema)):
        if column.dtype != expected.dtype or column.shape != expected.shape:
            raise WireError(ErrorCode.BAD_COLUMN, f"column {index}: {column.dtype}{list(column.shape)} per row "
                                                  f"(the table wants {expected.dtype}{list(expected.shape)})")
    columns.checked = schema


def unpack_header(frame) -> tuple[Header, Columns]:
    """Parses and checks a message's first frame (any bytes-like object). Raises WireError."""
    buffer = memoryview(frame)
    if len(buffer) < HEADER.size:
        raise WireError(ErrorCode.BAD_FRAME, f"header of {len(buffer)} bytes (expected >= {HEADER.size})")
    magic, version, op, flags, ncols, table, writer, rows, status, seq, arg0, arg1 = HEADER.unpack_from(buffer)
    if magic != MAGIC:
        raise WireError(ErrorCode.BAD_FRAME, f"bad magic {bytes(magic)!r} (expected {MAGIC!r})")
    if version != VERSION:
        raise WireError(ErrorCode.BAD_FRAME, f"wire version {version} (this server speaks {VERSION})")
    if ncols > MAX_COLUMNS:
        raise WireError(ErrorCode.BAD_FRAME, f"{ncols} columns (at most {MAX_COLUMNS})")
    if (len(buffer) < HEADER.size + ncols * COLUMN.size if flags & FLAG_INLINE else
            len(buffer) != HEADER.size + ncols * COLUMN.size):
        raise WireError(ErrorCode.BAD_FRAME, f"header frame of {len(buffer)} bytes for {ncols} columns "
                                             f"(expected {HEADER.size + ncols * COLUMN.size})")
    if not ncols:
        return Header(op, flags, ncols, table, writer, seq, rows, status, arg0, arg1), NO_COLUMNS
    descriptors = bytes(buffer[HEADER.size:HEADER.size + ncols * COLUMN.size])
    columns = _PARSED.get(descriptors)
    if columns is None:
        columns = _parse_columns(buffer, ncols)
        if len(_PARSED) < 256:  # a peer's schema repeats: parse each distinct one once
            _PARSED[descriptors] = columns
    return Header(op, flags, ncols, table, writer, seq, rows, status, arg0, arg1), columns


_PARSED: dict[bytes, Columns] = {}
NO_COLUMNS = Columns()


def _parse_columns(buffer, ncols: int) -> Columns:
    columns = Columns()
    for i in range(ncols):
        code, ndim, *dims = COLUMN.unpack_from(buffer, HEADER.size + i * COLUMN.size)
        if code not in DTYPES:
            raise WireError(ErrorCode.BAD_COLUMN, f"column {i}: unknown dtype code {code}")
        if ndim > MAX_DIMS or any(dims[ndim:]):
            raise WireError(ErrorCode.BAD_COLUMN, f"column {i}: bad shape descriptor (ndim {ndim}, dims {dims})")
        columns.append(Column(np.dtype(DTYPES[code]), tuple(dims[:ndim])))
    return columns


def column_array(frame, column: Column, rows: int, index: int) -> np.ndarray:
    """Column `index` of a message, alone in `frame`, as an array (rows, *shape) viewing it (no
    copy), after checking the frame's byte length."""
    buffer = memoryview(frame)
    need = rows * column.row_bytes
    if buffer.nbytes != need:
        raise WireError(ErrorCode.BAD_COLUMN, f"column {index}: {buffer.nbytes} bytes for {rows} rows "
                                              f"(expected {need})")
    return np.frombuffer(buffer, dtype=column.dtype).reshape((rows,) + column.shape)


def error_frames(code: ErrorCode, message: str, seq: int = 0) -> list:
    text = np.frombuffer(message.encode("utf-8", "replace")[:1000], dtype=np.uint8)
    return pack(Header(Op.ERROR, status=int(code), seq=seq, rows=len(text)), [text])


def info_frames(text: str) -> list:
    data = np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
    return pack(Header(Op.INFO, rows=len(data)), [data])
