"""`server:tcp://HOST:PORT` as a device of the registry (kernels/server): a Plan puts the replay
tasks on a replay server (pearl/server) and the sequential and processes runtimes train through a
ReplayClient without knowing it: the same env steps, updates and replay ratio as with the local
table, every transition stored once. Every server binds 127.0.0.1 on an ephemeral port."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("zmq")

import pearl  # noqa: E402
from pearl.errors import ConfigError  # noqa: E402
from pearl.kernels.registry import DeviceId, backend, parse_device  # noqa: E402
from pearl.kernels.server import backend as server_backend  # noqa: E402
from pearl.plan import Plan, ServerAccess  # noqa: E402
from pearl.server.config import AuthConfig, ServerConfig, TableConfig  # noqa: E402
from pearl.server.server import ReplayServer  # noqa: E402

FAST = dict(total_steps=3000, learning_starts=300, target_update_interval=200, hidden=[16, 16], batch_size=32)
REPLAY_TASKS = ("insert", "sample", "update_priorities")


def on_server(address: str, runtime="sequential", **plan) -> Plan:
    return Plan(devices={task: f"server:{address}" for task in REPLAY_TASKS}, runtime=runtime,
                server=ServerAccess(plaintext=True), **plan)


@pytest.fixture
def server():
    servers = []

    def start(kind="uniform", auth=None, **table):
        config = ServerConfig(table=TableConfig(kind=kind, capacity=100_000, **table), bind="tcp://127.0.0.1:0",
                              auth=auth or AuthConfig(plaintext=True))
        servers.append(ReplayServer(config).start())
        return servers[-1]

    yield start
    for srv in servers:
        srv.stop()


def test_server_device_ids_parse_and_refuse_in_one_line():
    device = parse_device("server:tcp://127.0.0.1:5555")
    assert device == DeviceId("server", 0, "", "tcp://127.0.0.1:5555")
    assert str(device) == "server:tcp://127.0.0.1:5555"
    for text in ("server:", "server", "server:127.0.0.1:5555", "server:tcp://127.0.0.1:99999", "server:tcp://:1"):
        with pytest.raises(ConfigError) as err:
            backend("server").check(parse_device(text, "plan.devices.sample"), None, "plan.devices.sample")
        assert str(err.value).startswith("plan.devices.sample: ") and "\n" not in str(err.value)


def test_only_replay_tasks_go_to_a_server():
    with pytest.raises(ConfigError, match=r"plan.devices.learn: server:tcp://127.0.0.1:1 is a replay server"):
        pearl.DQN("CartPole-v1", plan=Plan(devices={"learn": "server:tcp://127.0.0.1:1"},
                                           server=ServerAccess(plaintext=True)))
    with pytest.raises(ConfigError, match=r"plan.server: .*client_secret and server_public"):
        Plan(devices={task: "server:tcp://127.0.0.1:1" for task in REPLAY_TASKS}).check()


def test_no_server_or_a_different_table_is_one_line(server, monkeypatch):
    monkeypatch.setattr(server_backend, "CONNECT_TIMEOUT_S", 1.0)
    with pytest.raises(ConfigError, match="no replay server answered at tcp://127.0.0.1:1 within 1 s"):
        pearl.DQN("CartPole-v1", plan=on_server("tcp://127.0.0.1:1"), **FAST)
    srv = server(kind="prioritized")
    with pytest.raises(ConfigError, match="holds prioritized replay.*needs uniform replay"):
        pearl.DQN("CartPole-v1", plan=on_server(srv.address), **FAST)
    srv = server(obs_dim=3)
    with pytest.raises(ConfigError, match=r"obs float32\[3\].*obs float32\[4\]"):
        pearl.DQN("CartPole-v1", plan=on_server(srv.address), **FAST)


@pytest.mark.parametrize("runtime,replay", [("sequential", "prioritized"), ("processes", "uniform")])
def test_training_on_a_server_keeps_the_local_tables_counts(server, runtime, replay):
    srv = server(kind=replay)
    actors = 2 if runtime == "processes" else 1
    remote = pearl.DQN("CartPole-v1", plan=on_server(srv.address, runtime, actors=actors), replay=replay, **FAST)
    local = pearl.DQN("CartPole-v1", plan=Plan(runtime=runtime, actors=actors), replay=replay, **FAST)
    assert type(remote.replay).__name__ == "ReplayClient"
    remote.train(2000)
    local.train(2000)
    remote.replay.flush_updates()
    assert (remote.env_steps, remote.updates) == (local.env_steps, local.updates)
    assert remote.updates == int((remote.env_steps - 300) * 0.25)  # the ratio, exact at the end
    stats = remote.replay.stats()
    table = srv.service.table
    # 1-step transitions: one per env step, each stored once (CartPole's float states are unique)
    assert stats["rows_inserted"] == table.size == local.replay.inserted == remote.env_steps
    stored = table.storage["obs"][:table.size]
    assert len(np.unique(stored, axis=0)) == len(stored)
    assert stats["samples"] == remote.updates  # one sample request per update
    if replay == "prioritized":  # |TD| reached the server's tree (piggybacked on the next sample)
        assert len(np.unique(table.tree.get(np.arange(table.size)))) > 100


def test_curve_keys_from_the_plan(server, tmp_path, monkeypatch):
    monkeypatch.setattr(server_backend, "CONNECT_TIMEOUT_S", 1.0)
    from pearl.server.keys import generate

    server_public, server_secret = generate(tmp_path / "keys", "server")
    client_public, client_secret = generate(tmp_path / "clients", "learner")
    srv = server(auth=AuthConfig(server_secret=str(server_secret), allow=[str(tmp_path / "clients")]))
    plan = Plan(devices={task: f"server:{srv.address}" for task in REPLAY_TASKS},
                server=ServerAccess(client_secret=str(client_secret), server_public=str(server_public)))
    agent = pearl.DQN("CartPole-v1", plan=plan, **FAST)
    agent.train(400)
    assert srv.service.table.size == 400 and agent.updates == 25
    stranger_public, stranger_secret = generate(tmp_path / "others", "stranger")
    plan.server = ServerAccess(client_secret=str(stranger_secret), server_public=str(server_public))
    with pytest.raises(ConfigError, match="no replay server answered"):
        pearl.DQN("CartPole-v1", plan=plan, **FAST)


def test_the_estimator_prices_replay_on_a_server_over_the_wire():
    from types import SimpleNamespace

    from pearl.estimator import wire
    from pearl.estimator.costs import Costs
    from pearl.estimator.model import Candidate, predict
    from pearl.estimator.workload import Workload
    from pearl.platforms import load_platform

    workload = Workload("CartPole-v1", 4, 2, (64, 64), "prioritized", 100_000, 16, 0.25, 1000)
    platform = load_platform("ci_2core")
    local = Candidate("prioritized", "cpu", "cpu", "fused", envs=8, batch=64)
    remote = Candidate("prioritized", "server:tcp://127.0.0.1:5555", "cpu", "fused", envs=8, batch=64)
    costs = Costs(platform, workload)
    near, far = predict(local, costs), predict(remote, costs)
    assert {far.sources[t] for t in REPLAY_TASKS} == {"wire"}
    # a sample is the cpu table's own work + a round trip + the server's handling + the batch's bytes
    round_trip = 2 * wire.LOOPBACK_LATENCY_US + wire.SERVER_REQUEST_US
    assert far.call_us["sample"] > near.call_us["sample"] + round_trip
    assert far.steps_per_s < near.steps_per_s
    assert all("server" not in key for key in far.device_w)  # its power is not this platform's
    # a slower link costs more: latency + bytes / bandwidth per message
    slow = SimpleNamespace(host=platform.host, link=lambda a, b: SimpleNamespace(latency_us=1000.0, bandwidth_gb_s=0.1))
    seconds = wire.task_seconds("sample", remote, Costs(slow, workload))
    fast = wire.task_seconds("sample", remote, costs)
    batch_bytes = 64 * (workload.transition_bytes + 16)
    expected = 2 * (1000 - wire.LOOPBACK_LATENCY_US) * 1e-6 + batch_bytes / 0.1e9 - batch_bytes / (
        wire.LOOPBACK_BANDWIDTH_GB_S * 1e9)
    assert seconds - fast == pytest.approx(expected, rel=1e-9)


def test_a_hosting_learner_samples_in_process_and_frees_the_writers_credit():
    """ReplayService.sample_here (the ray runtime's learner): the server's ratio without the
    socket; the credit it frees reaches a waiting writer through the server thread (wake)."""
    import threading
    import time

    from pearl.server.client import ReplayClient
    from pearl.server.config import RatioConfig

    config = ServerConfig(table=TableConfig(capacity=1000), bind="tcp://127.0.0.1:0",
                          ratio=RatioConfig(updates_per_step=1.0, learning_starts=0, max_lag=4))
    srv = ReplayServer(config).start()
    service, updates = srv.service, 0
    try:
        writer = ReplayClient(srv.address, writer=7)

        def write():
            for chunk in range(10):
                ids = np.arange(4 * chunk, 4 * chunk + 4, dtype=np.float32)
                obs = np.repeat(ids[:, None], 4, axis=1)
                writer.add(obs, np.zeros(4, np.int64), ids, obs, np.ones(4, np.float32))
            writer.flush()

        thread = threading.Thread(target=write)
        thread.start()
        deadline = time.monotonic() + 30
        while updates < 40 and time.monotonic() < deadline:
            with srv.lock:
                batch = service.sample_here(2)
            if service.outbox:
                srv.wake()
            if batch is None:
                time.sleep(0.001)
                continue
            assert batch.obs.shape == (2, 4)
            updates += 1
        thread.join(10)
        assert not thread.is_alive() and updates == 40  # the writer could only finish on freed credit
        assert service.env_steps == 40 and service.updates == 40 and service.max_lag_seen <= 4
        with srv.lock:
            assert service.sample_here(2) is None  # nothing more is due
        writer.close()
    finally:
        srv.stop()


def test_a_model_saved_without_its_replay_is_refused_on_a_server_in_one_line(server, tmp_path):
    """A table on a replay server keeps a ratio of its own: it cannot restart apart from the run's
    counts, so a file saved without the replay contents (or a buffer file of its own) is refused."""
    from pearl.errors import PearlError

    srv = server()
    agent = pearl.DQN("CartPole-v1", **FAST)
    agent.train(400)
    agent.save(tmp_path / "model", exclude=["replay_buffer"])
    agent.save_replay_buffer(tmp_path / "buffer")
    with pytest.raises(PearlError, match="model.npz: saved without its replay contents, which a replay server"):
        pearl.load(tmp_path / "model", plan=on_server(srv.address))
    restarted = pearl.load(tmp_path / "model")
    restarted.train(400, run_dir=tmp_path / "run")
    with pytest.raises(PearlError, match="checkpoint.npz: a run whose replay restarted"):
        pearl.load(tmp_path / "run", plan=on_server(srv.address))
    served = pearl.DQN("CartPole-v1", **FAST, plan=on_server(srv.address))
    with pytest.raises(ConfigError, match="buffer.npz: a replay server's or a ray run's table is not loaded"):
        served.load_replay_buffer(tmp_path / "buffer")
