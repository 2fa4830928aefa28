"""The rate limiter keeps samples per insert inside its band; the replay enforces it."""
import threading
import time

import numpy as np
import pytest

from pearl.replay import RateLimiter, RateLimitExceeded, RateLimitTimeout, UniformReplay


def test_band_arithmetic():
    limiter = RateLimiter(samples_per_insert=2.0, min_size_to_sample=10, error_buffer=4)
    assert (limiter.min_diff, limiter.max_diff) == (16, 24)
    assert not limiter.can_sample(1)  # nothing inserted yet
    limiter.record_insert(10)
    assert limiter.can_sample(4) and not limiter.can_sample(5)  # 20 - 5 < 16
    assert limiter.can_insert(2) and not limiter.can_insert(3)  # 20 + 6 > 24
    limiter.record_sample(4)
    assert limiter.can_insert(4) and not limiter.can_insert(5)


def test_inserts_before_min_size_are_always_allowed():
    limiter = RateLimiter(samples_per_insert=0.1, min_size_to_sample=100, error_buffer=0)
    assert limiter.can_insert(100)
    limiter.record_insert(100)
    assert not limiter.can_insert(1) and limiter.can_sample(0)


def test_await_sample_waits_for_an_insert():
    limiter = RateLimiter(samples_per_insert=1.0, min_size_to_sample=4, error_buffer=2)
    done = []

    def learner():
        limiter.await_sample(3, timeout=5)
        done.append(time.monotonic())

    thread = threading.Thread(target=learner)
    thread.start()
    time.sleep(0.05)
    assert not done
    limiter.record_insert(5)  # diff 5: a sample of 3 leaves 2 >= min_diff 2
    thread.join(timeout=5)
    assert done


def test_await_times_out_with_a_clear_error():
    limiter = RateLimiter(samples_per_insert=1.0, min_size_to_sample=4, error_buffer=0)
    with pytest.raises(RateLimitTimeout, match="no room to sample within 0.05 s"):
        limiter.await_sample(1, timeout=0.05)


def test_replay_refuses_what_the_limiter_refuses():
    limiter = RateLimiter(samples_per_insert=8.0, min_size_to_sample=4, error_buffer=8)
    replay = UniformReplay(capacity=100, obs_dim=2, rate_limiter=limiter)
    one = (np.zeros((1, 2), np.float32), np.zeros(1, np.int64), np.zeros(1, np.float32),
           np.zeros((1, 2), np.float32), np.ones(1, np.float32))
    for _ in range(4):
        replay.add(*one)
    rng = np.random.default_rng(0)
    replay.sample(8, rng)  # diff 32 -> 24 = min_diff
    with pytest.raises(RateLimitExceeded, match="learner is ahead"):
        replay.sample(8, rng)
    replay.add(*one)  # diff 32 again
    replay.add(*one)  # diff 40 = max_diff
    with pytest.raises(RateLimitExceeded, match="learner is behind"):
        replay.add(*one)
    assert limiter.state_dict() == {"inserts": 6, "samples": 8}
