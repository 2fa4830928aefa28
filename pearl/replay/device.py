"""A replay table whose transitions and priority tree live on a torch device (a CUDA GPU).

Same interface as `Replay` (add / sample / update_priorities / state_dict), built from the
factories of a backend that keeps the table on its device (`kernels`: the cuda backend's
`storage` and `sum_tree`, kernels/cuda `TorchTransitionStorage`, `TorchSumTree`): sample draws its
indices on the device, gathers the rows there and returns a `Batch` of tensors on that device, so
a torch learner on the same device reads it with no host round trip; `update_priorities` takes
the learner's |TD| tensor as it is. Per sample the host sends the batch's uniforms (B float64,
from the runtime's numpy generator, so a seeded run draws what the CPU replay would) and reads
nothing back: the largest priority seen, the total and the minimum stay device tensors.
"""
from __future__ import annotations

import numpy as np
import torch

from pearl.contracts import ReplayTable, implements
from pearl.replay.base import FIELDS, Batch, admit_insert, admit_sample
from pearl.replay.prioritized import annealed_beta
from pearl.replay.rate_limiter import RateLimiter


@implements(ReplayTable)
class DeviceReplay:
    """Uniform (`prioritized=False`) or proportional prioritized replay on `device`."""

    progress = 0

    def __init__(self, capacity: int, obs_dim: int, device: str, prioritized: bool, *, kernels,
                 alpha: float = 0.6, beta: float = 0.4, beta_final: float = 1.0, beta_steps: int = 1,
                 priority_eps: float = 1e-6, fanout: int = 16, action_dtype=np.int64, action_shape=(),
                 rate_limiter: RateLimiter | None = None):
        # `device`: a torch device (cuda:N; "cpu" runs the same kernels on CPU tensors, as the
        # tests do without a GPU); `kernels`: the pearl.kernels.registry Backend building them
        self.capacity, self.obs_dim, self.prioritized = capacity, obs_dim, prioritized
        self.device = torch.device(device)
        self.rate_limiter = rate_limiter
        self.alpha, self.beta0, self.beta_final = alpha, beta, beta_final
        self.beta_steps, self.priority_eps, self.fanout = max(1, beta_steps), priority_eps, fanout
        self._new_tree = lambda: kernels.sum_tree(device, capacity, fanout)
        self.ring = kernels.storage(device, capacity, obs_dim, action_dtype, action_shape)
        self.tree = self._new_tree() if prioritized else None
        self._max_priority = torch.ones((), dtype=torch.float64, device=self.device)

    @property
    def size(self) -> int:
        return self.ring.size

    def __len__(self) -> int:
        return self.ring.size

    @property
    def storage(self) -> dict[str, torch.Tensor]:
        return self.ring.storage

    @property
    def beta(self) -> float:
        return annealed_beta(self.beta0, self.beta_final, self.beta_steps, self.progress)

    @property
    def max_priority(self) -> float:
        return float(self._max_priority)

    def add(self, obs, actions, rewards, next_obs, discounts) -> torch.Tensor:
        count = len(rewards)
        admit_insert(self.rate_limiter, count)
        chunks = [(obs, actions, rewards, next_obs, discounts)]
        if count > self.capacity:  # longer than the ring: written in order, so the last rows win
            chunks = [[np.asarray(v)[start:start + self.capacity] for v in chunks[0]]
                      for start in range(0, count, self.capacity)]
        for chunk in chunks:
            slots = self.ring.add(*chunk)
            if self.prioritized:
                self.tree.update(slots, (self._max_priority ** self.alpha).expand(len(slots)))
        return slots

    def sample(self, batch_size: int, rng: np.random.Generator) -> Batch:
        if not self.size:
            raise ValueError("cannot sample from an empty replay")
        admit_sample(self.rate_limiter, batch_size)
        uniforms = torch.from_numpy(rng.random(batch_size)).to(self.device, non_blocking=True)
        if not self.prioritized:
            indices = (uniforms * self.size).to(torch.int64)
            return Batch(**self.ring.gather(indices), indices=indices)
        indices = self.tree.sample(uniforms)
        total = self.tree.total_tensor()
        probabilities = self.tree.get(indices) / total
        min_probability = self.tree.min_tensor() / total
        weights = ((probabilities / min_probability) ** -self.beta).to(torch.float32)
        return Batch(**self.ring.gather(indices), indices=indices, weights=weights)

    def update_priorities(self, indices, td_errors) -> None:
        if not self.prioritized:
            return
        td = torch.as_tensor(td_errors, device=self.device).to(torch.float64)
        priorities = td.abs() + self.priority_eps
        self._max_priority = torch.maximum(self._max_priority, priorities.max())
        self.tree.update(indices, priorities ** self.alpha)

    def state_dict(self, detached: bool = False) -> dict:
        size = self.size  # (copies off the device whether detached or not)
        state = {"storage": {name: self.ring.storage[name][:size].cpu().numpy() for name in FIELDS},
                 "cursor": self.ring.cursor, "size": size, "inserted": self.ring.inserted}
        if self.prioritized:
            state.update(priorities=self.tree.get(torch.arange(size, device=self.device)).cpu().numpy(),
                         max_priority=self.max_priority, progress=self.progress)
        if self.rate_limiter is not None:
            state["rate_limiter"] = self.rate_limiter.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        size = int(state["size"])
        for name, values in state["storage"].items():
            self.ring.storage[name][:size] = torch.as_tensor(values, device=self.device)
        self.ring.cursor, self.ring.size = int(state["cursor"]), size
        self.ring.inserted = int(state["inserted"])
        if self.prioritized:
            self.tree = self._new_tree()
            self.tree.update(torch.arange(size, device=self.device), np.asarray(state["priorities"]))
            self._max_priority = torch.tensor(float(state["max_priority"]), dtype=torch.float64,
                                              device=self.device)
            self.progress = int(state["progress"])
        if self.rate_limiter is not None and "rate_limiter" in state:
            self.rate_limiter.load_state_dict(state["rate_limiter"])
