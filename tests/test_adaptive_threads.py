"""AdaptiveThreads (pearl/runtime/adaptive_threads.py): the learner's thread count follows whichever
count updates faster now, every update reaches the learner once, and build() wraps exactly the
learners whose count it can set."""
import numpy as np
import pytest
import torch

import pearl
from pearl.runtime.adaptive_threads import MARGIN, TRIAL_UPDATES, AdaptiveThreads


class ClockedLearner:
    """A learner whose update takes `cost[threads]` seconds of a fake clock, the threads being the
    last count set; it records every batch it gets."""

    kernel = "fake"

    def __init__(self, cost: dict):
        self.cost, self.now, self.threads, self.batches = cost, 0.0, None, []

    def set_threads(self, n: int) -> None:
        self.threads = n

    def clock(self) -> float:
        return self.now

    def update(self, batch):
        self.batches.append(batch)
        self.now += self.cost[self.threads]
        return float(batch), None

    def update_target(self):
        pass

    def policy_weights(self):
        return np.zeros(3, np.float32)

    def sync_to_algo(self):
        pass

    def state_dict(self):
        return {"batches": len(self.batches)}

    def load_state_dict(self, state):
        self.loaded = state


def run(inner: ClockedLearner, learner: AdaptiveThreads, seconds: float, start: int = 0) -> int:
    n = start
    end = inner.now + seconds
    while inner.now < end:
        assert learner.update(n) == (float(n), None)
        n += 1
    return n


def adaptive(cost: dict, threads: int = 2, **kw) -> tuple[ClockedLearner, AdaptiveThreads]:
    inner = ClockedLearner(cost)
    return inner, AdaptiveThreads(inner, threads, inner.set_threads, clock=inner.clock, first_probe_s=0.5, probe_every_s=1.0, **kw)


def test_stays_on_the_plans_threads_while_they_are_faster():
    inner, learner = adaptive({2: 0.003, 1: 0.0046})
    n = run(inner, learner, 30.0)
    assert learner.threads == 2 and learner.switches == 0
    # a trial of TRIAL_UPDATES on one thread every probe (~1 s), no more
    assert 0 < learner.updates_on[1] <= 31 * TRIAL_UPDATES
    assert learner.updates_on[2] + learner.updates_on[1] == n == len(inner.batches)


def test_moves_to_one_thread_when_two_gain_nothing_and_back_when_they_do():
    cost = {2: 0.0045, 1: 0.0040}
    inner, learner = adaptive(cost)
    n = run(inner, learner, 5.0)
    assert learner.threads == 1 and learner.switches == 1
    cost[2] = 0.0030  # the host's fast state again
    n = run(inner, learner, 5.0, n)
    assert learner.threads == 2 and learner.switches == 2
    assert inner.batches == list(range(n))  # every batch once, in order


def test_a_gain_within_the_margin_is_no_switch():
    inner, learner = adaptive({2: 0.004, 1: 0.004 * (1 - MARGIN / 2)})
    run(inner, learner, 20.0)
    assert learner.threads == 2 and learner.switches == 0


def test_sets_the_count_before_every_update():
    """Whatever set the process's threads in between, each update runs on the chosen count."""
    inner, learner = adaptive({2: 0.003, 1: 0.0046})
    for n in range(5):
        inner.threads = 7
        learner.update(n)
        assert inner.threads == 2


def test_passes_the_learner_through():
    inner, learner = adaptive({2: 0.003, 1: 0.0046})
    assert learner.kernel == "fake" and learner.cost is inner.cost
    assert learner.state_dict() == {"batches": 0}
    learner.load_state_dict({"x": 1})
    assert inner.loaded == {"x": 1}
    with pytest.raises(ValueError, match="threads"):
        AdaptiveThreads(inner, 1, inner.set_threads)


@pytest.mark.parametrize("algo, options, wrapped", [
    ("DDPG", dict(env="Pendulum-v1", learner_kernel="fused", torch_threads=2), True),
    ("DDPG", dict(env="Pendulum-v1", learner_kernel="torch", torch_threads=2), True),
    ("DDPG", dict(env="Pendulum-v1", learner_kernel="fused", torch_threads=2, adapt_threads=False), False),
    ("DDPG", dict(env="Pendulum-v1", learner_kernel="fused", torch_threads=1), False),
    ("DQN", dict(env="CartPole-v1", learner_kernel="fused", torch_threads=2), True),
    ("DQN", dict(env="CartPole-v1", learner_kernel="torch", torch_threads=2), True),
])
def test_build_wraps_the_learners_whose_threads_it_can_set(algo, options, wrapped):
    threads = torch.get_num_threads()
    try:
        agent = getattr(pearl, algo)(seed=0, total_steps=1000, **options)
        assert isinstance(agent.learner, AdaptiveThreads) == wrapped
    finally:
        torch.set_num_threads(threads)


def test_a_fused_dqn_learner_switches_its_pairs():
    """The fused DQN step's count is its kernel's `threads` (the pairs), not torch's."""
    threads = torch.get_num_threads()
    try:
        agent = pearl.DQN(env="CartPole-v1", seed=0, total_steps=1000, learner_kernel="fused", torch_threads=2,
                          hidden=[256, 256], batch_size=64, learning_starts=200)
        summary = agent.train(600)
        assert summary["learner_threads"][2] + summary["learner_threads"][1] == summary["updates"] > 0
        agent.learner._set_threads(1)
        assert agent.learner.kernel_impl.threads == 1
    finally:
        torch.set_num_threads(threads)
