"""The ray runtime against the processes runtime and RLlib's DQN, side by side from one run.

DQN on CartPole-v1 with the shipped config (pearl/configs/cartpole_dqn.yaml: 0.25 updates per env
step, batch 64, 64x64) at n-step --n-step (default 1) for --steps env steps per run:
- processes: `--actors` actor processes of `--envs` envs beside the learner (one machine);
- ray: the same actor count spread over a local Ray cluster of `--nodes` nodes
  (ray.cluster_utils.Cluster, every node on 127.0.0.1, 1 CPU each), a replay server in the learner;
- rllib (if installed and --rllib): RLlib's DQN (new API stack) on the same cluster, its env runners
  as many as our actors with the same envs each, training_intensity = updates per env step x batch
  (the same updates per env step), its own defaults otherwise.
Runs alternate (processes, ray, rllib) per seed so load changes hit each alike. Figures: env steps/s
over the whole `train` call (start-up included) and over the steady part (after the first quarter
of the steps), per seed, the ratio ray / processes beside them; the machine's load average before
and after.

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
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import time

from pearl.kernels.cpu.backend import cpu_model  # noqa: E402

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")


# -- CPU accounting (--cpu): every thread of this process and of its descendants (Ray's GCS,
# raylets, their agents and workers, the node agents and their actor processes; the processes
# runtime's actors), from /proc/PID/task/TID/schedstat (ns on the CPU), by role.
def _processes() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line) of every process."""
    found = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as f:
                    parent = int(f.read().rpartition(b")")[2].split()[1])
                with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                    command = f.read().replace(b"\0", b" ").decode(errors="replace")
            except (OSError, IndexError, ValueError):
                continue
            found[int(entry.name)] = (parent, command)
    return found


def _role(command: str) -> str:
    if "actor_main" in command:
        return "actor processes"
    for key, role in (("ray::NodeAgent", "node agents"), ("ray::ReplayShard", "replay shards"),
                      ("gcs_server", "ray: gcs"), ("raylet", "ray: raylets"), ("dashboard", "ray: dashboard agents"),
                      ("DashboardAgent", "ray: dashboard agents"), ("runtime_env", "ray: runtime-env agents"),
                      ("RuntimeEnvAgent", "ray: runtime-env agents"), ("log_monitor", "ray: log monitors"),
                      ("monitor.py", "ray: monitor"), ("ray::", "ray: idle workers")):
        if key in command:
            return role
    return "other: " + command[:60]


def _maps_rings(pid: int) -> bool:
    """Whether the process maps a shared-memory ring (an actor process does; a resource tracker not)."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            return "/psm_" in f.read()
    except OSError:
        return False


def cpu_snapshot(threads: dict[int, str]) -> dict[tuple[int, int], tuple[str, int]]:
    """(pid, tid) -> (role, ns on the CPU) for this process (its threads by `threads`: native id ->
    role, the rest "driver: other threads") and every descendant."""
    root = os.getpid()
    table = _processes()
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in table.items():
        children.setdefault(parent, []).append(pid)
    tree, todo = [root], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            tree.append(child)
            todo.append(child)
    snapshot = {}
    for pid in tree:
        role = None if pid == root else _role(table[pid][1])
        if role is not None and role.startswith("other") and _maps_rings(pid):
            role = "actor processes"  # (one's /proc cmdline sometimes reads empty under a Ray worker)
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    ns = int(f.read().split()[0])
                with open(f"/proc/{pid}/task/{tid}/comm") as f:
                    zmq = f.read().startswith("ZMQbg")  # libzmq's I/O threads name themselves
            except (OSError, ValueError, IndexError):
                continue
            name = role or threads.get(int(tid), "driver: other threads (Ray core worker)")
            snapshot[pid, int(tid)] = (("driver" if role is None else role) + ": zmq I/O" if zmq else name, ns)
    return snapshot


def cpu_delta(before: dict, after: dict) -> dict[str, float]:
    """Seconds on the CPU by role between two snapshots (threads born since count whole)."""
    spent: dict[str, float] = {}
    for key, (role, ns) in after.items():
        spent[role] = spent.get(role, 0.0) + (ns - before.get(key, (role, 0))[1]) * 1e-9
    return spent


def idle_cpu(seconds: float) -> dict[str, float]:
    """CPU per second by role with no run going: what the cluster's own processes cost at rest."""
    first = cpu_snapshot({})
    time.sleep(seconds)
    return {role: s / seconds for role, s in cpu_delta(first, cpu_snapshot({})).items()}


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
    import threading

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
            threads = {threading.main_thread().native_id: "driver: learner (main thread)"}
            threads.update({t.native_id: "driver: replay-server thread" for t in threading.enumerate()
                            if t.name == "replay-server"})
            marks.append((time.perf_counter(), a.env_steps, a.updates, _actor_clocks(a), cpu_snapshot(threads)))

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


def pearl_run(plan, steps: int, seed: int, n_step: int) -> tuple[float, float, dict]:
    import pearl
    from pearl.config import default_config_path, load_config
    from pearl.api import make_agent
    from pearl.config import apply_overrides

    config = apply_overrides(load_config(default_config_path()), {"total_steps": steps, "seed": seed,
                                                                  "dqn.n_step": n_step})
    agent = make_agent(config, plan)
    marks = []
    started = time.perf_counter()
    agent.train(steps, on_round=lambda a: marks.append((time.perf_counter(), a.env_steps)))
    wall = time.perf_counter() - started
    steady = [m for m in marks if m[1] >= steps // 4]
    rate = (steady[-1][1] - steady[0][1]) / (steady[-1][0] - steady[0][0]) if len(steady) > 1 else float("nan")
    assert agent.updates == int(max(0, agent.env_steps - 1000) * 0.25), "the replay ratio is not exact"
    del pearl
    return agent.env_steps / wall, rate, {"env_steps": agent.env_steps, "updates": agent.updates}


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


def cpu_report(plans: dict, args) -> None:
    """--cpu: the cluster's idle CPU, then per seed each plan's steady-part CPU per 1,000 env steps
    by role, interleaved; the medians by role side by side."""
    idle = idle_cpu(5.0)
    print(f"# idle cluster, CPU ms per s by role: " + ", ".join(f"{r} {1e3 * c:.1f}" for r, c in sorted(idle.items())
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
    parser.add_argument("--learning", action="store_true", help="learning quality: the shipped config, ray only")
    parser.add_argument("--replay", default="learner", help="plan.ray.replay: learner, server or node")
    parser.add_argument("--shards", type=int, default=1)
    parser.add_argument("--runtimes", default="processes,ray", help="which of processes, ray to run")
    parser.add_argument("--cpu", action="store_true",
                        help="CPU time per env step by process and thread role (steady part), processes vs ray")
    args = parser.parse_args()

    import ray
    from ray.cluster_utils import Cluster

    from pearl.plan import Plan, RayPlan

    print(f"# {cpu_model()}, {os.cpu_count()} cores; load average before: {os.getloadavg()}")
    store = 150 * 2**20
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "node_ip_address": "127.0.0.1",
                                                            "object_store_memory": store, "include_dashboard": False})
    for _ in range(args.nodes - 1 + (args.shards if args.replay == "node" else 0)):
        cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1", object_store_memory=store)
    ray.init(address=cluster.address, _node_ip_address="127.0.0.1", log_to_driver=False)
    if args.learning:
        plan = Plan(runtime="ray", actors=args.actors // args.nodes, envs_per_actor=args.envs,
                    ray=RayPlan(nodes=args.nodes, chunk=args.chunk, replay=args.replay, shards=args.shards))
        print(f"# learning: shipped config (100k env steps, n_step 3), ray runtime, {args.nodes} nodes x "
              f"{plan.actors} actors x {args.envs} envs, replay {args.replay} x {args.shards}", flush=True)
        finals = []
        try:
            for seed in range(args.seeds):
                row = learning_run(plan, seed)
                finals.append(row["final"])
                print(f"seed {seed}: final greedy return {row['final']:6.1f} (20 episodes), best periodic "
                      f"{row['best']:6.1f}, {row['steps_per_s']:6.0f} env steps/s, {row['env_steps']} env steps, "
                      f"{row['updates']} updates (ratio exact: {row['exact']}); load {os.getloadavg()}", flush=True)
        finally:
            ray.shutdown()
            cluster.shutdown()
        print(f"# solved (final >= 475): {sum(f >= 475 for f in finals)} of {len(finals)}; "
              f"load average after: {os.getloadavg()}")
        return
    print(f"# DQN CartPole-v1 (shipped config, n_step {args.n_step}), {args.steps} env steps per run, "
          f"{args.actors} actors x {args.envs} envs")
    plans = {"processes": Plan(runtime="processes", actors=args.actors, envs_per_actor=args.envs),
             "ray": Plan(runtime="ray", actors=args.actors // args.nodes, envs_per_actor=args.envs,
                         ray=RayPlan(nodes=args.nodes, chunk=args.chunk))}
    plans = {name: plans[name] for name in args.runtimes.split(",")}
    if args.cpu:
        try:
            cpu_report(plans, args)
        finally:
            ray.shutdown()
            cluster.shutdown()
        return
    results: dict[str, list] = {name: [] for name in (*plans, *(["rllib"] if args.rllib else []))}
    try:
        for seed in range(args.seeds):
            for name, plan in plans.items():
                wall, steady, info = pearl_run(plan, args.steps, seed, args.n_step)
                results[name].append((wall, steady))
                print(f"seed {seed} {name:9s}: {wall:8.0f} env steps/s whole run, {steady:8.0f} steady  {info}", flush=True)
            if args.rllib:
                wall, steady, info = rllib_run(args.rllib_steps, seed, args.actors, args.envs, args.n_step)
                results["rllib"].append((wall, steady))
                print(f"seed {seed} rllib    : {wall:8.0f} env steps/s whole run, {steady:8.0f} steady  {info}", flush=True)
    finally:
        ray.shutdown()
        cluster.shutdown()
    print(f"# load average after: {os.getloadavg()}")
    for other in [n for n in results if n != "ray"]:
        for column, label in ((0, "whole run"), (1, "steady")):
            ratios = [r[column] / o[column] for r, o in zip(results["ray"], results[other])]
            print(f"ray / {other} ({label}): per seed {', '.join(f'{x:.2f}' for x in ratios)}; "
                  f"median {statistics.median(ratios):.2f}")


if __name__ == "__main__":
    main()
