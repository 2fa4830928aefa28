"""The threaded runtime: the actor and the learner side by side on two threads of one process.

The calling thread acts and inserts; a learner thread samples, learns, updates priorities and
publishes weights. The compiled kernels (the fused learner step, the replay's numba kernels)
release the GIL, so the learner's arithmetic overlaps the actor's environment steps.

What it keeps of the sequential runtime's semantics (docs/ARCHITECTURE.md):
- the replay ratio: the learner never runs ahead of floor((env_steps - learning_starts) x
  updates_per_step) and the actor waits while the learner is more than `max_lag` updates behind
  it, so the ratio at any moment is within max_lag updates of the configured one, and the run ends
  with exactly the sequential count;
- every transition inserted once: one actor, inserts under the replay lock;
- target-network updates at the same points: after the update that completes the count due when
  env_steps crossed a multiple of target_update_interval;
- weights reach the actor every `plan.sync_interval` updates as a snapshot the learner copies
  between its updates, loaded by the actor between its steps, so inference never reads a
  half-written update.
What it does not keep: bit-for-bit determinism (which update a transition first meets depends on
thread timing).

The replay's kernels are not thread-safe: one lock serialises insert, sample and priority update
(each a few microseconds). Rounds that log or evaluate (crossing config.log.interval or
config.eval.interval) run with the learner paused, so an evaluation reads one consistent set of
weights.
"""
from __future__ import annotations

import threading
import time

from pearl.contracts import Runtime, implements
from pearl.kernels.cpu import flush_denormals
from pearl.runtime.counters import Counters, Hooks
from pearl.schedule import MAX_LAG, crossed, sync_due


@implements(Runtime)
class Threaded:
    name = "threaded"
    max_lag = MAX_LAG[name]  # updates the learner may trail the count due (the rate limiter allows for it)

    def run(self, parts, counters: Counters, steps: int, hooks: Hooks) -> None:
        """Advances `counters` by `steps` env steps with a learner thread (see the module doc)."""
        _run(parts, counters, steps, hooks, self.max_lag)


RUNTIME = Threaded()


def _run(parts, counters: Counters, steps: int, hooks: Hooks, max_lag: int) -> None:
    actor, replay, learner, schedule = parts.actor, parts.replay, parts.learner, parts.schedule
    rng, timer, clock = parts.rng, hooks.timer, time.perf_counter
    end = counters.env_steps + steps
    n_envs = actor.n_envs
    due = schedule.due

    replay_lock = threading.Lock()
    pause = threading.Lock()  # held by the learner around each update; the actor takes it to pause it
    state = threading.Condition()
    shared = {"env_steps": counters.env_steps, "done": False, "error": None, "weights": None}
    # target updates owed: (env step at which the interval was crossed) in order
    target_points: list[int] = []

    def work_available() -> bool:
        if counters.updates < due(shared["env_steps"]):
            return True
        return bool(target_points) and counters.updates >= due(target_points[0])

    def learner_loop() -> None:
        # denormal flushing is per thread (the x86 MXCSR): without it here, Adam's tiny second
        # moments made the learner's step 7x slower than on the caller's thread (measured)
        flush_denormals()
        try:
            while True:
                with state:
                    while not work_available() and not shared["done"]:
                        state.wait()
                    if not work_available():
                        return
                    target_due = bool(target_points) and counters.updates >= due(target_points[0])
                    if target_due:
                        target_points.pop(0)
                if target_due:
                    with pause:
                        learner.update_target()
                    continue
                with pause:
                    t0 = clock()
                    with replay_lock:
                        batch = replay.sample(schedule.batch_size, rng)
                    t1 = clock()
                    loss, abs_td = learner.update(batch)
                    t2 = clock()
                    if replay.prioritized:
                        with replay_lock:
                            replay.update_priorities(batch.indices, abs_td)
                    t3 = clock()
                    snapshot = None
                    if sync_due(counters.updates + 1, schedule.sync_interval):
                        snapshot = learner.policy_weights().copy()
                with state:
                    counters.updates += 1
                    counters.record_loss(loss)
                    if snapshot is not None:
                        shared["weights"] = snapshot
                    state.notify_all()
                if timer:
                    timer.add("sample", t1 - t0)
                    timer.add("learn", t2 - t1)
                    if replay.prioritized:
                        timer.add("update_priorities", t3 - t2)
        except BaseException as error:  # handed to the actor thread, which raises it
            with state:
                shared["error"] = error
                state.notify_all()

    thread = threading.Thread(target=learner_loop, name="pearl-learner", daemon=True)
    thread.start()
    try:
        while counters.env_steps < end and not counters.stop_requested:
            with state:
                weights, shared["weights"] = shared["weights"], None
            if weights is not None:
                t0 = clock()
                actor.policy.load(weights)
                if timer:
                    timer.add("sync_weights", clock() - t0)
            t0 = clock()
            transitions, finished = actor.step(parts.algo.epsilon(counters.env_steps))
            t1 = clock()
            if transitions is not None:
                with replay_lock:
                    replay.add(*transitions)
            t2 = clock()
            previous = counters.env_steps
            counters.env_steps += n_envs
            replay.progress = counters.env_steps
            counters.record_episodes(finished)
            if timer:
                timer.add("act", t1 - t0)
                timer.add("insert", t2 - t1)
            with state:
                shared["env_steps"] = counters.env_steps
                if crossed(previous, counters.env_steps, schedule.target_interval):
                    target_points.append(counters.env_steps)
                state.notify_all()
                while due(counters.env_steps) - counters.updates > max_lag and shared["error"] is None:
                    state.wait()
                if shared["error"] is not None:
                    raise shared["error"]
            if hooks.on_round is not None:
                if hooks.quiet(previous, counters.env_steps):
                    with pause:  # the learner between updates: consistent weights to log and evaluate
                        hooks.on_round()
                else:
                    hooks.on_round()
    finally:
        with state:
            shared["done"] = True
            state.notify_all()
        thread.join()
    if shared["error"] is not None:
        raise shared["error"]
    with state:  # the last snapshot, so the actor's copy is current as after the sequential runtime
        weights = shared["weights"]
    if weights is not None:
        actor.policy.load(weights)
