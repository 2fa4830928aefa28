"""Clients of the replay server.

`ReplayClient(address, ...)` has the interface of a local replay table (pearl.contracts.ReplayTable):
`add(obs, actions, rewards, next_obs, discounts)`, `sample(batch, rng) -> Batch`,
`update_priorities(indices, td)`, `state_dict()` / `load_state_dict()`, `capacity`,
`prioritized`, `progress` - so a learner or an actor uses it where it used a table.

- As a writer (`writer=ID`, a positive int unique per writer stream): `add` sends the chunk with the
  next sequence number and the env steps it commits (`env_steps=`, default its row count) and
  returns at once; up to `window` chunks are in flight. The writer keeps every chunk until it is
  acknowledged and resends unacknowledged ones after a reconnect, so a chunk is stored exactly
  once; it also keeps up to `retain` acknowledged chunks that are not yet in a server checkpoint
  and resends them if the server restarts from an older checkpoint (kill -9); `flush()` waits for all acknowledgements. With a server-side replay ratio the writer
  commits env steps only against the credit the server granted it (and waits for more).
- As a learner: `update_priorities` is held and rides on the next `sample` request
  (UPDATE_SAMPLE: one round trip per learner step); `piggyback=False` sends it at once instead.
"""
from __future__ import annotations

import json
import os
import time
from collections import deque
from dataclasses import dataclass

import numpy as np
import zmq

from pearl.contracts import Batch, ReplayTable, implements
from pearl.server.wire import (FLAG_NO_ACK, INLINE_BYTES, ErrorCode, Header, Op, Packer, message_arrays,
                               pack, unpack_header)

ZERO_COPY_BYTES = 1 << 18
LEARNER_SPIN_US = 0.0  # a learner's connection spins this long for a reply before blocking (spin_wait)


def spin_wait(sockets, ns: int) -> dict:
    """{socket: POLLIN} for those of `sockets` with a message, waiting up to `ns` ns by spinning
    on ZMQ_EVENTS (which also takes in the I/O thread's pending commands). A thread blocked in
    poll sleeps, and waking it costs a VM's idle core ~100 us or more (docs/REPLAY_SERVER.md);
    a spin keeps it running until a reply or request that comes soon. Each turn yields the core
    (sched_yield, without the GIL): on an idle machine it returns at once, so the spin keeps the
    core awake; on a busy one the peer, its I/O thread or the host's threads run instead of the
    spinner (200 us spins on both ends without the yield: p50 +420-470 us at load 5, docs/BENCHMARKS.md)."""
    deadline = time.perf_counter_ns() + ns
    while True:
        ready = {s: zmq.POLLIN for s in sockets if s.get(zmq.EVENTS) & zmq.POLLIN}
        if ready or time.perf_counter_ns() >= deadline:
            return ready
        os.sched_yield()


class ServerError(RuntimeError):
    """The server refused a request: `code` is its ErrorCode, the message its one line."""

    def __init__(self, code: int, message: str):
        super().__init__(f"replay server: {ErrorCode(code).name}: {message}" if code in ErrorCode._value2member_map_
                         else f"replay server: error {code}: {message}")
        self.code = code


class NoReply(TimeoutError):
    """No reply within the timeout: the server is down, unreachable, or refused our key."""


@dataclass
class ClientAuth:
    """plaintext, or CURVE with this client's certificate (NAME.key_secret) and the server's
    public key (a certificate file or a z85 string)."""

    plaintext: bool = True
    client_secret: str | None = None
    server_public: str | bytes | None = None
    # or this client's key pair in memory, z85 (public, secret): keys a runtime made for one run
    client_keys: tuple[bytes, bytes] | None = None


class Connection:
    """One DEALER socket to one server."""

    def __init__(self, address: str, auth: ClientAuth | None = None, timeout: float = 30.0,
                 context: zmq.Context | None = None, spin_us: float = 0.0):
        self.address, self.auth, self.timeout = address, auth or ClientAuth(), timeout
        self.spin_ns = int(spin_us * 1000)
        self.context = context or zmq.Context.instance()
        # every one-frame message fits: its columns (<= INLINE_BYTES), header, descriptors, padding
        self._scratch = np.empty(INLINE_BYTES + 4096, np.uint8)
        self.socket = None
        self.connect()

    def connect(self) -> None:
        if self.socket is not None:
            self.socket.close(linger=0)
        socket = self.context.socket(zmq.DEALER)
        socket.linger = 0
        # a DEALER blocks a send while it has no peer (a server that is down, or refused our CURVE
        # key during the handshake): bounded like a reply
        socket.sndtimeo = int(self.timeout * 1000)
        socket.sndhwm = socket.rcvhwm = 10_000
        if not self.auth.plaintext:
            from pearl.server.keys import load_public, load_secret

            public, secret = self.auth.client_keys or load_secret(self.auth.client_secret)
            socket.curve_publickey, socket.curve_secretkey = public, secret
            socket.curve_serverkey = load_public(self.auth.server_public)
        socket.connect(self.address)
        self.socket = socket

    def send(self, frames) -> None:
        try:
            if len(frames) == 1:  # a header-only or inline message (the common case): zmq copies it
                self.socket.send(frames[0])
                return
            # zero-copy only pays for large buffers: a zmq.Frame per column costs more than a memcpy
            big = sum(f.nbytes if isinstance(f, np.ndarray) else len(f) for f in frames) > ZERO_COPY_BYTES
            self.socket.send_multipart(frames, copy=not big)
        except zmq.Again:
            waited = self.socket.sndtimeo / 1000
            self.connect()
            raise NoReply(f"the replay server at {self.address} took no message within {waited:g} s "
                          f"(down, unreachable, or our key is not on its allow-list)") from None

    def recv(self, timeout: float | None = None):
        """(header, frames) of the next reply; ServerError for an ERROR reply; NoReply on timeout."""
        timeout = self.timeout if timeout is None else timeout
        socket = self.socket
        # zmq_poll, not Socket.poll (a Poller built per call); it looks at ZMQ_EVENTS itself before
        # any system call, so a ZMQ_EVENTS check first only adds ~2 us while the reply is on its way
        if not (self.spin_ns and spin_wait((socket,), self.spin_ns)) \
                and not zmq.zmq_poll([(socket, zmq.POLLIN)], int(timeout * 1000)):
            # a fresh socket: a late reply to this request must not be read as the next one's (the
            # server sees us leave and takes back a sample it could not deliver)
            self.connect()
            raise NoReply(f"no reply from the replay server at {self.address} within {timeout} s "
                          f"(down, unreachable, or our key is not on its allow-list)")
        frames = self._receive()
        header, columns = unpack_header(frames[0])
        # a BATCH with FLAG_MASSES ends with one meta row: [total, min mass, beta, size, env steps]
        arrays = message_arrays(frames, header, columns, 1 if header.op == Op.BATCH and len(columns) == 9 else None)
        if header.op == Op.ERROR:
            raise ServerError(header.status, arrays[0].tobytes().decode("utf-8", "replace") if arrays else "")
        return header, arrays

    def _receive(self) -> list:
        """The frames of the message waiting on the socket, the first (a reply's only frame when
        inline, as a sample's batch is) copied once from ZeroMQ's buffer into a fresh array of
        its own: the arrays parsed from it are writable and outlive the next call without a copy
        each (recv_multipart: a zmq.Frame per part, and then a copy per column, ~3 us more)."""
        socket, scratch = self.socket, self._scratch
        n = socket.recv_into(scratch)
        if n > len(scratch):  # not a message of our server: an inline frame is < INLINE_BYTES + 4 kB
            self.connect()
            raise ServerError(ErrorCode.BAD_FRAME, f"a reply frame of {n} bytes (at most {len(scratch)})")
        frames = [scratch[:n].copy()]
        if socket.get(zmq.RCVMORE):  # a large message: one frame per column after the header's
            frames += [f.buffer for f in socket.recv_multipart(copy=False)]
        return frames

    def call(self, frames, timeout: float | None = None):
        if timeout is None or timeout == self.timeout:  # (setting a socket option costs ~10 us)
            self.send(frames)
            return self.recv(timeout)
        self.socket.sndtimeo = int(timeout * 1000)
        try:
            self.send(frames)
        finally:
            self.socket.sndtimeo = int(self.timeout * 1000)
        return self.recv(timeout)

    def info(self, op: Op, timeout: float | None = None) -> dict:
        header, arrays = self.call(pack(Header(op)), timeout)
        return json.loads(arrays[0].tobytes().decode("utf-8"))

    def close(self) -> None:
        if self.socket is not None:
            self.socket.close(linger=0)
            self.socket = None


def batch_from(arrays) -> Batch:
    """A BATCH reply's columns as a Batch (they view the reply's own buffer: Connection._receive)."""
    return Batch(*arrays[:7])


class _Writer:
    """A writer stream: sequence numbers, the resend buffer, the window, and credits."""

    def __init__(self, connection: Connection, writer: int, window: int, ratio: bool, retries: int,
                 retain: int = 1024):
        if writer < 1 or writer >= 1 << 32:
            raise ValueError(f"writer id {writer}: expected 1 .. 2^32 - 1")
        self.conn, self.writer, self.window, self.ratio, self.retries = connection, writer, window, ratio, retries
        self.inflight: deque = deque()  # (seq, frames, env steps), oldest first, unacknowledged
        # acknowledged chunks not yet in a server checkpoint (at most `retain`): resent if the
        # server restarts from a checkpoint older than them
        self.retain, self.retained, self.unprotected = retain, deque(), 0
        self.sent = 0                   # chunks of `inflight` already sent since the last resync
        self.acked = 0
        self.durable = 0                # highest seq in the server's last checkpoint
        self.credit = 0                 # server's credit at the last ack, before in-flight chunks
        # chunks whose seq is a multiple of ack_every ask for an ACK, the others carry FLAG_NO_ACK
        # (fewer messages per chunk on both sides); with a ratio every chunk asks, as credit
        # requests wait for their own reply
        self.ack_every = 1 if ratio else max(1, window // 2)
        self.expect = 0                 # highest seq a reply is on its way for (this socket)
        self.resync()

    @property
    def next_seq(self) -> int:
        return (self.inflight[-1][0] if self.inflight else self.acked) + 1

    def resync(self) -> None:
        """Asks the server for this writer's acknowledged sequence number; drops what it has. A
        server restarted from a checkpoint older than our acknowledgements gets the retained
        chunks again; if we no longer hold them, that is an error naming the lost range."""
        header, _ = self.conn.call(pack(Header(Op.WRITER, writer=self.writer)))
        self.sent = self.expect = 0
        if header.seq < self.acked:
            if header.seq < self.unprotected:
                raise ServerError(ErrorCode.SEQUENCE_GAP,
                                  f"the server restarted at writer {self.writer}'s chunk {header.seq}; chunks "
                                  f"{header.seq + 1}..{self.unprotected} were acknowledged after its last "
                                  f"checkpoint and are no longer held here (raise retain=)")
            while self.retained and self.retained[-1][0] > header.seq:
                self.inflight.appendleft(self.retained.pop())
            self.acked = header.seq
        self._acknowledge(header)

    def _acknowledge(self, header: Header) -> None:
        self.acked = max(self.acked, header.seq)
        self.credit, self.durable = header.arg0, header.arg1
        while self.inflight and self.inflight[0][0] <= self.acked:
            chunk = self.inflight.popleft()
            self.sent = max(0, self.sent - 1)
            if self.retain and chunk[0] > self.durable:
                self.retained.append(chunk)
        while self.retained and (self.retained[0][0] <= self.durable or len(self.retained) > self.retain):
            seq = self.retained.popleft()[0]
            if seq > self.durable:
                self.unprotected = max(self.unprotected, seq)

    def available(self) -> int:
        return self.credit - sum(steps for _, _, steps in list(self.inflight)[:self.sent])

    def put(self, frames, seq: int, steps: int) -> None:
        if seq <= self.acked:
            return  # a resend of a chunk the server already stored (restarted writer)
        self.inflight.append((seq, frames, steps))
        self.pump()

    def pump(self, wait_all: bool = False) -> None:
        """Sends what the window and the credit allow; waits for acks while the window is full,
        credit is short, or (wait_all) anything is unacknowledged."""
        failures = 0
        while True:
            try:
                while self.sent < len(self.inflight) and self.sent < self.window:
                    seq, frames, steps = self.inflight[self.sent]
                    if self.ratio and steps > self.available():
                        if self.sent:  # let the server take what is in flight first
                            break
                        self._ask_credit(steps)
                        continue
                    self.conn.send(frames)
                    self.sent += 1
                    if seq % self.ack_every == 0:
                        self.expect = seq
                if not self.inflight or (not wait_all and len(self.inflight) < self.window and
                                         self.sent == len(self.inflight)):
                    return
                if self.expect <= self.acked:  # no reply on its way: ask where the server is
                    self.conn.send(pack(Header(Op.WRITER, writer=self.writer)))
                    self.expect = self.inflight[self.sent - 1][0]
                self._receive()
                failures = 0
            except (NoReply, zmq.ZMQError) as error:
                failures += 1
                if failures > self.retries:
                    raise NoReply(f"writer {self.writer}: {error}") from error
                self.conn.connect()  # a fresh socket: stale replies die with the old one
                try:
                    self.resync()
                except NoReply:
                    continue

    def _receive(self) -> None:
        try:
            header, _ = self.conn.recv()
        except ServerError as error:
            if error.code in (ErrorCode.SEQUENCE_GAP, ErrorCode.RATE_LIMITED, ErrorCode.NO_CREDIT):
                # the chunks after it are refused too: a fresh socket (their replies die with the
                # old one), ask where the server is, resend from there
                time.sleep(0.01 if error.code == ErrorCode.RATE_LIMITED else 0)
                self.conn.connect()
                self.resync()
                return
            raise
        self._acknowledge(header)

    def release_credit(self) -> None:
        """Gives the credit left back to the server, once every chunk sent is acknowledged (each
        was committed against that credit)."""
        if self.ratio:
            self.pump(wait_all=True)
            self._ask_credit(0)

    def _ask_credit(self, steps: int) -> None:
        self.conn.send(pack(Header(Op.CREDIT, writer=self.writer, arg0=steps)))
        header, _ = self.conn.recv()
        self._acknowledge(header)


@implements(ReplayTable)
class ReplayClient:
    """A replay table on a replay server, used through the local table's interface."""

    def __init__(self, address: str, auth: ClientAuth | None = None, writer: int | None = None,
                 timeout: float = 30.0, piggyback: bool = True, window: int = 16, retries: int = 5,
                 retain: int = 1024, connect_timeout: float | None = None,
                 spin_us: float = LEARNER_SPIN_US):
        self.address, self.auth, self.timeout = address, auth or ClientAuth(), timeout
        self.piggyback = piggyback
        self.learner = Connection(address, self.auth, timeout, spin_us=spin_us)
        self.info = self.learner.info(Op.HELLO, connect_timeout)  # NoReply: no server answered
        self.capacity = int(self.info["capacity"])
        self.prioritized = bool(self.info["prioritized"])
        self._writer = None
        if writer is not None:
            self._writer = _Writer(Connection(address, self.auth, timeout), writer, window,
                                   self.info["ratio"] is not None, retries, retain)
        self._pending: tuple | None = None  # (indices, td) riding on the next sample
        self._packers: dict[int, Packer] = {}  # rows -> the packer of an update of that many rows
        self._dtypes = tuple(np.dtype(dtype) for dtype, _ in self.info["insert"])  # the server's insert columns
        self._progress = 0
        self._told_no_checkpoints = False

    # ---- the table interface ----------------------------------------------------------------
    @property
    def progress(self) -> int:
        """Env steps the server has counted from the writers' commit records (read-only: the
        server owns the count; setting it is ignored)."""
        return self._progress

    @progress.setter
    def progress(self, value) -> None:
        pass

    def add(self, *columns, env_steps: int | None = None, seq: int | None = None) -> int:
        """Sends one chunk (returns its sequence number without waiting for the ack): the server's
        insert columns (obs, actions, rewards, next_obs, discounts; a frame table's step records).
        `seq`: an explicit sequence number, for a restarted writer replaying its stream."""
        if self._writer is None:
            raise RuntimeError("this ReplayClient has no writer id: ReplayClient(address, writer=ID)")
        if len(columns) != len(self._dtypes):
            raise ValueError(f"an insert of {len(columns)} columns; the server's table takes {len(self._dtypes)}")
        rows = len(columns[0])
        steps = rows if env_steps is None else int(env_steps)
        w = self._writer
        seq = w.next_seq if seq is None else int(seq)
        dtypes = self._dtypes
        columns = [np.ascontiguousarray(a, t) for a, t in zip(columns, dtypes)]
        header = Header(Op.INSERT, writer=w.writer, seq=seq, rows=rows, arg0=steps,
                        flags=FLAG_NO_ACK if seq % w.ack_every else 0)
        if sum(c.nbytes for c in columns) > INLINE_BYTES:
            # zero-copy frames: copies first, the chunk stays in the resend buffer until acknowledged
            # and the caller may reuse its arrays
            columns = [c.copy() for c in columns]
        w.put(pack(header, columns), seq, steps)  # inline: pack copies into one frame
        return seq

    def flush(self, release_credit: bool = False) -> int:
        """Waits until every chunk sent was acknowledged; returns the acknowledged sequence number.
        `release_credit`: this writer is done for now, so the credit of a server-side ratio it
        still holds goes back to the server for other writers (it asks anew if it writes again)."""
        if self._writer is not None:
            self._writer.pump(wait_all=True)
            if release_credit:
                self._writer.release_credit()
            return self._writer.acked
        return 0

    def resume(self) -> int:
        """A (re)started writer: the server's highest acknowledged sequence number for it."""
        self._writer.resync()
        return self._writer.acked

    @property
    def durable(self) -> int:
        """The highest sequence number of this writer inside the server's last checkpoint."""
        return self._writer.durable if self._writer else 0

    def sample(self, batch_size: int, rng: np.random.Generator | None = None, timeout: float | None = None,
               flags: int = 0) -> Batch:
        """A batch drawn by the server's selector (its RNG; `rng` is accepted for the table
        interface). With a server-side ratio the reply waits until the update is due."""
        header, arrays = self.sample_raw(batch_size, timeout, flags)
        return batch_from(arrays)

    def sample_raw(self, batch_size: int, timeout: float | None = None, flags: int = 0):
        if self._writer is not None and self._writer.inflight:
            # a client that writes and samples reads its own writes, as a local table does: the
            # writer's socket and the learner's are two streams the server may serve in any order
            self._writer.pump(wait_all=True)
        if self._pending is not None:
            indices, td = self._pending
            self._pending = None
            frames = self._pack_update(Header(Op.UPDATE_SAMPLE, rows=len(indices), arg0=batch_size, flags=flags),
                                       indices, td)
        else:
            frames = pack(Header(Op.SAMPLE, arg0=batch_size, flags=flags))
        header, arrays = self.learner.call(frames, timeout)
        self._progress = int(header.arg0)
        return header, arrays

    def update_priorities(self, indices, td_errors) -> None:
        indices = np.ascontiguousarray(indices, np.int64).reshape(-1)
        td = np.abs(np.ascontiguousarray(td_errors, np.float32)).reshape(-1)
        if td.shape != indices.shape:
            raise ValueError(f"update_priorities: {td.shape[0]} |td| for {indices.shape[0]} indices")
        if self.piggyback:
            if self._pending is not None:  # two updates without a sample between: send the first
                self._send_update(*self._pending)
            self._pending = (indices.copy(), td)  # (np.abs made td a fresh array)
        else:
            self._send_update(indices, td)

    def _send_update(self, indices, td) -> None:
        self.learner.call(self._pack_update(Header(Op.UPDATE, rows=len(indices)), indices, td))

    def _pack_update(self, header: Header, indices: np.ndarray, td: np.ndarray) -> list:
        """An update's message: int64 indices and float32 |td| (update_priorities made them so),
        packed by one Packer per row count (a learner's batch size: one or two)."""
        packer = self._packers.get(len(indices))
        if packer is None:
            if len(indices) * 12 > INLINE_BYTES or len(self._packers) >= 16:
                return pack(header, [indices, td])
            packer = self._packers[len(indices)] = Packer([indices, td])
        return packer.pack(header, [indices, td])

    def flush_updates(self) -> None:
        if self._pending is not None:
            pending, self._pending = self._pending, None
            self._send_update(*pending)

    def stats(self) -> dict:
        return self.learner.info(Op.STATS)

    def checkpoint(self) -> dict:
        """Asks the server to write a checkpoint; returns its manifest once it is on disk."""
        self.flush_updates()
        return self.learner.info(Op.CHECKPOINT)

    def state_dict(self, detached: bool = False) -> dict:
        """The server's table stays on the server (so nothing here to detach): this writes a
        checkpoint there and returns where (restart the server from its checkpoint_dir to load it). A server without a
        checkpoint_dir keeps its table only while it runs: the run's checkpoint says so
        (`checkpoint: None`) and the run goes on, with one warning."""
        if not self.info.get("checkpoints", True):
            if not self._told_no_checkpoints:
                import warnings

                self._told_no_checkpoints = True
                warnings.warn(f"the replay server at {self.address} has no checkpoint_dir: the run's checkpoints "
                              f"hold no replay (a restarted server starts empty)", stacklevel=2)
            return {"replay_server": self.address, "checkpoint": None}
        return {"replay_server": self.address, "checkpoint": self.checkpoint()}

    def load_state_dict(self, state: dict) -> None:
        """Nothing to load client-side: a server restarts from its own latest checkpoint."""

    def __len__(self) -> int:
        return int(self.stats()["size"])

    def close(self) -> None:
        self.learner.close()
        if self._writer is not None:
            self._writer.conn.close()


def connect_table(address: str, kind: str, fields: dict, auth=None, connect_timeout: float = 10.0,
                  field: str = "replay", frames: dict | None = None) -> ReplayClient:
    """A ReplayClient (a writer stream of its own) of the server at `address` for a run whose
    replay is `kind` with transition `fields` (name -> (dtype, shape)): a one-line ConfigError
    naming `field` if no server answers, or it holds another table, or it keeps a replay ratio of
    its own (the caller's runtime keeps the ratio). `auth`: plaintext, client_secret and
    server_public (pearl.plan.ServerAccess); None: plaintext. `frames`: the run writes a frame
    table's step records (frame_stack, streams, n_step, gamma): the server's table must be a frame
    table of that stack, n_step and gamma with at least that many streams."""
    import os

    from pearl.errors import ConfigError

    client_auth = ClientAuth(plaintext=True) if auth is None or auth.plaintext else ClientAuth(
        plaintext=False, client_secret=auth.client_secret, server_public=auth.server_public)
    # writer ids are per stream: a fresh random one never collides with a live writer of another run
    writer = int.from_bytes(os.urandom(4), "little") % (2**32 - 1) + 1
    try:
        client = ReplayClient(address, client_auth, writer=writer, connect_timeout=connect_timeout)
    except NoReply:
        raise ConfigError(f"{field}: no replay server answered at {address} within {connect_timeout:g} s (not "
                          f"running, unreachable, or our key is not on its allow-list)") from None
    info = client.info
    served = (info["kind"], tuple(info["obs_shape"]), np.dtype(info["obs_dtype"]), np.dtype(info["action_dtype"]),
              tuple(info["action_shape"]))
    wanted = (kind, tuple(fields["obs"][1]), np.dtype(fields["obs"][0]), np.dtype(fields["actions"][0]),
              tuple(fields["actions"][1]))
    problem = None
    if served != wanted:
        problem = (f"the replay server at {address} holds {_describe(*served)}; this run needs "
                   f"{_describe(*wanted)} (start it with matching table keys)")
    elif info.get("ratio"):
        problem = (f"the replay server at {address} keeps a replay ratio of its own; this run's runtime keeps "
                   f"the ratio (start the server without `ratio`)")
    else:
        problem = _frames_problem(address, info, frames)
    if problem:
        client.close()
        raise ConfigError(f"{field}: {problem}")
    return client


def _frames_problem(address: str, info: dict, frames: dict | None) -> str | None:
    """Why a run that writes `frames` (None: whole transitions) cannot use the server's table."""
    stack = info.get("frame_stack", 0)
    if not frames:
        return (f"the replay server at {address} holds a frame table (frame_stack {stack}); this run writes whole "
                f"transitions (serve frame_stack 0, or set replay.frame_stack)") if stack else None
    served = {key: info.get(key) for key in ("frame_stack", "n_step", "gamma")}
    wanted = {key: frames[key] for key in served}
    if served != wanted:
        return (f"the replay server at {address} holds a table of {served}; this run writes the step records of "
                f"{wanted} (start it with matching table keys)")
    if info["streams"] < frames["streams"]:
        return (f"the replay server at {address} has {info['streams']} env streams; this run's actors step "
                f"{frames['streams']} envs (start it with table.streams >= {frames['streams']})")
    return None


def _describe(kind, obs_shape, obs_dtype, action_dtype, action_shape) -> str:
    return f"{kind} replay, obs {obs_dtype}{list(obs_shape)}, actions {action_dtype}{list(action_shape)}"
