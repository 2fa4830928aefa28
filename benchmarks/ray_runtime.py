"""The ray runtime against the processes runtime and RLlib's DQN, side by side from one run.

DQN on CartPole-v1 with the shipped config (pearl/configs/cartpole_dqn.yaml: 0.25 updates per env
step, batch 64, 64x64) at n-step --n-step (default 1) for --steps env steps per run:
- processes: `--actors` actor processes of `--envs` envs beside the learner (one machine);
- ray: the same actor count spread over a local Ray cluster of `--nodes` nodes
  (ray.cluster_utils.Cluster, every node on 127.0.0.1, 1 CPU each), a replay server in the learner;
- rllib (if installed and --rllib): RLlib's DQN (new API stack) on the same cluster, its env runners
  as many as our actors with the same envs each, training_intensity = updates per env step x batch
  (the same updates per env step), its own defaults otherwise.
`--config PATH`: another DQN config instead (e.g. configs/minatar_breakout_dqn.yaml: image
observations, uint8 4x10x10 boards, through both runtimes' rings and, for ray, the wire and the
replay server). Runs alternate (processes, ray, rllib) per seed so load changes hit each alike.
Figures: env steps/s over the whole `train` call (start-up included) and over the steady part (after the first quarter
of the steps; for ray also after its learner's own actor handed over to the node agents), per
seed, the ratio ray / processes beside them; the machine's load average before and after. Both
runtimes step the learner's own actor while their actors start (plan.act_while_actors_start);
`--no-learner-start` turns that off for ray (its node agents take every step).

    RAY_USAGE_STATS_ENABLED=0 RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 \
        python benchmarks/ray_runtime.py --steps 20000 --seeds 3 --actors 2 --envs 8 [--rllib]

`--cpu`: where the CPU goes instead of the rates alone. Over each run's steady part (env steps 25%
-> 90%) the CPU time of every thread of this process and of its descendants (Ray's GCS, raylets
and agents, idle workers, the node agents and their actor processes; the processes runtime's
actors), by role, per 1,000 env steps, and the actors' act / act CPU / wait time per round; the
idle cluster's CPU per second first. `--runtimes processes,ray` picks the runtimes.

    python benchmarks/ray_runtime.py --cpu --steps 60000 --seeds 2

`--learning`: learning quality instead. The shipped config as it is (100k env steps, n_step 3)
trained by the ray runtime alone on the same cluster for each seed (`--replay`, `--shards`: the
replay placement), then the final greedy return over 20 fresh episodes (`agent.evaluate`; solved:
a mean >= 475), the best periodic evaluation of the run (eval.interval) and the run's env steps/s.

    python benchmarks/ray_runtime.py --learning --seeds 3 [--replay server --shards 2]

`--accuracy`: the estimator's ray model (pearl/schedule/models.py Ray) against measurement (issue
15). `pearl profile --wire` measures the config's task costs here (n_step 1, uniform replay, the
fused learner, 1 / 8 / 16 envs, with the processes runtime's ring write and time-sharing factor,
and the replay wire: estimator/wire.py; cached per machine; `--wire-constants`: the profile
without the wire, priced by wire.py's constants), the model prices RAY_PLANS on platforms/local_cluster.yaml (1-3 nodes, the three
replay placements, chunks of 32 and 256 rows), and each plan trains --steps env steps on a local
3-node cluster, its steady rate taken after the first quarter (`pearl_run`); the processes plans
of PROCESSES_PLANS are measured in the same turns (pearl.measure windows) beside them, the local
runtimes' accuracy. Prints the wire's tables, per plan predicted, measured and error (and the
ray plans priced again with wire.py's constants: what the measured wire changes), the median
|error| of each set, the CPU model and the load average before each plan; `--save FILE` keeps
the runs' figures and the profile's tables as JSON.

    python benchmarks/ray_runtime.py --accuracy --steps 40000 [--passes 2] [--save runs.json]

`--calls`: the Ray figures of platforms/local_cluster.yaml's `nodes:` (a driver's time per actor
call, a call's round trip, the Ray daemons' idle CPU per node) on the same local cluster.

`--scaling PLATFORM`: the model's figures for 1-64 node agents on a cluster profile (DQN CartPole
and DDPG Pendulum; the costs this machine's profile measured, the topology the platform's),
with the side that limits each: where the learner, the wire and the servers saturate.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import os
import statistics
import time

from pearl.kernels.cpu.backend import cpu_model  # noqa: E402
from pearl.runtime.ray_profile import (cpu_delta, cpu_snapshot, driver_threads, idle_cpu,  # noqa: E402
                                       local_cluster, model_role, ray_us)

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")


def _actor_clocks(agent) -> tuple[float, float, float, int]:
    """(act s, wait s, act CPU s, rounds) summed over the run's actor processes, now."""
    from pearl.runtime.shared import ACT_CPU_NS, ACT_NS, ROUNDS, WAIT_NS

    actors = agent.counters.actor_processes
    if actors is not None:  # processes runtime: its rings' counters
        c = [channel.counters for channel in actors.channels]
        return (sum(int(x[ACT_NS]) for x in c) * 1e-9, sum(int(x[WAIT_NS]) for x in c) * 1e-9,
                sum(int(x[ACT_CPU_NS]) for x in c) * 1e-9, sum(int(x[ROUNDS]) for x in c))
    import ray

    reports = ray.get([node.report.remote() for node in agent.counters.ray_agents], timeout=30)
    return (sum(r["act_s"] for r in reports), sum(r.get("wait_s", math.nan) for r in reports),
            sum(r.get("act_cpu_s", math.nan) for r in reports), sum(r["rounds"] for r in reports))


def cpu_run(plan, steps: int, seed: int, n_step: int) -> dict:
    """One run; over its steady part (env steps 25% -> 90% of `steps`): CPU seconds per 1,000 env
    steps by role, the actors' act / wait / act-CPU time per round, env steps/s."""
    from pearl.api import make_agent
    from pearl.config import apply_overrides, default_config_path, load_config

    config = apply_overrides(load_config(default_config_path()), {"total_steps": steps, "seed": seed,
                                                                  "dqn.n_step": n_step})
    agent = make_agent(config, plan)
    marks = []

    first = []

    def mark(a):
        if not first:
            first.append(time.perf_counter())  # the first round: start-up done
        if len(marks) < 2 and a.env_steps >= (steps // 4, steps * 9 // 10)[len(marks)]:
            marks.append((time.perf_counter(), a.env_steps, a.updates, _actor_clocks(a),
                          cpu_snapshot(driver_threads())))

    started = time.perf_counter()
    agent.train(steps, on_round=mark)
    wall = time.perf_counter() - started
    (t0, s0, u0, c0, p0), (t1, s1, u1, c1, p1) = marks
    env_steps, rounds = s1 - s0, max(1, c1[3] - c0[3])
    spent = cpu_delta(p0, p1)
    return {"whole": agent.env_steps / wall, "steady": env_steps / (t1 - t0), "updates": u1 - u0,
            "startup_s": first[0] - started,
            "cpu_ms_per_1k": {role: 1e6 * s / env_steps for role, s in spent.items()},
            "cores": sum(spent.values()) / (t1 - t0),
            "act_us": 1e6 * (c1[0] - c0[0]) / rounds, "wait_us": 1e6 * (c1[1] - c0[1]) / rounds,
            "act_cpu_us": 1e6 * (c1[2] - c0[2]) / rounds, "acted": rounds * plan.envs_per_actor / env_steps,
            "exact": agent.updates == agent.parts.schedule.due(agent.env_steps)}


def pearl_run(plan, steps: int, seed: int, n_step: int, until: float | None = None,
              probe=None, config_path: str | None = None) -> tuple[float, float, dict]:
    """DQN CartPole (the shipped config, or the DQN config at `config_path`, at `n_step`) trained
    `steps` env steps by `plan`: (env steps/s over the whole call, the steady rate from steps / 4
    on, up to until x steps if given, info). `probe`: called when the steady window starts and
    ends; info["probes"] holds (time, env steps, its value) of each."""
    from pearl.api import make_agent
    from pearl.config import apply_overrides, default_config_path, load_config
    from pearl.schedule import updates_due

    config = apply_overrides(load_config(config_path or default_config_path()),
                             {"total_steps": steps, "seed": seed, "dqn.n_step": n_step})
    agent = make_agent(config, plan)
    marks, probes = [], {}
    last = steps if until is None else int(until * steps)

    def on_round(a):
        now = time.perf_counter()
        # the ray runtime's env steps of its learner's own actor so far (act_while_actors_start)
        marks.append((now, a.env_steps, getattr(a.counters, "learner_env_steps", 0)))
        if probe is not None:
            for name, at in (("start", steps // 4), ("end", last)):
                if name not in probes and a.env_steps >= at:
                    probes[name] = (now, a.env_steps, probe())

    started = time.perf_counter()
    agent.train(steps, on_round=on_round)
    wall = time.perf_counter() - started
    # the steady part: from steps / 4 on, and (ray) once the node agents' steps are in
    steady = [m for m in marks if m[1] >= steps // 4 and m[1] > m[2] and (until is None or m[1] <= last)]
    rate = (steady[-1][1] - steady[0][1]) / (steady[-1][0] - steady[0][0]) if len(steady) > 1 else float("nan")
    cfg = config.algo_config
    assert agent.updates == updates_due(agent.env_steps, cfg.learning_starts, cfg.updates_per_step), \
        "the replay ratio is not exact"
    # the env steps the learner's own actor took while the actors / node agents started
    return agent.env_steps / wall, rate, {"env_steps": agent.env_steps, "updates": agent.updates, "probes": probes,
                                          "learner_steps": getattr(agent.counters, "learner_env_steps", 0),
                                          "first_round_s": marks[0][0] - started if marks else None}


PUBLISHED = {"sends": 0, "puts": 0, "cpu_s": 0.0}  # the driver's publisher, counted by `watch_publisher`


def watch_publisher() -> None:
    """Counts the ray runtime's weight publishes (pearl/runtime/ray.py `_Publisher.send`: the calls,
    those that put and called the agents, the driver thread's CPU in them) into PUBLISHED: the
    model's publish figures set against the runtime's own."""
    from pearl.runtime import ray as ray_runtime

    send = ray_runtime._Publisher.send

    def counted(self, weights, epsilon):
        started = time.thread_time()
        send(self, weights, epsilon)
        PUBLISHED["cpu_s"] += time.thread_time() - started
        PUBLISHED["sends"] += 1
        PUBLISHED["puts"] += not self.due

    ray_runtime._Publisher.send = counted


def cpu_per_step(start: tuple, end: tuple) -> dict[str, float]:
    """Per side of the ray model (model_role), CPU us per env step between two probes (time, env
    steps, (cpu_snapshot, PUBLISHED)): the same accounting as --cpu."""
    (_, s0, (c0, p0)), (_, s1, (c1, p1)) = start, end
    out = {role: 0.0 for role in ("driver", "agents", "servers", "actors", "ray")}
    for role, seconds in cpu_delta(c0, c1).items():
        out[model_role(role)] += 1e6 * seconds / (s1 - s0)
    puts = p1["puts"] - p0["puts"]
    out.update(publishes_per_step=puts / (s1 - s0), us_per_publish=1e6 * (p1["cpu_s"] - p0["cpu_s"]) / max(1, puts),
               publisher_us=1e6 * (p1["cpu_s"] - p0["cpu_s"]) / (s1 - s0))
    return out


def probe() -> tuple:
    return cpu_snapshot(driver_threads()), dict(PUBLISHED)


def learning_run(plan, seed: int) -> dict:
    """The shipped config trained to its total by `plan`; its greedy return at the end."""
    from pearl.api import make_agent
    from pearl.config import apply_overrides, default_config_path, load_config

    agent = make_agent(apply_overrides(load_config(default_config_path()), {"seed": seed}), plan)
    evals = []

    def watch(a):
        if a.counters.env_steps // a.config.eval.interval > len(evals):
            evals.append(a.evaluate()["mean"])  # the periodic greedy evaluation (config eval.interval)

    summary = agent.train(on_round=watch)
    final = agent.evaluate(episodes=20)["mean"]
    return {"final": final, "best": max(evals, default=float("nan")), "steps_per_s": summary["steps_per_s"],
            "env_steps": agent.env_steps, "updates": agent.updates,
            "exact": agent.updates == agent.parts.schedule.due(agent.env_steps)}


def rllib_run(steps: int, seed: int, runners: int, envs: int, n_step: int) -> tuple[float, float, dict]:
    from ray.rllib.algorithms.dqn import DQNConfig

    config = (DQNConfig().environment("CartPole-v1")
              .env_runners(num_env_runners=runners, num_envs_per_env_runner=envs)
              .training(train_batch_size=64, training_intensity=0.25 * 64, num_steps_sampled_before_learning_starts=1000,
                        target_network_update_freq=500, n_step=n_step, lr=1e-3,
                        replay_buffer_config={"type": "PrioritizedEpisodeReplayBuffer", "capacity": 100_000,
                                              "alpha": 0.0})  # alpha 0: uniform sampling, as ours
              .rl_module(model_config={"fcnet_hiddens": [64, 64]})
              .debugging(seed=seed))
    algo = config.build_algo()
    started, sampled, marks = time.perf_counter(), 0, []
    while sampled < steps:
        result = algo.train()
        sampled = result["env_runners"]["num_env_steps_sampled_lifetime"]
        marks.append((time.perf_counter(), sampled))
    wall = time.perf_counter() - started
    algo.stop()
    # RLlib starts learning at 1000 sampled steps: its steady part is past that
    steady = [m for m in marks if m[1] >= max(steps // 4, 1500)]
    rate = (steady[-1][1] - steady[0][1]) / (steady[-1][0] - steady[0][0]) if len(steady) > 1 else float("nan")
    return sampled / wall, rate, {"env_steps": sampled, "iterations": len(marks)}


# The ray plans of --accuracy: (nodes, actors per node, envs, placement, shards, chunk)
RAY_PLANS = [(1, 1, 8, "learner", 1, 256), (2, 1, 8, "learner", 1, 256), (3, 1, 8, "learner", 1, 256),
             (2, 1, 8, "learner", 1, 32), (1, 2, 8, "learner", 1, 64), (2, 1, 8, "server", 1, 256),
             (2, 1, 8, "server", 2, 256), (2, 1, 8, "node", 1, 256)]
PROCESSES_PLANS = [(1, 8), (2, 8)]  # (actors, envs): the processes runtime beside them
CLUSTER_NODES = 3


def accuracy_config():
    """The shipped DQN CartPole config at n_step 1 (benchmarks/autotune_accuracy.py's acceptance config)."""
    from pearl.config import apply_overrides, default_config_path, load_config

    return apply_overrides(load_config(default_config_path()), {"dqn.n_step": 1})


def measured_costs(config, platform: str, profile_seconds: float = 1.5, log=None, wire: bool = False,
                   ray: bool = False):
    """Costs of the config's workload on `platform` from this machine's profile (measured if not
    cached; `wire`: with the replay wire's tables, `pearl profile --wire`; `ray`: with the local
    Ray cluster's, `pearl profile --ray`)."""
    from pearl import measure
    from pearl.estimator.costs import Costs
    from pearl.estimator.profile import profile
    from pearl.estimator.workload import workload_from_config
    from pearl.platforms import load_platform

    tables = profile(config, [("uniform", "cpu")], envs=(1, 8, 16), kernels=("fused",),
                     seconds=profile_seconds, log=log, processes=True, wire=wire,
                     ray=ray_us if ray else None, runner=measure)
    return Costs(load_platform(platform), workload_from_config(config), tables)


def ray_candidate(nodes, actors, envs, placement, shards, chunk, batch=64, kernel="fused"):
    from pearl.estimator.model import Candidate

    return Candidate("uniform", "cpu", "cpu", kernel, envs, batch, runtime="ray", actors=actors, nodes=nodes,
                     placement=placement, shards=shards, chunk=chunk)


def accuracy(steps: int, passes: int, profile_seconds: float, wire: bool = True, save: str | None = None) -> None:
    import sys

    from pearl.estimator.costs import Costs
    from pearl.estimator.model import Candidate, predict
    from pearl.measure import measure_many

    log = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    config = accuracy_config()
    print(f"# {cpu_model()}, {os.cpu_count()} cores; load average before: {os.getloadavg()}", flush=True)
    costs = measured_costs(config, "local_cluster", profile_seconds, log, wire=wire, ray=True)
    from pearl.estimator.wire import source

    print(f"# the wire: {'measured by pearl profile --wire' if source(costs.measured, 'uniform') == 'measured' else 'constants (estimator/wire.py)'}", flush=True)
    for name in sorted(k for k in costs.measured if k.startswith(("wire|", "ray|"))):
        print(f"#   {name}: " + ", ".join(f"{size} rows {us:.1f} us" if name.startswith("wire|") else f"{us:.1f} us"
                                          for size, us in costs.measured[name].items()))
    cands = [ray_candidate(*plan) for plan in RAY_PLANS]
    local = [Candidate("uniform", "cpu", "cpu", "fused", e, 64, runtime="processes", actors=a)
             for a, e in PROCESSES_PLANS]
    predicted = {c: predict(c, costs) for c in cands + local}
    # the same model with estimator/wire.py's constants for the wire: what the measured wire changes
    constants = Costs(costs.platform, costs.workload, {k: v for k, v in costs.measured.items()
                                                       if not k.startswith("wire|")})
    unwired = {c: predict(c, constants) for c in cands}
    # and without `pearl profile --ray`'s tables: what the measured Ray costs change
    rayless = Costs(costs.platform, costs.workload, {k: v for k, v in costs.measured.items()
                                                     if not k.startswith("ray|")})
    unrayed = {c: predict(c, rayless) for c in cands}
    rates: dict = {c: [] for c in cands + local}
    loads: dict = {c: [] for c in cands + local}
    cpu: dict = {}  # ray plan -> role -> CPU us per env step over its fastest run's steady window
    watch_publisher()
    with local_cluster(CLUSTER_NODES):
        for _ in range(passes):  # in turns: a burst of load hits one run of several plans
            for cand in cands:
                loads[cand].append(os.getloadavg()[0])
                # the model prices the agents' steady state: no learner's own actor at the start
                plan = dataclasses.replace(cand.to_plan(), act_while_actors_start=False)
                _, steady, info = pearl_run(plan, steps, 0, 1, until=0.9, probe=probe)
                if steady >= max(rates[cand], default=0.0):
                    cpu[cand] = cpu_per_step(info["probes"]["start"], info["probes"]["end"])
                rates[cand].append(steady)
                log(f"{cand.label()}: measured {steady:,.0f} steps/s steady (predicted "
                    f"{predicted[cand].steps_per_s:,.0f}), load {os.getloadavg()[0]:.1f}, CPU us per env step "
                    f"{', '.join(f'{k} {v:.3g}' for k, v in cpu[cand].items())}; model: publishes per step "
                    f"{predicted[cand].step_us['publish'] / predicted[cand].call_us['publish']:.3g}, "
                    f"{predicted[cand].call_us['publish']:.0f} us each")
    for _ in range(passes):
        for cand, run in zip(local, measure_many(config, local, 3.0)):
            loads[cand].append(os.getloadavg()[0])
            rates[cand].append(run["steps_per_s"])
    print("| runtime | plan | predicted steps/s | measured steps/s (runs) | error | limiting side (model) | "
          "load average | wire constants: predicted, error | without the ray profile: predicted, error |\n"
          "| --- | --- | ---: | ---: | ---: | --- | --- | --- | --- |")
    errors: dict = {"ray": [], "processes": [], "ray, wire constants": [], "ray, without the ray profile": []}
    for cand in cands + local:
        p = predicted[cand]
        measured = max(rates[cand])  # the least disturbed run, as pearl.measure keeps the fastest window
        error = (p.steps_per_s - measured) / measured
        errors[cand.runtime].append(abs(error))
        print(f"| {cand.runtime} | {cand.label()} | {p.steps_per_s:,.0f} | {measured:,.0f} "
              f"({', '.join(f'{r:,.0f}' for r in rates[cand])}) | {100 * error:+.1f}% | {p.limiting_side} "
              f"({p.bottleneck}) | {', '.join(f'{x:.1f}' for x in loads[cand])} | " +
              (f"{unwired[cand].steps_per_s:,.0f}, {100 * (unwired[cand].steps_per_s - measured) / measured:+.1f}% |"
               if cand in unwired else "|") +
              (f" {unrayed[cand].steps_per_s:,.0f}, {100 * (unrayed[cand].steps_per_s - measured) / measured:+.1f}% |"
               if cand in unrayed else " |"))
        if cand in unwired:
            errors["ray, wire constants"].append(abs(unwired[cand].steps_per_s - measured) / measured)
            errors["ray, without the ray profile"].append(abs(unrayed[cand].steps_per_s - measured) / measured)
    for runtime, values in errors.items():
        print(f"# {runtime}: median |error| {100 * statistics.median(values):.1f}% over {len(values)} plans, "
              f"max {100 * max(values):.1f}%")
    print("\nCPU per env step (us) of each role, measured over the fastest run's steady window / the model's:\n"
          "| plan | actors | node agents | driver (learner) | replay shards | Ray's own |\n"
          "| --- | --- | --- | --- | --- | --- |")
    background = costs.ray_background()
    for cand in cands:
        p, m = predicted[cand], cpu[cand]
        model = {"actors": sum(p.step_us.get(k, 0.0) for k in ("act", "ring_write", "weight_loads")),
                 "agents": p.step_us["agent"], "driver": p.sides["learner"],
                 "servers": p.sides.get("server", 0.0) * (cand.shards if cand.placement != "learner" else 0),
                 # Ray's processes at rest on every node of the cluster, and their work per publish
                 "ray": p.step_us.get("ray", 0.0) + 1e6 * background["daemon"] * costs.platform.nodes.count
                 / p.steps_per_s}
        print(f"| {cand.label()} | " + " | ".join(f"{m[k]:.1f} / {model[k]:.1f}" for k in model) + " |")
    print(f"# load average after: {os.getloadavg()}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    if save:
        import json

        runs = [{"plan": dataclasses.asdict(cand), "rates": rates[cand], "loads": loads[cand], "cpu": cpu.get(cand)}
                for cand in cands + local]
        with open(save, "w") as out:
            json.dump({"tables": costs.measured, "runs": runs}, out, indent=1)


def reprice(path: str) -> None:
    """--reprice: the ray plans of a --save file priced again by this tree's model, from the tables
    the run saved (its own profile), against the rates it measured: the model's changes checked
    on old runs without running them again."""
    import json

    from pearl.estimator.costs import Costs
    from pearl.estimator.model import Candidate, predict
    from pearl.estimator.workload import workload_from_config
    from pearl.platforms import load_platform

    with open(path) as f:
        saved = json.load(f)
    costs = Costs(load_platform("local_cluster"), workload_from_config(accuracy_config()), saved["tables"])
    print(f"# {path}: the saved runs priced by this tree's model with the saved tables ("
          f"{', '.join(sorted(k for k in saved['tables'] if k.startswith('ray|')))})")
    print("| plan | predicted steps/s | measured steps/s | error |\n| --- | ---: | ---: | ---: |")
    errors = []
    for run in saved["runs"]:
        cand = Candidate(**run["plan"])
        if cand.runtime != "ray":
            continue
        p, measured = predict(cand, costs), max(run["rates"])
        errors.append((p.steps_per_s - measured) / measured)
        print(f"| {cand.label()} | {p.steps_per_s:,.0f} | {measured:,.0f} | {100 * errors[-1]:+.1f}% |")
    print(f"# ray: median |error| {100 * statistics.median(map(abs, errors)):.1f}% over {len(errors)} plans, "
          f"max {100 * max(map(abs, errors)):.1f}%")


class Echo:
    """A Ray actor that answers (the calls' figures of --calls)."""

    def take(self, value):
        return None

    def hold(self, seconds: float):
        time.sleep(seconds)


def calls(nodes: int, rounds: int = 400, idle_s: float = 5.0) -> None:
    """The local cluster's Ray figures: the driver's CPU time per actor call submitted (`.remote()`
    on an actor of another node, object refs gathered after), one call's round trip (submitted and
    its result got, one at a time; the median), and the CPU the Ray processes of the cluster burn
    per node while idle."""
    import numpy as np
    import ray

    print(f"# {cpu_model()}, {os.cpu_count()} cores; load average before: {os.getloadavg()}", flush=True)
    with local_cluster(nodes):
        echo = ray.remote(Echo).options(num_cpus=1).remote()
        weights = np.zeros(4866, np.float32)  # the DQN 4-64-64-2 policy's weights
        ray.get(echo.take.remote(ray.put(weights)))
        results = []
        for _ in range(3):
            cpu0 = time.thread_time()
            refs = [echo.take.remote(i) for i in range(rounds)]
            submit = (time.thread_time() - cpu0) / rounds
            ray.get(refs)
            cpu0 = time.thread_time()
            for _ in range(rounds):  # one reference alive at a time, as the publisher holds them
                ref = ray.put(weights)
            put = (time.thread_time() - cpu0) / rounds
            del ref
            trips = []
            for _ in range(rounds // 4):
                t0 = time.perf_counter()
                ray.get(echo.take.remote(0))
                trips.append(time.perf_counter() - t0)
            # a publish to one agent as pearl/runtime/ray.py _Publisher makes it: one put, a call
            # taking the reference, the previous reference dropped; its wall time until the call
            # is done (the delivery: the agent reads the object)
            cycles = []
            for _ in range(rounds // 4):
                t0 = time.perf_counter()
                ref = ray.put(weights)
                ray.get(echo.take.remote(ref))
                cycles.append(time.perf_counter() - t0)
            del ref
            publish = statistics.median(cycles)
            held = [echo.hold.remote(1.0), echo.hold.remote(1.0)]  # in flight: what the publisher polls
            cpu0 = time.thread_time()
            for _ in range(rounds):
                ray.wait(held, num_returns=len(held), timeout=0)
            wait = (time.thread_time() - cpu0) / rounds
            results.append((submit, put, statistics.median(trips), wait, publish))
            print(f"call submitted: {1e6 * submit:.0f} us of the driver's CPU, ray.put of the weights "
                  f"{1e6 * put:.0f} us, a call's round trip {1e6 * results[-1][2]:.0f} us (median), ray.wait on "
                  f"2 calls in flight {1e6 * wait:.0f} us, a publish (put + call) until delivered {1e6 * publish:.0f} "
                  f"us (median); load {os.getloadavg()[0]:.1f}", flush=True)
            ray.get(held)
        ray.kill(echo)
        time.sleep(2.0)
        idle = idle_cpu(idle_s)  # the same accounting as --cpu and --accuracy
        ray_cores = sum(cores for role, cores in idle.items() if model_role(role) == "ray")
        print(f"Ray's processes while idle: {ray_cores / nodes:.3f} cores per node")
    best = [min(r[i] for r in results) for i in range(5)]
    print(f"# best of 3: call {1e6 * best[0]:.0f} us, put {1e6 * best[1]:.0f} us, round trip {1e6 * best[2]:.0f} us, "
          f"wait {1e6 * best[3]:.0f} us, publish delivered {1e6 * best[4]:.0f} us; load average after: "
          f"{os.getloadavg()}")


def scaling(platform: str, counts=(1, 2, 4, 8, 16, 32, 64)) -> None:
    """The model on `platform` for DQN CartPole and DDPG Pendulum by node agents (module doc)."""
    from pearl.config import default_config_path, load_config
    from pearl.estimator.costs import Costs
    from pearl.estimator.model import predict
    from pearl.estimator.profile import load_cached
    from pearl.estimator.workload import workload_from_config
    from pearl.platforms import load_platform

    profile_ = load_platform(platform)
    workloads = {"DQN CartPole (shipped, n_step 1, u 0.25, B64)": (accuracy_config(), "fused", 8),
                 "DDPG Pendulum (shipped 400x300, u 1, B256)": (load_config(default_config_path().with_name(
                     "pendulum_ddpg.yaml")), "fused", 1)}
    for name, (config, kernel, envs) in workloads.items():
        workload = workload_from_config(config)
        cached = load_cached(workload.key())
        costs = Costs(profile_, workload, cached["tables"] if cached else None)
        print(f"\n{name} on {profile_.name} ({'this machine' + chr(39) + 's profile' if cached else 'analytic'} "
              f"task costs), {profile_.nodes.cores} actors per node x {envs} envs, chunk 256:")
        print("| nodes | placement | predicted env steps/s | limiting side (task) | publishes per s | ceilings "
              "(env steps/s): learner / actors / agents / server / wire |\n| ---: | --- | ---: | --- | ---: | --- |")
        for n in counts:
            for placement, shards in (("learner", 1), ("server", 4), ("node", 4)):
                if n + (shards if placement == "node" else 0) > profile_.nodes.count:
                    continue
                cand = ray_candidate(n, profile_.nodes.cores, envs, placement, shards, 256,
                                     config.algo_config.batch_size, kernel)
                p = predict(cand, costs)
                ceiling = lambda side: f"{1e6 / p.sides[side]:,.0f}" if p.sides.get(side) else "-"  # noqa: E731
                publishes = p.steps_per_s * p.step_us["publish"] / p.call_us["publish"]
                print(f"| {n} | {placement}{f' x{shards}' if shards > 1 else ''} | {p.steps_per_s:,.0f} | "
                      f"{p.limiting_side} ({p.bottleneck}) | {publishes:,.0f} | "
                      + " / ".join(ceiling(side) for side in ("learner", "actors", "agents", "server", "wire")) + " |")


def cpu_report(plans: dict, args) -> None:
    """--cpu: the cluster's idle CPU, then per seed each plan's steady-part CPU per 1,000 env steps
    by role, interleaved; the medians by role side by side."""
    idle = idle_cpu(5.0)
    print("# idle cluster, CPU ms per s by role: " + ", ".join(f"{r} {1e3 * c:.1f}" for r, c in sorted(idle.items())
                                                               if c > 1e-4), flush=True)
    rows: dict[str, list] = {name: [] for name in plans}
    for seed in range(args.seeds):
        for name, plan in plans.items():
            row = cpu_run(plan, args.steps, seed, args.n_step)
            rows[name].append(row)
            total = sum(row["cpu_ms_per_1k"].values())
            print(f"seed {seed} {name:9s}: {row['whole']:7.0f} env steps/s whole, {row['steady']:7.0f} steady, "
                  f"{row['cores']:.2f} cores busy, CPU {total:6.1f} ms per 1k env steps; actors per round: act "
                  f"{row['act_us']:.0f} us (CPU {row['act_cpu_us']:.0f}), wait {row['wait_us']:.0f} us, acted/counted "
                  f"{row['acted']:.2f}; start-up {row['startup_s']:.2f} s; "
                  f"ratio exact {row['exact']}; load {os.getloadavg()[0]:.2f}", flush=True)
    roles = sorted({r for name in rows for row in rows[name] for r in row["cpu_ms_per_1k"]})
    print(f"# CPU ms per 1,000 env steps, steady part, median of {args.seeds} seeds")
    print(f"{'role':48s}" + "".join(f"{name:>12s}" for name in rows))
    for role in roles + ["total"]:
        cells = []
        for name in rows:
            values = [sum(row["cpu_ms_per_1k"].values()) if role == "total" else row["cpu_ms_per_1k"].get(role, 0.0)
                      for row in rows[name]]
            cells.append(f"{statistics.median(values):12.1f}")
        print(f"{role:48s}" + "".join(cells))
    print(f"# load average after: {os.getloadavg()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20000)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--actors", type=int, default=2, help="actor processes in all (ray: spread over --nodes)")
    parser.add_argument("--envs", type=int, default=8)
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--chunk", type=int, default=256)
    parser.add_argument("--rllib", action="store_true")
    parser.add_argument("--rllib-steps", type=int, default=4000,
                        help="RLlib's env steps per run (it runs at well under 1k steps/s here; rates compared)")
    # 1, not the shipped 3: with n_step 3 and 8 envs per actor the processes runtime's replay rate
    # limiter refuses a sample now and then on the loaded machine (RateLimitExceeded; also on main)
    parser.add_argument("--n-step", type=int, default=1)
    parser.add_argument("--config", help="a DQN experiment config instead of the shipped CartPole one, e.g. "
                                         "configs/minatar_breakout_dqn.yaml (processes / ray comparison)")
    parser.add_argument("--learning", action="store_true", help="learning quality: the shipped config, ray only")
    parser.add_argument("--replay", default="learner", help="plan.ray.replay: learner, server or node")
    parser.add_argument("--shards", type=int, default=1)
    parser.add_argument("--accuracy", action="store_true", help="the estimator's ray model against measurement")
    parser.add_argument("--passes", type=int, default=1, help="--accuracy: runs of each plan, in turns")
    parser.add_argument("--profile-seconds", type=float, default=1.5)
    parser.add_argument("--save", metavar="FILE", help="--accuracy: the runs' figures and the profile's tables as JSON "
                                                       "(to price the same runs again with another model)")
    parser.add_argument("--reprice", metavar="FILE", help="the ray plans of a --save file priced again by this "
                        "tree's model with the file's tables, against its measured rates (no runs)")
    parser.add_argument("--wire-constants", action="store_true",
                        help="--accuracy: price the wire with estimator/wire.py's constants, not `pearl profile --wire`")
    parser.add_argument("--calls", action="store_true", help="the local cluster's Ray figures")
    parser.add_argument("--scaling", metavar="PLATFORM", help="the model's figures for 1-64 nodes on a cluster profile")
    parser.add_argument("--runtimes", default="processes,ray", help="which of processes, ray to run")
    parser.add_argument("--no-learner-start", action="store_true",
                        help="ray: the node agents take every step (plan.act_while_actors_start off)")
    parser.add_argument("--cpu", action="store_true",
                        help="CPU time per env step by process and thread role (steady part), processes vs ray")
    args = parser.parse_args()
    if args.reprice:
        return reprice(args.reprice)
    if args.accuracy:
        return accuracy(args.steps, args.passes, args.profile_seconds, not args.wire_constants, args.save)
    if args.calls:
        return calls(CLUSTER_NODES)
    if args.scaling:
        return scaling(args.scaling)
    print(f"# {cpu_model()}, {os.cpu_count()} cores; load average before: {os.getloadavg()}")
    with local_cluster(args.nodes + (args.shards if args.replay == "node" else 0)):
        run_main(args)


def run_main(args) -> None:
    """The processes / ray / RLlib comparison, or --learning, on the running cluster."""
    from pearl.plan import Plan, RayPlan

    if args.learning:
        plan = Plan(runtime="ray", actors=args.actors // args.nodes, envs_per_actor=args.envs,
                    ray=RayPlan(nodes=args.nodes, chunk=args.chunk, replay=args.replay, shards=args.shards))
        print(f"# learning: shipped config (100k env steps, n_step 3), ray runtime, {args.nodes} nodes x "
              f"{plan.actors} actors x {args.envs} envs, replay {args.replay} x {args.shards}", flush=True)
        finals = []
        for seed in range(args.seeds):
            row = learning_run(plan, seed)
            finals.append(row["final"])
            print(f"seed {seed}: final greedy return {row['final']:6.1f} (20 episodes), best periodic "
                  f"{row['best']:6.1f}, {row['steps_per_s']:6.0f} env steps/s, {row['env_steps']} env steps, "
                  f"{row['updates']} updates (ratio exact: {row['exact']}); load {os.getloadavg()}", flush=True)
        print(f"# solved (final >= 475): {sum(f >= 475 for f in finals)} of {len(finals)}; "
              f"load average after: {os.getloadavg()}")
        return
    print(f"# DQN, {args.config or 'the shipped CartPole-v1 config'} (n_step {args.n_step}), {args.steps} env "
          f"steps per run, {args.actors} actors x {args.envs} envs; CPU {cpu_model()}, load {os.getloadavg()}")
    plans = {"processes": Plan(runtime="processes", actors=args.actors, envs_per_actor=args.envs),
             "ray": Plan(runtime="ray", actors=args.actors // args.nodes, envs_per_actor=args.envs,
                         act_while_actors_start=not args.no_learner_start,
                         ray=RayPlan(nodes=args.nodes, chunk=args.chunk, replay=args.replay, shards=args.shards))}
    plans = {name: plans[name] for name in args.runtimes.split(",")}
    if args.cpu:  # the steady part's CPU: the agents' and actors', not the learner's own actor at the start
        return cpu_report({name: dataclasses.replace(plan, act_while_actors_start=False)
                           for name, plan in plans.items()}, args)
    results: dict[str, list] = {name: [] for name in (*plans, *(["rllib"] if args.rllib else []))}
    for seed in range(args.seeds):
        for name, plan in plans.items():
            wall, steady, info = pearl_run(plan, args.steps, seed, args.n_step, config_path=args.config)
            results[name].append((wall, steady))
            print(f"seed {seed} {name:9s}: {wall:8.0f} env steps/s whole run, {steady:8.0f} steady  {info}", flush=True)
        if args.rllib:
            wall, steady, info = rllib_run(args.rllib_steps, seed, args.actors, args.envs, args.n_step)
            results["rllib"].append((wall, steady))
            print(f"seed {seed} rllib    : {wall:8.0f} env steps/s whole run, {steady:8.0f} steady  {info}", flush=True)
    print(f"# load average after: {os.getloadavg()}")
    for other in [n for n in results if n != "ray"]:
        for column, label in ((0, "whole run"), (1, "steady")):
            ratios = [r[column] / o[column] for r, o in zip(results["ray"], results[other])]
            print(f"ray / {other} ({label}): per seed {', '.join(f'{x:.2f}' for x in ratios)}; "
                  f"median {statistics.median(ratios):.2f}")


if __name__ == "__main__":
    main()
