"""The Python API: `pearl.DQN(env=...)` (and DDPG, TD3, SAC), `.train()`, `.evaluate()`, `.act()`,
`.save()`, `pearl.load()`, `pearl.resume()`.

An agent is the user's verbs over the parts the builder made (pearl/build.py) and the counters a
runtime advances (pearl/runtime/counters.py); it keeps the run directory.
"""
from __future__ import annotations

import contextlib
import time
import warnings
from pathlib import Path

import numpy as np
import yaml

from pearl import runtime
from pearl.build import build
from pearl.checkpoint import agent_state, read_checkpoint, restore_state, save_checkpoint
from pearl.config import ExperimentConfig, resolve_config
from pearl.envs import episode_returns
from pearl.errors import ConfigError
from pearl.io import atomic_write_text, interrupts_deferred, owned_run_dir
from pearl.kernels.cpu import cpu_kernel_mode
from pearl.plan import Plan, replanned
from pearl.runlog import RunLog, plot_learning_curve, simulated_columns
from pearl.runtime.counters import Counters, Hooks, stop_on_interrupt
from pearl.schedule import MANY_ACTORS, crossed


def _delegated(holder: str, name: str) -> property:
    """agent.`name` is agent.`holder`.`name` (a part, or a counter), read and written there."""
    return property(lambda self: getattr(getattr(self, holder), name),
                    lambda self, value: setattr(getattr(self, holder), name, value))


class Agent:
    """An off-policy agent on a Gymnasium environment; subclasses name the algorithm."""

    algo_name, default_env = "", ""

    def __init__(self, env: str | None = None, *, config: ExperimentConfig | None = None,
                 plan: Plan | None = None, **options):
        self.parts = build(resolve_config(self.algo_name, env, config, options, self.default_env), plan)
        self.counters = Counters()
        self._warned_schedules = False  # train() past config.total_steps says so once

    config, plan, algo, learner, replay, policy, rng = (
        _delegated("parts", name) for name in ("config", "plan", "algo", "learner", "replay", "policy", "rng"))
    env_steps, updates, episodes, stop_requested, task_timer, recent_returns = (
        _delegated("counters", name) for name in ("env_steps", "updates", "episodes", "stop_requested",
                                                  "task_timer", "recent_returns"))
    actor_processes, actor_restarts, actor_lead = (
        _delegated("counters", name) for name in ("actor_processes", "actor_restarts", "actor_lead"))

    @property
    def actor(self):
        return self.parts.actor

    # -- the user's verbs ----------------------------------------------------------------------
    def train(self, steps: int | None = None, *, progress: bool = False, run_dir: str | Path | None = None,
              time_tasks: bool = False, resume: bool = False, on_round=None) -> dict:
        """Trains for `steps` env steps (default: what is left of config.total_steps).

        With `run_dir` (held for the call: a second run on it is refused, pearl.io.owned_run_dir),
        writes config.yaml, plan.yaml, metrics.csv, checkpoint.npz and learning_curve.png there,
        the checkpoint also every `log.checkpoint_interval` env steps and `log.checkpoint_seconds`
        of wall time (atomically; never one with non-finite weights). `resume`: continue that run
        directory's metrics.csv instead of starting it afresh (`pearl.resume`). `on_round(agent)`
        runs after each runtime round; setting `agent.stop_requested` there (or Ctrl-C) stops at
        the end of the round, writes the checkpoint and returns (`summary["interrupted"]`); a
        second Ctrl-C aborts at once, but not a checkpoint being written. Training past
        config.total_steps warns once. Returns a summary (steps/s, updates, final training
        return; `steps` and the rates count this call only).
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
        run_path = Path(run_dir) if run_dir is not None else None
        with owned_run_dir(run_path) if run_path is not None else contextlib.nullcontext():
            return self._train(steps, progress, run_path, time_tasks, resume, on_round)

    def _train(self, steps: int, progress: bool, run_path: Path | None, time_tasks: bool, resume: bool,
               on_round) -> dict:
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

        def after_round():
            previous, last[0] = last[0], counters.env_steps
            epsilon = self.algo.epsilon  # RunLog reads it only for a row it writes
            if crossed(previous, counters.env_steps, eval_every):
                log(counters, epsilon, eval_return=self.evaluate(config.eval.episodes)["mean"])
            else:
                log(counters, epsilon)
            if (crossed(previous, counters.env_steps, checkpoint_every)
                    or checkpoint_seconds and time.monotonic() - last_checkpoint[0] >= checkpoint_seconds):
                self.checkpoint(run_path / "checkpoint.npz")
                last_checkpoint[0] = time.monotonic()
            if on_round is not None:
                on_round(self)

        hooks = Hooks(after_round, lambda a, b: crossed(a, b, log_every) or crossed(a, b, eval_every),
                      counters.task_timer if time_tasks else None)
        start_steps, start_updates, started = counters.env_steps, counters.updates, time.perf_counter()
        counters.stop_requested = False
        try:
            with cpu_kernel_mode(), stop_on_interrupt(counters):
                runtime.get(self.plan.runtime).run(self.parts, counters, steps, hooks)
        finally:
            log.close()
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
        """Greedy returns over `episodes` fresh episodes on a separate env (the training env is untouched)."""
        family = self.parts.family
        policy = family.policy_factory(self.config, self.algo, "cpu")()  # a copy of the current weights
        policy.load(self.learner.policy_weights())
        returns = episode_returns(self.config.env, lambda obs: family.to_env(family.act(
            policy, np.asarray(obs, dtype=np.float32)[None], None, True, self.config)),
            episodes or self.config.eval.episodes, (self.config.seed + 1_000_003) if seed is None else seed)
        return {"mean": float(np.mean(returns)), "std": float(np.std(returns)), "returns": returns}

    def act(self, obs, deterministic: bool = True):
        """The action for one observation (or a batch of them): DQN's action index, a continuous
        algorithm's action in the env's bounds; with the policy's exploration if not deterministic
        (DQN: epsilon_final)."""
        obs = np.asarray(obs, dtype=np.float32)
        self.policy.load(self.learner.policy_weights())
        actions = self.parts.family.act(self.policy, obs.reshape(-1, self.parts.family.obs_dim), self.rng,
                                        deterministic, self.config)
        if obs.ndim != 1:
            return actions
        return int(actions[0]) if self.parts.family.action_field[1] == () else actions[0]

    def save(self, path: str | Path) -> None:
        """Config, plan, weights, optimizer state, replay contents and counters: one atomic .npz."""
        save_checkpoint(path, *agent_state(self.parts, self.counters))

    def checkpoint(self, path: str | Path) -> bool:
        """save(path) unless the weights went non-finite (then the previous checkpoint stays, and
        False is returned): a run's checkpoint is always one it can resume from."""
        if not np.isfinite(self.learner.policy_weights()).all():
            return False
        with interrupts_deferred():  # a Ctrl-C while it is written acts once it is complete
            self.save(path)
        return True

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


def make_agent(config: ExperimentConfig, plan: Plan | None = None) -> Agent:
    """The agent that `config.algo` names (DQN, DDPG, TD3 or SAC), built from `config`."""
    return AGENTS[config.algo](config=config, plan=plan)


def load(path: str | Path, plan: Plan | None = None) -> Agent:
    """An agent restored from `agent.save(path)` (or a run directory's checkpoint.npz); `plan`
    replaces the saved plan (its unset fields keep the saved ones). The checkpoint is checked
    against the parts its config builds before anything is loaded (pearl/checkpoint.py)."""
    path, header, arrays, config, saved = read_checkpoint(path)
    config, plan = (config, saved) if plan is None else replanned(config, saved, plan)
    try:
        agent = make_agent(config, plan)
    except ConfigError as err:  # the saved env or devices are not there: say which file holds them
        raise ConfigError(f"{path}: {err}") from None
    restore_state(path, header, arrays, agent.parts, agent.counters)
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
