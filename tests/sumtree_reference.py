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
