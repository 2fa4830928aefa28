"""benchmarks/replay_pixels.py's floor for the sample rows (the benchmark itself runs minutes: not a test)."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import replay_pixels  # noqa: E402


def test_streaming_read_is_measured_on_each_thread_count():
    for threads in (1, 2):
        assert 0.1 < replay_pixels.streaming_read_gbps(threads, table_bytes=64 * 2**20) < 1000


def test_floor_is_the_batchs_frames_over_the_best_bandwidth(capsys):
    frames_32 = 32 * (replay_pixels.STACK + 1) * replay_pixels.FRAME_BYTES  # 1,128,960 bytes
    rounds = [{"pearl-t2": {"uniform_32": 50.0, "per_32": 60.0}, "cpprb": {"uniform_32": 120.0, "per_32": 240.0},
               "tianshou": {"uniform_32": 300.0, "per_32": 150.0}}]
    summary = replay_pixels.report(100_000, [32], rounds)
    replay_pixels.report_floor([32], {1: 10.0, 2: 25.0}, summary)
    floor = frames_32 / 25.0 / 1e3
    assert summary["uniform_32"]["floor_us"] == pytest.approx(floor)  # 45.2 us
    lines = capsys.readouterr().out.splitlines()
    uniform, per = (next(line for line in lines if line.lstrip().startswith("floor") and op in line)
                    for op in ("uniform_32", "per_32"))
    assert "asks for 40.0 us" in uniform and "below the floor" in uniform  # 120 / 3 < 45.2
    assert "asks for 50.0 us" in per and "above the floor" in per  # the best rival's 150 / 3 > 45.2
