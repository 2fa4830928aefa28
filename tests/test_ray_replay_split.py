"""The ray runtime's remote replay shards hold the run's one table (pearl/runtime/ray_replay.py):
dealing a table out to S shards and gathering it back keeps every row once, its priority with it,
the counts and, oldest rows first, the order in which rows are overwritten. No Ray needed."""
from __future__ import annotations

import numpy as np
import pytest

from pearl.config import ReplayConfig
from pearl.replay import make_replay
from pearl.runtime.ray_replay import merge_states, shard_capacities, split_states


@pytest.mark.parametrize("kind", ["uniform", "prioritized"])
@pytest.mark.parametrize("rows", [0, 37, 100, 250])  # empty, partly full, full, wrapped
@pytest.mark.parametrize("shards", [1, 2, 3])
def test_split_then_merge_keeps_every_row_once(kind, rows, shards):
    capacity = 100
    table = make_replay(ReplayConfig(kind=kind, capacity=capacity), 3)
    rng = np.random.default_rng(rows)
    for first in range(0, rows, 16):
        n = min(16, rows - first)
        obs = np.arange(first, first + n, dtype=np.float32)[:, None].repeat(3, 1)
        table.add(obs, rng.integers(2, size=n), rng.random(n).astype(np.float32), obs + 0.5,
                  np.full(n, 0.99, np.float32))
    if kind == "prioritized" and table.size:
        table.update_priorities(np.arange(table.size), rng.random(table.size) + 0.1)
    state = table.state_dict()
    capacities = shard_capacities(capacity, shards)
    assert sum(capacities) == capacity
    parts = split_states(state, capacity, capacities, env_steps=rows + 5)
    assert sum(steps for _, steps in parts) == rows + 5
    for (part, _), cap in zip(parts, capacities):
        assert part["size"] <= cap
    merged = merge_states([p for p, _ in parts], capacities, capacity, rows + 5, {})
    assert merged["size"] == state["size"] and merged["inserted"] == state["inserted"]
    key = merged["storage"]["obs"][:, 0]
    assert sorted(key) == sorted(state["storage"]["obs"][:, 0])  # every row once
    if kind == "prioritized":
        by_row = dict(zip(state["storage"]["obs"][:, 0], state["priorities"]))
        assert np.allclose(merged["priorities"], [by_row[k] for k in key])
        assert merged["progress"] == rows + 5
    # a table loaded from the merged state overwrites its oldest rows first, as the original would
    back = make_replay(ReplayConfig(kind=kind, capacity=capacity), 3)
    back.load_state_dict(merged)
    if rows >= capacity:
        oldest = min(key)
        assert back.storage["obs"][back.cursor, 0] == oldest


@pytest.mark.parametrize("ray_section, message", [
    ("{replay: learner, shards: 2}", "plan.ray.shards: 2 shards need replay: server or node"),
    ("{replay: server, shards: 0}", "plan.ray.shards: expected an integer >= 1, got 0"),
    ("{replay: disk}", "plan.ray.replay"),
])
def test_a_bad_replay_placement_is_one_line_naming_the_field(ray_section, message):
    from pearl.errors import ConfigError
    from pearl.plan import Plan

    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        Plan.from_yaml(f"plan: {{runtime: ray, ray: {ray_section}}}")
    assert Plan.from_yaml("plan: {runtime: ray, ray: {replay: node, shards: 3}}").ray.shards == 3
