"""The K-ary sum tree (plus min tree) and the transition ring as torch tensors on a device.

Same interface and semantics as the float64 numpy reference `pearl.kernels.cpu.sumtree.SumTree`:

    TorchSumTree(capacity, fanout, device, dtype=torch.float64)
    update(indices, priorities)   set leaf priorities (already raised to alpha); last duplicate wins
    find(prefix_sums)             leaf j whose bracket [c_{j-1}, c_j) holds each prefix sum
    sample(uniforms)              stratified: find((i + u_i) * total / B) for a batch of B uniforms
    total                         sum of all priorities (python float: synchronises)
    min()                         smallest priority of a filled leaf, inf when empty (synchronises)
    get(indices)                  leaf priorities

Inputs may be torch tensors (ideally already on the device, then nothing is copied) or numpy
arrays / sequences (copied to the device once). Outputs are tensors on the device: indices int64,
priorities in the tree's dtype. Only `total` and `min()` hand a python float to the host, and
therefore wait for the device; `total_tensor()` and `min_tensor()` are their non-blocking 0-d
tensor forms.

Layout: all levels of the sum tree live in one flat tensor `sum_nodes` (and of the min tree in
`min_nodes`), level d (fanout^d nodes, level 0 the root) starting at offset (K^d - 1) / (K - 1);
node n of level d has children n*K .. n*K+K-1 on level d+1. One extra trailing "trash" slot takes
the writes that deduplication discards, so every kernel has a shape fixed by the batch size alone:
no `nonzero`/`unique` (whose output size the host must read back), no `.item()`, no `.any()`.
`sums` / `mins` / `leaves` are per-level views, as in the reference.

Sample: the prefix sums are computed on the device from the root, then the batch descends one
level at a time, all members together: one gather of the K children of each member's node, a
cumulative sum over them, and the first child whose cumulative sum exceeds the remaining mass.
Rounding can leave no such child; then (as in the reference) the last child with any mass is
taken, so a zero-priority leaf is never returned. The choice is made with `torch.where` for the
whole batch, not by testing on the host whether any member overflowed.

Update: the batch is stable-sorted by leaf index; the last element of each run of equal indices
(the last occurrence in the caller's order) writes the leaf, the others write the trash slot.
That keeps the "last duplicate wins" semantics without relying on the order in which
`index_put_` applies duplicate writes (undefined on CUDA). Then each level's touched parents
(the sorted leaf indices divided by K^h, still sorted, so duplicates are adjacent and again only
the first of each run writes) are recomputed from their K children, sum and min, the same way
the reference does: no delta accumulation, so rounding never drifts.
"""
from __future__ import annotations

import math

import numpy as np
import torch

_INF = math.inf


def _torch_dtype(dtype) -> torch.dtype:
    """A torch dtype from a torch dtype, a numpy dtype or a numpy scalar type."""
    if isinstance(dtype, torch.dtype):
        return dtype
    return torch.from_numpy(np.zeros(0, dtype=np.dtype(dtype))).dtype


class TorchSumTree:
    def __init__(self, capacity: int, fanout: int = 16, device="cpu", dtype=torch.float64):
        if capacity < 1 or fanout < 2:
            raise ValueError(f"sum tree needs capacity >= 1 and fanout >= 2, got {capacity}, {fanout}")
        dtype = _torch_dtype(dtype)
        if dtype not in (torch.float64, torch.float32):
            raise ValueError(f"sum tree dtype must be float64 or float32, got {dtype}")
        self.capacity, self.fanout = capacity, fanout
        self.device, self.dtype = torch.device(device), dtype
        self.depth = 1
        while fanout ** self.depth < capacity:
            self.depth += 1
        k = fanout
        self.offsets = [(k ** d - 1) // (k - 1) for d in range(self.depth + 2)]  # offsets[d]: level d
        self.num_nodes = self.offsets[self.depth + 1]
        self._trash = self.num_nodes  # the slot discarded writes go to
        self.sum_nodes = torch.zeros(self.num_nodes + 1, dtype=dtype, device=self.device)
        self.min_nodes = torch.full((self.num_nodes + 1,), _INF, dtype=dtype, device=self.device)
        self._child_offsets = torch.arange(k, dtype=torch.int64, device=self.device)
        self._aranges: dict[int, torch.Tensor] = {}  # batch size -> arange in the tree's dtype

    # -- views ------------------------------------------------------------------------------------
    def _level(self, nodes: torch.Tensor, d: int) -> torch.Tensor:
        return nodes[self.offsets[d]:self.offsets[d + 1]]

    @property
    def sums(self) -> list[torch.Tensor]:
        """Per-level views of the sum tree (level 0 = root), as in the reference."""
        return [self._level(self.sum_nodes, d) for d in range(self.depth + 1)]

    @property
    def mins(self) -> list[torch.Tensor]:
        return [self._level(self.min_nodes, d) for d in range(self.depth + 1)]

    @property
    def leaves(self) -> torch.Tensor:
        return self._level(self.sum_nodes, self.depth)

    # -- scalars ----------------------------------------------------------------------------------
    def total_tensor(self) -> torch.Tensor:
        """Sum of all priorities as a 0-d device tensor (no synchronisation)."""
        return self.sum_nodes[0]

    def min_tensor(self) -> torch.Tensor:
        """Smallest positive leaf priority (inf when none) as a 0-d device tensor (no sync)."""
        return self.min_nodes[0]

    @property
    def total(self) -> float:
        """Sum of all priorities as a python float. Copies to the host: waits for the device."""
        return float(self.sum_nodes[0].item())

    def min(self) -> float:
        """Smallest positive leaf priority (inf when none), python float. Waits for the device."""
        return float(self.min_nodes[0].item())

    # -- conversions ------------------------------------------------------------------------------
    def _indices(self, indices) -> torch.Tensor:
        return torch.as_tensor(indices, dtype=torch.int64, device=self.device).reshape(-1)

    def _values(self, values) -> torch.Tensor:
        return torch.as_tensor(values, dtype=self.dtype, device=self.device).reshape(-1)

    def get(self, indices) -> torch.Tensor:
        return self.sum_nodes[self._indices(indices) + self.offsets[self.depth]]

    # -- update -----------------------------------------------------------------------------------
    def update(self, indices, priorities) -> None:
        """Sets leaf priorities; for repeated indices the last occurrence wins. Indices are not
        range-checked (that would need a host round trip); they must lie in [0, capacity)."""
        indices = self._indices(indices)
        priorities = self._values(priorities)
        n = indices.shape[0]
        if n == 0:
            return
        if priorities.shape[0] != n:
            priorities = priorities.expand(n)  # a single priority for all
        k, trash = self.fanout, self._trash
        nodes, order = torch.sort(indices, stable=True)
        priorities = priorities[order]
        # the last of each run of equal indices writes the leaf; the rest write the trash slot
        last = torch.ones(n, dtype=torch.bool, device=self.device)
        torch.ne(nodes[1:], nodes[:-1], out=last[:-1])
        target = torch.where(last, nodes + self.offsets[self.depth], trash)
        self.sum_nodes[target] = priorities
        self.min_nodes[target] = torch.where(priorities > 0, priorities, _INF)
        first = torch.ones(n, dtype=torch.bool, device=self.device)
        for level in range(self.depth - 1, -1, -1):
            nodes = torch.div(nodes, k, rounding_mode="floor")  # stays sorted
            torch.ne(nodes[1:], nodes[:-1], out=first[1:])
            target = torch.where(first, nodes + self.offsets[level], trash)
            children = nodes[:, None] * k + (self._child_offsets + self.offsets[level + 1])
            self.sum_nodes[target] = self.sum_nodes[children].sum(dim=1)
            self.min_nodes[target] = self.min_nodes[children].amin(dim=1)

    # -- find / sample ----------------------------------------------------------------------------
    def find(self, prefix_sums) -> torch.Tensor:
        """Leaf j with c_{j-1} <= prefix < c_j for each prefix sum (int64 tensor on the device)."""
        mass = self._values(prefix_sums)
        batch = mass.shape[0]
        k = self.fanout
        node = torch.zeros(batch, dtype=torch.int64, device=self.device)
        for level in range(1, self.depth + 1):
            children = self.sum_nodes[node[:, None] * k + (self._child_offsets + self.offsets[level])]
            cumulative = children.cumsum(dim=1)
            child = (cumulative <= mass[:, None]).sum(dim=1)
            # rounding can leave no child whose cumulative sum exceeds the mass: then take the
            # last child that has any mass (decided per member on the device, no host test)
            last_with_mass = (k - 1) - (children.flip(1) > 0).to(torch.uint8).argmax(dim=1)
            child = torch.where(child >= k, last_with_mass, child)
            before = cumulative.gather(1, (child - 1).clamp_min(0)[:, None]).squeeze(1)
            mass = mass - torch.where(child > 0, before, 0.0)
            node = node * k + child
        return node

    def _arange(self, batch: int) -> torch.Tensor:
        arange = self._aranges.get(batch)
        if arange is None:
            arange = torch.arange(batch, dtype=self.dtype, device=self.device)
            self._aranges[batch] = arange
        return arange

    def sample(self, uniforms) -> torch.Tensor:
        """Stratified sample: member i finds (i + u_i) * total / B, the total read on the device."""
        uniforms = self._values(uniforms)
        batch = uniforms.shape[0]
        if batch == 0:
            return torch.zeros(0, dtype=torch.int64, device=self.device)
        return self.find((self._arange(batch) + uniforms) * (self.sum_nodes[0] / batch))


class GraphedSampler:
    """`tree.sample` for a fixed batch size captured once in a CUDA graph and replayed (CUDA only).

    The graph reads the tree's node tensors in place, so updates made to the tree after capture
    are seen by later replays. The returned index tensor is a static buffer that the next call
    overwrites: copy it to keep it.
    """

    def __init__(self, tree: TorchSumTree, batch_size: int, warmup: int = 3):
        if tree.device.type != "cuda" or not torch.cuda.is_available():
            raise RuntimeError("GraphedSampler needs a sum tree on a CUDA device")
        self.tree = tree
        self.uniforms = torch.full((batch_size,), 0.5, dtype=tree.dtype, device=tree.device)
        with torch.cuda.device(tree.device):
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):  # warm up (caches, allocator) outside the capture
                for _ in range(warmup):
                    tree.sample(self.uniforms)
            torch.cuda.current_stream().wait_stream(stream)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.indices = tree.sample(self.uniforms)

    def __call__(self, uniforms=None, generator: torch.Generator | None = None) -> torch.Tensor:
        """Samples with the given uniforms, or fresh ones drawn on the device."""
        if uniforms is None:
            self.uniforms.uniform_(generator=generator)
        else:
            self.uniforms.copy_(torch.as_tensor(uniforms, dtype=self.tree.dtype).reshape(-1))
        self.graph.replay()
        return self.indices


FIELDS = ("obs", "actions", "rewards", "next_obs", "discounts")


class TorchTransitionStorage:
    """The transition ring of `pearl.replay.base.Replay`, as preallocated tensors on a device.

    `add` takes a batch (leading axis = count, at most `capacity`), overwrites the oldest on
    wrap-around and returns the slots written (int64 tensor on the device). `gather` copies the
    rows of `indices` into preallocated outputs (given, or cached per batch size and reused by
    the next `gather` of that size: copy a batch to keep it).
    """

    def __init__(self, capacity: int, obs_dim: int, device="cpu", action_dtype=torch.int64,
                 action_shape=()):
        if capacity < 1:
            raise ValueError(f"storage needs capacity >= 1, got {capacity}")
        self.capacity, self.obs_dim = capacity, obs_dim
        self.device = torch.device(device)
        action_dtype = _torch_dtype(action_dtype)
        self.storage = {
            "obs": torch.zeros((capacity, obs_dim), dtype=torch.float32, device=self.device),
            "actions": torch.zeros((capacity, *action_shape), dtype=action_dtype, device=self.device),
            "rewards": torch.zeros(capacity, dtype=torch.float32, device=self.device),
            "next_obs": torch.zeros((capacity, obs_dim), dtype=torch.float32, device=self.device),
            "discounts": torch.zeros(capacity, dtype=torch.float32, device=self.device),
        }
        self.cursor = 0  # next slot to write (host-side counters: the count of an add is known)
        self.size = 0
        self.inserted = 0
        self._out: dict[int, dict[str, torch.Tensor]] = {}

    def __len__(self) -> int:
        return self.size

    def add(self, obs, actions, rewards, next_obs, discounts) -> torch.Tensor:
        count = len(rewards)
        if count > self.capacity:
            raise ValueError(f"cannot add {count} transitions to a ring of {self.capacity}")
        start = self.cursor
        slots = torch.arange(start, start + count, dtype=torch.int64, device=self.device)
        wraps = start + count > self.capacity
        if wraps:
            slots = slots.remainder_(self.capacity)
        for name, values in zip(FIELDS, (obs, actions, rewards, next_obs, discounts)):
            arr = self.storage[name]
            values = torch.as_tensor(values, dtype=arr.dtype, device=self.device)
            if wraps:
                arr[slots] = values
            else:
                arr[start:start + count] = values
        self.cursor = (start + count) % self.capacity
        self.size = min(self.size + count, self.capacity)
        self.inserted += count
        return slots

    def gather(self, indices, out: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        indices = torch.as_tensor(indices, dtype=torch.int64, device=self.device).reshape(-1)
        batch = indices.shape[0]
        if out is None:
            out = self._out.get(batch)
            if out is None:
                out = {name: torch.empty((batch, *arr.shape[1:]), dtype=arr.dtype, device=self.device)
                       for name, arr in self.storage.items()}
                self._out[batch] = out
        for name, arr in self.storage.items():
            torch.index_select(arr, 0, indices, out=out[name])
        return out
