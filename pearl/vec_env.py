"""SB3's vector env interface for the user's loops (pearl/sb3.py re-exports it under SB3's name)."""
from __future__ import annotations

import numpy as np


class DummyVecEnv:
    """Stable-Baselines3's vector env interface over Gymnasium envs stepped one after another in this
    process (what `model.get_env()` gives): `reset()` returns the observations, one row per env;
    `step(actions)` returns (observations, rewards, dones, infos) and an env whose episode ended
    starts the next one at once, its last observation in infos[i]["terminal_observation"];
    infos[i]["TimeLimit.truncated"] says whether a time limit cut the episode, as SB3's vector envs
    say."""

    def __init__(self, env_fns):
        self.envs = [make() for make in env_fns]
        self.num_envs = len(self.envs)
        self.observation_space, self.action_space = self.envs[0].observation_space, self.envs[0].action_space
        self._seeds: list = [None] * self.num_envs

    def seed(self, seed: int | None = None) -> list:
        """Seeds for the next reset(): seed + i for env i."""
        self._seeds = [None if seed is None else seed + i for i in range(self.num_envs)]
        return self._seeds

    def reset(self) -> np.ndarray:
        observations = [env.reset(seed=seed)[0] for env, seed in zip(self.envs, self._seeds)]
        self._seeds = [None] * self.num_envs
        return np.stack(observations)

    def step(self, actions) -> tuple:
        actions = np.asarray(actions)
        observations, rewards, dones, infos = [], np.zeros(self.num_envs, np.float32), np.zeros(self.num_envs, bool), []
        for i, env in enumerate(self.envs):
            action = actions[i].item() if actions[i].ndim == 0 else actions[i]
            obs, rewards[i], terminated, truncated, info = env.step(action)
            info = {**info, "TimeLimit.truncated": truncated and not terminated}
            if terminated or truncated:
                dones[i] = True
                info["terminal_observation"] = obs
                obs, _ = env.reset()
            observations.append(obs)
            infos.append(info)
        return np.stack(observations), rewards, dones, infos

    def render(self, mode: str | None = None):
        """The first env's render() (its render_mode decides what that is)."""
        return self.envs[0].render()

    def close(self) -> None:
        for env in self.envs:
            env.close()
