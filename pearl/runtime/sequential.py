"""The sequential runtime: the reference semantics every other runtime must keep.

One process runs the protocol's tasks in order — act, insert, then as many (sample, learn,
update_priorities) rounds as keep `updates / (env steps past learning_starts)` exactly at the
configured replay ratio, with sync_weights after every `plan.sync_interval`-th update — of a burst
of updates between two act rounds only the last such one's (the actor acts on no earlier one; a
copy of the 256x256 CartPole net's weights costs ~9 us, 128 times a burst with the RL Zoo's 128
gradient steps). Seeded, it is deterministic: the same config gives the same transitions, updates
and weights.
"""
from __future__ import annotations

import time

from pearl.contracts import Runtime, implements
from pearl.runtime.counters import Counters, Hooks
from pearl.schedule import MAX_LAG, crossed, last_sync


def learn_one(replay, learner, batch_size: int, rng, timer) -> float:
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


@implements(Runtime)
class Sequential:
    name = "sequential"
    max_lag = MAX_LAG[name]

    def run(self, parts, counters: Counters, steps: int, hooks: Hooks) -> None:
        """Advances `counters` by `steps` env steps; `hooks.on_round()` after each act round."""
        actor, replay, learner, schedule = parts.actor, parts.replay, parts.learner, parts.schedule
        rng, timer, clock = parts.rng, hooks.timer, time.perf_counter
        end = counters.env_steps + steps
        while counters.env_steps < end and not counters.stop_requested:
            t0 = clock()
            transitions, finished = actor.step(parts.algo.epsilon(counters.env_steps))
            t1 = clock()
            if transitions is not None:
                replay.add(*transitions)
            t2 = clock()
            previous = counters.env_steps
            counters.env_steps += actor.n_envs
            replay.progress = counters.env_steps
            counters.record_episodes(finished)
            if timer:
                timer.add("act", t1 - t0)
                timer.add("insert", t2 - t1)

            due = schedule.due(counters.env_steps)
            publish = last_sync(counters.updates, due, schedule.sync_interval)
            while counters.updates < due:
                loss = learn_one(replay, learner, schedule.batch_size, rng, timer)
                counters.updates += 1
                counters.record_loss(loss)
                if counters.updates == publish:
                    t0 = clock()
                    actor.policy.load(learner.policy_weights())
                    if timer:
                        timer.add("sync_weights", clock() - t0)
            if crossed(previous, counters.env_steps, schedule.target_interval):
                learner.update_target()
            if hooks.on_round is not None:
                hooks.on_round()


RUNTIME = Sequential()
