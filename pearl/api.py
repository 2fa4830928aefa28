"""The Python API: `pearl.DQN(env=...)` (and DDPG, TD3, SAC), `.train()`, `.evaluate()`, `.act()`,
`.save()`, `pearl.load()`, `pearl.resume()`; and Stable-Baselines3's: `pearl.DQN("MlpPolicy", env,
learning_rate=...)`, `.learn()`, `.predict()`, `DQN.load()`, `.num_timesteps`, its hyperparameter
attributes, `get_parameters` / `set_parameters`, `save_replay_buffer` / `load_replay_buffer`
(pearl/sb3.py, pearl/callbacks.py).

An agent is the user's verbs over the parts the builder made (pearl/build.py) and the counters a
runtime advances (pearl/runtime/counters.py); it keeps the run directory.
"""
from __future__ import annotations

import contextlib
import copy
import functools
import os
import time
import warnings
from pathlib import Path

import numpy as np
import yaml

from pearl import runtime
from pearl.build import build
from pearl.callbacks import as_callback, needs_pause, positive_int
from pearl.checkpoint import (agent_state, check_state, join_state, load_checkpoint, read_checkpoint, restore_state,
                              save_checkpoint, split_state, start_checkpoint)
from pearl.config import ExperimentConfig, apply_overrides, load_config, parse_config, resolve_config
from pearl.envs import episode_returns, make_env, register_source
from pearl.sb3 import (HYPERPARAMETERS, check_policy, fit_observations, hyperparameter_key, is_policy,
                       sb3_overrides, vector_env)
from pearl.tensorboard import Logger, TensorBoardLog, check_available, next_run_dir
from pearl.errors import ConfigError, PearlError
from pearl.io import atomic_write_text, interrupts_deferred, owned_run_dir
from pearl.kernels.cpu import cpu_kernel_mode
from pearl.plan import Plan, load_plan, replanned
from pearl.runlog import RunLog, plot_learning_curve, simulated_columns
from pearl.runtime.adaptive_threads import AdaptiveThreads
from pearl.runtime.counters import Counters, Hooks, stop_on_interrupt
from pearl.schedule import MANY_ACTORS, crossed
from pearl.vec_env import DummyVecEnv


def _delegated(holder: str, name: str) -> property:
    """agent.`name` is agent.`holder`.`name` (a part, or a counter), read and written there."""
    return property(lambda self: getattr(getattr(self, holder), name),
                    lambda self, value: setattr(getattr(self, holder), name, value))


def _hyperparameter(name: str) -> property:
    """model.`name`, Stable-Baselines3's attribute of that name, read from the config
    (pearl/sb3.py `hyperparameter_key`); AttributeError where SB3's model of the algorithm has none."""
    def read(self):
        key = hyperparameter_key(self.algo_name, name)
        if key is None:
            raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")
        return functools.reduce(getattr, key.split("."), self.config)
    return property(read, doc=f"SB3's {name}, from the config (read only).")


class Agent:
    """An off-policy agent on a Gymnasium environment; subclasses name the algorithm."""

    algo_name, default_env = "", ""

    def __init__(self, *args, config: ExperimentConfig | str | os.PathLike | dict | None = None,
                 plan: Plan | str | os.PathLike | dict | None = None, **options):
        """PEARL's form `DQN(env, **options)` or Stable-Baselines3's `DQN("MlpPolicy", env,
        learning_rate=..., ...)`: built SB3's way, the agent starts from SB3's defaults
        (pearl/sb3.py); SB3's names work in either form, beside PEARL's own. `config` and `plan`:
        the object, its YAML file's path (as `pearl train` reads them) or a mapping of its fields."""
        config = None if config is None else _as_config(config)
        plan = _as_plan(plan)
        policy, env = _policy_and_env(type(self).__name__, args, options)
        self.verbose = options.pop("verbose", 0)
        self.tensorboard_log = options.pop("tensorboard_log", None)
        if self.tensorboard_log is not None:
            check_available("tensorboard_log")
        n_envs = 1
        if env is not None:
            env, n_envs = vector_env(env)
            if n_envs > 1:
                options.setdefault("envs_per_actor", n_envs)
        if policy is not None:
            check_policy(policy)
        frames_once = options.pop("optimize_memory_usage", False)
        dotted = sb3_overrides(self.algo_name, options, policy, n_envs)
        if dotted:
            config = apply_overrides(config or ExperimentConfig(algo=self.algo_name, env=self.default_env), dotted)
        config = fit_observations(resolve_config(self.algo_name, env, config, options, self.default_env), policy,
                                  frames_once)
        self.parts = build(config, plan)
        self.counters = Counters()
        self.logger = Logger()  # what callbacks record for the next metric row
        self._policy_version = None  # (updates, learner) whose weights the numpy policy holds
        self._checkpointing = None  # a run's checkpoint being written (pearl.checkpoint.start_checkpoint)
        self._warned_schedules = False  # train() past config.total_steps says so once
        self._env = None  # get_env()'s, made on first use

    config, plan, algo, learner, replay, policy, rng = (
        _delegated("parts", name) for name in ("config", "plan", "algo", "learner", "replay", "policy", "rng"))
    env_steps, updates, episodes, stop_requested, task_timer, recent_returns = (
        _delegated("counters", name) for name in ("env_steps", "updates", "episodes", "stop_requested",
                                                  "task_timer", "recent_returns"))
    actor_processes, actor_restarts, actor_lead = (
        _delegated("counters", name) for name in ("actor_processes", "actor_restarts", "actor_lead"))

    (learning_rate, gamma, batch_size, buffer_size, learning_starts, tau, target_update_interval, exploration_fraction,
     exploration_initial_eps, exploration_final_eps, max_grad_norm, policy_delay, target_policy_noise,
     target_noise_clip, seed) = (_hyperparameter(name) for name in HYPERPARAMETERS)

    @property
    def actor(self):
        return self.parts.actor

    @property
    def num_timesteps(self) -> int:
        """Env steps taken (Stable-Baselines3's name for env_steps)."""
        return self.counters.env_steps

    @property
    def n_envs(self) -> int:
        """Envs stepped per round over all actors (SB3's vector env size)."""
        actors = self.plan.actors if self.plan.runtime in MANY_ACTORS else 1
        return actors * self.plan.envs_per_actor

    # -- the user's verbs ----------------------------------------------------------------------
    def train(self, steps: int | None = None, *, progress: bool | str = False, run_dir: str | Path | None = None,
              time_tasks: bool = False, resume: bool = False, on_round=None, callback=None,
              tensorboard_dir: str | Path | None = None) -> dict:
        """Trains for `steps` env steps (default: what is left of config.total_steps).

        With `run_dir` (held for the call: a second run on it is refused, pearl.io.owned_run_dir),
        writes config.yaml, plan.yaml, metrics.csv, checkpoint.npz and learning_curve.png there,
        the checkpoint also every `log.checkpoint_interval` env steps and `log.checkpoint_seconds`
        of wall time (atomically; never one with non-finite weights). `resume`: continue that run
        directory's metrics.csv instead of starting it afresh (`pearl.resume`). `on_round(agent)`
        runs after each runtime round; setting `agent.stop_requested` there (or Ctrl-C) stops at
        the end of the round, writes the checkpoint and returns (`summary["interrupted"]`); a
        second Ctrl-C aborts at once, but not a checkpoint being written. Training past
        config.total_steps warns once. `progress`: a bar on a terminal, a line per metric row
        elsewhere ("lines": always lines; pearl/progress.py). `callback`: SB3's callbacks
        (pearl/callbacks.py: when they are called). `tensorboard_dir` (or `log.tensorboard` with a
        run_dir): TensorBoard scalars under SB3's names (pearl/tensorboard.py). Returns a summary
        (steps/s, updates, final training return; `steps` and the rates count this call only).
        """
        counters, config = self.counters, self.config
        steps = config.total_steps - counters.env_steps if steps is None else steps
        if steps < 1:
            raise ConfigError(f"steps: expected a positive number of env steps, got {steps}")
        if counters.env_steps + steps > config.total_steps and not self._warned_schedules:
            self._warned_schedules = True
            warnings.warn(f"training to env step {counters.env_steps + steps:,} but the schedules (epsilon, "
                          f"beta) were sized for config.total_steps = {config.total_steps:,} steps",
                          stacklevel=2)
        starts = getattr(config, config.algo).learning_starts
        if counters.env_steps + steps <= starts and counters.updates == 0:
            warnings.warn(f"{config.algo}.learning_starts = {starts:,}: training to env step "
                          f"{counters.env_steps + steps:,} runs no update (random actions only)", stacklevel=2)
        run_path = Path(run_dir) if run_dir is not None else None
        with owned_run_dir(run_path) if run_path is not None else contextlib.nullcontext():
            return self._train(steps, progress, run_path, time_tasks, resume, on_round, callback, tensorboard_dir)

    def _train(self, steps: int, progress: bool | str, run_path: Path | None, time_tasks: bool, resume: bool,
               on_round, callback, tensorboard_dir) -> dict:
        counters, config = self.counters, self.config
        if run_path is not None:
            atomic_write_text(run_path / "config.yaml", yaml.safe_dump(config.to_dict(), sort_keys=False))
            self.plan.save(run_path / "plan.yaml")
        fpga = self.parts.fpga_device()
        fpga_start = fpga.report() if fpga is not None and fpga.simulated else None  # this run's share
        log = RunLog(run_path, config.log.interval, counters.env_steps, counters.env_steps + steps, progress,
                     resume_after=counters.env_steps if resume else None, **simulated_columns(fpga, fpga_start))
        eval_every, log_every = config.eval.interval, config.log.interval
        checkpoint_every = config.log.checkpoint_interval if run_path is not None else 0
        checkpoint_seconds = config.log.checkpoint_seconds if run_path is not None else 0
        last = [counters.env_steps]  # env steps at the previous round: runtimes advance by rounds
        last_checkpoint = [time.monotonic()]
        checkpoint_now: list[bool | None] = [None]  # this round's decision (checkpoint_due)
        if tensorboard_dir is None and config.log.tensorboard and run_path is not None:
            tensorboard_dir = run_path
        board = (TensorBoardLog(Path(tensorboard_dir), config.algo, config.algo_config.lr)
                 if tensorboard_dir is not None else None)
        rows = [len(log.rows)]
        callback = as_callback(callback) if callback is not None else None
        train_freq, n_envs = self.parts.schedule.train_freq or 1, self.n_envs

        def after_round():
            previous, last[0] = last[0], counters.env_steps
            epsilon = self.algo.epsilon  # RunLog reads it only for a row it writes
            if callback is not None:
                rollout_ended = crossed(previous, counters.env_steps, train_freq)
                if rollout_ended:
                    callback.on_rollout_end()
                if not callback.on_step(counters.env_steps // n_envs - previous // n_envs):
                    counters.stop_requested = True
                if rollout_ended:
                    callback.on_rollout_start()
            if crossed(previous, counters.env_steps, eval_every):
                log(counters, epsilon, eval_return=self.evaluate(config.eval.episodes)["mean"])
            else:
                log(counters, epsilon)
            if board is not None and len(log.rows) > rows[0]:
                rows[0] = len(log.rows)
                board.write(log.rows[-1], self.logger.take())
            if checkpoint_due(previous, counters.env_steps):
                self.checkpoint(run_path / "checkpoint.npz", background=True)
                last_checkpoint[0] = time.monotonic()
            checkpoint_now[0] = None
            if on_round is not None:
                on_round(self)

        def checkpoint_due(previous: int, now: int) -> bool:
            """Whether this round writes the checkpoint, decided once per round: the threaded
            runtime's quiet() asks first, and its answer must hold when the round's hook runs."""
            if checkpoint_now[0] is None:
                checkpoint_now[0] = bool(crossed(previous, now, checkpoint_every) or checkpoint_seconds and
                                         time.monotonic() - last_checkpoint[0] >= checkpoint_seconds)
            return checkpoint_now[0]

        def quiet(a, b):  # rounds whose hook reads the weights (or saves them) see the threaded learner paused
            return (crossed(a, b, log_every) or crossed(a, b, eval_every) or checkpoint_due(a, b)
                    or callback is not None and needs_pause(callback, a, b))

        hooks = Hooks(after_round, quiet, counters.task_timer if time_tasks else None)
        start_steps, start_updates, started = counters.env_steps, counters.updates, time.perf_counter()
        counters.stop_requested = False
        if callback is not None:
            callback.init_callback(self)
            callback.on_training_start({"self": self, "total_timesteps": counters.env_steps + steps,
                                        "callback": callback}, {})
            callback.on_rollout_start()
        try:
            with cpu_kernel_mode(), stop_on_interrupt(counters):
                runtime.get(self.plan.runtime).run(self.parts, counters, steps, hooks)
        except BaseException:
            self.finish_checkpoint(raising=False)  # (the run's error goes on)
            raise
        finally:
            log.close()
            if board is not None:
                board.close()
            release = getattr(self.learner, "release", None)  # optional (the Learner contract)
            if release is not None:
                release()
        if callback is not None:
            callback.on_training_end()
        wall = time.perf_counter() - started
        summary = {
            "env_steps": counters.env_steps, "updates": counters.updates, "episodes": counters.episodes,
            # this call's share: a resumed run's figures count only the steps it took
            "steps": counters.env_steps - start_steps, "wall_s": wall,
            "steps_per_s": (counters.env_steps - start_steps) / wall,
            "updates_per_s": (counters.updates - start_updates) / wall,
            "mean_return_100": counters.mean_return(), "learner_kernel": self.learner.kernel,
            "interrupted": counters.stop_requested,
        }
        if time_tasks:
            summary["task_us"] = counters.task_timer.mean_us()
        if self.plan.runtime in MANY_ACTORS:
            summary["actor_restarts"] = counters.actor_restarts
        if isinstance(self.learner, AdaptiveThreads):  # the updates run on each thread count, so far
            summary["learner_threads"] = dict(self.learner.updates_on)
        if fpga is not None:
            summary["fpga"] = (fpga.report(since=fpga_start) if fpga.simulated
                               else {"simulated": False, "label": fpga.label})
        if run_path is not None:
            self.checkpoint(run_path / "checkpoint.npz")
            if config.log.plot and log.rows:
                plot_learning_curve(log.rows, run_path / "learning_curve.png",
                                    f"{config.algo.upper()} on {config.env} (seed {config.seed})")
        return summary

    def evaluate(self, episodes: int | None = None, seed: int | None = None) -> dict:
        """Greedy returns over `episodes` fresh episodes (None: config.eval.episodes) on a separate
        env (the training env is untouched)."""
        episodes = self.config.eval.episodes if episodes is None else positive_int("episodes", episodes)
        family = self.parts.family
        policy = family.policy_factory(self.config, self.algo, "cpu")()  # a copy of the current weights
        policy.load(self.learner.policy_weights())
        returns = episode_returns(self.config.env, lambda obs: family.to_env(family.act(
            policy, np.asarray(obs, dtype=np.float32)[None], None, True, self.config)),
            episodes, (self.config.seed + 1_000_003) if seed is None else seed,
            self.config.env_kwargs)
        return {"mean": float(np.mean(returns)), "std": float(np.std(returns)), "returns": returns}

    def act(self, obs, deterministic: bool = True):
        """The action for one observation (or a batch of them): DQN's action index, a continuous
        algorithm's action in the env's bounds; with the policy's exploration if not deterministic
        (DQN: epsilon_final)."""
        batch, single = self._observations(obs, "obs")
        actions = self._actions(batch, deterministic)
        if not single:
            return actions
        return int(actions[0]) if self.parts.family.action_field[1] == () else actions[0]

    def _observations(self, obs, field: str) -> tuple[np.ndarray, bool]:
        """(a batch of flat float32 observations, whether `obs` was one): the env's observation shape
        or a batch of them. An image (C, H, W) may come channel-last, (H, W, C), as SB3's
        VecFrameStack stacks Atari frames (SB3's predict transposes such an image too)."""
        shape = self.parts.family.obs_shape
        obs = np.asarray(obs, dtype=np.float32)
        channel_last = (*shape[1:], shape[0]) if len(shape) == 3 else shape
        if channel_last != shape and obs.shape[-3:] == channel_last:
            obs = np.moveaxis(obs, -1, -3)
        if obs.shape != shape and obs.shape[1:] != shape:
            wanted = f"{shape} or (n, {', '.join(map(str, shape))})"
            if channel_last != shape:
                wanted += f", channel-last {channel_last} or (n, {', '.join(map(str, channel_last))})"
            raise ConfigError(f"{field}: expected shape {wanted}, got {obs.shape}")
        return obs.reshape(-1, self.parts.family.obs_dim), obs.shape == shape

    def _actions(self, batch: np.ndarray, deterministic: bool) -> np.ndarray:
        self._current_policy()
        return self.parts.family.act(self.policy, batch, self.rng, deterministic, self.config)

    def _current_policy(self) -> None:
        """Loads the learner's weights into the numpy policy if an update or a load may have
        changed them since (a predict loop would otherwise copy the weights every call)."""
        version = (self.counters.updates, id(self.parts.learner))
        if self._policy_version != version:
            self.policy.load(self.learner.policy_weights())
            self._policy_version = version

    def save(self, path: str | Path, exclude=None, include=None) -> None:
        """Config, plan, weights, optimizer state, replay contents and counters: one atomic .npz
        (".npz" added to a path without a suffix, as SB3 adds ".zip"). SB3's `exclude`:
        "replay_buffer" leaves the replay contents out, as SB3's save always does (0.7 GB of
        Atari frames at 100k); an agent loaded from such a file starts with an empty table and its
        updates wait until the table holds learning_starts transitions again. Nothing else PEARL
        saves can be left out; `include` adds nothing."""
        self.finish_checkpoint()
        replay = "replay_buffer" not in (exclude or ())
        save_checkpoint(_with_suffix(path), *agent_state(self.parts, self.counters, replay))

    def checkpoint(self, path: str | Path, background: bool = False) -> bool:
        """save(path) unless the weights went non-finite (then the previous checkpoint stays, and
        False is returned): a run's checkpoint is always one it can resume from. `background` (a
        run's periodic checkpoint): a frame table's frames are written by a thread while the run
        goes on (pearl.checkpoint.start_checkpoint); `finish_checkpoint` waits for it."""
        if not np.isfinite(self.learner.policy_weights()).all():
            return False
        self.finish_checkpoint()
        with interrupts_deferred():  # a Ctrl-C while it is written acts once it is complete
            if background:
                self._checkpointing = start_checkpoint(path, self.parts, self.counters)
            else:
                self.save(path)
        return True

    def finish_checkpoint(self, raising: bool = True) -> None:
        """Waits until a checkpoint written in the background is on disk, and raises what it failed
        with (unless not `raising`: the previous checkpoint file stays either way)."""
        writing, self._checkpointing = self._checkpointing, None
        if writing is not None:
            try:
                writing.finish()
            except BaseException:
                if raising:
                    raise

    # -- Stable-Baselines3's verbs (pearl/sb3.py) ------------------------------------------------
    def learn(self, total_timesteps: int, callback=None, log_interval: int = 4, tb_log_name: str | None = None,
              reset_num_timesteps: bool = True, progress_bar: bool = False) -> "Agent":
        """SB3's learn: trains `total_timesteps` env steps and returns the agent. On a fresh agent the
        schedules (epsilon, beta) are sized for them, as SB3 sizes its own. On an agent that already
        trained it trains on from its count whatever `reset_num_timesteps` says: PEARL's replay
        ratio and target schedule run on that count (SB3 would restart exploration). `log_interval`
        (episodes between SB3's console tables) is not used: a metric row comes every
        `log.interval` env steps. `progress_bar`: a tqdm bar (a line per row outside a terminal);
        verbose >= 1 prints the lines."""
        if (isinstance(total_timesteps, bool) or not isinstance(total_timesteps, (int, float, np.integer))
                or not float(total_timesteps).is_integer() or total_timesteps < 1):
            raise ConfigError(f"total_timesteps: expected a positive integer, got {total_timesteps!r}")
        total = int(total_timesteps)
        if self.env_steps == 0 and total != self.config.total_steps:
            self.parts = build(apply_overrides(self.config, {"total_steps": total}), self.plan)
        board = None
        if self.tensorboard_log is not None:
            board = next_run_dir(Path(self.tensorboard_log), tb_log_name or type(self).__name__,
                                 new=reset_num_timesteps or self.env_steps == 0)
        self.train(total, progress=True if progress_bar else "lines" if self.verbose >= 1 else False,
                   callback=callback, tensorboard_dir=board)
        return self

    def predict(self, observation, state=None, episode_start=None, deterministic: bool = False):
        """SB3's predict: (action, None) for one observation or (actions, None) for a batch, as
        numpy arrays in the env's action space (DQN with deterministic=False: epsilon_final)."""
        batch, single = self._observations(observation, "observation")
        actions = self._actions(batch, deterministic)
        if self.parts.family.action_field[1] == ():
            actions = actions + self.parts.family.action_start
        return (actions[0] if single else actions), state

    @property
    def observation_space(self):
        return self.parts.family.observation_space

    @property
    def action_space(self):
        return self.parts.family.action_space

    def get_env(self):
        """SB3's get_env: a vector env (pearl.sb3.DummyVecEnv, SB3's interface) of `n_envs` envs made
        as the config makes them, the same object on every call. PEARL's actors step envs of their
        own: this one is for the user's loops (predict / step / render, evaluate_policy)."""
        if self._env is None:
            self._env = DummyVecEnv([functools.partial(make_env, self.config.env, kwargs=self.config.env_kwargs)]
                                    * self.n_envs)
        return self._env

    env = property(get_env)

    def set_env(self, env, force_reset: bool = True) -> None:
        """SB3's set_env: train on from here on `env` (an id, env instance, factory or vector env of
        the same observation and action spaces and as many envs): the agent's networks, optimizer,
        replay contents and counters carry over; its actors start fresh episodes on the new env
        (SB3's force_reset: PEARL's always do)."""
        env, n_envs = vector_env(env)
        if n_envs != self.n_envs:
            raise ConfigError(f"env: {n_envs} envs, but this agent steps {self.n_envs} (expected as many)")
        # an id keeps the config's env_kwargs; a factory or instance takes its arguments itself
        config = apply_overrides(self.config, {"env": env} if isinstance(env, str)
                                 else {"env": register_source(env), "env_kwargs": {}})
        parts = build(config, self.plan)
        for name in ("observation_space", "action_space"):
            mine, theirs = getattr(self, name), getattr(parts.family, name)
            if mine != theirs:
                raise ConfigError(f"env: {config.env} has the {name} {theirs}, this agent's is {mine}")
        restore_state(Path("set_env"), *agent_state(self.parts, self.counters), parts, self.counters)
        self.parts, self._env, self._policy_version = parts, None, None

    @property
    def exploration_rate(self) -> float:
        """DQN's epsilon at the current env step (SB3's exploration_rate)."""
        if self.algo_name != "dqn":
            raise AttributeError(f"'{type(self).__name__}' object has no attribute 'exploration_rate'")
        return self.algo.epsilon(self.env_steps)

    def get_parameters(self) -> dict:
        """SB3's get_parameters: {"learner": the learner's state}, weights and optimizer state as
        numpy arrays (a copy: training on does not change it); `set_parameters` takes it back."""
        self.learner.sync_to_algo()
        return {"learner": copy.deepcopy(self.learner.state_dict())}  # the Learner contract promises no copy

    def set_parameters(self, load_path_or_dict, exact_match: bool = True, device: str = "auto") -> None:
        """SB3's set_parameters: the learner's weights and optimizer state from `get_parameters()`'s
        dict or from a saved agent's file (its replay and counters stay as they are here), checked
        against this agent's networks first. `device` is SB3's argument: the learner stays where
        its plan put it."""
        if exact_match is not True:
            raise ConfigError("exact_match: PEARL sets a learner's whole state (exact_match=True)")
        if isinstance(load_path_or_dict, dict):
            source = "parameters"
            if set(load_path_or_dict) != {"learner"}:
                raise ConfigError(f"{source}: expected get_parameters()'s dict {{'learner': ...}}, got keys "
                                  f"{sorted(load_path_or_dict)}")
            plain, arrays = split_state("learner", load_path_or_dict["learner"])
        else:
            source = _existing(load_path_or_dict)
            header, arrays = load_checkpoint(source)
            if not isinstance(header.get("learner"), dict):
                raise ConfigError(f"{source}: holds no learner state (expected a file agent.save wrote)")
            plain = header["learner"]
        check_state(source, "learner", plain, arrays, self.learner.state_dict(), 0)
        self.learner.load_state_dict(join_state("learner", plain, arrays))
        self.parts.policy.load(self.learner.policy_weights())
        self._policy_version = None

    def save_replay_buffer(self, path: str | Path) -> None:
        """SB3's save_replay_buffer: the replay table's contents alone, one atomic .npz (".npz" added
        to a path without a suffix; agent.save holds them too)."""
        plain, arrays = split_state("replay", self.replay.state_dict())
        save_checkpoint(_with_suffix(path), {"replay": plain}, arrays)

    def load_replay_buffer(self, path: str | Path, truncate_last_traj: bool = True) -> None:
        """SB3's load_replay_buffer: the contents save_replay_buffer (or agent.save) wrote, checked
        against this agent's table first. The updates go on at the ratio from the agent's counts,
        at once if the table holds learning_starts transitions (`Schedule.restarted`).
        `truncate_last_traj` has nothing to do here: PEARL's tables hold whole transitions only."""
        path = _existing(path)
        if not self.parts.replay_restartable:
            raise ConfigError(f"{path}: a replay server's or a ray run's table is not loaded from a file "
                              f"(load the agent whole with pearl.load)")
        header, arrays = load_checkpoint(path)
        if not isinstance(header.get("replay"), dict):
            raise ConfigError(f"{path}: holds no replay contents (expected a file save_replay_buffer wrote)")
        check_state(path, "replay", header["replay"], arrays, self.replay.state_dict(), self.config.replay.capacity)
        self.replay.load_state_dict(join_state("replay", header["replay"], arrays))
        self.parts.restart_schedule(self.env_steps, self.updates)

    @classmethod
    def load(cls, path: str | Path, env=None, device: str = "auto", **kwargs) -> "Agent":
        """SB3's `DQN.load(path, env=None)`: pearl.load, checking the checkpoint is this class's
        algorithm; `env` (an id, instance or factory with the same spaces) replaces the saved one."""
        unknown = sorted(kwargs.keys() - {"custom_objects", "print_system_info", "force_reset"})
        if unknown:
            raise ConfigError(f"{unknown[0]}: not a load option PEARL has (it takes path, env, device)")
        agent = load(path, env=env, device=None if device == "auto" else device)
        if cls.algo_name and agent.algo_name != cls.algo_name:
            raise ConfigError(f"{path}: a {agent.algo_name.upper()} checkpoint, not {cls.algo_name.upper()} "
                              f"(pearl.load loads either)")
        return agent


class DQN(Agent):
    """DQN (pearl/algos/dqn.py: double DQN, n-step returns, dueling head) on discrete actions.

    >>> agent = pearl.DQN(env="CartPole-v1", seed=1)
    >>> agent.train(50_000)
    >>> agent.evaluate(10)
    """

    algo_name, default_env = "dqn", "CartPole-v1"


class DDPG(Agent):
    """DDPG (pearl/algos/ddpg.py); defaults are Stable-Baselines3's: 400x300 actor and critic,
    batch 256, 1 update per env step, tau 0.005, lr 1e-3, Gaussian action noise 0.1."""

    algo_name, default_env = "ddpg", "Pendulum-v1"


class TD3(Agent):
    """TD3 (pearl/algos/td3.py): DDPG's defaults plus policy delay 2 and target smoothing 0.2 / 0.5."""

    algo_name, default_env = "td3", "Pendulum-v1"


class SAC(Agent):
    """SAC (pearl/algos/sac.py); defaults are Stable-Baselines3's: 256x256, lr 3e-4, batch 256,
    1 update per env step, automatic entropy coefficient starting at 1."""

    algo_name, default_env = "sac", "Pendulum-v1"


AGENTS = {cls.algo_name: cls for cls in (DQN, DDPG, TD3, SAC)}


def _policy_and_env(name: str, args: tuple, options: dict):
    """(SB3's policy name or None, the env) from `Agent(*args, **options)`."""
    policy = options.pop("policy", None)
    if args and is_policy(args[0]) and policy is None:
        policy, args = args[0], args[1:]
    if len(args) > 1:
        raise ConfigError(f"{name}: takes (env) or (policy, env) positionally, got {len(args) + (policy is not None)} "
                          f"arguments; give the others by name")
    if args and "env" in options:
        raise ConfigError("env: given twice (positionally and as env=)")
    return policy, args[0] if args else options.pop("env", None)


def _with_suffix(path: str | Path) -> Path:
    path = Path(path)
    return path if path.suffix else path.with_suffix(".npz")


def _existing(path: str | Path) -> Path:
    """`path`, or `path` with ".npz" where only that exists (saved without a suffix)."""
    path = Path(path)
    return _with_suffix(path) if not path.exists() and _with_suffix(path).is_file() else path


def _as_config(config) -> ExperimentConfig:
    """An agent's `config` argument as the config it gives."""
    if isinstance(config, ExperimentConfig):
        return config
    if isinstance(config, (str, os.PathLike)):
        return load_config(config)
    if isinstance(config, dict):
        return parse_config(config)
    raise ConfigError(f"config: expected an ExperimentConfig, a config file's path or a mapping of config "
                      f"sections, got {type(config).__name__}")


def _as_plan(plan) -> Plan | None:
    """An agent's `plan` argument as the plan it gives: a mapping is checked as a plan file's
    `plan` section."""
    if plan is None or isinstance(plan, Plan):
        return plan
    if isinstance(plan, (str, os.PathLike)):
        return load_plan(plan)
    if isinstance(plan, dict):
        return Plan.from_data({"plan": plan})
    raise ConfigError(f"plan: expected a Plan, a plan file's path or a mapping of plan fields, got "
                      f"{type(plan).__name__}")


def make_agent(config: ExperimentConfig | str | os.PathLike | dict,
               plan: Plan | str | os.PathLike | dict | None = None) -> Agent:
    """The agent that `config.algo` names (DQN, DDPG, TD3 or SAC), built from `config` (the
    object, its YAML file's path or a mapping of its sections) and `plan` (likewise)."""
    config = _as_config(config)
    return AGENTS[config.algo](config=config, plan=plan)


def load(path: str | Path, plan: Plan | str | os.PathLike | dict | None = None, env=None,
         device: str | None = None) -> Agent:
    """An agent restored from `agent.save(path)` (or a run directory's checkpoint.npz; a path
    saved without a suffix is found with ".npz"); `plan` (a Plan, its file's path or a mapping of
    its fields) replaces the saved plan (its unset fields keep the saved ones); `env` (an id, env
    instance or factory) the saved env and `device` the learner device. The checkpoint is checked
    against the parts its config builds before anything is loaded (pearl/checkpoint.py)."""
    plan = _as_plan(plan)
    path, header, arrays, config, saved = read_checkpoint(_existing(path))
    config, plan = (config, saved) if plan is None else replanned(config, saved, plan)
    saved_env = config.env
    if env is not None or device is not None:
        overrides = {} if device is None else {"runtime.device": device}
        if env is not None:
            env = vector_env(env)[0]
            # an id keeps the saved env_kwargs; a factory or instance takes its arguments itself
            overrides.update({"env": env} if isinstance(env, str) else {"env": register_source(env), "env_kwargs": {}})
        config = apply_overrides(config, overrides)
    try:
        agent = make_agent(config, plan)
    except ConfigError as err:  # the saved env or devices are not there: say which file holds them
        raise ConfigError(f"{path}: {err}") from None
    try:
        restore_state(path, header, arrays, agent.parts, agent.counters)
    except PearlError as err:  # the arrays' shapes follow the env's spaces: name the likely cause first
        if agent.config.env == saved_env:
            raise
        raise PearlError(f"env {agent.config.env}: its spaces do not fit the checkpoint's, saved with env "
                         f"{saved_env} ({err})") from None
    return agent


def resume(run_dir: str | Path, progress: bool = False, time_tasks: bool = False) -> tuple[Agent, dict]:
    """Continues the run in `run_dir` (after a crash, kill -9 or Ctrl-C) from its checkpoint to
    config.total_steps: weights, optimiser, replay contents, counters and RNG streams come back;
    episodes that were in progress start afresh, as do n-step transitions not yet inserted.
    Returns (agent, the train summary)."""
    run_path = Path(run_dir)
    if not (run_path / "checkpoint.npz").is_file():
        raise ConfigError(f"{run_path}: no checkpoint.npz to resume from")
    agent = load(run_path)
    if agent.env_steps >= agent.config.total_steps:
        raise ConfigError(f"{run_path}: the run already finished ({agent.env_steps} of "
                          f"{agent.config.total_steps} env steps)")
    return agent, agent.train(progress=progress, run_dir=run_path, time_tasks=time_tasks, resume=True)
