"""Networks for image observations: a convolutional encoder, the CNN Q-network built on it, and the
actors' torch copy of a network the numpy act kernels do not run.

Observations reach the networks as the env gives them (uint8 frames, channels first, as
pearl.envs arranges them) and become float only here, scaled by `obs_scale` (1/255 for Atari
frames, 1 for MinAtar's 0/1 boards): the replay and the rings carry a quarter of float32's bytes.

The default stack is the Nature DQN's (Mnih et al. 2015): conv 32 8x8 stride 4, 64 4x4 stride 2,
64 3x3 stride 1, then fc 512 (the algorithm's `hidden`). MinAtar's (Young & Tian 2019) is one
16 3x3 stride 1 conv and fc 128. A layer is [out channels, kernel, stride], no padding.
"""
from __future__ import annotations

import copy
import functools
import math

import numpy as np
import torch
from torch import nn

NATURE_CONV = ((32, 8, 4), (64, 4, 2), (64, 3, 1))


def is_image(obs_shape) -> bool:
    """Observations the convolutional networks take: (C, H, W) or (H, W)."""
    return len(obs_shape) in (2, 3)


def conv_shapes(obs_shape, conv) -> list[tuple[int, int, int]]:
    """(channels, height, width) of the input and of every conv layer's output."""
    c, h, w = obs_shape if len(obs_shape) == 3 else (1, *obs_shape)
    shapes = [(c, h, w)]
    for out_channels, kernel, stride in conv:
        h, w = (h - kernel) // stride + 1, (w - kernel) // stride + 1
        if h < 1 or w < 1:
            return shapes + [(out_channels, h, w)]
        shapes.append((out_channels, h, w))
    return shapes


def check_conv(obs_shape, conv, field: str) -> None:
    """One line naming the field if the stack does not fit the observation (a kernel larger than
    what is left of the image)."""
    from pearl.errors import ConfigError

    shapes = conv_shapes(obs_shape, conv)
    if shapes[-1][1] < 1 or shapes[-1][2] < 1:
        layer = len(shapes) - 2
        raise ConfigError(f"{field}[{layer}]: the kernel {conv[layer][1]} does not fit the "
                          f"{shapes[-2][1]}x{shapes[-2][2]} image left by the layers before it "
                          f"(observation shape {tuple(obs_shape)})")


class ConvEncoder(nn.Module):
    """Image -> flat features: float conversion and scaling, conv + ReLU layers, flatten."""

    def __init__(self, obs_shape, conv, obs_scale: float):
        super().__init__()
        shapes = conv_shapes(obs_shape, conv)
        self.in_shape = shapes[0]
        self.obs_scale = obs_scale
        layers: list[nn.Module] = []
        for (in_channels, _, _), (out_channels, kernel, stride) in zip(shapes, conv):
            layers += [nn.Conv2d(in_channels, out_channels, kernel, stride), nn.ReLU()]
        self.convs = nn.Sequential(*layers)
        self.out_features = int(np.prod(shapes[-1]))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        # (N, C, H, W), (N, H, W) (one channel) or rows of the flattened image: a view as (N, C, H, W),
        # converted once to the convolutions' dtype (float32, or a BF16Copy's bfloat16) and layout
        weight = self.convs[0].weight
        layout = torch.channels_last if weight.dtype == torch.bfloat16 else torch.contiguous_format
        x = obs.reshape(obs.shape[0], *self.in_shape).to(weight.dtype, memory_format=layout)
        if self.obs_scale != 1.0:
            x = x * self.obs_scale
        return self.convs(x).flatten(1)


def mlp(sizes, last_activation: bool = False) -> list[nn.Module]:
    layers: list[nn.Module] = []
    for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(nn.Linear(n_in, n_out))
        if i < len(sizes) - 2 or last_activation:
            layers.append(nn.ReLU())
    return layers


def adam(module: nn.Module, lr: float, eps: float = 1e-8) -> torch.optim.Adam:
    """Every algorithm's optimizer. fused: one pass over each tensor for the whole Adam update (CPU
    and CUDA alike); on the CPU it takes ~270 us for a 400x300 critic where the default
    multi-tensor path takes ~530 us, and a Nature DQN update 26.3 ms instead of 29.2 ms (Zen 3,
    2 threads; benchmarks/cnn_paths.py, paths fp32_foreach / fp32)."""
    return torch.optim.Adam(module.parameters(), lr=lr, eps=eps, fused=True)


def make_optimizer(module: nn.Module, lr: float, settings) -> torch.optim.Optimizer:
    """`settings` (config.OptimizerConfig): `adam` above, or torch's RMSprop."""
    if settings.kind == "adam":
        return adam(module, lr, settings.eps)
    return torch.optim.RMSprop(module.parameters(), lr=lr, alpha=settings.alpha, eps=settings.eps,
                               momentum=settings.momentum, centered=settings.centered)


def optimizer_buffers(optimizer: torch.optim.Optimizer) -> tuple[str, ...]:
    """The names of the per-parameter state tensors `optimizer` keeps (one weight-shaped tensor
    each, in optimizer.state[param]) beside its step count."""
    if isinstance(optimizer, torch.optim.RMSprop):
        group = optimizer.param_groups[0]
        return ("square_avg", *(("momentum_buffer",) if group["momentum"] > 0 else ()),
                *(("grad_avg",) if group["centered"] else ()))
    return ("exp_avg", "exp_avg_sq")


class CNNQNetwork(nn.Module):
    """Q(s, .) from an image: the conv encoder, fc `hidden` layers, then Q-values (or the dueling
    head: V(s) + A(s, a) - mean_a A(s, a), Wang et al. 2016)."""

    def __init__(self, obs_shape, n_actions: int, hidden, dueling: bool, conv=NATURE_CONV,
                 obs_scale: float = 1.0):
        super().__init__()
        self.encoder = ConvEncoder(obs_shape, conv, obs_scale)
        sizes = [self.encoder.out_features, *hidden]
        self.dueling = dueling
        if dueling:
            self.trunk = nn.Sequential(*mlp(sizes, last_activation=True))
            self.value = nn.Linear(sizes[-1], 1)
            self.advantage = nn.Linear(sizes[-1], n_actions)
        else:
            self.trunk = nn.Sequential(*mlp([*sizes, n_actions]))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        h = self.trunk(self.encoder(obs))
        if not self.dueling:
            return h
        advantage = self.advantage(h)
        return self.value(h) + advantage - advantage.mean(dim=-1, keepdim=True)


class BF16Copy(nn.Module):
    """A bfloat16, channels-last copy of a float32 network, for a learner whose convolutions and
    products run in bfloat16 (runtime.learner_precision: bf16) while the float32 network stays the
    master: Adam updates it, checkpoints and actors read it. Why a kept copy rather than autocast:
    autocast converts every weight at every forward (three per DQN update) and its gradients come back
    through per-op casts; oneDNN's bfloat16 kernels (AMX on this Xeon) want the channels-last bfloat16
    operands directly (benchmarks/cnn_paths.py: full-bf16 copies vs autocast, docs/BENCHMARKS.md).

    uint8 frames enter as their integer values (exact in bfloat16), converted to channels-last
    bfloat16 in one compiled pass (kernels/cpu/pixels.py); the encoder's input scale (1/255 for Atari)
    is folded into the first convolution's weights instead (conv(s x) = conv with s W, one rounding of
    s W), which saves a pass over each input batch.

    Outputs are float32, so losses and targets are computed in float32. `refresh` copies the master's
    weights in (after a target update or a load); `adam_step` steps the master by Adam on this copy's
    gradients and refreshes the copy, in two compiled passes per parameter (kernels/cpu/bf16_adam.py);
    cpu tensors only."""

    def __init__(self, master: nn.Module):
        super().__init__()
        from pearl.kernels.cpu.pixels import BF16_OF_BYTE, bytes_to_bf16_nhwc

        self.net = copy.deepcopy(master).to(dtype=torch.bfloat16, memory_format=torch.channels_last)
        encoder = self.net.encoder
        # each convolution with its ReLU: one oneDNN call without autograd (same parameters, same order)
        layers = list(encoder.convs)
        encoder.convs = nn.Sequential(*(ConvReLU(conv) for conv in layers[0::2]))
        self._pairs = (list(self.net.parameters()), list(master.parameters()))
        self._convert, self._table = bytes_to_bf16_nhwc, BF16_OF_BYTE
        self._in_shape, self._scale = encoder.in_shape, encoder.obs_scale
        encoder.obs_scale = 1.0
        # the first convolution's weight, in the copy and in the master: where the scale is folded
        self._first = encoder.convs[0].weight, master.encoder.convs[0].weight
        self._views, self._row, self._moment_views = None, None, {}  # adam_step's, made at its first call
        self.refresh()

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        if obs.dtype == torch.uint8 and obs.device.type == "cpu":
            n, (c, h, w) = obs.shape[0], self._in_shape
            # a new buffer per call: autograd keeps each forward's input for the weight gradients
            bits = np.empty((n, h * w, c), np.uint16)
            self._convert(obs.numpy().reshape(n, c, h * w), self._table, bits)
            obs = torch.from_numpy(bits).view(torch.bfloat16).view(n, h, w, c).permute(0, 3, 1, 2)
        return self.net(obs).float()

    def refresh(self) -> None:
        with torch.no_grad():
            torch._foreach_copy_(*self._pairs)
            if self._scale != 1.0:
                low, master = self._first
                low.copy_(master * self._scale)

    def adam_step(self, optimizer: torch.optim.Adam, max_norm: float) -> None:
        """optimizer.step() on the master's parameters (a torch.optim.Adam over them, which holds the
        state and the hyperparameters; no weight decay, amsgrad or maximize) for the gradient this
        copy's backward left, times the folded scale, clipped to `max_norm` as
        torch.nn.utils.clip_grad_norm_ (coefficient max_norm / (norm + 1e-6) when below 1), then the
        copy refreshed from the new weights; clears this copy's gradients. The master's .grad is not
        written."""
        from pearl.kernels.cpu.bf16_adam import adam_to_bf16, bf16_sumsq

        lows, masters = self._pairs
        if self._views is None:  # numpy views of the weights in the copy's order (their tensors stay)
            self._views = [(_in_low_order(master.data).numpy(), _bits(_in_low_order(low.data)),
                            self._scale if low is self._first[0] else 1.0) for low, master in zip(lows, masters)]
            self._row = np.empty(max(view[1].shape[2] for view in self._views), np.float32)
        sumsq, grads = 0.0, []
        for low, (_, _, scale) in zip(lows, self._views):
            bits = _bits(_in_low_order(low.grad).contiguous())  # the array keeps the gradient's memory
            sumsq += bf16_sumsq(bits.reshape(-1)) * scale * scale
            grads.append(bits)
            low.grad = None
        coef = max_norm / (math.sqrt(sumsq) + 1e-6)
        clip = coef if coef < 1.0 else 1.0
        group = optimizer.param_groups[0]
        (beta1, beta2), lr, eps = group["betas"], group["lr"], group["eps"]
        for i, (master, grad, (weights, low_bits, scale)) in enumerate(zip(masters, grads, self._views)):
            state = optimizer.state[master]
            if not state:
                state.update(step=torch.tensor(0.0), exp_avg=torch.zeros_like(master),
                             exp_avg_sq=torch.zeros_like(master))
            state["step"] += 1
            exp_avg, exp_avg_sq = self._moments(i, state)
            adam_to_bf16(grad, scale * clip, weights, exp_avg, exp_avg_sq, low_bits, scale, self._row,
                         lr, beta1, beta2, eps, float(state["step"]))

    def _moments(self, i: int, state: dict) -> tuple[np.ndarray, np.ndarray]:
        """Numpy views of parameter i's Adam moments in the copy's order, made again when the state's
        tensors change (a checkpoint load replaces them: load_optimizer_state)."""
        tensors = state["exp_avg"], state["exp_avg_sq"]
        cached = self._moment_views.get(i)
        if cached is None or cached[0][0] is not tensors[0] or cached[0][1] is not tensors[1]:
            cached = self._moment_views[i] = tensors, tuple(_in_low_order(t).numpy() for t in tensors)
        return cached[1]


class ConvReLU(nn.Module):
    """relu(conv(x)) of a BF16Copy's convolution (no padding, no dilation, one group). Without
    autograd (the target's forward, double DQN's argmax) one oneDNN convolution with the ReLU as its
    post-op: torch's separate ReLU is one more pass over each activation (~0.35-0.45 ms of a ~3.5-6
    ms no-grad Nature forward at batch 32, docs/BENCHMARKS.md session 14); the same bfloat16 numbers.
    With autograd the two torch ops, whose backward autograd runs: the fused forward with the pair's
    backward written out (threshold_backward, convolution_backward) made the backward 0.5-1.4 ms
    slower, for reasons not found."""

    def __init__(self, conv: nn.Conv2d):
        super().__init__()
        self.conv = conv

    @property
    def weight(self) -> torch.Tensor:  # what ConvEncoder reads its input dtype from, as of nn.Conv2d
        return self.conv.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        conv = self.conv
        if (torch.is_grad_enabled() and (conv.weight.requires_grad or x.requires_grad)) or not _fused_bf16_conv():
            return torch.relu(conv(x))
        return torch.ops.mkldnn._convolution_pointwise(x, conv.weight, conv.bias, [0, 0], list(conv.stride),
                                                       [1, 1], 1, "relu", [], None)


@functools.cache
def _fused_bf16_conv() -> bool:
    """Whether oneDNN takes a bfloat16 convolution with a post-op on this CPU: it wants AVX-512
    (BW, VL, DQ) or AVX-NE-CONVERT and raises elsewhere (an AMD Zen 3); torch's own convolution
    runs bfloat16 on any CPU."""
    return torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()


def _in_low_order(t: torch.Tensor) -> torch.Tensor:
    """A parameter-shaped tensor as (rows, positions, channels) in a BF16Copy weight's memory order:
    a convolution weight (O, I, H, W), channels-last there, as (O, H*W, I); a matrix (1, out, in); a
    vector (1, 1, n). A view (strided for the master's own layout)."""
    if t.dim() == 4:
        o, i, h, w = t.shape
        return t.permute(0, 2, 3, 1).reshape(o, h * w, i)
    return t.reshape(1, -1, t.shape[-1])


def _bits(t: torch.Tensor) -> np.ndarray:
    """A bfloat16 tensor's bits as a numpy uint16 view."""
    return t.view(torch.int16).numpy().view(np.uint16)


def as_views_of(flat: np.ndarray, params) -> None:
    """Makes each (contiguous, cpu, float32) parameter a view of its span of `flat`, in parameter
    order (the flat weights' layout), keeping its values: the parameter objects stay the same."""
    offset = 0
    for p in params:
        n = p.numel()
        view = torch.from_numpy(flat[offset:offset + n]).view_as(p)
        view.copy_(p.data)
        p.data = view
        offset += n


class TorchPolicy:
    """The actor's copy of a network the numpy act kernels cannot run (a CNN): the network built by
    `build()` on the cpu, loaded from the flat float32 weights every learner publishes.

    `threads`: torch's intra-op threads for this process (an actor process: 1, so that the actors
    and the learner do not fight over the cores); None leaves the process's setting alone.
    `q_values` is the network's raw output: Q-values, or an actor-critic policy's pre-squash
    outputs (pearl.runtime.continuous.ContinuousPolicy takes this object as its network).
    """

    def __init__(self, build, threads: int | None = None):
        if threads is not None:
            torch.set_num_threads(threads)
        self.net = build().requires_grad_(False)
        self.net.eval()
        self.flat = np.zeros(sum(p.numel() for p in self.net.parameters()), dtype=np.float32)
        # the parameters are views of `flat`, so a load is one copy (a sync of the Nature CNN's 1.7M
        # weights every update: two copies cost ~1 ms more)
        as_views_of(self.flat, self.net.parameters())

    def load(self, flat: np.ndarray) -> None:
        np.copyto(self.flat, flat)

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return self.net(torch.from_numpy(np.ascontiguousarray(obs))).numpy()

    def greedy(self, obs: np.ndarray) -> np.ndarray:
        return self.q_values(obs).argmax(axis=-1)


class SharedEncoder:
    """DDPG's, TD3's and SAC's image front end: one conv encoder shared by the actor and the critics
    (as in SAC-AE, Yarats et al. 2021, and DrQ, Kostrikov et al. 2021), trained by the critics'
    loss only (the actor sees its features detached), with a Polyak-averaged target copy for the
    next observations. The actor and critic MLPs then work on features as they work on flat
    observations; the actor's policy for acting is `policy(actor_mlp)`: encoder, then the MLP."""

    def __init__(self, obs_shape, conv, obs_scale: float):
        self.online = ConvEncoder(obs_shape, conv, obs_scale)
        self.target = copy.deepcopy(self.online).requires_grad_(False)
        self.features = self.online.out_features

    def encode(self, obs: torch.Tensor, next_obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Features of obs (with gradients into the encoder) and of next_obs (the target's)."""
        with torch.no_grad():
            next_features = self.target(next_obs)
        return self.online(obs), next_features

    def soft_update(self, tau: float) -> None:
        with torch.no_grad():
            torch._foreach_lerp_(list(self.target.parameters()), list(self.online.parameters()), tau)

    def policy(self, actor_mlp: nn.Module) -> nn.Sequential:
        """The acting network: the online encoder (shared, not copied), then the actor's MLP."""
        return nn.Sequential(self.online, actor_mlp)


def encoded_policy(obs_shape, conv, obs_scale: float, sizes) -> nn.Sequential:
    """An actor process's copy of `SharedEncoder.policy`: the same modules in the same order, so it
    loads the same flat weights."""
    return nn.Sequential(ConvEncoder(obs_shape, conv, obs_scale), nn.Sequential(*mlp(sizes)))
