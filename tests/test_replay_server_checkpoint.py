"""Replay server checkpoints: taken while inserts and samples go on (copy-on-write blocks), the
file holds exactly the state at its start, a restart resumes with the same counters and rows, and
kill -9 of a server process then a restart from its checkpoint loses nothing acknowledged before
the checkpoint (the writer resends what came after). Loopback only; every wait bounded."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

zmq = pytest.importorskip("zmq")

from pearl.server.checkpoint import latest  # noqa: E402
from pearl.server.client import ReplayClient  # noqa: E402
from pearl.server.config import ServerConfig, TableConfig  # noqa: E402
from pearl.server.server import ReplayServer  # noqa: E402

LOOPBACK = "tcp://127.0.0.1:0"


def rows(start, count):
    ids = np.arange(start, start + count, dtype=np.float32)
    obs = np.repeat(ids[:, None], 4, axis=1)
    return obs, np.zeros(count, np.int64), ids, obs, np.ones(count, np.float32)


def expected_ids(inserted: int, capacity: int) -> np.ndarray:
    """Slot j holds the last id k < inserted with k % capacity == j."""
    size = min(inserted, capacity)
    slots = np.arange(size)
    last = inserted - 1 - ((inserted - 1 - slots) % capacity)
    return last.astype(np.float32)


def load_obs(directory: Path) -> tuple[dict, np.ndarray]:
    name = latest(directory)
    manifest = json.loads((directory / name / "manifest.json").read_text())
    return manifest, np.load(directory / name / "obs.npy", allow_pickle=False)[:, 0]


def test_checkpoint_under_concurrent_load_and_restart(tmp_path):
    capacity, chunk = 400_000, 2000
    config = ServerConfig(table=TableConfig(kind="prioritized", capacity=capacity), bind=LOOPBACK,
                          checkpoint_dir=str(tmp_path / "ckpt"))
    srv = ReplayServer(config).start()
    writer = ReplayClient(srv.address, writer=1, window=8, timeout=30)
    next_id = 0
    while next_id < capacity:  # fill, so the inserts during the checkpoint overwrite saved rows
        writer.add(*rows(next_id, chunk))
        next_id += chunk
    writer.flush()
    stop = threading.Event()
    done = {"inserts": [], "samples": []}
    errors = []

    def write():
        nonlocal next_id
        try:
            while not stop.is_set() and next_id < 40 * capacity:  # ids stay exact in float32
                writer.add(*rows(next_id, chunk))
                next_id += chunk
                done["inserts"].append(time.monotonic())
            writer.flush()
        except Exception as error:  # pragma: no cover
            errors.append(error)

    def learn():
        try:
            learner = ReplayClient(srv.address, timeout=30)
            while not stop.is_set():
                batch = learner.sample(256)
                learner.update_priorities(batch.indices, np.abs(batch.rewards % 7) + 0.1)
                done["samples"].append(time.monotonic())
            learner.close()
        except Exception as error:  # pragma: no cover
            errors.append(error)

    threads = [threading.Thread(target=write), threading.Thread(target=learn)]
    for t in threads:
        t.start()
    time.sleep(0.3)
    admin = ReplayClient(srv.address, timeout=60)
    began = time.monotonic()
    info = admin.checkpoint()
    ended = time.monotonic()
    time.sleep(0.2)
    stop.set()
    for t in threads:
        t.join(60)
    assert not errors, errors
    # service went on during the checkpoint: inserts and samples completed between its start and end
    assert any(began < t < ended for t in done["inserts"]), (info, len(done["inserts"]))
    assert any(began < t < ended for t in done["samples"])
    # the file holds the rows as they were at the checkpoint's start, though many were overwritten since
    manifest, obs = load_obs(tmp_path / "ckpt")
    inserted = manifest["table"]["inserted"]
    assert manifest["acked"]["1"] * chunk == inserted == manifest["env_steps"]
    assert np.array_equal(obs, expected_ids(inserted, capacity))
    assert srv.service.table.inserted > inserted
    final = admin.stats()
    srv.stop()
    # restart from it: the same counters and contents
    again = ReplayServer(config).start()
    try:
        service = again.service
        assert service.table.inserted == inserted and service.env_steps == manifest["env_steps"]
        assert service.acked == {1: manifest["acked"]["1"]} and service.table.cursor == manifest["table"]["cursor"]
        assert np.array_equal(service.table.storage["obs"][:capacity, 0], expected_ids(inserted, capacity))
        priorities = np.load(tmp_path / "ckpt" / manifest["name"] / "priorities.npy")
        assert np.array_equal(service.table.tree.get(np.arange(capacity)), priorities)
        client = ReplayClient(again.address, timeout=30)
        assert client.sample(64).obs.shape == (64, 4)
        client.close()
    finally:
        again.stop()
    assert final["checkpoints"] == 1
    writer.close()
    admin.close()


def _start_server(directory: Path, capacity: int):
    process = subprocess.Popen(
        [sys.executable, "-m", "pearl.server.cli", "--bind", "tcp://127.0.0.1:0", "--plaintext",
         "--capacity", str(capacity), "--checkpoint-dir", str(directory)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 60
    line = ""
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if "listening on" in line or process.poll() is not None:
            break
    assert "listening on" in line, (line, process.stderr.read() if process.poll() is not None else "")
    return process, line.split("listening on ")[1].split()[0]


def test_kill_9_then_restart_from_checkpoint_loses_nothing_acknowledged(tmp_path):
    directory, capacity, chunk = tmp_path / "ckpt", 50_000, 500
    process, address = _start_server(directory, capacity)
    try:
        writer = ReplayClient(address, writer=3, window=4, timeout=3, retries=20)
        for k in range(20):
            writer.add(*rows(k * chunk, chunk))
        writer.flush()
        info = writer.checkpoint()
        assert info["acked"] == {"3": 20}
        for k in range(20, 30):  # acknowledged after the checkpoint: lost by the server's kill -9
            writer.add(*rows(k * chunk, chunk))
        assert writer.flush() == 30
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)
        process, address2 = _start_server(directory, capacity)
        if address2 != address:  # a new port: point the same writer (and its buffers) at it
            writer._writer.conn.address = address2
            writer.learner.address = address2
            writer.learner.connect()
        # the same writer goes on: it reconnects, learns the server is back at chunk 20 and resends
        # 21..30 from what it retained (acknowledged, not yet checkpointed), then its new chunks
        for k in range(30, 40):
            writer.add(*rows(k * chunk, chunk))
        assert writer.flush() == 40
        stats = writer.stats()
        assert stats["size"] == 40 * chunk and stats["env_steps"] == 40 * chunk
        writer.checkpoint()
        manifest, obs = load_obs(directory)
        assert np.array_equal(np.sort(obs), np.arange(40 * chunk, dtype=np.float32))  # each exactly once
        # a restarted writer process (fresh client, same id) replaying its stream stores nothing twice
        fresh = ReplayClient(address2, writer=3, timeout=10)
        assert fresh.resume() == 40
        for k in range(40):
            fresh.add(*rows(k * chunk, chunk), seq=k + 1)
        assert fresh.flush() == 40 and fresh.stats()["rows_inserted"] >= 40 * chunk
        assert fresh.stats()["size"] == 40 * chunk
        fresh.close()
        writer.close()
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
