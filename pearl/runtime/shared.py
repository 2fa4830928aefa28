"""Shared-memory transport between actor processes and the learner: no pickling per step.

`ActorChannel` is one actor's single-producer / single-consumer ring of transitions and finished
episodes, plus the counters the two sides exchange (what the actor committed, the env-step allowance
the learner grants, the actor's task times). `WeightBoard` carries the policy weights and the
exploration epsilon from the learner to every actor under a sequence lock; `VersionBoard` is its
counterpart for a deterministic run (Plan.deterministic_lag): numbered weight versions, and what
each act round acts with.

Memory is POSIX shared memory (`multiprocessing.shared_memory`) that the learner creates and
unlinks; actor processes attach by name (a restarted actor attaches to the same block and continues
where the dead one stopped). Each counter has one writer and sits on its own cache line.

An act round is committed by one store: the actor writes the round's transitions and episodes,
then a commit record (its running totals of transitions, episodes and env steps) in a ring of
records, then the round count that points at that record. The learner loads the round count, then
the record, then the data. So an actor killed mid-round leaves nothing half-counted: its
replacement continues from the last record and overwrites the partial data. The ordering this
relies on: x86-64 keeps stores in order and loads in order (TSO), and numpy does each store as one
aligned 8-byte write, so a reader never sees a count ahead of its data. (On weaker memory models,
e.g. ARM, this transport would need fences.)
"""
from __future__ import annotations

import os
from multiprocessing import resource_tracker
from multiprocessing.shared_memory import SharedMemory

import numpy as np

from pearl.kernels.cpu.stream_store import publish_numbered, publish_streamed
from pearl.schedule import RING_RECORDS

LINE = 64  # bytes: one cache line
_WORDS = LINE // 8

# one int64 counter per cache line, each with a single writer
ROUNDS = 0           # actor: act rounds committed; round r's totals are in records[(r - 1) % RECORDS]
CONSUMED = 1         # learner: transitions read
EPISODES_READ = 2    # learner: episodes read
ALLOWED = 3          # learner: env steps the actor may reach before it waits
STOP = 4             # learner: 1 = finish now
ACT_NS = 5           # actor: nanoseconds spent in act rounds
WAIT_NS = 6          # actor: nanoseconds waiting for the allowance or for ring space
ERROR_BYTES = 7      # actor: length of the error report it wrote before exiting
ACT_CPU_NS = 8       # actor: CPU nanoseconds in act rounds (sampled: 1 round in CPU_SAMPLE, scaled)
BOOT_CPU_NS = 9      # actor: its process's CPU nanoseconds from fork or exec to ready to act (interpreter, imports, kernels)
_COUNTERS = 10
CPU_SAMPLE = 16  # a thread CPU clock read is a system call (~0.5 us): one round in 16 is enough
# commit records: an actor may be at most RECORDS / 2 rounds ahead of the learner (the runtime caps
# its allowance there), so the record the learner reads is never being rewritten
RECORDS = RING_RECORDS
ERROR_CAPACITY = 8192  # bytes of an actor's error report (a traceback's tail)


def _aligned(offset: int) -> int:
    return -(-offset // LINE) * LINE


_CREATED: set[str] = set()  # blocks this process created (and will unlink)


def _create(size: int) -> SharedMemory:
    memory = SharedMemory(create=True, size=size)
    _CREATED.add(memory.name)
    return memory


def _attach(name: str) -> SharedMemory:
    """Opens the learner's block without taking ownership: only its creator unlinks it."""
    try:
        return SharedMemory(name=name, track=False)  # Python >= 3.13
    except TypeError:
        memory = SharedMemory(name=name)
        # Python < 3.13 registers every attach with this process's resource tracker, which would
        # unlink the block when this process exits, under the learner's feet (in the creator's
        # own process the registration is the creator's: it stays)
        if memory.name not in _CREATED:
            resource_tracker.unregister(memory._name, "shared_memory")
        return memory


class _Block:
    """A named shared-memory block: created (and later unlinked) by the learner, attached by actors."""

    def __init__(self, memory: SharedMemory, owner: bool):
        self.memory, self.owner = memory, owner
        self.raw = np.frombuffer(memory.buf, dtype=np.uint8)

    def close(self) -> None:
        """Drops this process's views and mapping; the owner also unlinks the name."""
        self.__dict__ = {"memory": self.memory, "owner": self.owner}  # the numpy views go first
        try:
            self.memory.close()
        except BufferError:  # a caller still holds a view: the mapping goes when that view does
            pass
        if self.owner:
            try:
                self.memory.unlink()
            except FileNotFoundError:  # already gone (a second close)
                pass
            _CREATED.discard(self.memory.name)


class _Layout:
    """Byte offsets of a block's parts: counters, commit records, each field's ring, the episode
    ring, the error report."""

    def __init__(self, fields: dict[str, tuple[np.dtype, tuple]], capacity: int, episode_capacity: int):
        self.fields, self.capacity, self.episode_capacity = fields, capacity, episode_capacity
        self.records_offset = _COUNTERS * LINE
        offset = _aligned(self.records_offset + RECORDS * 3 * 8)
        self.offsets = {}
        for name, (dtype, shape) in fields.items():
            self.offsets[name] = offset
            offset = _aligned(offset + capacity * int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize)
        self.episodes_offset = offset
        self.error_offset = _aligned(offset + episode_capacity * 2 * 8)
        self.size = self.error_offset + ERROR_CAPACITY


class ActorChannel(_Block):
    """One actor's ring. Created by the learner (`create`), attached by the actor process (or its
    replacement after a crash) from `spec()`."""

    def __init__(self, memory: SharedMemory, layout: _Layout, owner: bool = False):
        super().__init__(memory, owner)
        self.layout = layout
        raw = self.raw
        self.counters = raw[:_COUNTERS * LINE].view(np.int64)[::_WORDS]
        self.records = raw[layout.records_offset:].view(np.int64)[:RECORDS * 3].reshape(RECORDS, 3)
        self.fields = {name: raw[layout.offsets[name]:].view(np.dtype(dtype))[:layout.capacity * int(np.prod(shape, dtype=np.int64))]
                       .reshape((layout.capacity, *shape))
                       for name, (dtype, shape) in layout.fields.items()}
        self.episodes = raw[layout.episodes_offset:].view(np.float64)[:2 * layout.episode_capacity].reshape(-1, 2)
        self._error = raw[layout.error_offset:layout.error_offset + ERROR_CAPACITY]
        self._totals = self.totals()  # the actor's running totals (its side only)
        self._rounds = int(self.counters[ROUNDS])  # the actor's own commit count (it is the one writer)
        self._rings = tuple(self.fields.values())
        self._column_bases = np.array([layout.offsets[name] for name in layout.fields], dtype=np.int64)
        self._row_bytes = np.array([ring[0].nbytes for ring in self._rings], dtype=np.int64)
        # what the actor last read of the learner's CONSUMED and EPISODES_READ: both only grow, so
        # a stale value under-counts the free room; re-read (a load of a line the learner's core
        # wrote: a cache miss) only when the stale value says there is not enough
        self._consumed = self._episodes_read = 0
        # the learner's side: its own CONSUMED and EPISODES_READ (it is their one writer)
        self._taken, self._episodes_taken = int(self.counters[CONSUMED]), int(self.counters[EPISODES_READ])

    @classmethod
    def create(cls, fields: dict[str, tuple[np.dtype, tuple]], capacity: int,
               episode_capacity: int = 4096) -> ActorChannel:
        """`fields`: name -> (dtype, shape of one transition's value), in the replay's add() order."""
        layout = _Layout(fields, capacity, episode_capacity)
        return cls(_create(layout.size), layout, owner=True)

    def spec(self) -> tuple:
        """What another process needs to attach (picklable)."""
        return self.memory.name, self.layout

    @classmethod
    def attach(cls, name: str, layout: _Layout) -> ActorChannel:
        return cls(_attach(name), layout)

    def totals(self) -> tuple[int, int, int]:
        """(transitions, episodes, env steps) committed by the last complete round."""
        rounds = int(self.counters[ROUNDS])
        if not rounds:
            return 0, 0, 0
        committed, episodes, steps = self.records[(rounds - 1) % RECORDS].tolist()
        return committed, episodes, steps

    # -- the actor's side -------------------------------------------------------------------------
    @property
    def rounds(self) -> int:
        """Act rounds this actor has committed."""
        return self._rounds

    @property
    def steps(self) -> int:
        """Env steps this actor has committed."""
        return self._totals[2]

    def free(self) -> int:
        return self.layout.capacity - (self._totals[0] - int(self.counters[CONSUMED]))

    def episode_free(self) -> int:
        return self.layout.episode_capacity - (self._totals[1] - int(self.counters[EPISODES_READ]))

    def has_room(self, transitions: int, episodes: int) -> bool:
        """Whether a round of up to `transitions` transitions and `episodes` episodes fits: from
        what the actor last read of the learner's counters, re-read only if that is not enough."""
        committed, written, _ = self._totals
        layout = self.layout
        if (layout.capacity - (committed - self._consumed) >= transitions
                and layout.episode_capacity - (written - self._episodes_read) >= episodes):
            return True
        self._consumed, self._episodes_read = int(self.counters[CONSUMED]), int(self.counters[EPISODES_READ])
        return (layout.capacity - (committed - self._consumed) >= transitions
                and layout.episode_capacity - (written - self._episodes_read) >= episodes)

    def put(self, transitions, finished: list[tuple[float, int]], env_steps: int) -> None:
        """Writes and commits one act round: its transitions (arrays in field order, or None), the
        episodes it finished and the env steps it took. The caller checked `free()` and
        `episode_free()`."""
        committed, episodes, steps = self._totals
        if transitions is not None:
            count = len(transitions[0])
            capacity = self.layout.capacity
            first = committed % capacity
            if first + count <= capacity:  # (a round is a few rows: one per env, a few copies each)
                end = first + count
                for ring, values in zip(self._rings, transitions):
                    ring[first:end] = values
            else:  # wraps around the ring's end
                split = capacity - first
                for ring, values in zip(self._rings, transitions):
                    ring[first:] = values[:split]
                    ring[:count - split] = values[split:]
            committed += count
        for episode_return, length in finished:
            self.episodes[episodes % self.layout.episode_capacity] = episode_return, length
            episodes += 1
        steps += env_steps
        self._totals = committed, episodes, steps
        record = self.records[self._rounds % RECORDS]
        record[0], record[1], record[2] = committed, episodes, steps
        self._rounds += 1
        self.counters[ROUNDS] = self._rounds  # the commit

    def report_error(self, text: str) -> None:
        """What an actor leaves for the learner before it exits on an exception (the tail of `text`
        if it is long: a traceback ends with the error)."""
        data = text.encode()[-ERROR_CAPACITY:]
        self._error[:len(data)] = np.frombuffer(data, dtype=np.uint8)
        self.counters[ERROR_BYTES] = len(data)

    def error(self) -> str | None:
        length = int(self.counters[ERROR_BYTES])
        return self._error[:length].tobytes().decode(errors="replace") if length else None

    # -- the learner's side -----------------------------------------------------------------------
    def take(self, rounds: int | None = None) -> tuple[int, list[tuple], list[tuple[float, int]]]:
        """(env steps committed so far, the new transitions as up to two runs of field arrays, the new
        episodes); with `rounds`, only up to the end of the actor's round `rounds` (committed, at
        most RECORDS - 1 rounds back). The arrays are views of the ring: consume them before
        calling `release`."""
        steps, spans, episodes = self.take_spans(rounds)
        rings = self._rings
        return steps, [tuple([ring[first:first + count] for ring in rings]) for first, count in spans], episodes

    def take_spans(self, rounds: int | None = None) -> tuple[int, list[tuple[int, int]], list[tuple[float, int]]]:
        """`take` with each run of new transitions as (its first ring row, its row count): for
        `column_offsets`, without a view per field."""
        if rounds is None:
            committed, written, steps = self.totals()
        else:
            committed, written, steps = self.records[(rounds - 1) % RECORDS].tolist() if rounds else (0, 0, 0)
        consumed = self._taken
        spans = []
        if committed > consumed:
            capacity = self.layout.capacity
            first, count = consumed % capacity, committed - consumed
            split = min(count, capacity - first)
            spans.append((first, split))
            if split < count:
                spans.append((0, count - split))
        episodes = []
        if written > self._episodes_taken:
            for k in range(self._episodes_taken, written):
                episode_return, length = self.episodes[k % self.layout.episode_capacity].tolist()
                episodes.append((episode_return, int(length)))
            self.counters[EPISODES_READ] = self._episodes_taken = written
        self._taken = committed
        return steps, spans, episodes

    def column_offsets(self, first: int) -> np.ndarray:
        """The byte offset in `raw` of ring row `first` of each field (layout order): with `raw`, a
        run of rows as Replay.add_frame reads them."""
        return self._column_bases + first * self._row_bytes

    def release(self) -> None:
        """Hands the slots of the last `take` back to the actor."""
        self.counters[CONSUMED] = self._taken


class WeightBoard(_Block):
    """The learner's latest policy weights and epsilon for every actor, under a sequence lock: the
    version is odd while the learner writes, and a reader keeps a copy only if it saw the same even
    version before and after copying."""

    def __init__(self, memory: SharedMemory, n_weights: int, owner: bool = False):
        super().__init__(memory, owner)
        self.n_weights = n_weights
        raw = self.raw
        self._version = raw[:8].view(np.int64)
        self._epsilon = raw[LINE:LINE + 8].view(np.float64)
        self._weights = raw[2 * LINE:2 * LINE + 4 * n_weights].view(np.float32)

    @classmethod
    def create(cls, n_weights: int) -> WeightBoard:
        return cls(_create(2 * LINE + 4 * n_weights), n_weights, owner=True)

    def spec(self) -> tuple:
        return self.memory.name, self.n_weights

    @classmethod
    def attach(cls, name: str, n_weights: int) -> WeightBoard:
        return cls(_attach(name), n_weights)

    def view(self) -> WeightBoard:
        """Another view of the mapped block, as an attach makes it (a forked actor's; never its owner)."""
        return WeightBoard(self.memory, self.n_weights)

    def publish(self, weights: np.ndarray) -> None:
        """The learner's side: whole lines by non-temporal stores (kernels/cpu/stream_store.py)."""
        if weights.dtype != np.float32 or not weights.flags.c_contiguous:
            weights = np.ascontiguousarray(weights, dtype=np.float32)
        publish_streamed(self._version, self._weights, weights)

    @property
    def epsilon(self) -> float:
        return float(self._epsilon[0])

    @epsilon.setter
    def epsilon(self, value: float) -> None:
        self._epsilon[0] = value

    @property
    def version(self) -> int:
        return int(self._version[0])

    def read(self, out: np.ndarray, seen: int) -> int:
        """Copies the weights into `out` if a version newer than `seen` is complete; returns the
        version `out` now holds (`seen` if nothing new or the learner was mid-write)."""
        version = int(self._version[0])
        if version == seen or version & 1:
            return seen
        out[:] = self._weights
        return version if int(self._version[0]) == version else seen

    def read_latest(self, out: np.ndarray, seen: int, alive) -> int | None:
        """`read` that copies again when the learner wrote meanwhile, until a copy is complete: `out`
        may be the weights a policy acts with (no second copy), never left half-written while the
        learner lives. None if the learner stays mid-write and `alive()` (asked every 1000 waits)
        says it is gone (killed while it published): `out` may then be half-written."""
        waits = 0
        while True:
            version = int(self._version[0])
            if version == seen:
                return seen
            if version & 1:  # mid-write: the learner's copy takes a few microseconds
                waits += 1
                if waits % 1000 == 0 and not alive():
                    return None
                os.sched_yield()
                continue
            out[:] = self._weights
            if int(self._version[0]) == version:
                return version


class VersionBoard(_Block):
    """A deterministic run's board (Plan.deterministic_lag): numbered weight versions in `slots`
    slots, each under its own sequence word (`publish_numbered`: 2 x version + 2 once the slot holds
    that version; a new block's zeros hold none), and for each global act round g, in row g % `rounds` of a table the learner fills
    ahead of the actors, the epsilon that round acts with and the version and slot of its weights.
    The learner reuses a slot only after every actor is past the rounds that read it (the runtime
    sizes `slots` for that); an actor finding its version overwritten raises."""

    def __init__(self, memory: SharedMemory, n_weights: int, slots: int, rounds: int, actors: int,
                 owner: bool = False):
        super().__init__(memory, owner)
        self.n_weights, self.slots, self.rounds, self.actors = n_weights, slots, rounds, actors
        raw = self.raw
        self._sequences = raw[:slots * LINE].view(np.int64)[::_WORDS]
        row = _aligned(4 * n_weights) // 4
        offset = slots * LINE
        self._weights = raw[offset:offset + slots * row * 4].view(np.float32).reshape(slots, row)[:, :n_weights]
        offset += slots * row * 4
        self._epsilons = raw[offset:offset + 8 * rounds].view(np.float64)
        self._versions = raw[offset + 8 * rounds:offset + 16 * rounds].view(np.int64)
        self._slot_of = raw[offset + 16 * rounds:offset + 24 * rounds].view(np.int64)

    @staticmethod
    def _size(n_weights: int, slots: int, rounds: int) -> int:
        return slots * LINE + slots * _aligned(4 * n_weights) + 24 * rounds

    @classmethod
    def create(cls, n_weights: int, slots: int, rounds: int, actors: int) -> VersionBoard:
        """`actors`: the run's actor count (actor g % actors acts global round g)."""
        return cls(_create(cls._size(n_weights, slots, rounds)), n_weights, slots, rounds, actors, owner=True)

    def spec(self) -> tuple:
        return self.memory.name, self.n_weights, self.slots, self.rounds, self.actors

    @classmethod
    def attach(cls, name: str, n_weights: int, slots: int, rounds: int, actors: int) -> VersionBoard:
        return cls(_attach(name), n_weights, slots, rounds, actors)

    def view(self) -> VersionBoard:
        """Another view of the mapped block, as an attach makes it (a forked actor's; never its owner)."""
        return VersionBoard(self.memory, self.n_weights, self.slots, self.rounds, self.actors)

    # -- the learner's side -----------------------------------------------------------------------
    def publish(self, slot: int, version: int, weights: np.ndarray) -> None:
        if weights.dtype != np.float32 or not weights.flags.c_contiguous:
            weights = np.ascontiguousarray(weights, dtype=np.float32)
        publish_numbered(self._sequences[slot:slot + 1], self._weights[slot], weights, version)

    def set_rounds(self, first: int, epsilons: list, versions: list, slots: list) -> None:
        """What global act rounds first, first + 1, ... act with (written before any actor may
        reach them; fewer than `rounds` of them)."""
        count = len(epsilons)
        row = first % self.rounds
        split = min(count, self.rounds - row)
        for table, values in ((self._epsilons, epsilons), (self._versions, versions), (self._slot_of, slots)):
            table[row:row + split] = values[:split]
            table[:count - split] = values[split:]

    # -- an actor's side --------------------------------------------------------------------------
    def round(self, round_index: int) -> tuple[float, int, int]:
        """(epsilon, weights version, its slot) of global act round `round_index`."""
        row = round_index % self.rounds
        return float(self._epsilons[row]), int(self._versions[row]), int(self._slot_of[row])

    def try_read(self, out: np.ndarray, version: int, slot: int) -> bool:
        """Copies version `version` from `slot` into `out` if the slot holds it complete; False if the
        learner has not published it yet (or is writing it)."""
        complete = 2 * version + 2
        sequence = int(self._sequences[slot])
        if sequence < complete:
            return False
        if sequence == complete:
            out[:] = self._weights[slot]
            if int(self._sequences[slot]) == complete:
                return True
        raise RuntimeError(f"weights version {version} was overwritten in slot {slot} before this actor "
                           f"read it (the deterministic board has too few slots)")
