"""Learner kernels: who executes the algorithm's `learn` task on the Plan's learn device.

Both learners expose the same narrow interface (update, update_target, policy_weights, state) so
the runtime never cares which one runs:
- `FusedCPULearner`: the numpy fused Q-learning step (pearl.kernels.cpu), for plain MLP Q-nets on
  the CPU, where framework overhead dominates small networks.
- `TorchLearner`: the algorithm's own PyTorch update on any torch device (cpu, cuda:N); runs any
  network, e.g. the dueling head.
Learner state travels as flat float32 vectors in torch parameter order, the layout every kernel
shares, so a checkpoint written by one learner loads into the other.
"""
from __future__ import annotations

import numpy as np
import torch

from pearl.contracts import Learner, implements
from pearl.kernels.cpu import FusedQLearner


@implements(Learner)
class FusedCPULearner:
    kernel = "fused"

    def __init__(self, algo):
        self.algo = algo
        cfg = algo.config
        self.kernel_impl = FusedQLearner(algo.policy_sizes(), cfg.lr, cfg.double, cfg.max_grad_norm)
        self.kernel_impl.online[:] = algo.flat_weights(algo.online)
        self.kernel_impl.target[:] = algo.flat_weights(algo.target)

    def update(self, batch):
        return self.kernel_impl.update(batch.obs, batch.actions, batch.rewards, batch.next_obs,
                                       batch.discounts, batch.weights)

    def update_target(self) -> None:
        self.kernel_impl.update_target(self.algo.config.tau)

    def policy_weights(self) -> np.ndarray:
        return self.kernel_impl.online

    def sync_to_algo(self) -> None:
        """Writes the kernel's weights into the algorithm's torch networks (for save / export)."""
        self.algo.load_flat_weights(self.algo.online, self.kernel_impl.online)
        self.algo.load_flat_weights(self.algo.target, self.kernel_impl.target)

    def state_dict(self) -> dict:
        return self.kernel_impl.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.kernel_impl.load_state_dict(state)
        self.sync_to_algo()


@implements(Learner)
class TorchLearner:
    kernel = "torch"

    def __init__(self, algo, device: str):
        self.algo = algo
        self.device = torch.device(device)
        algo.online.to(self.device)
        algo.target.to(self.device)
        self._policy = np.zeros(algo.n_params(), dtype=np.float32)
        self._policy_stale = True

    def _tensor(self, array, dtype=None):
        if isinstance(array, torch.Tensor):  # a batch from a device replay table: already there
            return array.to(self.device) if dtype is None else array.to(self.device, dtype)
        tensor = torch.from_numpy(array)
        if self.device.type == "cuda":
            tensor = tensor.pin_memory().to(self.device, non_blocking=True)
        return tensor if dtype is None else tensor.to(dtype)

    def update(self, batch):
        weights = None if batch.weights is None else self._tensor(batch.weights)
        loss, abs_td = self.algo.update(self._tensor(batch.obs), self._tensor(batch.actions),
                                        self._tensor(batch.rewards), self._tensor(batch.next_obs),
                                        self._tensor(batch.discounts), weights)
        self._policy_stale = True
        # |TD| stays on the device for a device replay's priority update (no host round trip)
        return loss, abs_td if isinstance(batch.obs, torch.Tensor) else abs_td.cpu().numpy()

    def update_target(self) -> None:
        self.algo.update_target()

    def policy_weights(self) -> np.ndarray:
        if self._policy_stale:
            self._policy[:] = self.algo.flat_weights(self.algo.online)
            self._policy_stale = False
        return self._policy

    def sync_to_algo(self) -> None:
        """The algorithm's networks are the learner's own: nothing to copy."""

    def state_dict(self) -> dict:
        return {"online": self.algo.flat_weights(self.algo.online),
                "target": self.algo.flat_weights(self.algo.target), **optimizer_state(self.algo.optimizer)}

    def load_state_dict(self, state: dict) -> None:
        self.algo.load_flat_weights(self.algo.online, state["online"])
        self.algo.load_flat_weights(self.algo.target, state["target"])
        self._policy_stale = True
        load_optimizer_state(self.algo.optimizer, state)


def optimizer_state(optimizer: torch.optim.Optimizer) -> dict:
    """Adam's moments as flat float32 vectors in parameter order, and its step count."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    state = optimizer.state

    def moment(name):
        return np.concatenate([state[p][name].detach().reshape(-1).cpu().numpy() if p in state
                               else np.zeros(p.numel(), np.float32) for p in params])
    steps = int(state[params[0]]["step"]) if params[0] in state else 0
    return {"exp_avg": moment("exp_avg"), "exp_avg_sq": moment("exp_avg_sq"), "steps": steps}


def load_optimizer_state(optimizer: torch.optim.Optimizer, state: dict) -> None:
    """The inverse of `optimizer_state`."""
    optimizer.state.clear()
    if not state["steps"]:
        return
    offset = 0
    for group in optimizer.param_groups:
        for p in group["params"]:
            n = p.numel()
            optimizer.state[p] = {
                "step": torch.tensor(float(state["steps"])),
                "exp_avg": torch.from_numpy(state["exp_avg"][offset:offset + n].copy()).view_as(p).to(p.device),
                "exp_avg_sq": torch.from_numpy(state["exp_avg_sq"][offset:offset + n].copy()).view_as(p).to(p.device),
            }
            offset += n
