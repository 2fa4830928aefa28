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
from dataclasses import dataclass, field

import numpy as np
import torch

from pearl.algos import algorithm_class
from pearl.config import ExperimentConfig
from pearl.envs import box_spaces, discrete_spaces, env_factory, env_module, import_modules, make_env
from pearl.errors import ConfigError
from pearl.estimator.workload import workload_of
from pearl.kernels.cpu import MLPLayout
from pearl.kernels.registry import backend, kind_of
from pearl.plan import Plan, reconcile
from pearl.placement import check_device, check_placement, replay_device
from pearl.replay import RateLimiter, make_replay
from pearl.runtime.actor import Actor, device_policy
from pearl.runtime.continuous import ActionScaler, ContinuousActor, ContinuousLearner, ContinuousPolicy
from pearl.runtime.fused_actor_critic import FusedActorCriticLearner
from pearl.runtime.learners import FusedCPULearner, TorchLearner
from pearl.runtime.processes import ActorRecipe
from pearl import schedule


class Discrete:
    """DQN's family: discrete actions, a Q-network the actors run epsilon-greedily."""

    action_field = (np.dtype(np.int64), ())

    def __init__(self, config: ExperimentConfig):
        probe = make_env(config.env)
        self.obs_dim, self.n_actions = discrete_spaces(probe, config.env)
        self.action_size = self.n_actions  # what the workload counts: the number of actions
        self.action_start = int(getattr(probe.action_space, "start", 0))
        probe.close()

    def algorithm(self, config: ExperimentConfig):
        return algorithm_class(config.algo)(self.obs_dim, self.n_actions, config.algo_config,
                                            config.total_steps, config.seed)

    def learner(self, algo, device: str, kernel: str):
        return FusedCPULearner(algo) if kernel == "fused" else TorchLearner(algo, device)

    def policy_factory(self, config: ExperimentConfig, algo, act_device: str) -> functools.partial:
        hidden = config.algo_config.hidden
        layout = (MLPLayout([self.obs_dim, *hidden], dueling_actions=self.n_actions) if config.algo_config.dueling
                  else MLPLayout([self.obs_dim, *hidden, self.n_actions]))
        return functools.partial(device_policy, layout, act_device)

    def actor_recipe(self, config: ExperimentConfig, plan: Plan, policy_factory) -> ActorRecipe:
        cfg = config.algo_config
        return ActorRecipe(Actor, policy_factory, dict(env_id=config.env, n_envs=plan.envs_per_actor,
                                                       n_actions=self.n_actions, n_step=cfg.n_step, gamma=cfg.gamma))

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
        probe = make_env(config.env)
        self.obs_dim, self.action_dim = box_spaces(probe, config.env, config.algo)
        self.action_size = self.action_dim  # what the workload counts: the action vector's size
        self.scaler = ActionScaler(probe.action_space.low, probe.action_space.high)
        probe.close()
        self.action_field = (np.dtype(np.float32), (self.action_dim,))

    def algorithm(self, config: ExperimentConfig):
        return algorithm_class(config.algo)(self.obs_dim, self.action_dim, config.algo_config, config.seed)

    def learner(self, algo, device: str, kernel: str):
        return FusedActorCriticLearner(algo) if kernel == "fused" else ContinuousLearner(algo, device)

    def policy_factory(self, config: ExperimentConfig, algo, act_device: str) -> functools.partial:
        noise = algo.exploration_noise() if algo.policy_kind == "deterministic" else 0.0
        return functools.partial(ContinuousPolicy, algo.policy_sizes(), self.action_dim, algo.policy_kind, noise)

    def actor_recipe(self, config: ExperimentConfig, plan: Plan, policy_factory) -> ActorRecipe:
        cfg = config.algo_config
        return ActorRecipe(ContinuousActor, policy_factory,
                           dict(env_id=config.env, n_envs=plan.envs_per_actor, scaler=self.scaler,
                                n_step=cfg.n_step, gamma=cfg.gamma))

    def act(self, policy, obs: np.ndarray, rng, deterministic: bool, config: ExperimentConfig) -> np.ndarray:
        """Actions in the env's bounds (SAC deterministic: tanh of the mean)."""
        return self.scaler.to_env(policy.mean_action(obs) if deterministic else policy.explore(obs, rng))

    def to_env(self, actions: np.ndarray):
        return actions[0]


FAMILIES = {"discrete": Discrete, "continuous": Continuous}


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
        obs = (np.dtype(np.float32), (self.family.obs_dim,))
        scalar = (np.dtype(np.float32), ())
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

    def fpga_device(self):
        """The FPGA driver the replay's priority tree runs on (kernels/fpga), or None."""
        return getattr(getattr(self.replay, "tree", None), "device", None)


def learner_kernel(requested: str, learn_device: str, workload) -> str:
    """'auto' -> the learn device's first kernel for the workload (the cpu's fused one where it
    runs the workload's networks); a kernel the device lacks was refused by the placement rule."""
    if requested != "auto":
        return requested
    return backend(kind_of(learn_device)).learner_kernels(workload)[0]


def check_memory(config: ExperimentConfig, obs_dim: int, action_dim: int) -> None:
    """Refuses (one line naming the field) a replay table or networks larger than this machine's
    memory, before anything is allocated: numpy and torch would fail deep inside with a traceback."""
    import os

    memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    # a transition: obs and next_obs (float32), the action, reward and discount, the sum-tree leaves
    replay = config.replay.capacity * (8 * obs_dim + 8 * action_dim + 8 + 16)
    widths = [obs_dim, *config.algo_config.hidden, action_dim]
    # weights, gradients, two Adam moments and a target copy, float32, for up to three networks
    networks = 3 * 5 * 4 * sum(a * b for a, b in zip(widths, widths[1:]))
    for field, size in (("replay.capacity", replay), (f"{config.algo}.hidden", networks)):
        if size > memory:
            raise ConfigError(f"{field}: needs about {size / 2**30:,.0f} GiB; this machine has "
                              f"{memory / 2**30:,.0f} GiB of memory")


def build(config: ExperimentConfig, plan: Plan | None = None) -> Parts:
    """The parts of a run of `config` under `plan` (default: the config's own placement)."""
    configured = config.runtime.device
    config, plan = reconcile(config, plan)
    check_device("runtime.device", configured, plan.platform)  # named as the user gave it
    import_modules(config.imports)
    algo_class = algorithm_class(config.algo)
    family = FAMILIES[algo_class.family](config)
    check_memory(config, family.obs_dim, family.action_size)
    workload = workload_of(config, family.obs_dim, family.action_size)
    check_placement(plan.devices, workload, plan.learner_kernel, plan.platform)
    kernel = learner_kernel(plan.learner_kernel, plan.device_of("learn"), workload)

    torch.set_num_threads(config.runtime.torch_threads)
    algo = family.algorithm(config)
    learner = family.learner(algo, plan.device_of("learn"), kernel)
    policy_factory = family.policy_factory(config, algo, plan.device_of("act"))
    policy = family.policy_factory(config, algo, "cpu")()
    policy.load(learner.policy_weights())
    cfg = config.algo_config
    limit = schedule.rate_limit(plan.runtime, plan.batch_size, cfg.updates_per_step, cfg.learning_starts,
                                cfg.n_step, plan.envs_per_actor, plan.actors, burst=cfg.gradient_steps or 1)
    action_dtype, action_shape = family.action_field
    replay = make_replay(config.replay, family.obs_dim, action_dtype=action_dtype, action_shape=action_shape,
                         total_steps=config.total_steps, rate_limiter=RateLimiter(**dataclasses.asdict(limit)),
                         device=replay_device(plan.devices, plan.platform))
    run_schedule = schedule.Schedule(cfg.learning_starts, cfg.updates_per_step, plan.batch_size,
                                     plan.sync_interval, getattr(cfg, "target_update_interval", None),
                                     cfg.train_freq, cfg.gradient_steps or 1)
    # what an actor process imports before it makes the env: the config's modules, and the one
    # that registered the env id with a class (Gymnasium imports 'module:...' strings itself)
    modules = tuple(dict.fromkeys([*config.imports, *filter(None, [env_module(config.env)])]))
    recipe = dataclasses.replace(family.actor_recipe(config, plan, policy_factory), modules=modules,
                                 env_factory=env_factory(config.env))
    return Parts(config, plan, family, run_schedule, algo, learner, replay, policy, recipe,
                 np.random.default_rng(config.seed))
