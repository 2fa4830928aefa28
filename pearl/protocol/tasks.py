"""The six tasks of an off-policy training loop, as first-class objects.

A task knows what it consumes and produces and what one call costs (FLOPs, bytes moved), computed
from the algorithm's networks and the replay config. It never knows where it runs: the Plan says
that, and the estimator turns (task, device) into time and power.
"""
from __future__ import annotations

from dataclasses import dataclass

from pearl.estimator import Cost, sum_tree_cost
from pearl.estimator.signatures import FLOAT_BYTES

TASK_NAMES = ("act", "insert", "sample", "learn", "update_priorities", "sync_weights")


@dataclass(frozen=True)
class Task:
    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    cost: Cost  # per call
    calls_per_env_step: float  # how often the task runs, per environment step, to keep the replay ratio

    def cost_per_env_step(self) -> Cost:
        return self.cost * self.calls_per_env_step


def transition_bytes(obs_dim: int, action_dim: int) -> int:
    """obs + next_obs + action + reward + discount, as the replay stores them."""
    return (2 * obs_dim + action_dim + 2) * FLOAT_BYTES


def build_tasks(algo, replay_kind: str, capacity: int, batch_size: int, updates_per_step: float,
                envs_per_actor: int = 1, sync_interval: int = 1) -> dict[str, Task]:
    """The protocol of `algo` (an Algorithm with act_cost/learn_cost/n_params) for a replay config.

    `update_priorities` exists only for prioritized replay; a uniform replay has no priorities.
    """
    item = transition_bytes(algo.obs_dim, algo.action_dim)
    prioritized = replay_kind != "uniform"
    tree = sum_tree_cost(capacity, batch_size) if prioritized else Cost()
    tasks = [
        Task("act", ("observation", "policy_weights"), ("transition",),
             algo.act_cost(envs_per_actor), 1.0 / envs_per_actor),
        Task("insert", ("transition",), ("replay_slot",),
             Cost(flops=envs_per_actor * (20 if prioritized else 0), bytes=envs_per_actor * item),
             1.0 / envs_per_actor),
        Task("sample", ("replay",), ("batch", "indices", "weights"),
             Cost(flops=tree.flops, bytes=batch_size * item + tree.bytes), updates_per_step),
        Task("learn", ("batch", "weights"), ("learner_weights", "td_errors"),
             algo.learn_cost(batch_size), updates_per_step),
    ]
    if prioritized:
        tasks.append(Task("update_priorities", ("indices", "td_errors"), ("replay",),
                          tree, updates_per_step))
    tasks.append(Task("sync_weights", ("learner_weights",), ("policy_weights",),
                      Cost(bytes=algo.n_params() * FLOAT_BYTES), updates_per_step / sync_interval))
    return {task.name: task for task in tasks}
