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

`--learning`: learning quality instead. The shipped config as it is (100k env steps, n_step 3)
trained by the ray runtime alone on the same cluster for each seed (`--replay`, `--shards`: the
replay placement), then the final greedy return over 20 fresh episodes (`agent.evaluate`; solved:
a mean >= 475), the best periodic evaluation of the run (eval.interval) and the run's env steps/s.

    python benchmarks/ray_runtime.py --learning --seeds 3 [--replay server --shards 2]
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

from pearl.kernels.cpu.backend import cpu_model  # noqa: E402

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")




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
