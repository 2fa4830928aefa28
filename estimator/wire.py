"""The wire: what a replay task costs when its table is on a replay server (a `server:ADDR`
device, kernels/server; the backend's `cost_source` is "wire").

A task on the server costs the client's own calls, the messages' bytes over the link (latency +
bytes / bandwidth, the platform's `cpu`-`server` link, or loopback's measured figures), the
server's handling of the request (validation, packing: SERVER_REQUEST_US) and the table's own
work there (the same task on a cpu table, priced by `Costs` as for a local one):

- insert: one chunk of E transitions per act round; the client waits for its acknowledgement
  before the next sample (a client reads its own writes), so a round trip per chunk;
- sample: one round trip carrying the batch back (its rows, indices and weights);
- update_priorities: rides on the next sample request (the piggybacked form): its bytes only.

The figures are docs/BENCHMARKS.md "Replay server" (2-core machine, loopback; session 8 re-measure,
2026-11-26, `benchmarks/replay_server.py latency`, 4 runs without spinning at load average 7-12):
piggybacked sample + update p50 228-315 us of which the server's handling of UPDATE_SAMPLE was
80-117 us p50 and the table's own work 32-36 us, so ~45-80 us of handling beyond the table and
~150-200 us per round trip for the loopback and both ends' I/O. Imports nothing of the server (no pyzmq).
"""
from __future__ import annotations

from dataclasses import replace

from pearl.errors import ConfigError

# Loopback on the 2-core machine: half a measured round trip per message, and a memcpy-bound stream.
LOOPBACK_LATENCY_US = 90.0
LOOPBACK_BANDWIDTH_GB_S = 2.0
SERVER_REQUEST_US = 70.0  # the server's handling of one request beyond the table's own work
CLIENT_CALLS = {"insert": 3, "sample": 4, "update_priorities": 1}  # pack + send (+ recv + unpack)


def link(platform) -> tuple[float, float]:
    """(latency_us, bandwidth_gb_s) between the host and the replay server: the platform's link
    between `cpu` and `server` if it has one, else loopback's."""
    try:
        found = platform.link("cpu", "server")
    except (ConfigError, AttributeError):
        return LOOPBACK_LATENCY_US, LOOPBACK_BANDWIDTH_GB_S
    return found.latency_us, found.bandwidth_gb_s


def message_s(nbytes: float, latency_us: float, bandwidth_gb_s: float) -> float:
    """One message over the link: latency + bytes / bandwidth."""
    return latency_us * 1e-6 + nbytes / (bandwidth_gb_s * 1e9)


def task_seconds(task: str, cand, costs) -> float:
    """One call of replay task `task` of candidate `cand` on its server (`costs`: estimator.costs.Costs)."""
    w, host = costs.workload, costs.platform.host
    latency, bandwidth = link(costs.platform)
    client = CLIENT_CALLS[task] * host.call_overhead_us * 1e-6
    table = costs.analytic_seconds(task, replace(cand, replay_device="cpu"), host)  # the server's table, a cpu one
    if task == "insert":
        chunk = cand.envs * w.transition_bytes
        return client + 2 * message_s(0, latency, bandwidth) + chunk / (bandwidth * 1e9) + \
            SERVER_REQUEST_US * 1e-6 + table
    if task == "sample":
        batch = cand.batch * (w.transition_bytes + 16)  # rows + index + weight
        return client + 2 * message_s(0, latency, bandwidth) + batch / (bandwidth * 1e9) + \
            SERVER_REQUEST_US * 1e-6 + table
    # update_priorities: indices and |TD| ride on the next sample request; the server applies them
    return client + cand.batch * 12 / (bandwidth * 1e9) + table
