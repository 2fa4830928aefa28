"""Sharded prioritized sampling equals one table's (chi-square), and CURVE authentication with an
allow-list (an unknown key gets nothing). Loopback only; every wait bounded."""
from __future__ import annotations

import contextlib

import numpy as np
import pytest

zmq = pytest.importorskip("zmq")
scipy_stats = pytest.importorskip("scipy.stats")

from pearl.replay import PrioritizedReplay  # noqa: E402
from pearl.server.client import ClientAuth, NoReply, ReplayClient  # noqa: E402
from pearl.server.config import AuthConfig, ServerConfig, TableConfig  # noqa: E402
from pearl.server.keys import generate  # noqa: E402
from pearl.server.server import ReplayServer  # noqa: E402
from pearl.server.shards import SHIFT, ShardedReplayClient  # noqa: E402

LOOPBACK = "tcp://127.0.0.1:0"


def rows(ids):
    ids = np.asarray(ids, np.float32)
    obs = np.repeat(ids[:, None], 4, axis=1)
    return obs, np.zeros(len(ids), np.int64), ids, obs, np.ones(len(ids), np.float32)


def test_sharded_per_equals_one_table_chi_square():
    shards, per_shard, beta_steps = 3, 200, 10_000
    servers = [ReplayServer(ServerConfig(table=TableConfig(kind="prioritized", capacity=per_shard, beta_steps=beta_steps),
                                         bind=LOOPBACK, seed=11 + s)).start() for s in range(shards)]
    try:
        client = ShardedReplayClient([s.address for s in servers], writer=1, timeout=20)
        n = shards * per_shard
        for s in range(shards):  # round robin: chunk k goes to shard k % 3
            client.add(*rows(np.arange(s * per_shard, (s + 1) * per_shard)))
        client.flush()
        data_rng = np.random.default_rng(5)
        # row id i gets |td| td[i]; shard s's rows are (s + 1)^2 times heavier, so the count split matters
        td = (data_rng.uniform(0.05, 3.0, n) * (1 + np.arange(n) // per_shard) ** 2).astype(np.float32)
        # global index of id i: shard i // per_shard, slot i % per_shard
        ids = np.arange(n)
        client.update_priorities(((ids // per_shard) << SHIFT) | (ids % per_shard), td[ids])
        for s, shard in enumerate(client.shards):  # land the updates before sampling
            shard._send_update(*client._pending[s])
            client._pending[s] = None
        client.refresh()
        reference = PrioritizedReplay(n, 4, beta_steps=beta_steps)
        reference.add(*rows(ids))
        reference.update_priorities(ids, td)
        reference.progress = client.progress
        assert client.progress == n

        rng = np.random.default_rng(0)
        sharded_counts, local_counts = np.zeros(n), np.zeros(n)
        batches, batch = 300, 256
        for _ in range(batches):
            b = client.sample(batch, rng)
            got = b.obs[:, 0].astype(np.int64)
            np.add.at(sharded_counts, got, 1)
            # the weights are the one table's: (m_i / m_min)^-beta with the global minimum
            m = reference.tree.get(got)
            expected = (m / reference.tree.min()) ** -reference.beta
            assert np.allclose(b.weights, expected, rtol=2e-5)
            local = reference.sample(batch, rng)
            np.add.at(local_counts, local.indices, 1)
        masses = reference.tree.get(ids)
        p = masses / masses.sum()
        total = batches * batch
        # goodness of fit of the sharded draws to P(i) = m_i / T ...
        assert scipy_stats.chisquare(sharded_counts, p * total).pvalue > 1e-3
        # ... and sharded vs one table, as two samples of the same distribution
        table = np.vstack([sharded_counts, local_counts])
        assert scipy_stats.chi2_contingency(table).pvalue > 1e-3
        client.close()
    finally:
        for s in servers:
            s.stop()


@contextlib.contextmanager
def two_uniform_shards():
    """A sharded client over two uniform shard servers on loopback, 32 rows in each (ids 0-31 and
    100-131, so a row's id says its shard and slot)."""
    servers = [ReplayServer(ServerConfig(table=TableConfig(kind="uniform", capacity=64), bind=LOOPBACK,
                                         seed=s)).start() for s in range(2)]
    try:
        client = ShardedReplayClient([s.address for s in servers], writer=1, timeout=20)
        client.add(*rows(np.arange(0, 32)), env_steps=32)
        client.add(*rows(np.arange(100, 132)), env_steps=32)
        client.flush()
        yield client
        client.close()
    finally:
        for s in servers:
            s.stop()


def test_asked_batches_are_taken_oldest_first():
    """A learner's prefetch (pearl/runtime/ray.py `_Remote.prefetch`): batches asked for ahead come
    back in order, each with its shards' counts, and a STATS refresh waits for none of them."""
    with two_uniform_shards() as client:
        rng = np.random.default_rng(0)
        client.sample(8, rng)  # the totals and counts of both shards
        sizes = (3, 5, 7)
        for size in sizes:
            client.ask(size, rng)
        assert len(client.asked) == 3
        with pytest.raises(RuntimeError, match="asked"):
            client.refresh()
        got = [client.take() for _ in sizes]
        assert [len(b.indices) for b in got] == list(sizes)
        assert not client.asked and client.progress == 64
        for b in got:  # rows of shard s have ids s * 100 + slot
            assert np.array_equal(b.obs[:, 0].astype(np.int64), (b.indices >> SHIFT) * 100 + (b.indices & ((1 << SHIFT) - 1)))
        client.refresh()  # nothing asked: the STATS replies are the next on the sockets


def test_ask_refreshes_only_with_nothing_in_flight():
    """One rule for `ask` and `refresh`: with batches in flight the counts come from the totals the
    taken replies carried (no refresh, which would refuse); with nothing in flight an ask without
    totals refreshes them."""
    with two_uniform_shards() as client:
        rng = np.random.default_rng(0)
        client.ask(4, rng)  # nothing in flight, no totals yet: a refresh gives them
        assert client.totals.sum() > 0 and len(client.asked) == 1
        client.totals[:] = 0.0  # as if the replies taken so far had carried no mass
        with pytest.raises(ValueError, match="in flight"):
            client.ask(4, rng)
        assert len(client.take().indices) == 4  # its replies carry the shards' totals again
        assert client.totals.sum() > 0
        client.ask(5, rng)
        assert len(client.take().indices) == 5
        client.totals[:] = 0.0
        client.ask(6, rng)  # nothing in flight: refreshed, then asked
        assert len(client.take().indices) == 6 and client.progress == 64


def test_curve_allow_list_unknown_key_gets_nothing(tmp_path):
    _, server_secret = generate(tmp_path / "server", "server")
    good_public, good_secret = generate(tmp_path / "clients", "learner")
    _, bad_secret = generate(tmp_path / "strangers", "mallory")
    config = ServerConfig(table=TableConfig(kind="uniform", capacity=100), bind=LOOPBACK,
                          auth=AuthConfig(server_secret=str(server_secret), allow=[str(tmp_path / "clients")]))
    srv = ReplayServer(config).start()
    try:
        server_public = str(tmp_path / "server" / "server.key")
        good = ReplayClient(srv.address, ClientAuth(False, str(good_secret), server_public), writer=1, timeout=10)
        good.add(*rows(np.arange(10)))
        assert good.flush() == 1
        with pytest.raises(NoReply):  # a key not on the allow-list: the handshake is refused
            ReplayClient(srv.address, ClientAuth(False, str(bad_secret), server_public), timeout=1.5)
        with pytest.raises(NoReply):  # no key at all (plaintext) against a CURVE server
            ReplayClient(srv.address, ClientAuth(plaintext=True), timeout=1.5)
        stats = good.stats()  # the server kept serving the allowed peer
        assert stats["size"] == 10 and stats["rows_inserted"] == 10
        assert srv.refused_keys.refused >= 1
        good.close()
    finally:
        srv.stop()


@pytest.mark.slow
def test_server_embedded_in_a_ray_actor(monkeypatch):
    """The server runs inside a Ray actor (start() in the actor, loopback); clients outside use it."""
    ray = pytest.importorskip("ray")
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    # a Ray instance of its own, files apart: never join (or become "current" over) another one
    ray.init(address="local", num_cpus=1, include_dashboard=False, _node_ip_address="127.0.0.1",
             log_to_driver=False, _temp_dir="/tmp/ray-pearl-test-server")
    try:
        @ray.remote
        class Host:
            def start(self):
                from pearl.server.config import ServerConfig, TableConfig
                from pearl.server.server import ReplayServer

                self.server = ReplayServer(ServerConfig(table=TableConfig(kind="prioritized", capacity=1000),
                                                        bind=LOOPBACK)).start()
                return self.server.address

        host = Host.remote()
        address = ray.get(host.start.remote(), timeout=120)
        assert address.startswith("tcp://127.0.0.1:")
        client = ReplayClient(address, writer=1, timeout=20)
        client.add(*rows(np.arange(100)))
        client.flush()
        batch = client.sample(16)
        client.update_priorities(batch.indices, np.ones(16))
        assert client.sample(16).obs.shape == (16, 4) and client.stats()["size"] == 100
        client.close()
    finally:
        ray.shutdown()
