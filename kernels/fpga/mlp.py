"""Q-network inference and one DQN training step on an FPGA (hls/mlp), through any driver.

`FPGAQPolicy` has the interface of kernels/cpu/mlp.py's QPolicy for plain ReLU MLPs (`load`,
`q_values`, `greedy`): `load` marks the weights for upload, the next `q_values` sends them once
and the kernel keeps them on chip. `FPGAQTrainer.step` runs one gradient step of
FusedQLearner.update (kernels/cpu/qlearn.py) given the TD targets: weighted Huber loss, backward,
global-norm clipping, Adam with torch's rule; parameters and Adam moments stay in device buffers.
"""
from __future__ import annotations

import numpy as np

from pearl.kernels.cpu.mlp import MLPLayout


def _limits(sizes, batch):
    return {"PEARL_MLP_MAX_WIDTH": max(sizes), "PEARL_MLP_MAX_BATCH": batch}


class FPGAQPolicy:
    def __init__(self, sizes: list[int], max_batch: int = 256, *, device):
        if len(sizes) < 2 or len(sizes) - 1 > 4:
            raise ValueError(f"the FPGA MLP kernels take 1 to 4 layers, got sizes {sizes}")
        self.sizes, self.max_batch = list(sizes), int(max_batch)
        self.layout = MLPLayout(self.sizes)
        self.device = device
        self.kernel = self.device.kernel("pearl_mlp_forward", _limits(sizes, max_batch))
        def alloc(count, dtype, arg):
            return self.device.allocate(count, dtype, kernel=self.kernel, arg=arg)

        self._sizes = alloc(len(sizes), np.int32, "sizes")
        self._sizes.array[:] = sizes
        self._params = alloc(self.layout.size, np.float32, "params")
        self._obs = alloc(self.max_batch * sizes[0], np.float32, "obs")
        self._q = alloc(self.max_batch * sizes[-1], np.float32, "q")
        self._stale = True

    @property
    def flat(self) -> np.ndarray:
        return self._params.array

    def load(self, flat: np.ndarray) -> None:
        np.copyto(self._params.array, flat)
        self._stale = True

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        obs = np.asarray(obs, dtype=np.float32).reshape(-1, self.sizes[0])
        out = np.empty((obs.shape[0], self.sizes[-1]), np.float32)
        for start in range(0, obs.shape[0], self.max_batch):
            n = min(self.max_batch, obs.shape[0] - start)
            self._obs.array[:n * self.sizes[0]] = obs[start:start + n].ravel()
            self._obs.sync_to_device(n * self.sizes[0])
            load = self._stale
            if load:
                self._sizes.sync_to_device()
                self._params.sync_to_device()
                self._stale = False
            self.kernel.start(int(load), len(self.sizes) - 1, n, self._sizes, self._params, self._obs, self._q).wait()
            self._q.sync_from_device(n * self.sizes[-1])
            out[start:start + n] = self._q.array[:n * self.sizes[-1]].reshape(n, self.sizes[-1])
        return out

    def greedy(self, obs: np.ndarray) -> np.ndarray:
        return self.q_values(obs).argmax(axis=-1)


class FPGAQTrainer:
    """Online weights and Adam moments in device buffers; `step` = one FusedQLearner update."""

    def __init__(self, sizes: list[int], lr: float, max_grad_norm: float, betas=(0.9, 0.999),
                 adam_eps: float = 1e-8, max_batch: int = 256, *, device):
        if len(sizes) < 2 or len(sizes) - 1 > 4:
            raise ValueError(f"the FPGA MLP kernels take 1 to 4 layers, got sizes {sizes}")
        self.sizes, self.max_batch = list(sizes), int(max_batch)
        self.layout = MLPLayout(self.sizes)
        self.lr, self.max_grad_norm, self.betas, self.adam_eps = lr, max_grad_norm, betas, adam_eps
        self.device = device
        self.kernel = self.device.kernel("pearl_mlp_train_step", _limits(sizes, max_batch))
        n, b = self.layout.size, self.max_batch
        def alloc(count, dtype, arg):
            return self.device.allocate(count, dtype, kernel=self.kernel, arg=arg)

        self._sizes, self._hyper = alloc(len(sizes), np.int32, "sizes"), alloc(8, np.float64, "hyper")
        self._sizes.array[:] = sizes
        self._params, self._m = alloc(n, np.float32, "params"), alloc(n, np.float32, "exp_avg")
        self._v = alloc(n, np.float32, "exp_avg_sq")
        self._obs, self._actions = alloc(b * sizes[0], np.float32, "obs"), alloc(b, np.int32, "actions")
        self._targets, self._weights = alloc(b, np.float32, "targets"), alloc(b, np.float32, "weights")
        self._abs_td = alloc(b, np.float32, "abs_td")
        self.steps = 0
        self._sizes.sync_to_device()

    def load_state(self, online, exp_avg=None, exp_avg_sq=None, steps: int = 0) -> None:
        np.copyto(self._params.array, online)
        self._m.array[:] = 0.0 if exp_avg is None else exp_avg
        self._v.array[:] = 0.0 if exp_avg_sq is None else exp_avg_sq
        self.steps = int(steps)
        for buffer in (self._params, self._m, self._v):
            buffer.sync_to_device()

    def state(self) -> dict:
        for buffer in (self._params, self._m, self._v):
            buffer.sync_from_device()
        return {"online": self._params.array.copy(), "exp_avg": self._m.array.copy(),
                "exp_avg_sq": self._v.array.copy(), "steps": self.steps}

    def step(self, obs, actions, targets, weights=None) -> np.ndarray:
        """One gradient step toward `targets` (the TD targets of the taken `actions`); returns |TD|."""
        batch = len(actions)
        if not 1 <= batch <= self.max_batch:
            raise ValueError(f"batch must be in [1, {self.max_batch}], got {batch}")
        self.steps += 1
        self._hyper.array[:6] = (self.lr, self.betas[0], self.betas[1], self.adam_eps, self.max_grad_norm,
                                 self.steps)
        self._obs.array[:batch * self.sizes[0]] = np.asarray(obs, np.float32).ravel()
        self._actions.array[:batch] = actions
        self._targets.array[:batch] = targets
        self._weights.array[:batch] = 1.0 if weights is None else weights
        self._hyper.sync_to_device(6)
        self._obs.sync_to_device(batch * self.sizes[0])
        for buffer in (self._actions, self._targets, self._weights):
            buffer.sync_to_device(batch)
        self.kernel.start(len(self.sizes) - 1, batch, self._sizes, self._hyper, self._params, self._m, self._v,
                          self._obs, self._actions, self._targets, self._weights, self._abs_td).wait()
        self._abs_td.sync_from_device(batch)
        return self._abs_td.array[:batch].copy()
