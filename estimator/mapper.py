"""The mapper: enumerate the plans a platform allows for a workload, predict each, rank them by
the user's metric.

Search space: replay kind (those the caller allows) x where the replay table lives x where the
learner runs and with which kernel and product precision (Backend.learner_precisions: bf16 where
the cpu has bfloat16 units) x envs per actor x batch size x runtime x the learner's threads (where
the runtime leaves cores free: `learner_threads`), and for the processes
runtime x actor processes (`actor_counts`: 1 up to the host's cores; more would only time-share
the cores, each loading every weight version, so the model never ranks them higher). Only
placements the runtime accepts are generated: act on the cpu, the replay and the learner on every device
of the platform whose backend runs them (Backend.can_run, learner_kernels: a registered
backend's devices are enumerated like the built-in ones), each placement passing the one
placement rule (pearl/placement.py check_placement: e.g. a replay on cuda:N feeds a learner on
the same GPU), so every ranked plan is one `pearl train --plan` runs. Ray plans (a platform with a
`nodes:` section) add node agents (the ladder up to the cluster's nodes) x actor processes per node
(up to a node's cores) x replay placement and shards (RAY_PLACEMENTS) x chunk size (RAY_CHUNKS),
their replay table on the cpu. Pruning: devices with identical figures are interchangeable (an H100
node's eight GPUs give one set of plans, not eight); under a power cap, plans over the cap are
dropped. The space is small (hundreds to a few thousand plans), so the rest is exhaustive.
"""
from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass

from pearl import schedule
from pearl.errors import ConfigError
from pearl.estimator.model import Candidate, Prediction, predict
from pearl.kernels.cpu import paired_products
from pearl.kernels.registry import REPLAY_TASKS, backend
from pearl.placement import check_placement

METRICS = ("throughput", "efficiency", "power_cap")
# every runtime has a schedule model (pearl.schedule.models); ray plans need a platform with nodes
RUNTIMES = (*schedule.RUNTIMES, *schedule.CLUSTER_RUNTIMES)
DEFAULT_ENVS = (1, 2, 4, 8, 16)
# actor counts the mapper tries up to the host's cores: all of them on a small host, a geometric
# ladder on a big one (the predicted step falls as 1 / actors until another side limits it, so
# the ladder lands within one rung of the best count)
ACTOR_LADDER = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)


# ray plans: the replay placements (plan.ray.replay) with their shard counts, and the chunk sizes
RAY_PLACEMENTS = (("learner", 1), ("server", 1), ("server", 2), ("node", 1))
RAY_CHUNKS = (64, 256)


def node_counts(count: int) -> list[int]:
    """Node agents to try on a cluster of `count` nodes: the ladder up to them, and all of them."""
    return sorted({n for n in ACTOR_LADDER if n <= count} | {count})


def ray_plans(nodes) -> list[dict]:
    """The plan.ray fields of the ray plans a cluster (platforms/ `nodes:`) holds: node agents x
    placement x shards x chunk, a `node` placement's shards on nodes beside the agents'."""
    return [dict(nodes=n, placement=where, shards=shards, chunk=chunk)
            for n in node_counts(nodes.count) for where, shards in RAY_PLACEMENTS for chunk in RAY_CHUNKS
            if n + (shards if where == "node" else 0) <= nodes.count]


def learner_threads(cores: int, workload, learn_device: str, kernel: str, runtime: str) -> list[int]:
    """Learner threads (Plan.learner_threads) to try: more than one only for a learner on the cpu
    whose products can split — the torch learners and the fused DDPG / TD3 / SAC learners (torch's
    threads), the fused DQN learner at 2 where its products pair (pearl.kernels.cpu.paired_products)
    — and only onto cores the learner can have while it learns: all of them in the sequential
    runtime (its actor waits) and in the processes runtime (its actors wait once ahead by their
    allowance; the model charges the learn once per thread on the shared cores, so a plan whose
    actors keep the cores busy loses by it), one fewer in the threaded runtime (its actor thread
    runs beside the learner's); a ray learner's node is left to its agents.
    The ladder up to those cores, and the cores themselves."""
    if learn_device != "cpu" or runtime in schedule.CLUSTER_RUNTIMES:
        return [1]
    free = cores - (1 if runtime == "threaded" else 0)
    if kernel == "fused" and not workload.continuous:
        sizes = [workload.obs_dim, *workload.hidden, workload.n_actions]
        return [1, 2] if free >= 2 and not workload.dueling and paired_products(sizes, workload.batch_size) else [1]
    return sorted({n for n in ACTOR_LADDER if n <= free} | {max(1, free)})


def actor_counts(cores: int) -> list[int]:
    """Actor processes to try on a host with `cores` cores: the ladder up to the cores, and the
    cores themselves and one fewer (with the learner, cores - 1 actors fill the cores exactly)."""
    return sorted({n for n in ACTOR_LADDER if n <= cores} | {max(1, cores - 1), cores})


@dataclass
class Ranking:
    metric: str
    predictions: list[Prediction]  # best first
    pruned: int  # candidates dropped before prediction (interchangeable devices)
    over_cap: int  # predicted but over the power cap
    refused: int = 0  # dropped by the caller because the runtime would refuse them (pearl/tune.py)

    @property
    def best(self) -> Prediction:
        return self.predictions[0]


def _distinct(devices) -> list:
    """One device of each set of interchangeable ones (same kind and figures)."""
    seen, out = set(), []
    for device in devices:
        key = (device.kind, device.name, device.peak_gflops, device.memory_bandwidth_gb_s,
               device.static_w, device.dynamic_w, device.launch_us, device.clock_mhz, device.host)
        if key not in seen:
            seen.add(key)
            out.append(device)
    return out


def candidates(platform, workload, replay_kinds=None, envs=DEFAULT_ENVS, batches=None,
               sync_intervals=(1,), runtimes=("sequential",), actors=None,
               engines=None) -> tuple[list[Candidate], int]:
    """(the plans to predict, how many were pruned as interchangeable). `actors`: the actor
    counts of processes plans (default: actor_counts of the host's cores) and per node of ray
    plans (default: actor_counts of a node's cores); the other runtimes run one actor. `engines`:
    the actors' env engines (default: env_engines(workload))."""
    engines = engines or env_engines(workload)
    kinds = list(replay_kinds or [workload.replay_kind])
    if "ray" in runtimes and platform.nodes is None:
        raise ConfigError(f"--runtimes: ray plans need a platform with a nodes: section ({platform.source} has "
                          f"none; e.g. --platform local_cluster)")
    # actor processes: the host's for processes plans, each node's for ray plans
    cores = {**{runtime: platform.host.cores for runtime in schedule.MANY_ACTORS},
             **{runtime: platform.nodes.cores if platform.nodes else 1 for runtime in schedule.CLUSTER_RUNTIMES}}
    counts = {runtime: (list(actors or actor_counts(cores[runtime])) if runtime in cores else [1])
              for runtime in runtimes}
    layouts = {runtime: ray_plans(platform.nodes) if runtime == "ray" else [{}] for runtime in runtimes}
    batches = list(batches or [64])
    distinct = _distinct(platform.devices)
    pruned = len(platform.devices) - len(distinct)
    out = []
    for kind in kinds:
        work = dataclasses.replace(workload, replay_kind=kind)
        replay_devices = [d.id for d in distinct if all(backend(d.kind).can_run(task, work) is None
                                                         for task in REPLAY_TASKS)]
        learners = [(d.id, kernel, precision) for d in distinct if backend(d.kind).can_run("learn", work) is None
                    for kernel in backend(d.kind).learner_kernels(work)
                    for precision in backend(d.kind).learner_precisions(work, kernel)]
        placements = [(replay, learn, kernel, precision) for replay in replay_devices
                      for learn, kernel, precision in learners
                      if _placeable({"sample": replay, "insert": replay, "update_priorities": replay,
                                     "learn": learn, "sync_weights": learn}, work, kernel, platform)]
        for (replay, learn, kernel, precision), e, b, s, runtime, engine in itertools.product(
                placements, envs, batches, sync_intervals, runtimes, engines):
            if runtime == "ray" and replay != "cpu":
                continue  # a ray run's replay table is a cpu one, in the learner's process or a server's
            out += [Candidate(kind, replay, learn, kernel, e, b, s, runtime=runtime, actors=n, env_engine=engine,
                              precision=precision, threads=t, **layout)
                    for n in counts[runtime] for layout in layouts[runtime]
                    for t in learner_threads(platform.host.cores, work, learn, kernel, runtime)]
    return out, pruned


def env_engines(workload, measured: dict | None = None) -> tuple[str, ...]:
    """The actors' env engines a plan may use here: Gymnasium always; EnvPool where it is installed
    and has the env, for DQN on vector observations (what pearl.envs.envpool_envs runs) - unless
    `measured` (a profile) timed act on Gymnasium and not on EnvPool: a measured figure would be set
    against an analytic one (`pearl profile` times EnvPool's act where it is installed)."""
    from pearl.envs import envpool_has

    if not (workload.algo == "dqn" and not workload.image and envpool_has(workload.env)):
        return ("gymnasium",)
    acts = [name for name in measured or {} if name.startswith("act")]
    if acts and not any(name.startswith("act|envpool@") for name in acts):
        return ("gymnasium",)
    return ("gymnasium", "envpool")


def _placeable(devices, workload, kernel, platform) -> bool:
    try:
        check_placement(devices, workload, kernel, platform, here=False)
    except ConfigError:
        return False
    return True


def rank(costs, metric: str = "throughput", power_cap_w: float | None = None, replay_kinds=None,
         envs=DEFAULT_ENVS, batches=None, schedule: str | None = None,
         runtimes=("sequential",), actors=None) -> Ranking:
    if metric not in METRICS:
        raise ConfigError(f"metric: expected one of {', '.join(METRICS)}, got {metric!r}")
    allowed = costs.workload.replay_kinds
    refused = [kind for kind in replay_kinds or () if kind not in allowed]
    if refused:
        raise ConfigError(f"replay kinds: {costs.workload.algo} samples its replay {' or '.join(allowed)}, "
                          f"not {', '.join(refused)}")
    if metric == "power_cap" and (power_cap_w is None or power_cap_w <= 0):
        raise ConfigError("power_cap: the power_cap metric needs a positive cap in watts (--power-cap W)")
    if metric != "power_cap" and power_cap_w is not None:  # a cap the ranking would silently ignore
        raise ConfigError(f"power_cap: a cap of {power_cap_w:g} W ranks plans only with the power_cap metric "
                          f"(--metric power_cap), not {metric}")
    cands, pruned = candidates(costs.platform, costs.workload, replay_kinds, envs, batches, runtimes=runtimes,
                               actors=actors, engines=env_engines(costs.workload, costs.measured))
    predictions = [predict(c, costs, schedule) for c in cands]
    over_cap = 0
    if metric == "power_cap":
        kept = [p for p in predictions if p.watts <= power_cap_w]
        over_cap = len(predictions) - len(kept)
        if not kept:
            lowest = min(p.watts for p in predictions)
            raise ConfigError(f"power_cap: no plan fits under {power_cap_w:g} W (the lowest predicted is {lowest:.1f} W)")
        predictions = kept
    key = (lambda p: p.samples_per_j) if metric == "efficiency" else (lambda p: p.steps_per_s)
    predictions.sort(key=key, reverse=True)
    return Ranking(metric, predictions, pruned, over_cap)
