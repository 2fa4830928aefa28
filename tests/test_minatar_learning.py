"""benchmarks/minatar_learning.py's bookkeeping and verdict (issue 16's learning study), no training:
the derived config keeps the paper's schedule in absolute frames, curves are read from metrics.csv,
seed states decide skip / resume / restart, the value at the target's frame count and the verdict."""
import json
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import minatar_learning as ml  # noqa: E402

BASE = yaml.safe_load(ml.CONFIG.read_text())
HEADER = "env_steps,updates,episodes,mean_return_100,eval_return,loss,epsilon,steps_per_s,wall_s\n"


def test_the_derived_config_keeps_the_epsilon_decay_at_100k_frames():
    config = ml.derived_config(BASE, 150_000, eval_interval=10_000, log_interval=5_000)
    assert config["total_steps"] == 150_000
    assert config["dqn"]["exploration"]["fraction"] * 150_000 == pytest.approx(100_000)
    assert (config["eval"]["interval"], config["log"]["interval"]) == (10_000, 5_000)
    # the rest is the shipped config's, which stays as it was
    assert config["dqn"]["updates_per_step"] == 1.0 and config["dqn"]["learning_starts"] == 5000
    assert BASE["total_steps"] == 5_000_000 and BASE["dqn"]["exploration"]["fraction"] == 0.02
    from pearl.config import parse_config

    parse_config(config)  # a config pearl accepts


@pytest.mark.parametrize("frames, eval_interval, log_interval, field", [
    (50_000, 10_000, 5_000, "--frames"),          # stops inside the exploration decay
    (100_000, 10_000, 5_000, "--frames"),         # the decay begins at the replay start: it ends at 105k
    (6_000_000, 10_000, 5_000, "--frames"),       # past the paper's 5M
    (150_000, 7_000, 5_000, "--eval-interval"),   # not a divisor: no evaluation at the end's frame
    (150_000, 10_000, 0, "--log-interval"),
])
def test_bad_budgets_are_refused_naming_the_flag(frames, eval_interval, log_interval, field):
    with pytest.raises(SystemExit, match=f"^{field}:"):
        ml.derived_config(BASE, frames, eval_interval, log_interval)


def test_read_curve_and_value_at(tmp_path):
    (tmp_path / "metrics.csv").write_text(
        HEADER + "5000,0,600,0.5,,,0.96,200,25\n10000,5000,1200,0.8,2.4,0.001,0.91,190,50\n"
        "15000,10000,1500,1.5,,0.002,0.87,180,80\n")
    curve = ml.read_curve(tmp_path / "metrics.csv")
    assert curve[1] == {"frames": 10000, "train_return_100": 0.8, "eval_return": 2.4, "episodes": 1200,
                        "wall_s": 50.0}
    assert curve[0]["eval_return"] is None
    assert ml.value_at(curve, 15000, "train_return_100", 5000) == 1.5
    assert ml.value_at(curve, 12000, "train_return_100", 5000) == 0.8      # the row at or before
    assert ml.value_at(curve, 20000, "train_return_100", 5000) is None     # not there yet
    assert ml.value_at(curve, 10000, "eval_return", 5000) == 2.4
    assert ml.value_at(curve, 15000, "eval_return", 5000) is None          # no eval in the window
    assert ml.read_curve(tmp_path / "missing.csv") == []
    # the rows a resumed run rewrote
    (tmp_path / "metrics.csv").write_text(HEADER + "5000.0,0.0,600.0,0.5,,,0.96,200,25\n")
    assert ml.read_curve(tmp_path / "metrics.csv")[0]["frames"] == 5000
    # read while pearl writes: a row cut short ends the curve there, as a row that is half a number
    (tmp_path / "metrics.csv").write_text(HEADER + "5000,0,600,0.5,,,0.96,200,25\n10000,5000,12")
    assert [r["frames"] for r in ml.read_curve(tmp_path / "metrics.csv")] == [5000]
    (tmp_path / "metrics.csv").write_text(HEADER + "5000,0,600,0.5,,,0.96,200,25\n1000")
    assert [r["frames"] for r in ml.read_curve(tmp_path / "metrics.csv")] == [5000]


def test_seed_states(tmp_path):
    run = tmp_path / "seed-0"
    assert ml.seed_state(run) == "new"
    run.mkdir()
    (run / "metrics.csv").write_text(HEADER)
    assert ml.seed_state(run) == "new"            # killed before its first checkpoint
    (run / "checkpoint.npz").write_bytes(b"")
    assert ml.seed_state(run) == "partial"
    (run / "result.json").write_text(json.dumps({"interrupted": True}))
    assert ml.seed_state(run) == "partial"        # Ctrl-C'd: resume it
    (run / "result.json").write_text(json.dumps({"interrupted": False, "eval_mean": 3.0}))
    assert ml.seed_state(run) == "done"


def test_verdict():
    assert ml.verdict({"0": 5.0, "1": 6.0, "2": 7.0}, None, 3)[0].startswith("no published value")
    assert ml.verdict({"0": 5.0, "1": 6.0, "2": 7.0}, None, 3)[1] == 6.0
    assert ml.verdict({"0": 5.0, "1": None, "2": 7.0}, 4.0, 3)[0].startswith("incomplete: 2 of 3")
    text, mean = ml.verdict({"0": 5.0, "1": 6.0, "2": 7.0}, 6.0, 3)
    assert text.startswith("met") and mean == 6.0                      # reaching it is enough
    assert ml.verdict({"0": 5.0, "1": 6.0, "2": 6.9}, 6.0, 3)[0].startswith("not met")


def _study(tmp_path, *extra):
    return ml.Study(ml.parse_args(["--out", str(tmp_path), "--frames", "20000", *extra]))


def test_the_study_saves_curves_and_the_verdict_from_the_run_dirs(tmp_path):
    for seed, train in ((0, 2.0), (1, 3.0), (2, 4.0)):
        run = tmp_path / f"seed-{seed}"
        run.mkdir()
        (run / "metrics.csv").write_text(HEADER + "10000,5000,900,1.0,,,0.9,100,90\n"
                                         f"20000,15000,1500,{train},2.5,,0.1,100,190\n")
        (run / "checkpoint.npz").write_bytes(b"")
    data = _study(tmp_path, "--target-return", "2.9", "--how-read", "test").save()
    assert [data["seeds"][s]["at_target"] for s in "012"] == [2.0, 3.0, 4.0]
    assert data["seeds"]["0"]["state"] == "partial" and data["target"]["frames"] == 20000
    assert data["verdict"].startswith("met") and data["mean_at_target"] == 3.0
    assert json.loads((tmp_path / "curves.json").read_text())["verdict"] == data["verdict"]
    # the greedy evaluation instead: 2.5 < 2.9
    assert _study(tmp_path, "--target-return", "2.9", "--metric", "eval").save()["verdict"].startswith("not met")
    # the built-in target has no value: not judged
    assert _study(tmp_path).save()["verdict"].startswith("no published value")


def test_a_seeds_record_keeps_what_is_added_to_it_between_saves(tmp_path):
    study = _study(tmp_path)
    record = study.data["seeds"].setdefault("1", {})
    record["starts"] = ["first"]
    study.save()
    record["cpu_s_children"] = 12.5  # as train() adds after the seed's polls
    study.save()
    assert json.loads((tmp_path / "curves.json").read_text())["seeds"]["1"]["cpu_s_children"] == 12.5
    again = _study(tmp_path)  # a later run of the script keeps the records
    assert again.save()["seeds"]["1"]["starts"] == ["first"]


def test_bad_arguments_are_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        ml.parse_args(["--out", str(tmp_path), "--target-frames", "100000"])
    assert "--target-frames: give --target-return" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="^--target-frames: at most"):
        _study(tmp_path, "--target-return", "1", "--target-frames", "30000")


def _reference(path, returns, stamps):
    path.write_text(json.dumps({"returns": returns, "frame_stamps": stamps}))
    return str(path)


def test_the_target_from_reference_runs_is_their_last_100_episodes_by_the_frame_count(tmp_path):
    # run a: 150 episodes of 100 frames (returns 0..149), then one more that the loop cut at 15,050
    a = _reference(tmp_path / "a.json", [*range(150), 99.0], [100 * (i + 1) for i in range(150)] + [15_050])
    # run b: every return 2.0 by 12,000 frames, 9.0 after; its last episode ends at the budget
    b = _reference(tmp_path / "b.json", [2.0] * 120 + [9.0] * 31, [100 * (i + 1) for i in range(151)])
    # a at 15,000: episodes 50..149 (the cut one is never counted) -> 99.5; b at 12,000: 2.0
    assert ml.reference_return([Path(a)], 15_000) == pytest.approx(99.5)
    assert ml.reference_return([Path(b)], 12_000) == pytest.approx(2.0)
    assert ml.reference_return([Path(a), Path(b)], 12_000) == pytest.approx((69.5 + 2.0) / 2)
    # b at its budget, 15,100: its last episode is left out -> episodes 50..149: 70 x 2.0 + 30 x 9.0
    assert ml.reference_return([Path(b)], 15_100) == pytest.approx((70 * 2.0 + 30 * 9.0) / 100)


def test_reference_runs_in_the_file_minatars_dqn_writes(tmp_path):
    import collections

    import torch

    torch.save({"returns": [1.0] * 100 + [3.0] * 100, "frame_stamps": list(range(10, 2001, 10)),
                "policy_net_state_dict": collections.OrderedDict(w=torch.zeros(2, 2))},
               tmp_path / "breakout_data_and_weights")
    assert ml.reference_run(tmp_path / "breakout_data_and_weights")[0][-1] == 3.0
    # episodes 99..198 (the 200th, at the budget, left out): one 1.0 and 99 x 3.0
    assert ml.reference_return([tmp_path / "breakout_data_and_weights"], 2000) == pytest.approx((1.0 + 99 * 3.0) / 100)


@pytest.mark.parametrize("content, frames, message", [
    ({"returns": [1.0] * 200, "frame_stamps": list(range(1, 201))}, 500, "expected a run of >= 500 frames"),
    ({"returns": [1.0] * 50, "frame_stamps": list(range(1, 51))}, 40, "expected >= 100 episodes"),
    ({"returns": [1.0]}, 1, "expected a file with 'returns' and 'frame_stamps'"),
    ({"returns": [1.0, 2.0], "frame_stamps": [5, 3]}, 1, "expected one rising frame stamp per episode"),
])
def test_bad_reference_runs_are_refused_naming_the_file(tmp_path, content, frames, message):
    path = tmp_path / "run.json"
    path.write_text(json.dumps(content))
    with pytest.raises(SystemExit, match=f"^--reference-runs {path}: {message}"):
        ml.reference_return([path], frames)
    with pytest.raises(SystemExit, match="^--reference-runs .*missing.json: expected a file"):
        ml.reference_return([tmp_path / "missing.json"], frames)


def test_the_study_judged_against_reference_runs(tmp_path):
    for seed, train in ((0, 2.0), (1, 3.0), (2, 4.0)):
        run = tmp_path / f"seed-{seed}"
        run.mkdir()
        (run / "metrics.csv").write_text(HEADER + f"20000,15000,1500,{train},2.5,,0.1,100,190\n")
    stamps = [150 * (i + 1) for i in range(133)] + [20_000]
    refs = [_reference(tmp_path / f"ref{k}.json", [value] * 134, stamps) for k, value in enumerate((2.5, 3.5))]
    data = _study(tmp_path, "--reference-runs", *refs).save()
    assert data["target"]["value"] == pytest.approx(3.0) and data["target"]["frames"] == 20_000
    assert "2 runs of kenjyoung/MinAtar examples/dqn.py" in data["target"]["how_read"]
    assert data["verdict"].startswith("met: mean 3.00 >= published 3.00")
    assert _study(tmp_path, "--reference-runs", refs[1], "--metric", "train").save()["verdict"].startswith("not met")


def test_a_target_given_twice_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        ml.parse_args(["--out", str(tmp_path), "--target-return", "1", "--reference-runs", "r.json"])
    assert "--reference-runs: the target comes from --target-return or from reference runs" in capsys.readouterr().err
