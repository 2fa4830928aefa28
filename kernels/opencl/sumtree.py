"""The sum tree of prioritized replay, and transition storage, on an OpenCL device.

`OpenCLSumTree` implements the interface of the numpy reference `pearl.kernels.cpu.SumTree`
(numpy arrays in and out; the trees live in device buffers) and keeps the same layout, so the two
agree bit for bit in float64:

- sample / find: one work-item per prefix descends one root-to-leaf path (the fanout K is a
  compile-time define, so the K-child scan unrolls). For `sample` the prefix
  (i + u_i) * total / B is computed on the device from the root, with no host round trip.
- update: the host (numpy, on at most B indices) resolves duplicates (last in the batch wins),
  then computes the sorted unique ancestors of every level; they travel in ONE upload, and the
  device runs one `set_leaves` launch, then one `recompute` launch per level, bottom up, in an
  in-order queue (a launch boundary is the only grid-wide barrier OpenCL has). Each parent is
  recomputed from its K children (no deltas, so rounding never drifts, and no atomics: every
  written node is owned by exactly one work-item). Node sums use numpy's pairwise summation order,
  generated as straight-line code for the compile-time K, so internal nodes are exactly what the
  reference's `.sum(axis=1)` computes.
- a min tree rides along (+inf for empty leaves), recomputed in the same launches.

Precision: float64 when the device reports cl_khr_fp64 (PoCL on CPUs does). Otherwise float32:
priorities, sums and prefixes are rounded to 24-bit mantissas, so the total carries a relative
error of about depth * K * 6e-8, a leaf smaller than ~6e-8 of its subtree's sum is absorbed in
that sum (it can then only be sampled through the rounding guard), and `find` can pick the
neighbouring leaf for prefixes within ~1e-6 (relative to the total) of a bracket boundary. The
rounding guard still holds: a non-negative prefix never lands on a zero-priority leaf.

`OpenCLTransitionStorage` is the ring of `pearl.replay.base.Replay` in device buffers, with a
row-gather kernel into preallocated device outputs; `sample_batch` chains tree sampling and the
gather on the device, reading back only the final batch.

Device choice: PEARL_OPENCL_DEVICE="platform[:device]" (indices into cl.get_platforms() and the
platform's devices); otherwise the first usable GPU, else the first usable device of any kind
(usable: its compiler builds kernels, kernels/opencl/devices.py).
"""
from __future__ import annotations

import os
from importlib import resources

import numpy as np

from pearl.kernels.cpu.sumtree import checked_leaf_indices
from pearl.kernels.opencl.devices import cl as _cl
from pearl.kernels.opencl.devices import compile_error, usable

_CONTEXT = None
_QUEUES: dict = {}
_PROGRAMS: dict = {}


def kernel_source() -> str:
    """The OpenCL C source, read as package data (works from an installed wheel)."""
    return resources.files(__package__).joinpath("sumtree.cl").read_text(encoding="utf-8")


def parse_device_spec(spec: str) -> tuple[int, int | None]:
    """"2" -> (2, None); "1:0" -> (1, 0)."""
    parts = spec.strip().split(":")
    if len(parts) > 2 or not parts[0].strip():
        raise ValueError(f"PEARL_OPENCL_DEVICE must be 'platform[:device]', got {spec!r}")
    try:
        platform = int(parts[0])
        device = int(parts[1]) if len(parts) == 2 and parts[1].strip() else None
    except ValueError:
        raise ValueError(f"PEARL_OPENCL_DEVICE must be 'platform[:device]', got {spec!r}") from None
    return platform, device


def _choose_device():
    spec = os.environ.get("PEARL_OPENCL_DEVICE", "").strip()
    if spec:
        p, d = parse_device_spec(spec)
        device = _cl().get_platforms()[p].get_devices()[d if d is not None else 0]
        error = compile_error(device)
        if error is not None:
            raise RuntimeError(f"PEARL_OPENCL_DEVICE={spec}: {device.name.strip()} builds no kernel: {error}")
        return device
    devices = [device for _, device in usable()]
    if not devices:
        raise RuntimeError("no usable OpenCL device found")
    gpus = [dev for dev in devices if dev.type & _cl().device_type.GPU]
    return (gpus or devices)[0]


def available() -> bool:
    """Whether pyopencl imports and at least one OpenCL device builds kernels."""
    try:
        return bool(usable())
    except Exception:
        return False


def default_context():
    """A process-wide context on the chosen device (see the module docstring)."""
    global _CONTEXT
    if _CONTEXT is None:
        cl = _cl()
        _CONTEXT = cl.Context([_choose_device()])
    return _CONTEXT


def default_queue(context=None):
    """One in-order queue per context, shared by the trees and storages made on it."""
    cl = _cl()
    context = context or default_context()
    key = context.int_ptr
    if key not in _QUEUES:
        _QUEUES[key] = cl.CommandQueue(context)
    return _QUEUES[key]


def supports_fp64(device) -> bool:
    return "cl_khr_fp64" in device.extensions or bool(getattr(device, "double_fp_config", 0))


def _pairwise_expression(names: list[str]) -> str:
    """numpy's pairwise_sum over `names`, as a C expression with the same association."""
    n = len(names)
    if n < 8:
        expr = "(real)0"
        for name in names:
            expr = f"({expr} + {name})"
        return expr
    if n <= 128:
        acc = list(names[:8])
        i = 8
        while i < n - n % 8:
            acc = [f"({acc[j]} + {names[i + j]})" for j in range(8)]
            i += 8
        expr = (f"((({acc[0]} + {acc[1]}) + ({acc[2]} + {acc[3]})) + "
                f"(({acc[4]} + {acc[5]}) + ({acc[6]} + {acc[7]})))")
        for name in names[i:]:
            expr = f"({expr} + {name})"
        return expr
    half = n // 2
    half -= half % 8
    return f"({_pairwise_expression(names[:half])} + {_pairwise_expression(names[half:])})"


class _Program:
    """The built program for one (context, fanout, precision), with its kernels fetched once."""

    def __init__(self, context, fanout: int, use_double: bool):
        cl = _cl()
        node_sum = _pairwise_expression([f"(c)[{j}]" for j in range(fanout)])
        header = (f"#define FANOUT {fanout}\n#define USE_DOUBLE {int(use_double)}\n"
                  f"#define NODE_SUM(c) {node_sum}\n")
        self.program = cl.Program(context, header + kernel_source()).build()
        i64, i32 = np.int64, np.int32
        signatures = {
            "find": [None, i32, None, None, i64],
            "sample": [None, i32, None, None, i64],
            "set_leaves": [None, None, i64, None, i64, i64, i64],
            "update_fused": [None, None, None, i32],
            "recompute": [None, None, i64, i64, None, i64, i64],
            "get_leaves": [None, i64, None, None, i64],
            "gather_rows_u32": [None, None, None, i64, i64, i64],
            "gather_rows_u8": [None, None, None, i64, i64, i64],
        }
        for name, dtypes in signatures.items():
            kernel = cl.Kernel(self.program, name)
            kernel.set_scalar_arg_dtypes(dtypes)
            setattr(self, name, kernel)


def _program(context, fanout: int, use_double: bool) -> _Program:
    key = (context.int_ptr, fanout, use_double)
    if key not in _PROGRAMS:
        _PROGRAMS[key] = _Program(context, fanout, use_double)
    return _PROGRAMS[key]


def _global_size(n: int, multiple: int = 64) -> tuple[int]:
    return (max(multiple, -(-n // multiple) * multiple),)


class _Scratch:
    """A device buffer that grows (to powers of two) and is reused across calls."""

    def __init__(self, context, dtype):
        self.context, self.dtype, self.buffer, self.items = context, np.dtype(dtype), None, 0

    def get(self, items: int):
        if items > self.items:
            cl = _cl()
            self.items = 1 << max(6, int(items - 1).bit_length())
            self.buffer = cl.Buffer(self.context, cl.mem_flags.READ_WRITE,
                                    self.items * self.dtype.itemsize)
        return self.buffer


class OpenCLSumTree:
    """The interface of `pearl.kernels.cpu.SumTree`, with the trees in device memory.

    `dtype` forces the device precision (np.float64 or np.float32); by default float64 where the
    device supports it. Results are numpy: int64 indices, float64 priorities.
    """

    def __init__(self, capacity: int, fanout: int = 16, context=None, queue=None, dtype=None):
        if capacity < 1 or fanout < 2:
            raise ValueError(f"sum tree needs capacity >= 1 and fanout >= 2, got {capacity}, {fanout}")
        cl = _cl()
        self.capacity, self.fanout = int(capacity), int(fanout)
        self.depth = 1
        while fanout ** self.depth < capacity:
            self.depth += 1
        self.context = context or (queue.context if queue is not None else default_context())
        self.queue = queue or default_queue(self.context)
        if self.queue.properties & cl.command_queue_properties.OUT_OF_ORDER_EXEC_MODE_ENABLE:
            raise ValueError("the sum tree needs an in-order command queue")
        device = self.queue.device
        if dtype is None:
            dtype = np.float64 if supports_fp64(device) else np.float32
        self.dtype = np.dtype(dtype)
        if self.dtype == np.float64 and not supports_fp64(device):
            raise ValueError(f"{device.name} has no cl_khr_fp64")
        if self.dtype not in (np.float64, np.float32):
            raise ValueError(f"dtype must be float64 or float32, got {self.dtype}")
        self._k = _program(self.context, self.fanout, self.dtype == np.float64)
        # level d starts at (K^d - 1) / (K - 1)
        self.level_offsets = [(fanout ** d - 1) // (fanout - 1) for d in range(self.depth + 2)]
        self.nodes = self.level_offsets[self.depth + 1]
        self.leaf_offset = self.level_offsets[self.depth]
        nbytes = self.nodes * self.dtype.itemsize
        self.sums_buffer = cl.Buffer(self.context, cl.mem_flags.READ_WRITE, nbytes)
        self.mins_buffer = cl.Buffer(self.context, cl.mem_flags.READ_WRITE, nbytes)
        cl.enqueue_fill_buffer(self.queue, self.sums_buffer, self.dtype.type(0), 0, nbytes)
        cl.enqueue_fill_buffer(self.queue, self.mins_buffer, self.dtype.type(np.inf), 0, nbytes)
        self._nodes_in = _Scratch(self.context, np.int64)
        self._packed = _Scratch(self.context, np.int64)
        self._pending = None
        # updates of at most `fused_limit` unique leaves run as one launch of one work-group
        fused = self._k.update_fused
        self._group = int(min(256, fused.get_work_group_info(
            cl.kernel_work_group_info.WORK_GROUP_SIZE, device)))
        self.fused_limit = 16 * self._group
        self._reals_in = _Scratch(self.context, self.dtype)
        self._index_out = _Scratch(self.context, np.int64)
        self._reals_out = _Scratch(self.context, self.dtype)
        self._root = np.empty(1, self.dtype)

    # -- reads -------------------------------------------------------------------------------
    def _read_root(self, buffer) -> float:
        _cl().enqueue_copy(self.queue, self._root, buffer, is_blocking=True)
        return float(self._root[0])

    @property
    def total(self) -> float:
        return self._read_root(self.sums_buffer)

    def min(self) -> float:
        return self._read_root(self.mins_buffer)

    def _levels(self, buffer) -> list[np.ndarray]:
        host = np.empty(self.nodes, self.dtype)
        _cl().enqueue_copy(self.queue, host, buffer, is_blocking=True)
        host = host.astype(np.float64, copy=False)
        return [host[self.level_offsets[d]:self.level_offsets[d + 1]] for d in range(self.depth + 1)]

    @property
    def sums(self) -> list[np.ndarray]:
        """Host copy of every level (for tests and debugging: reads the whole tree back)."""
        return self._levels(self.sums_buffer)

    @property
    def mins(self) -> list[np.ndarray]:
        return self._levels(self.mins_buffer)

    @property
    def leaves(self) -> np.ndarray:
        """Host copy of the leaf level, padding included."""
        cl = _cl()
        host = np.empty(self.fanout ** self.depth, self.dtype)
        cl.enqueue_copy(self.queue, host, self.sums_buffer,
                        src_offset=self.leaf_offset * self.dtype.itemsize, is_blocking=True)
        return host.astype(np.float64, copy=False)

    def get(self, indices) -> np.ndarray:
        cl = _cl()
        shape = np.shape(indices)
        indices = checked_leaf_indices(indices, self.capacity)
        n = indices.size
        out = np.empty(n, self.dtype)
        if n:
            nodes = self._nodes_in.get(n)
            cl.enqueue_copy(self.queue, nodes, indices, is_blocking=True)
            result = self._reals_out.get(n)
            self._k.get_leaves(self.queue, _global_size(n), None, self.sums_buffer,
                               self.leaf_offset, nodes, result, n)
            cl.enqueue_copy(self.queue, out, result, is_blocking=True)
        return out.astype(np.float64, copy=False).reshape(shape)

    # -- update ------------------------------------------------------------------------------
    def update(self, indices, priorities) -> None:
        """Sets leaf priorities; within one call the last occurrence of an index wins."""
        cl = _cl()
        indices = checked_leaf_indices(indices, self.capacity)
        if indices.size == 0:
            return
        priorities = np.broadcast_to(np.asarray(priorities, dtype=np.float64), indices.shape)
        # last duplicate wins: first occurrence in the reversed batch
        leaves, first = np.unique(indices[::-1], return_index=True)
        values = np.ascontiguousarray(priorities[::-1][first], dtype=self.dtype)
        segments = [leaves]
        nodes = leaves
        for _ in range(self.depth):  # sorted unique parents of each level, bottom up
            nodes = nodes // self.fanout
            keep = np.empty(nodes.size, bool)
            keep[0] = True
            np.not_equal(nodes[1:], nodes[:-1], out=keep[1:])
            nodes = nodes[keep]
            segments.append(nodes)
        # one upload: segment boundaries, the segments, then the values' raw bits
        header = self.depth + 2
        bounds = np.cumsum([header] + [seg.size for seg in segments])
        raw = values.view(np.uint8)
        raw = np.concatenate((raw, np.zeros(-raw.size % 8, np.uint8))).view(np.int64)
        packed = np.concatenate((bounds, *segments, raw))
        buffer = self._packed.get(packed.size)
        # asynchronous: the NannyEvent keeps `packed` alive until the copy is done; the in-order
        # queue orders it after earlier kernels that read the scratch buffer, before ours
        self._pending = cl.enqueue_copy(self.queue, buffer, packed, is_blocking=False)
        k = self._k
        n = leaves.size
        if n <= self.fused_limit:
            k.update_fused(self.queue, (self._group,), (self._group,), self.sums_buffer,
                           self.mins_buffer, buffer, self.depth)
            return
        k.set_leaves(self.queue, _global_size(n), None, self.sums_buffer, self.mins_buffer,
                     self.leaf_offset, buffer, int(bounds[0]), int(bounds[-1]), n)
        for level, s in zip(range(self.depth - 1, -1, -1), range(1, self.depth + 1)):
            m = segments[s].size
            k.recompute(self.queue, _global_size(m), None, self.sums_buffer, self.mins_buffer,
                        self.level_offsets[level], self.level_offsets[level + 1], buffer,
                        int(bounds[s]), m)

    # -- find / sample -----------------------------------------------------------------------
    def _descend(self, kernel, values, out_device: bool):
        cl = _cl()
        values = np.ascontiguousarray(values, dtype=self.dtype).ravel()
        n = values.size
        out = np.empty(n, np.int64)
        if n == 0:
            return (None, 0) if out_device else out
        inputs = self._reals_in.get(n)
        upload = cl.enqueue_copy(self.queue, inputs, values, is_blocking=False)
        result = self._index_out.get(n)
        kernel(self.queue, _global_size(n), None, self.sums_buffer, self.depth, inputs, result, n)
        if out_device:
            self._pending_input = upload  # keeps `values` alive until the copy is done
            return result, n
        cl.enqueue_copy(self.queue, out, result, is_blocking=True)
        del upload  # done: the blocking read came after it in the in-order queue
        return out

    def find(self, prefix_sums) -> np.ndarray:
        """Leaf j whose bracket [c_{j-1}, c_j) holds each prefix sum (int64)."""
        return self._descend(self._k.find, np.asarray(prefix_sums, dtype=np.float64), False)

    def sample(self, uniforms) -> np.ndarray:
        """Stratified: find((i + u_i) * total / B), the prefix computed on the device."""
        return self._descend(self._k.sample, np.asarray(uniforms, dtype=np.float64), False)

    def sample_device(self, uniforms):
        """Like `sample`, but leaves the int64 indices on the device: (buffer, count). The
        buffer is scratch space that the next sample/find of this tree overwrites."""
        return self._descend(self._k.sample, np.asarray(uniforms, dtype=np.float64), True)


FIELDS = ("obs", "actions", "rewards", "next_obs", "discounts")


class OpenCLTransitionStorage:
    """The transition ring of `pearl.replay.base.Replay` in device buffers.

    `add` overwrites the oldest transitions on wrap-around and returns the slots written;
    `gather(indices)` returns a dict of numpy arrays that the next gather of the same batch size
    reuses (copy what you keep), like `Replay.gather`.
    """

    def __init__(self, capacity: int, obs_dim: int, action_dtype=np.int64, action_shape=(),
                 context=None, queue=None):
        if capacity < 1:
            raise ValueError(f"storage needs capacity >= 1, got {capacity}")
        cl = _cl()
        self.capacity, self.obs_dim = int(capacity), int(obs_dim)
        self.context = context or (queue.context if queue is not None else default_context())
        self.queue = queue or default_queue(self.context)
        self.layout = {
            "obs": (np.dtype(np.float32), (obs_dim,)),
            "actions": (np.dtype(action_dtype), tuple(action_shape)),
            "rewards": (np.dtype(np.float32), ()),
            "next_obs": (np.dtype(np.float32), (obs_dim,)),
            "discounts": (np.dtype(np.float32), ()),
        }
        self.row_bytes = {name: dtype.itemsize * int(np.prod(shape, dtype=np.int64))
                          for name, (dtype, shape) in self.layout.items()}
        self.buffers = {}
        for name, nbytes in self.row_bytes.items():
            size = max(nbytes * self.capacity, 1)
            self.buffers[name] = cl.Buffer(self.context, cl.mem_flags.READ_WRITE, size)
            cl.enqueue_fill_buffer(self.queue, self.buffers[name], np.uint8(0), 0, size)
        self._k = _program(self.context, 2, supports_fp64(self.queue.device))
        self._index = _Scratch(self.context, np.int64)
        self._device_out: dict[int, dict] = {}
        self._host_out: dict[int, dict[str, np.ndarray]] = {}
        self.cursor = 0
        self.size = 0
        self.inserted = 0

    def __len__(self) -> int:
        return self.size

    def add(self, obs, actions, rewards, next_obs, discounts) -> np.ndarray:
        """Inserts a batch (leading axis = count); returns the slots written."""
        cl = _cl()
        count = len(rewards)
        start = self.cursor
        slots = (start + np.arange(count)) % self.capacity
        keep = min(count, self.capacity)  # more than capacity: only the newest survive
        first = (start + count - keep) % self.capacity
        pieces = [(first, 0, min(keep, self.capacity - first))]
        if pieces[0][2] < keep:
            pieces.append((0, pieces[0][2], keep - pieces[0][2]))
        for name, values in zip(FIELDS, (obs, actions, rewards, next_obs, discounts)):
            dtype, shape = self.layout[name]
            rows = np.ascontiguousarray(np.broadcast_to(np.asarray(values, dtype=dtype),
                                                        (count, *shape))[count - keep:])
            row_bytes = self.row_bytes[name]
            if row_bytes == 0:
                continue
            for slot, row, length in pieces:
                cl.enqueue_copy(self.queue, self.buffers[name], rows[row:row + length],
                                dst_offset=slot * row_bytes, is_blocking=True)
        self.cursor = (start + count) % self.capacity
        self.size = min(self.size + count, self.capacity)
        self.inserted += count
        return slots

    def _outputs(self, n: int) -> dict:
        out = self._device_out.get(n)
        if out is None:
            cl = _cl()
            out = {name: cl.Buffer(self.context, cl.mem_flags.READ_WRITE, max(nbytes * n, 1))
                   for name, nbytes in self.row_bytes.items()}
            self._device_out[n] = out
        return out

    def gather_device(self, index_buffer, n: int) -> dict:
        """Gathers rows index_buffer[0..n) (int64, device-resident, not range-checked: rows
        outside the ring are left untouched) into preallocated device outputs, one per field;
        the next gather of the same n reuses them."""
        out = self._outputs(n)
        if n == 0:
            return out
        for name, nbytes in self.row_bytes.items():
            if nbytes == 0:
                continue
            if nbytes % 4 == 0:
                kernel, width = self._k.gather_rows_u32, nbytes // 4
            else:
                kernel, width = self._k.gather_rows_u8, nbytes
            kernel(self.queue, (-(-n // 8) * 8, width), None, self.buffers[name], out[name],
                   index_buffer, n, width, self.capacity)
        return out

    def read_back(self, device_out: dict, n: int) -> dict[str, np.ndarray]:
        """Copies gathered device outputs into the preallocated host arrays for batch size n."""
        cl = _cl()
        host = self._host_out.get(n)
        if host is None:
            host = {name: np.empty((n, *shape), dtype=dtype)
                    for name, (dtype, shape) in self.layout.items()}
            self._host_out[n] = host
        if n:
            for name, array in host.items():
                if array.nbytes:
                    cl.enqueue_copy(self.queue, array, device_out[name], is_blocking=False)
            self.queue.finish()
        return host

    def gather(self, indices) -> dict[str, np.ndarray]:
        cl = _cl()
        indices = np.asarray(indices)
        if indices.size and not np.issubdtype(indices.dtype, np.integer):
            raise IndexError(f"gather indices must be integers, got {indices.dtype}")
        indices = np.ascontiguousarray(indices, dtype=np.int64).ravel()
        n = indices.size
        if n and (indices.min() < 0 or indices.max() >= self.capacity):
            raise IndexError(f"gather index out of range [0, {self.capacity})")
        index_buffer = self._index.get(n) if n else None
        if n:
            cl.enqueue_copy(self.queue, index_buffer, indices, is_blocking=True)
        return self.read_back(self.gather_device(index_buffer, n), n)

    def read(self, name: str) -> np.ndarray:
        """Host copy of one whole field (all `capacity` slots)."""
        cl = _cl()
        dtype, shape = self.layout[name]
        host = np.empty((self.capacity, *shape), dtype)
        if host.nbytes:
            cl.enqueue_copy(self.queue, host, self.buffers[name], is_blocking=True)
        return host


def sample_batch(tree: OpenCLSumTree, storage: OpenCLTransitionStorage, uniforms):
    """Stratified sample of the tree and gather of the rows, chained on the device; returns
    (indices, dict of numpy arrays). Tree and storage must share a queue."""
    if tree.queue.int_ptr != storage.queue.int_ptr:
        raise ValueError("tree and storage must share one command queue")
    index_buffer, n = tree.sample_device(uniforms)
    out = storage.read_back(storage.gather_device(index_buffer, n), n)
    indices = np.empty(n, np.int64)
    if n:
        _cl().enqueue_copy(tree.queue, indices, index_buffer, is_blocking=True)
    return indices, out
