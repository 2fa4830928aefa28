"""Turns one environment's stream of steps into n-step transitions.

A transition from step t carries R = r_t + g r_{t+1} + ... + g^{k-1} r_{t+k-1}, the observation
k steps later and discount g^k, with k = n, or fewer when the episode ends first. On termination
the discount is 0 (nothing to bootstrap); on truncation (time limit) it stays g^k and the learner
bootstraps from the last observation, as the time limit is not part of the task.
"""
from __future__ import annotations

from collections import deque

import numpy as np


class NStepAccumulator:
    """One env's n-step transitions, step by step: the readable reference for `NStepBuffer`."""

    def __init__(self, n: int, gamma: float):
        self.n, self.gamma = n, gamma
        self.pending: deque = deque()  # (obs, action, reward) not yet emitted

    def step(self, obs, action, reward: float, next_obs, terminated: bool, truncated: bool) -> list:
        """Feeds one step; returns the transitions (obs, action, R, next_obs, discount) now complete."""
        self.pending.append((obs, action, reward))
        out = []
        if terminated or truncated:
            while self.pending:
                out.append(self._emit(next_obs, 0.0 if terminated else None))
        elif len(self.pending) == self.n:
            out.append(self._emit(next_obs, None))
        return out

    def _emit(self, next_obs, discount_override):
        ret, scale = 0.0, 1.0
        for _, _, reward in self.pending:
            ret += scale * reward
            scale *= self.gamma
        obs, action, _ = self.pending.popleft()
        discount = scale if discount_override is None else discount_override
        return obs, action, ret, next_obs, discount


class NStepBuffer:
    """The vectorised form of `NStepAccumulator` for an actor's `n_envs` lockstepped envs.

    The last n steps of every env sit in ring arrays indexed by the global step count; each step
    emits, for every env with n pending steps, one transition whose return is a dot product with
    (1, g, ..., g^{n-1}). Envs whose episode ended flush their pending steps (a short loop that runs
    once per episode). Each step emits exactly what one `NStepAccumulator` per env would, in env
    order.
    """

    def __init__(self, n: int, gamma: float, n_envs: int, obs_dim: int | tuple, action_dtype=np.int64,
                 obs_dtype=np.float32):
        self.n, self.gamma = n, gamma
        obs_shape = (obs_dim,) if np.ndim(obs_dim) == 0 else tuple(obs_dim)  # a vector or an image
        self.obs = np.zeros((n, n_envs, *obs_shape), dtype=obs_dtype)
        self.actions = np.zeros((n, n_envs), dtype=action_dtype)
        self.rewards = np.zeros((n, n_envs), dtype=np.float64)
        self.pending = np.zeros(n_envs, dtype=np.int64)
        self.powers = gamma ** np.arange(n)
        self.discounts_n = np.full(n_envs, gamma ** n, dtype=np.float32)
        self._ended = np.zeros(n_envs, dtype=np.float32)  # n = 1, one env: its terminal discount
        self.orders = [(oldest + np.arange(n)) % n for oldest in range(n)]  # ring slots, oldest first
        self.t = 0  # steps taken; step t is stored in slot t % n

    def step(self, obs, actions, rewards, next_obs, terminated, truncated):
        """Feeds one step of every env; returns (obs, actions, R, next_obs, discounts) or None.

        The arrays may be views of this buffer's rings, valid until the next `step`.
        """
        if self.n == 1:  # nothing to hold back: each step is its own transition
            if len(terminated) == 1:  # one env: one of two constant rows (an actor's hot path)
                discounts = self._ended if terminated[0] else self.discounts_n
            else:
                discounts = np.where(terminated, np.float32(0.0), np.float32(self.gamma))
            rewards = rewards if rewards.dtype == np.float32 else rewards.astype(np.float32)
            return obs, actions, rewards, next_obs, discounts
        n, slot = self.n, self.t % self.n
        self.obs[slot], self.actions[slot], self.rewards[slot] = obs, actions, rewards
        self.t += 1
        self.pending += 1
        ended = terminated | truncated
        full = (self.pending == n) & ~ended
        oldest = self.t % n  # slot of step t - n + 1
        if full.all():  # the steady state: every env emits one transition, nothing to flush
            self.pending[:] = n - 1
            returns = (self.powers @ self.rewards[self.orders[oldest]]).astype(np.float32)
            return self.obs[oldest], self.actions[oldest], returns, next_obs, self.discounts_n
        parts, owners = [], []
        if full.any():
            returns = self.powers @ self.rewards[self.orders[oldest]][:, full]
            parts.append((self.obs[oldest, full], self.actions[oldest, full], returns,
                          next_obs[full], np.full(returns.shape, self.gamma ** n)))
            owners.append(np.flatnonzero(full))
            self.pending[full] = n - 1
        for env in np.flatnonzero(ended):
            parts.append(self._flush(env, next_obs[env], bool(terminated[env])))
            owners.append(np.full(len(parts[-1][2]), env))
        if not parts:
            return None
        out = [np.concatenate(x) for x in zip(*parts)]
        if len(parts) > 1:  # back into env order (stable: an env's own transitions stay in time order)
            by_env = np.argsort(np.concatenate(owners), kind="stable")
            out = [x[by_env] for x in out]
        obs_out, act_out, ret_out, next_out, disc_out = out
        return (obs_out, act_out, ret_out.astype(np.float32), next_out, disc_out.astype(np.float32))

    def _flush(self, env: int, final_obs, terminated: bool):
        count, n = int(self.pending[env]), self.n
        slots = (self.t - count + np.arange(count)) % n  # pending steps, oldest first
        rewards = self.rewards[slots, env]
        returns = np.array([self.powers[:count - j] @ rewards[j:] for j in range(count)])
        discounts = np.zeros(count) if terminated else self.gamma ** (count - np.arange(count))
        self.pending[env] = 0
        return (self.obs[slots, env], self.actions[slots, env], returns,
                np.repeat(final_obs[None], count, axis=0), discounts)
