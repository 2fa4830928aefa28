"""Observations of any shape and dtype through the whole-observation replays (stored as given, no
conversion), and the builder's choice of the frame table (replay.frame_stack)."""
import numpy as np
import pytest

from pearl.config import ReplayConfig
from pearl.errors import ConfigError
from pearl.replay import FrameReplay, NStepBuffer, PrioritizedReplay, UniformReplay, make_replay


@pytest.mark.parametrize("shape,dtype", [((4, 6, 6), np.uint8), ((3,), np.uint8), ((5, 2), np.float16),
                                         ((7,), np.float64), ((2, 3, 3), np.float32)])
@pytest.mark.parametrize("kind", ["uniform", "prioritized", "amper"])
def test_observations_are_stored_and_sampled_in_their_own_shape_and_dtype(shape, dtype, kind):
    rng = np.random.default_rng(0)
    replay = make_replay(ReplayConfig(kind=kind, capacity=50), shape, obs_dtype=dtype)
    assert isinstance(replay, UniformReplay if kind == "uniform" else PrioritizedReplay)
    obs = rng.integers(0, 200, (80, *shape)).astype(dtype)
    next_obs = rng.integers(0, 200, (80, *shape)).astype(dtype)
    for start in range(0, 80, 16):  # wraps around the 50-slot ring
        replay.add(obs[start:start + 16], np.arange(start, start + 16), np.ones(16), next_obs[start:start + 16],
                   np.full(16, 0.9))
    assert replay.storage["obs"].dtype == dtype and replay.storage["obs"].shape == (50, *shape)
    batch = replay.sample(32, rng)
    assert batch.obs.dtype == dtype and batch.obs.shape == (32, *shape)
    written = batch.actions  # action a was inserted with obs[a]
    assert np.array_equal(batch.obs, obs[written]) and np.array_equal(batch.next_obs, next_obs[written])
    assert np.all(written >= 30)  # the 30 oldest were overwritten


def test_n_step_buffer_keeps_image_observations():
    buffer = NStepBuffer(2, 0.5, 2, (2, 3, 3), obs_dtype=np.uint8)
    frames = [np.full((2, 2, 3, 3), t, np.uint8) for t in range(4)]
    assert buffer.step(frames[0], np.zeros(2, np.int64), np.ones(2), frames[1], np.zeros(2, bool),
                       np.zeros(2, bool)) is None
    obs, _, returns, next_obs, _ = buffer.step(frames[1], np.zeros(2, np.int64), np.ones(2), frames[2],
                                               np.zeros(2, bool), np.zeros(2, bool))
    assert obs.dtype == np.uint8 and np.all(obs == 0) and np.all(next_obs == 2) and returns.tolist() == [1.5, 1.5]


def test_the_frame_table_is_chosen_by_replay_frame_stack():
    config = ReplayConfig(kind="prioritized", capacity=120, frame_stack=4)
    replay = make_replay(config, (4, 8, 8), obs_dtype=np.uint8, streams=3, n_step=2, gamma=0.9)
    assert isinstance(replay, FrameReplay) and replay.prioritized
    assert (replay.streams, replay.length, replay.n_step, replay.gamma) == (3, 40, 2, 0.9)
    assert replay.frames.dtype == np.uint8 and replay.frames.shape == (120, 8, 8)
    with pytest.raises(ConfigError, match=r"replay.frame_stack: 4 frames .* shape \(3, 8, 8\)"):
        make_replay(config, (3, 8, 8), obs_dtype=np.uint8)
    with pytest.raises(ConfigError, match="replay.capacity: 120 leaves 2 records"):
        make_replay(config, (4, 8, 8), obs_dtype=np.uint8, streams=60, n_step=2)


def test_frame_stack_is_checked_in_the_config():
    from pearl.config import apply_overrides, ExperimentConfig

    with pytest.raises(ConfigError, match="replay.frame_stack"):
        apply_overrides(ExperimentConfig(), {"replay.frame_stack": -1})


def _allocated_bytes(obj, seen: set, depth: int = 0) -> int:
    """Bytes of the distinct numpy buffers an object's attributes (and their objects') hold."""
    total = 0
    for value in vars(obj).values():
        values = value if isinstance(value, (list, tuple)) else [value]
        for item in values:
            if isinstance(item, np.ndarray):
                while isinstance(item.base, np.ndarray):
                    item = item.base
                if id(item) not in seen:
                    seen.add(id(item))
                    total += item.nbytes
            elif depth < 2 and hasattr(item, "__dict__") and not isinstance(item, type) and not callable(item):
                total += _allocated_bytes(item, seen, depth + 1)
    return total


@pytest.mark.parametrize("frame_stack", [0, 4])
@pytest.mark.parametrize("kind", ["uniform", "prioritized"])
@pytest.mark.parametrize("capacity,shape,dtype,action", [(5000, (4, 6, 6), np.uint8, (np.int64, ())),
                                                          (70000, (4, 3), np.float32, (np.float32, (2,)))])
def test_table_bytes_is_what_the_table_allocates(frame_stack, kind, capacity, shape, dtype, action):
    """The memory check's figure (pearl.replay.table_bytes) against the arrays the table holds: the
    rows (a frame table's records hold one frame: a quarter of a 4-stack), and the sum tree, padded
    to a power of its fanout (capacity 70,000: 1,048,576 leaves)."""
    from pearl.replay import table_bytes

    config = ReplayConfig(kind=kind, capacity=capacity, frame_stack=frame_stack)
    replay = make_replay(config, shape, obs_dtype=dtype, action_dtype=action[0], action_shape=action[1])
    held = _allocated_bytes(replay, set())
    expected = table_bytes(config, shape, dtype, *action)
    # what the estimate leaves out: a frame table's per-stream counters, the batch outputs, alignment
    assert expected <= held <= expected + 4096


def test_a_table_larger_than_free_memory_is_refused_in_one_line(monkeypatch):
    """Atari's 1M transitions fit as a frame table (~6.6 GiB of 84x84 uint8 frames) and not as whole
    stacks (~53 GiB): the builder's check prices the table it will build."""
    import pearl.kernels.cpu.backend as cpu
    from pearl.replay import check_table_fits

    monkeypatch.setattr(cpu, "memory_available", lambda: 8 * 2**30)
    frames = ReplayConfig(capacity=1_000_000, frame_stack=4)
    check_table_fits("replay.capacity", frames, (4, 84, 84), np.uint8, np.int64)
    with pytest.raises(ConfigError, match=r"^replay\.capacity: 1,000,000 transitions of 4x84x84 uint8 observations "
                                          r"need about 52\.6 GiB; this machine has 8\.0 GiB available$"):
        check_table_fits("replay.capacity", ReplayConfig(capacity=1_000_000), (4, 84, 84), np.uint8, np.int64)


@pytest.mark.parametrize("frame_stack", [0, 4])
@pytest.mark.parametrize("kind", ["uniform", "prioritized"])
def test_a_state_is_the_tables_rows_unless_detached(frame_stack, kind):
    """A checkpoint writes the table's own rows (no second copy of a GB table in memory); a
    detached state (the server's snapshot, a ray shard's) keeps what it held while rows go on."""
    rng = np.random.default_rng(0)
    replay = make_replay(ReplayConfig(kind=kind, capacity=64, frame_stack=frame_stack), (4, 3, 3), obs_dtype=np.uint8)

    def add(rows: int):
        obs = rng.integers(0, 256, (rows, 4, 3, 3), dtype=np.uint8)
        if frame_stack:
            replay.add(np.zeros(rows, np.int64), obs, np.zeros(rows, np.int64), np.ones(rows, np.float32), obs[:, -1],
                       np.zeros(rows, bool), np.zeros(rows, bool))
        else:
            replay.add(obs, np.zeros(rows, np.int64), np.ones(rows, np.float32), obs, np.full(rows, 0.99, np.float32))

    add(80)  # past full: every slot stored
    own, detached = replay.state_dict(), replay.state_dict(detached=True)
    rows = (lambda state: state["frames"]) if frame_stack else (lambda state: state["storage"]["obs"])
    table = replay._frames if frame_stack else replay._ring.rows
    assert np.shares_memory(rows(own), table) and not np.shares_memory(rows(detached), table)
    kept = rows(detached).copy()
    add(30)
    assert np.array_equal(rows(detached), kept) and not np.array_equal(rows(own), kept)
