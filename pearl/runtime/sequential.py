"""The sequential runtime: the reference semantics every other runtime must keep.

One process runs the protocol's tasks in order — act, insert, then as many (sample, learn,
update_priorities) rounds as keep `updates / (env steps past learning_starts)` exactly at the
configured replay ratio, then sync_weights every `plan.sync_interval` updates. Seeded, it is
deterministic: the same config gives the same transitions, updates and weights.
"""
from __future__ import annotations

import time


class TaskTimer:
    """Wall time spent in each protocol task, so measured costs can be set against estimates."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}

    def add(self, task: str, seconds: float, calls: int = 1) -> None:
        if calls:
            self.seconds[task] = self.seconds.get(task, 0.0) + seconds
            self.calls[task] = self.calls.get(task, 0) + calls

    def mean_us(self) -> dict[str, float]:
        return {t: 1e6 * s / self.calls[t] for t, s in self.seconds.items()}


def learn_one(replay, learner, batch_size: int, rng, timer: TaskTimer | None) -> float:
    """One update in the reference order: sample -> learn -> update_priorities. Returns the loss."""
    clock = time.perf_counter
    t0 = clock()
    batch = replay.sample(batch_size, rng)
    t1 = clock()
    loss, abs_td = learner.update(batch)
    t2 = clock()
    if replay.prioritized:
        replay.update_priorities(batch.indices, abs_td)
    if timer:
        timer.add("sample", t1 - t0)
        timer.add("learn", t2 - t1)
        if replay.prioritized:
            timer.add("update_priorities", clock() - t2)
    return loss


def run(agent, steps: int, on_progress=None, time_tasks: bool = False) -> None:
    """Advances `agent` by `steps` env steps. `on_progress(agent)` is called after each act round."""
    cfg = agent.config.algo_config
    actor, replay, learner, plan = agent.actor, agent.replay, agent.learner, agent.plan
    rng = agent.rng
    timer = agent.task_timer if time_tasks else None
    clock = time.perf_counter
    end = agent.env_steps + steps
    while agent.env_steps < end and not agent.stop_requested:
        t0 = clock()
        transitions, finished = actor.step(agent.algo.epsilon(agent.env_steps))
        t1 = clock()
        if transitions is not None:
            replay.add(*transitions)
        t2 = clock()
        previous = agent.env_steps
        agent.env_steps += len(actor.envs)
        replay.progress = agent.env_steps
        agent.record_episodes(finished)
        if timer:
            timer.add("act", t1 - t0)
            timer.add("insert", t2 - t1)

        due = int(max(0, agent.env_steps - cfg.learning_starts) * cfg.updates_per_step) - agent.updates
        for _ in range(due):
            loss = learn_one(replay, learner, plan.batch_size, rng, timer)
            agent.updates += 1
            agent.record_loss(loss)
            if agent.updates % plan.sync_interval == 0:
                t0 = clock()
                actor.policy.load(learner.policy_weights())
                if timer:
                    timer.add("sync_weights", clock() - t0)

        # DDPG, TD3 and SAC have no interval: their targets move inside each update (TD3's every
        # policy_delay-th), as part of the algorithm.
        interval = getattr(cfg, "target_update_interval", None)
        if interval and agent.env_steps // interval > previous // interval:
            learner.update_target()
        if on_progress is not None:
            on_progress(agent)
