"""Per-call cost signatures (FLOPs and bytes moved) of the kernels the training loop's tasks run.

Counts are for float32 and count a multiply-add as 2 FLOPs. Bytes are the minimum traffic to and
from memory (inputs read once, outputs written once, parameters read once per call), the figure a
roofline model needs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

FLOAT_BYTES = 4


@dataclass(frozen=True)
class Cost:
    flops: float = 0.0
    bytes: float = 0.0

    def __add__(self, other: "Cost") -> "Cost":
        return Cost(self.flops + other.flops, self.bytes + other.bytes)

    def __mul__(self, times: float) -> "Cost":
        return Cost(self.flops * times, self.bytes * times)

    __rmul__ = __mul__


def mlp_parameter_count(sizes: list[int]) -> int:
    """Weights and biases of a dense MLP with layer widths `sizes` (input first, output last)."""
    return sum(n_in * n_out + n_out for n_in, n_out in zip(sizes[:-1], sizes[1:]))


def mlp_forward_cost(sizes: list[int], batch: int) -> Cost:
    matmul = sum(2 * n_in * n_out for n_in, n_out in zip(sizes[:-1], sizes[1:]))
    elementwise = sum(2 * n for n in sizes[1:])  # bias add + activation
    activations = sum(sizes) * batch * FLOAT_BYTES
    return Cost(flops=batch * (matmul + elementwise),
                bytes=activations + mlp_parameter_count(sizes) * FLOAT_BYTES)


def mlp_backward_cost(sizes: list[int], batch: int) -> Cost:
    """Gradients w.r.t. weights and inputs of every layer: twice the forward matmuls."""
    forward = mlp_forward_cost(sizes, batch)
    return Cost(flops=2 * forward.flops,
                bytes=forward.bytes + mlp_parameter_count(sizes) * FLOAT_BYTES)


def mlp_input_gradient_cost(sizes: list[int], batch: int, first_layer_inputs: int | None = None) -> Cost:
    """Back-propagation through an MLP whose weights are held fixed (an actor's loss through the
    critic): one product per layer for the input gradient, none for the weights. The first layer's
    product can be restricted to its last `first_layer_inputs` inputs (the action columns)."""
    first_in = sizes[0] if first_layer_inputs is None else first_layer_inputs
    matmul = 2 * first_in * sizes[1] + sum(2 * n_in * n_out for n_in, n_out in zip(sizes[1:-1], sizes[2:]))
    return Cost(flops=batch * matmul, bytes=sum(sizes) * batch * FLOAT_BYTES + mlp_parameter_count(sizes) * FLOAT_BYTES)


def soft_update_cost(n_params: int) -> Cost:
    """Polyak-averaging target weights: a lerp per parameter (3 FLOPs; reads both, writes one)."""
    return Cost(flops=3 * n_params, bytes=3 * n_params * FLOAT_BYTES)


def adam_cost(n_params: int) -> Cost:
    """One Adam step: ~10 FLOPs per parameter; reads param, grad, m, v and writes param, m, v."""
    return Cost(flops=10 * n_params, bytes=7 * n_params * FLOAT_BYTES)


def optimizer_cost(kind: str, n_params: int) -> Cost:
    """One step of DQN's optimizer (config dqn.optimizer.kind). RMSprop is costed in the form the
    DQN papers run, centered with momentum: ~10 FLOPs per parameter; reads param, grad, the squared
    and plain gradient averages and the momentum, and writes all but grad back."""
    if kind == "adam":
        return adam_cost(n_params)
    return Cost(flops=10 * n_params, bytes=9 * n_params * FLOAT_BYTES)


def sum_tree_cost(capacity: int, batch: int, fanout: int = 2) -> Cost:
    """A batch of root-to-leaf walks (sample) or leaf-to-root walks (update) in a K-ary sum tree."""
    depth = max(1, math.ceil(math.log(max(capacity, 2), fanout)))
    return Cost(flops=batch * depth * fanout, bytes=batch * depth * fanout * FLOAT_BYTES)


# -- convolutions (image observations; pearl/nets.py) ------------------------------------------------
def conv_layer_shapes(in_shape, conv) -> list[tuple[int, int, int, int, int]]:
    """Per conv layer [out channels, kernel, stride] (no padding) on an input (C, H, W):
    (in channels, out channels, kernel, output height, output width)."""
    channels, height, width = in_shape
    layers = []
    for out_channels, kernel, stride in conv:
        height, width = (height - kernel) // stride + 1, (width - kernel) // stride + 1
        layers.append((channels, out_channels, kernel, height, width))
        channels = out_channels
    return layers


def conv_output_size(in_shape, conv) -> int:
    """The flattened output of the conv layers: what the first fc layer takes."""
    _, channels, _, height, width = conv_layer_shapes(in_shape, conv)[-1]
    return channels * height * width


def encoder_learn_cost(in_shape, conv, batch: int, input_bytes: int) -> Cost:
    """An actor-critic's shared image encoder in one update (pearl/nets.py SharedEncoder): its
    forward on obs and its target's on next_obs, its backward from the critics' loss, its Adam
    step and its target's Polyak step."""
    params = conv_parameter_count(in_shape, conv)
    return (conv_forward_cost(in_shape, conv, batch, input_bytes) * 2 + conv_backward_cost(in_shape, conv, batch)
            + adam_cost(params) + soft_update_cost(params))


def conv_parameter_count(in_shape, conv) -> int:
    return sum(c_in * c_out * k * k + c_out for c_in, c_out, k, _, _ in conv_layer_shapes(in_shape, conv))


def conv_forward_cost(in_shape, conv, batch: int, input_bytes: int = FLOAT_BYTES) -> Cost:
    """Conv + bias + ReLU layers: 2 FLOPs per multiply-add (out elements x C_in k^2), 2 per output
    element for bias and ReLU; bytes: each layer's input and output activations once (the first
    layer's input at `input_bytes` per element: 1 for uint8 frames) and the weights once."""
    flops, activations = 0, in_shape[0] * in_shape[1] * in_shape[2] * input_bytes
    for c_in, c_out, k, h, w in conv_layer_shapes(in_shape, conv):
        outputs = c_out * h * w
        flops += outputs * (2 * c_in * k * k + 2)
        activations += outputs * FLOAT_BYTES
    return Cost(flops=batch * flops, bytes=batch * activations + conv_parameter_count(in_shape, conv) * FLOAT_BYTES)


def conv_backward_cost(in_shape, conv, batch: int) -> Cost:
    """Weight and input gradients: twice the forward multiply-adds (the first layer's input gradient
    is not needed, but torch's cost for it is small beside the others' and is not skipped on all
    paths; counted as the MLP's backward counts it)."""
    forward = conv_forward_cost(in_shape, conv, batch)
    return Cost(flops=2 * forward.flops, bytes=forward.bytes + conv_parameter_count(in_shape, conv) * FLOAT_BYTES)
