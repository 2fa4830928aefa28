"""The prioritized-replay sum tree on an FPGA: the interface of `pearl.kernels.cpu.SumTree`
(update / find / sample(uniforms) / total / min() / get), served by the `pearl_sumtree` HLS
kernel (hls/sumtree) through any FPGA driver (sim, PYNQ, XRT).

The tree stays in the kernel's on-chip memories; each call moves only its batch (indices,
priorities, uniforms, results) through device buffers. Every update returns the new root, so
`total` and `min()` cost no kernel call. Batches longer than the kernel's on-chip buffers are
split (updates keep their order, so the last duplicate still wins); a stratified `sample` must
fit in one call, since its strata depend on the batch size.

Precision: float32 nodes by default (the hardware build, hls/README.md): priorities are held
rounded to float32 and indices agree with the float64 reference except within ~1e-6 x total of
a bracket boundary. `dtype=np.float64` simulates the float64 build, which is bit-identical to the
reference.
"""
from __future__ import annotations

import numpy as np

from pearl.kernels.cpu.sumtree import checked_leaf_indices
from pearl.kernels.fpga.timing import SUMTREE_OPS

OPS = SUMTREE_OPS


def tree_depth(capacity: int, fanout: int) -> int:
    """Levels below the root, as the reference computes them."""
    depth = 1
    while fanout ** depth < capacity:
        depth += 1
    return depth


class FPGASumTree:
    def __init__(self, capacity: int, fanout: int = 16, *, device, dtype=np.float32):
        if capacity < 1 or fanout < 2:
            raise ValueError(f"sum tree needs capacity >= 1 and fanout >= 2, got {capacity}, {fanout}")
        if fanout & (fanout - 1) or fanout > 64:
            raise ValueError(f"the FPGA sum tree needs a power-of-two fanout in [2, 64], got {fanout}")
        self.dtype = np.dtype(dtype)
        if self.dtype not in (np.float32, np.float64):
            raise ValueError(f"dtype must be float32 or float64, got {self.dtype}")
        self.device = device
        self.capacity, self.fanout = int(capacity), int(fanout)
        self.depth = tree_depth(self.capacity, self.fanout)
        defines = {"PEARL_SUMTREE_FANOUT": self.fanout, "PEARL_SUMTREE_DEPTH": self.depth,
                   "PEARL_SUMTREE_DOUBLE": self.dtype == np.float64}
        self.kernel = device.kernel("pearl_sumtree", defines)
        self._allocate_buffers(8)
        self._call("info", 0, receive_values=4)
        fanout_hw, depth_hw, real_bytes, max_batch = (int(v) for v in self._out_values.array[:4])
        if fanout_hw != self.fanout or real_bytes != self.dtype.itemsize or fanout_hw ** depth_hw < self.capacity:
            raise ValueError(f"the loaded pearl_sumtree kernel holds {fanout_hw ** depth_hw} leaves of fanout "
                             f"{fanout_hw} in {8 * real_bytes}-bit floats; this tree needs {self.capacity} "
                             f"leaves, fanout {self.fanout}, {8 * self.dtype.itemsize}-bit")
        # a kernel built deeper than this tree needs holds the same tree under a chain of
        # single-child ancestors: same sums, same descents
        self.kernel_depth, self.max_batch = depth_hw, max_batch
        self._allocate_buffers(max(8, max_batch))
        self._call("clear", 0)
        self._total, self._min = 0.0, float("inf")

    # -- the kernel call ----------------------------------------------------------------------
    def _allocate_buffers(self, count: int) -> None:
        """One device buffer per pointer argument, in the memory bank of that argument."""
        def allocate(arg, dtype):
            return self.device.allocate(count, dtype, kernel=self.kernel, arg=arg)

        self._indices, self._values = allocate("indices", np.int64), allocate("values", np.float64)
        self._out_indices, self._out_values = allocate("out_indices", np.int64), allocate("out_values", np.float64)

    def _call(self, op: str, n: int, send_indices: bool = False, send_values: bool = False,
              receive_indices: bool = False, receive_values: int = 0) -> None:
        if send_indices:
            self._indices.sync_to_device(n)
        if send_values:
            self._values.sync_to_device(n)
        self.kernel.start(OPS[op], n, self._indices, self._values, self._out_indices, self._out_values).wait()
        if receive_indices:
            self._out_indices.sync_from_device(n)
        if receive_values:
            self._out_values.sync_from_device(receive_values)

    # -- the SumTree interface ----------------------------------------------------------------
    @property
    def total(self) -> float:
        return self._total

    def min(self) -> float:
        return self._min

    def update(self, indices, priorities) -> None:
        """Sets leaf priorities; within one call the last occurrence of an index wins."""
        indices = checked_leaf_indices(indices, self.capacity)
        priorities = np.broadcast_to(np.asarray(priorities, dtype=np.float64), indices.shape)
        for start in range(0, indices.size, self.max_batch):
            n = min(self.max_batch, indices.size - start)
            self._indices.array[:n] = indices[start:start + n]
            self._values.array[:n] = priorities[start:start + n]
            self._call("update", n, send_indices=True, send_values=True, receive_values=2)
            self._total, self._min = float(self._out_values.array[0]), float(self._out_values.array[1])

    def _descend(self, op: str, values: np.ndarray) -> np.ndarray:
        out = np.empty(values.size, np.int64)
        for start in range(0, values.size, self.max_batch):
            n = min(self.max_batch, values.size - start)
            self._values.array[:n] = values[start:start + n]
            self._call(op, n, send_values=True, receive_indices=True)
            out[start:start + n] = self._out_indices.array[:n]
        return out

    def find(self, prefix_sums) -> np.ndarray:
        """Leaf j whose bracket [c_{j-1}, c_j) holds each prefix sum (int64)."""
        return self._descend("find", np.ascontiguousarray(prefix_sums, dtype=np.float64).ravel())

    def sample(self, uniforms) -> np.ndarray:
        """Stratified: find((i + u_i) * total / B), the prefixes formed on the device."""
        uniforms = np.ascontiguousarray(uniforms, dtype=np.float64).ravel()
        if uniforms.size > self.max_batch:
            raise ValueError(f"a stratified sample of {uniforms.size} exceeds the kernel's batch of {self.max_batch}")
        return self._descend("sample", uniforms)

    def get(self, indices) -> np.ndarray:
        shape = np.shape(indices)
        indices = checked_leaf_indices(indices, self.capacity)
        out = np.empty(indices.size, np.float64)
        for start in range(0, indices.size, self.max_batch):
            n = min(self.max_batch, indices.size - start)
            self._indices.array[:n] = indices[start:start + n]
            self._call("get", n, send_indices=True, receive_values=n)
            out[start:start + n] = self._out_values.array[:n]
        return out.reshape(shape)

    @property
    def leaves(self) -> np.ndarray:
        """Host copy of the leaf level (padding leaves are zero)."""
        out = np.zeros(self.fanout ** self.depth)
        out[:self.capacity] = self.get(np.arange(self.capacity))
        return out

    def _levels(self, which: int) -> list[np.ndarray]:
        unit = getattr(self.kernel, "impl", None)
        if unit is None or not hasattr(unit, "read_level"):
            raise NotImplementedError("whole-tree reads exist only in the simulation (tests)")
        offset = self.kernel_depth - self.depth
        return [unit.read_level(offset + d, which)[:self.fanout ** d] for d in range(self.depth + 1)]

    @property
    def sums(self) -> list[np.ndarray]:
        """Every level's sums, root first (simulation only: for tests)."""
        return self._levels(0)

    @property
    def mins(self) -> list[np.ndarray]:
        return self._levels(1)
