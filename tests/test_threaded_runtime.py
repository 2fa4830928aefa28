"""The threaded runtime (pearl/runtime/threaded.py) keeps the sequential runtime's semantics: the
exact replay ratio at the end and within MAX_LAG updates during the run, every transition
inserted once, target updates and weight syncs, errors surfaced, checkpoints that load. Its
learning quality is not established yet: with the default CartPole config, one run solved 3 of 3
seeds and another 1 of 3 (sequential: 3 of 3 in both), so no slow test claims it."""
import numpy as np
import pytest

import pearl
from pearl.plan import Plan
from pearl.runtime.threaded import RUNTIME

MAX_LAG = RUNTIME.max_lag

FAST = dict(total_steps=3000, learning_starts=500, target_update_interval=200, hidden=[32, 32])


def threaded(**plan):
    return Plan(runtime="threaded", **plan)


@pytest.mark.parametrize("ratio,envs,replay", [(0.25, 1, "uniform"), (1.0, 1, "prioritized"),
                                               (0.5, 3, "uniform"), (2.0, 2, "prioritized")])
def test_replay_ratio_exact_at_the_end_and_bounded_during_the_run(ratio, envs, replay):
    agent = pearl.DQN("CartPole-v1", plan=threaded(envs_per_actor=envs), replay=replay,
                      **{**FAST, "updates_per_step": ratio})
    lags = []

    def watch(a):
        due = int(max(0, a.env_steps - 500) * ratio)
        lags.append(due - a.updates)

    agent.train(2000, on_round=watch)
    assert agent.env_steps == 2000 + (-2000 % envs)
    assert agent.updates == int((agent.env_steps - 500) * ratio)
    assert agent.replay.inserted == agent.env_steps  # 1-step transitions: none lost or duplicated
    assert min(lags) >= 0, "the learner ran ahead of the replay ratio"
    # the actor waits once the learner trails by more than MAX_LAG; one act round can add
    # ceil(envs x ratio) more before it checks
    assert max(lags) <= MAX_LAG + int(np.ceil(envs * ratio))
    # measured against the configured ratio over the run: within 2% once past a few hundred updates
    assert abs(agent.updates / ((agent.env_steps - 500) * ratio) - 1) < 0.02


def test_matches_the_sequential_counts_and_learns_the_same_way():
    a = pearl.DQN("CartPole-v1", **FAST, seed=5)
    b = pearl.DQN("CartPole-v1", plan=threaded(), **FAST, seed=5)
    a.train(2500)
    b.train(2500)
    assert (a.env_steps, a.updates, a.replay.inserted) == (b.env_steps, b.updates, b.replay.inserted)
    # same seeds, same environments: the actor's first steps (pure exploration) are identical
    np.testing.assert_array_equal(a.replay.storage["obs"][:400], b.replay.storage["obs"][:400])
    # after the run the actor holds the learner's latest synced weights, as in the sequential runtime
    np.testing.assert_array_equal(b.actor.policy.flat, b.learner.policy_weights())


def test_learner_errors_reach_the_caller():
    agent = pearl.DQN("CartPole-v1", plan=threaded(), **FAST)

    def broken(batch):
        raise FloatingPointError("loss is nan")

    agent.learner.update = broken
    with pytest.raises(FloatingPointError, match="nan"):
        agent.train(1500)


def test_checkpoint_of_a_threaded_run_loads_and_trains_on(tmp_path):
    agent = pearl.DQN("CartPole-v1", plan=threaded(), replay="prioritized", **FAST)
    agent.train(1200)
    agent.save(tmp_path / "agent.npz")
    restored = pearl.load(tmp_path / "agent.npz")
    assert restored.plan.runtime == "threaded"
    assert (restored.env_steps, restored.updates) == (agent.env_steps, agent.updates)
    np.testing.assert_array_equal(restored.learner.policy_weights(), agent.learner.policy_weights())
    restored.train(300)
    assert restored.updates == int((restored.env_steps - 500) * 0.25)


def test_plan_runtime_is_validated():
    from pearl.errors import ConfigError

    with pytest.raises(ConfigError, match="plan.runtime"):
        Plan.from_yaml("plan:\n  runtime: greenlets\n")
