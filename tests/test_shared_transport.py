"""The processes runtime's shared-memory transport (pearl/runtime/shared.py) against plain Python
models: a ring delivers every transition and episode once and in order across wrap-arounds; a
weight board never hands out a half-written vector."""
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pearl.replay import PrioritizedReplay, UniformReplay
from pearl.runtime.processes import takes_channel_rows
from pearl.runtime.shared import ActorChannel, WeightBoard

FIELDS = {"obs": (np.dtype(np.float32), (3,)), "actions": (np.dtype(np.int64), ()),
          "rewards": (np.dtype(np.float32), ()), "next_obs": (np.dtype(np.float32), (3,)),
          "discounts": (np.dtype(np.float32), ())}


def transitions(first: int, count: int):
    ids = np.arange(first, first + count)
    return (np.repeat(ids[:, None], 3, axis=1).astype(np.float32), ids.astype(np.int64),
            ids.astype(np.float32), -np.repeat(ids[:, None], 3, axis=1).astype(np.float32),
            (ids % 7).astype(np.float32))


def take_copies(channel):
    """take + release, keeping copies: the ring's views must not outlive the mapping."""
    steps, runs, episodes = channel.take()
    assert all(run[0].base is not None for run in runs)  # views of the ring, not copies
    copies = [tuple(np.array(values) for values in run) for run in runs]
    channel.release()
    return steps, copies, episodes


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 9), st.integers(0, 3), st.booleans()), min_size=1, max_size=80),
       st.integers(4, 24), st.integers(3, 8))
def test_ring_delivers_everything_once_in_order(rounds, capacity, episode_capacity):
    channel = ActorChannel.create(FIELDS, capacity, episode_capacity)
    try:
        sent, received, episodes_sent, episodes_received, steps = 0, [], [], [], 0
        for count, n_episodes, take in rounds:
            count = min(count, channel.free())
            n_episodes = min(n_episodes, channel.episode_free())
            finished = [(float(len(episodes_sent) + k), k + 1) for k in range(n_episodes)]
            channel.put(transitions(sent, count) if count else None, finished, 2)
            sent += count
            steps += 2
            episodes_sent += finished
            if take:
                taken_steps, runs, episodes = take_copies(channel)
                assert taken_steps == steps
                received += runs
                episodes_received += episodes
        _, runs, episodes = take_copies(channel)
        received += runs
        episodes_received += episodes
        if sent:
            got = [np.concatenate([r[i] for r in received]) for i in range(5)]
            for want, have in zip(transitions(0, sent), got):
                np.testing.assert_array_equal(have, want)
        else:
            assert not received
        assert episodes_received == episodes_sent
    finally:
        channel.close()


TABLES = {
    "uniform": lambda capacity: UniformReplay(capacity, 3),
    "prioritized numba": lambda capacity: PrioritizedReplay(capacity, 3, backend="numba"),
    "prioritized numpy": lambda capacity: PrioritizedReplay(capacity, 3, backend="numpy"),
}


@pytest.mark.parametrize("table", sorted(TABLES))
@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 9), st.booleans()), min_size=1, max_size=40),
       st.integers(4, 24), st.integers(3, 13))
def test_rows_taken_by_span_land_as_views_added_do(table, rounds, capacity, replay_capacity):
    """The learner's copy straight out of the shared block (take_spans + column_offsets +
    add_frame) leaves a table as take + add do: rows, order and priorities, across the wrap-around
    of both rings."""
    by_views, by_spans = TABLES[table](replay_capacity), TABLES[table](replay_capacity)
    assert takes_channel_rows(by_spans, FIELDS)
    channels = [ActorChannel.create(FIELDS, capacity) for _ in range(2)]
    try:
        sent = 0
        for count, take in rounds:
            count = min(count, channels[0].free())
            for channel in channels:
                channel.put(transitions(sent, count) if count else None, [], 1)
            sent += count
            if take:
                steps, runs, _ = channels[0].take()
                for run in runs:
                    by_views.add(*run)
                channels[0].release()
                spans_steps, spans, _ = channels[1].take_spans()
                for first, rows in spans:
                    by_spans.add_frame(channels[1].raw, channels[1].column_offsets(first), rows)
                channels[1].release()
                assert spans_steps == steps
                assert [rows for _, rows in spans] == [len(run[2]) for run in runs]
                runs = run = None  # the ring's views must not outlive the mapping
                if by_views.prioritized and by_views.size:  # new rows then get a larger max priority
                    for replay in (by_views, by_spans):
                        replay.update_priorities(np.arange(replay.size), np.arange(replay.size) + float(sent))
        want, have = by_views.state_dict(detached=True), by_spans.state_dict(detached=True)
        assert want.keys() == have.keys()
        for key in want:
            if isinstance(want[key], dict):
                for name in want[key]:
                    np.testing.assert_array_equal(have[key][name], want[key][name])
            else:
                np.testing.assert_array_equal(np.asarray(have[key]), np.asarray(want[key]))
    finally:
        for channel in channels:
            channel.close()


def test_only_a_table_of_the_channels_word_fields_takes_its_rows():
    assert takes_channel_rows(UniformReplay(8, 3), FIELDS)
    assert not takes_channel_rows(UniformReplay(8, 3, action_dtype=np.int32), FIELDS)  # another dtype
    assert not takes_channel_rows(UniformReplay(8, 4), FIELDS)  # another shape
    reordered = {name: FIELDS[name] for name in ("actions", "obs", "rewards", "next_obs", "discounts")}
    assert not takes_channel_rows(UniformReplay(8, 3), reordered)
    bytes_obs = {**FIELDS, "obs": (np.dtype(np.uint8), (3,)), "next_obs": (np.dtype(np.uint8), (3,))}
    assert not takes_channel_rows(UniformReplay(8, 3, obs_dtype=np.uint8), bytes_obs)  # not whole words


def test_an_attached_channel_sees_the_creators_writes():
    channel = ActorChannel.create(FIELDS, 8)
    try:
        other = ActorChannel.attach(*channel.spec())
        other.put(transitions(0, 3), [(1.5, 4)], 1)
        steps, runs, episodes = channel.take()
        assert steps == 1 and episodes == [(1.5, 4)]
        np.testing.assert_array_equal(runs[0][1], [0, 1, 2])
        del runs
        other.report_error("Traceback ...\nValueError: boom")
        assert channel.error().endswith("ValueError: boom")
        other.close()
    finally:
        channel.close()


WRITER = """
import sys, numpy as np
from pearl.runtime.shared import WeightBoard
board = WeightBoard.attach(sys.argv[1], int(sys.argv[2]))
for value in range(1, 10**8):  # until the reader has seen enough and stops it
    board.publish(np.full(board.n_weights, value, np.float32))
"""


def test_weight_board_never_hands_out_a_torn_vector():
    import subprocess
    import sys

    board = WeightBoard.create(20_000)
    writer = subprocess.Popen([sys.executable, "-c", WRITER, *map(str, board.spec())])
    try:
        # reads go on until both outcomes were seen often (a loaded machine gives the reader fewer
        # turns while the writer publishes), at most 60 s
        out, seen, fresh_reads, torn_chances = np.empty(20_000, np.float32), -1, 0, 0
        deadline = time.monotonic() + 60
        while (fresh_reads <= 100 or torn_chances <= 100) and time.monotonic() < deadline:
            assert writer.poll() is None, "the writer stopped"
            version = board.read(out, seen)
            if version != seen:
                assert version % 2 == 0
                assert out.min() == out.max()  # one publish, whole
                fresh_reads += 1
                seen = version
            else:
                torn_chances += 1  # the writer was mid-copy, or published during our copy
        assert fresh_reads > 100 and torn_chances > 100
    finally:
        writer.kill()
        writer.wait()
        board.close()


def test_a_round_cut_short_is_not_counted():
    """What kill -9 mid-round leaves: data written, no commit. The replacement actor attached to the
    same ring continues from the last committed round and overwrites the partial data."""
    channel = ActorChannel.create(FIELDS, 16)
    try:
        dying = ActorChannel.attach(*channel.spec())
        dying.put(transitions(0, 3), [(1.0, 3)], 1)
        dying.fields["actions"][3:5] = 99  # the next round's data, never committed
        dying.episodes[1] = (99.0, 99)
        dying.close()
        replacement = ActorChannel.attach(*channel.spec())
        assert replacement.steps == 1 and replacement.free() == 16 - 3
        replacement.put(transitions(3, 2), [], 1)
        steps, runs, episodes = take_copies(channel)
        assert steps == 2 and episodes == [(1.0, 3)]
        np.testing.assert_array_equal(np.concatenate([run[1] for run in runs]), [0, 1, 2, 3, 4])
        replacement.close()
    finally:
        channel.close()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 5), st.integers(0, 3), st.booleans()), min_size=1, max_size=60),
       st.integers(5, 20), st.integers(3, 8))
def test_has_room_agrees_with_the_learners_counts(rounds, capacity, episode_capacity):
    """`has_room` reads the learner's counts only when the ones it saw say no room: it answers as
    free() / episode_free() (which read them every time) would."""
    channel = ActorChannel.create(FIELDS, capacity, episode_capacity)
    try:
        sent = 0
        for count, n_episodes, take in rounds:
            fits = channel.free() >= count and channel.episode_free() >= n_episodes
            assert channel.has_room(count, n_episodes) == fits
            if fits:
                channel.put(transitions(sent, count), [(0.0, 1)] * n_episodes, 1)
                sent += count
            if take:
                take_copies(channel)
    finally:
        channel.close()


def test_read_latest_copies_whole_versions_and_gives_up_on_a_dead_writer():
    """`read_latest` copies into the policy's own weights: a complete version, or (the learner
    killed mid-write: the version stays odd) None once `alive()` says the writer is gone."""
    board = WeightBoard.create(8)
    try:
        out = np.zeros(8, np.float32)
        board.publish(np.arange(8, dtype=np.float32))
        assert board.read_latest(out, -1, lambda: True) == board.version
        np.testing.assert_array_equal(out, np.arange(8))
        assert board.read_latest(out, board.version, lambda: True) == board.version  # nothing new
        board._version[0] += 1  # a publish that never finished
        asked = []
        assert board.read_latest(out, 2, lambda: asked.append(1) or False) is None
        assert len(asked) == 1
    finally:
        board.close()


@settings(max_examples=80, deadline=None)
@given(st.integers(0, 31), st.integers(0, 200), st.integers(0, 7))
def test_the_streamed_publish_is_a_copy_at_any_alignment(offset, length, source_offset):
    """kernels/cpu/stream_store.py: whole 64-byte lines by non-temporal stores, the rest by
    ordinary ones: the same as numpy's copy wherever the vector starts and however long it is,
    nothing written outside it, the version two further on."""
    from pearl.kernels.cpu.stream_store import publish_streamed

    rng = np.random.default_rng(length)
    memory = np.full(offset + length + 40, -1.0, np.float32)
    source = rng.standard_normal(source_offset + length).astype(np.float32)[source_offset:]
    version = np.array([6], np.int64)
    publish_streamed(version, memory[offset:offset + length], source)
    assert np.array_equal(memory[offset:offset + length], source)
    assert (memory[:offset] == -1).all() and (memory[offset + length:] == -1).all()
    assert version[0] == 8


def test_version_board_hands_out_exactly_the_version_asked_for():
    from pearl.runtime.shared import VersionBoard

    board = VersionBoard.create(n_weights=37, slots=3, rounds=8, actors=2)
    try:
        out = np.zeros(37, dtype=np.float32)
        assert not board.try_read(out, 5, 1)  # not published yet
        for version in (4, 5, 6):
            board.publish(version % 3, version, np.full(37, version, dtype=np.float32))
        assert board.try_read(out, 5, 2) and (out == 5).all()
        assert not board.try_read(out, 7, 1)  # slot 1 holds 4: an older version
        board.publish(1, 7, np.full(37, 7, dtype=np.float32))
        with pytest.raises(RuntimeError, match="version 4 was overwritten in slot 1"):
            board.try_read(out, 4, 1)
        board.set_rounds(6, [0.5, 0.25, 0.125], [4, 6, 7], [1, 0, 1])  # rows 6, 7, then 0 (8 rows)
        assert board.round(6) == (0.5, 4, 1) and board.round(7) == (0.25, 6, 0) and board.round(8) == (0.125, 7, 1)
        assert board.round(0) == (0.125, 7, 1)
        view = board.view()
        assert view.try_read(out, 7, 1) and (out == 7).all() and not view.owner
        del view  # its arrays export the mapping: close() could not unmap it while they live
    finally:
        board.close()
