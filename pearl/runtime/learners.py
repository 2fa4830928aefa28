"""Learner kernels: who executes the algorithm's `learn` task on the Plan's learn device.

Both learners expose the same narrow interface (update, update_target, policy_weights, state) so
the runtime never cares which one runs:
- `FusedCPULearner`: the numpy fused Q-learning step (pearl.kernels.cpu), for plain MLP Q-nets on
  the CPU, where framework overhead dominates small networks; on 2 threads its big products run in
  pairs, and precision bf16 runs its inner hidden layers' products in bfloat16 (kernels/cpu/qlearn.py).
- `TorchLearner`: the algorithm's own PyTorch update on any torch device (cpu, cuda:N); runs any
  network, e.g. the dueling head; precision bf16 runs a CNN Q-network's forwards and backward on
  bfloat16 copies (pearl.nets.BF16Copy) with float32 master weights, Adam and loss (the Adam step
  compiled: kernels/cpu/bf16_adam.py).
Learner state travels as flat float32 vectors in torch parameter order, the layout every kernel
shares, so a checkpoint written by one learner loads into the other.
"""
from __future__ import annotations

from concurrent import futures
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from pearl.contracts import Learner, implements
from pearl.errors import ConfigError
from pearl.kernels.cpu import FusedQLearner
from pearl.kernels.cpu.float_mode import set_thread_float_mode, thread_float_mode
from pearl.nets import BF16Copy, as_views_of, optimizer_buffers


@implements(Learner)
class FusedCPULearner:
    kernel = "fused"

    def __init__(self, algo, threads: int = 1, precision: str = "fp32"):
        self.algo, self.precision = algo, precision
        cfg = algo.config
        self.kernel_impl = FusedQLearner(algo.policy_sizes(), cfg.lr, cfg.double, cfg.grad_clip,
                                         adam_eps=cfg.optimizer.eps, threads=threads, precision=precision)
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

    def __init__(self, algo, device: str, precision: str = "fp32", split_batch: bool = False, threads: int = 1):
        """`precision` bf16: a CNN Q-network (the builder refuses it for an MLP or off the cpu) learns
        through bfloat16 copies of the online and target networks; the algorithm's float32 networks
        are the masters, stepped by the algorithm's Adam (its state and hyperparameters) in compiled
        passes that also refresh the copy (BF16Copy.adam_step: as torch ops the step was four passes
        over the Nature network's 1.7M weights, ~5 ms of a ~17 ms update, benchmarks/cnn_paths.py).
        `split_batch` (cpu learners: the family decides, pearl/build.py): each update splits its batch
        in two halves and runs each half's forwards, loss and backward on a thread of its own (torch's
        ops release the GIL) with `threads // 2` op threads (at least one); autograd sums the two
        halves' gradients into the parameters' .grad (a + b: the same bits whichever half ends
        first), then the one optimizer step. The halves meet once an update, not at a barrier in
        every op as torch's intra-op threads do, so where an actor process takes a core for a while
        only the half on that core waits, and the core the other half leaves idle at the end runs
        the actor. The result is the whole batch's update up to float rounding (each half's sums
        are summed once more; in bf16 the gradients' sum is rounded to bfloat16 once more). Breakout,
        bf16, 2 threads, the processes runtime with one actor on the 2-core Zen 4 EPYC: ~10% more env
        steps/s than session 46's target-network forward on a thread of its own, six pairs won of six
        (`learn` 17.0-17.8 ms against 18.5-19.8; docs/BENCHMARKS.md, Pixels end to end, session 49)."""
        self.algo, self.precision = algo, precision
        self._split, self._half_threads = split_batch, max(1, threads // 2)
        self._pool = None
        self.device = torch.device(device)
        algo.online.to(self.device)
        algo.target.to(self.device)
        self._policy = np.zeros(algo.n_params(), dtype=np.float32)
        self._policy_stale = True
        params = list(algo.online.parameters())
        # on the cpu the online network's weights are views of the policy vector, so a sync reads it
        # without gathering them (the Nature CNN's 1.7M weights: ~0.7 ms CPU an update); not for
        # channels-last weights, whose memory order is not the flat layout's
        self._policy_views = self.device.type == "cpu" and all(p.is_contiguous() and p.dtype == torch.float32
                                                               for p in params)
        if self._policy_views:
            as_views_of(self._policy, params)
        self._low = None
        if precision == "bf16":
            self._low = {name: BF16Copy(net) for name, net in algo.networks().items()}

    def _tensor(self, array, dtype=None):
        if isinstance(array, torch.Tensor):  # a batch from a device replay table: already there
            return array.to(self.device) if dtype is None else array.to(self.device, dtype)
        tensor = torch.from_numpy(array)
        if self.device.type == "cuda":
            tensor = tensor.pin_memory().to(self.device, non_blocking=True)
        return tensor if dtype is None else tensor.to(dtype)

    def release(self) -> None:
        """Stops the second half's thread (the next update starts it again): a thread left alive would
        make a later processes run in this process start its actors by exec, not fork."""
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    def update(self, batch):
        weights = None if batch.weights is None else self._tensor(batch.weights)
        tensors = (self._tensor(batch.obs), self._tensor(batch.actions), self._tensor(batch.rewards),
                   self._tensor(batch.next_obs), self._tensor(batch.discounts), weights)
        if self._split and tensors[0].shape[0] > 1:
            loss, abs_td = self._update_split(tensors)
        elif self._low is None:
            loss, abs_td = self.algo.update(*tensors)
        else:
            loss, abs_td = self._update_bf16(*tensors)
        self._policy_stale = True
        # |TD| stays on the device for a device replay's priority update (no host round trip)
        return loss, abs_td if isinstance(batch.obs, torch.Tensor) else abs_td.cpu().numpy()

    def _update_split(self, tensors):
        """The update with the batch's two halves on two threads (`split_batch`)."""
        algo, low = self.algo, self._low
        networks = (algo.online, algo.target) if low is None else (low["online"], low["target"])
        n = tensors[0].shape[0]
        halves = (slice(0, n // 2), slice(n // 2, n))
        if self._pool is None:  # made at the first update: no thread exists before the runtime's start
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="pearl-half")
        threads, float_mode = torch.get_num_threads(), thread_float_mode()
        if low is None:
            algo.optimizer.zero_grad(set_to_none=True)
        other = self._pool.submit(self._half_backward, tensors, halves[1], n, networks, float_mode)
        try:
            first = self._half_backward(tensors, halves[0], n, networks, float_mode)
        finally:
            futures.wait((other,))  # (it writes the gradients: never left running)
            torch.set_num_threads(threads)
        (loss_a, td_a), (loss_b, td_b) = first, other.result()
        if low is None:
            algo.step()
        else:
            low["online"].adam_step(algo.optimizer, algo.config.grad_clip)
        share = halves[0].stop / n
        return float(loss_a * share + loss_b * (1.0 - share)), torch.cat((td_a, td_b))

    def _half_backward(self, tensors, half: slice, n: int, networks, float_mode: int):
        """The loss of the batch's rows `half` and its backward, scaled by the half's share of the
        batch (the whole batch's loss is the mean of its rows'); on the caller's thread or the
        worker, in the caller's float mode (cpu_kernel_mode sets it per thread)."""
        set_thread_float_mode(float_mode)
        torch.set_num_threads(self._half_threads)
        obs, actions, rewards, next_obs, discounts, weights = (None if t is None else t[half] for t in tensors)
        online, target = networks
        loss, abs_td = self.algo.loss(obs, actions, rewards, next_obs, discounts, weights, online=online, target=target)
        (loss * ((half.stop - half.start) / n)).backward()
        return loss.detach(), abs_td

    def _update_bf16(self, *tensors):
        """DQN.update's step with the loss taken through the bfloat16 copies (float32 outputs, so the
        loss and TD errors are float32) and the gradients handed to the float32 masters."""
        algo, low = self.algo, self._low
        loss, abs_td = algo.loss(*tensors, online=low["online"], target=low["target"])
        loss.backward()
        low["online"].adam_step(algo.optimizer, algo.config.grad_clip)
        return float(loss.detach()), abs_td

    def _refresh_low(self, *names) -> None:
        if self._low is not None:
            for name in names:
                self._low[name].refresh()

    def update_target(self) -> None:
        self.algo.update_target()
        self._refresh_low("target")

    def policy_weights(self) -> np.ndarray:
        if self._policy_stale and not self._policy_views:
            params = [p.detach().reshape(-1) for p in self.algo.online.parameters()]
            if self.device.type == "cpu":  # one pass into the vector (a CNN's 1.7M weights: ~0.7 ms saved a sync)
                torch.cat(params, out=torch.from_numpy(self._policy))
            else:
                self._policy[:] = torch.cat(params).cpu().numpy()
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
        self._refresh_low("online", "target")


def optimizer_state(optimizer: torch.optim.Optimizer) -> dict:
    """The optimizer's per-parameter buffers (Adam's moments, RMSprop's averages) as flat float32
    vectors in parameter order, keyed by their names (pearl.nets.optimizer_buffers), and its step
    count."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    state = optimizer.state

    def buffer(name):
        return np.concatenate([state[p][name].detach().reshape(-1).cpu().numpy() if p in state
                               else np.zeros(p.numel(), np.float32) for p in params])
    steps = int(state[params[0]]["step"]) if params[0] in state else 0
    return {**{name: buffer(name) for name in optimizer_buffers(optimizer)}, "steps": steps}


def load_optimizer_state(optimizer: torch.optim.Optimizer, state: dict) -> None:
    """The inverse of `optimizer_state`."""
    optimizer.state.clear()
    if not state["steps"]:
        return
    names = optimizer_buffers(optimizer)
    # a fused Adam (pearl.nets.adam) wants its step on the weights' device, RMSprop on the cpu
    fused = isinstance(optimizer, torch.optim.Adam)
    missing = [name for name in names if name not in state]
    if missing:  # a checkpoint of another optimizer: the config's optimizer was changed
        raise ConfigError(f"dqn.optimizer: the checkpoint holds no {missing[0]} state for this optimizer "
                          f"({type(optimizer).__name__}); expected the optimizer the run was saved with")
    offset = 0
    for group in optimizer.param_groups:
        for p in group["params"]:
            n = p.numel()
            optimizer.state[p] = {"step": torch.tensor(float(state["steps"]), device=p.device if fused else "cpu"), **{
                name: torch.from_numpy(state[name][offset:offset + n].copy()).view_as(p).to(p.device)
                for name in names}}
            offset += n
