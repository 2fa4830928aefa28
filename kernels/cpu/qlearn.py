"""A fused DQN training step for plain ReLU MLPs, in numpy.

PyTorch spends ~1.5 ms of dispatch and autograd bookkeeping on a double-DQN update of a 4-64-64-2
network at batch 64 on a 2-core CPU, for a few microseconds of arithmetic. This kernel does the
same step — TD target (double or vanilla), importance-weighted Huber loss, backward pass, gradient
norm clipping and Adam with PyTorch's exact update rule — as a short sequence of BLAS calls on
preallocated buffers. tests/test_qlearn_kernel.py holds it to the PyTorch reference in
pearl/algos/dqn.py.
"""
from __future__ import annotations

import numpy as np

from pearl.kernels.cpu.mlp import MLPLayout


class FusedQLearner:
    """Owns online weights, target weights and Adam state as flat float32 vectors."""

    def __init__(self, sizes: list[int], lr: float, double: bool, max_grad_norm: float,
                 betas: tuple[float, float] = (0.9, 0.999), adam_eps: float = 1e-8):
        self.layout = MLPLayout(sizes)
        self.lr, self.double, self.max_grad_norm = lr, double, max_grad_norm
        self.beta1, self.beta2 = betas
        self.adam_eps = adam_eps
        n = self.layout.size
        self.online = np.zeros(n, dtype=np.float32)
        self.target = np.zeros(n, dtype=np.float32)
        self.grad = np.zeros(n, dtype=np.float32)
        self.exp_avg = np.zeros(n, dtype=np.float32)
        self.exp_avg_sq = np.zeros(n, dtype=np.float32)
        self._scratch = np.zeros(n, dtype=np.float32)
        self.steps = 0
        self._online_layers = self.layout.views(self.online)
        self._target_layers = self.layout.views(self.target)
        self._grad_layers = self.layout.views(self.grad)

    # -- state ---------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"online": self.online.copy(), "target": self.target.copy(),
                "exp_avg": self.exp_avg.copy(), "exp_avg_sq": self.exp_avg_sq.copy(),
                "steps": self.steps}

    def load_state_dict(self, state: dict) -> None:
        for name in ("online", "target", "exp_avg", "exp_avg_sq"):
            np.copyto(getattr(self, name), state[name])
        self.steps = int(state["steps"])

    def update_target(self, tau: float) -> None:
        if tau >= 1.0:
            np.copyto(self.target, self.online)
        else:
            self.target *= 1.0 - tau
            self.target += tau * self.online

    # -- the step ------------------------------------------------------------------------------
    @staticmethod
    def _forward(layers, x: np.ndarray) -> list[np.ndarray]:
        """Activations of every layer (input first); hidden ones after ReLU, the last raw."""
        acts = [x]
        last = len(layers) - 1
        for i, (weight, bias) in enumerate(layers):
            h = acts[-1] @ weight.T
            h += bias
            if i < last:
                np.maximum(h, 0.0, out=h)
            acts.append(h)
        return acts

    def update(self, obs, actions, rewards, next_obs, discounts, weights=None):
        """One gradient step on a batch. Returns (loss, |TD error| per sample)."""
        batch = obs.shape[0]
        rows = np.arange(batch)
        # The online net sees obs and (for double DQN) next_obs in one pass; only the obs half
        # carries gradient.
        if self.double:
            acts = self._forward(self._online_layers, np.concatenate((obs, next_obs)))
            next_actions = acts[-1][batch:].argmax(axis=1)
            next_q = self._forward(self._target_layers, next_obs)[-1][rows, next_actions]
        else:
            acts = self._forward(self._online_layers, obs)
            next_q = self._forward(self._target_layers, next_obs)[-1].max(axis=1)
        q = acts[-1][rows, actions]
        td = q - (rewards + discounts * next_q)
        abs_td = np.abs(td)
        huber = np.where(abs_td <= 1.0, 0.5 * td * td, abs_td - 0.5)
        dq = np.clip(td, -1.0, 1.0)
        if weights is not None:
            huber *= weights
            dq *= weights
        loss = float(huber.mean())

        grad_out = np.zeros((batch, acts[-1].shape[1]), dtype=np.float32)
        grad_out[rows, actions] = dq / batch
        self._backward(acts, grad_out, batch)
        self._clip_grad_norm()
        self._adam()
        return loss, abs_td

    def _backward(self, acts: list[np.ndarray], grad_z: np.ndarray, batch: int) -> None:
        for layer in range(len(self._online_layers) - 1, -1, -1):
            weight, _ = self._online_layers[layer]
            grad_weight, grad_bias = self._grad_layers[layer]
            inputs = acts[layer][:batch]
            np.matmul(grad_z.T, inputs, out=grad_weight)
            np.sum(grad_z, axis=0, out=grad_bias)
            if layer:
                grad_z = grad_z @ weight
                grad_z *= inputs > 0.0

    def _clip_grad_norm(self) -> None:
        norm = float(np.sqrt(np.dot(self.grad, self.grad)))
        coef = self.max_grad_norm / (norm + 1e-6)  # torch.nn.utils.clip_grad_norm_'s rule
        if coef < 1.0:
            self.grad *= coef

    def _adam(self) -> None:
        """torch.optim.Adam (no weight decay, no amsgrad), step for step."""
        self.steps += 1
        b1, b2 = self.beta1, self.beta2
        self.exp_avg *= b1
        self.exp_avg += (1.0 - b1) * self.grad
        self.exp_avg_sq *= b2
        np.multiply(self.grad, self.grad, out=self._scratch)
        self._scratch *= 1.0 - b2
        self.exp_avg_sq += self._scratch
        bias_correction1 = 1.0 - b1 ** self.steps
        bias_correction2_sqrt = np.sqrt(1.0 - b2 ** self.steps)
        np.sqrt(self.exp_avg_sq, out=self._scratch)
        self._scratch /= bias_correction2_sqrt
        self._scratch += self.adam_eps
        np.divide(self.exp_avg, self._scratch, out=self._scratch)
        self._scratch *= self.lr / bias_correction1
        self.online -= self._scratch
