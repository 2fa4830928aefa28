"""Soft Actor-Critic (Haarnoja et al. 2018, with the automatic temperature of the second paper), as
Stable-Baselines3 runs it: a squashed Gaussian policy, twin critics with targets, no actor target.

The algorithm, top to bottom. Actions live in [-1, 1]^d; the runtime scales them to the
environment's bounds.

    for each env step t:
        a_t = uniform in [-1, 1]^d during the first learning_starts steps, else
              tanh(u), u ~ N(mean(s_t), std(s_t)^2)                                            # act
        store (s_t, a_t, R_t^(n), s_{t+n}, gamma^n * not_terminated)                          # insert
        every 1/replay_ratio steps:
            sample a batch                                                                    # sample
            alpha = exp(log_alpha)
            a' ~ pi(s');  y = R + discount * (min(Q1'(s', a'), Q2'(s', a')) - alpha log pi(a'|s'))
            critics: one Adam step on (mean((Q1(s, a) - y)^2) + mean((Q2(s, a) - y)^2)) / 2
            a~ ~ pi(s) (reparameterised)
            actor: one Adam step on mean(alpha log pi(a~|s) - min(Q1(s, a~), Q2(s, a~)))
            temperature: one Adam step on -mean(log_alpha (log pi(a~|s) + target_entropy))
            critic targets: theta' <- tau theta + (1 - tau) theta'                            # learn

with log pi(tanh(u)|s) = log N(u; mean, std) - sum_i log(1 - tanh(u_i)^2) (the change of variables
through tanh). Which device or kernel runs each line is the Plan's business, not this file's.
"""
from __future__ import annotations

import copy
import math

import torch
from torch import nn
from torch.nn import functional as F

from pearl.algos.ddpg import (DDPG, critic_step_cost, encoders, frozen, image_encoder_cost, mlp, soft_update, step,
                              with_encoder)
from pearl.algos.td3 import TwinCritic
from pearl.contracts import Algorithm, implements
from pearl.nets import SharedEncoder, adam
from pearl.estimator.signatures import (Cost, adam_cost, conv_output_size, mlp_backward_cost, mlp_forward_cost, mlp_input_gradient_cost,
                                        mlp_parameter_count, soft_update_cost)

LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0  # SB3's clamp: keeps std in a range where exp() is sane
LOG_2PI = math.log(2.0 * math.pi)


class SquashedGaussianActor(nn.Module):
    """MLP(s) -> (mean, log_std) of u; the action is tanh(u). One output layer of 2d units holds
    both heads (the same function as two d-unit heads), so the actor's numpy copy is a plain MLP."""

    def __init__(self, obs_dim: int, action_dim: int, hidden: list[int]):
        super().__init__()
        self.action_dim = action_dim
        self.net = mlp([obs_dim, *hidden, 2 * action_dim])

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.net(obs)
        mean, log_std = out[:, :self.action_dim], out[:, self.action_dim:]
        return mean, log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)

    def sample(self, obs: torch.Tensor, noise: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(tanh(u), log pi) with u = mean + std * noise (reparameterised); `noise` is standard
        normal, drawn here when not given."""
        mean, log_std = self(obs)
        if noise is None:
            noise = torch.randn_like(mean)
        u = mean + log_std.exp() * noise
        log_prob = (-0.5 * noise.pow(2) - log_std - 0.5 * LOG_2PI).sum(dim=1)
        # log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u)): exact, and finite where tanh(u) = +-1
        log_prob = log_prob - (2.0 * (math.log(2.0) - u - F.softplus(-2.0 * u))).sum(dim=1)
        return torch.tanh(u), log_prob


class Temperature(nn.Module):
    """log alpha, a module so that it moves and checkpoints like the networks."""

    def __init__(self, initial: float):
        super().__init__()
        self.log_alpha = nn.Parameter(torch.tensor(math.log(initial)))

    def forward(self) -> torch.Tensor:
        return self.log_alpha.exp()


@implements(Algorithm)
class SAC:
    """Networks, losses and update rule. `update` works on tensors of whichever device they are on."""

    name, family = "sac", "continuous"
    policy_kind = "squashed_gaussian"  # MLP(s) = (mean, log std), sampled and squashed by tanh

    def __init__(self, obs_dim: int, action_dim: int, config, seed: int = 0,
                 obs_shape: tuple[int, ...] | None = None, obs_scale: float = 1.0):
        """`obs_shape`: image observations through a shared conv encoder (as in DDPG). The
        next observations' features are the target encoder's, for the policy's next action too."""
        self.obs_dim, self.action_dim, self.config = obs_dim, action_dim, config
        torch.manual_seed(seed)
        self.encoder = SharedEncoder(obs_shape, config.conv, obs_scale) if obs_shape else None
        features = self.encoder.features if self.encoder else obs_dim
        self.actor = SquashedGaussianActor(features, action_dim, config.hidden)
        self.critic = TwinCritic(features, action_dim, config.hidden)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.temperature = Temperature(config.init_ent_coef)
        self.target_entropy = (-float(action_dim) if config.target_entropy is None
                               else float(config.target_entropy))
        self.actor_optimizer = adam(self.actor, config.lr)
        self.critic_optimizer = adam(with_encoder(self.critic, self.encoder), config.lr)
        self.temperature_optimizer = adam(self.temperature, config.lr)
        self.updates = 0

    # -- act -----------------------------------------------------------------------------------
    def epsilon(self, step: int) -> float:
        """Probability of a uniformly random action at env step `step`: 1 during the warm-up, then 0
        (the policy explores by sampling itself)."""
        return 1.0 if step < self.config.learning_starts else 0.0

    # -- learn ---------------------------------------------------------------------------------
    def alpha(self) -> torch.Tensor:
        return self.temperature().detach()

    def td_target(self, rewards, next_obs, discounts, noise: torch.Tensor | None = None) -> torch.Tensor:
        """The entropy-regularised target; `noise`: the standard normal draws of a' ~ pi(s')."""
        with torch.no_grad():
            next_actions, next_log_prob = self.actor.sample(next_obs, noise)
            q1, q2 = self.critic_target(next_obs, next_actions)
            return rewards + discounts * (torch.minimum(q1, q2) - self.alpha() * next_log_prob)

    def critic_loss(self, obs, actions, rewards, next_obs, discounts) -> torch.Tensor:
        y = self.td_target(rewards, next_obs, discounts)
        q1, q2 = self.critic(obs, actions)
        return 0.5 * (F.mse_loss(q1, y) + F.mse_loss(q2, y))

    def actor_loss(self, obs, noise: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(loss, log pi of the sampled actions)."""
        actions, log_prob = self.actor.sample(obs, noise)
        q1, q2 = self.critic(obs, actions)
        return (self.alpha() * log_prob - torch.minimum(q1, q2)).mean(), log_prob

    def temperature_loss(self, log_prob: torch.Tensor) -> torch.Tensor:
        """Raises alpha while the policy's entropy (-log pi) is below target_entropy, lowers it above."""
        return -(self.temperature.log_alpha * (log_prob.detach() + self.target_entropy)).mean()

    def update(self, obs, actions, rewards, next_obs, discounts) -> float:
        """One critic, actor and temperature step and a critic target update. Returns the critic loss."""
        obs, next_obs = self.features(obs, next_obs)
        critic_loss = self.critic_loss(obs, actions, rewards, next_obs, discounts)
        step(self.critic_optimizer, critic_loss)
        with frozen(self.critic):
            actor_loss, log_prob = self.actor_loss(obs.detach())  # the actor does not train the encoder
            step(self.actor_optimizer, actor_loss)
        if self.config.autotune:
            step(self.temperature_optimizer, self.temperature_loss(log_prob))
        soft_update(self.critic_target, self.critic, self.config.tau)
        if self.encoder:
            self.encoder.soft_update(self.config.tau)
        self.updates += 1
        return critic_loss.item()

    features = DDPG.features

    # -- what the runtime needs to know ------------------------------------------------------------
    policy_network = DDPG.policy_network

    def policy_sizes(self) -> list[int]:
        """The actor MLP's widths (on image observations it takes the encoder's features)."""
        return self.policy_shape(self.encoder.features if self.encoder else self.obs_dim, self.action_dim,
                                 self.config.hidden)

    def networks(self) -> dict[str, nn.Module]:
        return {"actor": self.actor, "critic": self.critic, "critic_target": self.critic_target,
                "temperature": self.temperature, **encoders(self.encoder)}

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {"actor": self.actor_optimizer, "critic": self.critic_optimizer,
                "temperature": self.temperature_optimizer}

    n_params = DDPG.n_params
    image_parameter_count = classmethod(DDPG.image_parameter_count.__func__)

    # -- cost spec: FLOPs and bytes from shapes alone (estimator/workload.py asks for them) --------
    critics = 2
    HEAD_FLOPS = 5  # per action component on act: exp of log_std, the scaled noise, the add and tanh
    COST_OPTIONS: tuple[str, ...] = ()  # config options learn_cost reads beside the shapes

    @staticmethod
    def policy_shape(obs_dim: int, action_dim: int, hidden) -> list[int]:
        """The policy MLP's widths (its outputs: the mean and log std of each action component)."""
        return [obs_dim, *hidden, 2 * action_dim]

    act_cost = classmethod(DDPG.act_cost.__func__)  # the policy's inference and its sampling head (HEAD_FLOPS above)

    @classmethod
    def learn_cost(cls, obs_dim: int, action_dim: int, hidden, batch: int, kernel: str, image=None) -> Cost:
        """One update: the critic step (ddpg.critic_step_cost), the actor step through both
        frozen critics (input gradients only, as in DDPG.learn_cost) and the critics' targets
        (SAC has no actor target)."""
        obs_dim = obs_dim if image is None else conv_output_size(*image[:2])
        actor, critic = cls.policy_shape(obs_dim, action_dim, hidden), [obs_dim + action_dim, *hidden, 1]
        into_critic = mlp_input_gradient_cost(critic, batch, action_dim if kernel == "fused" else None)
        actor_step = (mlp_forward_cost(actor, batch) + (mlp_forward_cost(critic, batch) + into_critic) * cls.critics
                      + mlp_backward_cost(actor, batch) + adam_cost(mlp_parameter_count(actor)))
        return (critic_step_cost(actor, critic, cls.critics, batch) + actor_step
                + soft_update_cost(cls.critics * mlp_parameter_count(critic)) + image_encoder_cost(image, batch))
