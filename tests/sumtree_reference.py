"""The float64 model every sum-tree backend's tests compare against (cumsum + searchsorted)."""
import numpy as np


def reference_find(priorities, prefixes):
    """Leaf j with c_{j-1} <= prefix < c_j, from a float64 cumulative sum."""
    return np.searchsorted(np.cumsum(np.asarray(priorities, np.float64)), prefixes, side="right")


def away_from_boundaries(priorities, prefixes, rel=1e-9):
    """Prefixes not within rel * total of any bracket boundary c_j (sorted search: O(n log n))."""
    prefixes = np.asarray(prefixes, np.float64)
    cum = np.concatenate(([0.0], np.cumsum(np.asarray(priorities, np.float64))))
    pos = np.clip(np.searchsorted(cum, prefixes), 1, len(cum) - 1)
    gap = np.minimum(np.abs(prefixes - cum[pos - 1]), np.abs(prefixes - cum[pos]))
    return gap > rel * cum[-1]


def assert_same_tree(tree, reference):
    """Layout, every node of both trees, total and min, value for value (a device tree of float64
    sums in the reference's order matches it exactly)."""
    assert (tree.capacity, tree.fanout, tree.depth) == (reference.capacity, reference.fanout, reference.depth)
    for mine, theirs in zip(tree.sums, reference.sums, strict=True):
        np.testing.assert_array_equal(mine, theirs)
    for mine, theirs in zip(tree.mins, reference.mins, strict=True):
        np.testing.assert_array_equal(mine, theirs)
    assert tree.total == reference.total and tree.min() == reference.min()


def check_last_write_wins(tree, reference, capacity, data, same_tree=assert_same_tree):
    """A few batches of updates with repeated indices (drawn from hypothesis's `data`): each leaf
    holds its last write, as sequential updates would leave it, and the tree matches the reference."""
    from hypothesis import strategies as st

    expected = np.zeros(capacity)
    for _ in range(data.draw(st.integers(1, 4))):
        indices = data.draw(st.lists(st.integers(0, capacity - 1), min_size=1, max_size=2 * capacity))
        values = data.draw(st.lists(st.floats(0.0, 50.0), min_size=len(indices), max_size=len(indices)))
        tree.update(np.array(indices), np.array(values))
        reference.update(np.array(indices), np.array(values))
        for i, v in zip(indices, values):
            expected[i] = v
        np.testing.assert_array_equal(tree.get(np.arange(capacity)), expected)
        same_tree(tree, reference)
