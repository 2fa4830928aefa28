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

from pearl.kernels.cpu import flush_denormals
from pearl.runtime import crossed

MAX_LAG = 4  # updates the learner may trail the count due (the replay's rate limiter allows for it)


def run(agent, steps: int, on_progress=None, time_tasks: bool = False, max_lag: int = MAX_LAG) -> None:
    """Advances `agent` by `steps` env steps with a learner thread (see the module doc)."""
    cfg = agent.config.algo_config
    actor, replay, learner, plan = agent.actor, agent.replay, agent.learner, agent.plan
    rng, timer, clock = agent.rng, (agent.task_timer if time_tasks else None), time.perf_counter
    end = agent.env_steps + steps
    n_envs = len(actor.envs)
    interval = getattr(cfg, "target_update_interval", None)
    log_every, eval_every = agent.config.log.interval, agent.config.eval.interval

    def due(env_steps: int) -> int:
        return int(max(0, env_steps - cfg.learning_starts) * cfg.updates_per_step)

    replay_lock = threading.Lock()
    pause = threading.Lock()  # held by the learner around each update; the actor takes it to pause it
    state = threading.Condition()
    shared = {"env_steps": agent.env_steps, "done": False, "error": None, "weights": None}
    # target updates owed: (env step at which the interval was crossed) in order
    target_points: list[int] = []

    def work_available() -> bool:
        if agent.updates < due(shared["env_steps"]):
            return True
        return bool(target_points) and agent.updates >= due(target_points[0])

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
                    target_due = bool(target_points) and agent.updates >= due(target_points[0])
                    if target_due:
                        target_points.pop(0)
                if target_due:
                    with pause:
                        learner.update_target()
                    continue
                with pause:
                    t0 = clock()
                    with replay_lock:
                        batch = replay.sample(plan.batch_size, rng)
                    t1 = clock()
                    loss, abs_td = learner.update(batch)
                    t2 = clock()
                    if replay.prioritized:
                        with replay_lock:
                            replay.update_priorities(batch.indices, abs_td)
                    t3 = clock()
                    snapshot = None
                    if (agent.updates + 1) % plan.sync_interval == 0:
                        snapshot = learner.policy_weights().copy()
                with state:
                    agent.updates += 1
                    agent.record_loss(loss)
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
        while agent.env_steps < end and not agent.stop_requested:
            with state:
                weights, shared["weights"] = shared["weights"], None
            if weights is not None:
                t0 = clock()
                actor.policy.load(weights)
                if timer:
                    timer.add("sync_weights", clock() - t0)
            t0 = clock()
            transitions, finished = actor.step(agent.algo.epsilon(agent.env_steps))
            t1 = clock()
            if transitions is not None:
                with replay_lock:
                    replay.add(*transitions)
            t2 = clock()
            previous = agent.env_steps
            agent.env_steps += n_envs
            replay.progress = agent.env_steps
            agent.record_episodes(finished)
            if timer:
                timer.add("act", t1 - t0)
                timer.add("insert", t2 - t1)
            with state:
                shared["env_steps"] = agent.env_steps
                if interval and agent.env_steps // interval > previous // interval:
                    target_points.append(agent.env_steps)
                state.notify_all()
                while due(agent.env_steps) - agent.updates > max_lag and shared["error"] is None:
                    state.wait()
                if shared["error"] is not None:
                    raise shared["error"]
            if on_progress is not None:
                if crossed(previous, agent.env_steps, log_every) or crossed(previous, agent.env_steps, eval_every):
                    with pause:  # the learner between updates: consistent weights to log and evaluate
                        on_progress(agent)
                else:
                    on_progress(agent)
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
