"""Autotune: pick the plan for a config on a platform by the user's metric, say why, and (for
plans this machine can run) set predictions against measurements.

    result = pearl.autotune("configs/cartpole_dqn.yaml", platform="ci_2core", metric="efficiency")
    result.plan.save("plan.yaml")      # pearl train --plan plan.yaml runs it, replay kind included

Any algorithm the estimator's workload models: DQN, and DDPG, TD3 and SAC (their uniform replay
on the cpu; the fused learner for DDPG and TD3).

Costs come from this machine's `pearl profile` table when the platform describes this machine
(same core count, and every device it names that this machine would run itself is present) and
the table exists;
otherwise from the analytic and FPGA models (estimator/costs.py). Every row says which, task by
task (measured at the size, interpolated, extrapolated, analytic, simulated), and gives the range
those sources allow; its watts are always modelled. Autotune warns (`AutotuneResult.warnings`)
when the platform file's CPU model is not this machine's or the profile's.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from pearl.errors import ConfigError
from pearl.io import atomic_write_text

SOURCE_LETTER = {"measured": "M", "interpolated": "I", "extrapolated": "X", "analytic": "A", "simulated": "S", "wire": "W"}
SOURCE_LEGEND = ("M measured by `pearl profile` here at this size, I interpolated between profiled sizes, "
                 "X extrapolated beyond them, A analytic, S simulated FPGA, W on a replay server's wire")
# a CPU model name's words that say nothing of the model (brand marks, generic nouns)
_GENERIC_CPU_WORDS = {"r", "tm", "cpu", "processor", "with", "radeon", "graphics", "core", "cores"}
# the sides of a parallel runtime's step (estimator/model.py Prediction.sides), in words
SIDE_WORDS = {"actor": "the actor thread", "learner": "the learner", "contention": "the threads' contention",
              "actors": "the actor processes", "cores": "the host's cores, time-shared by all processes",
              "agents": "the node agents", "server": "a replay server (shard)", "wire": "the wire into the server's node",
              "node cores": "each node's cores", "learner cores": "the learner node's cores"}


@dataclass
class AutotuneResult:
    config: object
    platform: object
    metric: str
    ranking: object  # estimator.mapper.Ranking
    costs: object
    reason: str
    measured: list = field(default_factory=list)  # [(Prediction, measured dict)]
    warnings: list = field(default_factory=list)  # one line each: what the figures may not describe

    @property
    def best(self):
        return self.ranking.best

    @property
    def plan(self):
        return self.best.candidate.to_plan(self.platform.source if self.platform.name not in
                                           _shipped() else self.platform.name)

    @property
    def replay_kind(self) -> str:
        return self.best.candidate.replay_kind

    def to_yaml(self) -> str:
        best = self.best
        # the plan is complete (replay kind included); the autotune section is for the reader
        doc = {"plan": self.plan.to_dict(),
               "autotune": {"platform": self.platform.name, "metric": self.metric,
                            "predicted": best.summary(), "why": self.reason}}
        return yaml.safe_dump(doc, sort_keys=False)

    def save(self, path: str | Path) -> None:
        atomic_write_text(path, self.to_yaml())

    def table(self, top: int = 10) -> str:
        return format_table(self.ranking.predictions[:top])


def _shipped() -> list[str]:
    from pearl.platforms import available_platforms

    return available_platforms()


def _config_of(agent_or_config):
    from pearl.config import ExperimentConfig, load_config

    if isinstance(agent_or_config, ExperimentConfig):
        return agent_or_config
    if isinstance(agent_or_config, (str, Path)):
        return load_config(agent_or_config)
    config = getattr(agent_or_config, "config", None)
    if isinstance(config, ExperimentConfig):
        return config
    raise ConfigError(f"autotune: expected an agent, an ExperimentConfig or a config path, got {type(agent_or_config).__name__}")


def runtime_accepts(config, cand, extra_rounds: int = 200) -> bool:
    """Whether the runtime's rate limiter admits every sample of `cand`'s first updates.

    The limiter is the one the agent builds for this config and plan (pearl.schedule.rate_limit,
    the band's one home; no copy of its formula here), driven with the sequential loop's counts:
    each act round inserts E transitions once the n-step buffers are full (rounds n_step-1
    onwards), and must also have room for a round in which every env's episode ends (E x n_step
    transitions), then takes the updates due; a round of a processes plan is every actor's (actors
    x E transitions). A plan the runtime would refuse must not be the one autotune writes (session
    2 found such plans: n_step > 1 with many envs per actor, before the limiter allowed for the
    n-step lag; session 6 one where all envs' episodes ended in the same round)."""
    from pearl import schedule
    from pearl.replay.rate_limiter import RateLimiter

    if cand.runtime in schedule.CLUSTER_RUNTIMES:
        # the replay server's credits (or the driver's grants) keep its band, not the limiter; a
        # frame table's shards hold whole env streams (the builder refuses more shards than streams)
        return not config.replay.frame_stack or cand.shards <= cand.nodes * cand.actors * cand.envs
    algo = config.algo_config
    limit = schedule.rate_limit(cand.runtime, cand.batch, algo.updates_per_step, algo.learning_starts, algo.n_step,
                                cand.envs, cand.actors)
    limiter = RateLimiter(limit.samples_per_insert, limit.min_size_to_sample, limit.error_buffer)
    per_round = cand.actors * cand.envs
    env_steps = updates = 0
    for round_ in range(algo.learning_starts // per_round + extra_rounds):
        if round_ >= algo.n_step - 1:
            # a round where every env ends its episode flushes its pending n-step transitions too
            if not (limiter.can_insert(per_round) and limiter.can_insert(per_round * algo.n_step)):
                return False
            limiter.record_insert(per_round)
        env_steps += per_round
        due = schedule.updates_due(env_steps, algo.learning_starts, algo.updates_per_step) - updates
        for _ in range(due):
            if not limiter.can_sample(cand.batch):
                return False
            limiter.record_sample(cand.batch)
            updates += 1
    return True


def describes_this_machine(platform) -> bool:
    """The profile's host has this machine's core count and this machine has every device the
    profile names that it would run itself (a board of a profile's own, an FPGA, runs simulated)."""
    from pearl.devices import cpu_devices
    from pearl.placement import runnable_here

    return platform.host.cores == cpu_devices()[0]["cores"] and runnable_here(d.id for d in platform.devices)


def same_cpu_model(platform_name: str, cpu_model: str) -> bool:
    """Whether a platform file's cpu `name` describes a CPU of model `cpu_model` (as /proc/cpuinfo
    names it): every word of the name, outside parentheses (a file's notes, e.g. "(KVM guest)")
    and brand marks, is a word of the model. "Intel Xeon" matches "Intel(R) Xeon(R) Platinum
    8480+" and "Intel(R) Xeon(R) Processor"; it does not match "AMD EPYC 7763 64-Core Processor"."""
    import re

    def words(text: str) -> set[str]:
        text = re.sub(r"\((r|tm)\)", " ", text.lower())
        text = re.sub(r"\([^)]*\)|@.*$", " ", text)
        return set(re.findall(r"[a-z0-9+-]+", text)) - _GENERIC_CPU_WORDS

    name = words(platform_name)
    return bool(name) and name <= words(cpu_model)


def autotune(agent_or_config, platform: str = "ci_2core", metric: str = "throughput", *,
             power_cap_w: float | None = None, replay_kinds=None, envs=None, batches=None,
             use_profile: bool | None = None, schedule: str | None = None,
             runtimes=None, actors=None) -> AutotuneResult:
    """Ranks the plans of `platform` for the config's workload; see the module doc. `runtimes`:
    default sequential, and ray on a platform with a cluster (a `nodes:` section)."""
    from pearl.estimator.costs import Costs
    from pearl.estimator.mapper import DEFAULT_ENVS, rank
    from pearl.estimator.workload import workload_from_config
    from pearl.platforms import load_platform
    from pearl.estimator.profile import load_cached, this_cpu_model

    config = _config_of(agent_or_config)
    profile_ = load_platform(platform) if not hasattr(platform, "devices") else platform
    workload = workload_from_config(config)
    measured, warnings = None, []
    here = describes_this_machine(profile_)
    if use_profile or (use_profile is None and here):
        cached = load_cached(workload.key())
        measured = cached["tables"] if cached else None
        if cached and not same_cpu_model(profile_.host.name, cached.get("cpu_model", "")):
            warnings.append(f"the profile was measured on CPU model {cached.get('cpu_model') or '(not recorded)'!r}, "
                            f"the platform file {profile_.source} describes {profile_.host.name!r}: measured and "
                            f"analytic figures of two machines are mixed (write this machine's with `pearl devices --write`)")
    if here and not same_cpu_model(profile_.host.name, this_cpu_model()):
        warnings.append(f"this machine's CPU model is {this_cpu_model()!r}, the platform file {profile_.source} "
                        f"describes {profile_.host.name!r} (only the core count matches): its analytic figures and "
                        f"power are another CPU's")
    costs = Costs(profile_, workload, measured)
    if runtimes is None:
        runtimes = ("sequential",) + (("ray",) if profile_.nodes is not None else ())
    kinds = replay_kinds or ([workload.replay_kind, "amper"] if workload.replay_kind == "prioritized"
                             else [workload.replay_kind])
    ranking = rank(costs, metric, power_cap_w, kinds, envs or DEFAULT_ENVS,
                   batches or [config.algo_config.batch_size], schedule, tuple(runtimes), actors)
    admitted = [p for p in ranking.predictions if runtime_accepts(config, p.candidate)]
    ranking.refused = len(ranking.predictions) - len(admitted)
    if not admitted:
        raise ConfigError(f"autotune: the runtime's rate limiter refuses every candidate plan of this config "
                          f"(n_step {config.algo_config.n_step}; try fewer envs per actor with --envs)")
    ranking.predictions = admitted
    return AutotuneResult(config, profile_, metric, ranking, costs, explain(ranking, metric, power_cap_w),
                          warnings=warnings)


def explain(ranking, metric: str, power_cap_w: float | None = None) -> str:
    """Why the first plan: its figure on the metric, the runner-up with a different placement,
    and where its time goes."""
    best = ranking.best
    value = (lambda p: p.samples_per_j) if metric == "efficiency" else (lambda p: p.steps_per_s)
    unit = "samples/J" if metric == "efficiency" else "env steps/s"
    placement = lambda p: (p.candidate.replay_kind, p.candidate.replay_device, p.candidate.learn_device,
                           p.candidate.learner_kernel)
    rival = next((p for p in ranking.predictions[1:] if placement(p) != placement(best)), None)
    what = {"throughput": "the highest predicted env steps/s",
            "efficiency": "the most env steps per joule",
            "power_cap": f"the highest predicted env steps/s under {power_cap_w or 0:g} W"}[metric]
    figures = lambda p: (f"{p.steps_per_s:,.0f} steps/s, {p.watts:.1f} W and {p.samples_per_j:,.1f} samples/J "
                         f"modelled")
    parts = [f"{best.candidate.label()} has {what} ({figures(best)})"]
    if rival is not None:
        ratio = value(best) / value(rival) if value(rival) else float("inf")
        parts.append(f"{ratio:.2f}x the {unit} of the best other placement, {rival.candidate.label()} "
                     f"({figures(rival)})")
    if best.sides:  # a parallel runtime: the step is its limiting side's time, not the tasks' sum
        side = best.limiting_side
        parts.append(f"its step ({1e6 / best.steps_per_s:.1f} us per env step) is set by {SIDE_WORDS[side]} "
                     f"({', '.join(f'{k} {v:.1f}' for k, v in best.sides.items())} us per env step), "
                     f"the largest task there {best.bottleneck} ({best.call_us[best.bottleneck]:.1f} us a call)")
    else:
        total = sum(best.step_us.values())
        share = best.step_us[best.bottleneck] / total
        parts.append(f"its bottleneck is {best.bottleneck} ({best.call_us[best.bottleneck]:.1f} us a call, "
                     f"{share:.0%} of the {total:.1f} us per env step)")
    if best.simulated:
        parts.append("FPGA costs are SIMULATED (HLS cycle model), not measured")
    return "; ".join(parts)


def format_table(predictions, measured: dict | None = None) -> str:
    """Ranked plans: predicted steps/s and its range, modelled W and samples/J, bottleneck, cost
    sources (per task: SOURCE_LETTER; a parallel runtime's factor after a slash), and where given
    (`measured`: candidate -> measure_many's dict) the measured steps/s, the error and the watts a
    sensor read (or "no sensor")."""
    width = max([46] + [len(p.candidate.label()) for p in predictions])
    head = (f"{'#':>3}  {'plan':<{width}} {'steps/s':>9} {'range':>15} {'W modelled':>10} "
            f"{'samples/J modelled':>18}  {'bottleneck':<17} {'costs':<9}")
    if measured is not None:
        head += f" {'measured':>9} {'error':>7} {'W measured':>22}"
    lines = [head]
    for i, p in enumerate(predictions, 1):
        letters = "".join(SOURCE_LETTER[p.sources[t]] for t in p.sources)
        if p.factor_source:
            letters += "/" + SOURCE_LETTER.get(p.factor_source, "-")
        low, high = p.steps_range
        line = (f"{i:>3}  {p.candidate.label():<{width}} {p.steps_per_s:>9,.0f} {f'{low:,.0f}-{high:,.0f}':>15} "
                f"{p.watts:>10.1f} {p.samples_per_j:>18,.1f}  {p.bottleneck:<17} {letters:<9}")
        run = (measured or {}).get(p.candidate)
        if run and run.get("steps_per_s"):
            m = run["steps_per_s"]
            watts = (f"{run['watts']:.1f} ({run['power_source']})" if "watts" in run else "no sensor")
            line += f" {m:>9,.0f} {100 * (p.steps_per_s - m) / m:>+6.1f}% {watts:>22}"
        lines.append(line)
    return "\n".join(lines)


def measure_top(result: AutotuneResult, k: int, seconds: float = 3.0, log=None, *, runner) -> list:
    """Runs the top `k` plans this machine can run (ray plans aside) for `seconds` each with `runner`
    (estimator.profile.Runner, pearl.measure: after a warm-up past learning_starts, in windows
    taken in turns); returns [(Prediction, the runner's dict: steps_per_s and, where a sensor read
    them, watts; or error)]."""
    from pearl.kernels.registry import backend, kind_of
    from pearl.placement import runnable_here
    from pearl.schedule import CLUSTER_RUNTIMES

    chosen = [p for p in result.ranking.predictions
              # a simulated FPGA's wall time is not the board's: nothing to compare
              if runnable_here((p.candidate.replay_device, p.candidate.learn_device, p.candidate.act_device))
              and backend(kind_of(p.candidate.replay_device)).cost_source != "simulated"
              # a ray plan runs on a cluster, measured by benchmarks/ray_runtime.py --accuracy
              and p.candidate.runtime not in CLUSTER_RUNTIMES][:k]
    out = []
    for prediction, run in zip(chosen, runner.measure_many(result.config, [p.candidate for p in chosen], seconds)):
        out.append((prediction, run))
        if log:
            log(f"measured {prediction.candidate.label()}: "
                + (f"{run['steps_per_s']:,.0f} steps/s" if run.get("steps_per_s") else run.get("error", "")))
    result.measured = out
    return out


def load_average() -> float:
    return os.getloadavg()[0]


# -- plots ---------------------------------------------------------------------------------------
def iteration_segments(prediction) -> list[tuple[str, str, float, float]]:
    """One iteration of the sequential runtime for a prediction, as (device, task, start us,
    length us): enough act rounds for one update at least (E envs x updates_per_step per round),
    each round act + insert, then its updates (sample, learn, update_priorities, sync_weights every
    sync_interval), transfers on the consuming device, then the loop's overhead. A processes plan
    gets one row per process instead (`process_segments`)."""
    if prediction.schedule == "processes":
        return process_segments(prediction)
    cand, calls = prediction.candidate, prediction.call_us
    u = prediction.updates_per_s / prediction.steps_per_s
    rounds = max(1, round(1 / (u * cand.envs))) if u * cand.envs < 1 else 1
    updates = max(1, round(u * cand.envs * rounds))
    per_update_transfer = {k: v / u for k, v in prediction.step_us.items() if k.startswith("transfer") and u}
    segments, t = [], 0.0

    def put(device, task, length):
        nonlocal t
        if length > 0:
            segments.append((device, task, t, length))
            t += length

    for _ in range(rounds):
        put(cand.device_of("act"), "act", calls.get("act", 0.0))
        put(cand.device_of("insert"), "insert", calls.get("insert", 0.0))
    for i in range(updates):
        put(cand.device_of("sample"), "sample", calls.get("sample", 0.0))
        for key, us in per_update_transfer.items():
            put(key.split("->")[1], "transfer", us)
        put(cand.device_of("learn"), "learn", calls.get("learn", 0.0))
        put(cand.device_of("update_priorities"), "update_priorities", calls.get("update_priorities", 0.0))
        if (i + 1) % cand.sync_interval == 0:
            put(cand.device_of("sync_weights"), "sync_weights", calls.get("sync_weights", 0.0))
    put("cpu", "overhead", prediction.step_us.get("overhead", 0.0) * cand.envs * rounds)
    return segments


def process_segments(prediction) -> list[tuple[str, str, float, float]]:
    """One pass of the processes runtime's learner as the model sees it (estimator/model.py), a
    row per process from time 0: each actor's rounds of its allowance R (act, ring write, weight
    loads), side by side; the learner's N inserts of R transitions, its loop's time, and the
    updates those N x R env steps are due. Where N + 1 processes outnumber the cores the rows
    cannot all run at once (the step is then the cores' share, not the longest row)."""
    from pearl.schedule import allowance

    cand, calls, step_us = prediction.candidate, prediction.call_us, prediction.step_us
    u = prediction.updates_per_s / prediction.steps_per_s
    run = allowance(u, cand.actors, cand.envs)
    steps = cand.actors * run  # env steps one learner pass takes in
    segments = []
    for k in range(cand.actors):
        t = 0.0
        for _ in range(run // cand.envs):
            for task, length in (("act", calls.get("act", 0.0)), ("ring_write", step_us["ring_write"] * cand.envs),
                                 ("weight_loads", step_us["weight_loads"] * cand.envs)):
                if length > 0:
                    segments.append((f"actor {k + 1}", task, t, length))
                    t += length
    t = 0.0
    learner = [("insert", calls.get("insert", 0.0))] * cand.actors + [("overhead", step_us["overhead"] * steps)]
    for i in range(max(1, round(u * steps))):
        learner += [(task, calls.get(task, 0.0)) for task in ("sample", "learn", "update_priorities")]
        if (i + 1) % cand.sync_interval == 0:
            learner.append(("sync_weights", calls.get("sync_weights", 0.0)))
    for task, length in learner:
        if length > 0:
            segments.append(("learner", task, t, length))
            t += length
    return segments


def plot_gantt(prediction, path, title: str = "") -> None:
    """PNG: one iteration of the plan per device (the sequential runtime runs one task at a time),
    or per process for a processes plan."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    segments = iteration_segments(prediction)
    processes = prediction.schedule == "processes"
    devices = list(dict.fromkeys(([] if processes else ["cpu"]) + [s[0] for s in segments]))
    tasks = list(dict.fromkeys(s[1] for s in segments))
    colours = dict(zip(tasks, plt.cm.tab10.colors))
    fig, ax = plt.subplots(figsize=(9, 1.6 + 0.6 * len(devices)))
    for device, task, start, length in segments:
        ax.broken_barh([(start, length)], (devices.index(device) - 0.35, 0.7), color=colours[task])
    ax.set_yticks(range(len(devices)), devices)
    ax.set_xlabel("us")
    ax.invert_yaxis()
    handles = [plt.Rectangle((0, 0), 1, 1, color=colours[t]) for t in tasks]
    ax.legend(handles, tasks, ncol=len(tasks), fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.35 - 0.1 / len(devices)),
              frameon=False)
    label = "SIMULATED FPGA costs; " if prediction.simulated else ""
    shared = " (the cores limit: the processes time-share them)" if prediction.limiting_side == "cores" else ""
    ax.set_title(title or f"{label}{prediction.candidate.label()}: one "
                 f"{'learner pass' if processes else 'iteration'}{shared}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_predicted_vs_measured(rows, path, title: str = "") -> None:
    """PNG: predicted vs measured env steps/s (rows: dicts with plan, predicted, measured and
    optionally runtime), the y = x line and the +-15% band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 5))
    lo = 0.8 * min(min(r["predicted"], r["measured"]) for r in rows)
    hi = 1.2 * max(max(r["predicted"], r["measured"]) for r in rows)
    ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
    ax.fill_between([lo, hi], [lo * 0.85, hi * 0.85], [lo * 1.15, hi * 1.15], color="0.9")
    kinds = {}
    for r in rows:
        runtime = r.get("runtime", "sequential")
        kind = r["plan"].split()[0] + ("" if runtime == "sequential" else f" {runtime}")
        kinds.setdefault(kind, []).append(r)
    for i, (kind, group) in enumerate(kinds.items()):  # tab20: a colour each for up to 20 kinds
        ax.scatter([r["measured"] for r in group], [r["predicted"] for r in group], label=kind, s=25,
                   color=plt.cm.tab20(i % 20))
    ax.set_xscale("log")
    ax.set_yscale("log")
    from matplotlib.ticker import NullFormatter, StrMethodFormatter

    for axis in (ax.xaxis, ax.yaxis):  # plain numbers; log minor labels overlap on a short range
        axis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
        axis.set_minor_formatter(NullFormatter())
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("measured env steps/s")
    ax.set_ylabel("predicted env steps/s")
    ax.legend(fontsize=7)
    ax.set_title(title or "predicted vs measured (grey: +-15%)", fontsize=8, wrap=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
