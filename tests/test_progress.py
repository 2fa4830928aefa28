"""The progress display: a tqdm bar on a terminal, a plain line per metric row elsewhere, both
with the rate over recent steps (not the run's mean) and an ETA."""
import io

import pearl.progress as progress
from pearl.cli import main


class Terminal(io.StringIO):
    def isatty(self):
        return True


def row(steps, **extra):
    return {"env_steps": steps, "mean_return_100": 20.0, "loss": 0.5, "epsilon": 0.1, "eval_return": "", **extra}


def test_lines_outside_a_terminal_show_the_recent_rate_and_eta(monkeypatch):
    clock = iter([0.0, 1.0, 11.0])
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock))
    out = io.StringIO()
    display = progress.Progress(0, 3000, stream=out)
    display.row(row(1000))   # 1000 steps in 1 s
    display.row(row(2000))   # the next 1000 in 10 s: 100 steps/s now (the mean would say 182)
    display.close()
    first, second = out.getvalue().splitlines()
    assert "1,000 steps/s" in first and "ETA 0:02" in first
    assert "100 steps/s" in second and "ETA 0:10" in second and "return 20.0" in second


def test_a_bar_on_a_terminal():
    out = Terminal()
    display = progress.Progress(0, 2000, stream=out)
    display.tick(500)
    display.row(row(1000))
    display.row(row(2000, eval_return=99.0))
    display.close()
    text = out.getvalue()
    assert "2.00k/2.00k" in text and "step/s" in text and "return 20.0" in text
    assert "2,000 steps: eval return 99.0" in text


def test_lines_forced_on_a_terminal():
    out = Terminal()
    display = progress.Progress(0, 2000, stream=out, bar=False)
    display.row(row(1000))
    assert out.getvalue().startswith("1,000/2,000 steps |")


def test_cli_train_prints_a_line_per_interval_in_ci_logs(tmp_path, capsys):
    assert main(["train", "--steps", "3000", "--run-dir", str(tmp_path / "run")]) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if " steps/s | ETA " in line]
    assert [line.split("/")[0].strip() for line in lines] == ["1,000", "2,000", "3,000"]
