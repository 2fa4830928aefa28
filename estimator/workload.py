"""What a training run asks of the hardware, independent of the plan: network sizes, replay
config and replay ratio. The estimator costs a plan for one Workload.
"""
from __future__ import annotations

from dataclasses import dataclass

from pearl.estimator.signatures import FLOAT_BYTES, mlp_parameter_count

REPLAY_KINDS = ("uniform", "prioritized", "amper")


@dataclass(frozen=True)
class Workload:
    env: str
    obs_dim: int
    n_actions: int
    hidden: tuple[int, ...]
    replay_kind: str  # the config's kind; the mapper may try others it allows
    capacity: int
    fanout: int
    updates_per_step: float
    learning_starts: int
    double: bool = True
    dueling: bool = False

    @property
    def sizes(self) -> list[int]:
        return [self.obs_dim, *self.hidden, self.n_actions]

    @property
    def n_params(self) -> int:
        return mlp_parameter_count(self.sizes)

    @property
    def transition_bytes(self) -> int:
        """obs + next_obs + action + reward + discount, as the replay stores and ships them."""
        return (2 * self.obs_dim + 3) * FLOAT_BYTES

    def key(self) -> str:
        """What the measured task costs depend on (pearl profile caches one table per key)."""
        return (f"{self.env}|h{'x'.join(map(str, self.hidden))}|cap{self.capacity}|k{self.fanout}|"
                f"u{self.updates_per_step:g}|{'double' if self.double else 'single'}"
                f"{'|dueling' if self.dueling else ''}")


def workload_from_config(config) -> Workload:
    """The Workload of a DQN ExperimentConfig (its env is probed for the spaces' sizes)."""
    from pearl.envs import discrete_spaces, make_env
    from pearl.errors import ConfigError

    if config.algo != "dqn":
        raise ConfigError(f"algo: autotune models DQN today, not {config.algo}")
    probe = make_env(config.env)
    obs_dim, n_actions = discrete_spaces(probe, config.env)
    probe.close()
    dqn = config.dqn
    return Workload(env=config.env, obs_dim=obs_dim, n_actions=n_actions, hidden=tuple(dqn.hidden),
                    replay_kind=config.replay.kind, capacity=config.replay.capacity,
                    fanout=config.replay.fanout, updates_per_step=dqn.updates_per_step,
                    learning_starts=dqn.learning_starts, double=dqn.double, dueling=dqn.dueling)
