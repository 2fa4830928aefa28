"""AMPER-style approximate prioritized sampling: priorities quantized into log-spaced buckets.

AMPER (Li et al., ICCAD'22) replaces the sum-tree descent of prioritized replay with an operation
an associative memory does well: find a candidate set of stored priorities "near" a random key and
sample from it. In software the candidate sets are fixed in advance: every stored priority (already
raised to alpha, as for `kernels.cpu.sumtree.SumTree`) falls into one of `n_buckets` log-spaced
buckets; a draw picks a bucket with probability proportional to the bucket's mass (the exact sum of
its members' priorities), then a member of that bucket uniformly. So item i of bucket b is drawn
with probability

    q_i = (mass_b / total) * (1 / count_b) = mean_b / total

instead of exact PER's P_i = p_i / total. Within a bucket all members are equally likely (the bias:
q_i / P_i = mean_b / p_i lies in [1/r, r] for a bucket ratio r = high/low per bucket), and the
total-variation distance to exact PER is at most (sqrt(r) - 1) / (sqrt(r) + 1) for priorities
inside [low, high) (see docs/AMPER.md). `probabilities()` returns q_i exactly, so importance
weights can correct for what this sampler really does.

Interface (mirrors SumTree where it can):

    AmperSampler(capacity, n_buckets=512, low=1e-6, high=1e4)
    update(indices, priorities)   set priorities (>= 0, finite); last duplicate wins; a slot that is
                                  already present moves between buckets; 0 removes it
    sample(uniforms)              stratified: target_i = (i + u_i) * total / B picks the bucket by
                                  the cumulative bucket masses; the position of target_i inside the
                                  bucket's slice picks the member (rank = floor(frac * count))
    sample_with_probabilities(uniforms) -> (indices, q)   the same plus q_i in one pass
    probabilities(indices)        q_i = mean of i's bucket / total (0 for zero-priority slots)
    min_probability()             smallest q_i over stored items (for weight normalisation)
    total                         sum of all priorities (sum of bucket masses)
    min()                         smallest bucket mean (priority units; inf when empty)
    get(indices)                  stored priorities
    size                          number of slots with a positive priority
    bucket_index(priorities), bucket_edges, members(b), refresh()

Layout (all O(1) per updated item): slot -> (bucket, rank); each bucket's member list is a paged
array (pages of `page_size` slots from a shared pool, a per-bucket page table), so a bucket can
hold anything from 0 to `capacity` members while memory stays capacity + n_buckets * page_size.
Removal is swap-remove (the bucket's last member takes the freed rank; an emptied last page goes
back to the pool). Bucket masses are running sums with Neumaier compensation; a bucket that
becomes empty is reset to exactly 0, and `refresh()` recomputes every mass from its members.
Priorities below `low` go to bucket 0 and those at or above `high` to the last bucket (there the
ratio bound does not hold). Zero priorities are in no bucket and are never sampled.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from pearl.kernels.cpu.fast_sumtree import _count_not_above

_NJIT = dict(cache=True, nogil=True)


@njit(inline="always")
def _bucket(p, log_low, inv_log_ratio, n_buckets):
    if p <= 0.0:
        return -1
    x = (math.log(p) - log_low) * inv_log_ratio
    if x < 0.0:
        return 0
    if x >= n_buckets:
        return n_buckets - 1
    return int(x)


@njit(inline="always")
def _add_mass(mass, comp, b, x):
    """Neumaier-compensated mass[b] += x; the bucket's mass is mass[b] + comp[b]."""
    s = mass[b]
    t = s + x
    if abs(s) >= abs(x):
        comp[b] += (s - t) + x
    else:
        comp[b] += (x - t) + s
    mass[b] = t


@njit(**_NJIT)
def _bucket_index(priorities, log_low, inv_log_ratio, n_buckets, out):
    for i in range(priorities.shape[0]):
        out[i] = _bucket(priorities[i], log_low, inv_log_ratio, n_buckets)


@njit(**_NJIT)
def _update(indices, priorities, prio, bucket_of, rank_of, count, mass, comp, page_table, pages,
            free_pages, state, shift, mask, log_low, inv_log_ratio, n_buckets):
    # state[0]: free-page stack height, state[1]: number of stored (positive) items
    # Touch passes: at capacity 1M the slot arrays and member pages are cache misses; loading
    # them in tight independent loops first lets the CPU overlap the misses (the processing loop
    # below is a dependent chain that would take them one at a time). Results are unaffected.
    n = indices.shape[0]
    capacity = prio.shape[0]
    touch = 0.0
    for j in range(n):  # validate before changing anything
        i = indices[j]
        if i < 0 or i >= capacity:
            return 1, touch
        p = priorities[j]
        if not (p >= 0.0 and p < np.inf):
            return 2, touch
        touch += prio[i] + bucket_of[i] + rank_of[i]
    for j in range(n):
        i = indices[j]
        b = bucket_of[i]
        if b >= 0:
            r = rank_of[i]
            if r < count[b]:
                touch += pages[page_table[b, r >> shift], r & mask]
    for j in range(n):
        b = bucket_of[indices[j]]
        if b >= 0 and count[b] > 0:
            last = count[b] - 1
            touch += rank_of[pages[page_table[b, last >> shift], last & mask]]
    for j in range(n):
        i = indices[j]
        p = priorities[j]
        old_b = bucket_of[i]
        new_b = _bucket(p, log_low, inv_log_ratio, n_buckets)
        if old_b >= 0:
            if old_b == new_b:
                _add_mass(mass, comp, old_b, p - prio[i])
                prio[i] = p
                continue
            # swap-remove slot i from old_b
            last = count[old_b] - 1
            r = rank_of[i]
            if r != last:
                moved = pages[page_table[old_b, last >> shift], last & mask]
                pages[page_table[old_b, r >> shift], r & mask] = moved
                rank_of[moved] = r
            if (last & mask) == 0:  # the last page is now empty: back to the pool
                free_pages[state[0]] = page_table[old_b, last >> shift]
                state[0] += 1
                page_table[old_b, last >> shift] = -1
            count[old_b] = last
            if last == 0:
                mass[old_b] = 0.0
                comp[old_b] = 0.0
            else:
                _add_mass(mass, comp, old_b, -prio[i])
            state[1] -= 1
        if new_b >= 0:
            r = count[new_b]
            if (r & mask) == 0:  # needs a fresh page
                state[0] -= 1
                page_table[new_b, r >> shift] = free_pages[state[0]]
            pages[page_table[new_b, r >> shift], r & mask] = i
            rank_of[i] = r
            count[new_b] = r + 1
            _add_mass(mass, comp, new_b, p)
            state[1] += 1
        bucket_of[i] = new_b
        prio[i] = p
    return 0, touch


@njit(inline="always")
def _cumulative(mass, comp, count, cum):
    """cum[b] = sum of bucket masses 0..b; returns the last non-empty bucket (-1 if none)."""
    acc = 0.0
    last = -1
    for b in range(mass.shape[0]):
        if count[b] > 0:
            acc += mass[b] + comp[b]
            last = b
        cum[b] = acc
    return last


@njit(**_NJIT)
def _sample(uniforms, mass, comp, count, page_table, pages, shift, mask, out, out_prob, want_prob):
    n_buckets = mass.shape[0]
    cum = np.empty(n_buckets)
    last = _cumulative(mass, comp, count, cum)
    total = cum[n_buckets - 1]
    batch = uniforms.shape[0]
    step = total / batch
    for i in range(batch):
        target = (i + uniforms[i]) * step
        # first bucket whose cumulative mass exceeds the target (empty buckets never do), by a
        # branchless search: a branchy one mispredicts every other step and serialises the batch
        b = _count_not_above(cum, 0, n_buckets, target)
        if b >= n_buckets:  # rounding: target >= total
            b = last
        before = cum[b - 1] if b > 0 else 0.0
        width = cum[b] - before
        frac = (target - before) / width if width > 0.0 else 0.0
        c = count[b]
        r = int(frac * c)
        if r >= c:
            r = c - 1
        elif r < 0:
            r = 0
        out[i] = pages[page_table[b, r >> shift], r & mask]
        if want_prob:
            out_prob[i] = (mass[b] + comp[b]) / c / total
    return total


@njit(**_NJIT)
def _probabilities(indices, bucket_of, mass, comp, count, out):
    total = 0.0
    for b in range(mass.shape[0]):
        if count[b] > 0:
            total += mass[b] + comp[b]
    for j in range(indices.shape[0]):
        b = bucket_of[indices[j]]
        out[j] = 0.0 if b < 0 else (mass[b] + comp[b]) / count[b] / total


@njit(**_NJIT)
def _min_mean(mass, comp, count):
    best = np.inf
    for b in range(mass.shape[0]):
        if count[b] > 0:
            mean = (mass[b] + comp[b]) / count[b]
            if mean < best:
                best = mean
    return best


@njit(**_NJIT)
def _refresh(prio, count, mass, comp, page_table, pages, shift, mask):
    for b in range(mass.shape[0]):
        s = 0.0
        c = 0.0
        for r in range(count[b]):
            x = prio[pages[page_table[b, r >> shift], r & mask]]
            t = s + x
            if abs(s) >= abs(x):
                c += (s - t) + x
            else:
                c += (x - t) + s
            s = t
        mass[b] = s + c
        comp[b] = 0.0


class AmperSampler:
    """Approximate prioritized sampler over `capacity` slots, `n_buckets` log-spaced buckets on
    [low, high) (bucket ratio r = (high / low) ** (1 / n_buckets)); see the module docstring."""

    def __init__(self, capacity: int, n_buckets: int = 512, low: float = 1e-6, high: float = 1e4,
                 page_size: int | None = None):
        if capacity < 1 or n_buckets < 1:
            raise ValueError(f"AMPER needs capacity >= 1 and n_buckets >= 1, got {capacity}, {n_buckets}")
        if not (0.0 < low < high < math.inf):
            raise ValueError(f"AMPER needs 0 < low < high < inf, got {low}, {high}")
        self.capacity, self.n_buckets = int(capacity), int(n_buckets)
        self.low, self.high = float(low), float(high)
        self.ratio = (self.high / self.low) ** (1.0 / self.n_buckets)
        self._log_low = math.log(self.low)
        self._inv_log_ratio = self.n_buckets / (math.log(self.high) - self._log_low)
        if page_size is None:  # about capacity / n_buckets, a power of two in [16, 4096]
            page_size = 1 << max(4, min(12, (max(1, -(-capacity // n_buckets)) - 1).bit_length()))
        if page_size < 1 or page_size & (page_size - 1):
            raise ValueError(f"page_size must be a power of two, got {page_size}")
        self.page_size = int(page_size)
        self._shift, self._mask = self.page_size.bit_length() - 1, self.page_size - 1
        pages_per_bucket = -(-self.capacity // self.page_size)
        n_pages = pages_per_bucket + self.n_buckets  # each bucket has at most one part-filled page
        self._prio = np.zeros(self.capacity)
        self._bucket_of = np.full(self.capacity, -1, dtype=np.int32)
        self._rank_of = np.zeros(self.capacity, dtype=np.int64)
        self._count = np.zeros(self.n_buckets, dtype=np.int64)
        self._mass = np.zeros(self.n_buckets)
        self._comp = np.zeros(self.n_buckets)
        self._page_table = np.full((self.n_buckets, pages_per_bucket), -1, dtype=np.int32)
        self._pages = np.zeros((n_pages, self.page_size), dtype=np.int32)
        self._free_pages = np.arange(n_pages - 1, -1, -1, dtype=np.int32)
        self._state = np.array([n_pages, 0], dtype=np.int64)

    # -- queries --------------------------------------------------------------------------------
    @property
    def bucket_edges(self) -> np.ndarray:
        """The n_buckets + 1 bucket boundaries low * r**k (bucket 0 also takes (0, low), the last
        bucket also [high, inf))."""
        return self.low * self.ratio ** np.arange(self.n_buckets + 1)

    @property
    def size(self) -> int:
        return int(self._state[1])

    @property
    def total(self) -> float:
        full = self._count > 0
        return float(np.sum(self._mass[full] + self._comp[full]))

    @property
    def counts(self) -> np.ndarray:
        return self._count.copy()

    @property
    def masses(self) -> np.ndarray:
        return np.where(self._count > 0, self._mass + self._comp, 0.0)

    def min(self) -> float:
        """The smallest bucket mean (the priority every member of that bucket is drawn with)."""
        return float(_min_mean(self._mass, self._comp, self._count))

    def min_probability(self) -> float:
        """The smallest q_i over stored items (0 when empty): importance weights
        (N q_i)^-beta are normalised by (N * min_probability())^-beta."""
        total = self.total
        return float(self.min() / total) if total > 0 else 0.0

    def get(self, indices) -> np.ndarray:
        return self._prio[np.asarray(indices)]

    def bucket_index(self, priorities) -> np.ndarray:
        """The bucket each priority would go to (-1 for 0)."""
        priorities = np.ascontiguousarray(priorities, dtype=np.float64).ravel()
        out = np.empty(priorities.shape[0], dtype=np.int64)
        _bucket_index(priorities, self._log_low, self._inv_log_ratio, self.n_buckets, out)
        return out

    def members(self, bucket: int) -> np.ndarray:
        """The slots in `bucket`, in rank order."""
        ranks = np.arange(self._count[bucket])
        return self._pages[self._page_table[bucket, ranks >> self._shift], ranks & self._mask].astype(np.int64)

    def probabilities(self, indices) -> np.ndarray:
        """The probability with which one draw of this sampler returns each index."""
        indices = np.ascontiguousarray(indices, dtype=np.int64).ravel()
        out = np.empty(indices.shape[0])
        if self.size == 0:
            out[:] = 0.0
            return out
        _probabilities(indices, self._bucket_of, self._mass, self._comp, self._count, out)
        return out

    # -- updates and sampling -------------------------------------------------------------------
    def update(self, indices, priorities) -> None:
        indices = np.ascontiguousarray(indices, dtype=np.int64).ravel()
        priorities = np.ascontiguousarray(priorities, dtype=np.float64).ravel()
        if priorities.shape[0] == 1 and indices.shape[0] != 1:
            priorities = np.full(indices.shape[0], priorities[0])
        if indices.shape[0] != priorities.shape[0]:
            raise ValueError(f"{indices.shape[0]} indices but {priorities.shape[0]} priorities")
        if indices.shape[0] == 0:
            return
        status, _ = _update(indices, priorities, self._prio, self._bucket_of, self._rank_of, self._count,
                self._mass, self._comp, self._page_table, self._pages, self._free_pages, self._state,
                self._shift, self._mask, self._log_low, self._inv_log_ratio, self.n_buckets)
        if status == 1:  # nothing was changed
            raise IndexError(f"AMPER slot out of range [0, {self.capacity})")
        if status == 2:
            raise ValueError("AMPER priorities must be finite and >= 0")

    def _sample(self, uniforms, want_prob: bool):
        uniforms = np.ascontiguousarray(uniforms, dtype=np.float64).ravel()
        if self.size == 0:
            raise ValueError("AMPER: cannot sample from an empty sampler")
        out = np.empty(uniforms.shape[0], dtype=np.int64)
        prob = np.empty(uniforms.shape[0] if want_prob else 0)
        _sample(uniforms, self._mass, self._comp, self._count, self._page_table, self._pages,
                self._shift, self._mask, out, prob, want_prob)
        return out, prob

    def sample(self, uniforms) -> np.ndarray:
        """Stratified: one index per uniform in [0, 1), slice i of B equal slices of the total mass."""
        return self._sample(uniforms, False)[0]

    def sample_with_probabilities(self, uniforms) -> tuple[np.ndarray, np.ndarray]:
        """sample(uniforms) and probabilities() of the drawn indices, in one pass."""
        return self._sample(uniforms, True)

    def refresh(self) -> None:
        """Recomputes every bucket mass from its members (drops accumulated rounding)."""
        _refresh(self._prio, self._count, self._mass, self._comp, self._page_table, self._pages,
                 self._shift, self._mask)
