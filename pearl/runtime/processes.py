"""The processes runtime: actor processes beside a learner process, joined by shared memory.

`plan.actors` processes each step `plan.envs_per_actor` environments with one batched policy
inference per step and write the n-step transitions and finished episodes into their own
shared-memory ring (pearl/runtime/shared.py): nothing is pickled per step. The calling process is
the learner: it drains every ring into the replay (one insert per drained run), runs the updates due
(sample -> learn -> update_priorities), publishes weights every `plan.sync_interval` updates and
the current epsilon to a shared board, and grants each actor an allowance of env steps.

What it keeps of the sequential runtime's semantics (docs/ARCHITECTURE.md):
- the replay ratio: updates = floor((env_steps - learning_starts) x updates_per_step) over the env
  steps the learner has taken in, as in the sequential runtime; an actor may run at most
  `allowance` env steps ahead of what the learner has taken in from it, so the updates trail the
  count due by at most about MAX_LAG; the run ends with exactly the sequential count;
- every transition inserted once: a transition is in the ring once its actor commits it and the
  learner inserts each committed slot once (`ActorChannel.take`/`release`);
- target-network updates after the updates due at each crossing of target_update_interval;
- weights reach the actors as complete snapshots (a sequence lock), never half-written.
What it does not keep by default: determinism (the interleaving of the actors' steps depends on
timing), and the exact epsilon at each step: an actor reads the epsilon of the env steps the learner
has taken in, at most `allowance` steps behind its own. With `plan.deterministic_lag` it keeps both
(`_Lockstep`): a fixed order of rounds, each acting with its own step's epsilon and the weights of a
fixed number of env steps before it; at lag 0 with one actor, the sequential runtime's run exactly.

An actor process that a signal kills (kill -9, a segfault, the OOM killer) is restarted with the
same ring: what it committed is kept, the n-step transitions it was still assembling and its
unfinished episodes are lost (as when resuming from a checkpoint). An actor that raises an
exception stops the run with its message, as does one that exits before it can report. The run ends at the first multiple of actors x envs_per_actor env steps at or past the
requested count.
"""
from __future__ import annotations

import dataclasses
import gc
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import math
import os
import pickle
import queue
import signal
import subprocess
import sys
import threading
import time
import traceback
import warnings
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from pearl.contracts import Batch, Runtime, implements
from pearl.errors import ConfigError, PearlError
from pearl.io import interrupts_deferred
from pearl.kernels.cpu import flush_denormals
from pearl.runtime.counters import Counters, Hooks
from pearl.runtime.sequential import learn_one
from pearl.runtime.shared import (ACT_CPU_NS, ACT_NS, ALLOWED, BOOT_CPU_NS, CPU_SAMPLE, ROUNDS, STOP, WAIT_NS,
                                  ActorChannel, VersionBoard, WeightBoard)
from pearl.schedule import MAX_LAG, allowance, crossed, crossings, sync_due

RING_ROUNDS = 1024  # act rounds of transitions each ring holds
MAX_RESTARTS = 10  # per run: beyond that an actor that keeps dying is an error, not bad luck
HEALTH_CHECK_S = 0.05
# an actor's products are a few thousand elements: a second BLAS thread only adds synchronisation
# and takes a core from the learner or another actor (kernels/cpu/__init__.py)
ONE_BLAS_THREAD = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


@dataclass
class ActorRecipe:
    """How to build an actor in another process: the actor class, a factory of its policy, its
    other constructor arguments, the modules to import first (those that register the env) and
    the factory of an env given in Python (pearl.envs.register_source), registered again there.
    Everything here is picklable, except possibly that factory (a lambda, a closure)."""

    actor_class: type
    policy_factory: Callable[[], object]
    kwargs: dict = field(default_factory=dict)
    modules: tuple[str, ...] = ()
    env_factory: Callable[[], object] | None = None

    def env_here(self) -> None:
        """Makes the recipe's env id makeable in this process."""
        for name in self.modules:
            importlib.import_module(name)
        if self.env_factory is not None:
            import gymnasium

            gymnasium.register(self.kwargs["env_id"], entry_point=self.env_factory)

    def build(self, seed: int, policy=None, index: int = 0):
        """Actor number `index` (a frame table's writer: its envs are streams first_stream + index x
        n_envs, ...; a ray node's actors start at their node's first stream)."""
        kwargs = dict(self.kwargs)
        if kwargs.get("first_stream") is not None:
            kwargs["first_stream"] += index * kwargs["n_envs"]
        return self.actor_class(seed=seed, policy=policy if policy is not None else self.policy_factory(), **kwargs)


# CPython >= 3.12's DeprecationWarning at a fork of a process with more than one OS thread ("This
# process (pid=N) is multi-threaded, use of fork() may lead to deadlocks in the child.")
FORK_WARNING = r".*multi-threaded, use of fork\(\)"
# (actor class, env id) whose kernels this process has loaded (`_ActorProcesses._fork`)
_WARM_ACTORS: set[tuple] = set()


def actor_seed(seed: int, start_steps: int, actor: int, generation: int) -> int:
    """Distinct env seeds and exploration streams per actor, per restart and per resumed run."""
    return int(np.random.SeedSequence([seed, start_steps, actor, generation]).generate_state(1)[0])


def _wait(spins: int) -> int:
    """Backs off while waiting on another process: yield the core first, then sleep."""
    if spins < 200:
        os.sched_yield()
    else:
        time.sleep(1e-4)
    return spins + 1


# An actor's interpreter: isolated (-I: no cwd or script dir on sys.path, no PYTHON* variables, no
# user site), deaf to the terminal's Ctrl-C (the learner stops it), niced by its first argument
# (before any thread starts: a thread takes its creator's niceness), its sys.path the learner's as
# sent on stdin, then actor_main. A Ctrl-C in the few ms before the first line runs kills it as a
# signal would (the learner restarts it, or is stopping anyway).
ACTOR_BOOT = ("import os, pickle, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
              "os.nice(int(sys.argv[1])); sys.path[:] = pickle.load(sys.stdin.buffer); "
              "from pearl.runtime.processes import actor_main; actor_main()")


def actor_path(modules: tuple[str, ...]) -> list[str]:
    """The learner's sys.path for an actor, without the working directory (`-c`, `-m` and the
    interactive prompt put it first: a gymnasium.py there must not shadow the real one), plus at
    the end the folders `modules` were imported from (the user's env module or actor class may
    live in the working directory)."""
    cwd = os.getcwd()
    path = [p for p in sys.path if p not in ("", cwd)]
    for name in modules:
        origin = getattr(sys.modules.get(name.partition(".")[0]), "__file__", None)
        if origin is not None:
            folder = os.path.dirname(os.path.dirname(origin) if origin.endswith("__init__.py") else origin)
            if folder not in path:
                path.append(folder)
    return path


# How much nicer than the learner a low-priority actor process runs (runtime.actor_priority): the
# most there is, so that where an actor and a learner thread want the same core the kernel runs the
# learner's (a scheduling weight of 15 against 1024)
LOW_PRIORITY_NICENESS = 19


def actor_niceness(priority: str, learner_threads: int, actors: int, cores: int) -> int:
    """The niceness the actor processes add to the learner's (runtime.actor_priority). auto: low
    where the learner runs on more than one thread and its threads and the actors outnumber the
    cores. There a learner thread the kernel preempts for an actor stalls the learner's whole
    parallel product at its next barrier, while an actor preempted for the learner delays only its
    own next step, which the learner waits for anyway once it has learned (DQN on Atari, bf16 on 2
    threads with 1 actor on 2 cores: +18-21% env steps/s, docs/BENCHMARKS.md "Pixels end to end",
    session 43)."""
    if priority == "auto":
        priority = "low" if learner_threads > 1 and learner_threads + actors > cores else "normal"
    return LOW_PRIORITY_NICENESS if priority == "low" else 0


BLAS_BINDINGS = "scipy.linalg.cython_blas"


class _AttachBlasBindings(importlib.abc.MetaPathFinder):
    """After `load_blas_bindings_alone`: an import of the scipy.linalg package (a user's env may
    use it) runs as usual, then gets the `cython_blas` attribute the package would have had."""

    def find_spec(self, name, path, target=None):
        if name != "scipy.linalg":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_package = spec.loader.exec_module  # (a loader instance per spec: only this one changes)

        def exec_and_attach(module):
            exec_package(module)
            module.cython_blas = sys.modules[BLAS_BINDINGS]
        spec.loader.exec_module = exec_and_attach
        return spec


def load_blas_bindings_alone() -> bool:
    """Loads SciPy's BLAS bindings (scipy.linalg.cython_blas) without the rest of scipy.linalg;
    returns whether it did.

    numba's CPU target imports scipy.linalg.cython_blas the first time a process loads any
    compiled kernel (numba.np.arraymath checks that np.dot has a BLAS), and that import runs
    scipy.linalg's __init__: ~0.12-0.15 s of CPU (SciPy's array-API layer walks numpy's lazy
    submodules), a fifth of an actor process's start-up, for a package the actor never calls
    (docs/BENCHMARKS.md, issue 19 "Session 11").
    The extension module alone loads in ~2 ms. Registered under its name, numba's import and its
    run-time lookup of the BLAS functions (a batched kernel's np.dot) find it. Without SciPy, or
    with another layout, nothing changes: numba imports it as before."""
    if BLAS_BINDINGS in sys.modules or "scipy.linalg" in sys.modules:
        return False
    try:
        package = importlib.util.find_spec("scipy.linalg")  # imports scipy's light top package only
        spec = importlib.machinery.PathFinder.find_spec(BLAS_BINDINGS, list(package.submodule_search_locations))
        module = importlib.util.module_from_spec(spec)
        sys.modules[BLAS_BINDINGS] = module
        spec.loader.exec_module(module)
    except Exception:  # (ImportError, AttributeError of a None spec, ...): numba's own import then
        sys.modules.pop(BLAS_BINDINGS, None)
        return False
    sys.meta_path.insert(0, _AttachBlasBindings())
    return True


IN_ACTOR = False  # whether this process is an actor process (set by run_actor)


def actor_main() -> None:
    """An actor process started as a fresh interpreter (`_ActorProcesses.start`, ACTOR_BOOT): its
    arguments arrive pickled on stdin."""
    load_blas_bindings_alone()  # before anything loads a compiled kernel
    index, recipe, seed, channel_spec, (board_class, board_spec), learner_pid = pickle.load(sys.stdin.buffer)
    run_actor(index, recipe, seed, ActorChannel.attach(*channel_spec), board_class.attach(*board_spec), learner_pid)


def run_actor(index: int, recipe: ActorRecipe, seed: int, channel: ActorChannel, board: WeightBoard | VersionBoard,
              learner_pid: int) -> None:
    """An actor process's life, however it started: step, write, wait for the allowance, until the
    learner says stop or goes away; then os._exit (never returns). On a VersionBoard (a
    deterministic run) each round acts with the epsilon and the weights version the board's table
    names for it, waiting for that version if the learner has not published it yet."""
    global IN_ACTOR
    IN_ACTOR = True
    try:
        recipe.env_here()
        actor = recipe.build(seed, index=index)
        # the first call of the policy's compiled kernels loads them (numba's first in a process
        # builds its CPU target: ~0.2 s): here, before the first commit tells the learner this actor
        # is up; its random draws are put back (the actor's stream is the sequential runtime's)
        drawn = actor.rng.bit_generator.state
        actor.choose(0.0)
        actor.rng.bit_generator.state = drawn
        counters = channel.counters
        counters[BOOT_CPU_NS] = time.process_time_ns()  # (a restarted actor's replaces the first's)
        n_envs = actor.n_envs
        weights = np.empty(board.n_weights, dtype=np.float32)
        # a CPU QPolicy acts from one flat vector: the board's weights are copied straight into it
        from pearl.kernels.cpu import QPolicy

        direct = type(actor.policy) is QPolicy
        numbered = isinstance(board, VersionBoard)
        target = actor.policy.flat if direct else weights

        def learner_alive() -> bool:
            return os.getppid() == learner_pid
        version = -1
        clock = time.perf_counter_ns
        # an act round emits at most n_envs x n_step transitions (episode ends flush pending steps)
        room = n_envs * actor.nstep.n
        rounds, orphaned = 0, False
        # What the learner last granted, and the actor's own time counters: read and written in
        # shared memory only when needed (a read of a line the other core wrote is a cache miss)
        allowed = 0
        act_ns, wait_ns, cpu_ns = (int(counters[k]) for k in (ACT_NS, WAIT_NS, ACT_CPU_NS))  # a restart goes on
        cpu_clock, cpu_started = time.thread_time_ns, 0
        while not counters[STOP] and not orphaned:
            waited, spins = clock(), 0
            while channel.steps + n_envs > allowed or not channel.has_room(room, n_envs):
                allowed = int(counters[ALLOWED])
                if channel.steps + n_envs <= allowed and channel.has_room(room, n_envs):
                    break
                if counters[STOP]:
                    break
                spins = _wait(spins)
                if spins % 1000 == 0 and os.getppid() != learner_pid:
                    orphaned = True  # the learner died: nobody will drain the ring
                    break
            if counters[STOP] or orphaned:
                break
            if numbered:
                epsilon, wanted, slot = board.round(channel.rounds * board.actors + index)
                spins = 0
                while wanted != version and not board.try_read(target, wanted, slot):
                    if counters[STOP]:
                        break
                    spins = _wait(spins)
                    if spins % 1000 == 0 and os.getppid() != learner_pid:
                        orphaned = True
                        break
                if counters[STOP] or orphaned:
                    break
                if wanted != version and not direct:
                    actor.policy.load(weights)
                version = wanted
            sampled = rounds % CPU_SAMPLE == 1  # (not round 0: a first round pays one-off costs)
            if sampled:
                cpu_started = cpu_clock()
            started = clock()
            if numbered:  # (its weights were read before the round, as a wait)
                epsilon_now = epsilon
            elif direct:
                epsilon_now = board.epsilon
                fresh = board.read_latest(actor.policy.flat, version, learner_alive)
                if fresh is None:  # the learner was killed while it published
                    orphaned = True
                    break
                version = fresh
            else:
                epsilon_now = board.epsilon
                fresh = board.read(weights, version)
                if fresh != version:
                    actor.policy.load(weights)
                    version = fresh
            transitions, finished = actor.step(epsilon_now)
            channel.put(transitions, finished, n_envs)
            act_ns += clock() - started
            wait_ns += started - waited
            if sampled:
                cpu_ns += (cpu_clock() - cpu_started) * CPU_SAMPLE
            rounds += 1
            if rounds % 64 == 0:
                counters[ACT_NS], counters[WAIT_NS], counters[ACT_CPU_NS] = act_ns, wait_ns, cpu_ns
                orphaned = rounds % 4096 == 0 and os.getppid() != learner_pid
        counters[ACT_NS], counters[WAIT_NS], counters[ACT_CPU_NS] = act_ns, wait_ns, cpu_ns
        actor.close()
    except BaseException as error:
        # a user's mistake (an env that breaks its own space) is reported as its one line, as the
        # learner's own actor raises it; anything else with where it happened
        channel.report_error(str(error) if isinstance(error, PearlError) else traceback.format_exc(limit=8))
        sys.stderr.flush()
        os._exit(1)
    sys.stdout.flush()
    sys.stderr.flush()
    # no interpreter teardown: it would try to unmap the shared memory under numpy's views
    os._exit(0)


def fork_actors(parts) -> bool:
    """Whether this run's actor processes may start as forks of the learner's process, which has
    numpy, numba, Gymnasium and the compiled kernels loaded: ~6 ms of CPU to be ready to act
    against ~0.47 s for a fresh interpreter (docs/BENCHMARKS.md, issue 19 "Session 13"). Only
    where what the child runs is fork-safe: Linux, and an actor acting with pearl's numba kernels
    on the cpu. A CNN policy acts with torch, whose OpenMP pool does not survive a fork, and a GPU
    or OpenCL driver's context must not cross one: those actors start as fresh interpreters.
    `_ActorProcesses.start` also needs this process to run no other Python thread at that moment."""
    return (hasattr(os, "fork") and sys.platform.startswith("linux") and not parts.family.image
            and parts.plan.device_of("act") == "cpu")


class _Forked:
    """A forked actor process: the part of subprocess.Popen's interface the learner uses."""

    def __init__(self, pid: int):
        self.pid, self.returncode = pid, None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere (SIGCHLD ignored): its status is lost (Popen says 0 too)
                self.returncode = 0
            else:
                if pid:
                    self.returncode = os.waitstatus_to_exitcode(status)  # -N: killed by signal N
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"actor process {self.pid}", timeout)
            time.sleep(1e-3)
        return self.returncode

    def kill(self) -> None:
        if self.poll() is None:
            os.kill(self.pid, signal.SIGKILL)


def one_blas_thread_in_fork() -> None:
    """The loaded BLAS libraries on the calling thread alone, in a forked child (an actor).

    OpenBLAS stops its worker threads before a fork and restarts them at the next call that sets
    its thread count, even to 1: each OpenBLAS loaded (numpy's, SciPy's) then starts a worker that
    spins for 2^28 cycles (OPENBLAS_THREAD_TIMEOUT's default, ~0.1 s) before it sleeps, beside the
    actor. Stopped again here; at one thread OpenBLAS never restarts them (docs/BENCHMARKS.md,
    issue 19, session 52: +10.6% and +12.4% env steps/s in two interleaved A/Bs of the DQN CartPole
    row's 50k-step runs)."""
    from threadpoolctl import ThreadpoolController

    controller = ThreadpoolController()
    controller.limit(limits=1, user_api="blas")
    for library in controller.select(internal_api="openblas").lib_controllers:
        # (the handle threadpoolctl opened with RTLD_NOLOAD: the loaded library, never a second copy)
        stop_workers = getattr(library.dynlib, "blas_thread_shutdown_", None)
        if stop_workers is not None:
            stop_workers()


class _ActorProcesses:
    """The learner's view of its actors: channels, processes, restarts.

    Actors start in one of two ways (`start`): as forks of the learner's process where
    `fork_actors` allows it and no other Python thread runs, else as fresh isolated interpreters
    (`python -I -c ACTOR_BOOT`). Not `multiprocessing` children: its spawn re-runs the user's main
    script in each child (a script without an `if __name__ == "__main__"` guard would train again
    there). Both kinds stay in the learner's session and process group (one scheduling group: the
    kernel's autogroup is per session), and ignore SIGINT, so a Ctrl-C in the terminal acts
    through the learner, which stops them; a fork also drops the learner's other signal handlers.
    """

    def __init__(self, parts, start_steps: int, n_weights: int, quota: int, fork: bool = False,
                 board: VersionBoard | None = None, niceness: int = 0):
        """`board`: a deterministic run's (its actor 0 then starts with the run's seed, as the
        sequential runtime's actor does); None: a WeightBoard for `n_weights` weights. `niceness`:
        what each actor process adds to the learner's (`actor_niceness`)."""
        plan = parts.plan
        if "__main__" in parts.actor_recipe.modules:
            raise PearlError(f"env: {parts.config.env} was registered by the main script; actor processes "
                             f"cannot import it: register it in a module and list that module in imports")
        try:
            pickle.dumps(parts.actor_recipe)
        except (pickle.PicklingError, AttributeError, TypeError) as err:
            raise PearlError(f"env: actor processes need a picklable env factory (a module-level function "
                             f"or class, or a registered id); {type(err).__name__}: {err}") from None
        self.n, self.envs, self.quota = plan.actors, plan.envs_per_actor, quota
        self.seed, self.start_steps = parts.seed, start_steps
        self.recipe = parts.actor_recipe
        fields = parts.transition_fields
        capacity = RING_ROUNDS * self.envs * max(1, parts.n_step)
        self.channels = [ActorChannel.create(fields, capacity) for _ in range(self.n)]
        self.board = board if board is not None else WeightBoard.create(n_weights)
        self.deterministic = board is not None
        self.processes: list = [None] * self.n
        self.generations = [0] * self.n
        self.restarts = 0
        self.fork = fork
        self.niceness = niceness

    def start(self, index: int) -> None:
        if self.deterministic and index == 0 and self.generations[0] == 0:
            seed = self.seed
        else:
            seed = actor_seed(self.seed, self.start_steps, index, self.generations[index])
        # another Python thread (the prefetcher's, a user's) could hold a lock the child needs
        if self.fork and threading.active_count() == 1:
            self.processes[index] = self._fork(index, seed)
            return
        args = (index, self.recipe, seed, self.channels[index].spec(), (type(self.board), self.board.spec()), os.getpid())
        process = subprocess.Popen([sys.executable, "-I", "-c", ACTOR_BOOT, str(self.niceness)], stdin=subprocess.PIPE,
                                   env={**os.environ, **ONE_BLAS_THREAD})
        try:
            pickle.dump(actor_path((*self.recipe.modules, self.recipe.actor_class.__module__)), process.stdin)
            pickle.dump(args, process.stdin)
            process.stdin.close()
        except BrokenPipeError:  # it died at once; check() reports how
            pass
        self.processes[index] = process

    def _fork(self, index: int, seed: int) -> _Forked:
        """Actor `index` as a fork of this process (`fork_actors`); this thread is the only Python one."""
        warm = (self.recipe.actor_class, self.recipe.kwargs.get("env_id"))
        if warm not in _WARM_ACTORS:
            # An actor's first greedy step loads its compiled kernels (the policy's, a compiled
            # env's), and numba's first load in a process builds its CPU target (~0.25 s of CPU).
            # Once here, every fork has them, in every later run of this process too: it needs
            # numba's target for its learner anyway and its own actor loads the same kernels.
            actor = self.recipe.build(self.seed)
            actor.step(0.0)
            actor.close()
            _WARM_ACTORS.add(warm)
        # text still buffered here would be written again by the child's flush before os._exit
        sys.stdout.flush()
        sys.stderr.flush()
        # no signal may run one of the learner's handlers in the child before it drops them
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
        learner = os.getpid()
        with warnings.catch_warnings():
            # Python >= 3.12 warns at any fork of a process with more than one OS thread. No other
            # Python thread runs here (`start`); the others are native pools idle while this
            # thread forks: OpenBLAS's workers (numpy's and SciPy's; OpenBLAS stops them before a
            # fork), torch's or numba's if the learner used them (the child never does: `fork_actors`)
            warnings.filterwarnings("ignore", message=FORK_WARNING, category=DeprecationWarning)
            pid = os.fork()
        if pid:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            return _Forked(pid)
        try:  # the child: it never returns into the learner's code
            for signum in signal.valid_signals():
                if callable(signal.getsignal(signum)):
                    signal.signal(signum, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            os.nice(self.niceness)  # (the child's only thread: the one that forked)
            # the learner's objects stay shared with it until written: a collection here would
            # write to every one of them (reference counts and links), so none is ever collected
            gc.freeze()
            os.environ.update(ONE_BLAS_THREAD)  # (the loaded BLAS libraries: below)
            one_blas_thread_in_fork()
            channel, board = self.channels[index], self.board
            # the child's own views of the mapped blocks, as an attach makes them (never their owner)
            run_actor(index, self.recipe, seed, ActorChannel(channel.memory, channel.layout), board.view(), learner)
        except BaseException:  # before run_actor could report it: the learner says "its output is above"
            traceback.print_exc()
            sys.stderr.flush()
        finally:
            os._exit(1)  # (run_actor exits itself; here only if the lines before it raised)

    def _raise_reported(self, index: int) -> None:
        text = self.channels[index].error()
        if text is not None:
            text = text.rstrip()
            separator = "\n" if "\n" in text else " "  # a traceback under the line, a user's mistake on it
            raise PearlError(f"actor {index} failed:{separator}{text}")

    def raise_any_reported(self) -> None:
        """After `stop`: an actor that failed while the learner's own actor did the run's steps
        (it had not started yet) still fails the run."""
        for index, process in enumerate(self.processes):
            self._raise_reported(index)
            if process is not None and process.returncode is not None and process.returncode > 0:
                raise PearlError(f"actor {index} exited with code {process.returncode} before it could "
                                 f"report (its output is above)")

    def check(self, done: Callable[[int], bool]) -> None:
        """Raises an actor's exception; restarts an actor that a signal killed (kill -9, a segfault,
        the OOM killer) and that still has steps to take."""
        for index, process in enumerate(self.processes):
            if process.poll() is None:
                continue
            self._raise_reported(index)
            if done(index):
                continue
            if process.returncode > 0:  # it exited on its own without a report: it cannot start
                raise PearlError(f"actor {index} exited with code {process.returncode} before it could "
                                 f"report (its output is above)")
            self.restarts += 1
            if self.restarts > MAX_RESTARTS:
                raise PearlError(f"actor {index} died (exit code {process.returncode}) and {MAX_RESTARTS} "
                                 f"restarts were used up: stopping the run")
            print(f"pearl: actor {index} died (exit code {process.returncode}); restarting it "
                  f"(restart {self.restarts} of at most {MAX_RESTARTS})", file=sys.stderr, flush=True)
            self.generations[index] += 1
            self.start(index)

    def stop(self) -> None:
        """Tells every actor to finish and waits for it (killing one that does not finish)."""
        for channel in self.channels:
            channel.counters[STOP] = 1
        for process in self.processes:
            if process is None:
                continue
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def close(self) -> None:
        """Unlinks the shared memory (after `stop`)."""
        for block in (*self.channels, self.board):
            block.close()


def _copy(values):
    """A copy of one batch field: a numpy array, a tensor of a device replay, or None."""
    if values is None:
        return None
    return values.clone() if hasattr(values, "clone") else np.array(values, copy=True)


class Prefetcher:
    """A second thread of the learner process that applies the last batch's priority update and
    draws the next batch (a copy: the replay reuses its sample buffers) while the learner trains.
    The fused learner and the replay's kernels release the GIL, so the two overlap where a core is
    free for it."""

    def __init__(self, replay, batch_size: int, rng, timer):
        self.replay, self.batch_size, self.rng, self.timer = replay, batch_size, rng, timer
        self.jobs, self.results = queue.SimpleQueue(), queue.SimpleQueue()
        self.thread = threading.Thread(target=self._serve, name="pearl-prefetch", daemon=True)
        self.thread.start()

    def sample(self) -> Batch:
        """A copy of a freshly drawn batch (on the calling thread; the learner's while none is in flight)."""
        clock = time.perf_counter
        t0 = clock()
        batch = self.replay.sample(self.batch_size, self.rng)
        batch = Batch(**{f.name: _copy(getattr(batch, f.name)) for f in dataclasses.fields(batch)})
        if self.timer:
            self.timer.add("sample", clock() - t0)
        return batch

    def _serve(self) -> None:
        flush_denormals()  # per thread, as the learner's (kernels/cpu/__init__.py)
        while True:
            job = self.jobs.get()
            if job is None:
                return
            pending, more = job
            try:
                if pending is not None:
                    t0 = time.perf_counter()
                    self.replay.update_priorities(*pending)
                    if self.timer:
                        self.timer.add("update_priorities", time.perf_counter() - t0)
                self.results.put(self.sample() if more else None)
            except BaseException as error:  # raised in the learner's thread by finish()
                self.results.put(error)

    def start(self, pending, more: bool) -> None:
        """Begins: the priority update of `pending` (indices, |TD|), then the next batch if `more`."""
        self.jobs.put((pending, more))

    def finish(self) -> Batch | None:
        result = self.results.get()
        if isinstance(result, BaseException):
            raise result
        return result

    def close(self) -> None:
        self.jobs.put(None)
        self.thread.join()


MAX_BOARD_BYTES = 1 << 30  # a deterministic run's weight versions in shared memory


class _Lockstep:
    """A deterministic run's order (Plan.deterministic_lag): global act round g is actor g % n's
    round g // n and begins at env step t = start + g x envs; it acts with epsilon(t) and the
    weights after the updates due at t - lag (rounded down to a publish, never older than the
    run's first weights); the learner takes rounds in in that order, in chunks that end with the
    first round after which an update is due or the target is copied, and then learns as the
    sequential runtime does after that round. Its VersionBoard keeps every published version until
    no actor can still need it: the learner is at most `lag` env steps' updates (plus one burst) past
    the oldest version an actor's next round reads, because an actor's next round is never one the
    learner has taken in."""

    def __init__(self, parts, start: int, updates: int, n_weights: int, window: int):
        """`start`, `updates`: the run's first env step and update count; `window`: global rounds
        past those taken in that an actor may reach (the allowances)."""
        plan, schedule = parts.plan, parts.schedule
        self.lag, self.sync, self.start = plan.deterministic_lag, schedule.sync_interval, start
        self.n, self.envs, self.window = plan.actors, plan.envs_per_actor, window
        self.schedule, self.epsilon, self.target_interval = schedule, parts.algo.epsilon, schedule.target_interval or 0
        self.first_version = updates
        span = self.lag * schedule.updates_per_step + schedule.gradient_steps + 1
        slots = math.ceil(span / self.sync) + 3
        need = slots * (-(-4 * n_weights // 64) * 64)
        if need > MAX_BOARD_BYTES:
            raise ConfigError(f"plan.deterministic_lag: {self.lag} env steps keep {slots} weight versions of "
                              f"{4 * n_weights / 2**20:.1f} MiB in shared memory ({need / 2**30:.1f} GiB; at most "
                              f"{MAX_BOARD_BYTES / 2**30:.0f} GiB): expected a smaller lag or a larger plan.sync_interval")
        # the table is filled `window` rounds at a time, up to two windows ahead of the rounds taken in
        self.board = VersionBoard.create(n_weights, slots, 3 * window + self.n, self.n)
        self.planned = 0  # global rounds whose row the board's table holds
        self._version, self._until = updates, -math.inf  # the version of rounds whose step - lag is below _until

    def version(self, round_index: int) -> int:
        """The weights version global round `round_index` acts with (rounds asked in order)."""
        behind = self.start + round_index * self.envs - self.lag
        if behind >= self._until:
            behind = max(0, behind)
            due = self.schedule.due(behind)
            self._version = max(self.first_version, due // self.sync * self.sync)
            self._until = self.schedule.next_increase(behind)
        return self._version

    def slot(self, version: int) -> int:
        """The board slot of a published version: publishes go round the slots in turn."""
        first = self.first_version
        return (0 if version == first else version // self.sync - first // self.sync) % self.board.slots

    def publish(self, version: int, weights: np.ndarray) -> None:
        self.board.publish(self.slot(version), version, weights)

    def plan_rounds(self, taken_rounds: int, total_rounds: int) -> None:
        """Writes the table rows an actor may reach next (before its allowance lets it): when
        fewer than a window are planned past the rounds taken in, up to two windows past them."""
        if self.planned - taken_rounds >= self.window or self.planned >= total_rounds:
            return
        first, end = self.planned, min(taken_rounds + 2 * self.window, total_rounds)
        epsilon, start, envs = self.epsilon, self.start, self.envs
        versions = [self.version(g) for g in range(first, end)]
        slots, slot, previous = [], None, None
        for version in versions:
            if version != previous:
                slot, previous = self.slot(version), version
            slots.append(slot)
        self.board.set_rounds(first, [epsilon(start + g * envs) for g in range(first, end)], versions, slots)
        self.planned = end

    def chunk(self, taken_rounds: int, limit: int) -> int:
        """Global rounds to take in before learning next: through the first round after which an
        update is due or the target is copied, at most `limit`."""
        t = self.start + taken_rounds * self.envs
        boundary = self.schedule.next_increase(t)
        if self.target_interval:
            boundary = min(boundary, (t // self.target_interval + 1) * self.target_interval)
        return min(limit, max(1, -(-(boundary - t) // self.envs)))

    def rounds_of(self, actor: int, global_rounds: int) -> int:
        """How many of the first `global_rounds` global rounds are actor `actor`'s."""
        return max(0, (global_rounds - actor + self.n - 1) // self.n)


def takes_channel_rows(replay, fields: dict[str, tuple[np.dtype, tuple]]) -> bool:
    """Whether `replay` takes a run of an ActorChannel's rows (`fields`: the channel's) by one
    compiled copy out of the shared block (Replay.add_frame): its rows are whole words and its
    fields are the channel's, in the same order. Else the learner inserts views of the ring (add):
    a view per field, and the table's check of each, cost ~10 us more per take here (an insert
    in a deterministic run is a few rows: docs/BENCHMARKS.md, issue 19, session 32)."""
    if not getattr(replay, "takes_frames", False):
        return False
    stored = [(name, column.dtype, column.shape[1:]) for name, column in replay.storage.items()]
    return stored == [(name, np.dtype(dtype), tuple(shape)) for name, (dtype, shape) in fields.items()]


@implements(Runtime)
class Processes:
    name = "processes"
    max_lag = MAX_LAG[name]  # summed over the actors' allowances

    def run(self, parts, counters: Counters, steps: int, hooks: Hooks) -> None:
        """Advances `counters` by about `steps` env steps with `plan.actors` actor processes (module doc)."""
        _run(parts, counters, steps, hooks)


RUNTIME = Processes()


def _run(parts, counters: Counters, steps: int, hooks: Hooks) -> None:
    replay, learner, plan, schedule, rng = parts.replay, parts.learner, parts.plan, parts.schedule, parts.rng
    timer, clock = hooks.timer, time.perf_counter
    n, envs = plan.actors, plan.envs_per_actor

    def quota_left(local_steps: int) -> int:
        """Env steps per actor that reach `steps` with those the learner's own actor took."""
        return max(0, math.ceil((steps - local_steps) / (n * envs)) * envs)

    quota = quota_left(0)
    ahead = allowance(schedule.updates_per_step, n, envs)
    start = counters.env_steps
    due = schedule.due

    weights = learner.policy_weights()
    lockstep = None
    if plan.deterministic_lag is not None:
        lockstep = _Lockstep(parts, start, counters.updates, weights.size, n * (ahead // envs + 2))
        lockstep.publish(counters.updates, weights)
        lockstep.plan_rounds(0, n * quota // envs)
    # the learner's own actor steps while the actor processes start (plan.act_while_actors_start);
    # it hands over at a multiple of n x envs steps, so the run ends where it would without it.
    # Meanwhile each actor may commit one round only (its sign that it is up): a later, smaller
    # quota (the learner's own steps count against it) is never below what an actor committed.
    # Not in a deterministic run: when the hand-over comes depends on timing. Made before the actors'
    # shared memory, which an env that fails to start (the user's) would otherwise leave behind.
    local = parts.actor if plan.act_while_actors_start and lockstep is None else None
    from pearl.devices import cpu_devices

    niceness = actor_niceness(parts.config.runtime.actor_priority, parts.config.runtime.torch_threads, n,
                              cpu_devices()[0]["cores"])
    actors = _ActorProcesses(parts, start, weights.size, quota, fork=fork_actors(parts),
                             board=lockstep.board if lockstep else None, niceness=niceness)
    board, channels = actors.board, actors.channels
    if lockstep is None:
        board.publish(weights)
        board.epsilon = published_epsilon = parts.algo.epsilon(counters.env_steps)
    taken = [0] * n  # env steps taken in from each actor
    local_steps = 0
    # on a frame table the learner's own actor writes actor 0's env streams: actor 0's rounds wait
    # in its ring until the hand-over (its first step begins new episodes there), and the learner's
    # actor drops its episodes then, to begin new ones when it next acts
    shared_streams = local is not None and local.streams is not None

    def allowed(index: int) -> int:
        return min(quota, envs if local is not None else taken[index] + ahead)

    for index, channel in enumerate(channels):
        channel.counters[ALLOWED] = allowed(index)
    counters.actor_processes = actors  # while the run lasts: its actors' processes and rings
    lead = 0  # the most env steps the actors were ahead of what the learner had taken in

    def learned(loss: float) -> None:
        counters.updates += 1
        counters.record_loss(loss)
        if sync_due(counters.updates, schedule.sync_interval):
            t0 = clock()
            weights = learner.policy_weights()
            if lockstep is not None:
                lockstep.publish(counters.updates, weights)
            else:
                board.publish(weights)
            if local is not None:
                local.policy.load(weights)
            if timer:
                timer.add("sync_weights", clock() - t0)

    def learn_until(target_updates: int) -> None:
        while counters.updates < target_updates:
            learned(learn_one(replay, learner, schedule.batch_size, rng, timer))

    prefetcher = None  # (its thread starts after the actors: `_ActorProcesses.start` forks only without one)

    def learn_until_prefetching(target_updates: int) -> None:
        """learn_until with the sampling of batch u+1 and the priority update of batch u-1 on the
        prefetcher's thread while batch u trains. Within one call only: inserts (take_in) never
        run beside it, and no batch is drawn that is not due."""
        if counters.updates >= target_updates:
            return
        batch, pending = prefetcher.sample(), None
        while counters.updates < target_updates:
            more = counters.updates + 1 < target_updates
            prefetcher.start(pending, more)
            t0 = clock()
            loss, abs_td = learner.update(batch)
            if timer:
                timer.add("learn", clock() - t0)
            if replay.prioritized:  # the kernel reuses its |TD| buffer at the next update
                pending = (batch.indices, np.array(abs_td, copy=True))
            batch = prefetcher.finish()
            learned(loss)
        prefetcher.start(pending, False)
        prefetcher.finish()

    def act_here() -> None:
        """One round of the learner's own actor, inserted at once (as the sequential runtime does)."""
        nonlocal local_steps
        t0 = clock()
        transitions, finished = local.step(parts.algo.epsilon(counters.env_steps))
        if transitions is not None:
            replay.add(*transitions)
        local_steps += envs
        counters.record_episodes(finished)
        if timer:
            timer.add("act_in_learner", clock() - t0)

    by_rows = takes_channel_rows(replay, parts.transition_fields)

    def take_in(index: int, rounds: int | None = None) -> int:
        """Inserts what actor `index` committed (up to its round `rounds`); returns how many env
        steps it had been ahead."""
        channel = channels[index]
        if by_rows:
            actor_steps, spans, finished = channel.take_spans(rounds)
            for first, count in spans:
                replay.add_frame(channel.raw, channel.column_offsets(first), count)
        else:
            actor_steps, runs, finished = channel.take(rounds)
            for run_fields in runs:
                replay.add(*run_fields)
        channel.release()
        ahead_by, taken[index] = actor_steps - taken[index], actor_steps
        if finished:
            counters.record_episodes(finished)
        return ahead_by

    learn = learn_until_prefetching if plan.prefetch else learn_until
    total_rounds = n * quota // envs
    # a deterministic chunk waits for every round in it: each actor's share stays within its
    # allowance and half its ring
    chunk_limit = n * max(1, min(ahead // envs, RING_ROUNDS // 2))
    last_check, spins = clock(), 0
    try:
        for index in range(n):
            actors.start(index)
        if plan.prefetch:
            prefetcher = Prefetcher(replay, schedule.batch_size, rng, timer)
        while True:
            previous = counters.env_steps
            if local is not None:
                # handing over with at most one round per actor left keeps every quota >= envs
                if local_steps % (n * envs) == 0 and (all(c.counters[ROUNDS] for c in channels)
                                                      or steps - local_steps <= n * envs):
                    if shared_streams:
                        local.begin_episodes()
                    local = None  # every actor is up (or the run is done): they take over
                    quota = quota_left(local_steps)
                else:
                    act_here()
            t0 = clock()
            if lockstep is not None:
                taken_rounds = (counters.env_steps - start) // envs
                chunk = lockstep.chunk(taken_rounds, min(total_rounds - taken_rounds, chunk_limit))
                wanted = [lockstep.rounds_of(index, taken_rounds + chunk) for index in range(n)]
                if chunk and all(int(c.counters[ROUNDS]) >= w for c, w in zip(channels, wanted)):
                    lead = max(lead, sum(take_in(index, wanted[index]) for index in range(n)))
                    counters.env_steps = start + sum(taken)
                    replay.progress = counters.env_steps
                    if timer:
                        timer.add("insert", clock() - t0)
                    # after the chunk's last round, as the sequential runtime after each round
                    learn(due(counters.env_steps))
                    if crossed(counters.env_steps - envs, counters.env_steps, schedule.target_interval or 0):
                        learner.update_target()
                    lockstep.plan_rounds(taken_rounds + chunk, total_rounds)
            else:
                # the actors' lead: how far their committed steps were past what the learner had taken
                # in, read as it takes them in (the commit records it loads anyway)
                first = 1 if shared_streams and local is not None else 0
                lead = max(lead, sum(take_in(index) for index in range(first, n)))
                counters.env_steps = start + local_steps + sum(taken)
                replay.progress = counters.env_steps
                if timer and counters.env_steps > previous:
                    timer.add("insert", clock() - t0)
                for point in crossings(previous, counters.env_steps, schedule.target_interval):
                    learn(due(point))
                    learner.update_target()
                learn(due(counters.env_steps))
                epsilon = parts.algo.epsilon(counters.env_steps)
                if epsilon != published_epsilon:  # a store to the line every actor reads each round
                    board.epsilon = published_epsilon = epsilon
            if local is not None:
                quota = quota_left(local_steps)
            for index, channel in enumerate(channels):
                channel.counters[ALLOWED] = allowed(index)
            finished_all = local is None and all(t >= quota for t in taken)
            if counters.env_steps > previous:
                spins = 0
                if hooks.on_round is not None:
                    hooks.on_round()
            elif not finished_all:
                spins = _wait(spins)
            if finished_all or counters.stop_requested:
                break
            if clock() - last_check > HEALTH_CHECK_S:
                actors.check(lambda index: taken[index] >= quota)
                last_check = clock()
    finally:
        # what actors commit after the last take_in is dropped: the run ends where the learner's
        # count says (counters.env_steps), with exactly the updates due there. A second Ctrl-C
        # waits for the actors to stop and the shared memory to be unlinked.
        with interrupts_deferred():
            actors.stop()
            try:
                actors.raise_any_reported()
            except PearlError as failure:
                reported = failure
            else:
                reported = None
            rounds = sum(int(c.counters[ROUNDS]) for c in channels)
            if timer and rounds:
                # the actors' own clocks: time in act rounds, and waiting for the allowance or ring space
                timer.add("act", sum(int(c.counters[ACT_NS]) for c in channels) * 1e-9, rounds)
                timer.add("act_wait", sum(int(c.counters[WAIT_NS]) for c in channels) * 1e-9, rounds)
                timer.add("act_cpu", sum(int(c.counters[ACT_CPU_NS]) for c in channels) * 1e-9, rounds)
            # (not a timer task: the estimator's profile prices every timed task per round or update)
            counters.actor_boot_cpu = tuple(int(c.counters[BOOT_CPU_NS]) * 1e-9 for c in channels
                                            if c.counters[BOOT_CPU_NS])
            actors.close()
            if prefetcher is not None:
                prefetcher.close()
            counters.actor_processes = None
    if reported is not None:
        raise reported
    counters.actor_restarts, counters.actor_lead = actors.restarts, lead
    parts.policy.load(learner.policy_weights())  # the learner side's copy: no actor here synced it
