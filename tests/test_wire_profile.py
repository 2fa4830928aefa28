"""The replay wire measured by `pearl profile --wire` (pearl/measure.py wire_us, estimator/profile.py)
and read by the estimator's wire model (estimator/wire.py, estimator/costs.py ray_parts): the
tables round-trip through the cache under their own version, the prediction of a plan moves with
the measured link and says where its wire came from, a bad profile file is refused in one line,
and the measurement itself runs the real server and clients on loopback."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from pearl.config import apply_overrides, default_config_path, load_config
from pearl.errors import ConfigError
from pearl.estimator import profile as prof
from pearl.estimator import wire
from pearl.estimator.costs import Costs
from pearl.estimator.model import Candidate, predict
from pearl.estimator.workload import workload_from_config
from pearl.platforms import load_platform

TASKS = {"act@cpu": {"8": 400.0}, "insert|uniform@cpu": {"8": 10.0, "256": 90.0},
         "sample|uniform@cpu": {"16": 20.0, "32": 25.0, "64": 40.0}, "learn|fused@cpu": {"64": 160.0},
         "sync_weights|fused@cpu": {"0": 5.0}, "overhead|round": {"0": 10.0}, "overhead|update": {"0": 8.0},
         "ring_write": {"8": 4.0}}


def wire_tables(scale: float = 1.0, kind: str = "uniform") -> dict:
    """A measured wire: a round trip of 150 us (+ rows), the client's 40 us, the server's 60 us."""
    sizes = {"insert": (8, 32, 256), "sample": (16, 32, 64)}
    base = {"rtt": 150.0, "client": 40.0, "server": 60.0}
    return {wire.table_name(task, kind, part): {str(n): scale * (us + 0.1 * n) for n in sizes[task]}
            for task in wire.WIRE_TASKS for part, us in base.items()}


def config(**overrides):
    return apply_overrides(load_config(default_config_path()),
                           {"dqn.learning_starts": 200, "replay.capacity": 5000, "dqn.n_step": 1,
                            "replay.kind": "uniform", **overrides})


class FakeRunner:
    """Fixed task figures; a wire `scale` x wire_tables(); records what it was asked."""

    def __init__(self, scale: float = 1.0):
        self.scale, self.wire_asked, self.runs = scale, [], 0

    def profile_runs(self, config, cands, seconds):
        self.runs += 1
        return [({"act": 30.0 * c.envs, "insert": 5.0, "sample": 0.1 * c.batch, "learn": 2.0 * c.batch,
                  "sync_weights": 3.0},
                 {"rounds": 1000, "updates": 250, "wall_s": 0.5, "task_s": 0.45, "steps_per_s": 2000.0}) for c in cands]

    def wire_us(self, config, kinds, rows, batches):
        self.wire_asked.append((tuple(kinds), tuple(rows), tuple(batches)))
        tables = {}
        for kind in kinds:
            tables.update(wire_tables(self.scale, kind))
        return tables


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PEARL_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def on_ray(placement="server", shards=1, nodes=2, chunk=256):
    return Candidate("uniform", "cpu", "cpu", "fused", 8, 64, runtime="ray", actors=1, nodes=nodes,
                     placement=placement, shards=shards, chunk=chunk)


def test_the_wire_tables_round_trip_through_the_cache_under_their_own_version(cache):
    cfg = config()
    runner = FakeRunner()
    tables = prof.profile(cfg, envs=(1, 8), kernels=("fused",), wire=True, runner=runner)
    # the sharded client asks each shard batch / shards rows: the batch and its shares of 2 and 4
    assert runner.wire_asked == [(("uniform",), prof.WIRE_ROWS, (16, 32, 64))]
    assert tables[wire.table_name("sample", "uniform", "rtt")]["64"] == pytest.approx(156.4)
    key = workload_from_config(cfg).key()
    entry = json.loads(prof.cache_path().read_text())["workloads"][key]
    assert entry["wire_version"] == prof.WIRE_VERSION and prof.load_cached(key)["tables"] == tables
    # cached: nothing measured again
    assert prof.profile(cfg, envs=(1, 8), kernels=("fused",), wire=True, runner=SimpleNamespace()) == tables
    # a wire measured another way (another version) is dropped on load, the task tables kept; asked
    # for, only the wire is measured again
    data = json.loads(prof.cache_path().read_text())
    data["workloads"][key]["wire_version"] = prof.WIRE_VERSION + 1
    prof.cache_path().write_text(json.dumps(data))
    stale = prof.load_cached(key)["tables"]
    assert not any(name.startswith("wire|") for name in stale) and stale["act@cpu"] == tables["act@cpu"]
    again = FakeRunner(scale=2.0)
    tables2 = prof.profile(cfg, envs=(1, 8), kernels=("fused",), wire=True, runner=again)
    assert again.runs == 0 and len(again.wire_asked) == 1
    assert tables2[wire.table_name("sample", "uniform", "rtt")]["64"] == pytest.approx(2 * 156.4)
    assert prof.load_cached(key)["tables"] == tables2


def test_the_estimator_reads_the_measured_wire_and_says_so():
    workload = workload_from_config(config())
    platform = load_platform("local_cluster")
    constants = Costs(platform, workload, dict(TASKS))
    fast, slow = (Costs(platform, workload, {**TASKS, **wire_tables(scale)}) for scale in (1.0, 3.0))
    for cand in (on_ray("server"), on_ray("server", shards=2), on_ray("node")):
        quick, sluggish, old = (predict(cand, c) for c in (fast, slow, constants))
        # a slower measured link (round trip, client and server CPU) makes the plan slower
        assert sluggish.steps_per_s < quick.steps_per_s
        assert quick.sources["server_requests"] == "measured" and old.sources["server_requests"] == "wire"
        assert quick.steps_per_s != pytest.approx(old.steps_per_s, rel=1e-3)
    # the parts: the sample a wait of the measured round trip, the shard its measured CPU
    parts = fast.ray_parts(on_ray("server"), 8)
    assert parts["sample_wait"] == pytest.approx(150.0 + 6.4)
    assert parts["shard_update"] == pytest.approx(60.0 + 6.4)
    assert parts["sample_client"] == pytest.approx(40.0 + 6.4)
    # the server's handling of a chunk: its measured CPU less the table's own insert
    assert parts["insert"] + parts["request"] == pytest.approx(60.0 + 0.8)
    two = fast.ray_parts(on_ray("server", shards=2), 8)  # two shards of 32 rows asked at once
    assert two["sample_wait"] == pytest.approx(150.0 + 3.2 + (40.0 + 3.2))
    assert two["sample_client"] == pytest.approx(2 * (40.0 + 3.2))
    # in the learner's process, the agents' chunks still cost the measured server and client CPU
    learner = predict(on_ray("learner"), slow)
    assert learner.steps_per_s < predict(on_ray("learner"), fast).steps_per_s


def test_a_replay_server_device_costs_the_measured_round_trip():
    workload = workload_from_config(config())
    costs = Costs(load_platform("ci_2core"), workload, wire_tables())
    remote = Candidate("uniform", "server:tcp://127.0.0.1:5555", "cpu", "fused", 8, 64)
    assert costs.task_seconds("sample", remote) == (pytest.approx((150.0 + 6.4) * 1e-6), "wire")
    assert costs.task_seconds("insert", remote)[0] == pytest.approx((150.0 + 0.8) * 1e-6)
    without = Costs(load_platform("ci_2core"), workload).task_seconds("sample", remote)[0]
    assert without != pytest.approx((150.0 + 6.4) * 1e-6)


@pytest.mark.parametrize("cells", [{"8": "fast"}, {"8": -1.0}, {"8": float("nan")}, {"eight": 3.0}, {}, [1, 2]])
def test_a_bad_profile_file_is_refused_in_one_line(cache, cells, capsys):
    cfg = load_config(default_config_path())
    key = workload_from_config(cfg).key()
    tables = {**TASKS, **wire_tables()}
    tables[wire.table_name("insert", "uniform", "rtt")] = cells
    prof.cache_path().parent.mkdir(parents=True)
    prof.cache_path().write_text(json.dumps({"version": prof.PROFILE_VERSION, "workloads": {
        key: {"tables": tables, "wire_version": prof.WIRE_VERSION}}}))
    with pytest.raises(ConfigError, match=r"profile-.*\.json: table 'wire\|insert\|uniform\|rtt'") as error:
        prof.load_cached(key)
    assert "\n" not in str(error.value)
    from pearl.cli import main

    assert main(["profile", "--wire", "--replays", "uniform"]) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "wire|insert|uniform|rtt" in err and "Traceback" not in err


def test_the_wire_is_measured_through_the_runtimes_server_on_loopback(monkeypatch):
    from pearl import measure

    monkeypatch.setattr(measure, "WIRE_CALLS", 20)  # bounded: 20 calls x 1 repeat per size
    monkeypatch.setattr(measure, "WIRE_REPEATS", 1)
    from pearl.server import client as client_module

    addresses, connect = [], client_module.Connection.connect

    def recorded(self):
        addresses.append(self.address)
        connect(self)

    monkeypatch.setattr(client_module.Connection, "connect", recorded)
    tables = measure.wire_us(config(), ["uniform", "prioritized"], (8, 64), (16, 32))
    # every connection went to the server process on loopback
    assert addresses and all(a.startswith("tcp://127.0.0.1:") for a in addresses), addresses
    for kind in ("uniform", "prioritized"):
        for task, sizes in (("insert", {"8", "64"}), ("sample", {"16", "32"})):
            for part in wire.WIRE_PARTS:
                cells = tables[wire.table_name(task, kind, part)]
                assert set(cells) == sizes and all(us > 0 for us in cells.values()), (task, kind, part)
            rtt, client = (tables[wire.table_name(task, kind, p)] for p in ("rtt", "client"))
            # the caller waits at least for its own CPU (a median against a mean: some slack)
            assert all(rtt[n] > 0.5 * client[n] for n in sizes)
    assert wire.source(tables, "uniform") == wire.source(tables, "prioritized") == "measured"


def test_a_small_credit_window_costs_a_credit_cycle_per_window():
    workload = workload_from_config(config())
    platform = load_platform("local_cluster")
    fast, slow = (Costs(platform, workload, {**TASKS, **wire_tables(scale)}) for scale in (1.0, 3.0))
    small, large = predict(on_ray("learner", chunk=32), fast), predict(on_ray("learner", chunk=256), fast)
    # the agents' window: MAX_LAG plus the chunks' credit (20 updates for chunks of 32 rows, 132 for
    # 256), in env steps at 0.25 updates a step
    from pearl.schedule import AGENT_NAP_S, MAX_LAG

    window_small, window_large = ((MAX_LAG["processes"] + credit) / 0.25 for credit in (20, 132))
    rtt = 150.0 + 0.1 * 8  # a chunk of one 8-env act round: the rows arriving per pass here
    assert small.step_us["credit_wait"] == pytest.approx((AGENT_NAP_S * 1e6 + 2 * rtt) / window_small, rel=0.05)
    assert large.step_us["credit_wait"] == pytest.approx(small.step_us["credit_wait"] * window_small / window_large,
                                                         rel=0.05)
    assert small.steps_per_s < large.steps_per_s
    # a slower measured link makes each credit cycle longer
    assert predict(on_ray("learner", chunk=32), slow).step_us["credit_wait"] > small.step_us["credit_wait"]
    # the remote placements keep no credit of their own (the driver grants): no such term
    assert "credit_wait" not in predict(on_ray("server"), fast).step_us
