"""The Python API: `pearl.DQN(env=...)`, `.train()`, `.evaluate()`, `.act()`, `.save()`, `pearl.load()`."""
from __future__ import annotations

import dataclasses
import functools
import math
import signal
import threading
import time
from collections import deque
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
import yaml

from pearl import runtime, schedule
from pearl.algos.dqn import DQN as DQNAlgorithm
from pearl.checkpoint import join_state, load_checkpoint, save_checkpoint, split_state
from pearl.config import CONTINUOUS_ALGOS, ExperimentConfig, apply_overrides, parse_config
from pearl.envs import discrete_spaces, make_env
from pearl.errors import ConfigError, TrainingDiverged
from pearl.io import atomic_write_text
from pearl.kernels.cpu import MLPLayout, QPolicy, cpu_kernel_mode
from pearl.plan import Plan, reconcile, replanned
from pearl.replay import RateLimiter, make_replay
from pearl.runlog import RunLog, plot_learning_curve
from pearl.runtime.actor import Actor, opencl_policy
from pearl.runtime.learners import make_learner
from pearl.runtime import crossed
from pearl.runtime.processes import ActorRecipe
from pearl.runtime.sequential import TaskTimer

_SECTIONS = ("dqn", *CONTINUOUS_ALGOS)
_TOP_LEVEL = {f.name for f in dataclasses.fields(ExperimentConfig)} - {"algo", "replay", *_SECTIONS}
_SECTION_FIELDS = {name: {f.name for f in dataclasses.fields(type(getattr(ExperimentConfig(), name)))}
                   for name in _SECTIONS}


def _overrides(kwargs: dict, algo: str = "dqn") -> dict:
    """Maps keyword arguments (lr=..., replay='prioritized', device='cuda') to dotted config keys."""
    out = {}
    for key, value in kwargs.items():
        if key in _TOP_LEVEL:
            out[key] = value
        elif key in _SECTION_FIELDS[algo]:
            out[f"{algo}.{key}"] = value
        elif key == "replay":
            out["replay.kind"] = value
        elif key in ("capacity", "buffer_size"):
            out["replay.capacity"] = value
        elif key == "checkpoint_interval":
            out["log.checkpoint_interval"] = value
        elif key in ("device", "learner_kernel", "envs_per_actor", "torch_threads"):
            out[f"runtime.{key}"] = value
        else:
            raise ConfigError(f"{key}: unknown {algo.upper()} option")
    return out


def resolve_config(algo: str, env: str | None, config: ExperimentConfig | None, options: dict,
                   default_env: str) -> ExperimentConfig:
    """The validated config of an agent built as `Agent(env, config=..., **options)`."""
    if config is None:
        config = ExperimentConfig(algo=algo, env=default_env)
    elif config.algo != algo:
        raise ConfigError(f"algo: the config is for {config.algo}, not {algo} (pearl.make_agent(config) builds the agent a config names)")
    if env is not None:
        options["env"] = env
    if options:
        return apply_overrides(config, _overrides(options, algo))
    return parse_config(config.to_dict())


@contextmanager
def _stop_on_interrupt(agent):
    """While training: the first Ctrl-C asks the runtime to stop at the end of its round (so the
    checkpoint is consistent), a second one interrupts at once. Only the main thread can take
    signals; elsewhere Ctrl-C keeps its default behaviour."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        if agent.stop_requested:
            raise KeyboardInterrupt
        agent.stop_requested = True

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


class Agent:
    """What every agent shares: the runtime's bookkeeping and the user's verbs (train, evaluate,
    save; `pearl.load`). A subclass builds config, plan, algo, learner, policy, replay and the
    actor, and says how it acts greedily (`_greedy_actor`)."""

    def _start_counters(self) -> None:
        self.rng = np.random.default_rng(self.config.seed)
        self._actor = None
        self.env_steps = self.updates = self.episodes = 0
        self.recent_returns: deque = deque(maxlen=100)
        self._loss_sum, self._loss_count = 0.0, 0
        self.task_timer = TaskTimer()
        self.stop_requested = False  # set by Ctrl-C during train(); the runtimes stop at a round's end
        self._actor_rng_state = None  # from a checkpoint, applied when the actor is built
        self.actor_processes = None  # the processes runtime's actors while it runs
        self.actor_restarts = self.actor_lead = 0  # of the last processes run

    def _set_plan(self, plan: Plan | None) -> tuple[str, str]:
        """Takes `plan` (default: the config's) after checking what the runtime can run of it;
        returns (replay device, learn device)."""
        self.config, self.plan = reconcile(self.config, plan)
        act = self.plan.device_of("act")
        if act != "cpu":
            if not (act.startswith("opencl:") and self.config.algo == "dqn"):
                raise ConfigError(f"plan.devices.act: {act} has no act kernel for {self.config.algo} "
                                  f"(act runs on cpu, or opencl:N for DQN)")
            from pearl.devices import opencl_context

            opencl_context(int(act.split(":")[1]))  # a missing device fails here, not in an actor
        replay_device = self._replay_device()
        learn_device = self.plan.device_of("learn")
        if learn_device.split(":")[0] not in ("cpu", "cuda"):
            raise ConfigError(f"plan.devices.learn: {learn_device} has no learner for {self.config.algo} "
                              f"(learn runs on cpu or cuda)")
        return replay_device, learn_device

    def _replay_device(self) -> str:
        """Where the priority structure lives: the plan's `sample` device. The tree is one object,
        so `insert` and `update_priorities` must name the same device."""
        devices = self.plan.devices
        for task in ("insert", "sample", "update_priorities"):
            device = devices[task]
            if device == "cpu":
                continue
            kind = self.config.replay.kind
            whole_table_on_gpu = device.startswith("cuda") and kind in ("uniform", "prioritized")
            if not (whole_table_on_gpu or (device.startswith(("opencl", "fpga"))
                                                            and kind == "prioritized")):
                raise ConfigError(f"plan.devices.{task}: {device} has no {task} kernel for "
                                  f"{kind} replay (prioritized replay runs on cpu, opencl:N, fpga:N "
                                  f"or cuda:N, uniform replay on cpu or cuda:N)")
        sample = devices["sample"]
        for task in ("insert", "update_priorities"):
            if devices[task] != sample:
                raise ConfigError(f"plan.devices.{task}: must be the sample device ({sample}), "
                                  f"where the priority tree lives; got {devices[task]}")
        if sample.startswith("cuda"):
            if self.config.algo != "dqn":  # the continuous learners read numpy batches
                raise ConfigError(f"plan.devices.sample: a replay table on {sample} feeds the DQN learner "
                                  f"only; {self.config.algo} keeps its replay on the cpu")
            if not torch.cuda.is_available():
                raise ConfigError(f"plan.devices.sample: {sample} requested but torch sees no CUDA GPU "
                                  f"(run `pearl devices`)")
            if devices["learn"] != sample:  # the batch is a set of tensors on that GPU
                raise ConfigError(f"plan.devices.learn: a replay on {sample} feeds a learner on the "
                                  f"same device; got {devices['learn']}")
        if sample.startswith("fpga") and self.plan.platform:
            return f"{sample}@{self.plan.platform}"  # the sampler's backend name carries the profile
        return sample

    @property
    def actor(self) -> Actor:
        """The actor of the in-process runtimes (built on first use; the processes runtime builds
        its own in each actor process from `actor_recipe()`)."""
        if self._actor is None:
            on_cpu = self.plan.device_of("act") == "cpu"  # else the recipe's policy on that device
            self._actor = self.actor_recipe().build(self.config.seed, self.policy if on_cpu else None)
            if not on_cpu:
                self._actor.policy.load(self.learner.policy_weights())
            if self._actor_rng_state is not None:  # a restored run's exploration stream goes on
                self._actor.rng.bit_generator.state = self._actor_rng_state
                self._actor_rng_state = None
        return self._actor

    def transition_fields(self) -> dict[str, tuple[np.dtype, tuple]]:
        """dtype and shape of one transition's value per field, in the replay's add() order."""
        obs = (np.dtype(np.float32), (self.obs_dim,))
        scalar = (np.dtype(np.float32), ())
        return {"obs": obs, "actions": self.action_field, "rewards": scalar, "next_obs": obs,
                "discounts": scalar}

    def fpga_device(self):
        """The FPGA driver the replay's priority tree runs on (kernels/fpga), or None."""
        return getattr(getattr(self.replay, "tree", None), "device", None)

    def _rate_limiter(self) -> RateLimiter:
        """The runtime's band of samples per insert (pearl.schedule.rate_limit, looked up at call
        time: autotune's runtime_accepts drives the same one)."""
        cfg, plan = self.config.algo_config, self.plan
        limit = schedule.rate_limit(plan.runtime, plan.batch_size, cfg.updates_per_step, cfg.learning_starts,
                                    cfg.n_step, plan.envs_per_actor, plan.actors)
        return RateLimiter(samples_per_insert=limit.samples_per_insert,
                           min_size_to_sample=limit.min_size_to_sample, error_buffer=limit.error_buffer)

    def record_episodes(self, finished: list[tuple[float, int]]) -> None:
        for episode_return, _ in finished:
            self.recent_returns.append(episode_return)
            self.episodes += 1

    def record_loss(self, loss: float) -> None:
        if not math.isfinite(loss):
            raise TrainingDiverged(f"loss became {loss} at update {self.updates + 1} (env step "
                                   f"{self.env_steps}): training stopped; the run's last checkpoint "
                                   f"is from before it")
        self._loss_sum += loss
        self._loss_count += 1

    def take_mean_loss(self) -> float | None:
        if not self._loss_count:
            return None
        mean = self._loss_sum / self._loss_count
        self._loss_sum, self._loss_count = 0.0, 0
        return mean

    def mean_return(self) -> float | None:
        return float(np.mean(self.recent_returns)) if self.recent_returns else None

    # -- the user's verbs ----------------------------------------------------------------------
    def train(self, steps: int | None = None, *, progress: bool = False, run_dir: str | Path | None = None,
              time_tasks: bool = False, resume: bool = False, on_round=None) -> dict:
        """Trains for `steps` env steps (default: what is left of config.total_steps).

        With `run_dir`, writes config.yaml, plan.yaml, metrics.csv, checkpoint.npz and
        learning_curve.png there, the checkpoint also every `log.checkpoint_interval` env steps
        (atomically; never one with non-finite weights). `resume`: continue that run directory's
        metrics.csv instead of starting it afresh (`pearl.resume`). Ctrl-C stops at the end of the
        current round, writes the checkpoint and returns (`summary["interrupted"]`); a second
        Ctrl-C aborts at once. `on_round(agent)` is called after each round of the runtime;
        setting `agent.stop_requested = True` in it stops the run at that round's end. Returns a
        summary (steps/s, updates, final training return).
        """
        steps = self.config.total_steps - self.env_steps if steps is None else steps
        if steps < 1:
            raise ConfigError(f"steps: expected a positive number of env steps, got {steps}")
        resume_after = self.env_steps if resume else None
        run_path = Path(run_dir) if run_dir is not None else None
        if run_path is not None:
            run_path.mkdir(parents=True, exist_ok=True)
            atomic_write_text(run_path / "config.yaml", yaml.safe_dump(self.config.to_dict(), sort_keys=False))
            self.plan.save(run_path / "plan.yaml")
        fpga = self.fpga_device()
        if fpga is not None and fpga.simulated:
            fpga_start = fpga.report()  # the device may be shared: report this run's share

            def simulated_seconds(agent):
                return {"fpga_simulated_s": None if agent is None
                        else round(fpga.simulated_s - fpga_start["simulated_s"], 6)}

            log = RunLog(run_path, self.config.log.interval, self.env_steps, self.env_steps + steps,
                         progress, label=fpga.label, extra=simulated_seconds, resume_after=resume_after)
        else:
            log = RunLog(run_path, self.config.log.interval, self.env_steps, self.env_steps + steps,
                         progress, resume_after=resume_after)
        eval_every = self.config.eval.interval
        checkpoint_every = self.config.log.checkpoint_interval if run_path is not None else 0

        last = [self.env_steps]  # env steps at the previous call: runtimes advance by rounds or runs

        def on_progress(agent):
            previous, last[0] = last[0], agent.env_steps
            if crossed(previous, agent.env_steps, eval_every):
                log(agent, eval_return=agent.evaluate(self.config.eval.episodes)["mean"])
            else:
                log(agent)
            if crossed(previous, agent.env_steps, checkpoint_every):
                agent.checkpoint(run_path / "checkpoint.npz")
            if on_round is not None:
                on_round(agent)

        start_steps, start_updates, started = self.env_steps, self.updates, time.perf_counter()
        self.stop_requested = False
        try:
            with cpu_kernel_mode(), _stop_on_interrupt(self):
                runtime.run(self.plan.runtime, self, steps, on_progress, time_tasks)
        finally:
            log.close()
        wall = time.perf_counter() - started
        summary = {
            "env_steps": self.env_steps, "updates": self.updates, "episodes": self.episodes,
            "wall_s": wall, "steps_per_s": (self.env_steps - start_steps) / wall,
            "updates_per_s": (self.updates - start_updates) / wall,
            "mean_return_100": self.mean_return(), "learner_kernel": self.learner.kernel,
            "interrupted": self.stop_requested,
        }
        if time_tasks:
            summary["task_us"] = self.task_timer.mean_us()
        if self.plan.runtime == "processes":
            summary["actor_restarts"] = self.actor_restarts
        if fpga is not None:
            summary["fpga"] = (fpga.report(since=fpga_start) if fpga.simulated
                               else {"simulated": False, "label": fpga.label})
        if run_path is not None:
            self.checkpoint(run_path / "checkpoint.npz")
            if self.config.log.plot and log.rows:
                plot_learning_curve(log.rows, run_path / "learning_curve.png",
                                    f"{self.config.algo.upper()} on {self.config.env} (seed {self.config.seed})")
        return summary

    def evaluate(self, episodes: int | None = None, seed: int | None = None) -> dict:
        """Greedy returns over `episodes` fresh episodes on a separate env (the training env is untouched)."""
        episodes = episodes or self.config.eval.episodes
        base_seed = (self.config.seed + 1_000_003) if seed is None else seed
        env = make_env(self.config.env, base_seed)
        greedy = self._greedy_actor(env)
        returns = []
        for episode in range(episodes):
            obs, _ = env.reset(seed=base_seed + episode)
            total, done = 0.0, False
            while not done:
                obs, reward, terminated, truncated, _ = env.step(greedy(np.asarray(obs, dtype=np.float32)))
                total += float(reward)
                done = terminated or truncated
            returns.append(total)
        env.close()
        return {"mean": float(np.mean(returns)), "std": float(np.std(returns)), "returns": returns}

    def save(self, path: str | Path) -> None:
        """Config, plan, weights, optimizer state, replay contents and counters: one atomic .npz."""
        self.learner.sync_to_algo()
        learner_plain, learner_arrays = split_state("learner", self.learner.state_dict())
        replay_plain, replay_arrays = split_state("replay", self.replay.state_dict())
        actor_rng = getattr(self._actor, "rng", None)
        header = {"config": self.config.to_dict(), "plan": self.plan.to_dict(),
                  "learner": learner_plain, "replay": replay_plain,
                  "counters": {"env_steps": self.env_steps, "updates": self.updates,
                               "episodes": self.episodes},
                  "rng": {"agent": self.rng.bit_generator.state,
                          "actor": None if actor_rng is None else actor_rng.bit_generator.state}}
        save_checkpoint(path, header, {**learner_arrays, **replay_arrays})

    def checkpoint(self, path: str | Path) -> bool:
        """save(path) unless the weights went non-finite (then the previous checkpoint stays, and
        False is returned): a run's checkpoint is always one it can resume from."""
        if not np.isfinite(self.learner.policy_weights()).all():
            return False
        self.save(path)
        return True

    def _load_state(self, header: dict, arrays: dict) -> None:
        counters = header["counters"]
        self.learner.load_state_dict(join_state("learner", header["learner"], arrays))
        self.replay.load_state_dict(join_state("replay", header["replay"], arrays))
        self.policy.load(self.learner.policy_weights())
        self.env_steps, self.updates, self.episodes = (counters["env_steps"], counters["updates"],
                                                       counters["episodes"])
        if "rng" in header:  # checkpoints from before RNG states were saved have none
            self.rng.bit_generator.state = header["rng"]["agent"]
            self._actor_rng_state = header["rng"]["actor"]


class DQN(Agent):
    """A DQN agent on a Gymnasium environment with a discrete action space.

    >>> agent = pearl.DQN(env="CartPole-v1", seed=1)
    >>> agent.train(50_000)
    >>> agent.evaluate(10)
    """

    def __init__(self, env: str | None = None, *, config: ExperimentConfig | None = None,
                 plan: Plan | None = None, **options):
        self.config = config = resolve_config("dqn", env, config, options, "CartPole-v1")
        probe = make_env(config.env)
        self.obs_dim, self.n_actions = discrete_spaces(probe, config.env)
        probe.close()
        replay_device, learn_device = self._set_plan(plan)
        config = self.config

        torch.set_num_threads(config.runtime.torch_threads)
        self.algo = DQNAlgorithm(self.obs_dim, self.n_actions, config.dqn, config.total_steps, config.seed)
        self.learner = make_learner(self.algo, self.plan.device_of("learn"), self.plan.learner_kernel)
        hidden = config.dqn.hidden
        layout = (MLPLayout([self.obs_dim, *hidden], dueling_actions=self.n_actions) if config.dqn.dueling
                  else MLPLayout([self.obs_dim, *hidden, self.n_actions]))
        self.policy = QPolicy(layout)
        self.policy.load(self.learner.policy_weights())
        replay_config = config.replay
        if replay_device.startswith("fpga"):  # the HLS tree on that FPGA, or its simulation
            replay_config = dataclasses.replace(replay_config, backend=replay_device)
        self.replay = make_replay(replay_config, self.obs_dim, total_steps=config.total_steps,
                                  rate_limiter=self._rate_limiter(), device=replay_device)
        self._start_counters()

    # -- parts the runtime drives --------------------------------------------------------------
    action_field = (np.dtype(np.int64), ())

    def actor_recipe(self) -> ActorRecipe:
        cfg = self.config
        act = self.plan.device_of("act")
        policy = (functools.partial(QPolicy, self.policy.layout) if act == "cpu" else
                  functools.partial(opencl_policy, self.policy.layout, int(act.split(":")[1])))
        return ActorRecipe(Actor, policy,
                           dict(env_id=cfg.env, n_envs=self.plan.envs_per_actor, n_actions=self.n_actions,
                                n_step=cfg.dqn.n_step, gamma=cfg.dqn.gamma))

    def _greedy_actor(self, env):
        """obs -> the env's action for the greedy policy, on a copy of the current weights."""
        policy = QPolicy(self.policy.layout)
        policy.load(self.learner.policy_weights())
        start = int(getattr(env.action_space, "start", 0))
        return lambda obs: int(policy.greedy(obs[None])[0]) + start

    def act(self, obs, deterministic: bool = True) -> int | np.ndarray:
        """The agent's action for one observation (or a batch); exploring with epsilon_final if not deterministic."""
        obs = np.asarray(obs, dtype=np.float32)
        batch = obs.reshape(-1, self.obs_dim)
        self.policy.load(self.learner.policy_weights())
        actions = self.policy.greedy(batch)
        if not deterministic:
            explore = self.rng.random(len(actions)) < self.config.dqn.exploration.final
            actions[explore] = self.rng.integers(self.n_actions, size=int(explore.sum()))
        return int(actions[0]) if obs.ndim == 1 else actions


def agent_class(algo: str) -> type[Agent]:
    if algo == "dqn":
        return DQN
    from pearl import continuous

    return {"ddpg": continuous.DDPG, "td3": continuous.TD3, "sac": continuous.SAC}[algo]


def make_agent(config: ExperimentConfig, plan: Plan | None = None) -> Agent:
    """The agent that `config.algo` names (DQN, DDPG, TD3 or SAC), built from `config`."""
    return agent_class(config.algo)(config=config, plan=plan)


def load(path: str | Path, plan: Plan | None = None) -> Agent:
    """An agent restored from `agent.save(path)` (or a run directory's checkpoint.npz)."""
    path = Path(path)
    if path.is_dir():
        path = path / "checkpoint.npz"
    header, arrays = load_checkpoint(path)
    config = parse_config(header["config"], str(path))
    saved = Plan.from_data({"plan": header["plan"]}, str(path))
    config, plan = (config, saved) if plan is None else replanned(config, saved, plan)
    agent = make_agent(config, plan)
    agent._load_state(header, arrays)
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
