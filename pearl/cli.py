"""The `pearl` command: `pearl train [CONFIG.yaml] [--env ... --steps ...]`, `pearl devices`.

User mistakes (bad config, missing file, unknown env, a device that is not there) end with one
line on stderr and exit code 2; no traceback.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from pearl.errors import PearlError

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
    train.add_argument("--env", help="Gymnasium environment id, e.g. CartPole-v1")
    train.add_argument("--steps", type=int, help="total environment steps")
    train.add_argument("--seed", type=int, help="random seed")
    train.add_argument("--device", help="learner device: cpu, cuda, cuda:N")
    train.add_argument("--replay", help="replay kind: uniform, prioritized or amper (approximate PER)")
    train.add_argument("--learner-kernel", help="auto, fused (numpy, cpu) or torch")
    train.add_argument("--plan", help="a Plan YAML (task -> device, actors, batch sizes)")
    train.add_argument("--run-dir", help="where to write config, metrics, checkpoint and plots "
                                         "(default: log.run_dir/<env>-<algo>-s<seed>-<time>)")
    train.add_argument("--quiet", action="store_true", help="no progress lines")

    devices = sub.add_parser("devices", help="list the CPU, CUDA GPUs and OpenCL devices found")
    devices.add_argument("--json", action="store_true", help="machine-readable output")
    devices.add_argument("--write", metavar="FILE", help="draft a platform profile of this machine (YAML) to FILE")
    return parser


def _train(args) -> int:
    from pearl.config import apply_overrides, default_config_path, load_config
    from pearl.envs import check_env_id
    from pearl.io import atomic_write_text
    from pearl.protocol import load_plan

    config = load_config(args.config or default_config_path())
    overrides = {"algo": args.algo, "env": args.env, "total_steps": args.steps, "seed": args.seed,
                 "runtime.device": args.device, "replay.kind": args.replay,
                 "runtime.learner_kernel": args.learner_kernel}
    overrides = {k: v for k, v in overrides.items() if v is not None}
    if overrides:
        config = apply_overrides(config, overrides)
    plan = load_plan(args.plan) if args.plan else None
    check_env_id(config.env)

    if args.run_dir:
        run_dir = Path(args.run_dir)
        if (run_dir / "checkpoint.npz").exists():
            raise PearlError(f"--run-dir {run_dir}: already holds a finished run; choose another directory")
    else:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        run_dir = Path(config.log.run_dir) / f"{config.env}-{config.algo}-s{config.seed}-{stamp}"

    from pearl.api import make_agent  # torch is imported only once the inputs are known to be good

    agent = make_agent(config, plan)
    print(f"pearl train: {config.algo} on {config.env}, {config.total_steps:,} steps, seed {config.seed}, "
          f"learner {agent.plan.device_of('learn')} ({agent.learner.kernel} kernel), "
          f"replay {config.replay.kind} -> {run_dir}", file=sys.stderr)
    fpga = agent.fpga_device()
    if fpga is not None:
        print(f"pearl train: replay sum tree on {agent.plan.device_of('sample')}: "
              f"{getattr(fpga, 'description', fpga.label)}"
              + ("; every FPGA time below is SIMULATED, not measured" if fpga.simulated else ""), file=sys.stderr)
    summary = agent.train(progress=not args.quiet, run_dir=run_dir, time_tasks=True)
    evaluation = agent.evaluate(config.eval.episodes)
    result = {**summary, "eval_mean": evaluation["mean"], "eval_std": evaluation["std"],
              "eval_returns": evaluation["returns"], "env": config.env, "algo": config.algo,
              "seed": config.seed, "run_dir": str(run_dir)}
    atomic_write_text(run_dir / "result.json", json.dumps(result, indent=2))
    tasks = ", ".join(f"{t} {us:.0f}" for t, us in summary.get("task_us", {}).items())
    print(f"throughput: {summary['steps_per_s']:,.0f} env steps/s, {summary['updates_per_s']:,.0f} updates/s "
          f"({summary['env_steps']:,} steps in {summary['wall_s']:.1f} s); mean us per task call: {tasks}")
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
    from pearl.devices import detect_devices

    if args.write:
        from pearl.devices import draft_profile

        if not args.write.endswith((".yaml", ".yml")):
            raise PearlError(f"--write {args.write}: expected a .yaml file name")
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
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return {"train": _train, "devices": _devices}[args.command](args)
    except PearlError as err:
        print(f"pearl: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("pearl: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
