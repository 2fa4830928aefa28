"""The sequential runtime's semantics: exact replay ratio, determinism, save/load, API verbs."""
import numpy as np
import pytest

import pearl
from pearl.errors import ConfigError

FAST = dict(total_steps=3000, learning_starts=500, target_update_interval=200, hidden=[32, 32])


def weights(agent):
    return agent.learner.policy_weights().copy()


@pytest.mark.parametrize("ratio,envs", [(0.25, 1), (1.0, 1), (0.5, 3), (2.0, 2)])
def test_replay_ratio_is_exact(ratio, envs):
    agent = pearl.DQN("CartPole-v1", **{**FAST, "updates_per_step": ratio, "envs_per_actor": envs})
    agent.train(2000)
    assert agent.env_steps == 2000 + (-2000 % envs)
    assert agent.updates == int((agent.env_steps - 500) * ratio)
    assert agent.replay.inserted == agent.env_steps  # 1-step transitions: none lost or duplicated


def test_n_step_transitions_are_all_inserted():
    agent = pearl.DQN("CartPole-v1", **FAST, n_step=3)
    agent.train(1500)
    # every step yields exactly one transition, some delayed by up to n-1 steps until emitted
    assert agent.env_steps - 2 <= agent.replay.inserted <= agent.env_steps


def test_same_seed_same_run():
    a = pearl.DQN("CartPole-v1", **FAST, seed=3)
    b = pearl.DQN("CartPole-v1", **FAST, seed=3)
    a.train(1500)
    b.train(1500)
    np.testing.assert_array_equal(weights(a), weights(b))
    assert a.episodes == b.episodes and list(a.recent_returns) == list(b.recent_returns)
    c = pearl.DQN("CartPole-v1", **FAST, seed=4)
    c.train(1500)
    assert not np.array_equal(weights(a), weights(c))


@pytest.mark.parametrize("kernel", ["fused", "torch"])
def test_save_load_round_trip(tmp_path, kernel):
    agent = pearl.DQN("CartPole-v1", **FAST, learner_kernel=kernel, replay="prioritized")
    agent.train(1200)
    agent.save(tmp_path / "agent.npz")
    restored = pearl.load(tmp_path / "agent.npz")
    assert restored.learner.kernel == kernel
    np.testing.assert_array_equal(weights(agent), weights(restored))
    assert (restored.env_steps, restored.updates) == (agent.env_steps, agent.updates)
    assert restored.evaluate(2)["returns"] == agent.evaluate(2)["returns"]
    assert len(restored.replay) == len(agent.replay) == 1200
    np.testing.assert_array_equal(restored.replay.storage["obs"], agent.replay.storage["obs"])
    np.testing.assert_array_equal(restored.replay.tree.get(np.arange(1200)), agent.replay.tree.get(np.arange(1200)))
    assert restored.replay.rate_limiter.state_dict() == agent.replay.rate_limiter.state_dict()
    state, again = agent.learner.state_dict(), restored.learner.state_dict()
    for key in ("online", "target", "exp_avg", "exp_avg_sq"):
        np.testing.assert_array_equal(state[key], again[key])
    restored.train(200)  # training goes on from the restored optimizer state
    assert restored.env_steps == agent.env_steps + 200


def test_checkpoint_moves_between_learners(tmp_path):
    agent = pearl.DQN("CartPole-v1", **FAST, learner_kernel="fused")
    agent.train(1000)
    agent.save(tmp_path / "a.npz")
    plan = pearl.Plan(learner_kernel="torch", batch_size=64)
    restored = pearl.load(tmp_path / "a.npz", plan=plan)
    assert restored.learner.kernel == "torch"
    np.testing.assert_allclose(weights(restored), weights(agent))


def test_load_rejects_bad_files(tmp_path):
    with pytest.raises(pearl.PearlError, match="no such checkpoint"):
        pearl.load(tmp_path / "none.npz")
    broken = tmp_path / "broken.npz"
    broken.write_bytes(b"not a zip")
    with pytest.raises(pearl.PearlError, match="not a PEARL checkpoint"):
        pearl.load(broken)


def test_act_and_evaluate():
    agent = pearl.DQN("CartPole-v1", **FAST)
    obs = np.zeros(4, dtype=np.float32)
    assert agent.act(obs) in (0, 1)
    batch = agent.act(np.zeros((5, 4), dtype=np.float32))
    assert batch.shape == (5,)
    result = agent.evaluate(3)
    assert len(result["returns"]) == 3 and result["mean"] > 0


@pytest.mark.parametrize("env_id", ["Acrobot-v1", "MountainCar-v0"])
def test_other_discrete_envs_train(env_id):
    agent = pearl.DQN(env_id, **FAST)
    summary = agent.train(800)
    assert summary["env_steps"] == 800 and summary["updates"] == 75


def test_dueling_runs_on_torch_learner():
    agent = pearl.DQN("CartPole-v1", **FAST, dueling=True)
    assert agent.learner.kernel == "torch"
    agent.train(700)
    with pytest.raises(ConfigError, match="learner_kernel"):
        pearl.DQN("CartPole-v1", **FAST, dueling=True, learner_kernel="fused")


def test_unknown_api_option():
    # learning_rate (SB3's name) is known since the SB3 surface (tests/test_sb3_api.py); a typo is not
    with pytest.raises(ConfigError, match="learnig_rate: unknown DQN option"):
        pearl.DQN("CartPole-v1", learnig_rate=1e-3)


def test_run_directory(tmp_path):
    agent = pearl.DQN("CartPole-v1", **FAST, updates_per_step=0.25)
    agent.train(2000, run_dir=tmp_path)
    for name in ("config.yaml", "plan.yaml", "metrics.csv", "checkpoint.npz", "learning_curve.png"):
        assert (tmp_path / name).is_file(), name
    rows = (tmp_path / "metrics.csv").read_text().splitlines()
    assert rows[0].startswith("env_steps,updates") and len(rows) == 3  # header + rows at 1000, 2000
    assert pearl.load_config(tmp_path / "config.yaml").dqn.hidden == [32, 32]
    assert pearl.load_plan(tmp_path / "plan.yaml").batch_size == 64


@pytest.mark.parametrize("envs", [1, 4, 16])
def test_n_step_with_many_envs_starts_learning_on_time(envs):
    """The rate limiter's minimum size allows for the (n_step - 1) transitions each env holds back."""
    agent = pearl.DQN("CartPole-v1", **{**FAST, "n_step": 3, "envs_per_actor": envs})
    agent.train(1500)
    assert agent.updates == int((agent.env_steps - 500) * 0.25)
