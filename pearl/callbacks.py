"""Callbacks under Stable-Baselines3's names, for `agent.learn(total_timesteps, callback=...)`.

When they are called. PEARL's runtimes work in rounds (pearl/runtime/counters.py `Hooks.on_round`):
the sequential and threaded runtimes make one round per act step of their actor's envs, which is
SB3's one `env.step` of its vector env, so `on_step` is called exactly as in SB3 there. The
processes runtime's learner makes a round per drain of the actors' rings (many env steps), and a
Python call per env step would cost more than the step itself; so `on_step` is called once per
round, with `num_timesteps` advanced by the round's env steps and `n_calls` by its vector steps
(env steps / envs). The callbacks here test their frequencies with "crossed a multiple since the
last call", so EvalCallback's eval_freq and CheckpointCallback's save_freq are honoured at round
granularity in every runtime; a callback of your own that tests `n_calls % freq == 0` should do the
same under the processes runtime.

`_on_rollout_end` / `_on_rollout_start` mark SB3's rollouts: every `train_freq` env steps (each
round without bursts), before that round's updates are visible to `_on_step`. `locals` holds the
learn call's arguments, not the per-step arrays SB3's collect_rollouts has (rewards, dones, infos):
PEARL's actors do not hand them to the learner one step at a time.
"""
from __future__ import annotations

import functools
import math
import sys
from pathlib import Path

import numpy as np

from pearl.errors import ConfigError
from pearl.schedule import crossed
from pearl.vec_env import DummyVecEnv


class BaseCallback:
    """Subclass it and override `_on_step` (return False to stop training) and any of
    `_init_callback`, `_on_training_start`, `_on_rollout_start`, `_on_rollout_end`,
    `_on_training_end`. `self.model` is the agent, `self.n_calls` the vector steps so far,
    `self.num_timesteps` the env steps, `self.logger.record(key, value)` adds a scalar to the next
    metric row (TensorBoard)."""

    def __init__(self, verbose: int = 0):
        self.verbose = verbose
        self.model = None
        self.n_calls = 0
        self.num_timesteps = 0
        self.locals: dict = {}
        self.globals: dict = {}
        self.parent = None
        self._round_calls = 1

    @property
    def logger(self):
        return self.model.logger

    def init_callback(self, model) -> None:
        self.model = model
        self._init_callback()

    def on_training_start(self, locals_: dict, globals_: dict) -> None:
        self.locals, self.globals = locals_, globals_
        self.num_timesteps = self.model.num_timesteps
        self._on_training_start()

    def on_rollout_start(self) -> None:
        self._on_rollout_start()

    def on_step(self, calls: int = 1) -> bool:
        """Called after each round; `calls`: the vector steps the round made (1 in SB3)."""
        self.n_calls += calls
        self._round_calls = calls
        self.num_timesteps = self.model.num_timesteps
        return self._on_step()

    def on_rollout_end(self) -> None:
        self._on_rollout_end()

    def on_training_end(self) -> None:
        self._on_training_end()

    def update_locals(self, locals_: dict) -> None:
        self.locals.update(locals_)

    def _init_callback(self) -> None:
        pass

    def _on_training_start(self) -> None:
        pass

    def _on_rollout_start(self) -> None:
        pass

    def _on_step(self) -> bool:
        return True

    def _on_rollout_end(self) -> None:
        pass

    def _on_training_end(self) -> None:
        pass


class CallbackList(BaseCallback):
    """Several callbacks called in order; training stops if any `_on_step` returns False."""

    def __init__(self, callbacks: list):
        super().__init__()
        self.callbacks = [as_callback(c) for c in callbacks]

    def _init_callback(self) -> None:
        for callback in self.callbacks:
            callback.init_callback(self.model)

    def _on_training_start(self) -> None:
        for callback in self.callbacks:
            callback.on_training_start(self.locals, self.globals)

    def _on_rollout_start(self) -> None:
        for callback in self.callbacks:
            callback.on_rollout_start()

    def _on_step(self) -> bool:
        keep = True
        for callback in self.callbacks:
            keep = callback.on_step(self._round_calls) and keep
        return keep

    def _on_rollout_end(self) -> None:
        for callback in self.callbacks:
            callback.on_rollout_end()

    def _on_training_end(self) -> None:
        for callback in self.callbacks:
            callback.on_training_end()

    def update_locals(self, locals_: dict) -> None:
        for callback in self.callbacks:
            callback.update_locals(locals_)


class ConvertCallback(BaseCallback):
    """A plain function `callback(locals_, globals_) -> bool` (False stops training), as SB3 takes."""

    def __init__(self, callback, verbose: int = 0):
        super().__init__(verbose)
        self.callback = callback

    def _on_step(self) -> bool:
        return self.callback(self.locals, self.globals) is not False


class EventCallback(BaseCallback):
    """A callback that triggers another one (`callback`) on an event of its own."""

    def __init__(self, callback: BaseCallback | None = None, verbose: int = 0):
        super().__init__(verbose)
        self.callback = callback
        if callback is not None:
            callback.parent = self

    def init_callback(self, model) -> None:
        super().init_callback(model)
        if self.callback is not None:
            self.callback.init_callback(model)

    def _on_training_start(self) -> None:
        if self.callback is not None:
            self.callback.on_training_start(self.locals, self.globals)

    def _on_event(self) -> bool:
        return self.callback.on_step() if self.callback is not None else True


class EveryNTimesteps(EventCallback):
    """Triggers `callback` each time num_timesteps crosses a multiple of `n_steps`."""

    def __init__(self, n_steps: int, callback: BaseCallback):
        super().__init__(callback)
        self.n_steps = positive_int("EveryNTimesteps.n_steps", n_steps)
        self.last = 0

    def _on_training_start(self) -> None:
        super()._on_training_start()
        self.last = self.num_timesteps

    def _on_step(self) -> bool:
        previous, self.last = self.last, self.num_timesteps
        return self._on_event() if crossed(previous, self.num_timesteps, self.n_steps) else True


class _EveryNCalls(EventCallback):
    """An event every `freq` vector steps (`n_calls`), at round granularity."""

    freq_name = "freq"

    def __init__(self, freq: int, callback=None, verbose: int = 0):
        super().__init__(callback, verbose)
        self.freq = positive_int(f"{type(self).__name__}.{self.freq_name}", freq)

    def _due(self) -> bool:
        return crossed(self.n_calls - self._round_calls, self.n_calls, self.freq)

    def needs_pause(self, previous_steps: int, env_steps: int) -> bool:
        """Whether the round from `previous_steps` to `env_steps` fires the event (the threaded
        runtime then pauses its learner, so the event sees one consistent set of weights)."""
        n = self.model.n_envs
        return crossed(previous_steps // n, env_steps // n, self.freq)


class CheckpointCallback(_EveryNCalls):
    """Saves the agent every `save_freq` vector steps to `save_path`/`name_prefix`_<steps>_steps.npz
    without its replay contents, as SB3 saves a model (an Atari table's would be 0.7-7 GB a file),
    and with `save_replay_buffer` those to `name_prefix`_replay_buffer_<steps>_steps.npz beside it
    (SB3's names; `load_replay_buffer` reads them)."""

    freq_name = "save_freq"

    def __init__(self, save_freq: int, save_path: str, name_prefix: str = "rl_model",
                 save_replay_buffer: bool = False, save_vecnormalize: bool = False, verbose: int = 0):
        super().__init__(save_freq, verbose=verbose)
        self.save_path, self.name_prefix, self.save_replay_buffer = Path(save_path), name_prefix, save_replay_buffer

    def _init_callback(self) -> None:
        self.save_path.mkdir(parents=True, exist_ok=True)

    def _checkpoint_path(self, kind: str = "") -> Path:
        return self.save_path / f"{self.name_prefix}_{kind}{self.num_timesteps}_steps.npz"

    def _on_step(self) -> bool:
        if self._due():
            path = self._checkpoint_path()
            self.model.save(path, exclude=["replay_buffer"])
            if self.verbose >= 2:
                print(f"Saving model checkpoint to {path}")
            if self.save_replay_buffer:
                path = self._checkpoint_path("replay_buffer_")
                self.model.save_replay_buffer(path)
                if self.verbose >= 2:
                    print(f"Saving model replay buffer checkpoint to {path}")
        return True


def evaluate_policy(model, env, n_eval_episodes: int = 10, deterministic: bool = True,
                    return_episode_rewards: bool = False, seed: int | None = None):
    """SB3's evaluate_policy on one Gymnasium env (an instance or an id) or on a VecEnv (SB3's or
    `model.get_env()`'s): (mean, std) of the episode returns, or (returns, lengths) with
    `return_episode_rewards`. A VecEnv is evaluated as SB3 does: env i runs (n_eval_episodes + i)
    // num_envs episodes (no bias towards short ones), and where a Monitor wraps its envs an episode
    is the Monitor's (a whole Atari game under SB3's AtariWrapper, which ends an episode per life).
    `seed` seeds the first reset. An id is made as the model's config makes its env when it is the
    model's env (with its env_kwargs), else with none."""
    from pearl.envs import make_env

    if _is_vec_env(env):
        returns, lengths = _vec_env_episodes(model, env, n_eval_episodes, deterministic, seed)
    else:
        if hasattr(env, "num_envs"):
            raise ConfigError("eval_env: expected one Gymnasium env (an instance or an id) or an SB3 VecEnv, "
                              "not a Gymnasium vector env")
        config = getattr(model, "config", None)
        kwargs = config.env_kwargs if config is not None and env == config.env else None
        returns, lengths = _episodes(model, env, n_eval_episodes, deterministic, seed,
                                     functools.partial(make_env, kwargs=kwargs))
    if return_episode_rewards:
        return returns, lengths
    return float(np.mean(returns)), float(np.std(returns))


def _episodes(model, env, n_episodes: int, deterministic: bool, seed: int | None, make_env):
    own = isinstance(env, str)
    env = make_env(env, seed, "eval_env") if own else env
    returns, lengths = [], []
    try:
        for episode in range(n_episodes):
            obs, _ = env.reset(seed=None if seed is None else seed + episode)
            total, length, done = 0.0, 0, False
            while not done:
                action, _ = model.predict(obs, deterministic=deterministic)
                obs, reward, terminated, truncated, _ = env.step(action)
                total, length, done = total + float(reward), length + 1, terminated or truncated
            returns.append(total)
            lengths.append(length)
    finally:
        if own:
            env.close()
    return returns, lengths


def _is_sb3_vec_env(env) -> bool:
    """SB3 is imported wherever one of its VecEnvs was made (PEARL does not import it otherwise)."""
    vec_env = getattr(sys.modules.get("stable_baselines3.common.vec_env"), "VecEnv", None)
    return vec_env is not None and isinstance(env, vec_env)


def _is_vec_env(env) -> bool:
    return isinstance(env, DummyVecEnv) or _is_sb3_vec_env(env)


def _monitored(env) -> bool:
    """Whether SB3's Monitor wraps the envs of `env` (an SB3 VecEnv), or its VecMonitor the VecEnv."""
    if not _is_sb3_vec_env(env):
        return False
    from stable_baselines3.common.monitor import Monitor
    from stable_baselines3.common.vec_env import VecMonitor, is_vecenv_wrapped

    return is_vecenv_wrapped(env, VecMonitor) or env.env_is_wrapped(Monitor)[0]


def _vec_env_episodes(model, env, n_episodes: int, deterministic: bool, seed: int | None):
    monitored = _monitored(env)
    n = env.num_envs
    targets = np.array([(n_episodes + i) // n for i in range(n)])
    counts, running, steps = np.zeros(n, int), np.zeros(n), np.zeros(n, int)
    returns, lengths = [], []
    if seed is not None:
        env.seed(seed)
    obs = env.reset()
    while (counts < targets).any():
        actions, _ = model.predict(obs, deterministic=deterministic)
        obs, rewards, dones, infos = env.step(actions)
        running, steps = running + rewards, steps + 1
        for i in np.flatnonzero(dones & (counts < targets)):
            if not monitored:
                returns.append(float(running[i]))
                lengths.append(int(steps[i]))
                counts[i] += 1
            elif "episode" in infos[i]:  # the Monitor's whole episode ended (not just a life)
                returns.append(float(infos[i]["episode"]["r"]))
                lengths.append(int(infos[i]["episode"]["l"]))
                counts[i] += 1
        running[dones], steps[dones] = 0.0, 0
    return returns, lengths


class EvalCallback(_EveryNCalls):
    """Every `eval_freq` vector steps: `n_eval_episodes` episodes on `eval_env` (a Gymnasium env
    or id), `last_mean_reward` / `best_mean_reward`, `callback_on_new_best` when it improves (its
    False stops training), `callback_after_eval` after each, the best agent saved to
    `best_model_save_path`/best_model.npz, the results to `log_path`/evaluations.npz
    (timesteps, results, ep_lengths) as SB3 writes them."""

    freq_name = "eval_freq"

    def __init__(self, eval_env, callback_on_new_best: BaseCallback | None = None,
                 callback_after_eval: BaseCallback | None = None, n_eval_episodes: int = 5,
                 eval_freq: int = 10000, log_path: str | None = None, best_model_save_path: str | None = None,
                 deterministic: bool = True, render: bool = False, verbose: int = 1, warn: bool = True):
        super().__init__(eval_freq, callback_after_eval, verbose)
        self.eval_env, self.n_eval_episodes, self.deterministic = eval_env, n_eval_episodes, deterministic
        self.callback_on_new_best = callback_on_new_best
        if callback_on_new_best is not None:
            callback_on_new_best.parent = self
        self.best_model_save_path = Path(best_model_save_path) if best_model_save_path else None
        self.log_path = Path(log_path) / "evaluations.npz" if log_path else None
        self.best_mean_reward, self.last_mean_reward = -math.inf, -math.inf
        self.evaluations_timesteps, self.evaluations_results, self.evaluations_length = [], [], []

    def _init_callback(self) -> None:
        for folder in (self.best_model_save_path, self.log_path and self.log_path.parent):
            if folder is not None:
                folder.mkdir(parents=True, exist_ok=True)
        if self.callback_on_new_best is not None:
            self.callback_on_new_best.init_callback(self.model)

    def _on_step(self) -> bool:
        if not self._due():
            return True
        returns, lengths = evaluate_policy(self.model, self.eval_env, self.n_eval_episodes, self.deterministic,
                                           return_episode_rewards=True)
        self.evaluations_timesteps.append(self.num_timesteps)
        self.evaluations_results.append(returns)
        self.evaluations_length.append(lengths)
        if self.log_path is not None:
            np.savez(self.log_path, timesteps=self.evaluations_timesteps, results=self.evaluations_results,
                     ep_lengths=self.evaluations_length)
        self.last_mean_reward = mean = float(np.mean(returns))
        self.logger.record("eval/mean_reward", mean)
        self.logger.record("eval/mean_ep_length", float(np.mean(lengths)))
        if self.verbose >= 1:
            print(f"Eval num_timesteps={self.num_timesteps}, episode_reward={mean:.2f} +/- {np.std(returns):.2f}")
        keep = True
        if mean > self.best_mean_reward:
            self.best_mean_reward = mean
            if self.best_model_save_path is not None:
                self.model.save(self.best_model_save_path / "best_model.npz")
            if self.verbose >= 1:
                print("New best mean reward!")
            if self.callback_on_new_best is not None:
                keep = self.callback_on_new_best.on_step()
        if self.callback is not None:
            keep = self._on_event() and keep
        return keep


class StopTrainingOnRewardThreshold(BaseCallback):
    """As EvalCallback's callback_on_new_best: stops training once its best mean reward reaches
    `reward_threshold`."""

    def __init__(self, reward_threshold: float, verbose: int = 0):
        super().__init__(verbose)
        self.reward_threshold = reward_threshold

    def _on_step(self) -> bool:
        if self.parent is None or not hasattr(self.parent, "best_mean_reward"):
            raise ConfigError("StopTrainingOnRewardThreshold: use it as EvalCallback's callback_on_new_best")
        keep = self.parent.best_mean_reward < self.reward_threshold
        if not keep and self.verbose >= 1:
            print(f"Stopping training: the mean reward {self.parent.best_mean_reward:.2f} reached "
                  f"the threshold {self.reward_threshold}")
        return keep


class StopTrainingOnMaxEpisodes(BaseCallback):
    """Stops training after `max_episodes` episodes (over all envs) in this learn call."""

    def __init__(self, max_episodes: int, verbose: int = 0):
        super().__init__(verbose)
        self.max_episodes = positive_int("StopTrainingOnMaxEpisodes.max_episodes", max_episodes)
        self.start = 0

    def _on_training_start(self) -> None:
        self.start = self.model.episodes

    def _on_step(self) -> bool:
        return self.model.episodes - self.start < self.max_episodes


class StopTrainingOnNoModelImprovement(BaseCallback):
    """As EvalCallback's callback_after_eval: stops when `max_no_improvement_evals` evaluations in
    a row (after `min_evals`) did not beat the best mean reward."""

    def __init__(self, max_no_improvement_evals: int, min_evals: int = 0, verbose: int = 0):
        super().__init__(verbose)
        self.max_no_improvement_evals, self.min_evals = max_no_improvement_evals, min_evals
        self.last_best, self.no_improvement = -math.inf, 0

    def _on_step(self) -> bool:
        if self.n_calls > self.min_evals:
            improved = self.parent.best_mean_reward > self.last_best
            self.no_improvement = 0 if improved else self.no_improvement + 1
        self.last_best = self.parent.best_mean_reward
        return self.no_improvement <= self.max_no_improvement_evals


def as_callback(callback) -> BaseCallback:
    """None, a BaseCallback, a list of them or a plain function -> one BaseCallback."""
    if callback is None:
        return CallbackList([])
    if isinstance(callback, BaseCallback):
        return callback
    if isinstance(callback, (list, tuple)):
        return CallbackList(list(callback))
    if callable(callback):
        return ConvertCallback(callback)
    raise ConfigError(f"callback: expected a BaseCallback, a list of them or a function, got {callback!r}")


def needs_pause(callback: BaseCallback, previous_steps: int, env_steps: int) -> bool:
    """Whether any callback fires an event that reads the weights in this round."""
    if isinstance(callback, CallbackList):
        return any(needs_pause(c, previous_steps, env_steps) for c in callback.callbacks)
    return isinstance(callback, _EveryNCalls) and callback.needs_pause(previous_steps, env_steps)


def positive_int(field: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ConfigError(f"{field}: expected a positive integer, got {value!r}")
    return int(value)


__all__ = ["BaseCallback", "CallbackList", "CheckpointCallback", "ConvertCallback", "EvalCallback",
           "EventCallback", "EveryNTimesteps", "StopTrainingOnMaxEpisodes", "StopTrainingOnNoModelImprovement",
           "StopTrainingOnRewardThreshold", "evaluate_policy"]
