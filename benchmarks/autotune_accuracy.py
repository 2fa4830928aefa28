"""Predicted vs measured env steps/s on this machine (issue 5 acceptance).

    python benchmarks/autotune_accuracy.py [--seconds 3] [--profile-seconds 1.5] [--json out.json]

One process, back to back: `pearl profile` measures the task costs (the covering grid below),
autotune ranks every plan of the ci_2core profile on that grid by throughput, then the chosen
plan and a fixed, diverse set of plans (replay kinds, replay on cpu / opencl:0, envs, batch
sizes, fused / torch learner) each train for `--seconds` after a warm-up, and the table sets
prediction against measurement (both take the least disturbed of 4 windows, pearl/measure.py
WINDOWS: the machine is shared). Prints a markdown table, the median absolute error and whether
autotune's pick measures within 10% of the best measured plan.

Threaded plans and processes plans (1, 2, 3 actor processes x 1, 4, 16 envs per actor; each of
their windows is one run, measured from when its actor processes are up: pearl/measure.py
`_steady_run`) are measured in the same turns and reported apart, with autotune's pick when every
runtime is allowed (`--runtimes sequential,threaded,processes --actors 1,2,3`).

The config is configs/cartpole_dqn.yaml with n_step 1 (the figures in docs/BENCHMARKS.md were
taken so, while n_step 3 with more than 3 envs per actor was refused by the runtime's rate limiter;
fixed since).

The continuous algorithms join the acceptance set: DDPG, TD3 and SAC on Pendulum-v1 (the shipped
configs with 64x64 networks and 500 warm-up steps, so that a plan runs a few seconds on 2 cores),
each profiled on its own grid (envs 1, 4 x batch 64, 128 x its cpu learner kernels), ranked by
autotune on it, and their fixed plans plus each algorithm's pick measured in the same way. The
report gives the median over the DQN sequential plans, over the continuous ones, and over both.
`--sequential-only` leaves out the threaded and processes plans (a shorter run).

`--heldout` runs the held-out set instead (issue 17): workloads unlike the development set above
(networks 128-256 wide, batch 32-256, 1-16 envs per actor, n-step 1 and 3, DQN, TD3 and SAC on
Acrobot-v1, MountainCar-v0, MountainCarContinuous-v0 and Pendulum-v1, and DQN's CNN on MinAtar
Breakout's uint8 boards; sequential and processes plans, an OpenCL replay), none of whose figures went into the model's design. Each workload is
profiled as a user would (`pearl profile CONFIG`: the config's batch size and n-step, the default
replays and envs, the processes runtime's one-actor overlap), ranked by autotune over the
sequential and processes runtimes, and its top 5 plans plus a fixed set are measured. Reported
apart from the development set: the median and max |error| with the profile, the median |error|
of the analytic model alone (autotune without the profile) on the same plans, and autotune's pick
against the best measured of its top 5.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from pearl import measure
from pearl.config import apply_overrides, default_config_path, load_config
from pearl.devices import cpu_devices
from pearl.estimator.model import Candidate
from pearl.estimator.profile import profile
from pearl.estimator.tune import SOURCE_LETTER, autotune
from pearl.measure import measure_many

REPLAYS = [("uniform", "cpu"), ("prioritized", "cpu"), ("amper", "cpu"), ("prioritized", "opencl:0")]
ENVS, BATCHES = (1, 4, 16), (64, 256)
# Plans measured besides autotune's pick: every replay kind / device, both learner kernels, both
# batch sizes, three env counts.
FIXED = [
    Candidate("uniform", "cpu", "cpu", "fused", 1, 64),
    Candidate("uniform", "cpu", "cpu", "fused", 16, 64),
    Candidate("uniform", "cpu", "cpu", "fused", 4, 256),
    Candidate("prioritized", "cpu", "cpu", "fused", 1, 64),
    Candidate("prioritized", "cpu", "cpu", "fused", 16, 256),
    Candidate("amper", "cpu", "cpu", "fused", 4, 64),
    Candidate("amper", "cpu", "cpu", "fused", 16, 256),
    Candidate("prioritized", "opencl:0", "cpu", "fused", 4, 64),
    Candidate("prioritized", "opencl:0", "cpu", "fused", 16, 256),
    Candidate("uniform", "cpu", "cpu", "torch", 1, 64),
    Candidate("uniform", "cpu", "cpu", "torch", 16, 256),
]
# The threaded runtime, measured and reported apart: its model (a contention factor measured once
# per learner kernel at E1 B64 uniform) is not yet within the bound on this shared 2-core machine.
THREADED = [
    Candidate("uniform", "cpu", "cpu", "fused", 16, 64, runtime="threaded"),
    Candidate("prioritized", "cpu", "cpu", "fused", 4, 256, runtime="threaded"),
    Candidate("amper", "cpu", "cpu", "fused", 4, 64, runtime="threaded"),
    Candidate("uniform", "cpu", "cpu", "torch", 16, 256, runtime="threaded"),
]
# The processes runtime, reported apart too: 1, 2 and 3 actor processes (3 actors + the learner
# time-share the 2 cores) x 1, 4 and 16 envs per actor.
PROCESS_ACTORS = (1, 2, 3)
PROCESSES = [Candidate("uniform", "cpu", "cpu", "fused", e, 64, runtime="processes", actors=n)
             for n in PROCESS_ACTORS for e in (1, 4, 16)]

# Plans that differ only in the actors' env engine (plan.env_engine: EnvPool, measured where it is
# installed; their Gymnasium twins are FIXED plans or, with --engines-only, ENGINE_TWINS), reported apart.
ENGINE_PLANS = [Candidate("uniform", "cpu", "cpu", "fused", e, 64, env_engine="envpool") for e in ENVS]
ENGINE_TWINS = [Candidate("uniform", "cpu", "cpu", "fused", e, 64) for e in ENVS]


# The continuous plans: per algorithm, the plans measured besides autotune's pick (both learner
# kernels where the algorithm has both, both batch sizes, 1 and 4 envs; the fused learner's bf16
# products too, issue 19 — offered by the mapper and profiled only on a cpu with bfloat16 units; and
# 2 learner threads, offered where the sequential runtime leaves a second core).
CONTINUOUS_ENVS, CONTINUOUS_BATCHES = (1, 4), (64, 128)
CONTINUOUS = {
    "ddpg": [Candidate("uniform", "cpu", "cpu", "fused", 1, 64), Candidate("uniform", "cpu", "cpu", "fused", 4, 128),
             Candidate("uniform", "cpu", "cpu", "torch", 1, 64),
             Candidate("uniform", "cpu", "cpu", "fused", 1, 64, precision="bf16"),
             Candidate("uniform", "cpu", "cpu", "fused", 4, 128, precision="bf16"),
             Candidate("uniform", "cpu", "cpu", "fused", 1, 64, threads=2)],
    "td3": [Candidate("uniform", "cpu", "cpu", "fused", 1, 128), Candidate("uniform", "cpu", "cpu", "torch", 4, 64),
            Candidate("uniform", "cpu", "cpu", "fused", 1, 128, precision="bf16"),
            Candidate("uniform", "cpu", "cpu", "fused", 4, 64, precision="bf16"),
            Candidate("uniform", "cpu", "cpu", "fused", 1, 128, threads=2)],
    "sac": [Candidate("uniform", "cpu", "cpu", "torch", 1, 64), Candidate("uniform", "cpu", "cpu", "torch", 4, 128),
            Candidate("uniform", "cpu", "cpu", "fused", 1, 64),
            Candidate("uniform", "cpu", "cpu", "fused", 4, 128, precision="bf16"),
            Candidate("uniform", "cpu", "cpu", "torch", 1, 64, threads=2)],
}


# The new plan choices of issue 19 (--new-choices): the learner's product precision and threads
# on networks wide enough for them to matter (256x256, batch 128), each beside its float32 /
# one-thread twin — in the sequential runtime and, since session 18, beside an actor process —
# profiled on a grid of one batch size; with the env-engine plans and their twins. DQN's fused
# learner takes bf16 since session 23 (CartPole, the default config at 256x256).
NEW_HIDDEN, NEW_BATCHES = [256, 256], (128,)
NEW_CHOICES = {
    "dqn": [Candidate("uniform", "cpu", "cpu", "fused", 1, 128),
            Candidate("uniform", "cpu", "cpu", "fused", 1, 128, precision="bf16"),
            Candidate("uniform", "cpu", "cpu", "fused", 1, 128, threads=2),
            Candidate("uniform", "cpu", "cpu", "fused", 1, 128, precision="bf16", threads=2),
            Candidate("uniform", "cpu", "cpu", "fused", 4, 128, precision="bf16", threads=2),
            Candidate("uniform", "cpu", "cpu", "torch", 1, 128)],
    **{algo: [Candidate("uniform", "cpu", "cpu", "fused", 1, 128),
           Candidate("uniform", "cpu", "cpu", "fused", 1, 128, precision="bf16"),
           Candidate("uniform", "cpu", "cpu", "fused", 1, 128, threads=2),
           Candidate("uniform", "cpu", "cpu", "fused", 4, 128, precision="bf16", threads=2),
           Candidate("uniform", "cpu", "cpu", "torch", 1, 128),
           Candidate("uniform", "cpu", "cpu", "torch", 4, 128, threads=2),
           Candidate("uniform", "cpu", "cpu", "fused", 1, 128, runtime="processes", precision="bf16"),
           Candidate("uniform", "cpu", "cpu", "fused", 1, 128, runtime="processes", precision="bf16", threads=2)]
       for algo in ("ddpg", "td3", "sac")}}


def acceptance_config():
    return apply_overrides(load_config(default_config_path()), {"dqn.n_step": 1})


def continuous_config(algo: str, hidden=(64, 64)):
    """The shipped Pendulum config of `algo` (DQN: the acceptance CartPole config), small enough to
    measure in seconds on 2 cores."""
    config = acceptance_config() if algo == "dqn" else load_config(default_config_path().with_name(f"pendulum_{algo}.yaml"))
    return apply_overrides(config, {f"{algo}.hidden": list(hidden), f"{algo}.learning_starts": 500})


def continuous_rows(seconds: float, profile_seconds: float, plans=CONTINUOUS, log=None, hidden=(64, 64),
                    batches=CONTINUOUS_BATCHES) -> tuple[list, dict]:
    """Per algorithm: profile its grid, autotune on it, measure its pick and fixed plans. Returns
    (rows as `run` gives them, with `algo`; measured pick / best measured plan per algorithm)."""
    rows, pick_vs_best = [], {}
    for algo, fixed in plans.items():
        config = continuous_config(algo, hidden)
        profile(config, envs=CONTINUOUS_ENVS, batches=batches, seconds=profile_seconds, log=log,
                use_cache=False, runner=measure)
        # every runtime a fixed plan names (the processes runtime with one actor process beside
        # the learner: its threads may take the actor's idle core, session 18)
        runtimes = tuple(dict.fromkeys(["sequential", *(c.runtime for c in fixed)]))
        result = autotune(config, platform="ci_2core", metric="throughput", envs=CONTINUOUS_ENVS,
                          batches=batches, use_profile=True, runtimes=runtimes, actors=(1,))
        by_cand = {p.candidate: p for p in result.ranking.predictions}
        pick = result.best.candidate
        cands = list(dict.fromkeys([pick, *(c for c in fixed if c in by_cand)]))  # bf16: where offered
        runs = measure_many(config, cands, seconds)
        for cand, run_ in zip(cands, runs):
            predicted, steps = by_cand[cand].steps_per_s, run_["steps_per_s"]
            rows.append({"plan": f"{algo} {cand.label()}", "algo": algo, "runtime": cand.runtime,
                         "predicted": predicted, "measured": steps, "measured_mean": run_["mean_steps_per_s"],
                         "error": (predicted - steps) / steps, "bottleneck": by_cand[cand].bottleneck,
                         "limit": "", "watts": by_cand[cand].watts, "pick": cand == pick, "overall_pick": False,
                         "new_choice": new_choice(cand)})
            if log:
                log(f"{algo} {cand.label()}: predicted {predicted:,.0f}, measured {steps:,.0f} steps/s; predicted us "
                    f"per call: {', '.join(f'{t} {us:.1f}' for t, us in by_cand[cand].call_us.items())}")
        pick_vs_best[algo] = runs[0]["steps_per_s"] / max(run_["steps_per_s"] for run_ in runs)
    return rows, pick_vs_best


def new_choice(cand) -> str:
    """Which of issue 19's plan choices `cand` makes beyond the defaults ("" for none)."""
    return " ".join(([cand.precision] if cand.precision != "fp32" else []) + ([f"t{cand.threads}"] if cand.threads != 1
                    else []) + ([cand.env_engine] if cand.env_engine != "gymnasium" else []))


def run(seconds: float, profile_seconds: float, replays=REPLAYS, envs=ENVS, batches=BATCHES,
        fixed=FIXED, kernels=("fused", "torch"), log=None, threaded=THREADED, processes=PROCESSES,
        continuous=CONTINUOUS, engines=ENGINE_PLANS, continuous_hidden=(64, 64),
        continuous_batches=CONTINUOUS_BATCHES) -> dict:
    config = acceptance_config()
    load_before = os.getloadavg()[0]
    started = time.time()
    profile(config, replays, envs, batches, kernels, profile_seconds, log=log, use_cache=False,
            threaded=bool(threaded), processes=bool(processes), runner=measure)
    kinds = sorted({k for k, _ in replays})
    # The acceptance set: sequential plans (the runtime the model is validated for); autotune picks among them.
    result = autotune(config, platform="ci_2core", metric="throughput", replay_kinds=kinds,
                      envs=envs, batches=batches, use_profile=True)
    by_cand = {p.candidate: p for p in result.ranking.predictions}
    parallel = tuple(name for name, plans in (("threaded", threaded), ("processes", processes)) if plans)
    overall = result.best
    if parallel:  # the other runtimes' plans, and autotune's pick when every runtime is allowed
        extra = autotune(config, platform="ci_2core", metric="throughput", replay_kinds=kinds, envs=envs,
                         batches=batches, use_profile=True, runtimes=("sequential",) + parallel,
                         actors=PROCESS_ACTORS)
        by_cand.update({p.candidate: p for p in extra.ranking.predictions})
        overall = extra.best
    pick = result.best.candidate
    plans = list(dict.fromkeys([pick, overall.candidate] + [c for c in list(fixed) + list(threaded) + list(processes)
                                                            + list(engines) if c in by_cand]))
    rows = []
    for cand, run_ in zip(plans, measure_many(config, plans, seconds)):
        measured = run_["steps_per_s"]
        predicted = by_cand[cand].steps_per_s
        rows.append({"plan": cand.label(), "runtime": cand.runtime, "engine": cand.env_engine,
                     "predicted": predicted, "measured": measured,
                     "measured_mean": run_["mean_steps_per_s"],
                     "error": (predicted - measured) / measured, "bottleneck": by_cand[cand].bottleneck,
                     "limit": by_cand[cand].limiting_side, "watts": by_cand[cand].watts, "pick": cand == pick,
                     "overall_pick": parallel != () and cand == overall.candidate, "new_choice": new_choice(cand)})
        if log:
            log(f"{cand.label()}: predicted {predicted:,.0f}, measured {measured:,.0f} steps/s")
    medians = {name: statistics.median(abs(r["error"]) for r in acceptance_rows(rows, name))
               for name in ("sequential",) + parallel}
    # the pick among every sequential plan measured, env engines included (autotune ranks them all)
    pick_vs_best = rows[0]["measured"] / max(r["measured"] for r in rows if r["runtime"] == "sequential")
    on_envpool = [abs(r["error"]) for r in rows if r["engine"] == "envpool"]
    continuous_, continuous_picks = (continuous_rows(seconds, profile_seconds, continuous, log, continuous_hidden,
                                                     continuous_batches) if continuous else ([], {}))
    rows += continuous_
    # processes plans with as many actors as cores are where the profile took the time-sharing
    # factor (fits); the other actor counts are predictions
    cores = cpu_devices()[0]["cores"]
    predicted = [abs(r["error"]) for r, cand in zip(rows, plans) if cand.runtime == "processes" and cand.actors != cores]
    overall_row = next((r for r in rows if r["overall_pick"]), None)
    return {"pick_prediction": by_cand[pick], "rows": rows,
            "median_abs_error": medians["sequential"],
            **{f"{name}_median_abs_error": medians[name] for name in parallel},
            "processes_predicted_median_abs_error": statistics.median(predicted) if predicted else None,
            "envpool_median_abs_error": statistics.median(on_envpool) if on_envpool else None,
            "envpool_plans": len(on_envpool),
            "pick_vs_best": pick_vs_best,
            **new_choice_medians(rows),
            **({"continuous_median_abs_error": statistics.median(abs(r["error"]) for r in continuous_),
                "all_median_abs_error": statistics.median(abs(r["error"]) for r in every_sequential(rows)),
                "continuous_pick_vs_best": continuous_picks} if continuous_ else {}),
            "overall_pick_vs_best": (overall_row["measured"] / max(r["measured"] for r in rows)
                                     if overall_row else None),
            "load_before": load_before, "load_after": os.getloadavg()[0], "wall_s": time.time() - started,
            "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def acceptance_rows(rows, runtime: str) -> list:
    """The rows of the acceptance set (the DQN CartPole plans, not the per-algorithm ones, which name
    their algorithm) on `runtime` with Gymnasium's envs (EnvPool's are reported apart)."""
    return [r for r in rows if "algo" not in r and r["runtime"] == runtime
            and r.get("engine", "gymnasium") == "gymnasium"]


def every_sequential(rows) -> list:
    """The sequential plans of the acceptance set and of every algorithm's, on Gymnasium's envs."""
    return [r for r in rows if r["runtime"] == "sequential" and r.get("engine", "gymnasium") == "gymnasium"]


def new_choice_medians(rows) -> dict:
    """Median |error| over the plans making one of issue 19's new choices (bf16 products, learner
    threads, an env engine), over each choice, and over the rest (their twins and the others)."""
    new = [r for r in rows if r.get("new_choice")]
    if not new:
        return {}
    words = sorted({word for r in new for word in r["new_choice"].split()})
    return {"new_choice_median_abs_error": statistics.median(abs(r["error"]) for r in new),
            "new_choice_plans": len(new),
            "new_choice_medians": {word: (statistics.median(abs(r["error"]) for r in new
                                                            if word in r["new_choice"].split()),
                                          sum(word in r["new_choice"].split() for r in new)) for word in words},
            "default_choice_median_abs_error": statistics.median(abs(r["error"]) for r in rows
                                                                 if not r.get("new_choice"))}


def markdown(report: dict) -> str:
    lines = ["| plan | predicted steps/s | measured steps/s (best window) | error | measured mean | "
             "bottleneck (model) |", "| --- | ---: | ---: | ---: | ---: | --- |"]
    for r in report["rows"]:
        mark = "**pick** " if r["pick"] else "**pick, any runtime** " if r.get("overall_pick") else ""
        limit = f" ({r['limit']})" if r.get("limit") else ""
        lines.append(f"| {mark}{r['plan']} | {r['predicted']:,.0f} | "
                     f"{r['measured']:,.0f} | {100 * r['error']:+.1f}% | {r['measured_mean']:,.0f} | "
                     f"{r['bottleneck']}{limit} |")
    count = lambda name: len(acceptance_rows(report["rows"], name))
    apart = [f"{name} {100 * report[f'{name}_median_abs_error']:.1f}% over {count(name)}"
             for name in ("threaded", "processes") if report.get(f"{name}_median_abs_error") is not None]
    if report.get("envpool_median_abs_error") is not None:
        apart.append(f"env engine envpool {100 * report['envpool_median_abs_error']:.1f}% over {report['envpool_plans']}")
    predicted = report.get("processes_predicted_median_abs_error")
    if predicted is not None:
        apart.append(f"of which the processes plans whose actor count is not the cores' (no factor fitted "
                     f"on them) {100 * predicted:.1f}%")
    overall = report.get("overall_pick_vs_best")
    lines.append(f"\nmedian |error| {100 * report['median_abs_error']:.1f}% over {count('sequential')} sequential plans"
                 + (f" (reported apart: {', '.join(apart)})" if apart else "") + "; "
                 f"autotune's pick measures {100 * report['pick_vs_best']:.1f}% of the best measured sequential plan"
                 + (f", its pick over every runtime {100 * overall:.1f}% of the best measured plan"
                    if overall is not None else "") + "; "
                 + continuous_summary(report) + new_choice_summary(report) +
                 f"load average {report['load_before']:.2f} before, {report['load_after']:.2f} after; "
                 f"{report['wall_s']:.0f} s; {report['when']}")
    return "\n".join(lines)


def new_choice_summary(report: dict) -> str:
    """The new plan choices' part of the summary line (issue 19), or nothing when the run had none."""
    if "new_choice_median_abs_error" not in report:
        return ""
    each = ", ".join(f"{word} {100 * median:.1f}% over {n}"
                     for word, (median, n) in report["new_choice_medians"].items())
    return (f"plans making a new choice (bf16, learner threads, env engine): median |error| "
            f"{100 * report['new_choice_median_abs_error']:.1f}% over {report['new_choice_plans']} ({each}), "
            f"the other plans {100 * report['default_choice_median_abs_error']:.1f}%; ")


def continuous_summary(report: dict) -> str:
    """The continuous plans' part of the summary line, or nothing when the run had none."""
    if "continuous_median_abs_error" not in report:
        return ""
    n = sum(1 for r in report["rows"] if "algo" in r)  # continuous_rows' rows name their algorithm
    both = len(every_sequential(report["rows"]))
    algos = ", ".join(a.upper() for a in report["continuous_pick_vs_best"])
    picks = ", ".join(f"{algo} {100 * ratio:.1f}%" for algo, ratio in report["continuous_pick_vs_best"].items())
    return (f"per-algorithm plans ({algos}): median |error| {100 * report['continuous_median_abs_error']:.1f}% "
            f"over {n}, each algorithm's pick measures of its best measured plan: {picks}; "
            f"every sequential plan: median |error| {100 * report['all_median_abs_error']:.1f}% "
            f"over {both} plans; ")


# The held-out workloads: (base config, overrides, fixed plans measured besides autotune's top 5)
HELDOUT = {
    "DQN Acrobot-v1 256x256 B128 u1 n1": (
        "acrobot_dqn.yaml",
        {"dqn.hidden": [256, 256], "dqn.batch_size": 128, "dqn.updates_per_step": 1.0, "dqn.n_step": 1,
         "dqn.learning_starts": 500, "replay.kind": "uniform", "replay.capacity": 50_000},
        [Candidate("uniform", "cpu", "cpu", "fused", 1, 128), Candidate("uniform", "cpu", "cpu", "torch", 4, 128),
         Candidate("uniform", "cpu", "cpu", "fused", 4, 128, runtime="processes", actors=1),
         Candidate("uniform", "cpu", "cpu", "fused", 1, 128, runtime="processes", actors=2)]),
    "DQN MountainCar-v0 128x128 B32 u0.1 n3": (
        "cartpole_dqn.yaml",
        {"env": "MountainCar-v0", "dqn.hidden": [128, 128], "dqn.batch_size": 32, "dqn.updates_per_step": 0.1,
         "dqn.n_step": 3, "dqn.learning_starts": 500, "replay.kind": "prioritized", "replay.capacity": 50_000},
        [Candidate("prioritized", "cpu", "cpu", "fused", 1, 32), Candidate("amper", "cpu", "cpu", "fused", 16, 32),
         Candidate("prioritized", "opencl:0", "cpu", "fused", 4, 32),
         Candidate("prioritized", "cpu", "cpu", "fused", 16, 32, runtime="processes", actors=1),
         Candidate("prioritized", "cpu", "cpu", "fused", 8, 32, runtime="processes", actors=2)]),
    "TD3 MountainCarContinuous-v0 256x256 B256 u1": (
        "pendulum_td3.yaml",
        {"env": "MountainCarContinuous-v0", "td3.hidden": [256, 256], "td3.batch_size": 256,
         "td3.learning_starts": 300, "replay.capacity": 50_000},
        [Candidate("uniform", "cpu", "cpu", "fused", 1, 256), Candidate("uniform", "cpu", "cpu", "torch", 4, 256),
         Candidate("uniform", "cpu", "cpu", "fused", 4, 256, runtime="processes", actors=1)]),
    "SAC Pendulum-v1 256x256 B64 u1": (
        "pendulum_sac.yaml",
        {"sac.hidden": [256, 256], "sac.batch_size": 64, "sac.learning_starts": 300, "replay.capacity": 50_000},
        [Candidate("uniform", "cpu", "cpu", "torch", 1, 64), Candidate("uniform", "cpu", "cpu", "torch", 16, 64),
         Candidate("uniform", "cpu", "cpu", "torch", 4, 64, runtime="processes", actors=2)]),
    # an image workload (issue 16): uint8 10x10x4 boards, the CNN learns with torch
    "DQN MinAtar/Breakout-v0 CNN B32 u0.25": (
        "minatar_breakout_dqn.yaml",
        {"dqn.updates_per_step": 0.25, "dqn.learning_starts": 500, "replay.capacity": 50_000},
        [Candidate("uniform", "cpu", "cpu", "torch", 1, 32), Candidate("prioritized", "cpu", "cpu", "torch", 4, 32),
         Candidate("uniform", "cpu", "cpu", "torch", 4, 32, runtime="processes", actors=1),
         Candidate("uniform", "cpu", "cpu", "torch", 1, 32, runtime="processes", actors=2)]),
}
HELDOUT_RUNTIMES = ("sequential", "processes")
TOP = 5


def _cpu_seconds() -> float:
    import resource

    return sum(u.ru_utime + u.ru_stime for u in (resource.getrusage(resource.RUSAGE_SELF),
                                                   resource.getrusage(resource.RUSAGE_CHILDREN)))


def heldout_config(base: str, overrides: dict):
    return apply_overrides(load_config(default_config_path().with_name(base)), overrides)


def _heldout_search(config, fixed) -> dict:
    """What autotune searches for a held-out workload: its replay kinds, its batch, both runtimes."""
    kinds = sorted({c.replay_kind for c in fixed} | {config.replay.kind})
    return dict(replay_kinds=kinds, batches=[config.algo_config.batch_size], runtimes=HELDOUT_RUNTIMES)


def _analytic_alone(config, fixed) -> dict:
    """Candidate -> the analytic model's prediction (autotune without the profile)."""
    analytic = autotune(config, platform="ci_2core", metric="throughput", use_profile=False,
                        **_heldout_search(config, fixed))
    return {p.candidate: p for p in analytic.ranking.predictions}


def reprice_analytic(report: dict, workloads=HELDOUT) -> dict:
    """A saved held-out report (--json) with its analytic column priced again by the current
    model: the measurements stay, so a change to the analytic model is judged on the same runs."""
    for name, (base, overrides, fixed) in workloads.items():
        rows = [r for r in report["rows"] if r["workload"] == name and "error" in r]
        if not rows:
            continue
        alone = {cand.label(): p for cand, p in _analytic_alone(heldout_config(base, overrides), fixed).items()}
        for r in rows:
            r["analytic"] = alone[r["plan"]].steps_per_s
            r["analytic_error"] = (r["analytic"] - r["measured"]) / r["measured"]
    report["analytic_median_abs_error"] = statistics.median(
        abs(r["analytic_error"]) for r in report["rows"] if "error" in r)
    return report


def heldout(seconds: float, profile_seconds: float, workloads=HELDOUT, log=None) -> dict:
    """The held-out set (see the module doc): rows per plan with the prediction from the profile
    and from the analytic model alone, and per workload autotune's pick / the best of its top 5."""
    from pearl.estimator.profile import default_replays

    load_before, started = os.getloadavg()[0], time.time()
    rows, picks, profile_s = [], {}, {}
    for name, (base, overrides, fixed) in workloads.items():
        config = heldout_config(base, overrides)
        began, cpu_began = time.time(), _cpu_seconds()
        profile(config, default_replays(config), seconds=profile_seconds, log=log, use_cache=False, overlap=True,
                runner=measure)
        # wall time, and the CPU time this process and its actor processes took: on a shared
        # machine the wall time is mostly waiting for a core, the CPU time what a quiet one needs
        profile_s[name] = (time.time() - began, _cpu_seconds() - cpu_began)
        result = autotune(config, platform="ci_2core", metric="throughput", use_profile=True,
                          **_heldout_search(config, fixed))
        by_cand = {p.candidate: p for p in result.ranking.predictions}
        alone = _analytic_alone(config, fixed)
        top = [p.candidate for p in result.ranking.predictions[:TOP]]
        cands = list(dict.fromkeys(top + [c for c in fixed if c in by_cand]))
        for cand, run_ in zip(cands, measure_many(config, cands, seconds)):
            if "error" in run_:
                rows.append({"workload": name, "plan": cand.label(), "error_text": run_["error"]})
                continue
            p, measured = by_cand[cand], run_["steps_per_s"]
            low, high = p.steps_range
            rows.append({"workload": name, "plan": cand.label(), "runtime": cand.runtime, "predicted": p.steps_per_s,
                         "low": low, "high": high, "analytic": alone[cand].steps_per_s, "measured": measured,
                         "error": (p.steps_per_s - measured) / measured,
                         "analytic_error": (alone[cand].steps_per_s - measured) / measured,
                         "sources": "".join(SOURCE_LETTER[s] for s in p.sources.values()) + (
                             f"/{SOURCE_LETTER.get(p.factor_source, '-')}" if p.factor_source else ""),
                         "rank": top.index(cand) + 1 if cand in top else None, "pick": cand == top[0]})
            if log:
                log(f"{name} {cand.label()}: predicted {p.steps_per_s:,.0f} (analytic {alone[cand].steps_per_s:,.0f}), "
                    f"measured {measured:,.0f} steps/s")
        ranked = [r for r in rows if r["workload"] == name and r.get("rank")]
        if ranked:
            picks[name] = next((r["measured"] for r in ranked if r["pick"]), 0.0) / max(r["measured"] for r in ranked)
    ok = [r for r in rows if "error" in r]
    errors = [abs(r["error"]) for r in ok]
    return {"rows": rows, "median_abs_error": statistics.median(errors), "max_abs_error": max(errors),
            "processes_median_abs_error": statistics.median(
                [abs(r["error"]) for r in ok if r["runtime"] == "processes"] or [float("nan")]),
            "analytic_median_abs_error": statistics.median(abs(r["analytic_error"]) for r in ok),
            "pick_vs_best_of_top": picks, "profile_s": profile_s, "cpu": cpu_devices()[0]["name"],
            "load_before": load_before, "load_after": os.getloadavg()[0], "wall_s": time.time() - started,
            "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def analytic_in_cpu_time(steps: int = 600, workloads=HELDOUT, log=None) -> dict:
    """The analytic model alone (no profile) against each held-out workload's sequential cpu
    plans, measured in env steps per CPU-second of this process: a one-thread sequential plan's
    speed when it has its core, whatever else the shared machine runs (its wall-clock rate under
    load is a fraction of that). `steps` env steps per plan after the warm-up (x 5 at < 1 update
    per step)."""
    import resource

    from pearl.estimator.costs import Costs
    from pearl.estimator.model import predict
    from pearl.estimator.workload import workload_from_config
    from pearl.measure import agent_for, default_warmup
    from pearl.platforms import load_platform

    def cpu() -> float:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime

    platform, rows, load_before = load_platform("ci_2core"), [], os.getloadavg()[0]
    for name, (base, overrides, fixed) in workloads.items():
        config = heldout_config(base, overrides)
        costs = Costs(platform, workload_from_config(config))
        for cand in (c for c in fixed if c.runtime == "sequential" and c.replay_device == "cpu"):
            agent = agent_for(config, cand, default_warmup(config), 10_000_000)
            n = steps if config.algo_config.updates_per_step >= 1 else 5 * steps
            cpu0, wall0 = cpu(), time.perf_counter()
            agent.train(n)
            per_cpu_s, wall = n / (cpu() - cpu0), n / (time.perf_counter() - wall0)
            predicted = predict(cand, costs).steps_per_s
            rows.append({"workload": name, "plan": cand.label(), "analytic": predicted, "per_cpu_s": per_cpu_s,
                         "wall": wall, "error": (predicted - per_cpu_s) / per_cpu_s})
            if log:
                log(f"{name} {cand.label()}: analytic {predicted:,.0f}, {per_cpu_s:,.0f} steps per CPU-second "
                    f"({wall:,.0f} per wall second)")
    return {"rows": rows, "median_abs_error": statistics.median(abs(r["error"]) for r in rows),
            "max_abs_error": max(abs(r["error"]) for r in rows), "load_before": load_before,
            "load_after": os.getloadavg()[0], "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def heldout_markdown(report: dict) -> str:
    lines = ["| workload | plan | rank | predicted (range) | sources | measured | error | analytic only | analytic error |",
             "| --- | --- | ---: | ---: | --- | ---: | ---: | ---: | ---: |"]
    for r in report["rows"]:
        if "error" not in r:
            lines.append(f"| {r['workload']} | {r['plan']} | | | | refused: {r['error_text']} | | | |")
            continue
        lines.append(f"| {r['workload']} | {'**' if r['pick'] else ''}{r['plan']}{'**' if r['pick'] else ''} | "
                     f"{r['rank'] or ''} | {r['predicted']:,.0f} ({r['low']:,.0f}-{r['high']:,.0f}) | {r['sources']} | "
                     f"{r['measured']:,.0f} | {100 * r['error']:+.1f}% | {r['analytic']:,.0f} | "
                     f"{100 * r['analytic_error']:+.1f}% |")
    n = sum(1 for r in report["rows"] if "error" in r)
    picks = ", ".join(f"{name}: {100 * v:.1f}%" for name, v in report["pick_vs_best_of_top"].items())
    profiles = ", ".join(f"{wall:.0f} s ({cpu:.0f} s of CPU)" for wall, cpu in report["profile_s"].values())
    lines.append(f"\nheld-out set, {n} plans, {report['cpu']}: median |error| {100 * report['median_abs_error']:.1f}% "
                 f"with the profile (processes plans {100 * report['processes_median_abs_error']:.1f}%), max "
                 f"{100 * report['max_abs_error']:.1f}%; analytic model alone: median |error| "
                 f"{100 * report['analytic_median_abs_error']:.1f}%; autotune's pick / the best measured of its top "
                 f"{TOP}: {picks}; profiles took {profiles}; load average {report['load_before']:.2f} before, "
                 f"{report['load_after']:.2f} after; {report['wall_s']:.0f} s; {report['when']}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--profile-seconds", type=float, default=1.5)
    parser.add_argument("--json")
    parser.add_argument("--sequential-only", action="store_true", help="no threaded or processes plans")
    parser.add_argument("--engines-only", action="store_true",
                        help="only the env-engine plans and their Gymnasium twins (uniform replay, fused learner, "
                             "sequential; needs envpool)")
    parser.add_argument("--new-choices", action="store_true",
                        help="only issue 19's new plan choices: DQN, DDPG, TD3 and SAC at 256x256 with bf16 products "
                             "and 2 learner threads beside their twins, and the env-engine plans with theirs (where "
                             "envpool is installed)")
    parser.add_argument("--algos", help="with --new-choices: a comma-separated subset of dqn,ddpg,td3,sac")
    parser.add_argument("--plots", help="folder for autotune_predicted_vs_measured.png and autotune_gantt_ci_pick.png")
    parser.add_argument("--heldout", action="store_true", help="the held-out set instead (issue 17)")
    parser.add_argument("--workloads", help="with --heldout: a comma-separated subset of the held-out workloads' "
                                            "numbers (1-based), e.g. 1,3")
    parser.add_argument("--analytic-cpu-time", action="store_true",
                        help="with --heldout: the analytic model alone against steps per CPU-second of the "
                             "held-out sequential cpu plans (load-independent)")
    parser.add_argument("--reprice", metavar="JSON",
                        help="with --heldout: a saved held-out report (--json) with its analytic column priced "
                             "again by the current model (no run)")
    args = parser.parse_args()
    if args.heldout and args.reprice:
        with open(args.reprice, encoding="utf-8") as f:
            print(heldout_markdown(reprice_analytic(json.load(f))))
        return 0
    if args.heldout and args.analytic_cpu_time:
        report = analytic_in_cpu_time(log=lambda line: print(line, file=sys.stderr))
        print("| workload | plan | analytic steps/s | steps per CPU-second | error | steps per wall second |\n"
              "| --- | --- | ---: | ---: | ---: | ---: |")
        for r in report["rows"]:
            print(f"| {r['workload']} | {r['plan']} | {r['analytic']:,.0f} | {r['per_cpu_s']:,.0f} | "
                  f"{100 * r['error']:+.1f}% | {r['wall']:,.0f} |")
        print(f"\nanalytic model alone vs steps per CPU-second: median |error| {100 * report['median_abs_error']:.1f}%, "
              f"max {100 * report['max_abs_error']:.1f}%; load average {report['load_before']:.2f} before, "
              f"{report['load_after']:.2f} after; {report['when']}")
        return 0
    if args.heldout:
        names = list(HELDOUT)
        chosen = [names[int(i) - 1] for i in args.workloads.split(",")] if args.workloads else names
        report = heldout(args.seconds, args.profile_seconds, {n: HELDOUT[n] for n in chosen},
                         log=lambda line: print(line, file=sys.stderr))
        print(heldout_markdown(report))
        if args.json:
            from pearl.io import atomic_write_text

            atomic_write_text(args.json, json.dumps(report, indent=1))
        return 0
    restricted = args.sequential_only or args.engines_only or args.new_choices
    parallel = {"threaded": (), "processes": ()} if restricted else {}
    if args.engines_only or args.new_choices:
        from pearl.envs import check_envpool, envpool_has

        if args.engines_only:
            check_envpool("--engines-only")
        engines = args.engines_only or envpool_has("CartPole-v1")
        parallel.update(replays=REPLAYS[:1], kernels=("fused",), batches=BATCHES[:1],
                        fixed=ENGINE_TWINS if engines else FIXED[:1], engines=ENGINE_PLANS if engines else (),
                        continuous={})
    if args.new_choices:
        algos = args.algos.split(",") if args.algos else list(NEW_CHOICES)
        unknown = [algo for algo in algos if algo not in NEW_CHOICES]
        if unknown:
            print(f"--algos: expected a subset of {','.join(NEW_CHOICES)}, got {','.join(unknown)}", file=sys.stderr)
            return 2
        parallel.update(continuous={algo: NEW_CHOICES[algo] for algo in algos}, continuous_hidden=NEW_HIDDEN,
                        continuous_batches=NEW_BATCHES)
    report = run(args.seconds, args.profile_seconds, log=lambda line: print(line, file=sys.stderr), **parallel)
    print(markdown(report))
    if args.plots:
        from pathlib import Path

        from pearl.estimator.tune import plot_gantt, plot_predicted_vs_measured

        Path(args.plots).mkdir(parents=True, exist_ok=True)
        plot_predicted_vs_measured(report["rows"], Path(args.plots) / "autotune_predicted_vs_measured.png",
                                   f"ci_2core, {len(report['rows'])} plans (grey: +-15%)\nmedian |error|: "
                                   f"sequential {100 * report['median_abs_error']:.1f}%"
                                   + "".join(f", {name} {100 * report[f'{name}_median_abs_error']:.1f}%"
                                             for name in ("threaded", "processes")
                                             if report.get(f"{name}_median_abs_error") is not None)
                                   + (f", continuous {100 * report['continuous_median_abs_error']:.1f}%"
                                      if "continuous_median_abs_error" in report else ""))
        plot_gantt(report["pick_prediction"], Path(args.plots) / "autotune_gantt_ci_pick.png")
    if args.json:
        from pearl.io import atomic_write_text

        atomic_write_text(args.json, json.dumps({k: v for k, v in report.items() if k != "pick_prediction"},
                                                indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
