"""`pearl profile --ray` (pearl/runtime/ray_profile.py, estimator/profile.py) and what the ray model
makes of it (estimator/costs.py `ray_background`, pearl/schedule/models.py Ray): the tables
round-trip through the cache under their own version, the model charges Ray's processes at rest
against the shared cores, a napping agent's CPU per second, Ray's and the publishing thread's
work per publish and a waiting actor's CPU per second, and falls back to the platform's figures
without them; its chunks fill up to the runtime's own allowance. Fast: hand-made tables, no Ray; the slow test at the
end measures a real 2-node local cluster."""
from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest

from pearl.config import apply_overrides, default_config_path, load_config
from pearl.estimator import profile as prof
from pearl.estimator.costs import Costs
from pearl.estimator.model import Candidate, predict
from pearl.estimator.workload import workload_from_config
from pearl.platforms import load_platform
from pearl.schedule import grant_step

TABLES = {"act@cpu": {"8": 400.0}, "insert|uniform@cpu": {"8": 10.0, "256": 90.0},
          "sample|uniform@cpu": {"32": 25.0, "64": 40.0}, "learn|fused@cpu": {"64": 160.0},
          "sync_weights|fused@cpu": {"0": 5.0}, "overhead|round": {"0": 10.0}, "overhead|update": {"0": 8.0},
          "ring_write": {"8": 4.0}}
# 0.1 cores per node at rest, 0.05 cores per napping agent, 80 / 200 / 300 us per publish per agent
# in the agent / Ray's processes / the driver's publishing thread, a publish every 20 ms at most
RAY = {"ray|daemon": {"0": 1e5}, "ray|agent": {"0": 5e4}, "ray|publish|agent": {"0": 80.0},
       "ray|publish|ray": {"0": 200.0}, "ray|publish|driver": {"0": 300.0}, "ray|publish|interval": {"0": 2e4}}


def config():
    return apply_overrides(load_config(default_config_path()),
                           {"dqn.learning_starts": 200, "replay.capacity": 5000, "dqn.n_step": 1})


def on_ray(nodes=2, placement="learner", chunk=8):
    return Candidate("uniform", "cpu", "cpu", "fused", 8, 64, runtime="ray", actors=1, nodes=nodes,
                     placement=placement, shards=1, chunk=chunk)


class FakeRunner:
    def profile_runs(self, config, cands, seconds):
        return [({"act": 30.0 * c.envs, "insert": 5.0, "sample": 0.1 * c.batch, "learn": 2.0 * c.batch,
                  "sync_weights": 3.0},
                 {"rounds": 1000, "updates": 250, "wall_s": 0.5, "task_s": 0.45, "steps_per_s": 2000.0}) for c in cands]


def test_the_ray_tables_round_trip_through_the_cache_under_their_own_version(tmp_path, monkeypatch):
    monkeypatch.setenv("PEARL_CACHE_DIR", str(tmp_path / "cache"))
    asked = []

    def ray_us(n_params, log=None):  # pearl/runtime/ray_profile.py's, without a cluster
        asked.append(n_params)
        return RAY

    cfg = config()
    workload = workload_from_config(cfg)
    tables = prof.profile(cfg, envs=(8,), kernels=("fused",), ray=ray_us, runner=FakeRunner())
    assert asked == [workload.n_params] and all(tables[name] == RAY[name] for name in prof.RAY_TABLES)
    assert prof.profile(cfg, envs=(8,), kernels=("fused",), ray=ray_us, runner=SimpleNamespace()) == tables  # cached
    data = json.loads(prof.cache_path().read_text())
    data["workloads"][workload.key()]["ray_version"] = prof.RAY_VERSION + 1  # measured another way: dropped
    prof.cache_path().write_text(json.dumps(data))
    assert not any(name.startswith("ray|") for name in prof.load_cached(workload.key())["tables"])
    again = prof.profile(cfg, envs=(8,), kernels=("fused",), ray=ray_us, runner=SimpleNamespace())  # only Ray's again
    assert len(asked) == 2 and again == tables


def test_the_model_charges_the_measured_ray_costs():
    platform = load_platform("local_cluster")
    costs = Costs(platform, workload_from_config(config()), {**TABLES, **RAY})
    assert costs.ray_background() == pytest.approx({"daemon": 0.1, "agent": 0.05, "publish_agent": 80.0,
                                                    "publish_ray": 200.0, "publish_driver": 300.0,
                                                    "publish_interval": 2e4})
    for placement in ("learner", "server"):
        cand = on_ray(placement=placement)
        p = predict(cand, costs)
        n, total = cand.nodes, 1e6 / p.steps_per_s  # us per env step
        calls = p.step_us["ray"] / 200.0  # Ray's work per publish to an agent (and per grant)
        workload = workload_from_config(config())
        grants = 1.0 / grant_step(cand.to_plan(), workload.updates_per_step, workload.n_step) \
            if placement != "learner" else 0.0
        assert calls > grants  # the publishes to every agent, and the driver's grants
        parts = costs.ray_parts(cand, 8)  # chunks of 8 rows: one act round, whatever the rate
        # an agent: its passes' own work (no nap call: the measured loop has it), its chunks, the
        # publishes and grants it takes, and its process's 0.05 cores whatever the rate
        agent = n * parts["agent_rings"] * total / (2000.0 + parts["agent_pass"]) + parts["agent_chunk"] / 8 \
            + calls * 80.0 + n * 0.05 * total
        assert parts["agent_pass"] - parts["agent_rings"] == pytest.approx(platform.host.call_overhead_us)
        assert p.step_us["agent"] == pytest.approx(agent, rel=1e-4)
        if placement == "learner":  # no grants: Ray's work is the publishes', one per measured 20 ms
            assert p.step_us["ray"] == pytest.approx(n * 200.0 * total / 2e4, rel=1e-3)
        # a publish: sync_weights and a call to each agent at the publishing thread's 300 us
        assert p.call_us["publish"] == pytest.approx(5.0 + n * 300.0)
        # (an actor process waiting at its allowance is not charged: its back-off yields the core)
        assert "actor_wait" not in p.step_us
        if placement == "learner":  # every process on the 2 shared cores, less Ray's 3 nodes at rest
            busy = (p.sides["actors"] + p.sides["agents"]) * n + p.step_us["ray"] + p.sides["learner"]
            assert p.sides["cores"] == pytest.approx(busy / (2 - 3 * 0.1), rel=1e-3)
    # the same plan without the ray tables is faster: the model charged cores the tables measured
    assert predict(on_ray(), Costs(platform, workload_from_config(config()), TABLES)).steps_per_s > \
        predict(on_ray(), costs).steps_per_s


def test_without_the_ray_tables_the_platforms_figures_stand():
    platform = load_platform("local_cluster")
    costs = Costs(platform, workload_from_config(config()), TABLES)
    assert costs.ray_background() == {"daemon": platform.nodes.daemon_cores, "agent": None,
                                      "publish_agent": platform.nodes.ray_call_us, "publish_ray": 0.0,
                                      "publish_driver": platform.nodes.ray_call_us,
                                      "publish_interval": None}
    p = predict(on_ray(), costs)
    assert p.step_us["ray"] == 0.0
    assert p.call_us["publish"] == pytest.approx(5.0 + 2 * platform.nodes.ray_call_us)
    busy = (p.sides["actors"] + p.sides["agents"]) * 2 + p.sides["learner"]
    assert p.sides["cores"] == pytest.approx(busy / (2 - 3 * platform.nodes.daemon_cores), rel=1e-3)


def test_chunks_fill_up_to_the_runtimes_agent_allowance(monkeypatch):
    from pearl.runtime import ray as ray_runtime
    from pearl.schedule import agent_allowance, models

    assert ray_runtime.agent_allowance is agent_allowance  # one rule for the runtime and the model
    costs = Costs(load_platform("local_cluster"), workload_from_config(config()), {**TABLES, **RAY})
    cand = on_ray(placement="server", chunk=256)
    # an agent finds at most its actors' allowances in its rings: held to 3 rows, its chunks carry 3
    monkeypatch.setattr(models, "agent_allowance", lambda plan, u: 3)
    p = predict(cand, costs)
    assert p.step_us["insert"] == pytest.approx(costs.ray_parts(cand, 3)["insert"] / 3)


@pytest.mark.slow
def test_the_profiler_measures_a_local_cluster():
    pytest.importorskip("ray")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    from pearl.runtime.ray_profile import ray_us

    tables = ray_us(4866, nodes=2, seconds=1.0)
    assert set(tables) == set(prof.RAY_TABLES)
    for name, cells in tables.items():
        assert list(cells) == ["0"] and 0.0 <= cells["0"] < 2e6, (name, cells)  # below 2 cores (us per s)
    assert tables["ray|agent"]["0"] > 0.0  # a napping process costs something
