"""Runtime pieces for continuous actions (DDPG, TD3, SAC): the actor's numpy policy, the actor, the
learner.

Algorithms act in [-1, 1]^d; `ActionScaler` maps to an env's Box bounds and back at the env's door
(what the replay stores is the [-1, 1] action, as in Stable-Baselines3).
"""
from __future__ import annotations

import numpy as np
import torch

from pearl.contracts import Learner, implements
from pearl.algos.dqn import DQN
from pearl.algos.sac import LOG_STD_MAX, LOG_STD_MIN
from pearl.kernels.cpu import MLPLayout, QPolicy
from pearl.replay import NStepBuffer
from pearl.runtime.actor import Actor
from pearl.runtime.learners import load_optimizer_state, optimizer_state

flat_weights, load_flat_weights = DQN.flat_weights, DQN.load_flat_weights  # one flat layout for all



class ActionScaler:
    """[-1, 1]^d <-> the Box [low, high]."""

    def __init__(self, low, high):
        self.low = np.asarray(low, dtype=np.float32)
        self.high = np.asarray(high, dtype=np.float32)
        self.half_range = (self.high - self.low) / 2

    def to_env(self, actions: np.ndarray) -> np.ndarray:
        return self.low + (actions + 1.0) * self.half_range

    def from_env(self, actions: np.ndarray) -> np.ndarray:
        return (np.asarray(actions, dtype=np.float32) - self.low) / self.half_range - 1.0


class ContinuousPolicy:
    """The actor's numpy copy of the policy network (a plain MLP, kernels/cpu/mlp.py), in [-1, 1]^d.

    kind 'deterministic' (DDPG, TD3): tanh(MLP(s)), explored with Gaussian noise of std `noise`.
    kind 'squashed_gaussian' (SAC): MLP(s) = (mean, log_std); explores with tanh(mean + std * N(0, 1)).
    """

    def __init__(self, sizes, action_dim: int, kind: str, noise: float = 0.0):
        """`sizes`: the MLP's widths, or a factory of another network with QPolicy's `load` and
        `q_values` (pearl.nets.TorchPolicy: image observations)."""
        self.net = sizes() if callable(sizes) else QPolicy(MLPLayout(sizes))
        self.action_dim, self.kind, self.noise = action_dim, kind, noise

    def load(self, flat: np.ndarray) -> None:
        self.net.load(flat)

    def mean_action(self, obs: np.ndarray) -> np.ndarray:
        out = self.net.q_values(obs)
        return np.tanh(out if self.kind == "deterministic" else out[:, :self.action_dim])

    def explore(self, obs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        out = self.net.q_values(obs)
        d = self.action_dim
        if self.kind == "deterministic":
            actions = np.tanh(out)
            if self.noise:
                actions += self.noise * rng.standard_normal(actions.shape, dtype=np.float32)
                np.clip(actions, -1.0, 1.0, out=actions)
            return actions
        std = np.exp(np.clip(out[:, d:], LOG_STD_MIN, LOG_STD_MAX))
        return np.tanh(out[:, :d] + std * rng.standard_normal(std.shape, dtype=np.float32))


class ContinuousActor(Actor):
    """The discrete Actor's env stepping and n-step bookkeeping, with Box actions."""

    def __init__(self, env_id: str, n_envs: int, seed: int, policy: ContinuousPolicy,
                 scaler: ActionScaler, n_step: int, gamma: float, env_kwargs: dict | None = None):
        super().__init__(env_id, n_envs, seed, policy, policy.action_dim, n_step, gamma, env_kwargs=env_kwargs)
        self.scaler = scaler
        # A subarray dtype makes each of NStepBuffer's action slots a float32 vector of the
        # action's size (its own arrays are (n, n_envs) of scalars).
        obs_shape = self.obs.shape[1:]
        self.nstep = NStepBuffer(n_step, gamma, n_envs, obs_shape if len(obs_shape) > 1 else obs_shape[0],
                                 action_dtype=np.dtype((np.float32, (policy.action_dim,))), obs_dtype=self.obs.dtype)

    def choose(self, epsilon: float) -> np.ndarray:
        """Actions in [-1, 1]^d: uniformly random with probability `epsilon` (the warm-up), else the
        policy's exploring action."""
        n = self.n_envs
        if epsilon >= 1.0:
            return self.rng.uniform(-1.0, 1.0, (n, self.n_actions)).astype(np.float32)
        actions = self.policy.explore(self.obs, self.rng)
        if epsilon > 0.0:
            explore = self.rng.random(n) < epsilon
            actions[explore] = self.rng.uniform(-1.0, 1.0, (int(explore.sum()), self.n_actions))
        return actions

    def env_actions(self, actions: np.ndarray):
        return self.scaler.to_env(actions)


@implements(Learner)
class ContinuousLearner:
    """Runs a DDPG / TD3 / SAC algorithm's PyTorch update on the Plan's learn device.

    State travels as flat float32 vectors per network and per optimizer (the checkpoint layout
    every learner shares), plus the algorithm's update count (TD3's policy delay reads it).
    """

    kernel = "torch"

    def __init__(self, algo, device: str):
        self.algo = algo
        self.device = torch.device(device)
        for network in algo.networks().values():
            network.to(self.device)
        self._policy = np.zeros(algo.n_params(), dtype=np.float32)
        self._policy_stale = True

    def _tensor(self, array: np.ndarray) -> torch.Tensor:
        tensor = torch.from_numpy(array)
        if self.device.type == "cuda":
            tensor = tensor.pin_memory().to(self.device, non_blocking=True)
        return tensor

    def update(self, batch):
        """One update of the algorithm. Returns (critic loss, None): no priorities to update."""
        loss = self.algo.update(self._tensor(batch.obs), self._tensor(batch.actions),
                                self._tensor(batch.rewards), self._tensor(batch.next_obs),
                                self._tensor(batch.discounts))
        self._policy_stale = True
        return loss, None

    def update_target(self) -> None:
        """Nothing is owed at an interval: the targets move inside `update` (Polyak steps; TD3's
        every policy_delay-th update)."""

    def policy_weights(self) -> np.ndarray:
        if self._policy_stale:
            self._policy[:] = flat_weights(self.algo.policy_network())
            self._policy_stale = False
        return self._policy

    def sync_to_algo(self) -> None:
        """The algorithm's networks are the learner's own: nothing to copy."""

    def state_dict(self) -> dict:
        state = {name: flat_weights(net) for name, net in self.algo.networks().items()}
        state["optimizers"] = {name: optimizer_state(opt) for name, opt in self.algo.optimizers().items()}
        state["updates"] = self.algo.updates
        return state

    def load_state_dict(self, state: dict) -> None:
        for name, net in self.algo.networks().items():
            load_flat_weights(net, state[name])
        for name, opt in self.algo.optimizers().items():
            load_optimizer_state(opt, state["optimizers"][name])
        self.algo.updates = int(state["updates"])
        self._policy_stale = True
