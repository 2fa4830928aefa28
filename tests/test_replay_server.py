"""The replay server (pearl/server): wire format, validation of every frame while serving,
insert / sample / update / piggybacked update / stats, exactly-once writers, the replay ratio and
its credits. Every server binds 127.0.0.1 on an ephemeral port; every loop is bounded."""
from __future__ import annotations

import pickle
import struct
import threading
import time

import numpy as np
import pytest

zmq = pytest.importorskip("zmq")

from pearl.replay import PrioritizedReplay  # noqa: E402
from pearl.schedule import updates_due  # noqa: E402
from pearl.server.client import NoReply, ReplayClient, ServerError  # noqa: E402
from pearl.server.config import RatioConfig, ServerConfig, TableConfig, load_config  # noqa: E402
from pearl.server.server import ReplayServer  # noqa: E402
from pearl.server.wire import (COLUMN, FLAG_INLINE, FLAG_NO_ACK, HEADER, INLINE_BYTES, MAGIC, VERSION,  # noqa: E402
                               ErrorCode, Header, Op, message_arrays, pack, unpack_header)

LOOPBACK = "tcp://127.0.0.1:0"


def chunk(start: int, rows: int, obs_dim: int = 4):
    """Rows whose obs[:, 0] is a unique id start..start+rows-1."""
    ids = np.arange(start, start + rows, dtype=np.float32)
    obs = np.repeat(ids[:, None], obs_dim, axis=1).astype(np.float32)
    return obs, (ids % 2).astype(np.int64), ids, obs + 0.5, np.full(rows, 0.99, np.float32)


@pytest.fixture
def server():
    servers = []

    def start(kind="uniform", capacity=1000, **kwargs):
        config = ServerConfig(table=TableConfig(kind=kind, capacity=capacity), **{"bind": LOOPBACK, **kwargs})
        srv = ReplayServer(config).start()
        servers.append(srv)
        return srv

    yield start
    for srv in servers:
        srv.stop()


def stored_ids(srv) -> np.ndarray:
    table = srv.service.table
    return np.sort(table.storage["obs"][:table.size, 0])


class Raw:
    """A bare DEALER socket that sends any frames and reads one reply."""

    def __init__(self, address):
        self.socket = zmq.Context.instance().socket(zmq.DEALER)
        self.socket.linger = 0
        self.socket.connect(address)

    def ask(self, frames, timeout=10.0):
        self.socket.send_multipart(frames)
        assert self.socket.poll(int(timeout * 1000)), "no reply"
        reply = self.socket.recv_multipart()
        return unpack_header(reply[0])[0], reply

    def close(self):
        self.socket.close(linger=0)


def header_bytes(op=Op.STATS, version=VERSION, magic=MAGIC, ncols=0, table=0, writer=0, seq=0, rows=0, arg0=0):
    return HEADER.pack(magic, version, op, 0, ncols, table, writer, rows, 0, seq, arg0, 0)


@pytest.mark.parametrize("inline", [False, True])
def test_wire_round_trip(inline):
    obs, actions, rewards, next_obs, discounts = chunk(0, 7)
    frames = pack(Header(Op.INSERT, writer=3, seq=9, rows=7, arg0=7), [obs, actions, rewards, next_obs, discounts],
                  inline=inline)
    assert len(frames) == (1 if inline else 6)
    header, columns = unpack_header(frames[0])
    arrays = message_arrays(frames, header, columns)
    assert np.array_equal(arrays[0], obs) and np.array_equal(arrays[1], actions)
    assert np.array_equal(arrays[4], discounts)
    assert (header.op, header.writer, header.seq, header.rows, header.arg0) == (Op.INSERT, 3, 9, 7, 7)
    assert [c.dtype for c in columns] == [np.float32, np.int64, np.float32, np.float32, np.float32]
    assert header.flags & 0x8000 == (0x8000 if inline else 0)
    assert columns[0].shape == (4,) and columns[2].shape == ()
    assert HEADER.size == 56 and COLUMN.size == 20


def test_insert_sample_update_stats(server):
    srv = server("prioritized", capacity=500)
    client = ReplayClient(srv.address, writer=1, timeout=20)
    for k in range(4):
        client.add(*chunk(100 * k, 100))
    assert client.flush() == 4
    assert len(client) == 400 and client.capacity == 500 and client.prioritized
    assert np.array_equal(stored_ids(srv), np.arange(400))
    batch = client.sample(64)
    ids = batch.obs[:, 0]
    assert np.array_equal(batch.indices, ids.astype(np.int64))  # slot i holds id i
    assert np.array_equal(batch.next_obs, batch.obs + 0.5) and np.array_equal(batch.rewards, ids)
    assert np.allclose(batch.weights, 1.0)  # every row at the max priority
    # piggybacked: one row gets all the priority, the next batch (same round trip) is all that row
    td = np.zeros(64, np.float32)
    td[0] = 1e3
    client.update_priorities(batch.indices, td)
    again = client.sample(64)
    stats = client.stats()
    assert stats["updates"] == 1 and stats["samples"] == 2 and stats["rejected"] == 0
    assert stats["latency"]["update_sample"]["count"] == 1
    # rows never sampled keep priority 1, so the heavy row is drawn at least ~1e3^0.6 / (400 + 63) of the time
    assert (again.indices == batch.indices[0]).sum() >= 1
    # weights agree with a local table holding the same priorities
    local = PrioritizedReplay(500, 4)
    local.add(*chunk(0, 400))
    local.update_priorities(batch.indices, td)
    local.progress = 400  # the server's env-step count (beta anneals on it)
    p = local.tree.get(again.indices)
    expected = (p / local.tree.min()) ** -local.beta
    assert np.allclose(again.weights, expected, rtol=1e-5)
    client.close()


def test_separate_update_and_uniform(server):
    srv = server("uniform", capacity=50)
    client = ReplayClient(srv.address, writer=2, piggyback=False)
    client.add(*chunk(0, 30))
    client.add(*chunk(30, 30))  # wraps: 60 rows into 50 slots
    client.flush()
    assert len(client) == 50 and srv.service.table.inserted == 60
    batch = client.sample(16)
    client.update_priorities(batch.indices, np.ones(16))  # a uniform table ignores priorities
    assert client.stats()["updates"] == 1
    client.close()


MALFORMED = []


def _malformed(name):
    def register(fn):
        MALFORMED.append((name, fn))
        return fn
    return register


def _insert(rows=4, obs=None, writer=7, seq=1, ncols=None, table=0, arg0=None, columns=None, drop=0, flags=0):
    cols = list(chunk(0, rows)) if columns is None else columns
    if obs is not None:
        cols[0] = obs
    frames = pack(Header(Op.INSERT, writer=writer, seq=seq, rows=rows, table=table, flags=flags,
                         arg0=rows if arg0 is None else arg0), cols, inline=False)
    return [bytes(f) for f in frames[:len(frames) - drop]]


def _update(indices, td):
    frames = pack(Header(Op.UPDATE, rows=len(indices)), [np.asarray(indices, np.int64), td], inline=False)
    return [bytes(f) for f in frames]


_malformed("bad magic")(lambda: [header_bytes(magic=b"XXXX")])
_malformed("bad version")(lambda: [header_bytes(version=VERSION + 1)])
_malformed("truncated header")(lambda: [header_bytes()[:20]])
_malformed("header longer than its columns")(lambda: [header_bytes() + b"\0" * 7])
_malformed("unknown op")(lambda: [header_bytes(op=99)])
_malformed("a reply op sent as a request")(lambda: [header_bytes(op=Op.ACK)])
_malformed("unknown table")(lambda: [header_bytes(table=5)])
_malformed("pickled payload")(lambda: [pickle.dumps({"obs": np.zeros(4), "cmd": "rm -rf"})])
_malformed("pickled column")(lambda: _insert()[:1] + [pickle.dumps(np.zeros((4, 4), np.float32))] + _insert()[2:])
_malformed("wrong dtype")(lambda: _insert(obs=np.zeros((4, 4), np.float64)))
_malformed("wrong shape")(lambda: _insert(obs=np.zeros((4, 5), np.float32)))
_malformed("truncated column")(lambda: _insert()[:1] + [_insert()[1][:-3]] + _insert()[2:])
_malformed("missing column frame")(lambda: _insert(drop=1))
_malformed("oversize row count")(lambda: _insert(rows=2000))
_malformed("row count larger than the buffers")(lambda: [
    HEADER.pack(MAGIC, VERSION, Op.INSERT, 0, 5, 0, 7, 10**9, 0, 1, 4, 0) + _insert()[0][HEADER.size:]] + _insert()[1:])
_malformed("unknown dtype code")(lambda: [header_bytes(op=Op.UPDATE, ncols=1, rows=1) + COLUMN.pack(99, 0, 0, 0, 0, 0),
                                          b"\0" * 8])
_malformed("too many dims")(lambda: [header_bytes(op=Op.UPDATE, ncols=1, rows=1) + COLUMN.pack(5, 6, 1, 1, 1, 1),
                                     b"\0" * 8])
_malformed("NaN priority")(lambda: _update([0, 1], np.array([1.0, np.nan], np.float32)))
_malformed("negative priority")(lambda: _update([0, 1], np.array([1.0, -2.0], np.float32)))
_malformed("infinite priority")(lambda: _update([0], np.array([np.inf], np.float64)))
_malformed("index out of range")(lambda: _update([0, 10**6], np.ones(2, np.float32)))
_malformed("priorities as int")(lambda: _update([0], np.ones(1, np.int32)))
_malformed("sample of 0 rows")(lambda: [header_bytes(op=Op.SAMPLE, arg0=0)])
_malformed("sample over max_batch")(lambda: [header_bytes(op=Op.SAMPLE, arg0=10**9)])
_malformed("writer id 0")(lambda: _insert(writer=0))
_malformed("sequence gap")(lambda: _insert(seq=5))
_malformed("inline message with trailing bytes")(lambda: [pack(Header(Op.INSERT, writer=7, seq=1, rows=4, arg0=4),
                                                               list(chunk(0, 4)), inline=True)[0] + b"\0" * 8])
_malformed("inline message with extra frames")(lambda: pack(Header(Op.INSERT, writer=7, seq=1, rows=4, arg0=4),
                                                            list(chunk(0, 4)), inline=True) + [b"\0" * 16])
_malformed("wrong dtype in an insert that asks for no ack")(lambda: _insert(obs=np.zeros((4, 4), np.float64),
                                                                          flags=FLAG_NO_ACK))
_malformed("inline message truncated")(lambda: [pack(Header(Op.INSERT, writer=7, seq=1, rows=4, arg0=4),
                                                     list(chunk(0, 4)), inline=True)[0][:-5]])


def test_malformed_frames_refused_while_serving(server):
    srv = server("prioritized", capacity=100, max_chunk_rows=64)
    good = ReplayClient(srv.address, writer=1)
    good.add(*chunk(0, 20))
    good.flush()
    raw = Raw(srv.address)
    assert len(MALFORMED) >= 15
    for i, (name, make) in enumerate(MALFORMED, 1):
        header, reply = raw.ask(make())
        assert header.op == Op.ERROR, name
        assert header.status != ErrorCode.OK
        h, columns = unpack_header(reply[0])
        message = message_arrays(reply, h, columns)[0].tobytes().decode()
        assert message and "\n" not in message, name
        # the server keeps serving: a valid request right after each bad one
        stats = good.stats()
        assert stats["rejected"] == i, (name, stats["last_error"])
        assert stats["size"] == 20, name  # nothing was executed
    # an empty message (routing id only) is refused too
    raw.socket.send(b"")
    assert raw.socket.poll(10_000)
    assert unpack_header(raw.socket.recv_multipart()[0])[0].op == Op.ERROR
    assert good.sample(8).obs.shape == (8, 4)
    assert np.array_equal(stored_ids(srv), np.arange(20))
    stats = good.stats()
    assert stats["rejected"] == len(MALFORMED) + 1 and stats["rows_inserted"] == 20
    raw.close()
    good.close()


def test_client_reports_refusal_as_one_line(server):
    srv = server("uniform", capacity=100)
    client = ReplayClient(srv.address, writer=1)
    with pytest.raises(ServerError, match="empty table"):
        client.sample(4)
    client.close()


def test_exactly_once_under_resend_and_writer_restart(server):
    srv = server("uniform", capacity=10_000)
    chunks = [chunk(50 * k, 50) for k in range(40)]
    first = ReplayClient(srv.address, writer=9, window=4)
    for k in range(25):
        first.add(*chunks[k])
    first.flush()
    # the same chunks sent again with their sequence numbers: acknowledged, not stored
    for k in range(10, 25):
        first.add(*chunks[k], seq=k + 1)
    first.flush()
    # raw duplicates that bypass the client's bookkeeping are dropped by the server too
    raw = Raw(srv.address)
    for k in (0, 5, 24):
        header, _ = raw.ask(_insert_frames(chunks[k], writer=9, seq=k + 1))
        assert header.op == Op.ACK and header.seq == 25
    raw.close()
    # a writer that dies with chunks in flight: they were sent (not flushed) then the process "died"
    for k in range(25, 32):
        first.add(*chunks[k])
    first.close()
    # its restart replays its whole stream from the start: whatever the server stored is skipped
    second = ReplayClient(srv.address, writer=9, window=4)
    acked = second.resume()
    assert 25 <= acked <= 32
    for k in range(40):
        second.add(*chunks[k], seq=k + 1)
    assert second.flush() == 40
    assert np.array_equal(stored_ids(srv), np.arange(2000))
    stats = second.stats()
    assert stats["rows_inserted"] == 2000 and stats["duplicates"] >= 3  # the client skips what it knows is stored
    assert stats["env_steps"] == 2000
    second.close()


def _insert_frames(columns, writer, seq):
    rows = len(columns[2])
    frames = pack(Header(Op.INSERT, writer=writer, seq=seq, rows=rows, arg0=rows), list(columns))
    return [bytes(f) for f in frames]


def test_replies_of_one_burst_keep_the_requests_order(server):
    """The server sends a sample's reply as soon as it is made (before looking for more requests)
    and keeps the acks of inserts for the burst's end, where they coalesce: whatever the burst,
    one peer's replies come in its requests' order, and a dropped ack is one a later ack covers."""
    srv = server("uniform", capacity=1000)
    raw = Raw(srv.address)
    raw.ask(_insert_frames(chunk(0, 50), writer=3, seq=1))
    srv.lock.acquire()  # the server thread waits: the requests below queue up as one burst
    try:
        for seq in (2, 3):
            raw.socket.send_multipart(_insert_frames(chunk(50 * seq, 50), writer=3, seq=seq))
        raw.socket.send_multipart([bytes(f) for f in pack(Header(Op.SAMPLE, arg0=8))])
        for seq in (4, 5):
            raw.socket.send_multipart(_insert_frames(chunk(50 * seq, 50), writer=3, seq=seq))
        raw.socket.send_multipart([bytes(f) for f in pack(Header(Op.STATS))])
        time.sleep(0.3)
    finally:
        srv.lock.release()
    got = []
    while raw.socket.poll(2000):
        header = unpack_header(raw.socket.recv_multipart()[0])[0]
        got.append((Op(header.op).name, header.seq))
        if header.op == Op.INFO:
            break
    assert got == [("ACK", 3), ("BATCH", 0), ("ACK", 5), ("INFO", 0)]
    raw.close()


def test_unacknowledged_chunks_are_covered_by_a_later_ack(server):
    """FLAG_NO_ACK: the chunk is stored without a reply; a later chunk's ACK (cumulative) or a
    WRITER request covers it; a resend of it is a silent duplicate. A client with a window of 16
    asks for every 8th ack and still stores each chunk exactly once, resends included."""
    srv = server("uniform", capacity=1000)
    raw = Raw(srv.address)
    silent = [bytes(f) for f in pack(Header(Op.INSERT, writer=5, seq=1, rows=10, arg0=10, flags=FLAG_NO_ACK),
                                     list(chunk(0, 10)))]
    raw.socket.send_multipart(silent)
    assert not raw.socket.poll(300)  # stored, no reply
    header, _ = raw.ask(_insert_frames(chunk(10, 10), writer=5, seq=2))
    assert header.op == Op.ACK and header.seq == 2
    raw.socket.send_multipart(silent)  # a resend: a duplicate, dropped without a reply
    assert not raw.socket.poll(300)
    header, _ = raw.ask(pack(Header(Op.WRITER, writer=5)))
    assert header.op == Op.ACK and header.seq == 2
    raw.close()
    client = ReplayClient(srv.address, writer=6, window=16)
    assert client._writer.ack_every == 8
    for k in range(23):  # not a multiple of 8: flush() has to ask where the server is
        client.add(*chunk(20 + 10 * k, 10))
    assert client.flush() == 23
    w = client._writer
    for k in range(23, 33):  # in flight when the connection drops
        client.add(*chunk(20 + 10 * k, 10))
    deadline = time.monotonic() + 10
    while client.stats()["rows_inserted"] < 350 and time.monotonic() < deadline:
        time.sleep(0.01)
    w.conn.connect()  # a fresh socket: the 10 unacknowledged chunks go again, the server has them
    w.sent = w.expect = 0
    assert client.flush() == 33  # (the first resend's ack covers them all: the rest may still be on their way)
    deadline = time.monotonic() + 10
    while client.stats()["duplicates"] < 1 + 10 and time.monotonic() < deadline:
        time.sleep(0.01)
    stats = client.stats()
    assert stats["duplicates"] == 1 + 10 and stats["rows_inserted"] == 350
    assert np.array_equal(stored_ids(srv), np.arange(350))
    client.close()


def test_spinning_server_and_learner(server):
    """spin_us: the server thread and the learner's connection spin before blocking; the service
    is the same (the speed is the benchmark's: benchmarks/replay_server.py latency --spins)."""
    from pearl.errors import ConfigError
    from pearl.server.client import spin_wait

    srv = server("prioritized", capacity=500, spin_us=300.0)
    client = ReplayClient(srv.address, writer=1, spin_us=300.0)
    client.add(*chunk(0, 100))
    client.flush()
    batch = client.sample(32)
    client.update_priorities(batch.indices, np.full(32, 2.0))
    assert client.sample(32).obs.shape == (32, 4)
    stats = client.stats()
    assert stats["updates"] == 1 and stats["samples"] == 2 and stats["rejected"] == 0
    # spin_wait: nothing queued -> {} once the time is up; a queued reply -> found at once
    socket = client.learner.socket
    start = time.perf_counter()
    assert spin_wait((socket,), 2_000_000) == {} and time.perf_counter() - start >= 0.002
    client.learner.send(pack(Header(Op.STATS)))
    assert spin_wait((socket,), 5_000_000_000) == {socket: zmq.POLLIN}
    client.learner.recv()
    client.close()
    for bad in (-1.0, 1e9):
        with pytest.raises(ConfigError, match="spin_us"):
            ServerConfig(spin_us=bad).check()


def test_unix_socket_server_is_owner_only(server, tmp_path):
    """ipc:// (a same-machine learner): the same service over a Unix socket whose file only its
    owner may connect to, whatever the umask left it as."""
    import os
    import stat

    old = os.umask(0)  # (no other thread of the test process creates files meanwhile)
    try:
        srv = server("prioritized", capacity=500, bind=f"ipc://{tmp_path}/replay")
    finally:
        os.umask(old)
    assert srv.address == f"ipc://{tmp_path}/replay"
    assert stat.S_IMODE(os.stat(tmp_path / "replay").st_mode) == 0o600
    client = ReplayClient(srv.address, writer=1)
    client.add(*chunk(0, 100))
    client.flush()
    batch = client.sample(32)
    client.update_priorities(batch.indices, np.full(32, 2.0))
    assert client.sample(32).obs.shape == (32, 4)
    assert client.stats()["updates"] == 1
    client.close()
    abstract = server("uniform", capacity=100, bind=f"ipc://@pearl-test-{os.getpid()}")  # no file to chmod
    other = ReplayClient(abstract.address)
    assert other.info["capacity"] == 100
    other.close()


def test_cli_spin_flag_is_checked(capsys):
    from pearl.server.cli import main

    assert main(["--plaintext", "--bind", LOOPBACK, "--spin-us", "-5"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("pearl: error: spin_us") and "\n" not in err


def test_inline_pack_pads_with_zeros_and_takes_strided_columns():
    obs = np.arange(30, dtype=np.float32).reshape(10, 3)[:, :2]  # not C-contiguous
    actions = np.arange(5, dtype=np.int8)[::-1][:5]
    rows = np.ones(5, np.int64)
    frames = pack(Header(Op.INSERT, rows=5), [obs[:5], actions, rows])
    assert len(frames) == 1
    header, columns = unpack_header(frames[0])
    assert header.flags & FLAG_INLINE
    arrays = message_arrays(frames, header, columns)
    assert np.array_equal(arrays[0], obs[:5]) and np.array_equal(arrays[1], actions)
    assert np.array_equal(arrays[2], rows)
    frame = bytes(frames[0])
    first = HEADER.size + 3 * COLUMN.size
    first += -first % 8  # each column starts 8-byte aligned
    assert frame[first:first + 40] == obs[:5].tobytes()
    assert frame[first + 45:first + 48] == b"\0\0\0"  # after the int8 column, before the int64 one
    assert len(frame) == first + 48 + 40


def test_pack_layout_cached_per_dtypes_and_shapes():
    """pack works out descriptors and padding once per column layout: a layout met again (other
    contents), the same dtypes at other row counts (other padding after an int8 column) and other
    per-row shapes each round-trip exactly."""
    def packed(rows, width):
        obs = np.arange(rows * width, dtype=np.float32).reshape(rows, width) + rows
        flags = (np.arange(rows) % 3).astype(np.int8)
        ids = np.arange(rows, dtype=np.int64) * 7
        frames = pack(Header(Op.INSERT, rows=rows), [obs, flags, ids])
        arrays = message_arrays(frames, *unpack_header(frames[0]))
        for got, sent in zip(arrays, (obs, flags, ids)):
            assert got.shape == sent.shape and np.array_equal(got, sent)
        return bytes(frames[0])

    for rows, width in [(5, 2), (5, 2), (8, 2), (3, 2), (5, 3), (5, 2)]:
        frame = packed(rows, width)
        first = HEADER.size + 3 * COLUMN.size
        first += -first % 8
        ids_at = first + rows * width * 4 + rows
        ids_at += -ids_at % 8
        assert len(frame) == ids_at + 8 * rows
    with pytest.raises(ValueError, match="per-row dims"):
        pack(Header(Op.INSERT, rows=1), [np.zeros((1, 1, 1, 1, 1, 1), np.float32)])


@pytest.mark.parametrize("rows", [1, 5, 256])
def test_packer_frames_equal_pack(rows):
    """Packer (a fixed layout's descriptors and padding worked out once) gives pack's bytes, also
    after an int8 column whose length needs padding; non-contiguous or oversize columns are refused."""
    from pearl.server.wire import Packer

    rng = np.random.default_rng(rows)
    columns = [rng.normal(size=(rows, 3)).astype(np.float32), (np.arange(rows) % 7).astype(np.int8),
               np.arange(rows, dtype=np.int64), rng.normal(size=rows).astype(np.float32)]
    packer = Packer(columns)
    for seq in range(3):
        columns[0] += 1.0
        header = Header(Op.BATCH, rows=rows, seq=seq, arg0=7 * seq, arg1=seq + 1, flags=FLAG_NO_ACK)
        assert packer.pack(header, columns) == pack(header, columns)
    with pytest.raises(ValueError, match="C-contiguous"):
        Packer([np.zeros((4, 6), np.float32)[:, :3]])
    with pytest.raises(ValueError, match="inline"):
        Packer([np.zeros(INLINE_BYTES + 8, np.uint8)])


@pytest.mark.parametrize("batch", [64, 3000])  # one inline frame; a frame per column (over INLINE_BYTES)
def test_sampled_batches_are_writable_and_outlive_the_next_sample(server, batch):
    """The client reads a reply into a fresh buffer of its own (Connection._receive): a batch is
    writable and keeps its contents after later samples and updates."""
    srv = server("prioritized", capacity=5000)
    client = ReplayClient(srv.address, writer=1, timeout=20)
    client.add(*chunk(0, 4000))
    client.flush()
    first = client.sample(batch)
    kept = {name: getattr(first, name).copy() for name in ("obs", "actions", "rewards", "indices", "weights")}
    for _ in range(3):
        client.update_priorities(first.indices, np.full(batch, 3.0))
        later = client.sample(batch)
        assert np.array_equal(later.obs[:, 0], later.indices)  # slot i holds id i
    for name, values in kept.items():
        assert np.array_equal(getattr(first, name), values)
    first.obs[0] = -1.0  # writable
    with pytest.raises(ValueError, match="2 |td| for 3 indices"):
        client.update_priorities(np.arange(3), np.ones(2))
    client.close()


@pytest.mark.parametrize("kind", ["uniform", "prioritized"])
def test_inline_inserts_store_what_table_add_stores(kind):
    """An inline INSERT goes into the ring by one compiled copy from the frame (Replay.add_frame):
    the same rows, cursor, size and priorities as the table's add of the same chunks, across the
    wrap; a multi-frame chunk (over INLINE_BYTES) still takes add."""
    from pearl.replay import PrioritizedReplay, UniformReplay
    from pearl.server.service import ReplayService

    service = ReplayService(ServerConfig(table=TableConfig(kind=kind, capacity=500, obs_dim=4)))
    reference = (UniformReplay if kind == "uniform" else PrioritizedReplay)(500, 4)
    assert service._frame_inserts
    rng = np.random.default_rng(0)
    for seq, rows in enumerate([37, 100, 1, 250, 113, 2000], 1):
        chunk = (rng.normal(size=(rows, 4)).astype(np.float32), rng.integers(0, 2, rows),
                 rng.normal(size=rows).astype(np.float32), rng.normal(size=(rows, 4)).astype(np.float32),
                 np.full(rows, 0.99, np.float32))
        frames = pack(Header(Op.INSERT, writer=1, seq=seq, rows=rows, arg0=rows), list(chunk))
        assert len(frames) == (1 if rows < 1000 else 6)
        (_, reply), = service.handle(b"peer", frames)
        assert unpack_header(reply[0])[0].op == Op.ACK
        reference.add(*chunk)
    table = service.table
    assert (table.cursor, table.size, table.inserted) == (reference.cursor, reference.size, reference.inserted)
    for name in reference.storage:
        np.testing.assert_array_equal(table.storage[name], reference.storage[name])
    if kind == "prioritized":
        np.testing.assert_array_equal(table.tree.get(np.arange(500)), reference.tree.get(np.arange(500)))


def test_service_warms_its_kernels_without_changing_the_table():
    """A fresh ReplayService has the insert kernel compiled for the read-only arrays a received
    frame gives (a process's first numba call would otherwise stall the first chunk ~0.7 s), and
    its table is untouched: run in a fresh interpreter, where nothing else compiled it."""
    import subprocess
    import sys

    code = """
import numpy as np
from pearl.kernels.cpu.fast_storage import insert_frame, insert_rows
from pearl.server.config import RateLimiterConfig, ServerConfig, TableConfig
from pearl.server.service import ReplayService
for kind in ("uniform", "prioritized"):
    s = ReplayService(ServerConfig(table=TableConfig(kind=kind, capacity=64),
                                   rate_limiter=RateLimiterConfig(samples_per_insert=1.0, min_size_to_sample=8)))
    t = s.table
    assert (t.size, t.cursor, t.inserted, t.rate_limiter.inserts) == (0, 0, 0, 0), (kind, t.size, t.cursor)
    assert not any(s.counts.values()) and s.env_steps == 0
    assert not t.prioritized or t.tree.total == 0
print(any(not sig[3].types[0].mutable for sig in insert_rows.signatures)  # read-only columns
      and any(not sig[3].mutable for sig in insert_frame.signatures))  # a read-only frame (bytes)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-1] == "True"


def test_ratio_exact_at_end_and_within_credit_bound(server):
    ratio = RatioConfig(updates_per_step=0.25, learning_starts=64, max_lag=4)
    srv = server("prioritized", capacity=20_000, ratio=ratio)
    steps_per_writer, rows = 1200, 8
    errors = []

    def write(writer):
        try:
            client = ReplayClient(srv.address, writer=writer, window=4, timeout=20)
            for k in range(steps_per_writer // rows):
                client.add(*chunk(writer * 100_000 + k * rows, rows), env_steps=rows)
            client.flush()
            client.close()
        except Exception as error:  # pragma: no cover - reported below
            errors.append(error)

    writers = [threading.Thread(target=write, args=(w,)) for w in (1, 2)]
    for t in writers:
        t.start()
    learner = ReplayClient(srv.address, timeout=20)
    total = 2 * steps_per_writer
    want = updates_due(total, ratio.learning_starts, ratio.updates_per_step)
    lags = []
    deadline = time.monotonic() + 60
    done = 0
    while done < want and time.monotonic() < deadline:
        batch = learner.sample(32, timeout=20)
        done += 1
        learner.update_priorities(batch.indices, np.abs(batch.rewards) + 1)
        if done % 25 == 0:
            s = learner.stats()
            lags.append(s["updates_due"] - s["updates"])
    for t in writers:
        t.join(30)
    assert not errors, errors
    learner.flush_updates()
    stats = learner.stats()
    assert stats["env_steps"] == total and stats["size"] == total
    assert stats["updates"] == want == done  # exact at the end
    assert stats["max_lag_seen"] <= ratio.max_lag  # within the credit bound during the run
    assert max(lags, default=0) <= ratio.max_lag
    # the learner cannot run ahead: one more sample waits (and times out)
    with pytest.raises(NoReply):
        learner.sample(32, timeout=0.3)
    time.sleep(0.3)
    # more env steps make it due after the learner gave up: the batch drawn for nobody is no update
    late = ReplayClient(srv.address, writer=3, timeout=20)
    late.add(*chunk(300_000, 8), env_steps=8)
    late.flush()
    more = updates_due(total + 8, ratio.learning_starts, ratio.updates_per_step) - want
    for _ in range(more):
        learner.sample(32, timeout=20)
    stats = learner.stats()
    assert stats["updates"] == stats["updates_due"] == want + more
    assert stats.get("undelivered", 0) == 1
    late.close()
    learner.close()


def test_a_writer_done_gives_its_credit_back(server):
    """flush(release_credit=True): a writer that is done gives the server back the credit it
    holds, so a writer that comes later gets the window. Without it (the ray runtime's node agent
    that Ray started late: CI at 6b8d3c8), the first writer's leftover (the whole window, granted
    while it wrote alone) left the late one too little of the window once nothing more was due,
    and its credit request waited for a reply that never came."""
    ratio = RatioConfig(updates_per_step=0.25, learning_starts=0, max_lag=16)  # a 64 env steps window
    srv = server(capacity=1000, ratio=ratio)
    first = ReplayClient(srv.address, writer=1, timeout=20)
    first.add(*chunk(0, 8), env_steps=8)
    first.flush()
    learner = ReplayClient(srv.address, timeout=20)
    for _ in range(updates_due(8, 0, 0.25)):
        learner.sample(4, timeout=20)
    held = int(learner.stats()["credit"]["1"])
    assert held > 64 - 8 - 16  # the lone writer's share: more than a later chunk of 16 leaves room for
    control = ReplayClient(srv.address, writer=2, timeout=0.5, retries=0)
    with pytest.raises(NoReply):
        control.add(*chunk(1000, 16), env_steps=16)
    control.close()
    first.flush(release_credit=True)
    assert "1" not in learner.stats()["credit"] or int(learner.stats()["credit"]["1"]) == 0
    late = ReplayClient(srv.address, writer=3, timeout=20)
    late.add(*chunk(2000, 16), env_steps=16)
    late.flush()
    for _ in range(updates_due(24, 0, 0.25) - updates_due(8, 0, 0.25)):
        learner.sample(4, timeout=20)
    stats = learner.stats()
    assert stats["env_steps"] == 24 and stats["updates"] == stats["updates_due"] == 6
    first.add(*chunk(3000, 8), env_steps=8)  # a writer done may write again: it asks for credit anew
    first.flush()
    assert learner.stats()["env_steps"] == 32
    for client in (first, late, learner):
        client.close()


def test_config_file_errors(tmp_path):
    path = tmp_path / "server.yaml"
    path.write_text("table: {kind: prioritized, capacity: 1000}\nbind: tcp://127.0.0.1:5999\n")
    config = load_config(path)
    assert config.table.kind == "prioritized" and config.auth.plaintext
    from pearl.errors import ConfigError

    for text, field in (("table: {capacity: -1}\n", "table.capacity"), ("tabel: {}\n", "tabel"),
                        ("bind: tcp://0.0.0.0:5555\n", "bind"), ("table: {kind: fifo}\n", "table.kind"),
                        ("auth: {plaintext: false}\n", "auth")):
        path.write_text(text)
        with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
            load_config(path)


def test_header_struct_is_little_endian():
    raw = header_bytes(op=Op.SAMPLE, arg0=256)
    assert raw[:4] == MAGIC and struct.unpack_from("<H", raw, 4)[0] == VERSION
    assert struct.unpack_from("<Q", raw, 40)[0] == 256


@pytest.mark.parametrize("kind", ["uniform", "prioritized", "amper"])
def test_every_selector_behind_the_server(server, kind):
    from pearl.server.wire import FLAG_MASSES

    srv = server(kind, capacity=300)
    client = ReplayClient(srv.address, writer=1)
    client.add(*chunk(0, 200))
    client.flush()
    header, arrays = client.sample_raw(32, flags=FLAG_MASSES)
    masses, meta = arrays[7], arrays[8][0]
    assert len(masses) == 32 and meta[3] == 200 and meta[4] == 200  # size, env steps
    assert meta[0] > 0 and 0 < meta[1] <= masses.min()  # total, min mass
    client.update_priorities(arrays[5], np.linspace(0.1, 5, 32))
    batch = client.sample(32)
    assert batch.obs.shape == (32, 4) and np.isin(batch.indices, np.arange(200)).all()
    assert client.prioritized == (kind != "uniform")
    client.close()


def test_table_rate_limiter_band_kept_by_the_server(server):
    """The table's pearl.replay.RateLimiter on the server: a refused insert is answered RATE_LIMITED
    and resent by the writer, a refused sample waits; every row is stored once, the band holds."""
    from pearl.server.config import RateLimiterConfig

    srv = server("uniform", capacity=1000, rate_limiter=RateLimiterConfig(samples_per_insert=2.0,
                                                                         min_size_to_sample=10))
    rows, errors = 200, []

    def write():
        try:
            client = ReplayClient(srv.address, writer=4, window=2, timeout=20)
            for k in range(rows // 5):
                client.add(*chunk(5 * k, 5))
            client.flush()
            client.close()
        except Exception as error:  # pragma: no cover
            errors.append(error)

    thread = threading.Thread(target=write)
    thread.start()
    learner = ReplayClient(srv.address, timeout=20)
    sampled, deadline = 0, time.monotonic() + 60
    while sampled < 2 * rows - 20 and time.monotonic() < deadline:
        learner.sample(4)
        sampled += 4
    thread.join(30)
    assert not errors, errors
    limiter = srv.service.table.rate_limiter
    assert limiter.inserts == rows and limiter.samples == sampled
    assert limiter.min_diff <= limiter.diff <= limiter.max_diff
    assert np.array_equal(stored_ids(srv), np.arange(rows))
    assert learner.stats()["rejected_by_code"].get("RATE_LIMITED", 0) >= 1  # the writer was held back
    learner.close()


@pytest.mark.parametrize("rows", [50, 2000])  # one inline frame / zero-copy frames per column
def test_caller_may_reuse_its_arrays_after_add(server, rows):
    srv = server("uniform", capacity=5000)
    client = ReplayClient(srv.address, writer=1, window=4)
    columns = chunk(0, rows)
    client.add(*columns)
    for c in columns:  # an actor overwriting its buffers right away
        c[...] = -1
    client.flush()
    assert np.array_equal(stored_ids(srv), np.arange(rows))
    client.close()
