"""What a training run asks of the hardware, independent of the plan: the algorithm, network sizes,
replay config and replay ratio. The estimator costs a plan for one Workload.

The FLOPs and bytes of act and learn are the algorithm's own cost spec (pearl/algos/*.py,
`act_cost` / `learn_cost` from shapes alone); this module only hands it the shapes. DQN's
networks are one Q MLP (and its target). The continuous algorithms have an actor (the policy the
actor process runs and sync_weights ships) and one critic (DDPG) or twin critics (TD3, SAC) on
[obs, action], all with the config's hidden layers; `n_actions` is then the Box action's size,
and a transition stores the action as that many float32 values.
"""
from __future__ import annotations

from dataclasses import dataclass

from pearl.algos import algorithm_class
from pearl.config import BF16_ALGOS, CONTINUOUS_ALGOS
from pearl.estimator.signatures import FLOAT_BYTES, Cost, mlp_parameter_count
from pearl.kernels.cpu.mlp import MLPLayout, bf16_layers

REPLAY_KINDS = ("uniform", "prioritized", "amper")


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
    optimizer: str = "adam"  # DQN's dqn.optimizer.kind; the continuous algorithms step Adam
    algo: str = "dqn"
    policy_delay: int = 1  # TD3: the actor and the targets step every policy_delay-th update
    # the rest changes what a profiled task costs, not the FLOPs: the n-step buffer sits in act ->
    # insert, the config's batch is the one `pearl profile` measures, and the sum
    # tree's kernels change every call's time
    n_step: int = 1
    batch_size: int = 64
    replay_backend: str = "auto"

    # image observations (pearl/nets.py): the observation's (C, H, W), its bytes per element and
    # the conv layers before the `hidden` fc layers; () for flat observations
    obs_shape: tuple[int, ...] = ()
    obs_itemsize: int = 4
    conv: tuple[tuple[int, int, int], ...] = ()
    frame_stack: int = 0  # replay.frame_stack: the actors write step records of one frame each

    @property
    def image(self) -> bool:
        return bool(self.conv)

    def _image_shapes(self) -> dict:
        """The cost spec's keyword for an image workload: the conv input and layers."""
        shape = self.obs_shape if len(self.obs_shape) == 3 else (1, *self.obs_shape)
        return {"image": (shape, self.conv, self.obs_itemsize)} if self.image else {}

    @property
    def continuous(self) -> bool:
        return self.algo in CONTINUOUS_ALGOS

    @property
    def algorithm(self) -> type:
        """The algorithm class whose cost spec this workload is (pearl/algos)."""
        return algorithm_class(self.algo)

    @property
    def sizes(self) -> list[int]:
        """The policy network: what the actor runs and sync_weights ships."""
        return self.algorithm.policy_shape(self.obs_dim, self.n_actions, self.hidden)

    @property
    def n_params(self) -> int:
        if self.image:
            return self.algorithm.image_parameter_count(self.n_actions, self.hidden, **self._image_shapes())
        return mlp_parameter_count(self.sizes)

    @property
    def transition_bytes(self) -> int:
        """obs + next_obs + action + reward + discount, as the replay stores and ships them."""
        return (2 * self.obs_dim * self.obs_itemsize // FLOAT_BYTES + (self.n_actions if self.continuous else 1)
                + 2) * FLOAT_BYTES

    @property
    def insert_bytes(self) -> int:
        """What an actor writes per env step (its ring, a replay server's wire, the table's insert):
        the transition, or for a frame table the step record: the stream id, the newest frame of
        obs and of next obs, action, reward and how the step ended."""
        if not self.frame_stack:
            return self.transition_bytes
        frame = self.obs_dim * self.obs_itemsize // self.frame_stack
        action = self.n_actions * FLOAT_BYTES if self.continuous else 8  # float32 vector, or an int64
        return 2 * frame + 8 + action + FLOAT_BYTES + 2

    @property
    def learner_kernels(self) -> tuple[str, ...]:
        """The cpu learner kernels the agent builds for this workload (pearl/api.py,
        pearl/continuous.py): the fused one has no dueling head, no CNN and steps only Adam."""
        fused = self.continuous or not (self.dueling or self.optimizer != "adam")
        return ("fused", "torch") if fused and not self.image else ("torch",)

    @property
    def fused_precisions(self) -> tuple[str, ...]:
        """The product precisions the algorithm's fused learner has (runtime.learner_precision):
        DQN's runs bfloat16 products in its inner hidden layers (pearl.kernels.cpu.mlp.bf16_layers),
        so only a Q-network with one of them has a bf16 to offer."""
        if self.algo not in BF16_ALGOS:
            return ("fp32",)
        if self.algo == "dqn" and not bf16_layers(MLPLayout(self.sizes).shapes, self.batch_size).any():
            return ("fp32",)
        return ("fp32", "bf16")

    @property
    def replay_kinds(self) -> tuple[str, ...]:
        """Replay kinds the config accepts: the continuous algorithms sample uniformly."""
        return ("uniform",) if self.continuous else REPLAY_KINDS

    def act_cost(self, envs: int) -> Cost:
        """The policy's inference for one act round of `envs` observations."""
        return self.algorithm.act_cost(self.obs_dim, self.n_actions, self.hidden, envs, **self._image_shapes())

    def learn_cost(self, batch: int, kernel: str) -> Cost:
        """One update on a batch with the learner kernel `kernel` (fused | torch)."""
        algorithm = self.algorithm
        return algorithm.learn_cost(self.obs_dim, self.n_actions, self.hidden, batch, kernel,
                                    **{name: getattr(self, name) for name in algorithm.COST_OPTIONS},
                                    **self._image_shapes())

    def key(self) -> str:
        """Everything of the workload a measured task cost depends on (pearl profile caches one
        table per key; the machine, CPU model included, is the cache file's fingerprint)."""
        shape = (f"{self.env}|obs{self.obs_dim}|act{self.n_actions}|h{'x'.join(map(str, self.hidden))}|"
                 f"f{8 * FLOAT_BYTES}|cap{self.capacity}|k{self.fanout}|u{self.updates_per_step:g}|n{self.n_step}|"
                 f"b{self.batch_size}|{self.replay_kind}|{self.replay_backend}")
        if self.continuous:
            return f"{self.algo}|{shape}" + (f"|delay{self.policy_delay}" if self.algo == "td3" else "")
        image = (f"|img{'x'.join(map(str, self.obs_shape))}|conv{self.conv}" if self.image else "") + (
            f"|frames{self.frame_stack}" if self.frame_stack else "")
        optimizer = f"|{self.optimizer}" if self.optimizer != "adam" else ""
        return f"{shape}|{'double' if self.double else 'single'}{'|dueling' if self.dueling else ''}{optimizer}{image}"


def workload_of(config, obs_dim: int, n_actions: int, obs_shape: tuple = (), obs_itemsize: int = 4) -> Workload:
    """The Workload of an ExperimentConfig whose env has these spaces' sizes (`obs_shape`: an
    image's (C, H, W) or (H, W), whose networks begin with the config's conv layers)."""
    cfg = config.algo_config
    image = dict(obs_shape=tuple(obs_shape), obs_itemsize=obs_itemsize,
                 conv=tuple(map(tuple, cfg.conv))) if len(obs_shape) > 1 else {}
    return Workload(env=config.env, obs_dim=obs_dim, n_actions=n_actions, hidden=tuple(cfg.hidden),
                    replay_kind=config.replay.kind, capacity=config.replay.capacity,
                    fanout=config.replay.fanout, updates_per_step=cfg.updates_per_step,
                    learning_starts=cfg.learning_starts, double=getattr(cfg, "double", False),
                    dueling=getattr(cfg, "dueling", False), algo=config.algo,
                    optimizer=cfg.optimizer.kind if hasattr(cfg, "optimizer") else "adam",
                    policy_delay=getattr(cfg, "policy_delay", 1), n_step=cfg.n_step, batch_size=cfg.batch_size,
                    replay_backend=config.replay.backend, frame_stack=config.replay.frame_stack, **image)


def workload_from_config(config) -> Workload:
    """The Workload of an ExperimentConfig (its env is probed for the spaces' sizes)."""
    from pearl.envs import box_spaces, discrete_spaces, make_env, observation_layout

    probe = make_env(config.env)
    try:
        if config.algo in CONTINUOUS_ALGOS:
            obs_dim, n_actions = box_spaces(probe, config.env, config.algo)
        else:
            obs_dim, n_actions = discrete_spaces(probe, config.env)
        obs_shape, obs_dtype, _ = observation_layout(probe, config.env, config.algo)
    finally:
        probe.close()
    return workload_of(config, obs_dim, n_actions, obs_shape, obs_dtype.itemsize)
