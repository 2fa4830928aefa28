"""The server backend: a replay table on a replay server (`pearl replay-server`, pearl/server).

A Plan puts its replay tasks there with `server:tcp://HOST:PORT` (`insert`, `sample`,
`update_priorities` on the same address); the builder asks `replay_table` for a
pearl.server.client.ReplayClient bound to that address, which has the local table's interface,
so neither the algorithm nor the runtime knows where the table lives. The runtime keeps the
replay ratio as with a local table (the server is used without a server-side ratio). The
estimator prices these tasks on the wire (estimator/wire.py: latency + bytes / bandwidth per
message, plus the server's own time per operation).

Light: importing it imports neither pyzmq nor the server.
"""
from __future__ import annotations

from pearl.errors import ConfigError
from pearl.kernels.registry import REPLAY_TASKS, Backend, register

CONNECT_TIMEOUT_S = 10.0  # the builder's HELLO: a server that does not answer is a one-line error


def split_tcp(address: str) -> tuple[str, int] | None:
    """('127.0.0.1', 5555) of 'tcp://127.0.0.1:5555'; None if it is not a tcp://HOST:PORT address."""
    if not address.startswith("tcp://"):
        return None
    host, colon, port = address[len("tcp://"):].rpartition(":")
    if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    return host.strip("[]"), int(port)


class ServerBackend(Backend):
    kind = "server"
    addressed = True
    cost_source = "wire"
    power_required = False  # the server's power is its own machine's, not this platform's
    # a server in a platform profile (a multi-node one): where it listens
    platform_keys = {"address": False}
    # Python-level calls on the client per task call (pack + send; recv + unpack for a sample)
    call_counts = {"insert": 3, "sample": 4, "update_priorities": 1}

    def detect(self) -> list[dict]:
        return []  # servers are not found on the machine: a plan names one by its address

    def check(self, device, platform=None, field: str = "device") -> None:
        if split_tcp(device.address) is None:
            raise ConfigError(f"{field}: {device}: expected server:tcp://HOST:PORT (a replay server's address)")

    def can_run(self, task: str, workload) -> str | None:
        if task in REPLAY_TASKS:
            return None
        return "is a replay server: it runs the replay tasks (insert, sample, update_priorities) only"

    def replay_table(self, device, config, fields: dict, auth=None, frames: dict | None = None):
        """A ReplayClient of the server at `device.address`, checked against the run's replay kind
        and transition schema (pearl/server/client.py `connect_table`). `auth`: pearl.plan.ServerAccess."""
        from pearl.server.client import connect_table

        frames = dict(frames, frame_stack=config.frame_stack) if config.frame_stack else None
        return connect_table(device.address, config.kind, fields, auth, CONNECT_TIMEOUT_S, "plan.devices.sample",
                             frames)


register(ServerBackend())
