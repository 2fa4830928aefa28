"""What a training run leaves behind: progress on stderr (pearl/progress.py), metrics.csv, and a
learning-curve PNG."""
from __future__ import annotations

import csv
import time
from pathlib import Path

from pearl.progress import Progress

METRIC_COLUMNS = ("env_steps", "updates", "episodes", "mean_return_100", "eval_return",
                  "loss", "epsilon", "steps_per_s", "wall_s")
COUNT_COLUMNS = ("env_steps", "updates", "episodes")  # integers, also in the rows a resumed run rewrites


class RunLog:
    """Collects metric rows every `interval` env steps; writes them to `run_dir`/metrics.csv."""

    def __init__(self, run_dir: Path | None, interval: int, start_steps: int, total: int, progress: bool,
                 label: str | None = None, extra=None, resume_after: int | None = None):
        """`label` (e.g. "simulated FPGA ...") starts every progress line and fills a `label`
        column of metrics.csv; `extra(counters) -> dict` adds columns (called with None for their names) (e.g. simulated device time).
        `resume_after`: continue run_dir's metrics.csv, keeping its rows up to that env step (the
        resumed checkpoint's; later rows were logged after it and are logged again)."""
        self.run_dir, self.interval, self.total, self.progress = run_dir, interval, total, progress
        self.label, self.extra = label, extra
        self.rows: list[dict] = []
        self.start = time.perf_counter()
        self.start_steps = start_steps
        self.next_row = start_steps - start_steps % interval + interval
        self.display = Progress(start_steps, total, label, bar=progress is True) if progress else None
        self._csv = None
        if run_dir is not None:
            run_dir.mkdir(parents=True, exist_ok=True)
            columns = list(METRIC_COLUMNS)
            if extra is not None:
                columns += list(extra(None))
            if label is not None:
                columns.append("label")
            if resume_after is not None:
                self.rows = [row for row in _read_rows(run_dir / "metrics.csv")
                             if row["env_steps"] <= resume_after]
            self._file = open(run_dir / "metrics.csv", "w", newline="")
            self._csv = csv.DictWriter(self._file, fieldnames=columns, extrasaction="ignore")
            self._csv.writeheader()
            self._csv.writerows(self.rows)

    def steps_per_s(self, env_steps: int) -> float:
        elapsed = time.perf_counter() - self.start
        return (env_steps - self.start_steps) / elapsed if elapsed > 0 else 0.0

    def __call__(self, counters, epsilon, eval_return: float | None = None) -> None:
        """A row of `counters` (pearl.runtime.counters.Counters) if one is due or an eval is given;
        `epsilon(env_steps)`: the act schedule (called only for a row: it costs as much as the
        rest of a round's bookkeeping)."""
        if self.display is not None:
            self.display.tick(counters.env_steps)
        if counters.env_steps < self.next_row and eval_return is None:
            return
        self.next_row = counters.env_steps - counters.env_steps % self.interval + self.interval
        row = {
            "env_steps": counters.env_steps, "updates": counters.updates, "episodes": counters.episodes,
            "mean_return_100": _round(counters.mean_return()), "eval_return": _round(eval_return),
            "loss": _round(counters.take_mean_loss(), 6), "epsilon": round(epsilon(counters.env_steps), 4),
            "steps_per_s": round(self.steps_per_s(counters.env_steps), 1),
            "wall_s": round(time.perf_counter() - self.start, 2),
        }
        if self.extra is not None:
            row.update(self.extra(counters))
        if self.label is not None:
            row["label"] = self.label
        self.rows.append(row)
        if self._csv is not None:
            self._csv.writerow(row)
            self._file.flush()
        if self.display is not None:
            self.display.row(row)

    def close(self) -> None:
        if self.display is not None:
            self.display.close()
        if self._csv is not None:
            self._file.close()


def _read_rows(path: Path) -> list[dict]:
    """metrics.csv's rows with numbers as numbers (empty cells stay "")."""
    if not path.is_file():
        return []

    def number(column: str, text: str):
        if text == "" or column == "label":
            return text
        return int(text) if column in COUNT_COLUMNS else float(text)

    with open(path, newline="") as f:
        return [{k: number(k, v) for k, v in row.items()} for row in csv.DictReader(f)]


def _round(value, digits: int = 2):
    return "" if value is None else round(float(value), digits)


def plot_learning_curve(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["env_steps"] for r in rows if r["mean_return_100"] != ""]
    returns = [r["mean_return_100"] for r in rows if r["mean_return_100"] != ""]
    evals = [(r["env_steps"], r["eval_return"]) for r in rows if r["eval_return"] != ""]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, returns, label="training return (mean of last 100 episodes)")
    if evals:
        ax.plot(*zip(*evals), "o-", label="greedy evaluation return")
    ax.set_xlabel("environment steps")
    ax.set_ylabel("episode return")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    tmp.replace(path)


def simulated_columns(fpga, start: dict | None) -> dict:
    """RunLog's label and extra column for a run on a simulated FPGA (`start`: its report at the
    run's start, the device may be shared), or nothing."""
    if start is None:
        return {}

    def extra(counters):
        return {"fpga_simulated_s": None if counters is None else round(fpga.simulated_s - start["simulated_s"], 6)}

    return {"label": fpga.label, "extra": extra}

