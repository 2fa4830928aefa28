"""A train call's progress on stderr: on a terminal a tqdm bar (the rate over recent seconds, not
the call's mean, and the ETA from it, with the latest return, loss and epsilon beside it);
elsewhere (CI logs, a pipe) one plain line per metric row with the same recent rate and ETA."""
from __future__ import annotations

import sys
import time


class Progress:
    """`tick(env_steps)` after every round (cheap: the bar redraws at most 10 times a second),
    `row(row)` for each metric row (pearl.runlog.RunLog), `close()` at the end."""

    REDRAW_S = 0.1

    def __init__(self, start_steps: int, total: int, label: str | None = None, stream=None, bar: bool = True):
        """`bar`: a tqdm bar if the stream is a terminal (else lines)."""
        self.stream = stream if stream is not None else sys.stderr
        self.total, self.label = total, label
        self.shown = self.last_steps = start_steps
        self.last_time = self.next_draw = time.monotonic()
        self.bar = None
        if bar and self.stream.isatty():
            from tqdm import tqdm  # (here: its import costs ~0.1 s, and only a terminal needs it)

            class Bar(tqdm):
                # no monitor thread: `tick` redraws every REDRAW_S (miniters=1), and a thread would
                # keep the processes runtime from forking its actors (processes.py `start`)
                monitor_interval = 0

            # smoothing: tqdm's rate is an exponential moving average of recent redraws
            self.bar = Bar(total=total, initial=start_steps, unit="step", unit_scale=True, dynamic_ncols=True,
                           smoothing=0.1, file=self.stream, desc=label, leave=True, miniters=1)

    def tick(self, env_steps: int) -> None:
        if self.bar is None:
            return
        now = time.monotonic()
        if now >= self.next_draw or env_steps >= self.total:
            self.bar.update(env_steps - self.shown)
            self.shown, self.next_draw = env_steps, now + self.REDRAW_S

    def row(self, row: dict) -> None:
        summary = [f"return {_fmt(row['mean_return_100'])}", f"loss {_fmt(row['loss'], 4)}",
                   f"eps {row['epsilon']:.2f}"]
        if row["eval_return"] != "":
            summary.append(f"eval {row['eval_return']:.1f}")
        if self.bar is not None:
            self.tick(int(row["env_steps"]))
            self.bar.set_postfix_str(" | ".join(summary), refresh=False)
            if row["eval_return"] != "":
                self.bar.write(f"{int(row['env_steps']):,} steps: eval return {row['eval_return']:.1f}",
                               file=self.stream)
            return
        steps, now = int(row["env_steps"]), time.monotonic()
        rate = (steps - self.last_steps) / (now - self.last_time) if now > self.last_time else 0.0
        self.last_steps, self.last_time = steps, now
        eta = _duration((self.total - steps) / rate) if rate > 0 and steps < self.total else "-"
        width = len(f"{self.total:,}")
        line = " | ".join([f"{steps:>{width},}/{self.total:,} steps", f"{rate:>8,.0f} steps/s",
                           f"ETA {eta}", *summary])
        if self.label is not None:
            line = f"[{self.label}] {line}"
        self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _fmt(value, digits: int = 1) -> str:
    return "-" if value == "" else f"{value:.{digits}f}"


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"
