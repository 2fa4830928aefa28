"""Image observations behind the replay server (issue 16 on the wire): tables of any observation
shape in float32 or uint8, rows stored as the run's own table stores them (inline inserts, whose
rows are whole 4-byte words, and multi-frame ones, and rows of odd byte counts), batches sampled
back in their dtype and shape, a run refused one line by a server holding another schema, the
config's and the command line's keys, and checkpoints that do not restore into another schema.
Every server binds 127.0.0.1 on an ephemeral port; every loop is bounded."""
from __future__ import annotations

import numpy as np
import pytest

zmq = pytest.importorskip("zmq")

from pearl.config import ReplayConfig  # noqa: E402
from pearl.errors import ConfigError  # noqa: E402
from pearl.replay import make_replay  # noqa: E402
from pearl.server.client import ReplayClient, connect_table  # noqa: E402
from pearl.server.config import ServerConfig, TableConfig, load_config  # noqa: E402
from pearl.server.server import ReplayServer  # noqa: E402

LOOPBACK = "tcp://127.0.0.1:0"
SCHEMAS = [((4, 10, 10), "uint8"),   # MinAtar's boards: rows of whole words (inline inserts copy them)
           ((3, 5, 5), "uint8"),     # 75-byte rows: the table's add
           ((2, 3), "float32")]


def transitions(rng, rows: int, shape: tuple, dtype: str) -> tuple:
    if dtype == "uint8":
        obs = rng.integers(0, 256, (rows, *shape), dtype=np.uint8)
        next_obs = rng.integers(0, 256, (rows, *shape), dtype=np.uint8)
    else:
        obs = rng.normal(size=(rows, *shape)).astype(np.float32)
        next_obs = rng.normal(size=(rows, *shape)).astype(np.float32)
    return (obs, rng.integers(0, 3, rows), rng.normal(size=rows).astype(np.float32), next_obs,
            np.full(rows, 0.99, np.float32))


@pytest.fixture
def serve():
    servers = []

    def start(table: TableConfig, **kwargs) -> ReplayServer:
        server = ReplayServer(ServerConfig(table=table, bind=LOOPBACK, **kwargs)).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.mark.parametrize("shape, dtype", SCHEMAS)
@pytest.mark.parametrize("kind", ["uniform", "prioritized"])
def test_rows_stored_and_sampled_as_the_local_table_does(serve, shape, dtype, kind):
    server = serve(TableConfig(kind=kind, capacity=300, obs_shape=shape, obs_dtype=dtype))
    client = ReplayClient(server.address, writer=1, timeout=20)
    reference = make_replay(ReplayConfig(kind=kind, capacity=300), shape, obs_dtype=np.dtype(dtype))
    rng = np.random.default_rng(0)
    for rows in (5, 120, 1, 250):  # the last wraps the ring (and for the boards is several frames)
        chunk = transitions(rng, rows, shape, dtype)
        client.add(*chunk)
        reference.add(*chunk)
    client.flush()
    table = server.service.table
    assert (table.cursor, table.size, table.inserted) == (reference.cursor, reference.size, reference.inserted)
    for name in reference.storage:
        np.testing.assert_array_equal(table.storage[name], reference.storage[name])
    assert table.storage["obs"].dtype == np.dtype(dtype)
    batch = client.sample(64)
    for name in ("obs", "next_obs"):
        values = getattr(batch, name)
        assert values.dtype == np.dtype(dtype) and values.shape == (64, *shape)
        np.testing.assert_array_equal(values, reference.storage[name][batch.indices])
    np.testing.assert_array_equal(batch.rewards, reference.storage["rewards"][batch.indices])
    client.update_priorities(batch.indices, np.linspace(0.1, 2.0, 64))
    assert client.sample(16).obs.shape == (16, *shape)
    client.close()


def test_a_run_is_refused_by_a_server_of_another_observation_schema(serve):
    server = serve(TableConfig(capacity=100, obs_dim=400))  # float32 vectors of 400
    fields = {"obs": (np.dtype(np.uint8), (4, 10, 10)), "actions": (np.dtype(np.int64), ())}
    with pytest.raises(ConfigError) as refused:
        connect_table(server.address, "uniform", fields, field="plan.devices.sample")
    message = str(refused.value)
    assert "\n" not in message and message.startswith("plan.devices.sample:")
    assert "obs float32[400]" in message and "obs uint8[4, 10, 10]" in message
    match = serve(TableConfig(capacity=100, obs_shape=(4, 10, 10), obs_dtype="uint8"))
    connect_table(match.address, "uniform", fields).close()


def test_config_keys_of_the_observation(tmp_path):
    path = tmp_path / "server.yaml"
    path.write_text("table: {capacity: 1000, obs_shape: [4, 84, 84], obs_dtype: uint8}\n")
    table = load_config(path).table
    assert table.observation_shape == (4, 84, 84) and table.obs_dtype == "uint8"
    assert TableConfig(obs_dim=17).observation_shape == (17,)
    for text, field in (("{obs_dim: 4, obs_shape: [4]}", "table"), ("{obs_dtype: float64}", "table.obs_dtype"),
                        ("{obs_shape: [4, 0]}", "table.obs_shape"), ("{obs_shape: 84}", "table.obs_shape"),
                        ("{obs_shape: [2.5]}", "table.obs_shape")):
        path.write_text(f"table: {text}\n")
        with pytest.raises(ConfigError, match="^" + field.replace(".", r"\.") + ":"):
            load_config(path)


def test_cli_observation_flags_are_checked(capsys):
    from pearl.server.cli import main

    assert main(["--plaintext", "--bind", LOOPBACK, "--obs-shape", "4,x"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("pearl: error: --obs-shape") and "\n" not in err
    assert main(["--plaintext", "--bind", LOOPBACK, "--obs-shape", "4,10,10", "--obs-dtype", "int8"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("pearl: error: table.obs_dtype") and "\n" not in err
    assert main(["--plaintext", "--bind", LOOPBACK, "--obs-shape", "84,84", "--frame-stack", "4", "--streams", "8",
                 "--capacity", "32"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("pearl: error: table.capacity: 32 leaves 4 records for each of 8 streams") and "\n" not in err


def test_a_table_larger_than_free_memory_is_refused_before_it_binds(capsys, monkeypatch):
    """1M whole 84x84 float32 observations (--frame-stack 0, the default capacity) need ~53 GiB:
    one line, exit 2, instead of numpy's MemoryError or a table killed as it fills; the same
    observations as a frame table of uint8 frames fit."""
    import pearl.kernels.cpu.backend as cpu
    from pearl.server.cli import main
    from pearl.server.service import make_table

    monkeypatch.setattr(cpu, "memory_available", lambda: 8 * 2**30)
    assert main(["--plaintext", "--bind", LOOPBACK, "--obs-shape", "84,84", "--frame-stack", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("pearl: error: table.capacity: 1,000,000 transitions of 84x84 float32 observations "
                          "need about 52.6 GiB; this machine has 8.0 GiB available") and "\n" not in err
    frames = ServerConfig(table=TableConfig(capacity=1_000_000, obs_shape=(84, 84), obs_dtype="uint8",
                                            frame_stack=4, streams=8))
    frames.table.check()
    table = make_table(frames)  # ~6.6 GiB, mapped lazily: nothing is touched here
    assert table.capacity == 1_000_000
    monkeypatch.setattr(cpu, "memory_available", lambda: 6 * 2**30)
    with pytest.raises(ConfigError, match=r"^table\.capacity: 1,000,000 records of one 84x84 uint8 frame need "
                                          r"about 6\.6 GiB; this machine has 6\.0 GiB available$"):
        make_table(frames)


def test_a_checkpoint_restores_its_schema_only(serve, tmp_path):
    from pearl.server.checkpoint import restore
    from pearl.server.service import ReplayService

    images = TableConfig(capacity=200, obs_shape=(4, 10, 10), obs_dtype="uint8")
    server = serve(images, checkpoint_dir=str(tmp_path))
    client = ReplayClient(server.address, writer=1, timeout=20)
    chunk = transitions(np.random.default_rng(1), 150, (4, 10, 10), "uint8")
    client.add(*chunk)
    client.flush()
    client.checkpoint()
    client.close()
    again = ReplayService(ServerConfig(table=images))
    restore(again, tmp_path)
    np.testing.assert_array_equal(again.table.storage["obs"][:150], chunk[0])
    for other in (TableConfig(capacity=200, obs_dim=400),
                  TableConfig(capacity=200, obs_shape=(4, 10, 10), obs_dtype="float32")):
        with pytest.raises(ValueError, match="obs_"):
            restore(ReplayService(ServerConfig(table=other)), tmp_path)


def step_records(rng, steps: int, streams: int) -> list[tuple]:
    """`steps` rounds of step records of `streams` env streams of 6x6 frames (a stream's first
    round takes it over: ~s), episodes ending at random."""
    rounds = []
    for k in range(steps):
        ids = np.arange(streams) if k else ~np.arange(streams)
        frames = rng.integers(0, 256, (streams, 6, 6), dtype=np.uint8)
        ended = rng.random(streams) < 0.15
        rounds.append((ids, rng.integers(0, 256, (streams, 6, 6), dtype=np.uint8), rng.integers(0, 2, streams),
                       rng.normal(size=streams).astype(np.float32), frames, ended & (rng.random(streams) < 0.5),
                       ended))
    return rounds


@pytest.mark.parametrize("kind", ["uniform", "prioritized"])
def test_an_embedded_server_writes_a_runs_frame_table_as_the_run_would(serve, kind):
    """The ray runtime's `learner` placement around a frame table: its inserts are the actors' step
    records (chunks of several rounds), stored as the table's own add stores them; the batches are
    stacks. A server of its own refuses a frame table in one line."""
    from pearl.replay import FrameReplay
    from pearl.server.service import make_table

    def table():
        return FrameReplay(240, (6, 6), 4, streams=3, n_step=2, kind=kind)

    served, reference = table(), table()
    config = TableConfig(kind=kind, capacity=240, obs_shape=(6, 6), obs_dtype="uint8", frame_stack=4)
    server = ReplayServer(ServerConfig(table=config, bind=LOOPBACK), table=served).start()
    try:
        client = ReplayClient(server.address, writer=1, timeout=20)
        rounds = step_records(np.random.default_rng(2), 150, 3)
        for first in range(0, len(rounds), 10):  # an agent's chunk: its rounds' rows one after another
            chunk = [np.concatenate(column) for column in zip(*rounds[first:first + 10])]
            client.add(*chunk)
            reference.add(*chunk)
        client.flush()
        assert served.progress == 450  # the env steps its writer committed (a row each, here)
        reference.progress = served.progress
        expected, stored = reference.state_dict(), served.state_dict()
        for name, values in expected.items():
            np.testing.assert_array_equal(stored[name], values, err_msg=name)
        batch = client.sample(32)
        assert batch.obs.shape == (32, 4, 6, 6) and batch.obs.dtype == np.uint8
        np.testing.assert_array_equal(batch.obs, reference.gather(batch.indices).obs)
        np.testing.assert_array_equal(batch.next_obs, reference.gather(batch.indices).next_obs)
        client.close()
    finally:
        server.stop()
    assert isinstance(make_table(ServerConfig(table=config)), FrameReplay)  # (a server of its own: below)


FRAMES = dict(obs_shape=(6, 6), obs_dtype="uint8", frame_stack=4, n_step=2, gamma=0.9)


def frame_table(kind: str, capacity: int, streams: int):
    from pearl.replay import FrameReplay

    return FrameReplay(capacity, (6, 6), 4, streams=streams, n_step=2, gamma=0.9, kind=kind)


def add_rounds(writers, rounds, rows_per_chunk: int = 10) -> None:
    """The rounds in chunks of `rows_per_chunk` rounds (a node agent's chunk), to every writer."""
    for first in range(0, len(rounds), rows_per_chunk):
        chunk = [np.concatenate(column) for column in zip(*rounds[first:first + rows_per_chunk])]
        for writer in writers:
            writer.add(*chunk)


@pytest.mark.parametrize("kind", ["uniform", "prioritized"])
def test_a_replay_server_of_its_own_holds_a_frame_table(serve, kind):
    """`pearl replay-server` with table.frame_stack: the table of table.streams env streams, each
    frame stored once, the n-step returns made with table.gamma; writers send step records (the
    HELLO names the 7 columns), batches come back as stacks equal to the local table's gather,
    priority updates reach slots beyond the count of valid transitions."""
    server = serve(TableConfig(kind=kind, capacity=240, streams=3, **FRAMES))
    client = ReplayClient(server.address, writer=1, timeout=20)
    assert client.info["frame_stack"] == 4 and client.info["streams"] == 3 and len(client.info["insert"]) == 7
    reference = frame_table(kind, 240, 3)
    add_rounds([client, reference], step_records(np.random.default_rng(3), 150, 3))
    client.flush()
    served = server.service.table
    reference.progress = served.progress = 0
    for name, values in reference.state_dict().items():
        np.testing.assert_array_equal(served.state_dict()[name], values, err_msg=name)
    for _ in range(5):
        batch = client.sample(32)
        expected = reference.gather(batch.indices)
        assert batch.obs.shape == (32, 4, 6, 6) and batch.obs.dtype == np.uint8
        for name in ("obs", "next_obs", "rewards", "discounts"):
            np.testing.assert_array_equal(getattr(batch, name), getattr(expected, name), err_msg=name)
        assert set(np.unique(batch.discounts)) <= set(np.float32([0.0, 0.9, 0.9 ** 2]))  # gamma, 2 steps
        td = np.linspace(0.1, 3.0, 32)
        client.update_priorities(batch.indices, td)
        reference.update_priorities(batch.indices, td)
    # slots are not 0 .. size - 1 in a frame table: valid transitions lie anywhere in each ring
    high = reference.valid_indices()[reference.valid_indices() >= served.size][:16]
    assert high.size
    client.update_priorities(high, np.full(high.size, 5.0))
    reference.update_priorities(high, np.full(high.size, 5.0))
    client.sample(8)  # (the last update rides on this request)
    assert server.service.counts["rejected"] == 0
    np.testing.assert_allclose(served.tree.get(np.arange(240)), reference.tree.get(np.arange(240)))
    client.close()


def test_a_frame_tables_config_is_checked_in_one_line():
    for table, field in ((dict(capacity=20, streams=4), "table.capacity"), (dict(streams=0), "table.streams"),
                         (dict(gamma=1.5), "table.gamma"), (dict(n_step=0), "table.n_step"),
                         (dict(frame_stack=300), "table.frame_stack"),
                         (dict(frame_stack=0, streams=4), "table.streams"), (dict(frame_stack=0, n_step=3), "table.n_step")):
        with pytest.raises(ConfigError, match="^" + field.replace(".", r"\.") + ":") as refused:
            load_config({"table": {**FRAMES, "obs_shape": [6, 6], **table}})
        assert "\n" not in str(refused.value)


@pytest.mark.parametrize("kind", ["uniform", "prioritized"])
def test_a_frame_table_server_restarts_from_its_checkpoint(serve, tmp_path, kind, monkeypatch):
    """A frame table's checkpoint taken while a writer goes on (all but the frames copied between
    two requests, the frames block by block, a block copied first where an insert would overwrite
    its frames: here every insert of the run's rest lands before the writing thread starts, and
    the rings wrap): a server restarted from it holds exactly the table its acknowledged chunks
    made (records, episode bookkeeping, priorities), its writer's sequence number and env steps;
    one of another frame layout is refused."""
    import threading

    from pearl.replay import frames
    from pearl.server import checkpoint
    from pearl.server.checkpoint import restore
    from pearl.server.service import ReplayService

    frame_bytes = int(np.prod(FRAMES["obs_shape"]))
    monkeypatch.setattr(frames, "SNAPSHOT_BLOCK_BYTES", 16 * frame_bytes)  # several blocks of 16 records
    gate, write = threading.Event(), checkpoint.Snapshot._run
    monkeypatch.setattr(checkpoint.Snapshot, "_run", lambda snapshot: (gate.wait(30), write(snapshot)))

    config = TableConfig(kind=kind, capacity=240, streams=3, **FRAMES)
    server = serve(config, checkpoint_dir=str(tmp_path))
    writer, learner = ReplayClient(server.address, writer=1, timeout=20), ReplayClient(server.address, timeout=20)
    rounds = step_records(np.random.default_rng(5), 300, 3)
    chunks = [[np.concatenate(column) for column in zip(*rounds[k:k + 5])] for k in range(0, 300, 5)]
    for chunk in chunks[:20]:
        writer.add(*chunk)
    writer.flush()
    batch = learner.sample(32)
    td = np.linspace(0.5, 4.0, 32, dtype=np.float32)  # (as the wire carries |td|)
    learner.update_priorities(batch.indices, td)
    learner.sample(8)  # (the update rides on it)
    info = {}
    asked = threading.Thread(target=lambda: info.update(learner.checkpoint()))
    asked.start()
    for chunk in chunks[20:]:  # inserts while the checkpoint is taken and written
        writer.add(*chunk)
    writer.flush()
    gate.set()
    asked.join(30)
    writer.close()
    learner.close()
    acked = info["acked"]["1"]
    assert 20 <= acked <= len(chunks)
    if acked < len(chunks):  # inserts after it overwrote records it holds (the rings are full)
        assert info["cow_blocks"] >= 1
    again = ReplayService(ServerConfig(table=config))
    manifest = restore(again, tmp_path)
    assert manifest["frame_table"] and again.acked == {1: acked} and again.env_steps == 15 * acked
    reference = frame_table(kind, 240, 3)
    for chunk in chunks[:20]:
        reference.add(*chunk)
    reference.update_priorities(batch.indices, td)
    for chunk in chunks[20:acked]:
        reference.add(*chunk)
    reference.progress = again.table.progress
    restored = again.table.state_dict()
    for name, values in reference.state_dict().items():
        np.testing.assert_array_equal(restored[name], values, err_msg=name)
    for other in (dict(streams=4), dict(n_step=1), dict(frame_stack=3)):
        with pytest.raises(ValueError, match="checkpoint table." + next(iter(other))):
            table = TableConfig(kind=kind, capacity=240, **{**FRAMES, "streams": 3, **other})
            restore(ReplayService(ServerConfig(table=table)), tmp_path)


@pytest.mark.parametrize("kind,steps", [("uniform", 130), ("prioritized", 130), ("prioritized", 30)])
def test_sharded_frame_tables_hold_whole_streams_and_merge_into_the_runs_table(serve, kind, steps):
    """A frame table over 2 shards (the ray runtime's `server` placement): each step record goes to
    its stream's shard (stream s to shard s mod 2 as its stream s // 2, a first step ~s as
    ~(s // 2)), so each shard's table is the run's table's streams; the shards' states merge into
    the state one table fed the same records has, and split back into the same shards' states;
    a batch's global indices name the run's slots whose stacks it holds. 30 steps: no ring is full
    (the states hold each stream's stored records only)."""
    from pearl.replay.frames import FrameReplay
    from pearl.runtime.ray_replay import FrameShards
    from pearl.server.shards import SHIFT, SLOT, ShardedReplayClient

    streams, length = 5, 48
    layout = FrameShards(streams, length, 2)
    assert [list(h) for h in layout.held] == [[0, 2, 4], [1, 3]] and layout.capacities == [144, 96]
    servers = [serve(TableConfig(kind=kind, capacity=c, streams=len(h), **FRAMES))
               for c, h in zip(layout.capacities, layout.held)]
    client = ShardedReplayClient([s.address for s in servers], writer=1, timeout=20)
    reference = frame_table(kind, streams * length, streams)
    rounds = step_records(np.random.default_rng(4), steps, streams)
    add_rounds([client, reference], rounds, rows_per_chunk=7)
    client.flush()
    assert [s.service.env_steps for s in servers] == [steps * 3, steps * 2]  # a row's env step, on its shard
    states = [s.service.table.state_dict() for s in servers]
    merged, expected = layout.merge(states, steps * streams, {}), reference.state_dict()
    stored = int(np.minimum(expected["counts"], length).sum())
    assert len(expected["frames"]) == stored and (stored < streams * length) == (steps < length)
    for name in expected:
        if name != "progress":
            np.testing.assert_array_equal(merged[name], expected[name], err_msg=name)
    every_slot = dict(expected, **{name: getattr(reference, "_" + name).copy() for name in FrameReplay.ROWS},
                      priorities=reference.tree.get(np.arange(streams * length)))  # (older checkpoints)
    for run_state in (expected, every_slot):
        for (part, _), state in zip(layout.split(run_state, steps * streams), states):
            for name in FrameShards.ROWS + FrameShards.STREAMS + ("state",):
                np.testing.assert_array_equal(part[name], state[name], err_msg=name)
    client.refresh()
    batch = client.sample(40, np.random.default_rng(0))
    shard, slot = batch.indices >> SHIFT, batch.indices & SLOT
    stream = np.array([layout.held[k][j] for k, j in zip(shard, slot // length)])
    expected = reference.gather(stream * length + slot % length)
    for name in ("obs", "next_obs", "rewards", "discounts", "actions"):
        np.testing.assert_array_equal(getattr(batch, name), getattr(expected, name), err_msg=name)
    client.close()


@pytest.mark.parametrize("frames", [False, True])
def test_pipelined_large_batches_each_hold_their_own_rows(serve, frames):
    """Batches over one inline frame (Atari-sized rows) leave the server as copies of the table's
    sample buffers, which the next draw reuses: eight batches asked at once each come back with the
    rows of their own indices (whole observations, and a frame table's stacks staged contiguous)."""
    from pearl.server.shards import SLOT, ShardedReplayClient

    rng = np.random.default_rng(6)
    if frames:
        server = serve(TableConfig(capacity=600, obs_shape=(84, 84), obs_dtype="uint8", frame_stack=4))
        reference = make_replay(ReplayConfig(capacity=600, frame_stack=4), (4, 84, 84), obs_dtype=np.dtype(np.uint8))
        ids = np.zeros(300, np.int64)
        ids[0] = ~0
        f = rng.integers(0, 256, (300, 84, 84), dtype=np.uint8)
        rows = (ids, f, rng.integers(0, 4, 300), np.ones(300, np.float32), f, np.zeros(300, bool), np.zeros(300, bool))
    else:
        server = serve(TableConfig(capacity=600, obs_shape=(4, 84, 84), obs_dtype="uint8"))
        reference = make_replay(ReplayConfig(capacity=600), (4, 84, 84), obs_dtype=np.dtype(np.uint8))
        rows = transitions(rng, 300, (4, 84, 84), "uint8")
    writer = ReplayClient(server.address, writer=1, timeout=20)
    writer.add(*rows)
    reference.add(*rows)
    writer.flush()
    learner = ShardedReplayClient([server.address], timeout=20)
    learner.refresh()
    for _ in range(8):
        learner.ask(128, rng)
    for _ in range(8):
        batch = learner.take()
        expected = reference.gather(batch.indices & SLOT) if frames else None
        for name in ("obs", "next_obs"):
            want = getattr(expected, name) if frames else reference.storage[name][batch.indices & SLOT]
            np.testing.assert_array_equal(getattr(batch, name), want, err_msg=name)
    learner.close()
    writer.close()


def test_a_run_on_a_server_without_checkpoints_warns_once_and_goes_on(serve, tmp_path):
    """A run's checkpoint asks its replay server for one: a server without checkpoint_dir says so
    in HELLO, and the client's state_dict records no replay checkpoint (one warning), instead of
    failing the run's checkpoint; a server with one writes it."""
    bare = ReplayClient(serve(TableConfig(capacity=100)).address, timeout=20)
    assert bare.info["checkpoints"] is False
    with pytest.warns(UserWarning, match="has no checkpoint_dir: the run's checkpoints hold no replay"):
        assert bare.state_dict() == {"replay_server": bare.address, "checkpoint": None}
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        bare.state_dict()  # (told once)
    kept = ReplayClient(serve(TableConfig(capacity=100), checkpoint_dir=str(tmp_path)).address, timeout=20)
    assert kept.info["checkpoints"] is True and kept.state_dict()["checkpoint"]["name"] == "ckpt-000001"
    bare.close()
    kept.close()
