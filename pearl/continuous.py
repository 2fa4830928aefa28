"""Agents for continuous actions: `pearl.DDPG`, `pearl.TD3`, `pearl.SAC` (Gymnasium Box actions).

They share everything but the algorithm with the DQN agent (pearl/api.py: train, evaluate, save,
`pearl.load`, run directories, the sequential runtime); what differs is here: Box spaces, the
actor's numpy policy with exploration noise, actions scaled to the env's bounds, the torch learner.

>>> agent = pearl.TD3(env="Pendulum-v1", seed=1, total_steps=20_000)
>>> agent.train(progress=True)
>>> agent.evaluate(10)["mean"]
"""
from __future__ import annotations

import functools

import numpy as np
import torch

from pearl.algos.ddpg import DDPG as DDPGAlgorithm
from pearl.algos.sac import SAC as SACAlgorithm
from pearl.algos.td3 import TD3 as TD3Algorithm
from pearl.api import Agent, resolve_config
from pearl.config import ExperimentConfig
from pearl.envs import box_spaces, make_env
from pearl.errors import ConfigError
from pearl.plan import Plan, reconcile
from pearl.replay import make_replay
from pearl.runtime.continuous import ActionScaler, ContinuousActor, ContinuousLearner, ContinuousPolicy
from pearl.runtime.fused_actor_critic import FusedActorCriticLearner
from pearl.runtime.processes import ActorRecipe


class ContinuousAgent(Agent):
    """An off-policy actor-critic agent on a Box action space; subclasses name the algorithm."""

    algo_name = ""
    algorithm_class: type = DDPGAlgorithm

    def __init__(self, env: str | None = None, *, config: ExperimentConfig | None = None,
                 plan: Plan | None = None, **options):
        self.config = config = resolve_config(self.algo_name, env, config, options, "Pendulum-v1")
        cfg = config.algo_config
        probe = make_env(config.env)
        self.obs_dim, self.action_dim = box_spaces(probe, config.env, self.algo_name)
        self.scaler = ActionScaler(probe.action_space.low, probe.action_space.high)
        probe.close()
        replay_device, learn_device = self._set_plan(plan)
        config, cfg = self.config, self.config.algo_config

        torch.set_num_threads(config.runtime.torch_threads)
        self.algo = self.algorithm_class(self.obs_dim, self.action_dim, cfg, config.seed)
        self.learner = self._make_learner(learn_device, self.plan.learner_kernel)
        self.policy = self._policy_factory()()
        self.policy.load(self.learner.policy_weights())
        action_dtype, action_shape = self.action_field
        self.replay = make_replay(config.replay, self.obs_dim, action_dtype=action_dtype,
                                  action_shape=action_shape, total_steps=config.total_steps,
                                  rate_limiter=self._rate_limiter(), device=replay_device)
        self._start_counters()

    def _make_learner(self, device: str, kernel: str):
        """'auto': the fused CPU kernel where one exists (DDPG, TD3 on the cpu), else autograd."""
        fused_ok = device == "cpu" and self.algo_name in ("ddpg", "td3")
        if kernel == "fused" and not fused_ok:
            why = f"device {device}" if self.algo_name != "sac" else "sac"
            raise ConfigError(f"runtime.learner_kernel: the fused kernel runs DDPG and TD3 on the cpu, "
                              f"not {why}; use 'torch' or 'auto'")
        if kernel == "fused" or (kernel == "auto" and fused_ok):
            return FusedActorCriticLearner(self.algo)
        return ContinuousLearner(self.algo, device)

    def _policy_factory(self) -> functools.partial:
        """Builds the actor's numpy policy (picklable: actor processes build theirs with it)."""
        kind = "squashed_gaussian" if isinstance(self.algo, SACAlgorithm) else "deterministic"
        noise = 0.0 if kind == "squashed_gaussian" else self.algo.exploration_noise()
        return functools.partial(ContinuousPolicy, self.algo.policy_sizes(), self.action_dim, kind, noise)

    # -- parts the runtime drives --------------------------------------------------------------
    @property
    def action_field(self) -> tuple[np.dtype, tuple]:
        return np.dtype(np.float32), (self.action_dim,)

    def actor_recipe(self) -> ActorRecipe:
        cfg = self.config
        return ActorRecipe(ContinuousActor, self._policy_factory(),
                           dict(env_id=cfg.env, n_envs=self.plan.envs_per_actor, scaler=self.scaler,
                                n_step=cfg.algo_config.n_step, gamma=cfg.algo_config.gamma))

    def _greedy_actor(self, env):
        """obs -> the env's action for the deterministic policy (SAC: tanh of the mean), on a copy
        of the current weights."""
        policy = self._policy_factory()()
        policy.load(self.learner.policy_weights())
        return lambda obs: self.scaler.to_env(policy.mean_action(obs[None])[0])

    # -- the user's verbs ----------------------------------------------------------------------
    def act(self, obs, deterministic: bool = True) -> np.ndarray:
        """The action, in the env's bounds, for one observation (d values) or a batch (n x d);
        with the policy's exploration noise if not deterministic."""
        obs = np.asarray(obs, dtype=np.float32)
        batch = obs.reshape(-1, self.obs_dim)
        self.policy.load(self.learner.policy_weights())
        actions = self.policy.mean_action(batch) if deterministic else self.policy.explore(batch, self.rng)
        actions = self.scaler.to_env(actions)
        return actions[0] if obs.ndim == 1 else actions


class DDPG(ContinuousAgent):
    """DDPG (pearl/algos/ddpg.py); defaults are Stable-Baselines3's: 400x300 actor and critic,
    batch 256, 1 update per env step, tau 0.005, lr 1e-3, Gaussian action noise 0.1."""

    algo_name = "ddpg"
    algorithm_class = DDPGAlgorithm


class TD3(ContinuousAgent):
    """TD3 (pearl/algos/td3.py): DDPG's defaults plus policy delay 2 and target smoothing 0.2 / 0.5."""

    algo_name = "td3"
    algorithm_class = TD3Algorithm


class SAC(ContinuousAgent):
    """SAC (pearl/algos/sac.py); defaults are Stable-Baselines3's: 256x256, lr 3e-4, batch 256,
    1 update per env step, automatic entropy coefficient starting at 1."""

    algo_name = "sac"
    algorithm_class = SACAlgorithm
