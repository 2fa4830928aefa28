"""The estimator's model of `runtime: ray` plans (pearl/schedule/models.py Ray, estimator/wire.py,
estimator/costs.py `ray_parts`), the platforms' `nodes:` section and the mapper's ray plans. Fast:
hand-made profile tables, no Ray; the slow test at the end trains autotune's top ray plan on a
local cluster (skipped without the `ray` extra)."""
from __future__ import annotations

import os

import pytest

from pearl.config import apply_overrides, default_config_path, load_config
from pearl.errors import ConfigError
from pearl.estimator.costs import Costs
from pearl.estimator.model import Candidate, predict
from pearl.estimator.workload import workload_from_config
from pearl.platforms import load_platform

# A profile of a workload whose actors are slow next to its learner (act: 400 us per env step on
# one core; the learner's update 200 us at 0.25 updates per env step): nodes pay until the learner
# saturates. One figure per table (the sizes the plans below use), so every figure is "measured".
TABLES = {"act@cpu": {"8": 3200.0}, "insert|uniform@cpu": {"8": 10.0, "256": 90.0},
          "sample|uniform@cpu": {"32": 25.0, "64": 40.0}, "learn|fused@cpu": {"32": 100.0, "64": 160.0},
          "sync_weights|fused@cpu": {"0": 5.0}, "overhead|round": {"0": 10.0}, "overhead|update": {"0": 8.0},
          "ring_write": {"8": 4.0}}

CLUSTER = """
name: test_cluster
devices:
  - {id: cpu, kind: cpu, name: test host, cores: 8, clock_mhz: 2600, peak_gflops: 800, memory_bandwidth_gb_s: 50,
     call_overhead_us: 5.0, power_w: {idle: 10, tdp: 100}}
nodes:
  count: 64
  cores: 2
  link: {kind: 25gbe, bandwidth_gb_s: 3.125, latency_us: 20}
  ray_call_us: 100
  ray_put_us: 100
  ray_wait_us: 20
  ray_publish_us: 1000
"""


def config():
    return apply_overrides(load_config(default_config_path()), {"dqn.n_step": 1})


def cluster(tmp_path, text=CLUSTER):
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    return load_platform(path)


def on_ray(nodes=1, placement="learner", shards=1, chunk=256, actors=1, envs=8, batch=64, kind="uniform"):
    return Candidate(kind, "cpu", "cpu", "fused", envs, batch, runtime="ray", actors=actors, nodes=nodes,
                     placement=placement, shards=shards, chunk=chunk)


def test_more_nodes_raise_throughput_until_the_learner_saturates(tmp_path):
    costs = Costs(cluster(tmp_path), workload_from_config(config()), TABLES)
    ladder = [predict(on_ray(n), costs) for n in (1, 2, 4, 8, 16, 32, 64)]
    assert ladder[0].limiting_side == "actors" and ladder[-1].limiting_side == "learner"
    actor_bound = [p for p in ladder if p.limiting_side == "actors"]
    learner_bound = [p for p in ladder if p.limiting_side == "learner"]
    assert len(actor_bound) >= 2 and len(actor_bound) + len(learner_bound) == len(ladder)
    for before, after in zip(actor_bound, actor_bound[1:]):
        assert after.steps_per_s > 1.5 * before.steps_per_s  # twice the nodes: nearly twice the steps
    # past the learner's saturation more nodes add nothing: the driver's publishes to every agent
    # only lengthen its line
    for before, after in zip(learner_bound, learner_bound[1:]):
        assert after.steps_per_s <= 1.001 * before.steps_per_s
        assert after.step_us["publish"] * after.steps_per_s > before.step_us["publish"] * before.steps_per_s


def test_the_wire_placements_wait_on_the_wire_unless_the_learner_asks_ahead(tmp_path):
    costs = Costs(cluster(tmp_path), workload_from_config(config()), TABLES)
    for kind in ("prioritized", "uniform"):
        inside = predict(on_ray(16, chunk=8, kind=kind), costs)
        for placement, shards in (("server", 1), ("server", 2), ("node", 1)):
            remote = predict(on_ray(16, placement, shards, chunk=8, kind=kind), costs)
            if kind == "prioritized":  # a round trip per update: two messages and the shards' handling
                assert remote.steps_per_s < inside.steps_per_s, placement
                assert remote.step_us["sample"] > inside.step_us["sample"] + 0.25 * 2 * 20
            else:  # SAMPLES_AHEAD batches asked for while it learns, and the chunks off its thread
                assert remote.sides["learner"] < inside.sides["learner"], placement
    assert "server" in predict(on_ray(16, "server", chunk=8), costs).sides


def test_the_prediction_uses_the_profiles_figures_when_present(tmp_path):
    platform = cluster(tmp_path)
    measured = predict(on_ray(64), Costs(platform, workload_from_config(config()), TABLES))
    assert measured.sources["learn"] == measured.sources["act"] == "measured"
    slower = {**TABLES, "learn|fused@cpu": {"32": 200.0, "64": 320.0}}
    twice = predict(on_ray(64), Costs(platform, workload_from_config(config()), slower))
    assert measured.limiting_side == twice.limiting_side == "learner"
    # the learner's line (its publishes aside, which follow the step) grows by u x (320 - 160) us per env step
    grown = (twice.sides["learner"] - twice.step_us["publish"]) - (measured.sides["learner"] - measured.step_us["publish"])
    assert grown == pytest.approx(0.25 * 160, rel=0.01)
    analytic = predict(on_ray(64), Costs(platform, workload_from_config(config())))
    assert analytic.sources["learn"] == "analytic" and analytic.steps_per_s != measured.steps_per_s


def test_a_local_cluster_shares_the_hosts_cores(tmp_path):
    """platforms/local_cluster.yaml: every node on the 2-core host, so nodes beyond the cores add
    processes, not cores; the Ray figures and daemons are the platform's."""
    platform = load_platform("local_cluster")
    assert platform.nodes.shared_cores == 2 and platform.nodes.count >= 3
    costs = Costs(platform, workload_from_config(config()), TABLES)
    one, three = predict(on_ray(1), costs), predict(on_ray(3), costs)
    assert "cores" in three.sides and three.steps_per_s < 2.2 * one.steps_per_s
    busy = sum(three.sides[k] * v for k, v in (("actors", 3), ("agents", 3)))  # the nodes' work per env step
    assert three.sides["cores"] >= busy / 2
    slow_calls = cluster(tmp_path, CLUSTER.replace("ray_call_us: 100", "ray_call_us: 400"))
    fast = predict(on_ray(64), Costs(cluster(tmp_path), workload_from_config(config()), TABLES))
    assert predict(on_ray(64), Costs(slow_calls, workload_from_config(config()), TABLES)).steps_per_s < fast.steps_per_s


def test_a_plan_the_cluster_cannot_hold_is_one_line(tmp_path):
    costs = Costs(load_platform("local_cluster"), workload_from_config(config()), TABLES)
    with pytest.raises(ConfigError, match=r"^plan.ray.nodes: .* needs 4 nodes, .* has 3$"):
        predict(on_ray(3, "node"), costs)
    with pytest.raises(ConfigError, match=r"nodes: missing \(a ray plan needs a platform with a nodes: section"):
        predict(on_ray(1), Costs(load_platform("ci_2core"), workload_from_config(config()), TABLES))


@pytest.mark.parametrize("change,field", [
    (("count: 64", "count: 0"), "nodes.count: expected an integer >= 1"),
    (("cores: 2\n", "cores: -2\n"), "nodes.cores: expected an integer >= 1"),
    (("count: 64", "count: 64\n  shared_cores: two"), "nodes.shared_cores: expected an integer >= 1"),
    (("count: 64", "count: 64\n  gpus: 1"), "nodes.gpus: unknown key"),
    (("bandwidth_gb_s: 3.125, ", ""), "nodes.link.bandwidth_gb_s: missing"),
    (("  ray_call_us: 100\n", ""), "nodes.ray_call_us: missing"),
    (("ray_publish_us: 1000", "ray_publish_us: .nan"), "nodes.ray_publish_us: expected a positive number"),
])
def test_bad_nodes_fields_are_one_line(tmp_path, change, field):
    with pytest.raises(ConfigError) as err:
        cluster(tmp_path, CLUSTER.replace(*change))
    assert field in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_autotune_searches_ray_plans_on_a_platform_with_nodes(tmp_path, monkeypatch):
    from pearl.estimator.mapper import candidates
    from pearl.estimator.tune import autotune

    monkeypatch.setenv("PEARL_CACHE_DIR", str(tmp_path / "cache"))
    result = autotune(config(), platform="local_cluster", envs=[8])  # sequential and, with nodes, ray
    ray = [p.candidate for p in result.ranking.predictions if p.candidate.runtime == "ray"]
    assert {c.nodes for c in ray} == {1, 2, 3} and {c.chunk for c in ray} == {64, 256}
    assert {(c.placement, c.shards) for c in ray} == {("learner", 1), ("server", 1), ("server", 2), ("node", 1)}
    assert all(c.nodes + 1 <= 3 for c in ray if c.placement == "node")
    assert {p.candidate.runtime for p in result.ranking.predictions} == {"sequential", "ray"}
    best = next(p.candidate for p in result.ranking.predictions if p.candidate.runtime == "ray")
    plan = best.to_plan()
    plan.check()
    assert (plan.runtime, plan.ray.nodes, plan.ray.replay, plan.ray.shards, plan.ray.chunk) == (
        "ray", best.nodes, best.placement, best.shards, best.chunk)
    with pytest.raises(ConfigError, match="--runtimes: ray plans need a platform with a nodes: section"):
        candidates(load_platform("ci_2core"), workload_from_config(config()), runtimes=("ray",))


def test_pearl_autotune_runtimes_ray_writes_a_ray_plan(tmp_path, monkeypatch, capsys):
    from pearl.cli import main
    from pearl.plan import load_plan

    monkeypatch.setenv("PEARL_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "plan.yaml"
    assert main(["autotune", "--platform", "local_cluster", "--runtimes", "ray", "--envs", "8", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert " ray " in text and "chosen:" in text
    plan = load_plan(out)
    assert plan.runtime == "ray" and 1 <= plan.ray.nodes <= 3


@pytest.mark.slow
def test_autotunes_top_ray_plan_on_the_local_cluster_profile_trains(tmp_path, monkeypatch):
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    ray = pytest.importorskip("ray")
    pytest.importorskip("zmq")
    from ray.cluster_utils import Cluster

    import pearl
    from pearl.estimator.tune import autotune

    monkeypatch.setenv("PEARL_CACHE_DIR", str(tmp_path / "cache"))
    small = apply_overrides(config(), {"total_steps": 4000, "dqn.learning_starts": 300, "dqn.hidden": [16, 16]})
    result = autotune(small, platform="local_cluster", runtimes=("ray",), envs=[2, 8], use_profile=False)
    best = result.best.candidate
    assert best.runtime == "ray"
    store = 100 * 2**20
    cluster_ = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "node_ip_address": "127.0.0.1",
                                                             "object_store_memory": store, "include_dashboard": False})
    try:
        for _ in range(load_platform("local_cluster").nodes.count - 1):
            cluster_.add_node(num_cpus=1, node_ip_address="127.0.0.1", object_store_memory=store)
        ray.init(address=cluster_.address, _node_ip_address="127.0.0.1", log_to_driver=False)
        agent = pearl.make_agent(small, result.plan)
        agent.train()
    finally:
        ray.shutdown()
        cluster_.shutdown()
    assert agent.env_steps >= 4000 and agent.updates == agent.parts.schedule.due(agent.env_steps)
