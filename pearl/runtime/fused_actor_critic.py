"""Fused CPU learners for DDPG and TD3, and SAC: the algorithm's update with its matrix products and
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

The elementwise steps between the products (losses, SAC's sampling and its derivatives) are
compiled kernels (kernels/cpu/actor_critic.py), and Adam's fused kernel is called directly
(adam_step): at 64x64 those were most of an update. Twin critics (TD3, SAC) run as one batch of
two MLPs, a batched product per layer (FlatMLPs, MLPBuffers).

`runtime.learner_precision: bf16` (a Plan's learner_precision) runs the inner hidden layers'
products on bfloat16 copies of the weights (AMX / AVX-512 BF16 units run them ~2.3x faster than
float32 on this project's Xeon, docs/BENCHMARKS.md), accumulated in float32; master weights, Adam
state, losses, the first and output layers and the target updates stay float32 (FlatMLPs). Held
to the float32 update within bfloat16's rounding by tests/test_learner_precision.py.
"""
from __future__ import annotations


import numpy as np
import torch

from pearl.algos.sac import LOG_STD_MAX, LOG_STD_MIN
from pearl.contracts import Learner, implements
from pearl.kernels.cpu.actor_critic import (min_gradient_shares, min_td_target, smoothed_target_action,
                                            soft_td_target, squared_error_gradient,
                                            squashed_gaussian_output_gradient, squashed_gaussian_sample)
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


# the learner's product precisions (runtime.learner_precision): the dtype of the products' operands
PRECISIONS = {"fp32": torch.float32, "bf16": torch.bfloat16}


class FlatMLPs:
    """`n` MLPs of one shape back to back in a flat float32 tensor (weights or their gradients),
    as the products read them: `stacked[i]`, layer i of all n MLPs as one batch (weight
    n x out x in, bias n x 1 x out), and `single[i]`, MLP 0's alone (weight out x in, bias out),
    each in the dtype layer i multiplies with (`layer_dtype`); `*_t`, the forward's transposed
    weights. The twin critics of TD3 and SAC run as one batched product per layer (torch.bmm): one
    call where two ran, with every elementwise step between the products on both critics' buffers
    at once, and bmm's bf16 kernels run two 256x400x300 products ~15-20% faster than two calls.

    Reduced precision (bf16) runs the inner hidden layers' products on a copy of their weights in
    that dtype (oneDNN accumulates them in float32); the first and the output layer's stay
    float32. The output layer: a Q value of ~-300 rounded to bfloat16 is off by up to 1, which the
    TD error would see, while the layer is ~0.1% of an update's FLOPs. The first layer: its inner
    dimension is the observation's few columns (3-4 on Pendulum), which the bfloat16 kernels pad
    to their tile and run ~2.5x slower than float32 (a 256x4 by 4x400 product: 53 vs 23 us; its
    weight gradient and input gradient alike), for ~0.5% of the FLOPs. The copy (`low_flat`) holds
    each inner layer's weights of the n MLPs contiguously, then their biases: bmm's bfloat16
    kernels run ~1.4x slower on batches strided as the float32 tensor's (MLP k's layers follow MLP
    k - 1's, the algorithm's `parameters()` order, which checkpoints keep). Weights: `to_low` after
    each optimizer or target step. Gradients: the inner layers' are written in the low precision
    and `from_low` widens them into the float32 gradient Adam reads; the others are float32 already."""

    def __init__(self, flat: torch.Tensor, sizes: list[int], n: int, dtype: torch.dtype):
        size = sum(a * b + b for a, b in zip(sizes[:-1], sizes[1:]))
        last = len(sizes) - 1
        self.flat, self.n = flat, n
        low_size = n * sum(a * b + b for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:]))
                           if layer_dtype(i, last, dtype) == dtype)
        self.low_flat = flat if dtype == torch.float32 else torch.empty(low_size, dtype=dtype)
        self.stacked, self.pairs = [], []  # pairs: (low, master) views that to_low / from_low copy
        offset, low_offset = flat.storage_offset(), 0
        for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
            weight = flat.as_strided((n, n_out, n_in), (size, n_in, 1), offset)
            bias = flat.as_strided((n, 1, n_out), (size, n_out, 1), offset + n_in * n_out)
            offset += n_in * n_out + n_out
            if dtype == torch.float32 or layer_dtype(i, last, dtype) != dtype:
                self.stacked.append((weight, bias))
                continue
            low_weight = self.low_flat[low_offset:low_offset + n * n_in * n_out].view(n, n_out, n_in)
            low_offset += n * n_in * n_out
            low_bias = self.low_flat[low_offset:low_offset + n * n_out].view(n, 1, n_out)
            low_offset += n * n_out
            self.stacked.append((low_weight, low_bias))
            self.pairs += [(low_weight, weight), (low_bias, bias)]
        self.single = [(weight[0], bias[0, 0]) for weight, bias in self.stacked]
        self.stacked_t = [weight.transpose(1, 2) for weight, _ in self.stacked]
        self.single_t = [weight.t() for weight, _ in self.single]
        # the output layer of each MLP (transposed weight, bias): with one output column a batched
        # product takes ~2x the time of a product per MLP (256x300 by 300x1: 48 vs 23 us for two)
        weight, bias = self.stacked[-1]
        self.outputs = [(weight[k].t(), bias[k, 0]) for k in range(n)]
        self.to_low()

    def layers(self, count: int) -> tuple[list, list]:
        """(layers, transposed weights) of MLPs 0..count-1: `single` for 1, else `stacked` (all n)."""
        return (self.single, self.single_t) if count == 1 else (self.stacked, self.stacked_t)

    def to_low(self) -> None:
        for low, master in self.pairs:
            low.copy_(master)

    def from_low(self, count: int) -> None:
        """Widens MLPs 0..count-1's low-precision gradients into the float32 tensor."""
        for low, master in self.pairs:
            if count < self.n:
                low, master = low[:count], master[:count]
            master.copy_(low)


def layer_dtype(i: int, layers: int, dtype: torch.dtype) -> torch.dtype:
    """The dtype of layer i's products in an MLP of `layers` layers with product precision `dtype`:
    float32 for the first and the output layer (FlatMLPs)."""
    return torch.float32 if i in (0, layers - 1) else dtype


class MLPBuffers:
    """Forward activations and gradients of `n` MLPs of one shape (FlatMLPs' n, all on one input)
    at one batch size, each in the dtype of the layer that computes or reads it (`layer_dtype`):
    where two layers' dtypes differ, the activation is converted after the ReLU and the gradient
    after the ReLU's derivative. A forward runs all n MLPs (each buffer n x batch x width, batched
    products) or MLP 0 alone (the buffers' first slice, plain products)."""

    def __init__(self, sizes: list[int], batch: int, dtype: torch.dtype = torch.float32, n: int = 1):
        self.sizes, self.n = sizes, n
        last = len(sizes) - 1
        dtypes = [layer_dtype(i, last, dtype) for i in range(last)]
        # hidden layer i: the product's output `prod[i]` (its own dtype) and `act[i]`, the next
        # layer's input (the next layer's dtype; the same tensor when they agree); the gradient
        # of act[i] (`grad_act[i]`) and of prod[i] (`grad_prod[i]`) likewise
        prod, act, grad_prod, grad_act = [], [], [], []
        for i in range(last - 1):
            ours, theirs, width = dtypes[i], dtypes[i + 1], sizes[i + 1]
            prod.append(torch.empty(n, batch, width, dtype=ours))
            act.append(prod[i] if ours == theirs else torch.empty(n, batch, width, dtype=theirs))
            grad_act.append(torch.empty(n, batch, width, dtype=theirs))
            grad_prod.append(grad_act[i] if ours == theirs else torch.empty(n, batch, width, dtype=ours))
        prod.append(torch.empty(n, batch, sizes[-1]))
        # the buffers as a forward of `count` MLPs uses them: {1: MLP 0's (2-d), n: all (3-d)}
        self.views = {count: tuple([t[0] for t in ts] if count == 1 else ts for ts in (prod, act, grad_prod, grad_act))
                      for count in {1, n}}
        self.output = prod[-1].numpy()  # the MLPs' last outputs (n x batch x out), as numpy
        self.outputs = list(self.output)  # MLP k's (batch x out)
        # MLP k's output layer input and output, for the output layer's products per MLP (FlatMLPs.outputs)
        self.output_layer = list(zip(act[-1] if act else [None] * n, prod[-1]))
        self.inputs: list[torch.Tensor] = []  # what each layer multiplied in the last forward
        self.count = 1  # how many MLPs the last forward ran

    def forward(self, net: FlatMLPs, x: torch.Tensor, count: int = 1) -> torch.Tensor:
        """MLPs 0..count-1 of `net` (count: 1 or n) on float32 `x`: ReLU between layers, none after
        the last; keeps every layer's input for `backward`. Returns the float32 output (batch x out
        for one MLP, else count x batch x out)."""
        layers, transposed = net.layers(count)
        prod, act, _, _ = self.views[count]
        product = torch.addmm if count == 1 else torch.baddbmm
        last = len(layers) - 1
        h = x if count == 1 else x.expand(count, *x.shape)
        self.inputs, self.count = [h], count
        for i in range(last):
            out = relu_(product(layers[i][1], h, transposed[i], out=prod[i]))
            h = out if act[i] is out else act[i].copy_(out)
            self.inputs.append(h)
        if count == 1 or last == 0:
            return product(layers[last][1], h, transposed[last], out=prod[last])
        for (weight_t, bias), (h_k, out_k) in zip(net.outputs, self.output_layer):
            torch.addmm(bias, h_k, weight_t, out=out_k)
        return prod[last]

    def backward(self, net: FlatMLPs, grads: FlatMLPs | None, g: torch.Tensor, input_columns: slice | None = None):
        """Back-propagates dL/d(output) `g` (float32, shaped as `forward`'s output) through the last
        `forward`. Writes weight and bias gradients into the same MLPs of `grads` unless it is
        None; returns dL/dx[:, input_columns] (float32, summed over the MLPs) when `input_columns`
        is given (the first layer's product is then restricted to them)."""
        count = self.count
        layers, _ = net.layers(count)
        grad_layers = grads.layers(count)[0] if grads is not None else None
        _, _, grad_prod, grad_act = self.views[count]
        mm = torch.mm if count == 1 else torch.bmm
        found = None
        for i in range(len(layers) - 1, -1, -1):
            weight = layers[i][0]
            if grad_layers is not None:
                grad_w, grad_b = grad_layers[i]
                mm(g.transpose(-1, -2), self.inputs[i], out=grad_w)
                torch.sum(g, dim=-2, keepdim=count > 1, out=grad_b)
            if i > 0:  # through layer i's product and layer i - 1's ReLU, into layer i - 1's dtype
                g = relu_backward(mm(g, weight, out=grad_act[i - 1]), self.inputs[i])
                if grad_prod[i - 1] is not g:
                    g = grad_prod[i - 1].copy_(g)
            elif input_columns is not None:
                found = mm(g, weight[..., input_columns])
                if count > 1:
                    found = found.sum(0)
        if grads is not None:
            grads.from_low(count)
        return found


def _as_int16(t: torch.Tensor) -> torch.Tensor:
    """A bfloat16 tensor's bits as int16, where ReLU's comparisons with 0 can run: a bfloat16 and
    its int16 share the sign bit, and non-negative bfloat16s order as their bits do. torch's own
    bfloat16 elementwise kernels widen to float32 and back (~35 us for ReLU at 256 x 400 here,
    int16 ~9 us)."""
    return t.view(torch.int16) if t.dtype == torch.bfloat16 else t


def relu_(h: torch.Tensor) -> torch.Tensor:
    """max(h, 0) in place (bfloat16: on its bits, negatives to +0; a negative NaN becomes 0 there
    too, where torch keeps it). Returns `h`."""
    _as_int16(h).clamp_(min=0)
    return h


def relu_backward(g: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """ReLU's derivative, in place on `g` where the layer's output `out` is 0: autograd's own
    kernel (~13 us at 256 x 400 float32; a comparison mask and a multiply take ~150 us), on the bits
    of bfloat16 operands (`_as_int16`; ~16 us against ~47 us for torch's bfloat16 kernel)."""
    bits = _as_int16(g)
    torch.ops.aten.threshold_backward.grad_input(bits, _as_int16(out), 0, grad_input=bits)
    return g


def adam_step(optimizer: torch.optim.Adam) -> None:
    """`optimizer.step()` of a fused Adam over one flat tensor, calling its kernel directly: the
    same state, the same kernel and arguments as torch.optim.adam's fused path, without its
    ~140 us of per-call Python (hooks, grouping by device, profiler records). The first step
    goes through torch, which creates the state."""
    group = optimizer.param_groups[0]
    (param,) = group["params"]
    state = optimizer.state.get(param)
    if not state:
        optimizer.step()
        return
    beta1, beta2 = group["betas"]
    state["step"].add_(1)
    torch._fused_adam_([param], [param.grad], [state["exp_avg"]], [state["exp_avg_sq"]], [], [state["step"]],
                       amsgrad=group["amsgrad"], lr=group["lr"], beta1=beta1, beta2=beta2,
                       weight_decay=group["weight_decay"], eps=group["eps"], maximize=group["maximize"])


@implements(Learner)
class FusedActorCriticLearner:
    """DDPG's or TD3's update (pearl/algos/ddpg.py, td3.py) for plain MLPs on the CPU, its matrix
    products in `precision` (fp32, or bf16: FlatMLPs).

    Same interface and checkpoint layout as ContinuousLearner (flat weights per network, flat Adam
    moments per optimizer), so either learner loads the other's checkpoints.
    """

    kernel = "fused"

    def __init__(self, algo, precision: str = "fp32"):
        self.algo = algo
        cfg = algo.config
        self.precision, self.dtype = precision, PRECISIONS[precision]
        self.twin = algo.name == "td3"
        self.actor_sizes = algo.policy_sizes()
        self.critic_sizes = [algo.obs_dim + algo.action_dim, *cfg.hidden, 1]
        n_critics = 2 if self.twin else 1
        self.flat = {"actor": flatten_parameters(algo.actor), "actor_target": flatten_parameters(algo.actor_target)}
        for tag, module in (("critic", algo.critic), ("critic_target", algo.critic_target)):
            self.flat[tag] = flatten_parameters(module)
        self._flat_networks(n_critics)

    def _flat_networks(self, n_critics: int) -> None:
        """Gradients, the products' views of each flat network and the algorithm's optimizers over
        the flat tensors (same Adam, same state layout), from `self.flat`."""
        self.grads = {name: torch.zeros_like(self.flat[name]) for name in ("actor", "critic")}
        for name in self.grads:
            self.flat[name].grad = self.grads[name]
        # each network's layers as the products read them; for twin critics, critic i lives at
        # [i * size, (i + 1) * size) of the flat tensor
        shapes = {"actor": (self.actor_sizes, 1), "critic": (self.critic_sizes, n_critics)}
        self.nets = {name: FlatMLPs(self.flat[name].data, *shapes[name.removesuffix("_target")], self.dtype)
                     for name in self.flat}
        self.grad_nets = {name: FlatMLPs(self.grads[name], *shapes[name], self.dtype) for name in self.grads}
        lr = self.algo.config.lr
        self.algo.actor_optimizer = torch.optim.Adam([self.flat["actor"]], lr=lr, fused=True)
        self.algo.critic_optimizer = torch.optim.Adam([self.flat["critic"]], lr=lr, fused=True)
        self._buffers: dict[int, tuple] = {}

    def _buffers_for(self, batch: int):
        if batch not in self._buffers:
            n_critics = 2 if self.twin else 1
            critic_in = torch.empty(batch, self.critic_sizes[0])  # [s, a], the critic's input
            obs_dim = self.algo.obs_dim
            self._buffers[batch] = (
                MLPBuffers(self.actor_sizes, batch, self.dtype),
                MLPBuffers(self.critic_sizes, batch, self.dtype, n_critics),
                critic_in, critic_in[:, :obs_dim], critic_in[:, obs_dim:],
                torch.empty(batch), torch.empty(n_critics, batch, 1),  # y, dL/dq of each critic
                torch.empty(batch, self.algo.action_dim),  # smoothing noise
            )
        return self._buffers[batch]

    def update(self, batch):
        with torch.no_grad():
            return self._update(*(torch.from_numpy(a) for a in (batch.obs, batch.actions, batch.rewards,
                                                                   batch.next_obs, batch.discounts))), None

    def _update(self, obs, actions, rewards, next_obs, discounts) -> float:
        algo, cfg, nets = self.algo, self.algo.config, self.nets
        actor_buf, critic_buf, critic_in, in_obs, in_action, y, grad_q, noise = self._buffers_for(obs.shape[0])
        n_critics = critic_buf.n

        # y = R + discount * Q'(s', mu'(s'))   (TD3: smoothed target action, min over twin targets)
        next_a = actor_buf.forward(nets["actor_target"], next_obs)
        in_obs.copy_(next_obs)
        if self.twin:
            noise.normal_()
            smoothed_target_action(next_a.numpy(), noise.numpy(), cfg.target_policy_noise, cfg.target_noise_clip,
                                   in_action.numpy())
        else:
            torch.tanh(next_a, out=in_action)
        critic_buf.forward(nets["critic_target"], critic_in, n_critics)
        min_td_target(critic_buf.output, rewards.numpy(), discounts.numpy(), y.numpy())

        # critic(s): one Adam step on sum_i mean((Q_i(s, a) - y)^2), the critics as one batch
        in_obs.copy_(obs)
        in_action.copy_(actions)
        critic_buf.forward(nets["critic"], critic_in, n_critics)
        loss = 0.0
        for q, g in zip(critic_buf.outputs, grad_q.numpy()):
            loss += squared_error_gradient(q, y.numpy(), 2.0 / len(y), g)
        critic_buf.backward(nets["critic"], self.grad_nets["critic"], grad_q if n_critics > 1 else grad_q[0])
        adam_step(algo.critic_optimizer)
        nets["critic"].to_low()

        algo.updates += 1
        if self.twin and algo.updates % cfg.policy_delay:
            return loss
        # actor: one Adam step on -mean(Q_1(s, mu(s))), through the just-updated critic
        pi = actor_buf.forward(nets["actor"], obs).tanh_()
        in_action.copy_(pi)
        critic_buf.forward(nets["critic"], critic_in)
        grad_q1 = grad_q[0].fill_(-1.0 / len(y))
        grad_a = critic_buf.backward(nets["critic"], None, grad_q1, input_columns=slice(algo.obs_dim, None))
        grad_a.mul_(1.0 - pi.square())  # tanh's derivative
        actor_buf.backward(nets["actor"], self.grad_nets["actor"], grad_a)
        adam_step(algo.actor_optimizer)
        nets["actor"].to_low()

        # targets: theta' <- tau theta + (1 - tau) theta', one call per network
        self.flat["critic_target"].data.lerp_(self.flat["critic"].data, cfg.tau)
        self.flat["actor_target"].data.lerp_(self.flat["actor"].data, cfg.tau)
        nets["critic_target"].to_low()
        nets["actor_target"].to_low()
        return loss

    def update_target(self) -> None:
        """Nothing is owed at an interval: the targets move inside `update` (Polyak steps; TD3's
        every policy_delay-th update)."""

    def policy_weights(self) -> np.ndarray:
        """The actor's flat weights, without a copy (the actor's policy copies them on sync)."""
        return self.flat["actor"].data.numpy()

    def sync_to_algo(self) -> None:
        """The algorithm's parameters are views of the flat tensors: nothing to copy."""

    def _weights(self) -> dict[str, torch.Tensor]:
        """Each checkpointed network's flat float32 weights (ContinuousLearner's names and layout)."""
        return {name: flat.data for name, flat in self.flat.items()}

    def state_dict(self) -> dict:
        state = {name: weights.numpy().copy() for name, weights in self._weights().items()}
        state["optimizers"] = {name: optimizer_state(opt) for name, opt in self.algo.optimizers().items()}
        state["updates"] = self.algo.updates
        return state

    def load_state_dict(self, state: dict) -> None:
        with torch.no_grad():
            for name, weights in self._weights().items():
                weights.copy_(torch.from_numpy(np.asarray(state[name])).reshape(weights.shape))
                if name in self.nets:
                    self.nets[name].to_low()
        for name, opt in self.algo.optimizers().items():
            load_optimizer_state(opt, state["optimizers"][name])
        self.algo.updates = int(state["updates"])


@implements(Learner)
class FusedSACLearner(FusedActorCriticLearner):
    """SAC's update (pearl/algos/sac.py) for plain MLPs on the CPU, written out like DDPG's above:
    the squashed Gaussian's sampling, log-probability and their derivatives by hand, twin critics,
    the temperature's Adam step on log alpha, the critics' Polyak step. Same checkpoint layout as
    ContinuousLearner (its networks' flat weights: actor, critic, critic_target, temperature)."""

    def __init__(self, algo, precision: str = "fp32"):
        self.algo = algo
        cfg = algo.config
        self.precision, self.dtype = precision, PRECISIONS[precision]
        self.actor_sizes = algo.policy_sizes()  # its outputs: the mean and log std of each action component
        self.critic_sizes = [algo.obs_dim + algo.action_dim, *cfg.hidden, 1]
        self.flat = {name: flatten_parameters(getattr(algo, name)) for name in ("actor", "critic", "critic_target")}
        self._flat_networks(2)

    def _buffers_for(self, batch: int):
        if batch not in self._buffers:
            d, obs_dim = self.algo.action_dim, self.algo.obs_dim
            critic_in = torch.empty(batch, self.critic_sizes[0])  # [s, a], the critics' input
            self._buffers[batch] = (
                MLPBuffers(self.actor_sizes, batch, self.dtype),
                MLPBuffers(self.critic_sizes, batch, self.dtype, 2),
                critic_in, critic_in[:, :obs_dim], critic_in[:, obs_dim:],
                torch.empty(batch),  # y
                torch.empty(2, batch, 1),  # dL/dq of each critic
                # the policy's standard normal draws, its action, std and log pi
                torch.empty(batch, d), torch.empty(batch, d), torch.empty(batch, d), torch.empty(batch),
                torch.empty(batch, self.actor_sizes[-1]),  # dL/d(mean, log std)
            )
        return self._buffers[batch]

    def _sample(self, actor_buf: MLPBuffers, obs: torch.Tensor, noise: torch.Tensor, action: torch.Tensor,
                std: torch.Tensor, log_prob: torch.Tensor) -> None:
        """Writes tanh(u), std and log pi with u = mean + std * noise, noise drawn here
        (SquashedGaussianActor.sample, same draws from the same generator)."""
        out = actor_buf.forward(self.nets["actor"], obs)
        noise.normal_()
        squashed_gaussian_sample(out.numpy(), noise.numpy(), LOG_STD_MIN, LOG_STD_MAX, action.numpy(), std.numpy(),
                                 log_prob.numpy())

    def _update(self, obs, actions, rewards, next_obs, discounts) -> float:
        algo, cfg, nets = self.algo, self.algo.config, self.nets
        (actor_buf, critic_buf, critic_in, in_obs, in_action, y, grad_q, noise, a, std, log_prob,
         grad_out) = self._buffers_for(obs.shape[0])
        n = obs.shape[0]
        alpha = float(algo.temperature.log_alpha.exp())
        q, grads = critic_buf.outputs, grad_q.numpy()  # each critic's last output and its gradient

        # y = R + discount * (min_i Q_i'(s', a') - alpha log pi(a'|s')),  a' ~ pi(s'); the critics as one batch
        self._sample(actor_buf, next_obs, noise, a, std, log_prob)
        in_obs.copy_(next_obs)
        in_action.copy_(a)
        critic_buf.forward(nets["critic_target"], critic_in, 2)
        soft_td_target(*q, log_prob.numpy(), rewards.numpy(), discounts.numpy(), alpha, y.numpy())

        # critics: one Adam step on (mean((Q_1(s, a) - y)^2) + mean((Q_2(s, a) - y)^2)) / 2
        in_obs.copy_(obs)
        in_action.copy_(actions)
        critic_buf.forward(nets["critic"], critic_in, 2)
        loss = 0.0
        for i in range(2):
            loss += 0.5 * squared_error_gradient(q[i], y.numpy(), 1.0 / n, grads[i])
        critic_buf.backward(nets["critic"], self.grad_nets["critic"], grad_q)
        adam_step(algo.critic_optimizer)
        nets["critic"].to_low()

        # actor: one Adam step on mean(alpha log pi(a~|s) - min_i Q_i(s, a~)), a~ = tanh(u) reparameterised,
        # through the just-updated critics
        self._sample(actor_buf, obs, noise, a, std, log_prob)
        in_action.copy_(a)
        critic_buf.forward(nets["critic"], critic_in, 2)
        min_gradient_shares(*q, -1.0 / n, *grads)
        grad_a = critic_buf.backward(nets["critic"], None, grad_q, input_columns=slice(algo.obs_dim, None))
        squashed_gaussian_output_gradient(grad_a.numpy(), a.numpy(), std.numpy(), noise.numpy(),
                                          actor_buf.views[1][0][-1].numpy(), LOG_STD_MIN, LOG_STD_MAX, alpha / n,
                                          grad_out.numpy())
        actor_buf.backward(nets["actor"], self.grad_nets["actor"], grad_out)
        adam_step(algo.actor_optimizer)
        nets["actor"].to_low()

        # temperature: one Adam step on -mean(log_alpha (log pi + target_entropy))
        if cfg.autotune:
            log_alpha = algo.temperature.log_alpha
            log_alpha.grad = -(log_prob.mean() + algo.target_entropy).reshape(log_alpha.shape)
            adam_step(algo.temperature_optimizer)

        # critic targets: theta' <- tau theta + (1 - tau) theta'
        self.flat["critic_target"].data.lerp_(self.flat["critic"].data, cfg.tau)
        nets["critic_target"].to_low()
        algo.updates += 1
        return loss

    def _weights(self) -> dict[str, torch.Tensor]:
        return {**super()._weights(), "temperature": self.algo.temperature.log_alpha.data.view(1)}
