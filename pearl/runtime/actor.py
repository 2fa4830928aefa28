"""An actor: a vector of environments stepped together with one batched policy inference.

The actor owns its own copy of the policy weights (a `QPolicy`), which the runtime refreshes at
each `sync_weights`; it never touches the learner.
"""
from __future__ import annotations

import numpy as np

from pearl.contracts import Actor as ActorContract, implements
from pearl.envs import SCORE, make_env, observation_layout
from pearl.kernels.cpu import QPolicy
from pearl.replay import NStepBuffer


def device_policy(layout, device: str):
    """The actor's Q-network on `device` (a plan's `act` device): the backend's act kernel with
    QPolicy's interface (opencl:N: batched inference in one launch per layer). Module-level, so
    an actor process's recipe can carry it pickled."""
    from pearl.kernels.registry import backend, parse_device

    where = parse_device(device, "plan.devices.act")
    return backend(where.kind).policy(where, layout)


@implements(ActorContract)
class Actor:
    def __init__(self, env_id: str, n_envs: int, seed: int, policy: QPolicy, n_actions: int,
                 n_step: int, gamma: float, first_stream: int | None = None):
        """`first_stream`: this actor writes to a frame table (replay.frame_stack, pearl/replay/frames.py)
        as env streams first_stream, first_stream + 1, ...: each step goes out as it happened, newest
        frames only, and the table makes the n-step transitions; None: n-step transitions here."""
        self.envs = [make_env(env_id, seed + i) for i in range(n_envs)]
        self.policy, self.n_actions, self.gamma = policy, n_actions, gamma
        self.action_start = int(getattr(self.envs[0].action_space, "start", 0))
        self.rng = np.random.default_rng(seed)
        obs_shape, obs_dtype, _ = observation_layout(self.envs[0], env_id, "dqn")  # uint8 frames stay uint8
        self.obs = np.stack([env.reset(seed=seed + i)[0] for i, env in enumerate(self.envs)]).astype(obs_dtype)
        self._next_obs = np.empty_like(self.obs)
        self._spare_obs = np.empty_like(self.obs)
        self._rewards = np.empty(n_envs, dtype=np.float32)
        self._terminated = np.zeros(n_envs, dtype=bool)
        self._truncated = np.zeros(n_envs, dtype=bool)
        self.episode_return = np.zeros(n_envs)
        self.episode_length = np.zeros(n_envs, dtype=np.int64)
        self.nstep = NStepBuffer(n_step, gamma, n_envs, obs_shape if len(obs_shape) > 1 else obs_shape[0],
                                 obs_dtype=obs_dtype)
        self.streams = None if first_stream is None else np.arange(first_stream, first_stream + n_envs)

    def choose(self, epsilon: float) -> np.ndarray:
        n = len(self.envs)
        # One uniform draw per env decides exploration, a second picks the random action:
        # Generator.integers costs several microseconds a call, a scaled uniform well under one.
        draws = self.rng.random(2 * n)
        explore = draws[:n] < epsilon
        n_explore = np.count_nonzero(explore)
        if n_explore == n:
            return (draws[n:] * self.n_actions).astype(np.int64)
        actions = self.policy.greedy(self.obs)
        if n_explore:
            actions[explore] = (draws[n:][explore] * self.n_actions).astype(np.int64)
        return actions

    def env_actions(self, actions: np.ndarray) -> list:
        """What each env's `step` receives for the chosen actions (Discrete spaces may start at n)."""
        return [int(a) + self.action_start for a in actions]

    def step(self, epsilon: float):
        """Steps every env once. Returns (transition arrays, [(episode return, length), ...]).

        Transitions are (obs, actions, n-step returns, next_obs, discounts), or None while every
        env is still gathering its first n steps; for a frame table, every step's (streams, newest
        frame of obs, actions, rewards, newest frame of next_obs, terminated, truncated).
        """
        actions = self.choose(epsilon)
        env_actions = self.env_actions(actions)
        next_obs, rewards = self._next_obs, self._rewards
        terminated, truncated = self._terminated, self._truncated
        finished = []
        for i, env in enumerate(self.envs):
            obs, reward, term, trunc, info = env.step(env_actions[i])
            next_obs[i] = obs
            rewards[i], terminated[i], truncated[i] = reward, term, trunc
            self.episode_return[i] += info.get(SCORE, reward)  # the game's score where rewards are clipped
            self.episode_length[i] += 1
            if term or trunc:
                finished.append((float(self.episode_return[i]), int(self.episode_length[i])))
                self.episode_return[i] = 0.0
                self.episode_length[i] = 0
        if self.streams is None:
            transitions = self.nstep.step(self.obs, actions, rewards, next_obs, terminated, truncated)
        else:  # a frame table's step records: the stacks' newest frames (views)
            transitions = (self.streams, self.obs[:, -1], actions, rewards, next_obs[:, -1], terminated, truncated)
        # The next observations become the current ones, except where an episode ended and its
        # env restarts. Buffers rotate rather than being copied; none that the returned
        # transitions reference is written before the next step.
        if finished:
            restarted = self._spare_obs
            restarted[:] = next_obs
            for i in np.flatnonzero(terminated | truncated):
                restarted[i] = self.envs[i].reset()[0]
            self._spare_obs, self.obs = self.obs, restarted
        else:
            self.obs, self._next_obs = next_obs, self.obs
        return transitions, finished

    def close(self) -> None:
        for env in self.envs:
            env.close()
