"""A fused CPU learner for DDPG and TD3: the algorithm's update with its matrix products and
elementwise steps written out on preallocated buffers, no autograd.

Why: at Stable-Baselines3's 400x300 / batch 256 an update is ~620 MFLOP of matrix products (~6 ms
on one core here), and PyTorch's autograd path adds ~4 ms around them: a graph per step, fresh
buffers for every activation and gradient, per-tensor Adam and Polyak loops. Here each network's
weights, gradients and Adam moments are one flat float32 tensor each (the layout of
kernels/cpu/mlp.py: weight then bias per layer, in `parameters()` order), every product writes into
a buffer allocated once per batch size, and Adam and the target update are one call per network.

The algorithm's torch modules keep working: their parameters become views of the flat tensors, so
evaluation, `act`, checkpoints and a later switch to the autograd learner see the same weights.
The update is held to the algorithm's own autograd `update` by tests/test_continuous.py.
"""
from __future__ import annotations

import numpy as np
import torch

from pearl.contracts import Learner, implements
from pearl.runtime.learners import load_optimizer_state, optimizer_state


def flatten_parameters(module: torch.nn.Module) -> torch.nn.Parameter:
    """Moves `module`'s parameters into one flat tensor (in `parameters()` order) and makes each
    parameter a view of it; returns the flat tensor."""
    params = list(module.parameters())
    flat = torch.nn.Parameter(torch.cat([p.detach().reshape(-1) for p in params]))
    offset = 0
    for p in params:
        n = p.numel()
        p.data = flat.data[offset:offset + n].view_as(p)
        offset += n
    return flat


def layer_views(flat: torch.Tensor, sizes: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(weight (out x in), bias) views of a flat MLP tensor."""
    out, offset = [], 0
    for n_in, n_out in zip(sizes[:-1], sizes[1:]):
        weight = flat[offset:offset + n_in * n_out].view(n_out, n_in)
        offset += n_in * n_out
        out.append((weight, flat[offset:offset + n_out]))
        offset += n_out
    return out


class MLPBuffers:
    """Forward activations and input gradients of one MLP shape at one batch size."""

    def __init__(self, sizes: list[int], batch: int):
        self.sizes = sizes
        self.out = [torch.empty(batch, n) for n in sizes[1:]]
        self.grad_in = [torch.empty(batch, n) for n in sizes[:-1]]

    def forward(self, layers, x: torch.Tensor) -> torch.Tensor:
        """ReLU between layers, none after the last; keeps every layer's output for `backward`."""
        h, last = x, len(layers) - 1
        for i, (weight, bias) in enumerate(layers):
            torch.addmm(bias, h, weight.t(), out=self.out[i])
            if i < last:
                self.out[i].clamp_(min=0.0)
            h = self.out[i]
        return h

    def backward(self, layers, grads, x: torch.Tensor, g: torch.Tensor, input_columns: slice | None = None):
        """Back-propagates dL/d(output) `g` through the last `forward` on `x`. Writes weight and bias
        gradients into `grads` (views like `layers`) unless it is None; returns dL/dx[:, input_columns]
        when `input_columns` is given (the first layer's product is then restricted to them)."""
        for i in range(len(layers) - 1, -1, -1):
            weight, _ = layers[i]
            inp = x if i == 0 else self.out[i - 1]
            if grads is not None:
                grad_w, grad_b = grads[i]
                torch.mm(g.t(), inp, out=grad_w)
                torch.sum(g, dim=0, out=grad_b)
            if i > 0:
                g = torch.mm(g, weight, out=self.grad_in[i])
                # ReLU's derivative, in place: autograd's own kernel (~13 us at 256 x 400; a
                # comparison mask and a multiply take ~150 us)
                torch.ops.aten.threshold_backward.grad_input(g, self.out[i - 1], 0.0, grad_input=g)
            elif input_columns is not None:
                return torch.mm(g, weight[:, input_columns])
        return None


@implements(Learner)
class FusedActorCriticLearner:
    """DDPG's or TD3's update (pearl/algos/ddpg.py, td3.py) for plain MLPs on the CPU.

    Same interface and checkpoint layout as ContinuousLearner (flat weights per network, flat Adam
    moments per optimizer), so either learner loads the other's checkpoints.
    """

    kernel = "fused"

    def __init__(self, algo):
        self.algo = algo
        cfg = algo.config
        self.twin = algo.name == "td3"
        self.actor_sizes = algo.policy_sizes()
        self.critic_sizes = [algo.obs_dim + algo.action_dim, *cfg.hidden, 1]
        n_critics = 2 if self.twin else 1
        self.flat = {"actor": flatten_parameters(algo.actor), "actor_target": flatten_parameters(algo.actor_target)}
        for tag, module in (("critic", algo.critic), ("critic_target", algo.critic_target)):
            self.flat[tag] = flatten_parameters(module)
        critic_size = sum(p.numel() for p in (algo.critic.q1 if self.twin else algo.critic).parameters())
        # views: each network's layers; for the twin, critic i lives at [i * size, (i + 1) * size)
        self.layers = {name: layer_views(self.flat[name], self.actor_sizes) for name in ("actor", "actor_target")}
        for name in ("critic", "critic_target"):
            self.layers[name] = [layer_views(self.flat[name][i * critic_size:(i + 1) * critic_size], self.critic_sizes)
                                 for i in range(n_critics)]
        self.grads = {name: torch.zeros_like(self.flat[name]) for name in ("actor", "critic")}
        self.flat["actor"].grad = self.grads["actor"]
        self.flat["critic"].grad = self.grads["critic"]
        self.grad_layers = {"actor": layer_views(self.grads["actor"], self.actor_sizes),
                            "critic": [layer_views(self.grads["critic"][i * critic_size:(i + 1) * critic_size],
                                                   self.critic_sizes) for i in range(n_critics)]}
        # the algorithm's optimizers are rebuilt over the flat tensors (same Adam, same state layout)
        algo.actor_optimizer = torch.optim.Adam([self.flat["actor"]], lr=cfg.lr, fused=True)
        algo.critic_optimizer = torch.optim.Adam([self.flat["critic"]], lr=cfg.lr, fused=True)
        self._buffers: dict[int, tuple] = {}

    def _buffers_for(self, batch: int):
        if batch not in self._buffers:
            n_critics = 2 if self.twin else 1
            self._buffers[batch] = (
                MLPBuffers(self.actor_sizes, batch),
                [MLPBuffers(self.critic_sizes, batch) for _ in range(n_critics)],
                torch.empty(batch, self.critic_sizes[0]),  # [s, a], the critic's input
                torch.empty(batch), torch.empty(batch, 1),  # y, dL/dq
                torch.empty(batch, self.algo.action_dim),  # smoothing noise / action gradient
            )
        return self._buffers[batch]

    def update(self, batch):
        with torch.no_grad():
            return self._update(*(torch.from_numpy(a) for a in (batch.obs, batch.actions, batch.rewards,
                                                                   batch.next_obs, batch.discounts))), None

    def _update(self, obs, actions, rewards, next_obs, discounts) -> float:
        algo, cfg = self.algo, self.algo.config
        actor_buf, critic_bufs, critic_in, y, grad_q, noise = self._buffers_for(obs.shape[0])
        obs_dim = algo.obs_dim
        critics = range(len(critic_bufs))

        # y = R + discount * Q'(s', mu'(s'))   (TD3: smoothed target action, min over twin targets)
        next_a = actor_buf.forward(self.layers["actor_target"], next_obs).tanh_()
        if self.twin:
            noise.normal_().mul_(cfg.target_policy_noise).clamp_(-cfg.target_noise_clip, cfg.target_noise_clip)
            next_a.add_(noise).clamp_(-1.0, 1.0)
        critic_in[:, :obs_dim] = next_obs
        critic_in[:, obs_dim:] = next_a
        next_q = critic_bufs[0].forward(self.layers["critic_target"][0], critic_in)
        if self.twin:
            next_q = torch.minimum(next_q, critic_bufs[1].forward(self.layers["critic_target"][1], critic_in))
        torch.addcmul(rewards, discounts, next_q[:, 0], out=y)

        # critic(s): one Adam step on sum_i mean((Q_i(s, a) - y)^2)
        critic_in[:, :obs_dim] = obs
        critic_in[:, obs_dim:] = actions
        loss = 0.0
        for i in critics:
            q = critic_bufs[i].forward(self.layers["critic"][i], critic_in)
            torch.sub(q[:, 0], y, out=grad_q[:, 0])
            loss += float(grad_q.square().mean())
            grad_q.mul_(2.0 / len(y))
            critic_bufs[i].backward(self.layers["critic"][i], self.grad_layers["critic"][i], critic_in, grad_q)
        algo.critic_optimizer.step()

        algo.updates += 1
        if self.twin and algo.updates % cfg.policy_delay:
            return loss
        # actor: one Adam step on -mean(Q_1(s, mu(s))), through the just-updated critic
        pi = actor_buf.forward(self.layers["actor"], obs).tanh_()
        critic_in[:, obs_dim:] = pi
        critic_bufs[0].forward(self.layers["critic"][0], critic_in)
        grad_q.fill_(-1.0 / len(y))
        grad_a = critic_bufs[0].backward(self.layers["critic"][0], None, critic_in, grad_q,
                                         input_columns=slice(obs_dim, None))
        grad_a.mul_(1.0 - pi.square())  # tanh's derivative
        actor_buf.backward(self.layers["actor"], self.grad_layers["actor"], obs, grad_a)
        algo.actor_optimizer.step()

        # targets: theta' <- tau theta + (1 - tau) theta', one call per network
        self.flat["critic_target"].data.lerp_(self.flat["critic"].data, cfg.tau)
        self.flat["actor_target"].data.lerp_(self.flat["actor"].data, cfg.tau)
        return loss

    def update_target(self) -> None:
        """Nothing is owed at an interval: the targets move inside `update` (Polyak steps; TD3's
        every policy_delay-th update)."""

    def policy_weights(self) -> np.ndarray:
        """The actor's flat weights, without a copy (the actor's policy copies them on sync)."""
        return self.flat["actor"].data.numpy()

    def sync_to_algo(self) -> None:
        """The algorithm's parameters are views of the flat tensors: nothing to copy."""

    def state_dict(self) -> dict:
        state = {name: self.flat[name].detach().numpy().copy()
                 for name in ("actor", "critic", "actor_target", "critic_target")}
        state["optimizers"] = {name: optimizer_state(opt) for name, opt in self.algo.optimizers().items()}
        state["updates"] = self.algo.updates
        return state

    def load_state_dict(self, state: dict) -> None:
        with torch.no_grad():
            for name in ("actor", "critic", "actor_target", "critic_target"):
                self.flat[name].copy_(torch.from_numpy(np.asarray(state[name])))
        for name, opt in self.algo.optimizers().items():
            load_optimizer_state(opt, state["optimizers"][name])
        self.algo.updates = int(state["updates"])
