"""The schedule arithmetic every runtime keeps, in one place: how many updates are due, when the
target network moves, when weights sync, how far a parallel runtime may run ahead, and how much
room the replay's rate limiter leaves for it. Imported by every runtime, by the agent's builder
(rate limiter sizing) and by the estimator; it imports nothing of pearl's.

The reference semantics (the sequential runtime, docs/ARCHITECTURE.md): after each act round,
exactly `Schedule.due(env_steps)` updates have been made (spread evenly at `updates_per_step`, or
in Stable-Baselines3's bursts of `gradient_steps` updates every `train_freq` env steps); a target update follows the updates due
at each env step that is a multiple of `target_update_interval`; weights go to the actors every
`sync_interval` updates.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

# Updates a parallel runtime's learner may trail the count due (its lag bound), by runtime: a
# runtime (a module of pearl/runtime) has its lag bound here and its schedule model in .models.
# The processes runtime's is the actors' buffer against the learner's hiccups: with an actor and a
# learner of near-equal speed (CartPole DQN, ~11 and ~13 us a step), 8 updates (32 env steps) left
# each waiting on the other ~150 times a 50k-step run (~0.2 ms a wait); 32 took its env steps/s
# from 60.8-66.6k to 67.6-69.3k (docs/BENCHMARKS.md issue 19, session 20).
MAX_LAG = {"sequential": 0, "threaded": 4, "processes": 32}
RUNTIMES = tuple(MAX_LAG)
MANY_ACTORS = ("processes",)  # runtimes that run a plan's `actors` actors (the others run one)
# Runtimes beyond one machine (`ray`: pearl/runtime/ray.py; `actors` actor processes on each node):
# a Plan may name them and each has a schedule model in .models, but no MAX_LAG (the replay server
# or the driver keeps their ratio with a bound of their own, tested in tests/test_ray_runtime.py)
# and no place in the one-machine contract suite.
CLUSTER_RUNTIMES = ("ray",)
RING_RECORDS = 4096  # commit records of a processes-runtime ring (pearl/runtime/shared.py)
# the ray runtime's weights go out at most this often: a publish costs Ray calls where the
# processes runtime's board costs a copy (measured on the 2-core EPYC, `pearl profile --ray`: ~0.8 ms
# of a node agent's CPU per publish, ~0.5 ms of the driver's and Ray's), ~7% of a 2-node CartPole
# run's CPU at 10 ms; a sync due sooner is folded into the next publish (the actors get the newest
# weights). At 20 ms a node's actors take ~400-500 env steps per version there (Ape-X's actors
# fetch every 400): whole runs +2-5% over 10 ms in 6 of 7 interleaved pairs, both orders (docs/BENCHMARKS.md)
PUBLISH_S = 0.02
# weights up to this size travel inside the publish call (Ray inlines arguments up to 100 KiB,
# its max_direct_call_object_size) rather than as one object-store put that each node's raylet
# fetches from the driver's: larger ones are put once and the reference sent
INLINE_WEIGHTS_BYTES = 64 * 1024
# a ray learner sampling remote replay shards (uniform replay) keeps this many batches asked for
# beyond the one it learns on: their round trips overlap its updates (the ray model prices it)
SAMPLES_AHEAD = 4


@dataclass(frozen=True)
class Schedule:
    """One run's schedule: the replay ratio from learning_starts on, the batch, how often weights
    go to the actors and, for algorithms with one (DQN), the target network's interval in env
    steps (None: the algorithm moves its targets inside each update, as DDPG, TD3 and SAC do).
    With `train_freq`, the updates come in bursts of `gradient_steps` (then `updates_per_step` is
    their average, gradient_steps / train_freq, which the estimator and rate limiter use)."""

    learning_starts: int
    updates_per_step: float
    batch_size: int
    sync_interval: int = 1
    target_interval: int | None = None
    train_freq: int | None = None
    gradient_steps: int = 1
    updates_before: int = 0  # made before learning_starts: a run whose replay restarted (`restarted`)

    def due(self, env_steps: int) -> int:
        if self.train_freq:
            return self.updates_before + burst_updates_due(env_steps, self.learning_starts, self.train_freq,
                                                           self.gradient_steps)
        return self.updates_before + updates_due(env_steps, self.learning_starts, self.updates_per_step)

    def restarted(self, env_steps: int, updates: int, stored: int, warm_up: int) -> "Schedule":
        """This schedule for a run whose replay table was set apart from its counts (an agent loaded
        without its replay contents, or given a table of its own): the `updates` made so far stand
        and the ratio goes on from `env_steps` once the table holds `warm_up` (the config's
        learning_starts) transitions, of which it holds `stored` now: no burst of updates the
        counts would make due on a table that cannot back them."""
        return dataclasses.replace(self, learning_starts=env_steps + max(0, warm_up - stored), updates_before=updates)

    def next_increase(self, env_steps: int) -> int:
        """The smallest env step count past `env_steps` at which more updates are due than at
        `env_steps`: solved from `due`'s formula, then checked against `due` itself (a deterministic
        processes run asks this once per update: a search cost ~3 us more each time)."""
        already = self.due(env_steps)
        if self.train_freq:
            at = (max(env_steps, self.learning_starts) // self.train_freq + 1) * self.train_freq
        else:
            at = self.learning_starts + math.ceil((already - self.updates_before + 1) / self.updates_per_step)
        # the even schedule's division may round a step off either way
        while self.due(at - 1) > already:
            at -= 1
        while self.due(at) <= already:
            at += 1
        return at


def updates_due(env_steps: int, learning_starts: int, updates_per_step: float) -> int:
    """Updates made once `env_steps` env steps were taken: floor((env_steps - learning_starts) x
    updates_per_step), never negative."""
    return int(max(0, env_steps - learning_starts) * updates_per_step)


def burst_updates_due(env_steps: int, learning_starts: int, train_freq: int, gradient_steps: int) -> int:
    """Updates made once `env_steps` env steps were taken, in bursts: `gradient_steps` at each
    multiple of `train_freq` past `learning_starts` (Stable-Baselines3 trains after each rollout of
    train_freq steps once num_timesteps > learning_starts). train_freq 1 is the even schedule."""
    return max(0, env_steps // train_freq - learning_starts // train_freq) * gradient_steps


def share(amount: int, start: int, stop: int, whole: int) -> int:
    """The part of `amount` (env steps, inserted counts) that rows [start, stop) of `whole` rows
    carry: whole numbers in proportion to the rows, consecutive parts summing to `amount` exactly."""
    return amount * stop // whole - amount * start // whole


def crossed(previous: int, current: int, interval: int) -> bool:
    """Whether going from `previous` to `current` env steps passed a multiple of `interval` (0: never)."""
    return bool(interval) and current // interval > previous // interval


def crossings(previous: int, current: int, interval: int | None) -> range:
    """The multiples of `interval` in (previous, current]: the env steps whose target updates are
    owed after going from `previous` to `current` (none without an interval)."""
    if not interval:
        return range(0)
    return range((previous // interval + 1) * interval, current + 1, interval)


def sync_due(updates: int, sync_interval: int) -> bool:
    """Whether the update that made the count `updates` publishes the weights to the actors."""
    return updates % sync_interval == 0


def last_sync(updates: int, due: int, sync_interval: int) -> int | None:
    """Of the updates that take the count from `updates` to `due` back to back, the last that
    publishes the weights (sync_due), or None: the actors act on none of the earlier ones, so a
    runtime that runs them without an act round between publishes only it."""
    last = due - due % sync_interval
    return last if last > updates else None


def allowance(updates_per_step: float, actors: int, envs: int) -> int:
    """Env steps a processes-runtime actor may run ahead of what the learner took in from it: the
    actors together at most MAX_LAG['processes'] updates ahead, at least one act round each, at
    most half of its ring's commit records."""
    rounds = MAX_LAG["processes"] / max(updates_per_step, 1e-9) / actors / envs
    return envs * max(1, min(int(rounds), RING_RECORDS // 2))


def chunk_steps(plan, n_step: int) -> int:
    """The env steps one chunk of a ray node agent may commit: `chunk` rows, and n-step heads."""
    return plan.ray.chunk + n_step * plan.envs_per_actor * plan.actors


AHEAD_ROUNDS = 64  # act rounds: ~3-10 ms of acting (an 8-env CartPole round is ~150 us here)


def agent_allowance(plan, updates_per_step: float) -> int:
    """Env steps an actor of a ray node agent may run ahead of what its agent took in
    (pearl/runtime/node_agent.py; the ray model fills chunks up to its actors' allowances):
    AHEAD_ROUNDS act rounds, a chunk's worth, at least the processes runtime's allowance, at most
    half its ring's commit records. It does not widen the lag: with `replay: learner` the server
    counts only what the agents commit against its credit, and a gated agent caps its actors'
    allowances at its grant."""
    n, envs = plan.actors, plan.envs_per_actor
    rounds = max(AHEAD_ROUNDS, math.ceil(plan.ray.chunk / (n * envs)),
                 allowance(updates_per_step, plan.ray.nodes * n, envs) // envs)
    return envs * min(rounds, RING_RECORDS // 2)


def credit_lag(plan, updates_per_step: float, n_step: int) -> int:
    """Updates a ray run's credit lets the learner trail the count due (its replay server's
    max_lag, pearl/runtime/ray.py; the ray model prices the same window): the processes runtime's
    bound, plus room for each node agent to hold the credit of one chunk (at most `chunk` rows,
    each with the env steps it commits; n-step heads add up to n_step x envs per actor)."""
    return MAX_LAG["processes"] + plan.ray.nodes * math.ceil(updates_per_step * chunk_steps(plan, n_step))


def grant_step(plan, updates_per_step: float, n_step: int) -> int:
    """Env steps of a ray run between two grants of the driver to a node agent (replay off the
    learner's process, pearl/runtime/ray.py `_Remote.grant`: a Ray call each, one per this many
    env steps of the whole run; the ray model prices them): a quarter of the credit window."""
    return max(1, math.ceil(credit_lag(plan, updates_per_step, n_step) / updates_per_step) // 4)


# A ray node agent's nap between passes over its rings (pearl/runtime/node_agent.py), and the age
# of its oldest row at which it sends what it holds as one chunk; the ray model prices its passes
# per nap, its chunks' fill and its credit window from them
AGENT_NAP_S = 0.002
FLUSH_S = 0.005


@dataclass(frozen=True)
class RateLimit:
    """The replay's rate-limiter band for a run (pearl.replay.RateLimiter's arguments)."""

    samples_per_insert: float
    min_size_to_sample: int
    error_buffer: float


def rate_limit(runtime: str, batch: int, updates_per_step: float, learning_starts: int, n_step: int,
               envs: int, actors: int = 1, burst: int = 1) -> RateLimit:
    """Samples per insert = updates per step x batch, with slack for what the runtime may have in
    flight: one act round's inserts, which with n-step returns is up to envs x n_step transitions
    (every env ending its episode at once flushes its pending steps), the updates one round makes
    due (a `burst` of train_freq / gradient_steps makes gradient_steps due at once, up to that many
    ahead of the even ratio), and the runtime's lag bound (a parallel runtime's actors run ahead by
    their allowances)."""
    ratio = updates_per_step * batch
    per_round = max(1.0, updates_per_step, burst)
    # before a round's insert the table may be ahead by the (n_step - 1) x envs pending steps, and
    # the insert adds up to envs x n_step more: ratio x envs x (2 n_step - 1) in all
    slack = batch * per_round * (n_step + envs) + ratio * envs * (2 * n_step - 1)
    if runtime != "sequential":
        slack += batch * (MAX_LAG.get(runtime, 0) + per_round * actors * envs * n_step)
    # each env of every actor holds its last n_step - 1 steps until their n-step returns are
    # known, so at learning_starts the table has (n_step - 1) x envs x actors fewer transitions
    # than env steps
    lag = (n_step - 1) * envs * actors
    return RateLimit(ratio, max(1, learning_starts - lag), slack)
