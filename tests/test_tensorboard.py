"""TensorBoard scalars under Stable-Baselines3's names, read back with tensorboard's own reader."""
import importlib.util

import pytest

import pearl
from pearl.callbacks import BaseCallback
from pearl.cli import main
from pearl.errors import ConfigError

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

SMALL = dict(learning_starts=100, buffer_size=5000, policy_kwargs=dict(net_arch=[32, 32]), seed=0)


def scalars(folder) -> dict:
    reader = EventAccumulator(str(folder))
    reader.Reload()
    return {tag: [(e.step, e.value) for e in reader.Scalars(tag)] for tag in reader.Tags()["scalars"]}


class Records(BaseCallback):
    def _on_step(self):
        if self.num_timesteps % 500 == 0:
            self.logger.record("custom/steps_seen", self.num_timesteps)
        return True


def test_learn_writes_sb3s_scalars_to_tensorboard_log(tmp_path):
    model = pearl.DQN("MlpPolicy", "CartPole-v1", tensorboard_log=str(tmp_path), **SMALL)
    model.learn(2000, callback=Records())
    board = scalars(tmp_path / "DQN_1")
    for tag in ("rollout/ep_rew_mean", "rollout/exploration_rate", "train/loss", "time/fps",
                "train/learning_rate", "train/n_updates", "time/episodes", "custom/steps_seen"):
        assert tag in board, (tag, sorted(board))
    assert [step for step, _ in board["time/fps"]] == [1000, 2000]  # a row every log.interval env steps
    assert board["train/n_updates"][-1] == (2000, model.updates)
    assert board["train/learning_rate"][0][1] == pytest.approx(1e-4)
    assert board["rollout/exploration_rate"][-1][1] == pytest.approx(model.algo.epsilon(2000), abs=1e-4)
    model.learn(1000, reset_num_timesteps=False)  # SB3: the same run goes on
    assert [s for s, _ in scalars(tmp_path / "DQN_1")["time/fps"]] == [1000, 2000, 3000]
    pearl.DQN("MlpPolicy", "CartPole-v1", tensorboard_log=str(tmp_path), **SMALL).learn(1000, tb_log_name="run")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["DQN_1", "run_1"]


def test_continuous_algorithms_log_the_critic_loss(tmp_path):
    model = pearl.TD3("MlpPolicy", "Pendulum-v1", tensorboard_log=str(tmp_path), learning_starts=100,
                      policy_kwargs=dict(net_arch=[16, 16]), batch_size=32)
    model.learn(1000)
    board = scalars(tmp_path / "TD3_1")
    assert "train/critic_loss" in board and "rollout/exploration_rate" not in board


def test_cli_tensorboard_beside_metrics_csv(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "--steps", "2000", "--tensorboard", "--run-dir", str(run), "--quiet"]) == 0
    assert (run / "metrics.csv").is_file()
    board = scalars(run)
    assert [s for s, _ in board["rollout/ep_rew_mean"]] == [1000, 2000] and "rollout/exploration_rate" in board


def test_missing_tensorboard_is_one_line(tmp_path, monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard" else real(name, *a))
    with pytest.raises(ConfigError, match=r"^tensorboard_log: TensorBoard logging needs the tensorboard package"):
        pearl.DQN("MlpPolicy", "CartPole-v1", tensorboard_log=str(tmp_path))
    assert main(["train", "--steps", "1000", "--tensorboard", "--run-dir", str(tmp_path / "run")]) == 2
    assert capsys.readouterr().err.strip().startswith("pearl: error: log.tensorboard: TensorBoard logging needs")
    assert not (tmp_path / "run").exists()
