"""The replay server's socket: one ZeroMQ ROUTER bound to an explicit address, one thread.

Every request is handled to completion by ReplayService.handle in arrival order, so the table
needs no lock; replies go back by the peer's routing id. Run it standalone (`pearl replay-server`,
`serve_forever`), embedded in a process (`start()` runs the loop in a daemon thread), or in a Ray
actor (construct it in the actor, call `start()`).
"""
from __future__ import annotations

import logging
import os
import struct
import threading
import time

import zmq

from pearl.server.client import spin_wait
from pearl.server.config import ServerConfig
from pearl.server.service import ReplayService
from pearl.server.wire import ErrorCode, Op, error_frames

log = logging.getLogger("pearl.replay_server")
POLL_MS = 50
ACK_OP = struct.pack("<H", Op.ACK)
BATCH_OP = struct.pack("<H", Op.BATCH)
INSERT_OP = struct.pack("<H", Op.INSERT)


def coalesce(replies: list) -> list:
    """Drops an ACK to a peer when a later ACK of the same burst goes to that peer with no other
    reply to it in between: acknowledgements are cumulative (the highest contiguous sequence
    number, the credit after it), so the last one says all the earlier ones did."""
    if len(replies) < 2:
        return replies
    keep, later_ack = [], set()
    for peer, frames in reversed(replies):
        ack = len(frames) == 1 and frames[0][6:8] == ACK_OP
        if ack and peer in later_ack:
            continue
        (later_ack.add if ack else later_ack.discard)(peer)
        keep.append((peer, frames))
    keep.reverse()
    return keep


class ReplayServer:
    # Received frames as bytes (one copy in pyzmq) rather than zero-copy zmq.Frame views: measured
    # faster for the row counts a chunk has (a Frame object costs more than copying ~50 kB), and
    # the service copies rows into the table once either way.
    copy_frames = True

    def __init__(self, config: ServerConfig, table=None):
        config.check()
        self.config = config
        self.service = ReplayService(config, table)
        self.restored = None
        if config.checkpoint_dir and config.restore:
            from pearl.server.checkpoint import restore

            self.restored = restore(self.service, config.checkpoint_dir)
        self.address: str | None = None
        self.refused_keys = None
        # held while the server thread handles a burst of requests; a learner in this process
        # holds it around service.sample_here (the table has no lock of its own)
        self.lock = threading.Lock()
        self._waker = None  # this process's other thread's end of the wake-up pipe (wake())
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    # ---- the socket -------------------------------------------------------------------------
    def wake(self) -> None:
        """Has the server thread send what waits in service.outbox now (from one other thread of
        this process: the learner that called service.sample_here)."""
        if self._waker is None:
            self._waker = self._context.socket(zmq.PUSH)
            self._waker.linger = 0
            self._waker.sndhwm = 4
            self._waker.connect(self._wake_address)
        try:
            self._waker.send(b"", zmq.NOBLOCK)
        except zmq.Again:  # wake-ups already queued: the server thread is coming
            pass

    def _open(self):
        context = self._context = zmq.Context()
        self._wake_address = f"inproc://pearl-replay-wake-{id(self)}"
        self._auth = None
        socket = context.socket(zmq.ROUTER)
        socket.linger = 0
        socket.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a reply to a peer that left raises, not queues
        socket.sndhwm = socket.rcvhwm = 10_000
        auth = self.config.auth
        if not auth.plaintext:
            from zmq.auth.thread import ThreadAuthenticator

            from pearl.server.keys import AllowList, allowed_keys, load_secret

            self._auth = ThreadAuthenticator(context)
            self._auth.start()
            self.refused_keys = AllowList(allowed_keys(auth.allow))
            self._auth.configure_curve_callback(domain="*", credentials_provider=self.refused_keys)
            public, secret = load_secret(auth.server_secret)
            socket.curve_publickey, socket.curve_secretkey = public, secret
            socket.curve_server = True
        bind = self.config.bind
        if bind.startswith("tcp://") and bind.endswith(":0"):
            bind = bind[:-2] + ":*"  # an ephemeral port; LAST_ENDPOINT names it
        socket.bind(bind)
        self.address = socket.getsockopt_string(zmq.LAST_ENDPOINT)
        if self.address.startswith("ipc://") and not self.address.startswith("ipc://@"):
            # a Unix socket's file mode is who may connect: its owner only (the umask may have
            # left it open to others), as a plaintext same-machine server has no other check (an
            # abstract name, ipc://@NAME, has no file: any local user may connect, as on loopback TCP)
            os.chmod(self.address[len("ipc://"):], 0o600)
        return context, socket

    def serve_forever(self) -> None:
        try:
            context, socket = self._open()
        except Exception as error:  # e.g. the address is taken: whoever waits for `ready` hears of it
            self._error = error
            self._ready.set()
            raise
        service = self.service
        poller = zmq.Poller()
        poller.register(socket, zmq.POLLIN)
        wake = context.socket(zmq.PULL)  # wake(): replies in service.outbox to send now
        wake.linger = 0
        wake.bind(self._wake_address)
        poller.register(wake, zmq.POLLIN)
        queued = [(socket, zmq.POLLIN)]
        every = self.config.checkpoint_every_s
        next_checkpoint = time.monotonic() + every if every and self.config.checkpoint_dir else None
        spin_ns = int(self.config.spin_us * 1000)
        spin = False  # after a burst: look for the next request by spinning before blocking in poll
        self._ready.set()
        try:
            while not self._stop.is_set():
                events = spin_wait((socket, wake), spin_ns) if spin else None
                if not events:
                    events = dict(poller.poll(POLL_MS))
                spin = bool(spin_ns and events)
                if wake in events:
                    while wake.poll(0):
                        wake.recv()
                if events:
                    # drain what is queued before polling again (one poll per burst, not per message)
                    with self.lock:
                        # replies made outside a request (sample_here) first, as they were made first
                        replies, service.outbox = service.outbox, []
                        for _ in range(256 if socket in events else 0):
                            try:
                                message = socket.recv_multipart(zmq.NOBLOCK, copy=self.copy_frames)
                            except zmq.Again:
                                break
                            replies += self._handle(message)
                            if replies and not self._insert(message):
                                # a reply someone waits for (a sample's batch) goes out now, not after
                                # the drain's last look for more; only acks coalesce
                                self._send(socket, coalesce(replies))
                                replies = []
                                # a learner's request comes alone: look for more by zmq_poll(0), ~1.3
                                # us, not by a recv raising zmq.Again, ~5 us (a writer's burst of
                                # inserts ends with one Again)
                                if not zmq.zmq_poll(queued, 0):
                                    break
                    self._send(socket, coalesce(replies))
                if service.snapshot is not None and service.snapshot.finished:
                    self._send(socket, service.snapshot.finish())
                if next_checkpoint is not None and time.monotonic() >= next_checkpoint and service.snapshot is None:
                    from pearl.server.checkpoint import start_checkpoint

                    service.snapshot = start_checkpoint(service, None)
                    next_checkpoint = time.monotonic() + every
        finally:
            if service.snapshot is not None:
                service.snapshot.join()
                service.snapshot.finish()
            wake.close(linger=0)
            socket.close(linger=0)
            if self._auth is not None:
                self._auth.stop()
            context.term()

    def _insert(self, message) -> bool:
        """Whether a received message is an INSERT (its reply, an ack, may wait for the burst's end)."""
        return len(message) > 1 and bytes(memoryview(message[1])[6:8]) == INSERT_OP

    def _handle(self, message) -> list:
        peer = message[0] if self.copy_frames else message[0].bytes
        if len(message) < 2:
            replies = [(peer, error_frames(ErrorCode.BAD_FRAME, "empty message"))]
            self.service.counts["rejected"] += 1
        else:
            try:
                replies = self.service.handle(peer, message[1:] if self.copy_frames else [f.buffer for f in message[1:]])
            except Exception as error:  # a bug, not a bad frame: say so, keep serving
                log.exception("replay server: request failed")
                self.service.counts["rejected"] += 1
                self.service.last_error = f"internal error: {error!r}"
                replies = [(peer, error_frames(ErrorCode.INTERNAL, self.service.last_error))]
        return replies

    def _send(self, socket, replies) -> None:
        for peer, frames in replies:
            try:
                if len(frames) == 1:  # an inline reply (a batch, an ack): two sends, ~2.4 us against
                    socket.send(peer, zmq.SNDMORE)  # send_multipart's ~6 us
                    socket.send(frames[0])
                else:
                    # copy=True: ZeroMQ copies each frame now (a batch's columns are the table's
                    # sample buffers, which the next draw reuses)
                    socket.send_multipart([peer] + frames, copy=True)
            except zmq.ZMQError:  # the peer left (EHOSTUNREACH, raised at its id): nothing to deliver
                if bytes(memoryview(frames[0])[6:8]) == BATCH_OP:
                    self.service.undo_sample()  # a waiting sample whose learner gave up: not an update

    # ---- embedded use -----------------------------------------------------------------------
    def start(self, timeout: float = 30.0) -> "ReplayServer":
        """Serves in a daemon thread of this process; returns once bound (self.address)."""

        def run():
            try:
                self.serve_forever()
            except BaseException as error:
                self._error = error
                self._ready.set()
                raise

        self._thread = threading.Thread(target=run, name="replay-server", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError(f"replay server did not bind within {timeout} s")
        if self._error is not None:
            raise self._error
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._waker is not None:
            self._waker.close(linger=0)
            self._waker = None
        if self._thread is not None:
            self._thread.join(timeout)

    def __enter__(self):
        return self.start() if self._thread is None else self

    def __exit__(self, *exc):
        self.stop()
