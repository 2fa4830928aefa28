"""Where an actor's and the learner's CPU goes per env step (issue 19, item 1), for A/B runs.

Two measurements, both on CPU clocks (the machine is shared: wall clock says little):

- `--parts`: the actor's step path piece by piece in this process, on the thread CPU clock,
  interleaved blocks (median us per call): a CartPole step through Gymnasium's wrappers and
  through `env_stepper`, one observation's greedy action (`greedy`, `greedy_into`), the
  exploration draws, the n-step buffer, the ring write, and a whole `Actor.step` + ring write.
- `--engines`: `Actor.step` per env step on each env engine (plan.env_engine) at 1-32 envs, on
  the process CPU clock (EnvPool steps on a worker thread of its own).
- `--learner`: the fused DQN update (kernels/cpu/qlearn.py) of e2e_dqn's 4-64-64-2 network at
  batch 64, vanilla and double, on the thread CPU clock (median and min of interleaved blocks).
- `--boot`: an actor process's start-up (fresh interpreter, imports, actor built from the run's
  recipe, first compiled call), process CPU until ready to act, with SciPy's BLAS bindings loaded
  alone (the actors' way) and through scipy.linalg, interleaved runs.
- `--run`: e2e_dqn.py's DQN CartPole setup on the processes runtime (one actor process, one env),
  `--steps` env steps: the actor's sampled CPU per act round (`act_cpu`), its wall time per round
  and waits, the learner process's CPU per env step (time.process_time), the actor processes' CPU
  per env step including their start-up (getrusage of the children), env steps/s, the share
  of env steps the learner's own actor took while the actor processes started (`local_share`),
  and each actor process's CPU from fork or exec until it was ready to act (`boot_cpu_ms`).

    python benchmarks/actor_path.py --parts
    python benchmarks/actor_path.py --learner
    python benchmarks/actor_path.py --boot
    python benchmarks/actor_path.py --run --steps 50000 --repeats 3
    python benchmarks/actor_path.py --engines
    python benchmarks/actor_path.py --run --engine envpool --envs 32 --runtime sequential
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from side_by_side import load_average, machine_header  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--parts", action="store_true", help="time the actor's step path piece by piece")
    p.add_argument("--run", action="store_true", help="time a whole processes-runtime run")
    p.add_argument("--engines", action="store_true", help="Actor.step per env step on each env engine")
    p.add_argument("--learner", action="store_true", help="the fused DQN update's thread CPU per call")
    p.add_argument("--boot", action="store_true", help="an actor process's start-up CPU, two ways")
    p.add_argument("--steps", type=int, default=50_000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--runtime", default="processes", choices=["processes", "sequential"])
    p.add_argument("--engine", default="gymnasium", choices=["gymnasium", "envpool"])
    p.add_argument("--envs", type=int, default=1, help="envs per actor (default 1)")
    p.add_argument("--label", default="", help="a name printed with the run's row (A/B runs)")
    args = p.parse_args(argv)
    if not (args.parts or args.run or args.engines or args.learner or args.boot):
        p.error("give --parts, --run, --engines, --learner and/or --boot")
    return args


def thread_us(fn, calls: int) -> float:
    """Thread CPU microseconds per call of `fn` over `calls` calls."""
    clock = time.thread_time_ns
    t0 = clock()
    for _ in range(calls):
        fn()
    return (clock() - t0) / calls / 1e3


def parts(blocks: int = 7, calls: int = 5000) -> None:
    import numpy as np

    from pearl import envs
    from pearl.envs import make_env
    from pearl.kernels.cpu import MLPLayout, QPolicy
    from pearl.replay import NStepBuffer
    from pearl.runtime.actor import Actor
    from pearl.runtime.shared import ActorChannel, WeightBoard

    rng = np.random.default_rng(0)
    policy = QPolicy(MLPLayout([4, 64, 64, 2]))
    policy.load(rng.standard_normal(policy.layout.size).astype(np.float32) * 0.1)
    obs = rng.standard_normal((1, 4)).astype(np.float32)
    actions = np.zeros(1, np.int64)

    def stepping(step, env):
        state = {"a": 0}

        def one():
            _, _, term, trunc, _ = step(state["a"])
            state["a"] ^= 1
            if term or trunc:
                env.reset()
        return one

    wrapped, direct = make_env("CartPole-v1", 0), make_env("CartPole-v1", 0)
    wrapped.reset(seed=0)
    direct.reset(seed=0)
    nstep = NStepBuffer(1, 0.99, 1, 4)
    rewards, flags = np.ones(1, np.float32), np.zeros(1, bool)
    fields = {"obs": (np.dtype(np.float32), (4,)), "actions": (np.dtype(np.int64), ()),
              "rewards": (np.dtype(np.float32), ()), "next_obs": (np.dtype(np.float32), (4,)),
              "discounts": (np.dtype(np.float32), ())}
    channel = ActorChannel.create(fields, 1 << 16)
    transition = (obs, actions, rewards, obs, rewards)

    def put():
        channel.put(transition, [], 1)
        channel.counters[1] = channel._totals[0]  # the learner's CONSUMED: the ring never fills

    board = WeightBoard.create(policy.layout.size)
    weights = np.empty(policy.layout.size, np.float32)

    def sync():  # what an actor does when the learner published new weights
        board.publish(policy.flat)
        board.read(weights, -1)
        policy.load(weights)

    def sync_direct():  # the same into the policy's own weights (WeightBoard.read_latest)
        board.publish(policy.flat)
        board.read_latest(policy.flat, -1, lambda: True)

    actor = Actor("CartPole-v1", 1, 0, policy, 2, 1, 0.99)

    def actor_round():
        transitions, finished = actor.step(0.05)
        channel.put(transitions, finished, 1)
        channel.counters[1] = channel._totals[0]
        channel.counters[2] = channel._totals[1]

    # what an older checkout (an A/B's base) lacks is left out
    stepper = getattr(envs, "env_stepper", None)
    cases = {"env.step (gymnasium wrappers)": stepping(wrapped.step, wrapped),
             **({"env_stepper(env) step": stepping(stepper(direct), direct)} if stepper else {}),
             "policy.greedy (1 obs)": lambda: policy.greedy(obs),
             "rng.random(2)": lambda: rng.random(2),
             "2 x rng.random()": lambda: (rng.random(), rng.random()),
             "NStepBuffer.step (n=1)": lambda: nstep.step(obs, actions, rewards, obs, flags, flags),
             "ActorChannel.put (1 transition)": put,
             "weights: publish + read + load": sync,
             **({"weights: publish + read_latest": sync_direct} if hasattr(board, "read_latest") else {}),
             "Actor.step(0.05) + put": actor_round}
    if hasattr(policy, "greedy_into"):
        cases["policy.greedy_into (1 obs)"] = lambda: policy.greedy_into(obs, actions)
        from pearl.kernels.cpu.mlp import _greedy_row

        policy.greedy_into(obs, actions)  # makes its packed tables

        meta, acts = policy._packed[1]
        cases["_greedy_row kernel (1 obs)"] = lambda: _greedy_row(policy.flat, meta, obs, acts, actions)
    for fn in cases.values():  # compile, warm caches
        thread_us(fn, 200)
    times = {name: [] for name in cases}
    for _ in range(blocks):
        for name, fn in cases.items():
            times[name].append(thread_us(fn, calls))
    print(f"\nthe actor's step path, thread CPU us per call (median of {blocks} interleaved blocks "
          f"of {calls} calls; min-max)")
    for name, values in times.items():
        print(f"  {name:<36} {statistics.median(values):7.2f}   ({min(values):.2f}-{max(values):.2f})")
    channel.close()
    board.close()
    actor.close()


def engines(env_counts=(1, 4, 8, 16, 32), blocks: int = 5, steps: int = 20_000) -> None:
    """Process CPU (EnvPool's worker thread included) per env step of `Actor.step` on each engine,
    CartPole, epsilon 0.05 with a 4-64-64-2 policy, interleaved blocks."""
    import numpy as np

    from pearl.envs import envpool_has
    from pearl.kernels.cpu import MLPLayout, QPolicy
    from pearl.runtime.actor import ENGINES

    rng = np.random.default_rng(0)
    policy = QPolicy(MLPLayout([4, 64, 64, 2]))
    policy.load(rng.standard_normal(policy.layout.size).astype(np.float32) * 0.1)
    names = [name for name in ENGINES if name == "gymnasium" or envpool_has("CartPole-v1")]
    actors = {(name, e): ENGINES[name]("CartPole-v1", e, 0, policy, 2, 1, 0.99) for name in names for e in env_counts}
    times = {key: [] for key in actors}
    clock = time.process_time_ns
    for _ in range(blocks):
        for (name, e), actor in actors.items():
            rounds = max(1, steps // e)
            t0 = clock()
            for _ in range(rounds):
                actor.step(0.05)
            times[(name, e)].append((clock() - t0) / (rounds * e) / 1e3)
    print(f"\nActor.step, process CPU us per env step (median of {blocks} interleaved blocks of ~{steps} env steps)")
    print("| envs per actor | " + " | ".join(names) + " |\n| ---: | " + " | ".join("---:" for _ in names) + " |")
    for e in env_counts:
        print(f"| {e} | " + " | ".join(f"{statistics.median(times[(name, e)]):.2f}" for name in names) + " |")
    for actor in actors.values():
        actor.close()


def learner(blocks: int = 7, calls: int = 3000) -> None:
    """Thread CPU per FusedQLearner.update, 4-64-64-2 at batch 64 (e2e_dqn's), vanilla and double."""
    import numpy as np

    from pearl.kernels.cpu import FusedQLearner, cpu_kernel_mode

    rng = np.random.default_rng(0)
    batch = (rng.standard_normal((64, 4)).astype(np.float32), rng.integers(0, 2, 64),
             np.ones(64, np.float32), rng.standard_normal((64, 4)).astype(np.float32), np.full(64, 0.99, np.float32))
    with cpu_kernel_mode():
        learners = {}
        for double in (False, True):
            learners["double" if double else "vanilla"] = kernel = FusedQLearner([4, 64, 64, 2], 2e-3, double, 10.0)
            kernel.online[:] = rng.standard_normal(kernel.online.size).astype(np.float32) * 0.1
            kernel.target[:] = kernel.online
        times = {name: [] for name in learners}
        for kernel in learners.values():
            thread_us(lambda: kernel.update(*batch), 200)  # compile or load, warm caches
        for _ in range(blocks):
            for name, kernel in learners.items():
                times[name].append(thread_us(lambda: kernel.update(*batch), calls))
    print(f"\nfused DQN update, 4-64-64-2 batch 64, thread CPU us per call (median of {blocks} interleaved "
          f"blocks of {calls}; min)")
    for name, values in times.items():
        print(f"  {name:<8} {statistics.median(values):7.2f}   ({min(values):.2f})")


BOOT_CHILD = ("import pickle, sys, time; sys.path[:] = pickle.load(sys.stdin.buffer); "
              "from pearl.runtime.processes import load_blas_bindings_alone; "
              "lean = pickle.load(sys.stdin.buffer); lean and load_blas_bindings_alone(); "
              "recipe = pickle.load(sys.stdin.buffer); recipe.env_here(); recipe.build(0).choose(0.0); "
              "print(time.process_time_ns(), 'scipy.linalg' in sys.modules)")


def boot(args, blocks: int = 5) -> None:
    """An actor process's start-up as actor_main does it (a fresh `python -I`, the imports, the
    actor built from the run's recipe, its first compiled call), process CPU until ready to act,
    with SciPy's BLAS bindings loaded alone (`load_blas_bindings_alone`, the actors' way) and
    through scipy.linalg (numba's own import), interleaved."""
    import pickle
    import subprocess

    from pearl.runtime.processes import ONE_BLAS_THREAD, actor_path

    agent = make_agent(args, 0)
    recipe = agent.parts.actor_recipe
    times = {True: [], False: []}
    for _ in range(blocks):
        for lean in (True, False):
            child = subprocess.run([sys.executable, "-I", "-c", BOOT_CHILD], capture_output=True, check=True,
                                   input=pickle.dumps(actor_path(recipe.modules)) + pickle.dumps(lean)
                                   + pickle.dumps(recipe), env={**os.environ, **ONE_BLAS_THREAD})
            cpu_ns, scipy_linalg = child.stdout.split()
            times[lean].append(int(cpu_ns) / 1e6)
            assert (scipy_linalg == b"True") != lean, "scipy.linalg loaded against the variant's intent"
    print(f"\nactor process start-up, process CPU ms until ready to act ({blocks} interleaved runs each)")
    for lean, label in ((True, "BLAS bindings alone (actors)"), (False, "through scipy.linalg")):
        print(f"  {label:<30} median {statistics.median(times[lean]):6.1f}   "
              f"({', '.join(f'{t:.0f}' for t in times[lean])})")


def make_agent(args, seed: int):
    """e2e_dqn.py's DQN CartPole agent on `args.runtime`."""
    import pearl
    from pearl.plan import Plan

    return pearl.DQN(env="CartPole-v1", seed=seed, total_steps=args.steps, hidden=[64, 64], lr=2e-3, gamma=0.99,
                     batch_size=64, learning_starts=1000, updates_per_step=0.25, target_update_interval=500,
                     tau=1.0, double=False, dueling=False, n_step=1, max_grad_norm=10.0,
                     exploration={"initial": 1.0, "final": 0.05, "fraction": 0.1}, replay="uniform",
                     capacity=50_000, learner_kernel="fused", envs_per_actor=args.envs,
                     plan=Plan(batch_size=64, learner_kernel="fused", runtime=args.runtime, envs_per_actor=args.envs,
                               **({"env_engine": args.engine} if args.engine != "gymnasium" else {})))


def run_once(args, seed: int) -> dict:
    agent = make_agent(args, seed)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu, wall = time.process_time(), time.perf_counter()
    summary = agent.train(time_tasks=True, progress=False)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    steps = agent.env_steps
    task = summary["task_us"]
    row = {"steps_per_s": steps / wall, "learner_cpu_us": cpu / steps * 1e6,
           "actors_cpu_us": ((after.ru_utime + after.ru_stime) - (children.ru_utime + children.ru_stime)) / steps * 1e6,
           "actor_nvcsw": after.ru_nvcsw - children.ru_nvcsw,
           "local_share": agent.task_timer.calls.get("act_in_learner", 0) * args.envs / steps}
    envs = args.envs
    if agent.counters.actor_boot_cpu:  # each actor process's CPU until it was ready to act
        row["boot_cpu_ms"] = statistics.mean(agent.counters.actor_boot_cpu) * 1e3
    for name in ("act_cpu", "act", "act_wait", "act_in_learner", "insert", "sample", "learn", "sync_weights"):
        if name in task:
            row[name] = task[name] / (envs if name.startswith("act") else 1)
    return row


def run(args) -> None:
    rows = []
    for repeat in range(args.repeats):
        row = run_once(args, repeat)
        rows.append(row)
        print(f"  {args.label or 'run'} {repeat}: " + ", ".join(f"{k} {v:,.2f}" for k, v in row.items()), flush=True)
    keys = rows[0].keys()
    print(f"  {args.label or 'run'} median: " + ", ".join(f"{k} {statistics.median(r[k] for r in rows):,.2f}"
                                                         for k in keys))


def main(argv=None) -> int:
    args = parse_args(argv)
    import pearl

    print(machine_header())
    print(f"pearl from {os.path.dirname(pearl.__file__)}; load average {load_average()}")
    if args.parts:
        parts()
    if args.engines:
        engines()
    if args.learner:
        learner()
    if args.boot:
        boot(args)
    if args.run:
        print(f"\n{args.runtime} runtime, {args.engine} engine, {args.envs} env(s) per actor, {args.steps} steps "
              f"(act_* per env step: us; insert/sample/learn per call)")
        run(args)
    print(f"load average at the end: {load_average()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
