"""The naive reference of pearl/replay/frames.py: full stacked obs and next obs per transition.

Each env stream stacks its frames as gymnasium's FrameStackObservation(padding_type="reset")
does, turns its steps into n-step transitions with NStepAccumulator (the readable reference of
pearl/replay/nstep.py), and remembers which records (one per step, one more per episode for its
final observation) every transition's frames came from. A transition may be sampled once emitted
and while every record it read is among its stream's last `length`.
"""
from __future__ import annotations

from collections import deque

import numpy as np

from pearl.replay.nstep import NStepAccumulator


class ReferenceStream:
    def __init__(self, stack: int, n: int, gamma: float):
        self.stack, self.n, self.gamma = stack, n, gamma
        self.nstep = NStepAccumulator(n, gamma)
        self.records = 0  # records written: an episode's first frame, then every next frame
        self.window: deque | None = None  # (frame, record number) of the current stack
        self.pending: deque = deque()  # record number of the obs of each step the accumulator holds

    def _stacked(self):
        return np.stack([frame for frame, _ in self.window]), min(record for _, record in self.window)

    def step(self, frame, action, reward, next_frame, terminated, truncated):
        """Returns the completed transitions as (record, oldest record read, (obs, a, R, next, discount))."""
        if self.window is None:  # a reset: the stack repeats the first frame
            self.window = deque([(frame, self.records)] * self.stack, maxlen=self.stack)
            self.records += 1
        else:
            assert np.array_equal(self.window[-1][0], frame), "obs must be the previous next obs"
        obs, oldest = self._stacked()
        record = self.window[-1][1]
        self.window.append((next_frame, self.records))
        self.records += 1
        ended = terminated or truncated
        next_obs, _ = self._stacked()
        self.pending.append((record, oldest))
        done = self.nstep.step(obs, action, reward, next_obs, terminated, truncated)
        out = [(*self.pending.popleft(), transition) for transition in done]
        if ended:
            self.window = None
            assert not self.pending
        return out

    def abandon(self):
        """Another writer takes the stream over: the unfinished episode's pending steps never complete."""
        self.window = None
        self.pending.clear()
        self.nstep = NStepAccumulator(self.n, self.gamma)


class ReferenceFrameReplay:
    def __init__(self, length: int, streams: int, stack: int, n: int, gamma: float):
        self.length = length
        self.streams = [ReferenceStream(stack, n, gamma) for _ in range(streams)]
        self.transitions: dict[int, tuple] = {}  # slot -> (stream, oldest record read, transition)
        self.next_frame = [None] * streams

    def add(self, stream, frame, action, reward, next_frame, terminated, truncated, begins=False):
        """One step; `begins`: a new writer's first step on the stream (written ~stream to the table)."""
        if begins:
            self.streams[stream].abandon()
        for record, oldest, transition in self.streams[stream].step(frame, action, reward, next_frame,
                                                                    terminated, truncated):
            self.transitions[stream * self.length + record % self.length] = (stream, oldest, transition)

    def valid(self) -> dict[int, tuple]:
        """slot -> (obs, action, R, next_obs, discount) of every transition that may be sampled."""
        out = {}
        for slot, (stream, oldest, transition) in self.transitions.items():
            if oldest >= self.streams[stream].records - self.length:
                out[slot] = transition
        return out
