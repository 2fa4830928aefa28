"""Issue 16's learning study: DQN on MinAtar Breakout, several seeds, against a published DQN curve.

Each seed is one `pearl train` of configs/minatar_breakout_dqn.yaml (the MinAtar paper's DQN: Young
& Tian 2019, arXiv:1903.03176, and its code; see the config's header) cut to `--frames` env
steps (= MinAtar frames: no frame skip). The cut keeps the paper's schedule in absolute frames (epsilon
1 -> 0.1 over the 100k frames after the replay start of 5000, target every 1000, one update per frame), so
a run's first N frames are those of the paper's 5M-frame run and its curve is comparable at N.

The study writes, under --out: the derived config (config.yaml), one run directory per seed
(seed-S: metrics.csv, checkpoints, result.json; seed-S.log: the run's output) and curves.json, which
is rewritten every --poll seconds while a seed trains and holds every seed's curve (training return
over the last 100 episodes and the greedy evaluations, against frames), the target and the verdict.
Run it again with the same arguments to go on: finished seeds are skipped, an interrupted one is
resumed from its latest checkpoint (`pearl train --resume`). No wall-clock limit anywhere: the run
may be paused (SIGSTOP to its process group) and continued (SIGCONT) at any time.

The comparison: the published curve's value at --target-frames against each seed's return at that
frame count (the metric the source plots: `train` = the mean return of the last 100 training
episodes, epsilon-greedy as the paper's curves; `eval` = PEARL's greedy evaluation); the study meets
the target when the mean over the seeds reaches the published value with every seed at that frame
count. No published value is built in (see TARGETS): without --target-return the verdict says so.

Where the published figure cannot be read, `--reference-runs` takes the value from runs of the code
that drew it (kenjyoung/MinAtar examples/dqn.py, the paper's DQN, NUM_FRAMES set to --frames; its
`<output>_data_and_weights` file, or a JSON file with the same "returns" and "frame_stamps" lists):
each run's mean return over its last 100 training episodes that ended by --target-frames (the
measure PEARL's `mean_return_100` is), averaged over the runs. That code is not part of PEARL.

    python benchmarks/minatar_learning.py --frames 150000 --out runs/minatar-study
    python benchmarks/minatar_learning.py --frames 150000 --out runs/minatar-study \\
        --target-frames 150000 --target-return X --report     # the verdict only, no training
    python benchmarks/minatar_learning.py --frames 150000 --out runs/minatar-study --report \\
        --reference-runs ref/breakout-0_data_and_weights ref/breakout-1_data_and_weights ...
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from side_by_side import load_average  # noqa: E402  (benchmarks/ is the script's own directory)

from pearl.io import atomic_write_text  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "configs" / "minatar_breakout_dqn.yaml"

# Published DQN curves on MinAtar Breakout. `value` is the return read off the source at `frames`
# frames; None where it has not been read (the figures are images: nothing on this machine or in
# the text that the project's search could reach states the curve's values; docs/BENCHMARKS.md,
# "Pixels end to end (issue 16)", sessions 14 and 44): --target-return enters a value read off the
# figure, --reference-runs takes it from runs of the figure's own code.
TARGETS = {
    "young-tian-2019": {
        "source": "Young & Tian 2019, MinAtar (arXiv:1903.03176v2), the DQN learning curve on Breakout "
                  "(the paper's learning-curve figure; the same curves as img/results.gif in "
                  "github.com/kenjyoung/MinAtar): 30 runs, the hyperparameters of "
                  "configs/minatar_breakout_dqn.yaml",
        "metric": "train",
        "frames": None,
        "value": None,
        "how_read": "not read yet: enter the value read off the figure at a frame count with "
                    "--target-frames/--target-return",
    },
}
METRICS = {"train": "train_return_100", "eval": "eval_return"}
REFERENCE_EPISODES = 100  # the window of PEARL's mean_return_100


def reference_run(path: Path) -> tuple[list[float], list[int]]:
    """(episode returns, the frame count at each episode's end) of one reference run: a JSON file,
    or the torch file MinAtar's examples/dqn.py writes (plain lists and tensors: loaded weights-only)."""
    try:
        if path.suffix == ".json":
            data = json.loads(path.read_text())
        else:
            import torch

            data = torch.load(path, weights_only=True)
        returns, stamps = [float(r) for r in data["returns"]], [int(t) for t in data["frame_stamps"]]
    except (OSError, ValueError, KeyError, TypeError, RuntimeError, AttributeError) as error:
        raise SystemExit(f"--reference-runs {path}: expected a file with 'returns' and 'frame_stamps' "
                         f"lists (examples/dqn.py's output or JSON), got {type(error).__name__}: {error}")
    if len(returns) != len(stamps) or any(b < a for a, b in zip(stamps, stamps[1:])):
        raise SystemExit(f"--reference-runs {path}: expected one rising frame stamp per episode return")
    return returns, stamps


def reference_return(paths: list[Path], frames: int) -> float:
    """The mean over the runs in `paths` of each run's mean return over its last REFERENCE_EPISODES
    episodes that ended at or before `frames`. A run's last episode is never counted: the code's loop
    stops it unfinished at its frame budget."""
    means = []
    for path in paths:
        returns, stamps = reference_run(path)
        if not stamps or stamps[-1] < frames:
            raise SystemExit(f"--reference-runs {path}: expected a run of >= {frames:,} frames, it ends "
                             f"at {stamps[-1] if stamps else 0:,}")
        ended = [r for r, t in zip(returns[:-1], stamps[:-1]) if t <= frames][-REFERENCE_EPISODES:]
        if len(ended) < REFERENCE_EPISODES:
            raise SystemExit(f"--reference-runs {path}: expected >= {REFERENCE_EPISODES} episodes ended by "
                             f"{frames:,} frames, got {len(ended)}")
        means.append(statistics.fmean(ended))
    return statistics.fmean(means)


def derived_config(base: dict, frames: int, eval_interval: int, log_interval: int) -> dict:
    """`base` (the shipped config as a dict) cut to `frames` env steps with its epsilon decay kept in
    absolute frames (the schedule is a fraction of total_steps)."""
    base_total, explore = base["total_steps"], base["dqn"]["exploration"]
    decay_frames = round(explore["fraction"] * base_total)
    decay_end = decay_frames + (base["dqn"]["learning_starts"] if explore.get("decay_from") == "learning_starts" else 0)
    if frames < decay_end or frames > base_total:
        raise SystemExit(f"--frames: expected {decay_end:,} (the end of the exploration decay) to "
                         f"{base_total:,}, got {frames:,}")
    for name, value in (("--eval-interval", eval_interval), ("--log-interval", log_interval)):
        if value < 1 or frames % value:
            raise SystemExit(f"{name}: expected a divisor of --frames {frames:,}, got {value:,}")
    config = json.loads(json.dumps(base))  # a deep copy of plain YAML data
    config["total_steps"] = frames
    config["dqn"]["exploration"]["fraction"] = decay_frames / frames
    config["eval"]["interval"] = eval_interval
    config["log"]["interval"] = log_interval
    # a kill (or a reboot) loses at most this many frames of a seed
    config["log"]["checkpoint_interval"] = eval_interval
    return config


def _number(text: str):
    return float(text) if text else None


def read_curve(metrics_csv: Path) -> list[dict]:
    """metrics.csv's rows as {frames, train_return_100, eval_return, episodes, wall_s}, up to the
    first row that does not parse: the file is read while pearl writes it (a row being written, or
    the whole file rewritten by a resumed run), and the next read sees the row whole."""
    if not metrics_csv.is_file():
        return []
    curve = []
    with open(metrics_csv, newline="") as f:
        for row in csv.DictReader(f):
            if None in row.values():  # cells missing: the row is being written
                break
            # int(float()): run directories resumed before pearl/runlog.py kept counts integers (session 14)
            # hold their earlier rows' counts as floats ("5000.0"); the study's own runs are such
            curve.append({"frames": int(float(row["env_steps"])), "train_return_100": _number(row["mean_return_100"]),
                          "eval_return": _number(row["eval_return"]), "episodes": int(float(row["episodes"])),
                          "wall_s": _number(row["wall_s"])})
    return curve


def seed_state(run_dir: Path) -> str:
    """new (nothing to continue), partial (a checkpoint to resume) or done (result.json of a run
    that was not interrupted)."""
    result = run_dir / "result.json"
    if result.is_file() and not json.loads(result.read_text()).get("interrupted"):
        return "done"
    return "partial" if (run_dir / "checkpoint.npz").is_file() else "new"


def value_at(curve: list[dict], frames: int, metric: str, window: int) -> float | None:
    """The seed's `metric` (train_return_100 or eval_return) in the last row logged within `window`
    frames before `frames` (inclusive); None if the seed has not got there."""
    rows = [r for r in curve if frames - window < r["frames"] <= frames and r[metric] is not None]
    return rows[-1][metric] if rows else None


def verdict(values: dict, target_value: float | None, seeds: int) -> tuple[str, float | None]:
    """(verdict, mean over the seeds) for `values` {seed: value or None at the target frames}."""
    reached = [v for v in values.values() if v is not None]
    mean = statistics.fmean(reached) if reached else None
    if target_value is None:
        return "no published value entered (--target-return): not judged", mean
    if len(reached) < seeds:
        return f"incomplete: {len(reached)} of {seeds} seeds at the target's frame count", mean
    if mean >= target_value:
        return f"met: mean {mean:.2f} >= published {target_value:.2f}", mean
    return f"not met: mean {mean:.2f} < published {target_value:.2f}", mean


class Study:
    def __init__(self, args):
        self.args, self.out = args, Path(args.out)
        self.target = dict(TARGETS[args.target])
        if args.target_return is not None:
            self.target.update(value=args.target_return, frames=args.target_frames or args.frames,
                               how_read=args.how_read or "given on the command line")
        elif args.reference_runs:
            frames = args.target_frames or args.frames
            paths = [Path(p) for p in args.reference_runs]
            self.target.update(
                value=reference_return(paths, frames), frames=frames, metric="train",
                how_read=args.how_read or f"the figure's own code re-run ({len(paths)} runs of kenjyoung/MinAtar "
                f"examples/dqn.py: {', '.join(map(str, paths))}): each run's mean return over its last "
                f"{REFERENCE_EPISODES} training episodes at {frames:,} frames, averaged")
        self.target["frames"] = self.target["frames"] or args.frames
        if self.target["frames"] > args.frames:
            raise SystemExit(f"--target-frames: at most --frames {args.frames:,}, got {self.target['frames']:,}")
        self.metric = METRICS[args.metric or self.target["metric"]]
        self.path = self.out / "curves.json"
        self.env = yaml.safe_load(Path(args.config).read_text())["env"]
        self.data = json.loads(self.path.read_text()) if self.path.is_file() else {"seeds": {}}

    def run_dir(self, seed: int) -> Path:
        return self.out / f"seed-{seed}"

    def save(self) -> dict:
        at_target = {}
        for seed in self.args.seeds:
            run_dir = self.run_dir(seed)
            curve = read_curve(run_dir / "metrics.csv")
            at_target[seed] = value_at(curve, self.target["frames"], self.metric, self.args.log_interval)
            # in place: train() keeps adding to the seed's record while the seed runs
            self.data["seeds"].setdefault(str(seed), {}).update(
                state=seed_state(run_dir), curve=curve, at_target=at_target[seed])
        text, mean = verdict(at_target, self.target["value"], len(self.args.seeds))
        self.data.update(
            study=f"DQN on {self.env} ({self.args.config} cut to --frames)",
            frames=self.args.frames, runtime=self.args.runtime, actors=self.args.actors,
            target=self.target, metric=self.metric, mean_at_target=mean, verdict=text,
            updated=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), load_average=load_average())
        atomic_write_text(self.path, json.dumps(self.data, indent=1))
        return self.data

    def train(self, seed: int) -> None:
        run_dir, state = self.run_dir(seed), seed_state(self.run_dir(seed))
        if state == "done":
            print(f"seed {seed}: done already, skipped", flush=True)
            return
        if state == "new" and run_dir.exists():  # killed before its first checkpoint: start again
            run_dir.rename(run_dir.with_name(f"{run_dir.name}.stale-{time.strftime('%H%M%S')}"))
        command = [sys.executable, "-c", "import sys; from pearl.cli import main; sys.exit(main())", "train"]
        if state == "partial":
            command += ["--resume", str(run_dir)]
        else:
            command += [str(self.out / "config.yaml"), "--seed", str(seed), "--run-dir", str(run_dir),
                        "--runtime", self.args.runtime]
            if self.args.runtime == "processes":
                command += ["--actors", str(self.args.actors)]
        command.append("--quiet")
        record = self.data["seeds"].setdefault(str(seed), {})
        record.setdefault("starts", []).append({"at": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                                                "how": state, "load_average": load_average()})
        print(f"seed {seed}: {'resuming' if state == 'partial' else 'starting'} ({' '.join(command[3:])}), "
              f"load {load_average()}", flush=True)
        cpu0 = os.times()
        with open(self.out / f"seed-{seed}.log", "a") as log:
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
            while True:
                try:  # a poll interval, not a limit: the run takes as long as it takes
                    code = process.wait(timeout=self.args.poll)
                    break
                except subprocess.TimeoutExpired:
                    self.save()
        cpu1 = os.times()
        record.setdefault("cpu_s_children", 0.0)
        record["cpu_s_children"] += (cpu1.children_user + cpu1.children_system
                                     - cpu0.children_user - cpu0.children_system)
        self.save()
        if code != 0:
            raise SystemExit(f"seed {seed}: pearl train exited with {code}; see {self.out}/seed-{seed}.log "
                             f"(run this again to resume from its latest checkpoint)")

    def report(self) -> None:
        data = self.save()
        t = self.target
        print(f"target: {t['source']}\n  metric {self.metric}, at {t['frames']:,} frames: "
              f"{t['value'] if t['value'] is not None else 'not entered'} ({t['how_read']})")
        print(f"{'seed':>4} {'state':>8} {'frames':>9} {'train_100':>9} {'eval':>6} {'at target':>9}")
        for seed, s in data["seeds"].items():
            last = s["curve"][-1] if s["curve"] else {}
            evals = [r["eval_return"] for r in s["curve"] if r["eval_return"] is not None]
            print(f"{seed:>4} {s['state']:>8} {last.get('frames', 0):>9,} "
                  f"{_fmt(last.get('train_return_100')):>9} {_fmt(evals[-1] if evals else None):>6} "
                  f"{_fmt(s['at_target']):>9}")
        print(f"verdict: {data['verdict']}" + (f" (mean at target {data['mean_at_target']:.2f})"
                                               if data["mean_at_target"] is not None else ""))


def _fmt(x) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.2f}"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default=str(CONFIG), help="the study's base config (default: %(default)s)")
    p.add_argument("--frames", type=int, default=150_000, help="env steps (frames) per seed")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--eval-interval", type=int, default=10_000, help="frames between greedy evaluations")
    p.add_argument("--log-interval", type=int, default=5_000, help="frames between metric rows")
    # sequential: at one update per frame the learner's update is the whole run (an actor process only
    # waits for it) and sequential measured the faster (docs/BENCHMARKS.md, issue 16, session 14)
    p.add_argument("--runtime", choices=["sequential", "processes"], default="sequential")
    p.add_argument("--actors", type=int, default=1, help="actor processes (runtime processes)")
    p.add_argument("--out", required=True, help="directory for the derived config, run dirs and curves.json")
    p.add_argument("--poll", type=float, default=30.0, help="seconds between curves.json updates")
    p.add_argument("--target", choices=sorted(TARGETS), default="young-tian-2019")
    p.add_argument("--target-frames", type=int, help="the frame count the published value is read at")
    p.add_argument("--target-return", type=float, help="the published curve's return there")
    p.add_argument("--reference-runs", nargs="+", metavar="FILE",
                   help="the target from runs of the published curve's code (examples/dqn.py's output files)")
    p.add_argument("--how-read", help="how the published value was read (kept in curves.json)")
    p.add_argument("--metric", choices=sorted(METRICS), help="override the target's metric")
    p.add_argument("--report", action="store_true", help="print the verdict from what is on disk; no training")
    args = p.parse_args(argv)
    if args.target_frames is not None and args.target_return is None and not args.reference_runs:
        p.error("--target-frames: give --target-return or --reference-runs with it")
    if args.target_return is not None and args.reference_runs:
        p.error("--reference-runs: the target comes from --target-return or from reference runs, not both")
    if args.actors < 1:
        p.error(f"--actors: expected an integer >= 1, got {args.actors}")
    if args.poll <= 0:
        p.error(f"--poll: expected seconds > 0, got {args.poll}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    study = Study(args)
    if not args.report:
        study.out.mkdir(parents=True, exist_ok=True)
        config = derived_config(yaml.safe_load(Path(args.config).read_text()), args.frames,
                                args.eval_interval, args.log_interval)
        written = study.out / "config.yaml"
        if written.is_file() and yaml.safe_load(written.read_text()) != config:
            raise SystemExit(f"--out {study.out}: holds a study with another config.yaml; use another --out")
        atomic_write_text(written, yaml.safe_dump(config, sort_keys=False))
        print(f"minatar_learning: {args.frames:,} frames x seeds {args.seeds}, {args.runtime} runtime, "
              f"-> {study.out}; load {load_average()}", flush=True)
        for seed in args.seeds:
            study.train(seed)
    study.report()
    return 0


if __name__ == "__main__":
    sys.exit(main())
