"""The device replay table (pearl/replay/device.py) against the host replays: same draws from the
same generator, same weights, same rows, same checkpoint contents. Runs on CPU tensors always and
on `cuda` when a GPU is present."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from pearl.replay import PrioritizedReplay, RateLimiter, RateLimitExceeded, UniformReplay
from pearl.kernels.registry import backend
from pearl.replay.device import DeviceReplay

TORCH = backend("cuda")  # its kernels run on CPU tensors too: how they are tested without a GPU

CUDA = torch.cuda.is_available()
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not CUDA, reason="no CUDA device"))]
OBS_DIM = 3
FIELDS = ("obs", "actions", "rewards", "next_obs", "discounts")


def transitions(start, count):
    ids = np.arange(start, start + count)
    obs = (ids[:, None] * 10 + np.arange(OBS_DIM)).astype(np.float32)
    return (obs, ids % 4, ids.astype(np.float32), obs + 0.5,
            np.where(ids % 5 == 0, 0.0, 0.99).astype(np.float32))


def host(tensor):
    return tensor.cpu().numpy()


def assert_same_batch(got, want, device):
    assert got.indices.device.type == torch.device(device).type
    np.testing.assert_array_equal(host(got.indices), want.indices)
    for name in FIELDS:
        value = getattr(got, name)
        assert isinstance(value, torch.Tensor) and value.device.type == torch.device(device).type
        np.testing.assert_array_equal(host(value), getattr(want, name))
    if want.weights is not None:
        assert got.weights.dtype == torch.float32
        np.testing.assert_allclose(host(got.weights), want.weights, rtol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_prioritized_matches_the_host_replay(device):
    options = dict(alpha=0.6, beta=0.4, beta_final=1.0, beta_steps=200, fanout=4)
    gpu = DeviceReplay(50, OBS_DIM, device, prioritized=True, kernels=TORCH, **options)
    cpu = PrioritizedReplay(50, OBS_DIM, backend="numpy", **options)
    rng = np.random.default_rng(0)
    inserted = 0
    for step in range(10):
        count = int(rng.integers(1, 20))
        for replay in (gpu, cpu):
            replay.add(*transitions(inserted, count))  # wraps after a few rounds
            replay.progress = 20 * step
        inserted += count
        seed = int(rng.integers(1 << 30))
        got, want = gpu.sample(32, np.random.default_rng(seed)), cpu.sample(32, np.random.default_rng(seed))
        assert_same_batch(got, want, device)
        td = rng.normal(size=32) * 3
        gpu.update_priorities(got.indices, torch.as_tensor(td, device=device))  # the learner's tensor
        cpu.update_priorities(want.indices, td)
        np.testing.assert_allclose(host(gpu.tree.leaves)[:50], cpu.tree.leaves[:50], rtol=1e-12)
        assert gpu.max_priority == pytest.approx(cpu.max_priority, rel=1e-12)


@pytest.mark.parametrize("device", DEVICES)
def test_uniform_matches_the_host_replay(device):
    gpu = DeviceReplay(20, OBS_DIM, device, prioritized=False, kernels=TORCH)
    cpu = UniformReplay(20, OBS_DIM)
    for replay in (gpu, cpu):
        replay.add(*transitions(0, 27))
    got, want = gpu.sample(16, np.random.default_rng(4)), cpu.sample(16, np.random.default_rng(4))
    assert got.weights is None
    assert_same_batch(got, want, device)
    gpu.update_priorities(got.indices, torch.ones(16))  # uniform tables ignore priorities


@pytest.mark.parametrize("device", DEVICES)
def test_state_dict_round_trip_and_host_format(device):
    replay = DeviceReplay(16, OBS_DIM, device, prioritized=True, kernels=TORCH, beta_steps=10)
    replay.add(*transitions(0, 11))
    replay.update_priorities(torch.arange(11, device=device), torch.linspace(0.1, 4.0, 11, device=device))
    replay.progress = 7
    state = replay.state_dict()
    assert isinstance(state["storage"]["obs"], np.ndarray) and isinstance(state["priorities"], np.ndarray)
    restored = DeviceReplay(16, OBS_DIM, device, prioritized=True, kernels=TORCH, beta_steps=10)
    restored.load_state_dict(state)
    assert (restored.size, restored.progress, restored.max_priority) == (11, 7, replay.max_priority)
    assert_same_batch(restored.sample(8, np.random.default_rng(1)),
                      _as_host(replay.sample(8, np.random.default_rng(1))), device)
    # and the host replay reads the same checkpoint
    cpu = PrioritizedReplay(16, OBS_DIM, backend="numpy", beta_steps=10)
    cpu.load_state_dict(state)
    assert_same_batch(replay.sample(8, np.random.default_rng(2)), cpu.sample(8, np.random.default_rng(2)), device)


def _as_host(batch):
    fields = {name: host(getattr(batch, name)) for name in FIELDS}
    return type(batch)(**fields, indices=host(batch.indices), weights=host(batch.weights))


def test_rate_limiter_and_empty_table():
    replay = DeviceReplay(8, OBS_DIM, "cpu", prioritized=True, kernels=TORCH,
                          rate_limiter=RateLimiter(samples_per_insert=1.0, min_size_to_sample=4,
                                                   error_buffer=8))
    with pytest.raises(ValueError, match="empty"):
        replay.sample(2, np.random.default_rng(0))
    replay.add(*transitions(0, 2))
    with pytest.raises(RateLimitExceeded):
        replay.sample(2, np.random.default_rng(0))  # below min_size_to_sample


@pytest.mark.skipif(not CUDA, reason="no CUDA device")
@pytest.mark.parametrize("kind", ["uniform", "prioritized"])
def test_dqn_trains_with_the_whole_replay_table_on_the_gpu(kind, tmp_path):
    import pearl
    from pearl.plan import Plan

    gpu = {task: "cuda:0" for task in ("insert", "sample", "update_priorities", "learn")}
    agent = pearl.DQN("CartPole-v1", plan=Plan(devices={**Plan().devices, **gpu}), replay=kind,
                      seed=0, total_steps=3000)
    assert isinstance(agent.replay, DeviceReplay)
    summary = agent.train()
    assert summary["env_steps"] == 3000 and agent.updates > 0
    agent.save(tmp_path / "agent.npz")
    restored = pearl.load(tmp_path / "agent.npz")
    assert restored.replay.size == agent.replay.size


def test_continuous_agents_keep_their_replay_on_the_cpu():
    import pearl
    from pearl.errors import ConfigError
    from pearl.plan import Plan

    gpu = {task: "cuda:0" for task in ("insert", "sample", "update_priorities", "learn")}
    with pytest.raises(ConfigError, match="feeds the DQN learner only; td3"):
        pearl.TD3(env="Pendulum-v1", plan=Plan(devices={**Plan().devices, **gpu}))
