"""The builder: an experiment config and a Plan -> the parts a runtime runs (pearl.contracts).

One place decides what a run is made of: the reconciled config and complete plan
(pearl.plan.reconcile), the placement check (pearl.placement), the algorithm
(pearl.algos), the learner on the plan's learn device with its kernel, the replay table with its
rate limiter (pearl.schedule.rate_limit), the learner side's numpy copy of the policy, and how to
build actors here or in another process (ActorRecipe). What differs between algorithm families
(discrete actions with a Q-network policy, continuous actions with an actor network) is one class
each below; the agent (pearl/api.py) keeps only the user's verbs.
"""
from __future__ import annotations

import dataclasses
import functools
import warnings
from dataclasses import dataclass, field

import numpy as np
import torch

from pearl.algos import algorithm_class
from pearl.config import ExperimentConfig
from pearl.envs import (box_spaces, discrete_spaces, env_factory, env_module, import_modules, make_env,
                        observation_layout)
from pearl.errors import ConfigError
from pearl.estimator.workload import workload_of
from pearl.kernels.cpu import MLPLayout
from pearl.kernels.cpu.backend import bf16_products
from pearl.kernels.registry import backend, kind_of, parse_device
from pearl.algos.dqn import q_network
from pearl.nets import TorchPolicy, check_conv, conv_shapes, encoded_policy, is_image
from pearl.plan import Plan, reconcile
from pearl.placement import check_device, check_placement, replay_device
from pearl.replay import RateLimiter, make_replay
from pearl.runtime.actor import ENGINES, device_policy
from pearl.runtime.adaptive_threads import AdaptiveThreads
from pearl.runtime.continuous import ActionScaler, ContinuousActor, ContinuousLearner, ContinuousPolicy
from pearl.runtime.fused_actor_critic import FusedActorCriticLearner, FusedSACLearner
from pearl.runtime.learners import FusedCPULearner, TorchLearner
from pearl.runtime import CLUSTER_RUNTIMES
from pearl.runtime.processes import ActorRecipe
from pearl import schedule


def observations(probe, config: ExperimentConfig) -> tuple[tuple, np.dtype, float, bool]:
    """(shape, dtype, input scale, image?) of the env's observations (pearl.envs.observation_layout);
    an image's conv stack is checked against its size here, before anything is built."""
    shape, dtype, scale = observation_layout(probe, config.env, config.algo)
    if is_image(shape):
        check_conv(shape, config.algo_config.conv, f"{config.algo}.conv")
    return shape, dtype, scale, is_image(shape)


class Discrete:
    """DQN's family: discrete actions, a Q-network the actors run epsilon-greedily."""

    action_field = (np.dtype(np.int64), ())

    def __init__(self, config: ExperimentConfig):
        probe = make_env(config.env, kwargs=config.env_kwargs)
        self.obs_dim, self.n_actions = discrete_spaces(probe, config.env)
        self.obs_shape, self.obs_dtype, self.obs_scale, self.image = observations(probe, config)
        self.action_size = self.n_actions  # what the workload counts: the number of actions
        self.action_start = int(getattr(probe.action_space, "start", 0))
        self.observation_space, self.action_space = probe.observation_space, probe.action_space
        probe.close()

    @property
    def obs_field(self) -> tuple[np.dtype, tuple]:
        """dtype and shape of an observation as actors, rings and the replay carry it (uint8
        frames: a quarter of float32's bytes; pearl.envs.observation_layout)."""
        return self.obs_dtype, self.obs_shape

    def algorithm(self, config: ExperimentConfig):
        image = dict(obs_shape=self.obs_shape, obs_scale=self.obs_scale) if self.image else {}
        return algorithm_class(config.algo)(self.obs_dim, self.n_actions, config.algo_config,
                                            config.total_steps, config.seed, **image)

    def check_precision(self, precision: str, kernel: str, device: str, config: ExperimentConfig) -> None:
        """A reduced precision runs in the fused learner (an MLP) or in the torch learner for a CNN
        Q-network, on the cpu only."""
        if precision != "fp32" and kernel == "torch" and not self.image:
            raise ConfigError(f"runtime.learner_precision: {precision} products run in DQN's fused learner, or in "
                              f"its torch learner for a CNN Q-network; {config.env}'s observations are flat "
                              f"(expected runtime.learner_kernel fused or auto, or learner_precision fp32)")
        if precision != "fp32" and config.dqn.optimizer.kind != "adam":  # both steps are compiled Adam
            raise ConfigError(f"runtime.learner_precision: {precision} learners step Adam; dqn.optimizer.kind "
                              f"{config.dqn.optimizer.kind} learns in fp32 (expected learner_precision fp32 or auto)")
        if precision != "fp32" and kind_of(device) != "cpu":  # its Adam step is a compiled cpu kernel
            raise ConfigError(f"runtime.learner_precision: {precision} runs on a cpu learn device; got {device} "
                              f"(expected learner_precision fp32 there)")

    def _split_batch(self, kernel: str, device: str, threads: int) -> bool:
        """A CNN's torch learner on cpu threads splits each update's batch in two halves, each on a
        thread of its own (TorchLearner(split_batch=True)): in a Breakout run on the 2-core EPYC
        with an actor process beside it, ~10% more env steps/s than the target network's forward
        on a second thread, which in turn took the Nature update at batch 32 to 15.1 ms against 17.7
        on torch's two threads and 19.2 on one (docs/BENCHMARKS.md, Pixels end to end)."""
        return kernel == "torch" and self.image and kind_of(device) == "cpu" and threads > 1

    def torch_threads(self, kernel: str, device: str, threads: int) -> int:
        """torch's intra-op threads for a learner on `threads` threads: with a split batch each of
        the two halves runs its ops on half of them."""
        return max(1, threads // 2) if self._split_batch(kernel, device, threads) else threads

    def learner(self, algo, device: str, kernel: str, precision: str = "fp32", threads: int = 1):
        """`threads`: the fused learner's pairs, or the threads a CNN's split batch shares between its
        halves (torch's other learners take torch.set_num_threads')."""
        if kernel == "fused":
            return FusedCPULearner(algo, threads, precision)
        return TorchLearner(algo, device, precision, split_batch=self._split_batch(kernel, device, threads),
                            threads=threads)

    def thread_setter(self, learner, device: str, threads: int):
        """What sets `learner`'s thread count while it runs (AdaptiveThreads): the fused DQN step's
        pairs, or torch's intra-op threads; None for a CNN's split batch (its two threads are fixed
        at construction) and off the cpu."""
        if kind_of(device) != "cpu" or self._split_batch(learner.kernel, device, threads):
            return None
        if learner.kernel == "fused":
            return functools.partial(setattr, learner.kernel_impl, "threads")
        return torch.set_num_threads if learner.kernel == "torch" else None

    def policy_factory(self, config: ExperimentConfig, algo, act_device: str,
                       threads: int | None = None) -> functools.partial:
        """`threads`: torch's threads where a CNN policy is built (the actor recipe's: 1)."""
        if self.image:  # the numpy act kernels run MLPs: a CNN acts with torch on the cpu
            check_image_act_device(act_device)
            return functools.partial(TorchPolicy, q_network(self.obs_shape, self.n_actions, config.algo_config,
                                                            self.obs_scale), threads)
        hidden = config.algo_config.hidden
        layout = (MLPLayout([self.obs_dim, *hidden], dueling_actions=self.n_actions) if config.algo_config.dueling
                  else MLPLayout([self.obs_dim, *hidden, self.n_actions]))
        return functools.partial(device_policy, layout, act_device)

    def actor_recipe(self, config: ExperimentConfig, plan: Plan, policy_factory) -> ActorRecipe:
        cfg = config.algo_config
        frames = dict(first_stream=0) if config.replay.frame_stack else {}  # ActorRecipe.build numbers the actors
        if plan.env_engine == "envpool" and config.env_kwargs:
            raise ConfigError("env_kwargs: plan.env_engine envpool makes its envs from the id alone; "
                              "use env_engine: gymnasium")
        return ActorRecipe(ENGINES[plan.env_engine], policy_factory,
                           dict(env_id=config.env, env_kwargs=config.env_kwargs, n_envs=plan.envs_per_actor,
                                n_actions=self.n_actions, n_step=cfg.n_step, gamma=cfg.gamma, **frames))

    def act(self, policy, obs: np.ndarray, rng, deterministic: bool, config: ExperimentConfig) -> np.ndarray:
        """Greedy actions (indices from 0) for a batch; with epsilon_final exploration if not deterministic."""
        actions = policy.greedy(obs)
        if not deterministic:
            explore = rng.random(len(actions)) < config.algo_config.exploration.final
            actions[explore] = rng.integers(self.n_actions, size=int(explore.sum()))
        return actions

    def to_env(self, actions: np.ndarray):
        return int(actions[0]) + self.action_start


class Continuous:
    """DDPG's, TD3's and SAC's family: Box actions in [-1, 1]^d scaled at the env's door, an actor
    network the actors run with the algorithm's own exploration."""

    def __init__(self, config: ExperimentConfig):
        probe = make_env(config.env, kwargs=config.env_kwargs)
        self.obs_dim, self.action_dim = box_spaces(probe, config.env, config.algo)
        self.obs_shape, self.obs_dtype, self.obs_scale, self.image = observations(probe, config)
        if config.replay.frame_stack:
            raise ConfigError(f"replay.frame_stack: the frame table feeds DQN; {config.algo} stores whole "
                              f"observations (frame_stack: 0)")
        self.action_size = self.action_dim  # what the workload counts: the action vector's size
        self.scaler = ActionScaler(probe.action_space.low, probe.action_space.high)
        self.observation_space, self.action_space = probe.observation_space, probe.action_space
        probe.close()
        self.action_field = (np.dtype(np.float32), (self.action_dim,))

    obs_field = Discrete.obs_field

    def algorithm(self, config: ExperimentConfig):
        image = dict(obs_shape=self.obs_shape, obs_scale=self.obs_scale) if self.image else {}
        return algorithm_class(config.algo)(self.obs_dim, self.action_dim, config.algo_config, config.seed, **image)

    def check_precision(self, precision: str, kernel: str, device: str, config: ExperimentConfig) -> None:
        """A reduced precision runs in the fused DDPG / TD3 / SAC learners only."""
        if precision != "fp32" and kernel != "fused":
            raise ConfigError(f"runtime.learner_precision: {precision} products run in the fused cpu learner; "
                              f"this run's learner is {kernel} on {device} (expected learner_kernel fused or "
                              f"auto on the cpu, or learner_precision fp32)")

    def torch_threads(self, kernel: str, device: str, threads: int) -> int:
        """torch's intra-op threads for a learner on `threads` threads: all of them."""
        return threads

    def learner(self, algo, device: str, kernel: str, precision: str = "fp32", threads: int = 1):
        """`threads` unused: these learners' products are torch's, on torch.set_num_threads' threads."""
        if kernel != "fused":
            return ContinuousLearner(algo, device)
        return (FusedSACLearner if algo.name == "sac" else FusedActorCriticLearner)(algo, precision)

    def thread_setter(self, learner, device: str, threads: int):
        """What sets `learner`'s thread count while it runs (AdaptiveThreads): torch's intra-op
        threads on the cpu, where the fused and the torch learners' products run."""
        return torch.set_num_threads if kind_of(device) == "cpu" and learner.kernel in ("fused", "torch") else None

    def policy_factory(self, config: ExperimentConfig, algo, act_device: str,
                       threads: int | None = None) -> functools.partial:
        noise = algo.exploration_noise() if algo.policy_kind == "deterministic" else 0.0
        if self.image:  # the shared encoder, then the actor's MLP, with torch on the cpu
            check_image_act_device(act_device)
            network = functools.partial(TorchPolicy, functools.partial(
                encoded_policy, self.obs_shape, tuple(map(tuple, config.algo_config.conv)), self.obs_scale,
                algo.policy_sizes()), threads)
            return functools.partial(ContinuousPolicy, network, self.action_dim, algo.policy_kind, noise)
        return functools.partial(ContinuousPolicy, algo.policy_sizes(), self.action_dim, algo.policy_kind, noise)

    def actor_recipe(self, config: ExperimentConfig, plan: Plan, policy_factory) -> ActorRecipe:
        if plan.env_engine != "gymnasium":
            raise ConfigError(f"plan.env_engine: {plan.env_engine} steps DQN's discrete-action actors; "
                              f"{config.algo} runs env_engine: gymnasium")
        cfg = config.algo_config
        return ActorRecipe(ContinuousActor, policy_factory,
                           dict(env_id=config.env, env_kwargs=config.env_kwargs, n_envs=plan.envs_per_actor,
                                scaler=self.scaler, n_step=cfg.n_step, gamma=cfg.gamma))

    def act(self, policy, obs: np.ndarray, rng, deterministic: bool, config: ExperimentConfig) -> np.ndarray:
        """Actions in the env's bounds (SAC deterministic: tanh of the mean)."""
        return self.scaler.to_env(policy.mean_action(obs) if deterministic else policy.explore(obs, rng))

    def to_env(self, actions: np.ndarray):
        return actions[0]


FAMILIES = {"discrete": Discrete, "continuous": Continuous}


def env_streams(plan: Plan) -> int:
    """The envs a run's actors step, on every node of a ray plan: a frame table's streams."""
    return plan.actors * plan.envs_per_actor * (plan.ray.nodes if plan.runtime in CLUSTER_RUNTIMES else 1)


def check_image_act_device(act_device: str) -> None:
    """The numpy and device act kernels run MLPs; a CNN policy acts with torch on the cpu."""
    if act_device != "cpu":
        raise ConfigError(f"plan.devices.act: image observations act on the cpu (a torch CNN), got {act_device}")


@dataclass
class Parts:
    """What a runtime runs (pearl.contracts): the algorithm, its learner, the replay table, the
    actors' recipe, the schedule; plus the learner side's numpy policy copy (act, evaluate)."""

    config: ExperimentConfig
    plan: Plan
    family: Discrete | Continuous
    schedule: schedule.Schedule
    algo: object
    learner: object
    replay: object
    policy: object
    actor_recipe: ActorRecipe
    rng: np.random.Generator
    actor_rng_state: dict | None = None  # from a checkpoint, applied when the actor is built
    _actor: object = field(default=None, repr=False)

    @property
    def seed(self) -> int:
        return self.config.seed

    @property
    def n_step(self) -> int:
        return self.config.algo_config.n_step

    @property
    def transition_fields(self) -> dict[str, tuple[np.dtype, tuple]]:
        """dtype and shape of one transition's value per field, in the replay's add() order."""
        obs = self.family.obs_field
        scalar = (np.dtype(np.float32), ())
        if self.config.replay.frame_stack:  # a frame table's step records (pearl.runtime.actor.Actor.step)
            frame, flag = (obs[0], obs[1][1:]), (np.dtype(np.bool_), ())
            return {"streams": (np.dtype(np.int64), ()), "obs": frame, "actions": self.family.action_field,
                    "rewards": scalar, "next_obs": frame, "terminated": flag, "truncated": flag}
        return {"obs": obs, "actions": self.family.action_field, "rewards": scalar, "next_obs": obs,
                "discounts": scalar}

    @property
    def actor(self):
        """The actor of the in-process runtimes, built on first use (the processes runtime builds
        its own in each actor process from `actor_recipe`). On the cpu it shares `policy`."""
        if self._actor is None:
            on_cpu = self.plan.device_of("act") == "cpu"
            self._actor = self.actor_recipe.build(self.seed, self.policy if on_cpu else None)
            if not on_cpu:
                self._actor.policy.load(self.learner.policy_weights())
            if self.actor_rng_state is not None:  # a restored run's exploration stream goes on
                self._actor.rng.bit_generator.state = self.actor_rng_state
                self.actor_rng_state = None
        return self._actor

    @property
    def replay_restartable(self) -> bool:
        """Whether the replay table may restart apart from the run's counts (`Schedule.restarted`):
        not on a replay server or under ray, whose servers keep a ratio of their own."""
        return (self.plan.runtime not in CLUSTER_RUNTIMES
                and not backend(kind_of(self.plan.device_of("sample"))).addressed)

    def restart_schedule(self, env_steps: int, updates: int) -> None:
        """The schedule after the replay table was set apart from the counts (`Schedule.restarted`)."""
        self.schedule = self.schedule.restarted(env_steps, updates, int(self.replay.size),
                                                self.config.algo_config.learning_starts)

    def fpga_device(self):
        """The FPGA driver the replay's priority tree runs on (kernels/fpga), or None."""
        return getattr(getattr(self.replay, "tree", None), "device", None)


def learner_kernel(requested: str, learn_device: str, workload) -> str:
    """'auto' -> the learn device's first kernel for the workload (the cpu's fused one where it
    runs the workload's networks); a kernel the device lacks was refused by the placement rule."""
    if requested != "auto":
        return requested
    return backend(kind_of(learn_device)).learner_kernels(workload)[0]


def learner_precision(requested: str, learn_device: str, workload, kernel: str) -> str:
    """'auto' -> the fastest precision the learn device's backend offers the kernel for the workload
    (bf16 where it has bfloat16 units and a bf16 learner runs the workload: a shipped config can ask
    for bf16 and still run, in float32, on a CPU without them); anything else as requested."""
    if requested != "auto":
        return requested
    return backend(kind_of(learn_device)).learner_precisions(workload, kernel)[-1]


def check_memory(config: ExperimentConfig, family, features: int | None, table: bool) -> None:
    """Refuses (one line naming the field) a replay table (`table`: the run holds one in host
    memory; not one on a replay server or a GPU) or networks larger than this machine's free memory, before anything is
    allocated: numpy and torch would fail deep inside with a traceback, or the run be killed when
    its table filled. `features`: what the first fc layer takes (a CNN's flattened conv output;
    None: the observation's size)."""
    from pearl.kernels.cpu.backend import memory_available
    from pearl.replay import check_table_fits

    (obs_dtype, obs_shape), (action_dtype, action_shape) = family.obs_field, family.action_field
    if table:
        check_table_fits("replay.capacity", config.replay, obs_shape, obs_dtype, action_dtype, action_shape)
    widths = [features or int(np.prod(obs_shape)), *config.algo_config.hidden, family.action_size]
    # weights, gradients, two Adam moments and a target copy, float32, for up to three networks
    networks = 3 * 5 * 4 * sum(a * b for a, b in zip(widths, widths[1:]))
    if networks > (free := memory_available()):
        raise ConfigError(f"{config.algo}.hidden: networks of widths {widths} need about {networks / 2**30:,.0f} GiB; "
                          f"this machine has {free / 2**30:,.1f} GiB available")


def build(config: ExperimentConfig, plan: Plan | None = None) -> Parts:
    """The parts of a run of `config` under `plan` (default: the config's own placement)."""
    configured = config.runtime.device
    config, plan = reconcile(config, plan)
    check_device("runtime.device", configured, plan.platform)  # named as the user gave it
    import_modules(config.imports)
    algo_class = algorithm_class(config.algo)
    family = FAMILIES[algo_class.family](config)
    obs_dtype, obs_shape = family.obs_field
    workload = workload_of(config, family.obs_dim, family.action_size, obs_shape, obs_dtype.itemsize)
    check_placement(plan.devices, workload, plan.learner_kernel, plan.platform)
    served = backend(kind_of(plan.device_of("sample")))  # a table on a replay server: its client, below
    check_memory(config, family, int(np.prod(conv_shapes(obs_shape, config.algo_config.conv)[-1]))
                 if len(obs_shape) > 1 else None, table=not (served.addressed or served.table_on_device))
    kernel = learner_kernel(plan.learner_kernel, plan.device_of("learn"), workload)
    plan = dataclasses.replace(plan, learner_precision=learner_precision(plan.learner_precision, plan.device_of("learn"),
                                                                         workload, kernel))
    family.check_precision(plan.learner_precision, kernel, plan.device_of("learn"), config)
    if plan.learner_precision == "bf16" and kind_of(plan.device_of("learn")) == "cpu" and not bf16_products():
        warnings.warn("runtime.learner_precision: bf16 on a CPU without bfloat16 units (AMX or AVX-512 BF16) "
                      "runs emulated, slower than fp32 (auto picks fp32 here)")

    torch.set_num_threads(family.torch_threads(kernel, plan.device_of("learn"), config.runtime.torch_threads))
    algo = family.algorithm(config)
    learner = family.learner(algo, plan.device_of("learn"), kernel, plan.learner_precision,
                             config.runtime.torch_threads)
    setter = family.thread_setter(learner, plan.device_of("learn"), config.runtime.torch_threads)
    if config.runtime.adapt_threads and config.runtime.torch_threads > 1 and setter is not None:
        learner = AdaptiveThreads(learner, config.runtime.torch_threads, setter)
    # an actor process's torch (a CNN policy) on one thread: the cores are the actors' and the learner's
    policy_factory = family.policy_factory(config, algo, plan.device_of("act"), threads=1)
    policy = family.policy_factory(config, algo, "cpu")()
    policy.load(learner.policy_weights())
    cfg = config.algo_config
    # the learner's own actor, stepping while actor processes or node agents start, keeps its last
    # n_step - 1 steps per env when it hands over (a fork's actor can take over before
    # learning_starts): one more actor's pending steps
    actors = plan.actors + (plan.act_while_actors_start and plan.runtime in ("processes", "ray"))
    limit = schedule.rate_limit(plan.runtime, plan.batch_size, cfg.updates_per_step, cfg.learning_starts,
                                cfg.n_step, plan.envs_per_actor, actors, burst=cfg.gradient_steps or 1)
    action_dtype, action_shape = family.action_field
    if config.replay.frame_stack and plan.runtime in CLUSTER_RUNTIMES and plan.ray.shards > env_streams(plan):
        raise ConfigError(f"plan.ray.shards: {plan.ray.shards} shards for a frame table of {env_streams(plan)} env "
                          f"streams (each shard holds whole streams: at most nodes x actors x envs_per_actor shards)")
    replay = None if served.addressed else make_replay(
                         config.replay, obs_shape if len(obs_shape) > 1 else family.obs_dim,
                         obs_dtype=obs_dtype,
                         action_dtype=action_dtype, action_shape=action_shape,
                         total_steps=config.total_steps, rate_limiter=RateLimiter(**dataclasses.asdict(limit)),
                         device=replay_device(plan.devices, plan.platform),
                         # the frame table (replay.frame_stack) keeps one stream per env and makes the n-step transitions
                         streams=env_streams(plan), n_step=cfg.n_step, gamma=cfg.gamma)
    run_schedule = schedule.Schedule(cfg.learning_starts, cfg.updates_per_step, plan.batch_size,
                                     plan.sync_interval, getattr(cfg, "target_update_interval", None),
                                     cfg.train_freq, cfg.gradient_steps or 1)
    # what an actor process imports before it makes the env: the config's modules, and the one
    # that registered the env id with a class (Gymnasium imports 'module:...' strings itself)
    modules = tuple(dict.fromkeys([*config.imports, *filter(None, [env_module(config.env)])]))
    recipe = dataclasses.replace(family.actor_recipe(config, plan, policy_factory), modules=modules,
                                 env_factory=env_factory(config.env))
    parts = Parts(config, plan, family, run_schedule, algo, learner, replay, policy, recipe,
                  np.random.default_rng(config.seed))
    if replay is None:
        parts.replay = served.replay_table(parse_device(plan.device_of("sample")), config.replay,
                                           parts.transition_fields, plan.server,
                                           frames=dict(streams=env_streams(plan), n_step=cfg.n_step, gamma=cfg.gamma))
    return parts
