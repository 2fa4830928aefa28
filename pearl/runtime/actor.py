"""An actor: a vector of environments stepped together with one batched policy inference.

The actor owns its own copy of the policy weights (a `QPolicy`), which the runtime refreshes at
each `sync_weights`; it never touches the learner.
"""
from __future__ import annotations

import numpy as np

from pearl.contracts import Actor as ActorContract, implements
from pearl.envs import SCORE, env_stepper, make_env, observation_layout
from pearl.errors import ConfigError
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
    """Gymnasium envs (real `gymnasium.Env`s from pearl.envs.make_env), stepped in a plain loop
    (plan.env_engine: gymnasium; its `EnvPoolActor` subclass steps an EnvPool instead)."""

    engine = "gymnasium"

    def __init__(self, env_id: str, n_envs: int, seed: int, policy: QPolicy, n_actions: int,
                 n_step: int, gamma: float, first_stream: int | None = None, env_kwargs: dict | None = None):
        """`first_stream`: this actor writes to a frame table (replay.frame_stack, pearl/replay/frames.py)
        as env streams first_stream, first_stream + 1, ...: each step goes out as it happened, newest
        frames only, and the table makes the n-step transitions; None: n-step transitions here.
        `env_kwargs`: the config's, each env made with them."""
        self.env_id, self.n_envs, self.env_kwargs = env_id, n_envs, env_kwargs
        spaces, first_obs = self._open(env_id, n_envs, seed)
        self.policy, self.n_actions, self.gamma = policy, n_actions, gamma
        self.action_start = int(getattr(spaces.action_space, "start", 0))
        self.rng = np.random.default_rng(seed)
        obs_shape, obs_dtype, _ = observation_layout(spaces, env_id, "dqn")  # uint8 frames stay uint8
        self.obs = np.empty((n_envs, *obs_shape), dtype=obs_dtype)
        for i, obs in enumerate(first_obs):
            try:
                self.obs[i] = obs
            except ValueError:
                self._check_shape("reset()", obs)
                raise
        self._next_obs = np.empty_like(self.obs)
        self._spare_obs = np.empty_like(self.obs)
        self._rewards = np.empty(n_envs, dtype=np.float32)
        self._terminated = np.zeros(n_envs, dtype=bool)
        self._truncated = np.zeros(n_envs, dtype=bool)
        self._actions = np.zeros(n_envs, dtype=np.int64)  # one env's choice, reused every step
        # Python numbers: an env's bookkeeping per step is a few scalar additions, which on numpy
        # elements cost ~10x more
        self.episode_return = [0.0] * n_envs
        self.episode_length = [0] * n_envs
        self.nstep = NStepBuffer(n_step, gamma, n_envs, obs_shape if len(obs_shape) > 1 else obs_shape[0],
                                 obs_dtype=obs_dtype)
        self.streams = None if first_stream is None else np.arange(first_stream, first_stream + n_envs)
        # its first step's stream ids say ~s: its episodes begin there, whoever wrote the streams before
        self._step_streams = None if first_stream is None else ~self.streams
        # a CPU policy's compiled greedy pass that writes one row's action in place (QPolicy.greedy_into)
        self._greedy_into = getattr(policy, "greedy_into", None)

    def _open(self, env_id: str, n_envs: int, seed: int):
        """Makes the envs; returns (something with the envs' observation and action spaces, each env's
        first observation)."""
        self.envs = [make_env(env_id, seed + i, kwargs=self.env_kwargs) for i in range(n_envs)]
        self._steps = [env_stepper(env) for env in self.envs]
        return self.envs[0], [env.reset(seed=seed + i)[0] for i, env in enumerate(self.envs)]

    def choose(self, epsilon: float) -> np.ndarray:
        n = self.n_envs
        if n == 1 and self._greedy_into is not None:
            # the same two uniforms as below, as Python floats: no small arrays to compare and index
            actions = self._actions
            explore, pick = self.rng.random(2).tolist()
            if explore < epsilon:
                actions[0] = int(pick * self.n_actions)
            else:
                self._greedy_into(self.obs, actions)
            return actions
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
        start = self.action_start
        return [a + start for a in actions.tolist()]

    def step(self, epsilon: float):
        """Steps every env once. Returns (transition arrays, [(episode return, length), ...]).

        Transitions are (obs, actions, n-step returns, next_obs, discounts), or None while every
        env is still gathering its first n steps; for a frame table, every step's (streams, newest
        frame of obs, actions, rewards, newest frame of next_obs, terminated, truncated).
        """
        actions = self.choose(epsilon)
        next_obs, rewards = self._next_obs, self._rewards
        terminated, truncated = self._terminated, self._truncated
        finished = self._step_envs(self.env_actions(actions), next_obs, rewards, terminated, truncated)
        if self.streams is None:
            transitions = self.nstep.step(self.obs, actions, rewards, next_obs, terminated, truncated)
        else:  # a frame table's step records: the stacks' newest frames (views)
            transitions = (self._step_streams, self.obs[:, -1], actions, rewards, next_obs[:, -1], terminated,
                           truncated)
            self._step_streams = self.streams
        # The next observations become the current ones, except where an episode ended and its
        # env restarts. Buffers rotate rather than being copied; none that the returned
        # transitions reference is written before the next step.
        if finished:
            restarted = self._spare_obs
            restarted[:] = next_obs
            self._restart(np.flatnonzero(terminated | truncated), restarted)
            self._spare_obs, self.obs = self.obs, restarted
        else:
            self.obs, self._next_obs = next_obs, self.obs
        return transitions, finished

    def _step_envs(self, env_actions: list, next_obs, rewards, terminated, truncated) -> list:
        """Steps env i with env_actions[i] into row i of the arrays; returns the finished episodes
        [(return, length), ...] in env order."""
        finished = []
        returns, lengths = self.episode_return, self.episode_length
        for i, step in enumerate(self._steps):
            obs, reward, term, trunc, info = step(env_actions[i])
            try:
                next_obs[i] = obs
            except ValueError:  # (a try costs nothing until it catches: the step stays as fast)
                self._check_shape("step()", obs)
                raise
            rewards[i], terminated[i], truncated[i] = reward, term, trunc
            returns[i] += info.get(SCORE, reward) if info else reward  # the game's score where rewards are clipped
            lengths[i] += 1
            if term or trunc:
                finished.append((float(returns[i]), int(lengths[i])))
                returns[i], lengths[i] = 0.0, 0
        return finished

    def begin_episodes(self) -> None:
        """Resets every env: another writer takes its frame-table streams over (the processes
        runtime's actor 0 from the learner's own actor), so its next step begins new episodes
        there, and its unfinished ones are dropped."""
        self._restart(np.arange(self.n_envs), self.obs)
        self.episode_return[:] = [0.0] * self.n_envs
        self.episode_length[:] = [0] * self.n_envs
        self._step_streams = ~self.streams

    def _restart(self, ended: np.ndarray, restarted: np.ndarray) -> None:
        """Resets the envs `ended`, their first observations into those rows of `restarted`."""
        for i in ended:
            obs = self.envs[i].reset()[0]
            try:
                restarted[i] = obs
            except ValueError:
                self._check_shape("reset()", obs)
                raise

    def _check_shape(self, call: str, obs) -> None:
        """Raises ConfigError if `obs`, which an env's `call` returned, is not of its observation
        space's shape: numpy's broadcast error, raised deep in a runtime, says neither which env
        broke its own space nor that the env is the user's."""
        declared = self.obs.shape[1:]
        if np.shape(obs) != declared:
            raise ConfigError(f"env {self.env_id}: {call} returned an observation of shape {np.shape(obs)}; "
                              f"its observation_space says {declared}") from None

    def close(self) -> None:
        for env in self.envs:
            env.close()


class EnvPoolActor(Actor):
    """plan.env_engine: envpool - the actor's envs are one EnvPool (pearl.envs.envpool_envs): C++
    envs stepped in one call, which pays from ~16 envs per actor (docs/BENCHMARKS.md "Actor path").
    Transitions as the Gymnasium engine's: an env whose episode ended is reset at once and acts
    from its first observation at the next step (EnvPool on its own resets it at that next step
    instead, ignoring its action: a step lost and a transition from a terminal state)."""

    engine = "envpool"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.episode_return = np.zeros(self.n_envs)
        self.episode_length = np.zeros(self.n_envs, dtype=np.int64)

    def _open(self, env_id: str, n_envs: int, seed: int):
        from pearl.envs import envpool_envs

        self.pool = envpool_envs(env_id, n_envs, seed)
        self.envs = ()  # no Gymnasium env objects: n_envs counts them
        self._pool_actions = np.zeros(n_envs, dtype=self.pool.action_space.dtype)
        obs, info = self.pool.reset()
        first = np.empty_like(obs)
        first[info["env_id"]] = obs  # EnvPool reports whose row is whose
        return self.pool, list(first)

    def env_actions(self, actions: np.ndarray) -> np.ndarray:
        np.add(actions, self.action_start, out=self._pool_actions, casting="unsafe")
        return self._pool_actions

    def _step_envs(self, env_actions, next_obs, rewards, terminated, truncated) -> list:
        obs, reward, term, trunc, info = self.pool.step(env_actions)
        ids = info["env_id"]
        next_obs[ids], rewards[ids], terminated[ids], truncated[ids] = obs, reward, term, trunc
        self.episode_return += rewards
        self.episode_length += 1
        ended = np.flatnonzero(terminated | truncated)
        if not len(ended):
            return []
        finished = [(float(self.episode_return[i]), int(self.episode_length[i])) for i in ended]
        self.episode_return[ended] = 0.0
        self.episode_length[ended] = 0
        return finished

    def _restart(self, ended: np.ndarray, restarted: np.ndarray) -> None:
        obs, info = self.pool.reset(ended.astype(np.int32))
        restarted[info["env_id"]] = obs

    def close(self) -> None:
        self.pool.close()


ENGINES = {"gymnasium": Actor, "envpool": EnvPoolActor}  # plan.env_engine -> the discrete actor class
