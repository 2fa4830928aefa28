"""Frame-deduplicated transition storage for stacked-frame observations: the compiled (numba)
write and gather kernels of pearl/replay/frames.py (its module doc has the layout and the rules).

A table holds `streams` rings of `length` records each; stream s's record number T (counted from
its first) sits in slot s * length + T % length. A record is one frame (the newest of an
observation's stack) and what followed it: the action, the reward, `ends` (CONTINUES,
TERMINATED or TRUNCATED after this step, or FINAL: an episode's last observation, with no action)
and `back`, how many of the frames before it belong to its episode (at most stack - 1). A
transition is named by the slot of its first record.

- `write_steps(...)`: appends one env step per row (the record of its next observation, FINAL
  where the episode ended; before it the episode's first observation where one begins), keeps
  `valid` (the transitions that may be sampled) and lists the slots whose validity changed,
  each once; `write_steps_selected(...)` also writes their priorities into the compiled sum tree.
- `gather_transitions(...)`: assembles obs and next obs stacks, actions, n-step returns and
  discounts of a batch of transitions, one frame copy at a time; `gather_windows(...)` the same
  for 1-step transitions as one window of stack + 1 frames each, of which obs and next obs are
  overlapping views (5 frames copied for Atari's stack of 4 instead of 8).
- `sample_windows(...)`: a prioritized 1-step batch as one call: the compiled sum tree's
  stratified draw (kernels/cpu/fast_sumtree.py), the importance weights and `gather_windows`.
  Measured at capacity 1M the gather is ~3/4 of a prioritized sample + update of 32, the draw
  ~6 us, and the rest the Python between three compiled calls; one call drops two dispatches and
  that glue (docs/BENCHMARKS.md, Pixel replay, session 14). `draw_uniform(...)` draws a uniform
  batch by rejection over the stored records (the tree only for the few rejected), and
  `sample_uniform_windows(...)` is it and `gather_windows` in one call.
- `FrameRecords`: a table's arrays and sizes, and its compiled sum tree's, as one argument of the
  entry points `insert_steps`, `sample_uniform` and `sample_prioritized` (the three calls of an
  env step and of a 1-step sample): numba unboxes every array argument of a call, and the 32 of
  an insert's dispatch took ~2 us of its ~10 (docs/BENCHMARKS.md Pixel replay, session 39).
- `threads=2` in the gathers (replay.gather_threads): a batch of TWO_THREADS_FROM or more is copied
  in two halves on numba's thread pool, bit-identical to one thread; ~0.55x the time when the
  second core is idle, far slower when it is busy (docs/ARCHITECTURE.md, the frame table).
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange, types
from numba.experimental import structref

from pearl.kernels.cpu.fast_storage import (LINE, STREAM_BYTES, _store_fence, _stream_row, _word_copy,
                                            importance_weights)
from pearl.kernels.cpu.fast_sumtree import _find, _sample as _tree_sample, _write as _tree_write

_NJIT = dict(cache=True, nogil=True)
CONTINUES, TERMINATED, TRUNCATED, FINAL = 0, 1, 2, 3
TWO_THREADS_FROM = 8  # the smallest batch gathered on 2 threads when asked (measured)
# windows copied a cache line of each in turn: one core keeps more of its reads in flight over
# several streams than over one. 8 at a time (~10% faster on one thread than 4, 3-8% on two, on the
# Zen 4 of session 54; on the Zen 3 of session 37 8 were slower, in a one-pass form; 16: slower on
# both; docs/BENCHMARKS.md Pixel replay): `_copy_eight_runs`, its streams' offsets held in registers.
# A line is copied as two 32-byte halves, not one 64-byte vector: an Atari frame's rows (7,056
# bytes) are 16-byte aligned, so most 64-byte loads straddle two lines, and on the Intel Xeon of
# session 56 (AVX-512) those split loads made the gather of 256 windows 9% slower; g++'s memcpy of
# a line (the bare copy's) is two 32-byte halves too
_copy_half_line = _word_copy(LINE // 2)


@njit(inline="always")
def _copy_line(dst, dst_at, src, src_at):
    """dst.flat[dst_at:dst_at + LINE] = src.flat[src_at:src_at + LINE] (uint8, C-contiguous)."""
    _copy_half_line(dst, dst_at, src, src_at)
    _copy_half_line(dst, dst_at + LINE // 2, src, src_at + LINE // 2)


# frames of this many bytes or more are written by non-temporal stores: a big table's next slot is
# long out of the caches, and an ordinary store reads each of its lines from memory first (an
# Atari frame's write 1.33 -> 0.92 us a call, measured: docs/BENCHMARKS.md Pixel replay, session 39)
STREAM_FRAMES_FROM = 4096


@njit(inline="always")
def _streams_frames(frames):
    """Whether frames' rows are written by non-temporal stores: large rows, each STREAM_BYTES-aligned."""
    width = frames.shape[1]
    return width >= STREAM_FRAMES_FROM and width % STREAM_BYTES == 0 and frames.ctypes.data % STREAM_BYTES == 0


@njit(inline="always")
def _copy(dst, src):
    """dst[:] = src for 1-d arrays (frames' bytes, actions), as a loop LLVM vectorizes: numba's slice assignment
    copies a 7 KB frame byte by byte, 6x slower (measured)."""
    for k in range(dst.shape[0]):
        dst[k] = src[k]


@njit(inline="always")
def _note(slot, changed, count, marks, stamp):
    """Adds `slot` to changed[:count] unless this call listed it already."""
    if marks[slot] != stamp:
        marks[slot] = stamp
        changed[count] = slot
        count += 1
    return count


@njit(inline="always")
def _set_valid(slot, value, valid, state, changed, count, marks, stamp):
    if valid[slot] != value:
        valid[slot] = value
        state[0] += 1 if value else -1
        count = _note(slot, changed, count, marks, stamp)
    return count


@njit(inline="always")
def _write_record(s, frame, end, first, frames, ends, back, valid, counts, episode_start, state, length,
                  stack, n, changed, count, marks, stamp):
    """Appends a record of `frame` to stream s: CONTINUES (its action and reward follow with the
    next step) or FINAL."""
    t = counts[s]
    base = s * length
    slot = base + t % length
    if t >= length:
        # record t - length leaves with its frame, and so does every transition that reads it:
        # transition u = t - length + j stacks back[u] frames before its own
        old = t - length
        for j in range(stack):
            u = old + j
            if u >= t:
                break
            g = base + u % length
            if back[g] >= j:
                count = _set_valid(g, 0, valid, state, changed, count, marks, stamp)
    if _streams_frames(frames):
        _stream_row(frames[slot], frame)
    else:
        _copy(frames[slot], frame)
    ends[slot] = end
    if first:
        episode_start[s] = t
    back[slot] = min(stack - 1, t - episode_start[s])
    counts[s] = t + 1
    if first:
        return count
    # the transitions this record completes: u's next observation is record u + n, or the
    # episode's FINAL record if the episode ends sooner
    start, oldest = episode_start[s], t + 1 - length
    lo, hi = t - n, t - n + 1
    if end == FINAL:
        lo, hi = t - n, t
    for u in range(max(lo, start), hi):
        g = base + u % length
        if u - back[g] >= oldest:  # every frame it reads is still stored
            count = _set_valid(g, 1, valid, state, changed, count, marks, stamp)
    return count


@njit(**_NJIT)
def write_steps(frames, actions, rewards, ends, back, valid, counts, episode_start, starting, state,
                marks, length, stack, n, streams, obs_frames, step_actions, step_rewards, next_frames,
                terminated, truncated, changed, priority, priorities):
    """Appends one step per row i to stream streams[i] (written ~s: the step begins an episode
    on stream s, whatever its previous step was): if the stream begins an episode (it is new,
    its previous step ended one, or the row says so), the first record, of obs_frames[i] (read only then);
    the step's action, reward and end on the stream's newest record; then the record of
    next_frames[i], FINAL if the step terminated or truncated the episode. Frames are rows of
    bytes, actions rows of the action field. `state[0]` counts the valid transitions, `state[1]`
    is the stamp that lists a slot once in `changed`; priorities[c] is the selector's new
    priority of slot changed[c]: `priority` if it became valid, else 0. Returns how many slots of
    `changed` it filled, or -(i + 1) for the first row whose stream is out of range (nothing
    written)."""
    for i in range(streams.shape[0]):
        s = streams[i] if streams[i] >= 0 else ~streams[i]
        if s >= counts.shape[0]:
            return -(i + 1)
    state[1] += 1
    stamp = state[1]
    count = 0
    for i in range(streams.shape[0]):
        s = streams[i]
        if s < 0:  # a new writer's first step on the stream: an episode begins whatever came before
            s = ~s
            starting[s] = True
        if starting[s]:
            count = _write_record(s, obs_frames[i], CONTINUES, True, frames, ends, back, valid, counts,
                                  episode_start, state, length, stack, n, changed, count, marks, stamp)
        end = TERMINATED if terminated[i] else TRUNCATED if truncated[i] else CONTINUES
        newest = s * length + (counts[s] - 1) % length
        _copy(actions[newest], step_actions[i])
        rewards[newest] = step_rewards[i]
        ends[newest] = end
        count = _write_record(s, next_frames[i], CONTINUES if end == CONTINUES else FINAL, False, frames,
                              ends, back, valid, counts, episode_start, state, length, stack, n, changed,
                              count, marks, stamp)
        starting[s] = end != CONTINUES
    for c in range(count):
        priorities[c] = priority if valid[changed[c]] else 0.0
    if _streams_frames(frames):
        _store_fence()
    return count


@njit(**_NJIT)
def write_steps_selected(frames, actions, rewards, ends, back, valid, counts, episode_start, starting, state,
                         marks, length, stack, n, streams, obs_frames, step_actions, step_rewards, next_frames,
                         terminated, truncated, changed, priority, priorities, sums, prefix, mins, offsets,
                         depth, k, tree_marks, nodes):
    """write_steps, then the changed slots' new priorities written into the compiled sum tree
    (sums .. k: NumbaSumTree's arrays, tree_marks and nodes its scratch, nodes as long as
    `changed`): an env step's insert as one call, not two (a dispatch of ~30 arguments and the
    Python between them are most of an insert's ~10 us, docs/BENCHMARKS.md Pixel replay)."""
    count = write_steps(frames, actions, rewards, ends, back, valid, counts, episode_start, starting, state,
                        marks, length, stack, n, streams, obs_frames, step_actions, step_rewards, next_frames,
                        terminated, truncated, changed, priority, priorities)
    if count > 0:
        ordered = True
        for c in range(1, count):
            if changed[c] < changed[c - 1]:
                ordered = False
                break
        _tree_write(sums, prefix, mins, offsets, depth, k, changed[:count], ordered, priorities[:count],
                    tree_marks, nodes)
    return count


@njit(inline="always")
def _stack(frames, base, pos, back_of, length, stack, out):
    """out[f] = the frame f - (stack - 1) records before record `pos` of the ring at `base`,
    the episode's first frame repeated where the stack reaches before it (gymnasium's
    FrameStackObservation with padding_type="reset")."""
    for f in range(stack):
        d = min(stack - 1 - f, back_of)
        p = pos - d
        if p < 0:
            p += length
        _copy(out[f], frames[base + p])


@njit(**_NJIT)
def any_left(valid, indices) -> bool:
    """Whether a slot of `indices` holds no transition now (valid 0): a priority update of a batch
    whose records were overwritten since it was drawn (0.5-0.8 us here; numpy's gather, compare and
    any 2.5-4.3 us, docs/BENCHMARKS.md Pixel replay, session 32)."""
    for i in range(indices.shape[0]):
        if valid[indices[i]] == 0:
            return True
    return False


@njit(inline="always")
def _first_out_of_range(indices, capacity):
    for i in range(indices.shape[0]):
        if indices[i] < 0 or indices[i] >= capacity:
            return i
    return -1


@njit(**_NJIT)
def _transitions_range(frames, actions, rewards, ends, back, length, stack, n, powers, indices, obs_out, next_out,
                       actions_out, returns_out, discounts_out, lo, hi):
    """gather_transitions of positions lo .. hi - 1: a function of its own, not inlined, so that
    the 2-thread kernel's parallel compile does not reach its copy loops (numba's parallel=True
    compile of them left the byte loop unvectorized: 8x slower, docs/BENCHMARKS.md session 9)."""
    for i in range(lo, hi):
        g = indices[i]
        s = g // length
        base = s * length
        pos = g - base
        _stack(frames, base, pos, back[g], length, stack, obs_out[i])
        total = 0.0
        k = n
        discount = powers[n]
        for j in range(n):
            p = pos + j
            if p >= length:
                p -= length
            total += powers[j] * rewards[base + p]
            end = ends[base + p]
            if end == TERMINATED or end == TRUNCATED:
                k = j + 1
                discount = 0.0 if end == TERMINATED else powers[k]
                break
        returns_out[i] = total
        discounts_out[i] = discount
        v = pos + k
        if v >= length:
            v -= length
        _stack(frames, base, v, back[base + v], length, stack, next_out[i])
        _copy(actions_out[i], actions[g])


@njit(inline="always")
def _copy_bytes(dst, dst_at, src, src_at, count):
    """dst.flat[dst_at:dst_at + count] = src.flat[src_at:src_at + count] (uint8, C-contiguous)."""
    tail = count - count % LINE
    for o in range(0, tail, LINE):
        _copy_line(dst, dst_at + o, src, src_at + o)
    for o in range(tail, count):
        dst[dst_at + o] = src[src_at + o]


@njit(inline="always")
def _copy_eight_runs(out, rows, table, sources, count):
    """out.flat[rows[K]:rows[K] + count] = table.flat[sources[K]:sources[K] + count] for K = 0..7,
    a line of each in turn (rows, sources: 8 offsets each)."""
    d0, d1, d2, d3, d4, d5, d6, d7 = rows[0], rows[1], rows[2], rows[3], rows[4], rows[5], rows[6], rows[7]
    s0, s1, s2, s3 = sources[0], sources[1], sources[2], sources[3]
    s4, s5, s6, s7 = sources[4], sources[5], sources[6], sources[7]
    tail = count - count % LINE
    for o in range(0, tail, LINE):
        _copy_line(out, d0 + o, table, s0 + o)
        _copy_line(out, d1 + o, table, s1 + o)
        _copy_line(out, d2 + o, table, s2 + o)
        _copy_line(out, d3 + o, table, s3 + o)
        _copy_line(out, d4 + o, table, s4 + o)
        _copy_line(out, d5 + o, table, s5 + o)
        _copy_line(out, d6 + o, table, s6 + o)
        _copy_line(out, d7 + o, table, s7 + o)
    for w in range(8):
        for o in range(tail, count):
            out[rows[w] + o] = table[sources[w] + o]


@njit(**_NJIT)
def _windows_range(frames, actions, rewards, ends, back, length, stack, powers, indices, windows_out, actions_out,
                   returns_out, discounts_out, lo, hi):
    """gather_windows of positions lo .. hi - 1 (not inlined: see _transitions_range). A window
    whose stack + 1 records are stored one after another (all but those reaching before their
    episode's first frame or across the ring's end) is one run of bytes. A first pass writes the
    small outputs, copies the other windows frame by frame and lists the runs; a second copies the
    runs 8 at a time, a line of each in turn, a last group of 4-7 padded to 8 and 1-3 left over one
    by one (lists first, copies after: ~12% faster than copying each group as soon as it fills,
    measured)."""
    width = frames.shape[1]
    span = (stack + 1) * width
    table, out = frames.reshape(-1), windows_out.reshape(-1)
    run_from, run_row = np.empty(hi - lo + 7, np.int64), np.empty(hi - lo + 7, np.int64)  # (+7: padding)
    runs = 0
    for i in range(lo, hi):
        g = indices[i]
        base = (g // length) * length
        pos = g - base
        returns_out[i] = rewards[g]
        discounts_out[i] = 0.0 if ends[g] == TERMINATED else powers[1]
        _copy(actions_out[i], actions[g])
        b = np.int64(back[g])
        if b >= stack - 1 and stack - 1 <= pos < length - 1:
            run_from[runs], run_row[runs] = (g - (stack - 1)) * width, i * span
            runs += 1
            continue
        for f in range(stack + 1):
            p = pos + max(f - (stack - 1), -b)
            if p < 0:
                p += length
            elif p >= length:
                p -= length
            _copy_bytes(out, i * span + f * width, table, (base + p) * width, width)
    last = runs - runs % 8
    for r in range(0, last, 8):
        _copy_eight_runs(out, run_row[r:r + 8], table, run_from[r:r + 8], span)
    if runs - last >= 4:  # padded to 8 with its last run again: the same bytes, the repeats read from L1
        for r in range(runs, last + 8):
            run_row[r], run_from[r] = run_row[runs - 1], run_from[runs - 1]
        _copy_eight_runs(out, run_row[last:last + 8], table, run_from[last:last + 8], span)
    else:  # (1-3 runs padded to 8: up to 2 us slower on a batch of 1, measured)
        for r in range(last, runs):
            _copy_bytes(out, run_row[r], table, run_from[r], span)


@njit(parallel=True, **_NJIT)
def _transitions_halves(frames, actions, rewards, ends, back, length, stack, n, powers, indices, obs_out, next_out,
                        actions_out, returns_out, discounts_out):
    """_transitions_range over the batch's two halves, one per thread of numba's pool."""
    half = (indices.shape[0] + 1) // 2
    for h in prange(2):
        _transitions_range(frames, actions, rewards, ends, back, length, stack, n, powers, indices, obs_out,
                           next_out, actions_out, returns_out, discounts_out, h * half,
                           min(indices.shape[0], (h + 1) * half))


@njit(parallel=True, **_NJIT)
def _windows_halves(frames, actions, rewards, ends, back, length, stack, powers, indices, windows_out, actions_out,
                    returns_out, discounts_out):
    """_windows_range over the batch's two halves, one per thread of numba's pool."""
    half = (indices.shape[0] + 1) // 2
    for h in prange(2):
        _windows_range(frames, actions, rewards, ends, back, length, stack, powers, indices, windows_out,
                       actions_out, returns_out, discounts_out, h * half, min(indices.shape[0], (h + 1) * half))


@njit(inline="always")
def _split(threads, batch):
    """Whether a batch is gathered on 2 threads: asked for, and big enough to repay the pool's
    hand-off (TWO_THREADS_FROM, measured)."""
    return threads > 1 and batch >= TWO_THREADS_FROM


@njit(**_NJIT)
def gather_transitions(frames, actions, rewards, ends, back, length, stack, n, powers, indices,
                       obs_out, next_out, actions_out, returns_out, discounts_out, threads=1):
    """For each transition indices[i] (the slot of its first record u): obs_out[i] = the stack
    ending at u, returns_out[i] = sum_{j<k} powers[j] r_{u+j} and next_out[i] = the stack ending
    at u + k, with k = n or the number of steps to the episode's end if that comes first;
    discounts_out[i] = 0 if the episode terminated within them, else powers[k]. `threads` 2
    copies the two halves of the batch on two threads (bit-identical: each output row is
    written by one thread). Returns the first position whose index is out of range, or -1."""
    bad = _first_out_of_range(indices, frames.shape[0])
    if bad >= 0:
        return bad
    if _split(threads, indices.shape[0]):
        _transitions_halves(frames, actions, rewards, ends, back, length, stack, n, powers, indices, obs_out,
                            next_out, actions_out, returns_out, discounts_out)
    else:
        _transitions_range(frames, actions, rewards, ends, back, length, stack, n, powers, indices, obs_out,
                           next_out, actions_out, returns_out, discounts_out, 0, indices.shape[0])
    return -1


@njit(**_NJIT)
def gather_windows(frames, actions, rewards, ends, back, length, stack, powers, indices, windows_out,
                   actions_out, returns_out, discounts_out, threads=1):
    """gather_transitions for 1-step transitions, both stacks in one window per transition:
    windows_out[i] = the frames of records u - stack + 1 .. u + 1 (the episode's first repeated
    before it), so obs = windows_out[:, :stack] and next obs = windows_out[:, 1:] (stack + 1
    frames copied instead of 2 x stack; the next record is in u's episode, so both stacks clamp
    at the same first frame). `threads` as gather_transitions'. Returns the first position whose
    index is out of range, or -1."""
    bad = _first_out_of_range(indices, frames.shape[0])
    if bad >= 0:
        return bad
    if _split(threads, indices.shape[0]):
        _windows_halves(frames, actions, rewards, ends, back, length, stack, powers, indices, windows_out,
                        actions_out, returns_out, discounts_out)
    else:
        _windows_range(frames, actions, rewards, ends, back, length, stack, powers, indices, windows_out,
                       actions_out, returns_out, discounts_out, 0, indices.shape[0])
    return -1


@njit(**_NJIT)
def draw_uniform(sums, prefix, offsets, depth, k, uniforms, mass, valid, counts, length, indices):
    """indices[i] uniform over the valid transitions, each drawn on its own (with replacement, as
    the flat uniform table's rows are): uniforms[i] picks a slot uniformly among the stored
    records, kept if it holds a valid transition; else uniforms[B + i] walks the 0/1 sum tree
    (sums .. k: NumbaSumTree's arrays; `mass` a float64 scratch as long as the batch). With V of
    F stored records valid, P(slot) = 1/F + (1 - V/F) / V = 1/V: exact. A full table's records
    are nearly all valid (all but each stream's newest n and the episodes' last), so the tree is
    rarely walked: a draw of 32 called from Python took 2.2-2.4 us against the tree's 4.1-4.5
    (100k, 1M; docs/BENCHMARKS.md Pixel replay, session 38). `uniforms` holds 2B. Returns False, drawing nothing, when no transition is valid."""
    total = sums[0]
    if not total > 0:
        return False
    b = indices.shape[0]
    stored = np.int64(0)
    for s in range(counts.shape[0]):
        stored += min(counts[s], length)
    missed = 0
    for i in range(b):
        r = min(np.int64(uniforms[i] * stored), stored - 1)  # (a u near 1 may round up to `stored`)
        s = 0
        while r >= min(counts[s], length):
            r -= min(counts[s], length)
            s += 1
        slot = s * length + r
        if valid[slot]:
            indices[i] = slot
        else:
            indices[i] = -1
            mass[missed] = uniforms[b + i] * total
            missed += 1
    if missed:
        drawn = np.empty(missed, np.int64)
        _find(sums, prefix, offsets, depth, k, mass[:missed], drawn)
        j = 0
        for i in range(b):
            if indices[i] < 0:
                indices[i] = drawn[j]
                j += 1
    return True


@njit(**_NJIT)
def sample_uniform_windows(sums, prefix, offsets, depth, k, uniforms, mass, valid, counts, frames, actions, rewards,
                           ends, back, length, stack, powers, indices, windows_out, actions_out, returns_out,
                           discounts_out, threads=1):
    """draw_uniform, then gather_windows of the drawn transitions: a uniform 1-step batch as one
    call. Returns False, sampling nothing, when no transition is valid."""
    if not draw_uniform(sums, prefix, offsets, depth, k, uniforms, mass, valid, counts, length, indices):
        return False
    gather_windows(frames, actions, rewards, ends, back, length, stack, powers, indices, windows_out, actions_out,
                   returns_out, discounts_out, threads)
    return True


@njit(**_NJIT)
def sample_windows(sums, prefix, mins, offsets, depth, k, uniforms, mass, size, beta, frames, actions, rewards, ends,
                   back, length, stack, powers, indices, priorities, weights, windows_out, actions_out, returns_out,
                   discounts_out, threads=1):
    """A prioritized 1-step batch as one call: a stratified draw of uniforms.shape[0] transitions
    from the tree (sums, prefix, mins, offsets, depth, k: NumbaSumTree's arrays; `mass` a float64
    scratch as long as the batch) into indices and priorities, their importance weights into
    `weights` ((p_i / p_min)^-beta, fast_storage.importance_weights with `size` valid
    transitions), then gather_windows of them. Returns False, sampling nothing, when the tree has
    no mass."""
    if not sums[0] > 0:
        return False
    _tree_sample(sums, prefix, offsets, depth, k, uniforms, mass, indices, priorities)
    importance_weights(priorities, sums[0], mins[0], size, beta, weights, mass)
    gather_windows(frames, actions, rewards, ends, back, length, stack, powers, indices, windows_out, actions_out,
                   returns_out, discounts_out, threads)
    return True


@structref.register
class FrameRecordsType(types.StructRef):
    def preprocess_fields(self, fields):
        return tuple((name, types.unliteral(typ)) for name, typ in fields)


class FrameRecords(structref.StructRefProxy):
    """A frame table's records (frames .. marks), sizes (length, stack, n), n-step discount
    powers and its compiled sum tree's arrays (sums .. k, tree_marks: NumbaSumTree's; empty
    arrays for a table whose selector is another backend's), held by reference: the kernels
    write the table's own arrays."""


FRAME_RECORD_FIELDS = ("frames", "actions", "rewards", "ends", "back", "valid", "counts", "episode_start", "starting",
                       "state", "marks", "length", "stack", "n", "powers", "sums", "prefix", "mins", "offsets",
                       "depth", "k", "tree_marks")
structref.define_proxy(FrameRecords, FrameRecordsType, list(FRAME_RECORD_FIELDS))


@njit(**_NJIT)
def insert_steps(r, streams, obs_frames, step_actions, step_rewards, next_frames, terminated, truncated, changed,
                 priority, priorities, nodes, selected):
    """write_steps into the records of `r`, and with `selected` write_steps_selected (the
    priorities into its compiled tree; `nodes` that tree's scratch, as long as `changed`)."""
    if selected:
        return write_steps_selected(r.frames, r.actions, r.rewards, r.ends, r.back, r.valid, r.counts,
                                    r.episode_start, r.starting, r.state, r.marks, r.length, r.stack, r.n, streams,
                                    obs_frames, step_actions, step_rewards, next_frames, terminated, truncated,
                                    changed, priority, priorities, r.sums, r.prefix, r.mins, r.offsets, r.depth, r.k,
                                    r.tree_marks, nodes)
    return write_steps(r.frames, r.actions, r.rewards, r.ends, r.back, r.valid, r.counts, r.episode_start,
                       r.starting, r.state, r.marks, r.length, r.stack, r.n, streams, obs_frames, step_actions,
                       step_rewards, next_frames, terminated, truncated, changed, priority, priorities)


@njit(**_NJIT)
def sample_uniform(r, uniforms, mass, indices, windows_out, actions_out, returns_out, discounts_out, threads):
    """sample_uniform_windows from the records and tree of `r`."""
    return sample_uniform_windows(r.sums, r.prefix, r.offsets, r.depth, r.k, uniforms, mass, r.valid, r.counts,
                                  r.frames, r.actions, r.rewards, r.ends, r.back, r.length, r.stack, r.powers,
                                  indices, windows_out, actions_out, returns_out, discounts_out, threads)


@njit(**_NJIT)
def sample_prioritized(r, uniforms, mass, beta, indices, priorities, weights, windows_out, actions_out, returns_out,
                       discounts_out, threads):
    """sample_windows from the records and tree of `r`, its valid transitions counted in r.state[0]."""
    return sample_windows(r.sums, r.prefix, r.mins, r.offsets, r.depth, r.k, uniforms, mass, r.state[0], beta,
                          r.frames, r.actions, r.rewards, r.ends, r.back, r.length, r.stack, r.powers, indices,
                          priorities, weights, windows_out, actions_out, returns_out, discounts_out, threads)
