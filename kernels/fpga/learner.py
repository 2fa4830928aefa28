"""The `learn` task on an FPGA: a learner with the interface of pearl/runtime/learners.py
(update, update_target, policy_weights, sync_to_algo, state_dict, load_state_dict) whose gradient
step is the `pearl_mlp_train_step` kernel and whose TD targets come from the `pearl_mlp_forward`
kernel (target network; online network for the double-DQN action choice).

Per update: next-state Q-values from the two forward kernels, the targets r + gamma^n * Q on the
host (as FusedQLearner forms them), one train-step call; the online weights are read back after
the step so the online forward kernel and the actors see them. Plain ReLU MLPs up to 4 layers x
256 wide and batches up to 256 (the kernels' build limits); no dueling head.
"""
from __future__ import annotations

import numpy as np

from pearl.errors import ConfigError
from pearl.kernels.fpga.mlp import FPGAQPolicy, FPGAQTrainer


class FPGALearner:
    def __init__(self, algo, device, batch_size: int):
        cfg = algo.config
        sizes = algo.policy_sizes()
        if cfg.dueling:
            raise ConfigError("plan.devices.learn: the FPGA training kernel runs plain MLP Q-networks, "
                              "not the dueling head (dqn.dueling: false, or learn on cpu/cuda)")
        if cfg.optimizer.kind != "adam":
            raise ConfigError(f"plan.devices.learn: the FPGA training kernel steps Adam, not "
                              f"{cfg.optimizer.kind} (dqn.optimizer.kind: adam, or learn on cpu/cuda)")
        if len(sizes) - 1 > 4 or max(sizes) > 256 or batch_size > 256:
            raise ConfigError(f"plan.devices.learn: the FPGA MLP kernels take up to 4 layers of width 256 "
                              f"and batches up to 256; got layers {sizes}, batch {batch_size}")
        self.algo, self.device = algo, device
        self.kernel = "fpga (simulated)" if device.simulated else "fpga"
        self.trainer = FPGAQTrainer(sizes, cfg.lr, cfg.grad_clip, adam_eps=cfg.optimizer.eps, max_batch=batch_size,
                                    device=device)
        self.online_policy = FPGAQPolicy(sizes, max_batch=batch_size, device=device)
        self.target_policy = FPGAQPolicy(sizes, max_batch=batch_size, device=device)
        self.online = algo.flat_weights(algo.online).astype(np.float32)
        self.target = algo.flat_weights(algo.target).astype(np.float32)
        self.trainer.load_state(self.online)
        self.online_policy.load(self.online)
        self.target_policy.load(self.target)

    def update(self, batch):
        next_q_all = self.target_policy.q_values(batch.next_obs)
        rows = np.arange(len(batch.actions))
        if self.algo.config.double:
            next_q = next_q_all[rows, self.online_policy.q_values(batch.next_obs).argmax(axis=1)]
        else:
            next_q = next_q_all.max(axis=1)
        targets = batch.rewards + batch.discounts * next_q
        abs_td = self.trainer.step(batch.obs, batch.actions, targets, batch.weights)
        huber = np.where(abs_td <= 1.0, 0.5 * abs_td * abs_td, abs_td - 0.5)
        if batch.weights is not None:
            huber = huber * batch.weights
        self.trainer._params.sync_from_device()
        np.copyto(self.online, self.trainer._params.array)
        self.online_policy.load(self.online)
        return float(huber.mean()), abs_td

    def update_target(self) -> None:
        tau = self.algo.config.tau
        if tau >= 1.0:
            np.copyto(self.target, self.online)
        else:
            self.target *= 1.0 - tau
            self.target += tau * self.online
        self.target_policy.load(self.target)

    def policy_weights(self) -> np.ndarray:
        return self.online

    def sync_to_algo(self) -> None:
        self.algo.load_flat_weights(self.algo.online, self.online)
        self.algo.load_flat_weights(self.algo.target, self.target)

    def state_dict(self) -> dict:
        state = self.trainer.state()
        return {"online": state["online"], "target": self.target.copy(), "exp_avg": state["exp_avg"],
                "exp_avg_sq": state["exp_avg_sq"], "steps": state["steps"]}

    def load_state_dict(self, state: dict) -> None:
        np.copyto(self.online, state["online"])
        np.copyto(self.target, state["target"])
        self.trainer.load_state(self.online, state["exp_avg"], state["exp_avg_sq"], int(state["steps"]))
        self.online_policy.load(self.online)
        self.target_policy.load(self.target)
        self.sync_to_algo()
