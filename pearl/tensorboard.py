"""TensorBoard scalars under Stable-Baselines3's names, written beside metrics.csv from the same
metric rows (pearl.runlog.RunLog): rollout/ep_rew_mean, rollout/exploration_rate (DQN),
train/loss (DQN) or train/critic_loss (DDPG, TD3, SAC), train/learning_rate, train/n_updates,
time/fps, time/episodes, eval/mean_reward, and what a callback `logger.record`s. Needs the
optional `tensorboard` extra (pip install "pearl-rl[tensorboard]")."""
from __future__ import annotations

import re
from pathlib import Path

from pearl.errors import ConfigError


def check_available(field: str) -> None:
    """One line naming `field` if the tensorboard package is missing (before any work starts)."""
    import importlib.util

    if importlib.util.find_spec("tensorboard") is None:
        raise ConfigError(f"{field}: TensorBoard logging needs the tensorboard package "
                          f"(pip install \"pearl-rl[tensorboard]\")")


def writer(log_dir: Path, field: str):
    """torch's SummaryWriter on `log_dir`; one line naming `field` if tensorboard is missing."""
    check_available(field)
    from torch.utils.tensorboard import SummaryWriter

    try:
        return SummaryWriter(log_dir=str(log_dir))
    except OSError as err:
        raise ConfigError(f"{field}: cannot write TensorBoard events to {log_dir} ({err.strerror})") from None


def next_run_dir(root: Path, name: str, new: bool = True) -> Path:
    """SB3's layout: `root`/`name`_N, N one past the latest (or the latest again if not `new`)."""
    runs = [int(m.group(1)) for p in root.glob(f"{name}_*") if (m := re.fullmatch(rf"{re.escape(name)}_(\d+)", p.name))]
    latest = max(runs, default=0)
    return root / f"{name}_{latest + 1 if new or not latest else latest}"


class Logger:
    """SB3's `logger.record(key, value)` for callbacks: values kept until the next metric row,
    then written with it (and to TensorBoard, if the run writes it)."""

    def __init__(self):
        self.values: dict[str, float] = {}

    def record(self, key: str, value, exclude=None) -> None:
        self.values[key] = value

    def record_mean(self, key: str, value, exclude=None) -> None:
        self.values[key] = value

    def take(self) -> dict:
        values, self.values = self.values, {}
        return values


class TensorBoardLog:
    """Writes each metric row's scalars at its env step."""

    def __init__(self, log_dir: Path, algo: str, learning_rate: float, field: str = "tensorboard_log"):
        self.log_dir = Path(log_dir)
        self.writer = writer(self.log_dir, field)
        self.algo, self.learning_rate = algo, learning_rate

    def write(self, row: dict, recorded: dict | None = None) -> None:
        step = int(row["env_steps"])
        scalars = {"time/fps": row["steps_per_s"], "time/episodes": row["episodes"],
                   "train/n_updates": row["updates"], "train/learning_rate": self.learning_rate,
                   "rollout/ep_rew_mean": row["mean_return_100"], "eval/mean_reward": row["eval_return"],
                   "train/loss" if self.algo == "dqn" else "train/critic_loss": row["loss"]}
        if self.algo == "dqn":
            scalars["rollout/exploration_rate"] = row["epsilon"]
        scalars.update(recorded or {})
        for key, value in scalars.items():
            if isinstance(value, (int, float)) or hasattr(value, "__float__") and not isinstance(value, str):
                self.writer.add_scalar(key, float(value), step)  # a scalar; SB3's console-only text is not one
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
