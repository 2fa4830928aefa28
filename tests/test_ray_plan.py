"""A ray plan (pearl/plan.py RayPlan) is checked like every plan field, and `pearl train
--address` asks for one; the server's lag bound for a ray run (pearl/runtime/ray.py lag_bound).
Fast: no Ray needed."""
from __future__ import annotations

import pytest

from pearl.cli import main
from pearl.errors import ConfigError
from pearl.plan import Plan, RayPlan
from pearl.runtime.ray import lag_bound
from pearl.schedule import MAX_LAG


@pytest.mark.parametrize("ray_plan,field", [(RayPlan(nodes=0), "plan.ray.nodes"), (RayPlan(chunk=0), "plan.ray.chunk"),
                                            (RayPlan(window=0), "plan.ray.window"),
                                            (RayPlan(shards=0), "plan.ray.shards"),
                                            (RayPlan(max_restarts=-1), "plan.ray.max_restarts")])
def test_bad_ray_plans_are_one_line(ray_plan, field):
    with pytest.raises(ConfigError) as err:
        Plan(runtime="ray", ray=ray_plan).check()
    assert str(err.value).startswith(field + ": ") and "\n" not in str(err.value)


def test_ray_plans_run_several_actors_and_read_from_yaml(tmp_path):
    plan = Plan.from_yaml("plan: {runtime: ray, actors: 3, ray: {nodes: 2, chunk: 128, address: auto}}")
    assert (plan.actors, plan.ray.nodes, plan.ray.chunk, plan.ray.address) == (3, 2, 128, "auto")
    with pytest.raises(ConfigError, match=r"plan.ray.replicas: unknown key"):
        Plan.from_yaml("plan: {runtime: ray, ray: {replicas: 2}}")
    with pytest.raises(ConfigError, match=r"plan.ray.shards: 2 shards need replay: server or node"):
        Plan.from_yaml("plan: {runtime: ray, ray: {shards: 2}}").check()
    sharded = Plan.from_yaml("plan: {runtime: ray, ray: {replay: node, shards: 2}}")
    assert (sharded.ray.replay, sharded.ray.shards) == ("node", 2)


def test_address_needs_a_ray_plan(capsys):
    assert main(["train", "--address", "auto", "--steps", "100"]) == 2
    assert "--address: joins a Ray cluster for runtime: ray" in capsys.readouterr().err


def test_lag_bound_holds_one_chunk_of_credit_per_node():
    plan = Plan(runtime="ray", actors=2, envs_per_actor=4, ray=RayPlan(nodes=3, chunk=100))
    assert lag_bound(plan, 0.25, 3) == MAX_LAG["processes"] + 3 * 31  # ceil(0.25 x (100 + 3 x 4 x 2))
