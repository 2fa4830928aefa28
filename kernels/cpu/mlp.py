"""Dense ReLU MLPs over one flat float32 parameter vector.

The flat vector holds each Linear layer's weight (out x in, row-major) then its bias, in the order
of the PyTorch module's `parameters()`, so weights move between a torch network, a fused learner
and an actor's policy as one contiguous copy.
"""
from __future__ import annotations

import numpy as np


class MLPLayout:
    """Where each layer's weight and bias sit in the flat parameter vector.

    `sizes` are the trunk widths (input first). A plain net's last trunk layer is the output; a
    dueling net adds a value head (1 output) and an advantage head (`n_actions` outputs).
    """

    def __init__(self, sizes: list[int], dueling_actions: int = 0):
        shapes = list(zip(sizes[1:], sizes[:-1]))
        if dueling_actions:
            shapes += [(1, sizes[-1]), (dueling_actions, sizes[-1])]
        self.shapes = shapes
        self.dueling = bool(dueling_actions)
        self.offsets = []
        offset = 0
        for n_out, n_in in shapes:
            self.offsets.append(offset)
            offset += n_out * n_in + n_out
        self.size = offset

    def views(self, flat: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
        """(weight, bias) views into `flat`; writing them writes `flat`."""
        out = []
        for (n_out, n_in), offset in zip(self.shapes, self.offsets):
            weight = flat[offset:offset + n_out * n_in].reshape(n_out, n_in)
            bias = flat[offset + n_out * n_in:offset + n_out * n_in + n_out]
            out.append((weight, bias))
        return out


class QPolicy:
    """Q-values of a batch of observations with numpy: the actor's copy of the learner's network."""

    def __init__(self, layout: MLPLayout):
        self.layout = layout
        self.flat = np.zeros(layout.size, dtype=np.float32)
        layers = [(weight.T, bias) for weight, bias in layout.views(self.flat)]  # views of flat
        n_heads = 2 if layout.dueling else 1
        self._hidden, self._heads = layers[:-n_heads], layers[-n_heads:]

    def load(self, flat: np.ndarray) -> None:
        np.copyto(self.flat, flat)

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        h = obs
        for weight_t, bias in self._hidden:
            h = h @ weight_t
            h += bias
            np.maximum(h, 0.0, out=h)
        if not self.layout.dueling:
            ((weight_t, bias),) = self._heads
            q = h @ weight_t
            q += bias
            return q
        (w_value, b_value), (w_adv, b_adv) = self._heads
        advantage = h @ w_adv + b_adv
        return (h @ w_value + b_value) + advantage - advantage.mean(axis=-1, keepdims=True)

    def greedy(self, obs: np.ndarray) -> np.ndarray:
        return self.q_values(obs).argmax(axis=-1)
