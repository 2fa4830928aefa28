"""What a training run asks of the hardware, independent of the plan: the algorithm, network sizes,
replay config and replay ratio. The estimator costs a plan for one Workload.

DQN's networks are one Q MLP (and its target). The continuous algorithms (pearl/continuous.py)
have an actor (the policy the actor process runs and sync_weights ships) and one critic (DDPG) or
twin critics (TD3, SAC) on [obs, action], all with the config's hidden layers; `n_actions` is then
the Box action's size, and a transition stores the action as that many float32 values.
"""
from __future__ import annotations

from dataclasses import dataclass

from pearl.estimator.signatures import (FLOAT_BYTES, Cost, adam_cost, mlp_backward_cost, mlp_forward_cost,
                                        mlp_input_gradient_cost, mlp_parameter_count, soft_update_cost)
from pearl.config import CONTINUOUS_ALGOS

REPLAY_KINDS = ("uniform", "prioritized", "amper")
# FLOPs per action component of the policy's head on act: tanh, the Gaussian noise and the clip
# (DDPG, TD3); exp of log_std, the scaled noise, the add and tanh (SAC)
HEAD_FLOPS = {"ddpg": 3, "td3": 3, "sac": 5}


@dataclass(frozen=True)
class Workload:
    env: str
    obs_dim: int
    n_actions: int  # DQN: discrete actions; continuous algorithms: the action vector's size
    hidden: tuple[int, ...]
    replay_kind: str  # the config's kind; the mapper may try others it allows
    capacity: int
    fanout: int
    updates_per_step: float
    learning_starts: int
    double: bool = True
    dueling: bool = False
    algo: str = "dqn"
    policy_delay: int = 1  # TD3: the actor and the targets step every policy_delay-th update

    @property
    def continuous(self) -> bool:
        return self.algo in CONTINUOUS_ALGOS

    @property
    def sizes(self) -> list[int]:
        """The policy network: what the actor runs and sync_weights ships (SAC's outputs are the
        mean and log std of each action component)."""
        outputs = 2 * self.n_actions if self.algo == "sac" else self.n_actions
        return [self.obs_dim, *self.hidden, outputs]

    @property
    def critic_sizes(self) -> list[int]:
        """One critic of a continuous algorithm: Q([obs, action])."""
        return [self.obs_dim + self.n_actions, *self.hidden, 1]

    @property
    def critics(self) -> int:
        return 2 if self.algo in ("td3", "sac") else 1

    @property
    def n_params(self) -> int:
        return mlp_parameter_count(self.sizes)

    @property
    def transition_bytes(self) -> int:
        """obs + next_obs + action + reward + discount, as the replay stores and ships them."""
        return (2 * self.obs_dim + (self.n_actions if self.continuous else 1) + 2) * FLOAT_BYTES

    @property
    def learner_kernels(self) -> tuple[str, ...]:
        """The cpu learner kernels the agent builds for this workload (pearl/api.py,
        pearl/continuous.py): the fused one has no dueling head and no SAC."""
        fused = self.algo in ("ddpg", "td3") or (self.algo == "dqn" and not self.dueling)
        return ("fused", "torch") if fused else ("torch",)

    @property
    def replay_kinds(self) -> tuple[str, ...]:
        """Replay kinds the config accepts: the continuous algorithms sample uniformly."""
        return ("uniform",) if self.continuous else REPLAY_KINDS

    def act_cost(self, envs: int) -> Cost:
        """The policy's inference for one act round of `envs` observations."""
        head = Cost(flops=envs * self.n_actions * HEAD_FLOPS[self.algo]) if self.continuous else Cost()
        return mlp_forward_cost(self.sizes, envs) + head

    def learn_cost(self, batch: int, kernel: str) -> Cost:
        """One update on a batch, averaged over updates (TD3's delayed actor step counts
        1 / policy_delay of itself). The kernels do the same products, but the fused one back-
        propagates the actor's loss into the critic's action columns only (the autograd path
        into all of its inputs); neither takes the frozen critic's weight gradients there."""
        if not self.continuous:
            forwards = 3 if self.double else 2  # Q(s), Q_target(s'), and Q(s') for double DQN
            return (mlp_forward_cost(self.sizes, batch) * forwards + mlp_backward_cost(self.sizes, batch)
                    + adam_cost(self.n_params))
        actor, critic, n = self.sizes, self.critic_sizes, self.critics
        critic_params, actor_params = mlp_parameter_count(critic), self.n_params
        into_critic = mlp_input_gradient_cost(critic, batch, self.n_actions if kernel == "fused" else None)
        # the critic step: the next action (target actor; SAC: the policy's sample), the target
        # critics on it, the critics on (s, a), their backward and one Adam over all of them
        critic_step = (mlp_forward_cost(actor, batch) + mlp_forward_cost(critic, batch) * (2 * n)
                       + mlp_backward_cost(critic, batch) * n + adam_cost(n * critic_params))
        if self.algo == "sac":  # the actor step through both critics; the critics' targets only
            actor_step = (mlp_forward_cost(actor, batch) + (mlp_forward_cost(critic, batch) + into_critic) * n
                          + mlp_backward_cost(actor, batch) + adam_cost(actor_params))
            return critic_step + actor_step + soft_update_cost(n * critic_params)
        # DDPG / TD3: the actor step through the first critic, then every target
        actor_step = (mlp_forward_cost(actor, batch) + mlp_forward_cost(critic, batch) + into_critic
                      + mlp_backward_cost(actor, batch) + adam_cost(actor_params)
                      + soft_update_cost(n * critic_params + actor_params))
        return critic_step + actor_step * (1.0 / self.policy_delay)

    def key(self) -> str:
        """What the measured task costs depend on (pearl profile caches one table per key)."""
        shape = (f"{self.env}|h{'x'.join(map(str, self.hidden))}|cap{self.capacity}|k{self.fanout}|"
                 f"u{self.updates_per_step:g}")
        if self.continuous:
            return f"{self.algo}|{shape}" + (f"|delay{self.policy_delay}" if self.algo == "td3" else "")
        return f"{shape}|{'double' if self.double else 'single'}{'|dueling' if self.dueling else ''}"


def workload_of(config, obs_dim: int, n_actions: int) -> Workload:
    """The Workload of an ExperimentConfig whose env has these spaces' sizes."""
    cfg = config.algo_config
    return Workload(env=config.env, obs_dim=obs_dim, n_actions=n_actions, hidden=tuple(cfg.hidden),
                    replay_kind=config.replay.kind, capacity=config.replay.capacity,
                    fanout=config.replay.fanout, updates_per_step=cfg.updates_per_step,
                    learning_starts=cfg.learning_starts, double=getattr(cfg, "double", False),
                    dueling=getattr(cfg, "dueling", False), algo=config.algo,
                    policy_delay=getattr(cfg, "policy_delay", 1))


def workload_from_config(config) -> Workload:
    """The Workload of an ExperimentConfig (its env is probed for the spaces' sizes)."""
    from pearl.envs import box_spaces, discrete_spaces, make_env

    probe = make_env(config.env)
    try:
        if config.algo in CONTINUOUS_ALGOS:
            obs_dim, n_actions, _, _ = box_spaces(probe, config.env, config.algo)
        else:
            obs_dim, n_actions = discrete_spaces(probe, config.env)
    finally:
        probe.close()
    return workload_of(config, obs_dim, n_actions)
