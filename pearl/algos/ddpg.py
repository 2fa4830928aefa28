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

from pearl.estimator import adam_cost, mlp_backward_cost, mlp_forward_cost, mlp_parameter_count


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


def adam(module: nn.Module, lr: float) -> torch.optim.Adam:
    # fused: one pass over each tensor for the whole Adam update (CPU and CUDA alike); on the CPU it
    # takes ~270 us for a 400x300 critic where the default multi-tensor path takes ~530 us
    return torch.optim.Adam(module.parameters(), lr=lr, fused=True)


class DDPG:
    """Networks, losses and update rule. `update` works on tensors of whichever device they are on."""

    name, family = "ddpg", "continuous"
    policy_kind = "deterministic"  # tanh(MLP(s)) explored with Gaussian noise
    critic_class = Critic

    def __init__(self, obs_dim: int, action_dim: int, config, seed: int = 0):
        self.obs_dim, self.action_dim, self.config = obs_dim, action_dim, config
        torch.manual_seed(seed)
        self.actor = DeterministicActor(obs_dim, action_dim, config.hidden)
        self.critic = self.critic_class(obs_dim, action_dim, config.hidden)
        self.actor_target = copy.deepcopy(self.actor).requires_grad_(False)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.actor_optimizer = adam(self.actor, config.lr)
        self.critic_optimizer = adam(self.critic, config.lr)
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

    def update(self, obs, actions, rewards, next_obs, discounts) -> float:
        """One critic step, one actor step, one target update. Returns the critic loss."""
        critic_loss = self.critic_loss(obs, actions, rewards, next_obs, discounts)
        step(self.critic_optimizer, critic_loss)
        with frozen(self.critic):
            step(self.actor_optimizer, self.actor_loss(obs))
        soft_update(self.critic_target, self.critic, self.config.tau)
        soft_update(self.actor_target, self.actor, self.config.tau)
        self.updates += 1
        return critic_loss.item()

    # -- what the runtime and the protocol need to know -------------------------------------------
    def policy_network(self) -> nn.Module:
        """The network whose flat weights the actor's numpy copy runs (see kernels/cpu/mlp.py)."""
        return self.actor.net

    def policy_sizes(self) -> list[int]:
        return [self.obs_dim, *self.config.hidden, self.action_dim]

    def networks(self) -> dict[str, nn.Module]:
        return {"actor": self.actor, "critic": self.critic,
                "actor_target": self.actor_target, "critic_target": self.critic_target}

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {"actor": self.actor_optimizer, "critic": self.critic_optimizer}

    def n_params(self) -> int:
        return sum(p.numel() for p in self.actor.parameters())

    def act_cost(self, batch: int):
        return mlp_forward_cost(self.policy_sizes(), batch)

    def learn_cost(self, batch: int):
        """Critic step: target actor + target critic + critic forward, critic backward; actor step:
        actor + critic forward, backward through both (critic weights frozen); Adam on both."""
        actor = self.policy_sizes()
        critic = [self.obs_dim + self.action_dim, *self.config.hidden, 1]
        return (mlp_forward_cost(actor, batch) * 2 + mlp_forward_cost(critic, batch) * 3
                + mlp_backward_cost(critic, batch) * 2 + mlp_backward_cost(actor, batch)
                + adam_cost(mlp_parameter_count(actor)) + adam_cost(mlp_parameter_count(critic)))


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
