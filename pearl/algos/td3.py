"""Twin Delayed DDPG (Fujimoto et al. 2018): DDPG (ddpg.py) with three changes, marked (1)-(3).

    for each env step t:
        a_t = uniform in [-1, 1]^d during the first learning_starts steps, else
              clip(mu(s_t) + N(0, action_noise^2), -1, 1)                                     # act
        store (s_t, a_t, R_t^(n), s_{t+n}, gamma^n * not_terminated)                          # insert
        every 1/replay_ratio steps:
            sample a batch                                                                    # sample
            (2) a' = clip(mu'(s') + clip(N(0, target_policy_noise^2), -c, c), -1, 1)
            (1) y  = R + discount * min(Q1'(s', a'), Q2'(s', a'))
            critics: one Adam step on mean((Q1(s, a) - y)^2) + mean((Q2(s, a) - y)^2)
            (3) every policy_delay-th update only:
                actor: one Adam step on -mean(Q1(s, mu(s)))
                targets: theta' <- tau theta + (1 - tau) theta'                               # learn

Which device or kernel runs each line is the Plan's business, not this file's.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from pearl.algos.ddpg import DDPG, Critic, frozen, soft_update, step
from pearl.contracts import Algorithm, implements


class TwinCritic(nn.Module):
    """Two independent critics, (1) of the paper; each returns one value per row."""

    def __init__(self, obs_dim: int, action_dim: int, hidden: list[int]):
        super().__init__()
        self.q1 = Critic(obs_dim, action_dim, hidden)
        self.q2 = Critic(obs_dim, action_dim, hidden)

    def forward(self, obs: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.q1(obs, actions), self.q2(obs, actions)


@implements(Algorithm)
class TD3(DDPG):
    name = "td3"
    critic_class = TwinCritic
    critics = 2  # the cost spec (DDPG.learn_cost) counts both
    COST_OPTIONS = ("policy_delay",)  # the actor step and targets run on 1 / policy_delay of the updates

    def td_target(self, rewards, next_obs, discounts, noise: torch.Tensor | None = None) -> torch.Tensor:
        """`noise`: standard normal draws for the smoothing noise (one per action component);
        drawn here when not given."""
        cfg = self.config
        with torch.no_grad():
            next_actions = self.actor_target(next_obs)
            if noise is None:
                noise = torch.randn_like(next_actions)
            smoothing = (noise * cfg.target_policy_noise).clamp(-cfg.target_noise_clip, cfg.target_noise_clip)
            next_actions = (next_actions + smoothing).clamp(-1.0, 1.0)
            q1, q2 = self.critic_target(next_obs, next_actions)
            return rewards + discounts * torch.minimum(q1, q2)

    def critic_loss(self, obs, actions, rewards, next_obs, discounts) -> torch.Tensor:
        y = self.td_target(rewards, next_obs, discounts)
        q1, q2 = self.critic(obs, actions)
        return F.mse_loss(q1, y) + F.mse_loss(q2, y)

    def actor_loss(self, obs) -> torch.Tensor:
        return -self.critic.q1(obs, self.actor(obs)).mean()

    def update(self, obs, actions, rewards, next_obs, discounts) -> float:
        """One critic step; every policy_delay-th call also one actor step and the target update."""
        obs, next_obs = self.features(obs, next_obs)
        critic_loss = self.critic_loss(obs, actions, rewards, next_obs, discounts)
        step(self.critic_optimizer, critic_loss)
        self.updates += 1
        if self.updates % self.config.policy_delay == 0:
            with frozen(self.critic):
                step(self.actor_optimizer, self.actor_loss(obs.detach()))  # the actor does not train the encoder
            soft_update(self.critic_target, self.critic, self.config.tau)
            soft_update(self.actor_target, self.actor, self.config.tau)
            if self.encoder:
                self.encoder.soft_update(self.config.tau)
        return critic_loss.item()
