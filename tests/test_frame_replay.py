"""The frame-deduplicated replay (pearl/replay/frames.py) against its naive reference
(tests/frame_replay_reference.py): the same sampleable transitions with the same obs, next obs,
action, n-step return and discount, across ring wrap-around, episode starts and ends, n-step and
several interleaved env streams, for every selector."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from frame_replay_reference import ReferenceFrameReplay
from pearl.replay.frames import FrameReplay

FRAME = (2, 3)
WIDE = (9, 11)  # 99 bytes: windows of several cache lines and a tail, the gather's line copies
LARGE = (64, 64)  # 4096 bytes: written by non-temporal stores (frame_storage.STREAM_FRAMES_FROM)


def drive(table, reference, rng, steps: int, end_probability: float, batch_streams: int, frame_dtype,
          takeover_probability: float = 0.0):
    """Random env steps of every stream, `batch_streams` rows per add (a stream may repeat: its
    steps are consecutive), into both tables; with `takeover_probability` a row is a new writer's
    first step on its stream (written ~s), which begins an episode there, mid-episode or not."""
    streams = table.streams
    current = [None] * streams  # the newest frame of each stream's current obs
    action_shape, frame_shape = table.action_shape, table.frame_shape
    for _ in range(steps):
        rows = rng.integers(streams, size=batch_streams)
        batch = {k: [] for k in ("obs", "next", "actions", "rewards", "term", "trunc")}
        for i, s in enumerate(rows):
            begins = rng.random() < takeover_probability
            if begins:
                current[s], rows[i] = None, ~s
            if current[s] is None:  # reset
                current[s] = rng.integers(0, 256, frame_shape).astype(frame_dtype)
            frame, next_frame = current[s], rng.integers(0, 256, frame_shape).astype(frame_dtype)
            action = (rng.integers(6) if action_shape == () else rng.uniform(-1, 1, action_shape)
                      ).astype(table.action_dtype)
            reward = np.float32(rng.normal())
            term, trunc = rng.random() < end_probability, rng.random() < end_probability / 2
            reference.add(s, frame, action, reward, next_frame, term, trunc, begins)
            for key, value in zip(batch, (frame, next_frame, action, reward, term, trunc)):
                batch[key].append(value)
            current[s] = None if term or trunc else next_frame
        # obs go in as full stacks (the table reads their last frame), next obs as frames
        stacks = np.stack([np.stack([f] * table.stack) for f in batch["obs"]])
        table.add(rows, stacks, np.array(batch["actions"]), np.array(batch["rewards"]), np.array(batch["next"]),
                  np.array(batch["term"]), np.array(batch["trunc"]))


def assert_matches(table, expected: dict, indices: np.ndarray, batch):
    for i, slot in enumerate(indices):
        obs, action, ret, next_obs, discount = expected[int(slot)]
        assert np.array_equal(batch.obs[i], obs), f"obs of slot {slot}"
        assert np.array_equal(batch.next_obs[i], next_obs), f"next obs of slot {slot}"
        assert np.array_equal(batch.actions[i], action)
        assert batch.rewards[i] == pytest.approx(ret, rel=1e-5, abs=1e-5)
        assert batch.discounts[i] == pytest.approx(discount, rel=1e-6)


@pytest.mark.parametrize("gather_threads", [1, 2])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stack=st.integers(1, 4), n=st.integers(1, 4), streams=st.integers(1, 3), spare=st.integers(0, 9),
       steps=st.integers(1, 120), end=st.sampled_from([0.0, 0.05, 0.3]), batch_streams=st.integers(1, 4),
       kind=st.sampled_from(["uniform", "prioritized", "amper"]), float_frames=st.booleans(),
       vector_actions=st.booleans(), takeover=st.sampled_from([0.0, 0.1]), frame=st.sampled_from([FRAME, WIDE, LARGE]),
       seed=st.integers(0, 2**31))
def test_frame_replay_matches_the_naive_reference(gather_threads, stack, n, streams, spare, steps, end,
                                                  batch_streams, kind, float_frames, vector_actions, takeover,
                                                  frame, seed):
    length, gamma = stack + n + spare, 0.9
    frame_dtype = np.float32 if float_frames else np.uint8
    table = FrameReplay(length * streams, frame, stack, streams=streams, n_step=n, gamma=gamma, kind=kind,
                        frame_dtype=frame_dtype, action_dtype=np.float32 if vector_actions else np.int64,
                        action_shape=(2,) if vector_actions else (), gather_threads=gather_threads)
    reference = ReferenceFrameReplay(length, streams, stack, n, gamma)
    rng = np.random.default_rng(seed)
    drive(table, reference, rng, steps, end, batch_streams, frame_dtype, takeover)

    expected = reference.valid()
    assert sorted(expected) == table.valid_indices().tolist()
    assert table.size == len(expected)
    leaves = table.tree.get(np.arange(table.capacity))  # the selector holds exactly the valid transitions
    assert np.flatnonzero(leaves).tolist() == sorted(expected)
    assert table.tree.total == pytest.approx(leaves.sum())
    if not expected:
        with pytest.raises(ValueError):
            table.sample(8, rng)
        return
    slots = np.array(sorted(expected))
    batch = table.gather(slots)
    assert batch.obs.shape == (len(slots), stack, *frame) and batch.obs.dtype == frame_dtype
    assert_matches(table, expected, slots, batch)

    batch = table.sample(16, rng)
    assert set(batch.indices.tolist()) <= set(expected)
    assert_matches(table, expected, batch.indices, batch)
    if kind != "uniform":
        assert batch.weights.shape == (16,) and np.all(batch.weights > 0) and np.all(batch.weights <= 1 + 1e-6)
        table.update_priorities(batch.indices, rng.normal(size=16))
        # priorities never revive a transition that left
        assert np.all(table.tree.get(np.flatnonzero(table._valid == 0)) == 0)


def test_a_stacked_obs_at_an_episode_start_repeats_the_reset_frame():
    table = FrameReplay(16, (1,), 4, n_step=1, gamma=0.5)
    frames = np.arange(1, 10, dtype=np.uint8).reshape(-1, 1)
    for t in range(3):  # an episode of 3 steps: frames 1, 2, 3, final 4 (terminated)
        table.add([0], frames[t:t + 1], [t], [1.0], frames[t + 1:t + 2], [t == 2], [False])
    table.add([0], frames[4:5], [7], [2.0], frames[5:6], [False], [True])  # a new episode: 5, 6 (truncated)
    batch = table.gather(table.valid_indices())
    assert batch.obs[:, :, 0].tolist() == [[1, 1, 1, 1], [1, 1, 1, 2], [1, 1, 2, 3], [5, 5, 5, 5]]
    assert batch.next_obs[:, :, 0].tolist() == [[1, 1, 1, 2], [1, 1, 2, 3], [1, 2, 3, 4], [5, 5, 5, 6]]
    assert batch.discounts.tolist() == [0.5, 0.5, 0.0, 0.5]  # the truncated episode bootstraps


def test_n_step_returns_stop_at_the_episode_end():
    table = FrameReplay(32, (1,), 2, n_step=3, gamma=0.5)
    for t in range(4):  # rewards 1, 2, 4, 8; the episode terminates after step 3
        table.add([0], [[t]], [t], [2.0 ** t], [[t + 1]], [t == 3], [False])
    batch = table.gather(table.valid_indices())
    assert batch.rewards.tolist() == [1 + 1 + 1, 2 + 2 + 2, 4 + 4, 8]
    assert batch.discounts.tolist() == [0.125, 0.0, 0.0, 0.0]
    assert batch.next_obs[:, :, 0].tolist() == [[2, 3], [3, 4], [3, 4], [3, 4]]


def test_overwritten_frames_leave_the_selector():
    stack, length = 4, 8
    table = FrameReplay(length, (1,), stack, n_step=1, kind="prioritized")
    for t in range(20):  # one long episode
        table.add([0], [[t]], [0], [0.0], [[t + 1]], [False], [False])
    # records 13..20 (frames 0..20) are stored; transitions need their 3 previous frames and the next
    starts = table.gather(table.valid_indices()).obs[:, -1, 0]
    assert starts.tolist() == [16, 17, 18, 19]
    assert table.tree.get(np.arange(length)).nonzero()[0].size == 4
    rng = np.random.default_rng(0)
    for _ in range(20):
        assert set(table.sample(8, rng).obs[:, -1, 0].tolist()) <= {16, 17, 18, 19}


@pytest.mark.parametrize("backend", ["numba", "numpy"])
def test_a_late_priority_update_does_not_revive_an_overwritten_transition(backend):
    """A batch drawn, then records written over some of its slots (a concurrent writer), then its
    priority update: the slots that hold no transition now keep priority 0."""
    table = FrameReplay(8, (1,), 4, n_step=1, kind="prioritized", backend=backend)
    for t in range(20):
        table.add([0], [[t]], [0], [0.0], [[t + 1]], [False], [False])
    batch = table.sample(16, np.random.default_rng(0))
    for t in range(20, 22):  # a new episode's first frames invalidate the slots they land in
        table.add([0], [[t]], [0], [0.0], [[t + 1]], [t == 21], [False])
    left = sorted(set(batch.indices.tolist()) - set(table.valid_indices().tolist()))
    assert left  # (the case under test)
    table.update_priorities(batch.indices, np.full(16, 5.0))
    leaves = table.tree.get(np.arange(table.capacity))
    assert np.flatnonzero(leaves).tolist() == table.valid_indices().tolist()


def test_bad_writes_are_refused():
    table = FrameReplay(16, (2, 2), 2, streams=2)
    with pytest.raises(IndexError, match="stream 2 out of range"):
        table.add([2], np.zeros((1, 2, 2)), [0], [0.0], np.zeros((1, 2, 2)), [False], [False])
    with pytest.raises(IndexError, match="stream 2 out of range"):  # ~2: a new writer's first step on stream 2
        table.add([0, ~2], np.zeros((2, 2, 2)), [0, 0], [0.0, 0.0], np.zeros((2, 2, 2)), [False] * 2, [False] * 2)
    with pytest.raises(ValueError, match="expected 1 frames of shape"):
        table.add([0], np.zeros((1, 3, 2)), [0], [0.0], np.zeros((1, 2, 2)), [False], [False])
    assert table.inserted == 0 and table._counts.tolist() == [0, 0]
    with pytest.raises(ValueError, match="records per stream"):
        FrameReplay(9, (2, 2), 4, streams=2, n_step=1)


def test_state_dict_round_trip_samples_the_same():
    rng = np.random.default_rng(1)
    table = FrameReplay(64, FRAME, 3, streams=2, n_step=2, kind="prioritized")
    reference = ReferenceFrameReplay(32, 2, 3, 2, 0.99)
    drive(table, reference, rng, 50, 0.1, 2, np.uint8)
    batch = table.sample(8, rng)
    table.update_priorities(batch.indices, rng.normal(size=8))
    copy = FrameReplay(64, FRAME, 3, streams=2, n_step=2, kind="prioritized")
    copy.load_state_dict(table.state_dict())
    a, b = table.sample(8, np.random.default_rng(5)), copy.sample(8, np.random.default_rng(5))
    for name in ("obs", "next_obs", "actions", "rewards", "discounts", "indices", "weights"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    assert copy.size == table.size and copy.inserted == table.inserted


@pytest.mark.parametrize("kind", ["uniform", "prioritized"])
def test_a_table_that_sampled_before_loading_a_state_samples_from_the_loaded_one(kind):
    """A 1-step sample's compiled call is bound to the table's records (and tree) when the batch
    size is first sampled; a state loaded later brings a new tree, so those calls are made again:
    the loaded table samples what its source does, not from the tree it had."""
    rng = np.random.default_rng(4)
    source, target = (FrameReplay(96, LARGE, 4, streams=2, n_step=1, kind=kind, gather_threads=2) for _ in range(2))
    drive(source, ReferenceFrameReplay(48, 2, 4, 1, 0.99), rng, 70, 0.05, 2, np.uint8)
    drive(target, ReferenceFrameReplay(48, 2, 4, 1, 0.99), np.random.default_rng(8), 30, 0.05, 2, np.uint8)
    if kind == "prioritized":
        batch = source.sample(16, rng)
        source.update_priorities(batch.indices, 10 * rng.normal(size=16))
    target.sample(16, rng)
    target.load_state_dict(source.state_dict(detached=True))
    for seed in range(3):
        a, b = source.sample(16, np.random.default_rng(seed)), target.sample(16, np.random.default_rng(seed))
        for name in ("obs", "next_obs", "actions", "rewards", "discounts", "indices", "weights"):
            assert np.array_equal(getattr(a, name), getattr(b, name)), name


@pytest.mark.parametrize("kind", ["uniform", "prioritized", "amper"])
def test_a_pickled_table_samples_the_same_and_writes_its_own_arrays(kind):
    """A copy (pickle, deepcopy) gets kernel records of its own arrays: the same samples as the
    original, and its inserts leave the original untouched."""
    import copy
    import pickle

    rng = np.random.default_rng(3)
    table = FrameReplay(128, LARGE, 4, streams=2, n_step=1, kind=kind)
    reference = ReferenceFrameReplay(64, 2, 4, 1, 0.99)
    drive(table, reference, rng, 80, 0.05, 2, np.uint8)
    for clone in (pickle.loads(pickle.dumps(table)), copy.deepcopy(table)):
        a, b = table.sample(8, np.random.default_rng(5)), clone.sample(8, np.random.default_rng(5))
        for name in ("obs", "next_obs", "actions", "rewards", "discounts", "indices"):
            assert np.array_equal(getattr(a, name), getattr(b, name)), name
        frames, valid = table._frames.copy(), table._valid.copy()
        drive(clone, ReferenceFrameReplay(64, 2, 4, 1, 0.99), np.random.default_rng(6), 40, 0.05, 2, np.uint8)
        assert not np.array_equal(clone._frames, frames)
        assert np.array_equal(table._frames, frames) and np.array_equal(table._valid, valid)


@pytest.mark.parametrize("kind", ["uniform", "prioritized"])
def test_a_state_holds_the_stored_records_only_and_loads_into_any_table(kind):
    """A checkpoint of a table that is far from full holds each stream's stored records, not its
    capacity (a 1M-frame Atari table 3,000 steps in: 21 MB, not 7 GB); it loads the same into a
    fresh table, into one that held other records, and as a state of every slot (the format of
    checkpoints before) does."""
    from pearl.replay.frames import stored_slots

    def table():
        return FrameReplay(300, FRAME, 3, streams=3, n_step=2, kind=kind)

    rng = np.random.default_rng(2)
    source = table()
    drive(source, ReferenceFrameReplay(100, 3, 3, 2, 0.99), rng, 25, 0.1, 3, np.uint8)
    if kind == "prioritized":
        batch = source.sample(8, rng)
        source.update_priorities(batch.indices, rng.normal(size=8))
    state = source.state_dict()
    filled = np.minimum(source._counts, source.length)
    assert 0 < filled.sum() == len(state["frames"]) == len(state["priorities"]) < source.capacity
    slots = stored_slots(source._counts, source.length)
    assert slots.tolist() == [s * 100 + t for s in range(3) for t in range(filled[s])]
    every_slot = dict(state, **{name: getattr(source, "_" + name).copy() for name in FrameReplay.ROWS},
                      priorities=source.tree.get(np.arange(source.capacity)))
    used = table()
    drive(used, ReferenceFrameReplay(100, 3, 3, 2, 0.99), np.random.default_rng(9), 140, 0.1, 3, np.uint8)
    fresh, old_format = table(), table()
    for target, loaded in ((fresh, state), (used, state), (old_format, every_slot)):
        target.load_state_dict(loaded)
        for name in FrameReplay.ROWS + ("counts", "episode_start", "starting", "state"):
            assert np.array_equal(getattr(target, "_" + name), getattr(source, "_" + name)), name
        assert np.array_equal(target.tree.get(np.arange(300)), source.tree.get(np.arange(300)))
        a, b = source.sample(16, np.random.default_rng(5)), target.sample(16, np.random.default_rng(5))
        for name in ("obs", "next_obs", "actions", "rewards", "discounts", "indices"):
            assert np.array_equal(getattr(a, name), getattr(b, name)), name
    with pytest.raises(ValueError, match="frame replay state: 7 records, but its streams' counts store"):
        table().load_state_dict(dict(state, **{name: state[name][:7] for name in FrameReplay.ROWS}))


@pytest.mark.parametrize("n_step", [1, 3])
def test_an_index_out_of_range_is_refused_by_both_gather_kernels(n_step):
    table = FrameReplay(16, (1,), 4, n_step=n_step, gamma=0.5)
    with pytest.raises(IndexError, match="gather index 16 out of range for capacity 16"):
        table.gather(np.array([0, 16]))
    with pytest.raises(IndexError, match="gather index -1 out of range"):
        table.gather(np.array([-1]))


@pytest.mark.parametrize("capacity", [64, 70_000])
@pytest.mark.parametrize("gather_threads", [1, 2])
def test_the_one_call_prioritized_sample_equals_the_tree_draw_gather_and_weights(gather_threads, capacity):
    """1-step prioritized samples from the compiled tree go through one kernel
    (frame_storage.sample_windows): the same indices, transitions and weights as sample_into +
    gather + importance_weights. 70,000 leaves: a tree of depth 5, whose descent is the pipelined
    one (fast_sumtree._find)."""
    from pearl.kernels.cpu.fast_storage import importance_weights

    table = FrameReplay(capacity, FRAME, 4, n_step=1, kind="prioritized", alpha=0.6, beta=0.5,
                        gather_threads=gather_threads)
    rng = np.random.default_rng(0)
    if capacity == 64:
        drive(table, ReferenceFrameReplay(64, 1, 4, 1, 0.99), rng, 90, 0.05, 1, np.uint8)
    else:
        for _ in range(capacity // 1000 + 1):
            frames = rng.integers(0, 256, (1000, *FRAME), np.uint8)
            table.add(np.zeros(1000, np.int64), frames, rng.integers(0, 4, 1000), rng.normal(size=1000), frames,
                      rng.random(1000) < 0.002, np.zeros(1000, bool))
        assert table.tree.depth == 5
    table.update_priorities(table.valid_indices(), np.random.default_rng(1).exponential(size=table.size))
    batch = table.sample(16, np.random.default_rng(2))
    got = {name: np.copy(getattr(batch, name)) for name in ("obs", "next_obs", "actions", "rewards", "discounts",
                                                            "indices")}
    uniforms = np.random.default_rng(2).random(16)
    indices, priorities = np.empty(16, np.int64), np.empty(16)
    table.tree.sample_into(uniforms, indices, priorities)
    assert np.array_equal(got["indices"], indices)
    expected = table.gather(indices)
    for name in ("obs", "next_obs", "actions", "rewards", "discounts"):
        assert np.array_equal(got[name], getattr(expected, name)), name
    weights = np.empty(16, np.float32)
    importance_weights(priorities, table.tree.total, table.tree.min(), table.size, table.beta, weights, np.empty(16))
    assert np.array_equal(batch.weights, weights)


def uniform_table(n_step: int, gather_threads: int = 1) -> FrameReplay:
    """3 streams, short episodes (a third of the stored records are their FINAL ones: no
    transition), two rings wrapped, one not: a uniform draw's first try misses often."""
    table = FrameReplay(3 * 60, FRAME, 4, streams=3, n_step=n_step, gamma=0.9, gather_threads=gather_threads)
    drive(table, ReferenceFrameReplay(60, 3, 4, n_step, 0.9), np.random.default_rng(6), 60, 0.5, 2, np.uint8)
    return table


@pytest.mark.parametrize("gather_threads", [1, 2])
@pytest.mark.parametrize("n_step", [1, 3])
def test_a_uniform_sample_is_a_stored_record_where_valid_else_the_trees_draw(n_step, gather_threads):
    """frame_storage.draw_uniform against its rule in numpy: uniforms[i] picks one of the stored
    records (stream after stream), kept where it is a valid transition's; elsewhere uniforms[B + i]
    picks one of the valid transitions (the 0/1 tree's find of u x V is the floor(u x V)-th valid
    slot). The batch holds those transitions, as a gather of them does."""
    from pearl.replay.frames import stored_slots

    table = uniform_table(n_step, gather_threads)
    stored = stored_slots(table._counts, table.length)
    valid = table.valid_indices()
    assert 0.2 < 1 - len(valid) / len(stored) < 0.8 and len(stored) < table.capacity
    batch = table.sample(64, np.random.default_rng(11))
    got = {name: np.copy(getattr(batch, name)) for name in ("obs", "next_obs", "actions", "rewards", "discounts",
                                                            "indices")}
    uniforms = np.random.default_rng(11).random(128)
    first = stored[(uniforms[:64] * len(stored)).astype(np.int64)]
    expected = np.where(table._valid[first] == 1, first, valid[(uniforms[64:] * len(valid)).astype(np.int64)])
    assert np.array_equal(got["indices"], expected)
    assert 0 < np.count_nonzero(table._valid[first] == 0) < 64  # both ways taken
    gathered = table.gather(expected)
    for name in ("obs", "next_obs", "actions", "rewards", "discounts"):
        assert np.array_equal(got[name], getattr(gathered, name)), name


def test_uniform_samples_are_uniform_over_the_valid_transitions():
    """Frequencies over 12,800 draws from a table whose first tries miss a third of the time:
    each valid transition equally likely (chi-square), no other slot ever drawn."""
    from scipy.stats import chisquare

    table = uniform_table(1)
    valid = table.valid_indices()
    rng = np.random.default_rng(12)
    drawn = np.concatenate([table.sample(32, rng).indices.copy() for _ in range(400)])
    assert set(drawn.tolist()) <= set(valid.tolist())
    counts = np.array([np.count_nonzero(drawn == slot) for slot in valid])
    assert chisquare(counts).pvalue > 1e-3


def test_a_uniform_draw_of_u_near_1_stays_among_the_stored_records():
    from pearl.kernels.cpu.frame_storage import draw_uniform

    table = uniform_table(1)
    tree, batch = table.tree, 8
    uniforms, indices = np.full(2 * batch, np.nextafter(1.0, 0.0)), np.empty(batch, np.int64)
    assert draw_uniform(tree._sums, tree._prefix, tree.offsets, tree.depth, tree.fanout, uniforms, np.empty(batch),
                        table._valid, table._counts, table.length, indices)
    assert np.all(table._valid[indices] == 1)


@pytest.mark.parametrize("n_step", [1, 3])
def test_two_gather_threads_give_the_one_thread_batch_bit_for_bit(n_step):
    """gather_threads=2 splits a batch over numba's pool at TWO_THREADS_FROM and above (below it
    the one-thread path runs): every batch size, odd and even, on both sides of that threshold."""
    from pearl.kernels.cpu.frame_storage import TWO_THREADS_FROM

    rng = np.random.default_rng(3)
    tables = [FrameReplay(96, FRAME, 4, streams=2, n_step=n_step, gamma=0.9, gather_threads=t) for t in (1, 2)]
    drive(tables[0], ReferenceFrameReplay(48, 2, 4, n_step, 0.9), np.random.default_rng(4), 150, 0.05, 2, np.uint8)
    drive(tables[1], ReferenceFrameReplay(48, 2, 4, n_step, 0.9), np.random.default_rng(4), 150, 0.05, 2, np.uint8)
    valid = tables[0].valid_indices()
    for size in (1, TWO_THREADS_FROM - 1, TWO_THREADS_FROM, TWO_THREADS_FROM + 1, 33, 64):
        indices = rng.choice(valid, size)
        one, two = (table.gather(indices) for table in tables)
        for name in ("obs", "next_obs", "actions", "rewards", "discounts", "indices"):
            assert np.array_equal(getattr(one, name), getattr(two, name)), (size, name)


def test_gather_threads_other_than_1_or_2_are_refused_in_one_line():
    with pytest.raises(ValueError, match="gather_threads: 1 or 2, got 3"):
        FrameReplay(16, FRAME, 2, gather_threads=3)


def test_the_config_refuses_gather_threads_other_than_1_or_2_naming_the_field():
    from pearl.config import ReplayConfig
    from pearl.errors import ConfigError

    from pearl.replay import make_replay

    config = ReplayConfig(capacity=64, frame_stack=4, gather_threads=2)
    config.check("replay")
    assert make_replay(config, (4, *FRAME), obs_dtype=np.uint8).gather_threads == 2
    with pytest.raises(ConfigError, match=r"^replay.gather_threads: expected an integer <= 2, got 3$"):
        ReplayConfig(frame_stack=4, gather_threads=3).check("replay")
    with pytest.raises(ConfigError, match=r"^replay.gather_threads: 2 is for the frame table \(replay.frame_stack"):
        ReplayConfig(gather_threads=2).check("replay")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(streams=st.integers(1, 3), before=st.integers(1, 80), block_rows=st.integers(1, 12),
       plan=st.lists(st.one_of(st.just("read"), st.integers(1, 4)), max_size=40), load=st.booleans(),
       seed=st.integers(0, 2**31))
def test_a_snapshot_reads_the_frames_of_its_moment_while_adds_go_on(streams, before, block_rows, plan, load, seed):
    """A FrameSnapshot (what a checkpoint written while the run goes on reads, pearl/checkpoint.py
    and the replay server's): its blocks, read in any interleaving with adds that wrap the rings
    (and with a load of another state into the table), are the frames the table held when it was
    taken, in the order of the state taken with it; once read whole it stops watching the adds."""
    from pearl.replay import frames

    rng = np.random.default_rng(seed)
    table = FrameReplay(20 * streams, WIDE, 3, streams=streams, n_step=2)

    def add(steps):  # (each call's reference is new: only the table's records matter here)
        drive(table, ReferenceFrameReplay(20, streams, 3, 2, 0.99), rng, steps, 0.1, streams, np.uint8)

    add(before)
    expected = table.state_dict(detached=True)
    saved = frames.SNAPSHOT_BLOCK_BYTES
    frames.SNAPSHOT_BLOCK_BYTES = block_rows * table._frames.shape[1]
    try:
        state, snapshot = table.snapshot()
    finally:
        frames.SNAPSHOT_BLOCK_BYTES = saved
    assert snapshot.block_rows == block_rows and table._snapshots == [snapshot]
    for name, values in state.items():  # the rest of the state: a copy of that moment too
        assert np.array_equal(values, expected[name]), name
    blocks = iter(range(snapshot.blocks))
    read = []
    for step in plan:
        if step == "read":
            block = next(blocks, None)
            if block is not None:
                read.append(snapshot.block(block))
        else:
            add(step)
    if load:  # the table overwritten whole (pearl.load's, load_replay_buffer's) before the rest is read
        table.load_state_dict(FrameReplay(20 * streams, WIDE, 3, streams=streams, n_step=2).state_dict())
        assert table._snapshots == []
    read += [snapshot.block(block) for block in blocks]
    assert np.array_equal(np.concatenate(read), expected["frames"])
    assert table._snapshots == []


def test_a_table_loads_a_state_whose_frames_come_block_by_block():
    """load_state_dict takes a state whose "frames" is a frame source (a FrameSnapshot here, a ray
    run's ShardFrames at its end): the same table as from the state with its frames array."""
    from pearl.replay import frames

    rng = np.random.default_rng(4)
    source = FrameReplay(90, WIDE, 3, streams=3, n_step=2, kind="prioritized")
    drive(source, ReferenceFrameReplay(30, 3, 3, 2, 0.99), rng, 50, 0.1, 3, np.uint8)
    saved = frames.SNAPSHOT_BLOCK_BYTES
    frames.SNAPSHOT_BLOCK_BYTES = 7 * source._frames.shape[1]  # blocks of 7 records: the last one short
    try:
        state, snapshot = source.snapshot()
    finally:
        frames.SNAPSHOT_BLOCK_BYTES = saved
    assert snapshot.blocks > 2 and len(snapshot) % 7
    target = FrameReplay(90, WIDE, 3, streams=3, n_step=2, kind="prioritized")
    target.load_state_dict({**state, "frames": snapshot})
    for name, values in source.state_dict().items():
        assert np.array_equal(target.state_dict()[name], values), name


@pytest.mark.parametrize("gather_threads", [1, 2])
def test_windows_of_every_group_size_are_gathered(gather_threads):
    """Batches of 1-40 one-run windows: whole groups of 8, a last group of 4-7 padded to 8 with its
    last window again, 1-3 copied one by one (kernels/cpu/frame_storage.py _windows_range), on
    frames whose bytes are not a whole number of cache lines; each against the stored frames."""
    table = FrameReplay(200, WIDE, 4, kind="uniform", gather_threads=gather_threads)
    frames = np.random.default_rng(0).integers(0, 256, (150, *WIDE), dtype=np.uint8)
    table.add([0], frames[:1], [0], [0.0], frames[1:2], [False], [False])
    for t in range(1, 149):
        table.add([0], frames[t:t + 1], [t], [0.0], frames[t + 1:t + 2], [False], [False])
    rng = np.random.default_rng(1)
    for batch in range(1, 41):
        slots = rng.integers(3, 148, batch)  # records 3 on: windows of 5 stored frames, one run each
        got = table.gather(slots)
        for i, slot in enumerate(slots):
            assert np.array_equal(got.obs[i], frames[slot - 3:slot + 1]), (batch, i)
            assert np.array_equal(got.next_obs[i], frames[slot - 2:slot + 2]), (batch, i)
