"""The `pearl` command: `pearl train [CONFIG.yaml] [--env ... --steps ...]`, `pearl devices`,
`pearl profile [CONFIG]`, `pearl autotune [CONFIG] --platform P --metric M [-o plan.yaml] [--measure K]`.

User mistakes (bad config, missing file, unknown env, a device that is not there) end with one
line on stderr and exit code 2; no traceback.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
import warnings
from pathlib import Path

from pearl.errors import PearlError, TrainingDiverged
from pearl.runtime import CLUSTER_RUNTIMES
from pearl.schedule import MANY_ACTORS, RUNTIMES

EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line instead of usage + message
        self.exit(EXIT_USAGE, f"pearl: error: {message} (see `{self.prog} --help`)\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="pearl", description="PEARL: fast deep RL on CPU / GPU / FPGA platforms.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    train = sub.add_parser("train", help="train an agent from an experiment config")
    train.add_argument("config", nargs="?", help="experiment YAML (default: the shipped cartpole_dqn.yaml)")
    train.add_argument("--algo", help="algorithm: dqn, ddpg, td3 or sac")
    train.add_argument("--env", help="Gymnasium environment id, e.g. CartPole-v1, or module:EnvId (imports "
                                     "the module, which registers EnvId)")
    train.add_argument("--import", dest="imports", action="append", metavar="MODULE",
                       help="import MODULE first (it registers custom environments); repeatable")
    train.add_argument("--steps", type=int, help="total environment steps")
    train.add_argument("--seed", type=int, help="random seed")
    train.add_argument("--device", help="learner device: cpu, cuda, cuda:N")
    train.add_argument("--replay", help="replay kind: uniform, prioritized or amper (approximate PER)")
    train.add_argument("--learner-kernel", help="auto, fused (numpy, cpu) or torch")
    train.add_argument("--plan", help="a Plan YAML (task -> device, actors, batch sizes)")
    train.add_argument("--runtime", choices=(*RUNTIMES, *CLUSTER_RUNTIMES),
                       help="override the plan's runtime (processes: actor processes beside the learner)")
    train.add_argument("--actors", type=int, help="actor processes (with --runtime processes)")
    train.add_argument("--deterministic-lag", type=int, metavar="STEPS",
                       help="with --runtime processes: a reproducible run, its actors acting with the weights of "
                            "STEPS env steps before (0: the sequential runtime's run; plan.deterministic_lag)")
    train.add_argument("--address", help="runtime ray: join the Ray cluster at auto or HOST:PORT (default: "
                                         "start a local Ray instance)")
    train.add_argument("--run-dir", help="where to write config, metrics, checkpoint and plots "
                                         "(default: log.run_dir/<env>-<algo>-s<seed>-<time>)")
    train.add_argument("--resume", metavar="RUN_DIR",
                       help="continue a stopped, interrupted or crashed run from its checkpoint")
    train.add_argument("--quiet", action="store_true", help="no progress bar or lines")
    train.add_argument("--tensorboard", action="store_true",
                       help="also write TensorBoard scalars (SB3's names) to the run dir (log.tensorboard)")

    devices = sub.add_parser("devices", help="list the CPU, CUDA GPUs and OpenCL devices found")
    devices.add_argument("--json", action="store_true", help="machine-readable output")
    devices.add_argument("--write", metavar="FILE", help="draft a platform profile of this machine (YAML) to FILE")

    tune = sub.add_parser("autotune", help="rank the plans of a platform for a config and pick one by a metric")
    tune.add_argument("config", nargs="?", help="experiment YAML (default: the shipped cartpole_dqn.yaml)")
    tune.add_argument("--platform", default="ci_2core", help="a platforms/ profile name or a .yaml path (default ci_2core)")
    tune.add_argument("--metric", default="throughput", help="throughput, efficiency (samples/J) or power_cap")
    tune.add_argument("--power-cap", type=float, help="watts; with --metric power_cap")
    tune.add_argument("-o", "--output", help="write the chosen plan (Plan YAML + why) to this file")
    tune.add_argument("--measure", type=int, default=0, metavar="K",
                      help="run the top K plans this machine can run and print predicted vs measured")
    tune.add_argument("--seconds", type=float, default=3.0, help="measuring budget per plan (default 3)")
    tune.add_argument("--replay-kinds", help="replay kinds to consider, e.g. uniform,prioritized,amper "
                                             "(default: the config's, plus amper for prioritized)")
    tune.add_argument("--envs", help="envs per actor to consider (default 1,2,4,8,16)")
    tune.add_argument("--batch-sizes", help="batch sizes to consider (default: the config's)")
    tune.add_argument("--runtimes", help="runtimes to consider, e.g. sequential,threaded,processes,ray (default "
                                         "sequential, and ray on a platform with nodes)")
    tune.add_argument("--actors", help="actor process counts of processes plans, per node of ray plans (default 1 "
                                       "up to the platform's cores, a node's)")
    tune.add_argument("--schedule", help="model every plan as sequential, threaded, processes or overlapped "
                                         "(the paper's T_iter; no runtime runs it yet) instead of by its runtime")
    tune.add_argument("--top", type=int, default=15, help="rows of the ranked table (default 15)")

    prof = sub.add_parser("profile", help="measure this machine's task costs for a config and cache them")
    prof.add_argument("config", nargs="?", help="experiment YAML (default: the shipped cartpole_dqn.yaml)")
    prof.add_argument("--replays", help="replay kind[@device] list, e.g. uniform,prioritized@opencl:0 (default: "
                                        "uniform,prioritized,amper for DQN and prioritized@opencl:0 where OpenCL is, uniform for DDPG, TD3 and SAC)")
    prof.add_argument("--envs", default="1,4,16", help="envs per actor (default 1,4,16)")
    prof.add_argument("--batch-sizes", help="batch sizes (default: the config's)")
    prof.add_argument("--kernels", help="learner kernels on the cpu (default: the algorithm's, fused,torch "
                                        "or torch for SAC)")
    prof.add_argument("--seconds", type=float, default=1.5, help="timed seconds per profile run (default 1.5)")
    prof.add_argument("--force", action="store_true", help="measure again even if the cache has the table")
    prof.add_argument("--threaded", action="store_true",
                      help="also measure the threaded runtime's contention factor per learner kernel")
    prof.add_argument("--processes", action="store_true",
                      help="also measure the processes runtime's time-sharing factor per learner kernel (N = cores actors)")
    prof.add_argument("--wire", action="store_true",
                      help="also time the replay wire (a loopback replay server: chunk inserts, samples; the ray "
                           "runtime's wire model reads them)")
    prof.add_argument("--ray", action="store_true",
                      help="also measure a local Ray cluster's own CPU (per node at rest, a napping node agent, per "
                           "publish; the ray runtime's model reads them)")
    prof.add_argument("--tasks-only", action="store_true",
                      help="leave out the processes runtime's one-actor runs (its overlap factor and ring write)")
    from pearl.server.cli import add_parser as replay_server_parser

    replay_server_parser(sub)
    return parser


def _int_list(text: str | None, flag: str) -> list[int] | None:
    if text is None:
        return None
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise PearlError(f"{flag}: expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise PearlError(f"{flag}: expected integers >= 1, got {text!r}")
    return values


def _autotune(args) -> int:
    from pearl import measure
    from pearl.config import default_config_path
    from pearl.estimator.tune import SOURCE_LEGEND, autotune, format_table, load_average, measure_top
    from pearl.estimator.mapper import RUNTIMES as TUNABLE_RUNTIMES
    from pearl.estimator.model import SCHEDULES
    from pearl.estimator.workload import REPLAY_KINDS

    kinds = None
    if args.replay_kinds:
        kinds = [k.strip() for k in args.replay_kinds.split(",")]
        for kind in kinds:
            if kind not in REPLAY_KINDS:
                raise PearlError(f"--replay-kinds: {kind!r} is not a replay kind (expected {', '.join(REPLAY_KINDS)})")
    if args.schedule is not None and args.schedule not in SCHEDULES:
        raise PearlError(f"--schedule: expected one of {', '.join(SCHEDULES)}, got {args.schedule!r}")
    runtimes = [r.strip() for r in args.runtimes.split(",")] if args.runtimes else None
    for name in runtimes or ():
        if name not in TUNABLE_RUNTIMES:
            raise PearlError(f"--runtimes: expected a comma-separated list of {', '.join(TUNABLE_RUNTIMES)}, "
                             f"got {name!r}")
    actors = _int_list(args.actors, "--actors")
    many = (*MANY_ACTORS, *CLUSTER_RUNTIMES)
    if actors and not set(runtimes or ()) & set(many):
        raise PearlError(f"--actors: only {' or '.join(many)} plans run several actors; add one to --runtimes")
    if args.measure < 0:
        raise PearlError(f"--measure: expected K >= 0, got {args.measure}")
    if args.top < 1:
        raise PearlError(f"--top: expected a number of rows >= 1, got {args.top}")
    _check_seconds(args.seconds)
    if args.output:
        from pearl.io import check_output_file

        check_output_file(args.output, "-o")
    result = autotune(args.config or default_config_path(), args.platform, args.metric,
                      power_cap_w=args.power_cap, replay_kinds=kinds, envs=_int_list(args.envs, "--envs"),
                      batches=_int_list(args.batch_sizes, "--batch-sizes"), schedule=args.schedule,
                      runtimes=runtimes, actors=actors)
    ranking = result.ranking
    print(f"pearl autotune: {result.config.env}, platform {result.platform.name}, metric {args.metric}, "
          f"{len(ranking.predictions)} plans ranked ({ranking.pruned} interchangeable devices pruned"
          + (f", {ranking.over_cap} over the cap" if ranking.over_cap else "")
          + (f", {ranking.refused} refused by the runtime's rate limiter (n_step x envs per actor)"
             if ranking.refused else "") + f"), schedule: {args.schedule or 'each plan by its runtime'}")
    print("costs per task (act, insert, sample, learn, update_priorities, sync_weights; after /, the "
          f"runtime's measured factor, - unmeasured): {SOURCE_LEGEND}; range: the prediction's band by those "
          "sources; W and samples/J are modelled (platform figures), never read by a sensor")
    for warning in result.warnings:
        print(f"warning: {warning}")
    print(result.table(args.top))
    print(f"chosen: {ranking.best.candidate.label()}\nwhy: {result.reason}")
    if args.output:
        result.save(args.output)
        print(f"plan written to {args.output}" + _plan_conflict(result))
    if args.measure:
        print(f"measuring the top {args.measure} plans this machine runs, {args.seconds:g} s each "
              f"(load average {load_average():.2f})", file=sys.stderr)
        rows = measure_top(result, args.measure, args.seconds, log=lambda line: print(line, file=sys.stderr),
                           runner=measure)
        print("predicted vs measured (env steps/s; W measured where a power sensor read it):")
        print(format_table([p for p, _ in rows], {p.candidate: run for p, run in rows}))
        for p, run in rows:
            if "error" in run:
                print(f"  {p.candidate.label()}: not measured ({run['error']})")
    return 0


def _plan_conflict(result) -> str:
    """The plan holds everything it chose (replay kind included), so `pearl train CONFIG --plan`
    runs it; unless the config itself set a value the plan changes, which training refuses
    (pearl.plan.reconcile): then say which, as training would."""
    from pearl.errors import ConfigError
    from pearl.plan import reconcile

    try:
        reconcile(result.config, result.plan)
    except ConfigError as err:
        return f" (with this config, pearl train --plan stops: {err})"
    return ""


def _profile(args) -> int:
    from pearl import measure
    from pearl.config import default_config_path, load_config
    from pearl.estimator.profile import cache_path, default_replays, parse_replays, profile
    from pearl.runtime.ray_profile import ray_us

    config = load_config(args.config or default_config_path())
    kernels = [k.strip() for k in args.kernels.split(",")] if args.kernels else None
    for kernel in kernels or ():
        if kernel not in ("fused", "torch"):
            raise PearlError(f"--kernels: expected fused and/or torch, got {kernel!r}")
    _check_seconds(args.seconds)
    replays = parse_replays(args.replays) if args.replays else default_replays(config)
    tables = profile(config, replays, _int_list(args.envs, "--envs"),
                     _int_list(args.batch_sizes, "--batch-sizes"), kernels, args.seconds,
                     log=lambda line: print(line, file=sys.stderr), use_cache=not args.force,
                     threaded=args.threaded, processes=args.processes, overlap=not args.tasks_only, wire=args.wire,
                     ray=ray_us if args.ray else None, runner=measure)
    for name, cells in sorted(tables.items()):
        print(f"{name:<40} " + ", ".join(f"{size}: {us:.1f} us" for size, us in cells.items()))
    print(f"cached in {cache_path()}")
    return 0


def _check_seconds(seconds: float) -> None:
    if not (math.isfinite(seconds) and seconds > 0):  # (nan passes `> 0`'s negation; inf never ends)
        raise PearlError(f"--seconds: expected a positive finite number of seconds, got {seconds:g}")


def _train(args) -> int:
    from pearl.config import apply_overrides, default_config_path, load_config
    from pearl.envs import check_env_id, import_modules
    from pearl.plan import Plan, load_plan

    if args.resume:
        return _resume(args)
    config = load_config(args.config or default_config_path())
    overrides = {"algo": args.algo, "env": args.env, "total_steps": args.steps, "seed": args.seed,
                 "runtime.device": args.device, "replay.kind": args.replay,
                 "runtime.learner_kernel": args.learner_kernel,
                 "imports": config.imports + args.imports if args.imports else None,
                 "log.tensorboard": True if args.tensorboard else None}
    overrides = {k: v for k, v in overrides.items() if v is not None}
    if overrides:
        config = apply_overrides(config, overrides)
    if config.log.tensorboard:
        from pearl.tensorboard import check_available

        check_available("log.tensorboard")
    plan = load_plan(args.plan) if args.plan else None
    import_modules(config.imports)
    check_env_id(config.env)
    if args.actors is not None and args.actors < 1:
        raise PearlError(f"--actors: expected an integer >= 1, got {args.actors}")

    from pearl.io import check_run_dir

    if args.run_dir:
        run_dir = Path(args.run_dir)
        check_run_dir(run_dir)
        if (run_dir / "checkpoint.npz").exists():
            raise PearlError(f"--run-dir {run_dir}: already holds a run; continue it with --resume {run_dir} "
                             f"or choose another directory")
    else:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        run_dir = Path(config.log.run_dir) / f"{config.env}-{config.algo}-s{config.seed}-{stamp}"
        check_run_dir(run_dir)

    from pearl.api import make_agent  # torch is imported once the inputs are known to be good

    if args.runtime is not None or args.actors is not None or args.deterministic_lag is not None:
        plan = plan or Plan()
        plan = dataclasses.replace(plan, runtime=args.runtime or plan.runtime,
                                   actors=args.actors if args.actors is not None else plan.actors,
                                   deterministic_lag=(args.deterministic_lag if args.deterministic_lag is not None
                                                      else plan.deterministic_lag))
    if args.address is not None:
        if (plan or Plan()).runtime != "ray":
            raise PearlError("--address: joins a Ray cluster for runtime: ray (give a ray plan or --runtime ray)")
        plan = dataclasses.replace(plan, ray=dataclasses.replace(plan.ray, address=args.address))
    agent = make_agent(config, plan)
    config = agent.config
    actors = (f", {agent.plan.actors} actor{'s' if agent.plan.actors > 1 else ''}"
              if agent.plan.runtime in MANY_ACTORS else
              f", {agent.plan.ray.nodes} nodes x {agent.plan.actors} actors" if agent.plan.runtime == "ray" else "")
    print(f"pearl train: {config.algo} on {config.env}, {config.total_steps:,} steps, seed {config.seed}, "
          f"learner {agent.plan.device_of('learn')} ({agent.learner.kernel} kernel), "
          f"replay {config.replay.kind}, {agent.plan.runtime} runtime{actors} -> {run_dir}", file=sys.stderr)
    fpga = agent.parts.fpga_device()
    if fpga is not None:
        print(f"pearl train: replay sum tree on {agent.plan.device_of('sample')}: "
              f"{getattr(fpga, 'description', fpga.label)}"
              + ("; every FPGA time below is SIMULATED, not measured" if fpga.simulated else ""), file=sys.stderr)
    summary = _train_into(agent, run_dir, progress=not args.quiet)
    return _report(agent, summary, run_dir, fpga)


def _train_into(agent, run_dir: Path, **kwargs) -> dict:
    """agent.train into `run_dir`; a divergence's message says what the run directory holds."""
    try:
        return agent.train(run_dir=run_dir, time_tasks=True, **kwargs)
    except TrainingDiverged as err:
        if (run_dir / "checkpoint.npz").is_file():
            raise TrainingDiverged(f"{err}; the checkpoint in {run_dir} is from before it") from None
        raise TrainingDiverged(f"{err}; no checkpoint was written before it (log.checkpoint_interval)") from None


def _resume(args) -> int:
    given = [flag for flag, value in (("CONFIG", args.config), ("--algo", args.algo), ("--env", args.env),
                                      ("--steps", args.steps), ("--seed", args.seed), ("--device", args.device),
                                      ("--replay", args.replay), ("--learner-kernel", args.learner_kernel),
                                      ("--plan", args.plan), ("--run-dir", args.run_dir),
                                      ("--import", args.imports), ("--tensorboard", args.tensorboard)) if value]
    if given:
        raise PearlError(f"--resume: the run directory's config and plan are used; drop {', '.join(given)}")
    from pearl.io import check_run_dir

    run_dir = Path(args.resume)
    if run_dir.is_dir():
        check_run_dir(run_dir)  # (a live run first: "in use by pid N")
    if not (run_dir / "checkpoint.npz").is_file():
        if (run_dir / "config.yaml").is_file():
            raise PearlError(f"--resume {run_dir}: the run stopped before its first checkpoint (every "
                             f"log.checkpoint_interval env steps); start it anew: pearl train "
                             f"{run_dir / 'config.yaml'} --run-dir {run_dir}")
        raise PearlError(f"--resume {run_dir}: no checkpoint.npz there (expected a pearl train run directory)")
    from pearl.api import load  # torch is imported only once the inputs are known to be good

    agent = load(run_dir)
    config = agent.config
    if agent.env_steps >= config.total_steps:
        if _evaluated(run_dir):
            raise PearlError(f"--resume {run_dir}: the run already finished ({agent.env_steps:,} of "
                             f"{config.total_steps:,} env steps)")
        # stopped during its final evaluation: the training is in the checkpoint, the result is owed
        print(f"pearl train: the run in {run_dir} trained all {config.total_steps:,} env steps; its final "
              f"evaluation was not written: evaluating now", file=sys.stderr)
        return _report(agent, _finished_summary(agent), run_dir, None)
    print(f"pearl train: resuming {config.algo} on {config.env} at step {agent.env_steps:,} of "
          f"{config.total_steps:,} ({agent.updates:,} updates) in {run_dir}", file=sys.stderr)
    summary = _train_into(agent, run_dir, progress=not args.quiet, resume=True)
    return _report(agent, summary, run_dir, agent.parts.fpga_device())


def _evaluated(run_dir: Path) -> bool:
    """Whether the run directory holds a final result (an interrupted call's result.json has no evaluation)."""
    try:
        return "eval_mean" in json.loads((run_dir / "result.json").read_text())
    except (OSError, ValueError):
        return False


def _finished_summary(agent) -> dict:
    """The summary of a run whose training ended in an earlier call: no steps taken in this one."""
    return {"env_steps": agent.env_steps, "updates": agent.updates, "steps": 0, "interrupted": False,
            "learner_kernel": agent.learner.kernel}


def _report(agent, summary: dict, run_dir: Path, fpga) -> int:
    """result.json and the closing lines of a training run (stopped early by Ctrl-C: no evaluation)."""
    from pearl.io import atomic_write_text

    config = agent.config
    if summary["interrupted"]:
        atomic_write_text(run_dir / "result.json", json.dumps({**summary, "run_dir": str(run_dir)}, indent=2))
        print(f"pearl train: stopped at step {summary['env_steps']:,} (checkpoint written); continue "
              f"with: pearl train --resume {run_dir}", file=sys.stderr)
        return 130
    evaluation = agent.evaluate(config.eval.episodes)
    result = {**summary, "eval_mean": evaluation["mean"], "eval_std": evaluation["std"],
              "eval_returns": evaluation["returns"], "env": config.env, "algo": config.algo,
              "seed": config.seed, "run_dir": str(run_dir)}
    atomic_write_text(run_dir / "result.json", json.dumps(result, indent=2))
    tasks = ", ".join(f"{t} {us:.0f}" for t, us in summary.get("task_us", {}).items())
    if summary["steps"]:
        print(f"throughput: {summary['steps_per_s']:,.0f} env steps/s, {summary['updates_per_s']:,.0f} updates/s "
              f"({summary['steps']:,} steps in {summary['wall_s']:.1f} s); mean us per task call: {tasks}")
    if fpga is not None and fpga.simulated:
        report = summary["fpga"]
        print(f"simulated FPGA ({report['platform']} {report['device']}, not measured): "
              f"{report['simulated_s'] * 1e3:,.1f} ms of simulated device time "
              f"({sum(report['kernel_calls'].values()):,} kernel calls, "
              f"{report['transfer_bytes'] / 1e6:,.1f} MB over the link)")
    print(f"result: eval return {evaluation['mean']:.1f} +/- {evaluation['std']:.1f} over "
          f"{len(evaluation['returns'])} greedy episodes; run dir {run_dir}")
    return 0


def _devices(args) -> int:
    from pearl.devices import detect_devices, unusable_devices

    if args.write:
        from pearl.devices import draft_profile

        from pearl.io import check_output_file

        if not args.write.endswith((".yaml", ".yml")):
            raise PearlError(f"--write {args.write}: expected a .yaml file name")
        check_output_file(args.write, "--write")
        draft_profile(args.write)
        print(f"pearl devices: wrote {args.write} (check the figures marked 'assumed (draft)'; "
              f"use it with `pearl autotune CONFIG --platform {args.write}`)", file=sys.stderr)
        return 0
    found = detect_devices()
    if args.json:
        print(json.dumps(found, indent=2))
        return 0
    for device in found:
        details = ", ".join(f"{k} {v}" for k, v in device.items() if k not in ("id", "kind", "name"))
        print(f"{device['id']:<12} {device['kind']:<7} {device['name']}" + (f"  ({details})" if details else ""))
    for device in unusable_devices():
        print(f"{'(unusable)':<12} {device['kind']:<7} {device['name']}  ({device['reason']})")
    return 0


def _replay_server(args) -> int:
    from pearl.server.cli import run

    return run(args)


def main(argv: list[str] | None = None) -> int:
    # OpenMP reads its wait policy once, when torch loads it (not yet: the commands import torch on
    # use). Its default lets a waiting thread spin, which cost ~5x CPU per update once a learner with
    # torch_threads > 1 shares a core with an actor (docs/BENCHMARKS.md, "Why a MinAtar update costs
    # ms"). A policy the user set wins; actor processes inherit it.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    # `--import my_envs` / `imports:` name the user's modules in the folder they run from, which
    # `python -m pearl.cli` searches and an installed console script does not; last, so that
    # nothing in that folder shadows an installed package
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    args = _parser().parse_args(argv)
    with warnings.catch_warnings():
        warnings.showwarning = _one_line_warning
        return _dispatch(args)


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """A warning as the command's other messages: one line, without Python's file and source line."""
    print(f"pearl: warning: {message}", file=sys.stderr if file is None else file)


def _dispatch(args) -> int:
    try:
        return {"train": _train, "devices": _devices, "autotune": _autotune,
                "profile": _profile, "replay-server": _replay_server}[args.command](args)
    except PearlError as err:
        print(f"pearl: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except TrainingDiverged as err:
        print(f"pearl: training diverged: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("pearl: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
