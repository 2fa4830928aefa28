"""The cost of one task call on one device: measured, analytic or simulated.

`Costs(platform, workload, measured)` answers `task_seconds(task, candidate)`:
- measured: the table `pearl profile` wrote for this machine (pearl/profile.py) has the task for
  this (replay kind, device, learner kernel) at this envs / batch size — or at neighbouring sizes,
  between which it interpolates linearly (and extrapolates from the two nearest). A measured call
  already includes the copies the runtime makes inside it, so the model adds no transfer for it.
- simulated (a backend whose `cost_source` is "simulated": fpga:N): `estimator.fpga.task_cost`,
  the HLS cycle model + the profile's link (launch, transfers included). No FPGA produced these
  figures.
- analytic (anything else): a roofline — max(FLOPs / peak, bytes / bandwidth) — plus a fixed
  cost per call: on a cpu the interpreter's `call_overhead_us` per Python-level kernel call, on
  a device its `launch_us` per kernel launch. The call counts are each backend's
  (pearl.kernels.registry Backend.calls: this runtime's, read off its code; why: with 4-64-64-2
  networks every task is overhead-bound, so the counts matter more than the FLOPs). Env steps are
  not FLOPs: an analytic act costs REFERENCE_ENV_STEP_US per env step, scaled by the host's clock.
"""
from __future__ import annotations

import bisect
from dataclasses import replace

from pearl.estimator.signatures import Cost, sum_tree_cost
from pearl.kernels.cpu import paired_products
from pearl.kernels.registry import backend, kind_of

# CartPole-v1's step + the actor's per-env bookkeeping, measured by `pearl profile` on the 2.6 GHz
# CI machine (act at 16 envs / 16); an analytic act scales it by clock. Other envs cost more:
# profile them on the machine.
REFERENCE_ENV_STEP_US = 9.0
REFERENCE_CLOCK_MHZ = 2600.0
# The same for plan.env_engine: envpool (one EnvPool per actor, one worker thread): a fixed cost
# per act round (a step call hands over to EnvPool's thread and back, ~50 us; a round where an
# episode ended makes a second one, the reset) plus per env the C++ step and the actor's
# bookkeeping; fitted to `Actor.step`'s process CPU per env step on CartPole at 1 and 32 envs
# (benchmarks/actor_path.py --engines, docs/BENCHMARKS.md "Actor path": 75.6 and 8.6 us, 15.1 at
# 8 envs where the fit says 14.6). Other envs cost more: profile them on the machine.
ENVPOOL_ROUND_US = 69.0
ENVPOOL_ENV_STEP_US = 6.4

# Where a task's figure came from, most trusted first: this machine's profile at the size, between
# two profiled sizes, beyond them; the analytic roofline; the FPGA cycle model
SOURCES = ("measured", "interpolated", "extrapolated", "analytic", "simulated", "wire")  # wire: estimator/wire.py
PROFILED = SOURCES[:3]

# The fraction of one core's peak FLOP/s (the platform's peak_gflops / cores: every FMA port busy
# every cycle) that the learner and act kernels reach on the cpu: their GEMMs are small (batch x
# 64..400 x 64..400), half of them on transposed operands in the backward pass, between
# elementwise passes (activations, losses, Adam) that leave the vector units idle. Fitted on the
# development set only (CartPole DQN and Pendulum DDPG / TD3 / SAC at 64x64, both learner kernels,
# batch 64 against 128 or 256: the slope of the learn time in the batch's FLOPs) with `pearl
# profile` on the quiet 2-core CI machine (issue 17, docs/BENCHMARKS.md "Estimator held-out"):
# 0.33-0.61, median 0.39. The held-out workloads' wider networks reach more (0.55-0.8), which a
# profile measures; the analytic model stays on the development set's figure.
CPU_KERNEL_EFFICIENCY = 0.4
# How much faster than float32 a learner variant (`learner_variant`: kernel and precision) runs its
# learn FLOPs on a cpu with bfloat16 units (kernels/cpu/backend.py bf16_products); an analytic bf16
# learn divides its FLOP time by it (float32 variants: 1); `pearl profile` measures bf16 learns where
# the mapper offers them. Each figure stays with what it measured, on this project's Xeon (AMX):
# - fused/bf16, the fused DDPG / TD3 / SAC learners' bfloat16 products: the 28 products of a DDPG
#   update at 400x300 / batch 256 replayed alone in each precision, 5.11 vs 2.27 ms
#   (benchmarks/ddpg_precision.py, docs/BENCHMARKS.md); the fused DQN step's (kernels/cpu/bf16_gemm.py)
#   agree on the 2-core EPYC: 64 x 256 x 256 in 37 vs 87 us (2.3x), the whole 4-256-256-2 update at
#   batch 64 1.9x on one thread (docs/BENCHMARKS.md, issue 19, session 23);
# - torch/bf16, DQN's torch learner with a CNN Q-network (the only one the builder lets run bf16;
#   pearl/nets.py BF16Copy: channels-last bfloat16 copies on oneDNN's AMX kernels, float32 masters,
#   fused Adam then; since session 13 an Adam step compiled with the copy's refresh, kernels/cpu/bf16_adam.py):
#   the whole Nature CNN update against the float32 one at batch 32, one thread, CPU time,
#   interleaved (benchmarks/cnn_paths.py, docs/BENCHMARKS.md "Pixels end to end"): 56.1 vs 27.6 ms.
#   MinAtar's one small conv gains less (3.75 vs 3.19 ms), but its update is the call overhead the
#   call counts price, not FLOPs.
LEARN_SPEEDUP = {"fused/bf16": 2.25, "torch/bf16": 2.0}
# What each learner thread beyond the first adds to the speed of a learner's FLOP time
# (Plan.learner_threads: torch's intra-op threads split each product). From the whole update, not
# the products alone: the fused DDPG update at 400x300 / batch 256 on this project's quiet 2-core
# Xeon took 6.0 ms on 1 thread and 5.5-6.2 on 2 while its products alone went 5.09 -> 3.52 ms
# (docs/BENCHMARKS.md "Quiet machine, SB3 at its best thread count", session 9): the
# second thread's handoffs outside the products take most of its gain back; 6.0 = 0.9 + 5.09 and
# 5.55 = 0.9 + 5.09 / 1.1. An analytic learn on t threads divides its FLOP time by
# 1 + (t - 1) x this; `pearl profile` measures the learn at the thread counts the mapper offers
# (on a loaded machine a second thread loses outright: its barrier waits for a descheduled thread).
PRODUCT_THREAD_GAIN = 0.1
# The fused DQN step's second thread (kernels/cpu/qlearn.py: the forwards and a layer's two backward
# products in pairs, numba's pool; nothing beyond 2 threads) at the same FLOP-time division: on the
# 2-core EPYC, 4-256-256-2 at batch 64, whole update 447-459 us on 1 thread and 285-300 on 2 in
# seven fresh processes of eight (415 in one), i.e. 450 = 55 + 395 and ~293 = 55 + 395 / 1.66
# (docs/BENCHMARKS.md issue 19, session 22). Below PAIR_FROM_MACS nothing pairs: no gain.
PAIRED_PRODUCT_GAIN = 0.66
# The n-step buffer's per-round work (pearl/replay/nstep.py NStepBuffer.step: ring writes and the
# discounted sums, ~8.5 us of CPU time a round on the CI machine at 1 and at 16 envs), in
# call-equivalents of the host's call_overhead_us, added to an analytic insert when n_step > 1.
NSTEP_CALLS_PER_ROUND = 2

LOOP_CALLS_PER_ROUND = 6  # the loop's own Python per act round (counters, episode records, logging)
LOOP_CALLS_PER_UPDATE = 2
RING_WRITE_CALLS = 1  # an actor process's ring write: one call copying the round into the ring


def product_thread_speedup(threads: int, pairs: bool | None = None) -> float:
    """How much faster a learner's products run on `threads` threads than on one (analytic): torch's
    threads, or with `pairs` given the fused DQN step's, whose second thread pays only where its
    products pair (pearl.kernels.cpu.paired_products)."""
    if pairs is not None:
        return 1.0 + PAIRED_PRODUCT_GAIN if threads > 1 and pairs else 1.0
    return 1.0 + (threads - 1) * PRODUCT_THREAD_GAIN


def env_steps_us(engine: str, envs: int) -> float:
    """Microseconds (at REFERENCE_CLOCK_MHZ) of one act round's env steps and bookkeeping on `engine`."""
    if engine == "envpool":
        return ENVPOOL_ROUND_US + envs * ENVPOOL_ENV_STEP_US
    return envs * REFERENCE_ENV_STEP_US


class Costs:
    def __init__(self, platform, workload, measured: dict | None = None):
        self.platform, self.workload = platform, workload
        self.measured = measured or {}

    # -- measured -------------------------------------------------------------------------------
    def _lookup(self, name: str, size: int) -> tuple[float, str] | None:
        """(seconds, how) from the profile's table `name` ({size: us}): "measured" at a profiled
        size, "interpolated" between two, "extrapolated" beyond them (from the two nearest)."""
        table = self.measured.get(name)
        if not table:
            return None
        points = sorted((int(k), float(v)) for k, v in table.items())
        xs = [x for x, _ in points]
        if size in xs:
            return points[xs.index(size)][1] * 1e-6, "measured"
        if len(points) == 1:
            return None  # one point says nothing about another size
        i = min(max(bisect.bisect_left(xs, size), 1), len(xs) - 1)
        (x0, y0), (x1, y1) = points[i - 1], points[i]
        how = "interpolated" if xs[0] < size < xs[-1] else "extrapolated"
        return max(0.0, y0 + (y1 - y0) * (size - x0) / (x1 - x0)) * 1e-6, how

    def _seconds(self, name: str, size: int) -> float | None:
        found = self._lookup(name, size)
        return None if found is None else found[0]

    def profiled_seconds(self, name: str, size: int) -> float | None:
        """Seconds from the profile's table `name` at `size` (interpolated or extrapolated between
        its sizes), or None: for tables outside the task grid (estimator/wire.py's)."""
        return self._seconds(name, size)

    @staticmethod
    def measured_name(task: str, cand) -> tuple[str, int]:
        """The profile table holding `task` of `cand`, and the size it is indexed by."""
        replay = f"{cand.replay_kind}@{cand.replay_device}"
        if task == "act":  # the Gymnasium engine's table keeps its old name
            engine = "" if cand.env_engine == "gymnasium" else f"|{cand.env_engine}"
            return f"act{engine}@{cand.act_device}", cand.envs
        if task == "insert":
            return f"insert|{replay}", cand.envs
        if task in ("sample", "update_priorities"):
            return f"{task}|{replay}", cand.batch
        if task == "learn":
            threads = f"/t{cand.threads}" if cand.threads != 1 else ""  # each thread count its own table
            return f"learn|{learner_variant(cand)}{threads}@{cand.learn_device}", cand.batch
        return f"sync_weights|{cand.learner_kernel}@{cand.learn_device}", 0

    def _measured(self, task: str, cand) -> tuple[float, str] | None:
        """A figure of the profile (seconds, measured | interpolated | extrapolated): first from the
        table of the candidate's context (act, learn and sync_weights run slower beside some
        replays; every task runs differently beside another env engine: estimator/profile.py), else
        the context-free one."""
        name, size = self.measured_name(task, cand)
        found = self._lookup(context_table(name, cand), size)
        return found if found is not None else self._lookup(name, size)

    def is_measured(self, task: str, cand) -> bool:
        """The figure comes from this machine's profile (at the size, or between or beyond sizes)."""
        return self._measured(task, cand) is not None

    # -- the answer -----------------------------------------------------------------------------
    def task_seconds(self, task: str, cand) -> tuple[float, str]:
        """(seconds of one call, its source: one of SOURCES)."""
        found = self._measured(task, cand)
        if found is not None:
            return found
        if _on_wire(cand.device_of(task)):  # a replay server (estimator/wire.py)
            from pearl.estimator.wire import task_seconds

            return task_seconds(task, cand, self), "wire"
        device = self.platform.device(cand.device_of(task))
        if backend(device.kind).cost_source == "simulated":
            from pearl.estimator.fpga import task_cost

            w = self.workload
            cost = task_cost(task, self.platform, device.id, batch=cand.batch, capacity=w.capacity,
                             fanout=w.fanout, envs=cand.envs, sizes=w.sizes)
            return cost.seconds, "simulated"
        return self.analytic_seconds(task, cand, device), "analytic"

    def active_seconds(self, task: str, cand) -> float:
        """The part of a call the device spends computing (what its dynamic power scales with):
        the whole call when measured or on a cpu; the roofline part on cuda / opencl (a launch
        keeps the host busy, not the device); the kernel cycles on an FPGA."""
        seconds, source = self.task_seconds(task, cand)
        if source == "wire":  # the server's machine computes it, not a device of this platform
            return 0.0
        device = self.platform.device(cand.device_of(task))
        if source in PROFILED or device.kind == "cpu":
            return seconds
        if source == "simulated":
            from pearl.estimator.fpga import task_cost

            w = self.workload
            return task_cost(task, self.platform, device.id, batch=cand.batch, capacity=w.capacity,
                             fanout=w.fanout, envs=cand.envs, sizes=w.sizes).kernel_s
        sig = self.signature(task, cand)
        return max(sig.flops / (device.peak_gflops * 1e9), sig.bytes / (device.memory_bandwidth_gb_s * 1e9))

    def signature(self, task: str, cand) -> Cost:
        """FLOPs and bytes of one call (estimator/signatures.py), as the protocol's tasks count them."""
        w = self.workload
        prioritized = cand.replay_kind != "uniform"
        tree = sum_tree_cost(w.capacity, cand.batch, w.fanout) if prioritized else Cost()
        if task == "act":
            return w.act_cost(cand.envs)
        if task == "insert":
            return Cost(flops=cand.envs * (20 if prioritized else 0), bytes=cand.envs * w.insert_bytes)
        if task == "sample":
            return Cost(flops=tree.flops, bytes=cand.batch * w.transition_bytes + tree.bytes)
        if task == "update_priorities":
            return tree
        if task == "learn":
            return w.learn_cost(cand.batch, cand.learner_kernel)
        return Cost(bytes=2 * w.n_params * 4)  # sync_weights: read + write the flat vector

    def analytic_seconds(self, task: str, cand, device) -> float:
        sig = self.signature(task, cand)
        kind = device.kind
        calls = backend(kind).calls(task, learner_variant(cand) if task == "learn" else cand.learner_kernel,
                                    self.workload.algo)
        if kind == "cpu":  # one runtime thread: one core's share of peak and bandwidth
            peak = device.peak_gflops / device.cores * 1e9 * CPU_KERNEL_EFFICIENCY
            if task == "learn":
                w = self.workload
                pairs = (paired_products([w.obs_dim, *w.hidden, w.n_actions], cand.batch)
                         if cand.learner_kernel == "fused" and not w.continuous else None)
                peak *= LEARN_SPEEDUP.get(learner_variant(cand), 1.0) * product_thread_speedup(cand.threads, pairs)
            if task == "insert" and self.workload.n_step > 1:
                calls += NSTEP_CALLS_PER_ROUND
            bandwidth = device.memory_bandwidth_gb_s / device.cores * 1e9
            fixed = calls * device.call_overhead_us * 1e-6
        else:
            peak, bandwidth = device.peak_gflops * 1e9, device.memory_bandwidth_gb_s * 1e9
            fixed = calls * device.launch_us * 1e-6
        seconds = fixed + max(sig.flops / peak, sig.bytes / bandwidth)
        if task == "act":  # the envs step on the host whatever runs the inference
            clock = REFERENCE_CLOCK_MHZ / self.platform.host.clock_mhz
            seconds += env_steps_us(cand.env_engine, cand.envs) * 1e-6 * clock
        return seconds

    def threaded_factor(self, cand) -> float:
        """The measured contention factor of the threaded runtime for the candidate's learner
        kernel at its envs per actor (pearl/profile.py `_threaded_factors`; interpolated between
        env counts), or 0 (no contention) when not measured."""
        table = self.measured.get(f"threaded|{cand.learner_kernel}")
        if not table:
            return 0.0
        seconds = self._seconds(f"threaded|{cand.learner_kernel}", cand.envs)
        if seconds is None:  # one env count measured: it stands for all
            seconds = next(iter(table.values())) * 1e-6
        return seconds * 1e6 if seconds is not None else 0.0

    def processes_factor(self, cand) -> float:
        """The processes runtime's time-sharing overhead when its processes outnumber the cores,
        for the candidate's learner kernel (pearl/profile.py `_processes_factors`: one figure per
        kernel); 1 when not measured."""
        table = self.measured.get(f"processes|{cand.learner_kernel}")
        return float(next(iter(table.values()))) if table else 1.0

    def processes_overlap(self, cand) -> tuple[float, str]:
        """(the processes runtime's measured step / its schedule's bound with one actor, where it
        came from): per learner kernel by envs per actor (pearl/profile.py `_processes_factors`),
        another kernel's table when the candidate's was not profiled, a single env count standing
        for all; (1, "unmeasured") without a profile."""
        names = [f"processes1|{cand.learner_kernel}"] + sorted(
            k for k in self.measured if k.startswith("processes1|") and k != f"processes1|{cand.learner_kernel}")
        for name in names:
            table = self.measured.get(name)
            if not table:
                continue
            sizes = sorted(int(k) for k in table)
            # a factor is not linear in envs beyond the profiled ones: the nearest one stands for them
            seconds, how = self._lookup(name, min(max(cand.envs, sizes[0]), sizes[-1]))
            if name != names[0] or not sizes[0] <= cand.envs <= sizes[-1]:
                how = "extrapolated"
            return seconds * 1e6, how
        return 1.0, "unmeasured"

    def ring_write_seconds(self, cand) -> float:
        """An actor process's write of one round (E transitions) into its shared-memory ring:
        measured (`ring_write` by envs) or a copy of the transitions at one core's bandwidth plus
        RING_WRITE_CALLS Python-level calls."""
        seconds = self._seconds("ring_write", cand.envs)
        if seconds is not None:
            return seconds
        host = self.platform.host
        return (RING_WRITE_CALLS * host.call_overhead_us * 1e-6
                + cand.envs * self.workload.insert_bytes / (host.memory_bandwidth_gb_s / host.cores * 1e9))

    # -- the ray runtime (pearl/schedule/models.py Ray) ---------------------------------------------
    def cluster(self, cand):
        """The platform's cluster (platforms/ `nodes:`) a ray plan runs on, checked to hold the plan."""
        from pearl.errors import ConfigError

        nodes = self.platform.nodes
        if nodes is None:
            raise ConfigError(f"{self.platform.source}: nodes: missing (a ray plan needs a platform with a nodes: "
                              f"section, e.g. platforms/local_cluster.yaml)")
        used = cand.nodes + (cand.shards if cand.placement == "node" else 0)
        if used > nodes.count:
            raise ConfigError(f"plan.ray.nodes: {cand.label()} needs {used} nodes, {self.platform.source} has "
                              f"{nodes.count}")
        return nodes

    def ray_background(self) -> dict[str, float | None]:
        """What a Ray cluster costs beyond the calls the ray model prices, from `pearl profile
        --ray` (pearl/runtime/ray_profile.py) where the profile has it: `daemon` cores per node of
        Ray's processes at rest (else the platform's `nodes.daemon_cores`), `agent` cores of a
        node agent's process napping between passes (else None: the model's own passes price it),
        `publish_agent` / `publish_ray` us per publish per agent in the agent's process (else the
        platform's `nodes.ray_call_us`) and in Ray's processes (else 0), `publish_driver` us per
        publish per agent in the driver's publishing thread (else the platform's `ray_call_us`),
        `publish_interval` us between publishes sent as the runtime's publisher sends them (else None)."""
        nodes = self.platform.nodes
        measured = {name: self._seconds(f"ray|{name.replace('_', '|')}", 0) for name in
                    ("daemon", "agent", "publish_agent", "publish_ray", "publish_driver",
                     "publish_interval")}
        return {"daemon": nodes.daemon_cores if measured["daemon"] is None else measured["daemon"],
                "agent": measured["agent"],
                "publish_agent": nodes.ray_call_us if measured["publish_agent"] is None
                else 1e6 * measured["publish_agent"],
                "publish_ray": 0.0 if measured["publish_ray"] is None else 1e6 * measured["publish_ray"],
                "publish_driver": nodes.ray_call_us if measured["publish_driver"] is None
                else 1e6 * measured["publish_driver"],
                "publish_interval": None if measured["publish_interval"] is None
                else 1e6 * measured["publish_interval"]}

    def ray_parts(self, cand, rows: int) -> dict[str, float]:
        """The ray runtime's per-component costs, us, for chunks of `rows` rows (estimator/wire.py
        for the wire and the node agents; the profile's or analytic figures for the tables):
        `insert` a chunk into a cpu table, `request` the server's handling of one request,
        `agent_pass` a node agent's pass over its rings (one per nap; `agent_rings` without the
        nap's call, when the profile measured the nap loop), `agent_chunk` its sending
        one chunk, `chunk_wire` the bytes of one
        chunk on the link, `insert_rtt` a chunk's round trip as its agent waits for the reply,
        `round` the driver's loop per chunk taken in; with the replay off the
        learner's process, `sample_wait` the learner's sample (the shards asked at once, the
        previous update riding on it), `sample_client` its own Python in that, `shard_update` a
        shard's work per update."""
        from pearl.estimator import wire

        latency, bandwidth = wire.node_link(self.platform)
        table = replace(cand, replay_device="cpu")
        kind = cand.replay_kind
        per_round, _ = self.overhead_parts_us(replace(cand, envs=rows))
        insert = self.task_seconds("insert", replace(table, envs=rows))[0]
        parts = {"insert": insert * 1e6,
                 "request": wire.server_s("insert", self, rows, insert, kind) * 1e6,
                 "agent_pass": wire.agent_pass_s(cand.actors, self) * 1e6,
                 "agent_rings": wire.agent_pass_s(cand.actors, self, nap=False) * 1e6,
                 "agent_chunk": wire.agent_chunk_s(rows, self, kind) * 1e6,
                 "chunk_wire": rows * self.workload.insert_bytes / (bandwidth * 1e3),
                 "insert_rtt": wire.round_trip_s("insert", rows, self, kind, insert) * 1e6,
                 "round": per_round * rows}
        if cand.placement != "learner":
            share = replace(table, batch=max(1, cand.batch // cand.shards))
            tasks = ("sample", "update_priorities") if kind != "uniform" else ("sample",)
            work = sum(self.task_seconds(task, share)[0] for task in tasks)
            shard = (work + wire.server_s("sample", self, share.batch, work, kind)) * 1e6
            client = wire.client_s("sample", self, cand.shards, cand.batch, kind) * 1e6
            if kind != "uniform" and wire.measured_s(self, "sample", kind, "client", share.batch) is None:
                client += wire.client_s("update_priorities", self, cand.shards) * 1e6
            rtt = wire.measured_s(self, "sample", kind, "rtt", share.batch)
            # the shards asked at once: one round trip, and the client's own work for the others
            wait = client + shard + wire.messages_s("sample", cand.batch, self, latency, bandwidth) * 1e6 \
                if rtt is None else rtt * 1e6 + client * (cand.shards - 1) / cand.shards
            parts.update(shard_update=shard, sample_client=client, sample_wait=wait)
        return parts

    def overhead_us(self, cand) -> float:
        """The runtime loop's own time per env step, outside any task."""
        return sum(self.overhead_parts_us(cand))

    def overhead_parts_us(self, cand) -> tuple[float, float]:
        """(per env step: the loop's time per act round / E, its time per update x updates_per_step)."""
        u = self.workload.updates_per_step
        per_round = self._seconds("overhead|round", 0)
        per_update = self._seconds("overhead|update", 0)
        if per_round is None or per_update is None:
            host = self.platform.host
            per_round = LOOP_CALLS_PER_ROUND * host.call_overhead_us * 1e-6
            per_update = LOOP_CALLS_PER_UPDATE * host.call_overhead_us * 1e-6
        return 1e6 * per_round / cand.envs, 1e6 * per_update * u

    # -- transfers --------------------------------------------------------------------------------
    def transfers(self, cand) -> dict[tuple[str, str], float]:
        """Seconds per env step moving data between the devices of consecutive tasks.

        Edges of the task graph: act -> insert (E transitions), sample -> learn (the batch, its
        indices and weights), learn -> update_priorities (|td| and indices), learn -> act
        (sync_weights: the flat weights). An edge costs latency + bytes / bandwidth over the
        link between its devices (through the host when neither is the host), unless either end
        is measured (the runtime's copy is inside the measured call) or an FPGA (the FPGA model
        counts its own transfers)."""
        w, u = self.workload, self.workload.updates_per_step
        edges = [("act", "insert", cand.envs * w.insert_bytes, 1.0 / cand.envs),
                 ("sample", "learn", cand.batch * (w.transition_bytes + 16), u),
                 ("learn", "sync_weights", 0, 0.0)]
        if cand.replay_kind != "uniform":
            edges.append(("learn", "update_priorities", cand.batch * 12, u))
        edges.append(("sync_weights", "act", w.n_params * 4, u / cand.sync_interval))
        out: dict[tuple[str, str], float] = {}
        for src, dst, nbytes, per_step in edges:
            a, b = cand.device_of(src), cand.device_of(dst)
            if a == b or per_step == 0 or nbytes == 0:
                continue
            if self.is_measured(src, cand) or self.is_measured(dst, cand):
                continue
            if any(_on_wire(d) for d in (a, b)):  # the wire model counts its own messages
                continue
            if any(backend(self.platform.device(d).kind).cost_source == "simulated" for d in (a, b)):
                continue
            seconds = sum(self.platform.link(x, y).transfer_s(nbytes)
                          for x, y in ([(a, b)] if "cpu" in (a, b) else [(a, "cpu"), ("cpu", b)]))
            out[(a, b)] = out.get((a, b), 0.0) + seconds * per_step
        return out


def context_table(name: str, cand) -> str:
    """The profile table of `name` measured in `cand`'s context: beside its replay, and its env
    engine when that is not Gymnasium (estimator/profile.py says why)."""
    engine = f" {cand.env_engine}" if cand.env_engine != "gymnasium" else ""
    return f"{name}|in {cand.replay_kind}@{cand.replay_device}{engine}"


def learner_variant(cand) -> str:
    """The candidate's learner kernel and, when not float32, its product precision ("fused/bf16"):
    what a learn's profile table and call count are kept under."""
    return cand.learner_kernel if cand.precision == "fp32" else f"{cand.learner_kernel}/{cand.precision}"


def _on_wire(device_id: str) -> bool:
    """Whether `device_id` is a replay server's (a backend whose cost_source is "wire")."""
    return backend(kind_of(device_id)).cost_source == "wire"
