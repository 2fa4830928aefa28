"""Deep Q-Network (Mnih et al. 2015) with double DQN (van Hasselt et al. 2016), n-step returns,
an optional dueling head (Wang et al. 2016) and importance weights for prioritized replay.

The algorithm, top to bottom, as the papers state it:

    for each env step t:
        a_t = random action with probability epsilon(t) (1 before learning_starts),      # act
              else argmax_a Q(s_t, a)
        store (s_t, a_t, R_t^(n), s_{t+n}, gamma^n * not_terminated)                    # insert
        every 1/replay_ratio steps:
            sample a batch with importance weights w                                    # sample
            a* = argmax_a Q(s', a)                  (double DQN; else target net's argmax)
            y  = R + discount * Q_target(s', a*)
            loss = mean(w * huber(Q(s, a) - y)); optimizer step (Adam or RMSprop),      # learn
                                                  gradient norm clipped
            new priorities = |Q(s, a) - y|                                              # update_priorities
        every target_update_interval steps: Q_target <- tau Q + (1 - tau) Q_target

Which device or kernel runs each line is the Plan's business, not this file's.
"""
from __future__ import annotations

import copy
import functools

import numpy as np
import torch
from torch import nn

from pearl.contracts import Algorithm, implements
from pearl.nets import CNNQNetwork, make_optimizer
from pearl.estimator.signatures import (Cost, conv_backward_cost, conv_forward_cost, conv_output_size,
                                        conv_parameter_count, mlp_backward_cost, mlp_forward_cost, mlp_parameter_count,
                                        optimizer_cost)


def q_network(obs_shape, n_actions: int, config, obs_scale: float) -> functools.partial:
    """The CNN Q-network's constructor for image observations (picklable: actor processes build
    their copy with it)."""
    return functools.partial(CNNQNetwork, tuple(obs_shape), n_actions, list(config.hidden), config.dueling,
                             tuple(map(tuple, config.conv)), obs_scale)


class QNetwork(nn.Module):
    def __init__(self, obs_dim: int, n_actions: int, hidden: list[int], dueling: bool):
        super().__init__()
        sizes = [obs_dim, *hidden]
        layers: list[nn.Module] = []
        for n_in, n_out in zip(sizes[:-1], sizes[1:]):
            layers += [nn.Linear(n_in, n_out), nn.ReLU()]
        self.dueling = dueling
        if dueling:
            self.trunk = nn.Sequential(*layers)
            self.value = nn.Linear(sizes[-1], 1)
            self.advantage = nn.Linear(sizes[-1], n_actions)
        else:
            self.trunk = nn.Sequential(*layers, nn.Linear(sizes[-1], n_actions))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        h = self.trunk(obs)
        if not self.dueling:
            return h
        advantage = self.advantage(h)
        return self.value(h) + advantage - advantage.mean(dim=-1, keepdim=True)


@implements(Algorithm)
class DQN:
    """Networks, loss and update rule. `update` works on tensors of whichever device they are on."""

    name, family = "dqn", "discrete"

    def __init__(self, obs_dim: int, n_actions: int, config, total_steps: int, seed: int = 0,
                 obs_shape: tuple[int, ...] | None = None, obs_scale: float = 1.0):
        """`obs_shape` (C, H, W) or (H, W): image observations, a CNN Q-network (pearl/nets.py)
        whose input is multiplied by `obs_scale`; otherwise an MLP on `obs_dim` features."""
        self.obs_dim, self.n_actions, self.action_dim = obs_dim, n_actions, 1
        self.config, self.total_steps = config, total_steps
        torch.manual_seed(seed)
        self.online = (QNetwork(obs_dim, n_actions, config.hidden, config.dueling) if not obs_shape
                       else q_network(obs_shape, n_actions, config, obs_scale)())
        self.target = copy.deepcopy(self.online).requires_grad_(False)
        self.optimizer = make_optimizer(self.online, config.lr, config.optimizer)

    # -- act -----------------------------------------------------------------------------------
    def epsilon(self, step: int) -> float:
        """The probability of a random action at env step `step`: 1 before learning_starts (the replay
        fills with uniformly random actions, as in Mnih et al. 2015, Stable-Baselines3 and this
        package's DDPG / TD3 / SAC; no greedy pass is computed for them), then the linear decay over
        `fraction` of the run's steps, counted from step 0 (SB3's schedule) or from learning_starts
        (exploration.decay_from)."""
        if step < self.config.learning_starts:
            return 1.0
        explore = self.config.exploration
        decay_steps = max(1.0, explore.fraction * self.total_steps)
        if explore.decay_from == "learning_starts":
            step -= self.config.learning_starts
        progress = min(1.0, step / decay_steps)
        return explore.initial + progress * (explore.final - explore.initial)

    # -- learn ---------------------------------------------------------------------------------
    def td_target(self, rewards, next_obs, discounts, online, target) -> torch.Tensor:
        with torch.no_grad():
            next_q_target = target(next_obs)
            if self.config.double:
                best = online(next_obs).argmax(dim=1, keepdim=True)
            else:
                best = next_q_target.argmax(dim=1, keepdim=True)
            return rewards + discounts * next_q_target.gather(1, best).squeeze(1)

    def loss(self, obs, actions, rewards, next_obs, discounts, weights=None, online=None, target=None):
        """`online`, `target`: the networks to run, the algorithm's own by default (a learner may pass
        stand-ins computing the same functions, e.g. bfloat16 copies: pearl.nets.BF16Copy)."""
        online = self.online if online is None else online
        target = self.target if target is None else target
        q = online(obs).gather(1, actions.long().unsqueeze(1)).squeeze(1)
        td = q - self.td_target(rewards, next_obs, discounts, online, target)
        huber = nn.functional.smooth_l1_loss(td, torch.zeros_like(td), reduction="none")
        if weights is not None:
            huber = huber * weights
        return huber.mean(), td.detach().abs()

    def update(self, obs, actions, rewards, next_obs, discounts, weights=None):
        """One optimizer step. Returns (loss, |TD error| per sample) as (float, tensor)."""
        loss, abs_td = self.loss(obs, actions, rewards, next_obs, discounts, weights)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.step()
        return float(loss.detach()), abs_td

    def step(self) -> None:
        """The optimizer step on the gradients in the online network's .grad, their norm clipped
        (a learner that computed them otherwise, e.g. a batch in two halves, steps with this)."""
        if self.config.max_grad_norm is not None:
            nn.utils.clip_grad_norm_(self.online.parameters(), self.config.max_grad_norm)
        self.optimizer.step()

    def update_target(self) -> None:
        tau = self.config.tau
        with torch.no_grad():
            for target, online in zip(self.target.parameters(), self.online.parameters()):
                target.lerp_(online, tau)

    # -- what the runtime needs to know ------------------------------------------------------------
    def policy_network(self) -> nn.Module:
        """The network whose flat weights the actor's numpy copy runs (see kernels/cpu/mlp.py)."""
        return self.online

    def policy_sizes(self) -> list[int]:
        return self.policy_shape(self.obs_dim, self.n_actions, self.config.hidden)

    def networks(self) -> dict[str, nn.Module]:
        return {"online": self.online, "target": self.target}

    def n_params(self) -> int:
        return sum(p.numel() for p in self.online.parameters())

    # -- cost spec: FLOPs and bytes from shapes alone (estimator/workload.py asks for them) --------
    COST_OPTIONS = ("double", "optimizer")  # options learn_cost reads beside the shapes (Workload's names)

    @staticmethod
    def policy_shape(obs_dim: int, n_actions: int, hidden) -> list[int]:
        """The Q MLP's widths: what the actor runs and sync_weights ships."""
        return [obs_dim, *hidden, n_actions]

    # `image`: (input (C, H, W), conv layers, bytes per input element) for a CNN Q-network, whose
    # fc layers take the last conv layer's flattened output instead of obs_dim features
    @classmethod
    def act_cost(cls, obs_dim: int, n_actions: int, hidden, envs: int, image=None) -> Cost:
        """The Q-network's inference for one act round of `envs` observations."""
        if image is None:
            return mlp_forward_cost(cls.policy_shape(obs_dim, n_actions, hidden), envs)
        shape, conv, input_bytes = image
        return (conv_forward_cost(shape, conv, envs, input_bytes)
                + mlp_forward_cost(cls.policy_shape(conv_output_size(shape, conv), n_actions, hidden), envs))

    @classmethod
    def learn_cost(cls, obs_dim: int, n_actions: int, hidden, batch: int, kernel: str, double: bool = True,
                   optimizer: str = "adam", image=None) -> Cost:
        """One update on a batch; the fused and torch learners do the same arithmetic."""
        forwards = 3 if double else 2  # Q(s), Q_target(s'), and Q(s') for double DQN
        if image is None:
            sizes = cls.policy_shape(obs_dim, n_actions, hidden)
            return (mlp_forward_cost(sizes, batch) * forwards + mlp_backward_cost(sizes, batch)
                    + optimizer_cost(optimizer, mlp_parameter_count(sizes)))
        shape, conv, input_bytes = image
        sizes = cls.policy_shape(conv_output_size(shape, conv), n_actions, hidden)
        return ((conv_forward_cost(shape, conv, batch, input_bytes) + mlp_forward_cost(sizes, batch)) * forwards
                + conv_backward_cost(shape, conv, batch) + mlp_backward_cost(sizes, batch)
                + optimizer_cost(optimizer, cls.image_parameter_count(n_actions, hidden, image)))

    @classmethod
    def image_parameter_count(cls, n_actions: int, hidden, image) -> int:
        shape, conv, _ = image
        return (conv_parameter_count(shape, conv)
                + mlp_parameter_count(cls.policy_shape(conv_output_size(shape, conv), n_actions, hidden)))

    # -- weights as one flat vector (the layout kernels share) ------------------------------------
    @staticmethod
    def flat_weights(network: nn.Module) -> np.ndarray:
        return torch.cat([p.detach().reshape(-1).cpu() for p in network.parameters()]).numpy()

    @staticmethod
    def load_flat_weights(network: nn.Module, flat: np.ndarray) -> None:
        offset = 0
        with torch.no_grad():
            for p in network.parameters():
                n = p.numel()
                p.copy_(torch.from_numpy(flat[offset:offset + n]).view_as(p))
                offset += n
