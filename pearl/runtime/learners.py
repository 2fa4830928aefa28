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

    def __init__(self, algo, device: str, precision: str = "fp32", target_thread: bool = False, threads: int = 1):
        """`precision` bf16: a CNN Q-network (the builder refuses it for an MLP or off the cpu) learns
        through bfloat16 copies of the online and target networks; the algorithm's float32 networks
        are the masters, stepped by the algorithm's Adam (its state and hyperparameters) in compiled
        passes that also refresh the copy (BF16Copy.adam_step: as torch ops the step was four passes
        over the Nature network's 1.7M weights, ~5 ms of a ~17 ms update, benchmarks/cnn_paths.py).
        `target_thread` (cpu learners: the family decides, pearl/build.py): the target network's forward of each update runs on a
        second thread beside the online network's forward (torch's ops release the GIL), one op
        thread each; no barrier per op as with torch's two intra-op threads, so a second core that
        an actor process also uses is taken only for that forward. Once the target's values are in,
        that thread is idle: the rest of the update (loss, backward, optimizer step) runs on torch's
        intra-op threads at `threads` (the learner's threads), then the count is put back. On the
        2-core Zen 4 EPYC the Nature update at batch 32 in bf16 took 12.4-12.8 ms so against
        14.2-14.8 with the backward on one thread, and the Breakout processes runtime ran ~4% more
        env steps/s (median of six interleaved rounds; docs/BENCHMARKS.md, Pixels end to end,
        session 46)."""
        self.algo, self.precision = algo, precision
        self._target_thread, self._threads = target_thread, threads
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
        """Stops the target thread (the next update starts it again): a thread left alive would
        make a later processes run in this process start its actors by exec, not fork."""
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    def update(self, batch):
        weights = None if batch.weights is None else self._tensor(batch.weights)
        tensors = (self._tensor(batch.obs), self._tensor(batch.actions), self._tensor(batch.rewards),
                   self._tensor(batch.next_obs), self._tensor(batch.discounts), weights)
        target = self.algo.target if self._low is None else self._low["target"]
        if self._target_thread:
            if self._pool is None:  # made at the first update: no thread exists before the runtime's start
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="pearl-target")
            target = _ForwardAhead(self._pool, target, tensors[3], self._threads)
            forward_threads = torch.get_num_threads()
        try:
            loss, abs_td = (self.algo.update(*tensors, target=target) if self._low is None
                            else self._update_bf16(*tensors, target=target))
        finally:
            if self._target_thread:
                torch.set_num_threads(forward_threads)
        self._policy_stale = True
        # |TD| stays on the device for a device replay's priority update (no host round trip)
        return loss, abs_td if isinstance(batch.obs, torch.Tensor) else abs_td.cpu().numpy()

    def _update_bf16(self, *tensors, target):
        """DQN.update's step with the loss taken through the bfloat16 copies (float32 outputs, so the
        loss and TD errors are float32) and the gradients handed to the float32 masters."""
        algo, low = self.algo, self._low
        loss, abs_td = algo.loss(*tensors, online=low["online"], target=target)
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


class _ForwardAhead:
    """A network whose forward of one input was started on a worker thread when this was made:
    called with that input (DQN.td_target's `target(next_obs)`), it waits for the result, then
    sets the calling thread's torch ops to `threads_after` threads (the worker is idle from then)."""

    def __init__(self, pool: ThreadPoolExecutor, network, x: torch.Tensor, threads_after: int):
        self._x, self._result = x, pool.submit(_forward_without_grad, network, x, thread_float_mode())
        self._threads_after = threads_after

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x is not self._x:
            raise RuntimeError("a forward run ahead was asked for another input than the one it ran")
        result = self._result.result()
        torch.set_num_threads(self._threads_after)
        return result


def _forward_without_grad(network, x: torch.Tensor, float_mode: int) -> torch.Tensor:
    set_thread_float_mode(float_mode)  # the caller's denormal flushing (cpu_kernel_mode sets it per thread)
    with torch.no_grad():  # grad mode is per thread too: the worker's own
        return network(x)


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
