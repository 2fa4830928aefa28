"""Deep Deterministic Policy Gradient (Lillicrap et al. 2016), as Stable-Baselines3 and CleanRL run
it: a deterministic tanh actor mu, one critic Q, target copies of both, Gaussian action noise.

The algorithm, top to bottom. Actions live in [-1, 1]^d here; the runtime scales them to the
environment's bounds, and back, at the environment's door.

    for each env step t:
        a_t = uniform in [-1, 1]^d during the first learning_starts steps, else
              clip(mu(s_t) + N(0, action_noise^2), -1, 1)                                     # act
        store (s_t, a_t, R_t^(n), s_{t+n}, gamma^n * not_terminated)                          # insert
        every 1/replay_ratio steps:
            sample a batch                                                                    # sample
            y = R + discount * Q'(s', mu'(s'))
            critic: one Adam step on mean((Q(s, a) - y)^2)
            actor:  one Adam step on -mean(Q(s, mu(s)))      (Q as just updated, held fixed)
            targets: theta' <- tau theta + (1 - tau) theta'                                   # learn

Which device or kernel runs each line is the Plan's business, not this file's. TD3 (td3.py)
changes three lines of this; SAC (sac.py) replaces the actor.
"""
from __future__ import annotations

import copy
from contextlib import contextmanager

import torch
from torch import nn
from torch.nn import functional as F

from pearl.contracts import Algorithm, implements
from pearl.estimator.signatures import (Cost, adam_cost, conv_forward_cost, conv_output_size, conv_parameter_count,
                                        encoder_learn_cost, mlp_backward_cost, mlp_forward_cost,
                                        mlp_input_gradient_cost, mlp_parameter_count, soft_update_cost)
from pearl.nets import SharedEncoder, adam


def mlp(sizes: list[int]) -> nn.Sequential:
    """Linear layers with ReLU between them and none after the last: the layout of
    kernels/cpu/mlp.py (weight, bias per layer in `parameters()` order), so the actor's numpy copy
    reads the same flat vector."""
    layers: list[nn.Module] = []
    for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(nn.Linear(n_in, n_out))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DeterministicActor(nn.Module):
    """mu(s) = tanh(MLP(s)), in [-1, 1]^d."""

    def __init__(self, obs_dim: int, action_dim: int, hidden: list[int]):
        super().__init__()
        self.net = mlp([obs_dim, *hidden, action_dim])

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.net(obs))


class Critic(nn.Module):
    """Q(s, a) = MLP([s, a]), one value per row."""

    def __init__(self, obs_dim: int, action_dim: int, hidden: list[int]):
        super().__init__()
        self.net = mlp([obs_dim + action_dim, *hidden, 1])

    def forward(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([obs, actions], dim=1)).squeeze(1)


def soft_update(target: nn.Module, online: nn.Module, tau: float) -> None:
    """theta' <- tau theta + (1 - tau) theta' for every parameter, in one fused call."""
    with torch.no_grad():
        torch._foreach_lerp_(list(target.parameters()), list(online.parameters()), tau)


@implements(Algorithm)
class DDPG:
    """Networks, losses and update rule. `update` works on tensors of whichever device they are on."""

    name, family = "ddpg", "continuous"
    policy_kind = "deterministic"  # tanh(MLP(s)) explored with Gaussian noise
    critic_class = Critic

    def __init__(self, obs_dim: int, action_dim: int, config, seed: int = 0,
                 obs_shape: tuple[int, ...] | None = None, obs_scale: float = 1.0):
        """`obs_shape` (C, H, W) or (H, W): image observations, which a conv encoder shared by
        actor and critic turns into the features both MLPs take (pearl/nets.py SharedEncoder)."""
        self.obs_dim, self.action_dim, self.config = obs_dim, action_dim, config
        torch.manual_seed(seed)
        self.encoder = SharedEncoder(obs_shape, config.conv, obs_scale) if obs_shape else None
        features = self.encoder.features if self.encoder else obs_dim
        self.actor = DeterministicActor(features, action_dim, config.hidden)
        self.critic = self.critic_class(features, action_dim, config.hidden)
        self.actor_target = copy.deepcopy(self.actor).requires_grad_(False)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.actor_optimizer = adam(self.actor, config.lr)
        self.critic_optimizer = adam(with_encoder(self.critic, self.encoder), config.lr)
        self.updates = 0

    # -- act -----------------------------------------------------------------------------------
    def epsilon(self, step: int) -> float:
        """Probability of a uniformly random action at env step `step`: 1 during the warm-up, then 0
        (the policy explores with its own noise)."""
        return 1.0 if step < self.config.learning_starts else 0.0

    def exploration_noise(self) -> float:
        """Std of the Gaussian noise the actor adds to mu(s), in [-1, 1] action units."""
        return self.config.action_noise

    # -- learn ---------------------------------------------------------------------------------
    def td_target(self, rewards, next_obs, discounts) -> torch.Tensor:
        with torch.no_grad():
            return rewards + discounts * self.critic_target(next_obs, self.actor_target(next_obs))

    def critic_loss(self, obs, actions, rewards, next_obs, discounts) -> torch.Tensor:
        return F.mse_loss(self.critic(obs, actions), self.td_target(rewards, next_obs, discounts))

    def actor_loss(self, obs) -> torch.Tensor:
        return -self.critic(obs, self.actor(obs)).mean()

    def features(self, obs, next_obs):
        """Image observations: the shared encoder's features of obs (trained by the critic's loss)
        and its target's of next_obs; flat observations as they are."""
        return (obs, next_obs) if self.encoder is None else self.encoder.encode(obs, next_obs)

    def update(self, obs, actions, rewards, next_obs, discounts) -> float:
        """One critic step, one actor step, one target update. Returns the critic loss."""
        obs, next_obs = self.features(obs, next_obs)
        critic_loss = self.critic_loss(obs, actions, rewards, next_obs, discounts)
        step(self.critic_optimizer, critic_loss)
        with frozen(self.critic):
            step(self.actor_optimizer, self.actor_loss(obs.detach()))  # the actor does not train the encoder
        soft_update(self.critic_target, self.critic, self.config.tau)
        soft_update(self.actor_target, self.actor, self.config.tau)
        if self.encoder:
            self.encoder.soft_update(self.config.tau)
        self.updates += 1
        return critic_loss.item()

    # -- what the runtime needs to know ------------------------------------------------------------
    def policy_network(self) -> nn.Module:
        """The network whose flat weights the actor's copy runs (kernels/cpu/mlp.py; for images
        the encoder, then the MLP: pearl/nets.py)."""
        return self.encoder.policy(self.actor.net) if self.encoder else self.actor.net

    def policy_sizes(self) -> list[int]:
        """The actor MLP's widths (on image observations it takes the encoder's features)."""
        return self.policy_shape(self.encoder.features if self.encoder else self.obs_dim, self.action_dim,
                                 self.config.hidden)

    def networks(self) -> dict[str, nn.Module]:
        return {"actor": self.actor, "critic": self.critic,
                "actor_target": self.actor_target, "critic_target": self.critic_target, **encoders(self.encoder)}

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {"actor": self.actor_optimizer, "critic": self.critic_optimizer}

    def n_params(self) -> int:
        return sum(p.numel() for p in self.policy_network().parameters())

    # -- cost spec: FLOPs and bytes from shapes alone (estimator/workload.py asks for them) --------
    # `image`: (input (C, H, W), conv layers, bytes per input element): the shared encoder's costs
    # beside those of the MLPs, which take its features instead of obs_dim inputs
    critics = 1  # critic networks on [s, a]
    HEAD_FLOPS = 3  # per action component on act: tanh, the Gaussian noise and the clip
    COST_OPTIONS: tuple[str, ...] = ()  # config options learn_cost reads beside the shapes

    @staticmethod
    def policy_shape(obs_dim: int, action_dim: int, hidden) -> list[int]:
        """The actor MLP's widths: what the actor runs and sync_weights ships."""
        return [obs_dim, *hidden, action_dim]

    @classmethod
    def act_cost(cls, obs_dim: int, action_dim: int, hidden, envs: int, image=None) -> Cost:
        """The policy's inference for one act round of `envs` observations, its head included."""
        encoder = Cost()
        if image is not None:
            encoder, obs_dim = conv_forward_cost(*image[:2], envs, image[2]), conv_output_size(*image[:2])
        return (encoder + mlp_forward_cost(cls.policy_shape(obs_dim, action_dim, hidden), envs)
                + Cost(flops=envs * action_dim * cls.HEAD_FLOPS))

    @classmethod
    def image_parameter_count(cls, action_dim: int, hidden, image) -> int:
        """The acting network's parameters for image observations: encoder and actor MLP."""
        return (conv_parameter_count(*image[:2])
                + mlp_parameter_count(cls.policy_shape(conv_output_size(*image[:2]), action_dim, hidden)))

    @classmethod
    def learn_cost(cls, obs_dim: int, action_dim: int, hidden, batch: int, kernel: str,
                   policy_delay: int = 1, image=None) -> Cost:
        """One update on a batch, averaged over updates (TD3's delayed actor step and targets
        count 1 / policy_delay of themselves). The learner kernels do the same products, but the
        fused one back-propagates the actor's loss into the critic's action columns only (the
        autograd path into all of its inputs); neither takes the frozen critic's weight
        gradients there."""
        obs_dim = obs_dim if image is None else conv_output_size(*image[:2])
        actor, critic = cls.policy_shape(obs_dim, action_dim, hidden), [obs_dim + action_dim, *hidden, 1]
        into_critic = mlp_input_gradient_cost(critic, batch, action_dim if kernel == "fused" else None)
        # the actor step through the first critic, then every target
        actor_step = (mlp_forward_cost(actor, batch) + mlp_forward_cost(critic, batch) + into_critic
                      + mlp_backward_cost(actor, batch) + adam_cost(mlp_parameter_count(actor))
                      + soft_update_cost(cls.critics * mlp_parameter_count(critic) + mlp_parameter_count(actor)))
        return (critic_step_cost(actor, critic, cls.critics, batch) + actor_step * (1.0 / policy_delay)
                + image_encoder_cost(image, batch))


def image_encoder_cost(image, batch: int) -> Cost:
    """The shared image encoder's part of an update (none for flat observations)."""
    return Cost() if image is None else encoder_learn_cost(image[0], image[1], batch, image[2])


def with_encoder(critic: nn.Module, encoder) -> nn.Module:
    """What the critic's optimizer steps: the critic, and the shared image encoder if any."""
    return critic if encoder is None else nn.ModuleList([critic, encoder.online])


def encoders(encoder) -> dict[str, nn.Module]:
    """The shared image encoder and its target, for checkpoints (none for flat observations)."""
    return {} if encoder is None else {"encoder": encoder.online, "encoder_target": encoder.target}


def critic_step_cost(actor: list[int], critic: list[int], critics: int, batch: int) -> Cost:
    """The critic step of DDPG, TD3 and SAC: the next action (target actor; SAC: the policy's
    sample), the target critics on it, the critics on (s, a), their backward and one Adam over
    all of them."""
    return (mlp_forward_cost(actor, batch) + mlp_forward_cost(critic, batch) * (2 * critics)
            + mlp_backward_cost(critic, batch) * critics + adam_cost(critics * mlp_parameter_count(critic)))


def step(optimizer: torch.optim.Optimizer, loss: torch.Tensor) -> None:
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()


@contextmanager
def frozen(module: nn.Module):
    """No gradients for `module`'s weights inside the block. The actor's loss differentiates through
    the critic, whose own weight gradients would be thrown away (SB3 computes them, one matrix
    product per layer, and zeroes them before the next critic step)."""
    module.requires_grad_(False)
    try:
        yield module
    finally:
        module.requires_grad_(True)
