"""kernels/cpu compiled_entry: numba's compiled code of a kernel for exactly the types of the
arguments it is given, called without the dispatcher's typing (the frame table's 1-step samples
call theirs so: pearl/replay/frames.py `_compiled_sample`)."""
import numpy as np
from numba import njit

from pearl.kernels.cpu import compiled_entry


@njit(nogil=True)
def scaled_sum(values, scale, out):
    total = 0.0
    for i in range(values.shape[0]):
        out[i] = values[i] * scale
        total += out[i]
    return total


def test_an_entry_computes_what_the_dispatched_kernel_does_for_its_types():
    rng = np.random.default_rng(0)
    for dtype in (np.float32, np.float64):
        values, out, expected = rng.normal(size=17).astype(dtype), np.empty(17, dtype), np.empty(17, dtype)
        entry = compiled_entry(scaled_sum, values, 2.5, out)
        assert entry(values, 2.5, out) == scaled_sum(values, 2.5, expected)
        assert np.array_equal(out, expected) and out.dtype == dtype
    assert len(scaled_sum.signatures) == 2  # one compiled version per dtype, made by compiled_entry


def test_a_table_samples_the_same_through_its_entries_as_through_the_dispatched_kernels():
    """The frame table's bound sample against frame_storage.sample_uniform called through numba's
    dispatcher on the same uniforms."""
    from pearl.kernels.cpu import frame_storage
    from pearl.replay.frames import FrameReplay

    table = FrameReplay(256, (6, 5), 4, streams=2, gather_threads=2)
    rng = np.random.default_rng(1)
    for step in range(300):
        frames = rng.integers(0, 256, (2, 6, 5), np.uint8)
        table.add([0, 1], frames, [step % 3, 1], [1.0, -1.0], frames, [step % 37 == 0, False], [False, False])
    batch = table.sample(24, np.random.default_rng(2))
    got = {name: np.copy(getattr(batch, name)) for name in ("obs", "next_obs", "actions", "rewards", "discounts",
                                                            "indices")}
    prepared = table.outputs(24)
    uniforms = np.random.default_rng(2).random(48)
    assert frame_storage.sample_uniform(table._records, uniforms, np.empty(24), prepared[5], prepared[0].base,
                                        prepared[2], prepared[3], prepared[4], 2)
    for name, expected in zip(("indices", "actions", "rewards", "discounts"), prepared[5:6] + prepared[2:5]):
        assert np.array_equal(got[name].reshape(expected.shape), expected), name
    assert np.array_equal(got["obs"], table._as_obs(prepared[0]))
