"""benchmarks/replay_pixels.py's floor for the sample rows: the bare copy of a batch's windows
(benchmarks/window_copy.cpp) against numpy, and the report's floor lines (the benchmark itself runs
minutes: not a test)."""
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import replay_pixels  # noqa: E402
from pearl.kernels.fpga.build import available  # noqa: E402

needs_compiler = pytest.mark.skipif(not available(), reason="no C++ compiler")
SPAN_ROWS = replay_pixels.STACK + 1


@needs_compiler
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("batch, width", [(32, 7056), (13, 99), (3, 64)])
def test_the_bare_copy_copies_each_window(threads, batch, width):
    """Windows of 5 rows, 8 at a time and the rest one by one, lines and a tail: the last batch's
    output equals numpy's windows."""
    rng = np.random.default_rng(batch)
    frames = rng.integers(0, 256, (500, width), dtype=np.uint8)
    starts = rng.integers(0, 500 - SPAN_ROWS + 1, 4 * batch)
    out = np.zeros(batch * SPAN_ROWS * width, np.uint8)
    us = replay_pixels.bare_copy_us(frames, starts, batch, threads, out)
    assert us.shape == (4,) and np.all(us > 0)
    expected = np.concatenate([frames[s:s + SPAN_ROWS].reshape(-1) for s in starts[-batch:]])
    assert np.array_equal(out, expected)


@needs_compiler
def test_the_bare_copy_refuses_windows_outside_the_table():
    frames = np.zeros((100, 64), np.uint8)
    with pytest.raises(ValueError, match="window starts"):
        replay_pixels.bare_copy_us(frames, np.array([100 - SPAN_ROWS + 1]), 1, 1)
    with pytest.raises(ValueError, match="window starts"):
        replay_pixels.bare_copy_us(frames, np.array([-1]), 1, 1)


def test_the_floor_sets_each_rounds_bare_copy_beside_what_3x_asks_for(capsys):
    rounds = [{"pearl-t2": {"uniform_32": 50.0, "per_32": 60.0, "bare_copy_32": 45.0},
               "cpprb": {"uniform_32": 120.0, "per_32": 240.0}, "tianshou": {"uniform_32": 300.0, "per_32": 150.0}},
              {"pearl-t2": {"uniform_32": 50.0, "per_32": 60.0, "bare_copy_32": 41.0},
               "cpprb": {"uniform_32": 126.0, "per_32": 240.0}, "tianshou": {"uniform_32": 300.0, "per_32": 150.0}}]
    summary = replay_pixels.report(100_000, [32], rounds)
    replay_pixels.report_floor([32], rounds, summary)
    assert summary["uniform_32"]["bare_copy_us"] == [45.0, 41.0]
    lines = capsys.readouterr().out.splitlines()
    uniform, per = (next(line for line in lines if line.lstrip().startswith("floor") and op in line)
                    for op in ("uniform_32", "per_32"))
    # uniform asks 40.0 / 42.0 us: the copy (45 / 41) leaves -5.0 / 1.0 us, one round above it
    assert "asks for 40.0 / 42.0 us" in uniform and "leaves -5.0 / 1.0 us" in uniform
    assert "0.375 / 0.325 of the best rival" in uniform
    # PER's best rival is Tianshou's 150: 50 us asked in both rounds, above both copies
    assert "asks for 50.0 / 50.0 us" in per and "leaves 5.0 / 9.0 us" in per
    rounds[1]["pearl-t2"]["bare_copy_32"] = 43.0
    replay_pixels.report_floor([32], rounds, replay_pixels.report(100_000, [32], rounds))
    uniform = next(line for line in capsys.readouterr().out.splitlines() if "floor uniform_32" in line)
    assert "no sampler that copies the windows reaches 3x here" in uniform


class FakeWorker:
    """A worker whose blocks are logged instead of timed."""

    def __init__(self, system, log):
        self.system, self.log = system, log

    def time(self, op, threads, calls, warmup):
        self.log.append((self.system, op, threads, calls, warmup))
        return [float(len(self.log))] * calls


def test_every_system_takes_each_operations_blocks_in_turn():
    """PEARL once per gather thread count (insert once) and its bare copy beside its uniform samples,
    each rival once; every job's blocks alternate in order, the long warm-up in the first block, a
    short one in the others."""
    log = []
    workers = [FakeWorker("pearl", log), FakeWorker("cpprb", log)]
    jobs = [(w.system, op, key, n) for w, op, key, n in replay_pixels.jobs("uniform_32", workers, (1, 2))]
    assert jobs == [("pearl", "uniform_32", "uniform_32@t1", 1), ("pearl", "uniform_32", "uniform_32@t2", 2),
                    ("pearl", "bare_copy_32", "bare_copy_32", 2), ("cpprb", "uniform_32", "uniform_32", 1)]
    assert [key for _, _, key, _ in replay_pixels.jobs("insert", workers, (1, 2))] == ["insert", "insert"]
    assert [key for _, _, key, _ in replay_pixels.jobs("per_32", workers, (2,))] == ["per_32@t2", "per_32"]

    medians = replay_pixels.time_interleaved("uniform_32", workers, (1, 2), repeats=40, blocks=4)
    assert set(medians) == {("pearl", "uniform_32@t1"), ("pearl", "uniform_32@t2"), ("pearl", "bare_copy_32"),
                            ("cpprb", "uniform_32")}
    assert len(log) == 16 and all(calls == 10 for *_, calls, _ in log)
    order = [(system, op, threads) for system, op, threads, _, _ in log]
    assert order[4:8] == order[:4][::-1] and order[8:12] == order[:4]
    assert [warmup for *_, warmup in log] == [replay_pixels.WARMUP_CALLS] * 4 + [replay_pixels.BLOCK_WARMUP_CALLS] * 12


@pytest.mark.parametrize("together", [True, False])
def test_a_round_times_each_systems_live_tables_through_its_worker(monkeypatch, capsys, together):
    """Real worker processes over their stdin / stdout: side by side where the tables fit in memory
    together, else one system at a time; a system that is not installed is reported, not fatal."""
    need = 3000 * replay_pixels.FRAME_BYTES * 1.15
    monkeypatch.setattr(replay_pixels, "memory_available", lambda: 2 * 2**30 + (2 if together else 1.5) * need)
    rows = replay_pixels.run_round(("pearl", "cpprb"), 3000, [8], repeats=8, blocks=2, seed=0, threads=(1, 2))
    pearl = rows["pearl"]
    expected = {"insert", "uniform_8@t1", "uniform_8@t2", "per_8@t1", "per_8@t2", "rss_per_table",
                "huge_pages_per_table"} | ({"bare_copy_8"} if available() else set())
    assert set(pearl) == expected and all(pearl[key] > 0 for key in expected - {"huge_pages_per_table"})
    cpprb = rows["cpprb"]
    assert set(cpprb) == {"unavailable"} or {"insert", "uniform_8", "per_8"} <= set(cpprb)
    alone = "timed one system at a time" in capsys.readouterr().out
    assert alone != together


def test_a_worker_that_dies_is_reported_not_fatal():
    """A worker killed while its table is alive (as the kernel's OOM killer would): its next block
    times nothing and says why; moving on and closing do not raise."""
    worker = replay_pixels.Worker("pearl", 3000, [8], 0)
    try:
        assert worker.ready()
        assert len(worker.time("uniform_8", 1, 3, 0)) == 3
        worker.process.kill()
        worker.process.wait()
        assert worker.time("uniform_8", 1, 3, 0) == []
        assert worker.unavailable.startswith("worker ended (exit ")
        worker.next()
    finally:
        worker.close()


def test_touching_the_pages_reads_every_page_of_a_freshly_written_array():
    """touch_pages walks the process's anonymous memory: an array of 64 MiB written just now is in it,
    so at least its pages are counted."""
    fresh = np.ones(64 << 20, np.uint8)
    assert replay_pixels.touch_pages() >= fresh.size // 4096
    assert fresh[::4096].all()  # read, not written


def test_a_worker_reads_its_pages_before_every_block(monkeypatch):
    """Each block, of either table, starts right after a touch_pages pass: never a block on memory
    that lay unread while the other systems took theirs."""
    log = []
    monkeypatch.setattr(replay_pixels, "touch_pages", lambda: log.append("touch") or 0)
    commands = [{"op": "insert", "threads": 1, "calls": 2, "warmup": 1},
                {"op": "uniform_8", "threads": 1, "calls": 2, "warmup": 1},
                {"op": "uniform_8", "threads": 2, "calls": 2, "warmup": 1}, {"op": "next"},
                {"op": "per_8", "threads": 2, "calls": 2, "warmup": 1}, {"op": "next"}]
    replay_pixels.serve(replay_pixels.Pearl, 300, [8], 0, iter(commands), lambda kind, value: log.append(kind))
    assert log == ["READY"] + ["touch", "TIMES"] * 3 + ["READY", "touch", "TIMES"]
