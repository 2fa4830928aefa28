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

The ray runtime's model (pearl/schedule/models.py Ray, through estimator/costs.py `ray_parts`)
prices its wire from the same parts (`client_s`, `messages_s`, `server_s`) over the cluster's
link (`node_link`: a platform's `nodes.link`, or loopback), and its node agents, the wire's
writers, with `agent_pass_s` (per pass over its rings) and `agent_chunk_s` (per chunk).

Measured wire: `pearl profile --wire` (pearl/measure.py `wire_us`) times the requests on this
machine through the runtime's own server and clients (CURVE, loopback) and keeps per replay kind,
by rows, tables `wire|TASK|KIND|PART` (TASK insert or sample, PART `rtt` / `client` / `server`:
the call's wall time, the caller's CPU, the server thread's CPU per request). Where they are, they
replace the constants below: a call on the server costs its measured round trip; the server's
handling of a request is its measured CPU less the table's own work; a client's own Python its
measured CPU (`source` says which the costs use). What no request times stays a constant: the
link's bandwidth (the wire's bytes per chunk are ~0.4-12 kB here) and Ray's calls (the platform's
`nodes:` figures, `benchmarks/ray_runtime.py --calls`: the ray runtime's weights travel in Ray
calls, not on this wire).

The constants are docs/BENCHMARKS.md "Replay server" (2-core machine, loopback; session 9 re-measure,
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
# A ray node agent (pearl/runtime/node_agent.py) is a writer on the wire; its Python-level calls,
# read off its loop: per actor ring per pass take, one copy per transition column (5), release and
# the allowance; per chunk sent a concatenate per column and the loop's bookkeeping (2), plus the
# client's own insert calls; the rows are copied 3 times (out of the ring, concatenated, packed).
AGENT_CALLS_PER_RING = 8
AGENT_CALLS_PER_CHUNK = 7
AGENT_COPIES = 3


# what `pearl profile --wire` times (pearl/measure.py wire_us): per request kind, its parts
WIRE_TASKS = ("insert", "sample")
WIRE_PARTS = ("rtt", "client", "server")


def table_name(task: str, kind: str, part: str) -> str:
    """The profile table of the wire's `part` of a `task` request on a `kind` replay table, by rows."""
    return f"wire|{task}|{kind}|{part}"


def measured_s(costs, task: str, kind: str, part: str, rows: int) -> float | None:
    """Seconds of `part` of one `task` request of `rows` rows from the profile's wire tables (at a
    profiled size, between or beyond them), or None when the profile has none."""
    if task not in WIRE_TASKS:
        return None
    return costs.profiled_seconds(table_name(task, kind, part), rows)


def source(tables: dict, kind: str) -> str:
    """"measured" when the profile's `tables` hold every wire table of replay `kind`, else "wire"
    (the constants of this module)."""
    names = [table_name(t, kind, p) for t in WIRE_TASKS for p in WIRE_PARTS]
    return "measured" if all(tables.get(n) for n in names) else "wire"


def link(platform) -> tuple[float, float]:
    """(latency_us, bandwidth_gb_s) between the host and the replay server: the platform's link
    between `cpu` and `server` if it has one, else loopback's."""
    try:
        found = platform.link("cpu", "server")
    except (ConfigError, AttributeError):
        return LOOPBACK_LATENCY_US, LOOPBACK_BANDWIDTH_GB_S
    return found.latency_us, found.bandwidth_gb_s


def node_link(platform) -> tuple[float, float]:
    """(latency_us, bandwidth_gb_s) between two nodes of the platform's cluster (`nodes.link`), or
    loopback's when it names none (a local cluster: every node on one host)."""
    nodes = getattr(platform, "nodes", None)
    if nodes is None or nodes.link is None:
        return LOOPBACK_LATENCY_US, LOOPBACK_BANDWIDTH_GB_S
    return nodes.link.latency_us, nodes.link.bandwidth_gb_s


def message_s(nbytes: float, latency_us: float, bandwidth_gb_s: float) -> float:
    """One message over the link: latency + bytes / bandwidth."""
    return latency_us * 1e-6 + nbytes / (bandwidth_gb_s * 1e9)


def client_s(task: str, costs, servers: int = 1, rows: int | None = None, kind: str = "") -> float:
    """The client's own Python (and socket work) for one call of `task` carrying `rows` rows, asked
    of `servers` servers at once (each its share of the rows) on a `kind` table: measured where the
    profile has it."""
    if rows is not None:
        each = measured_s(costs, task, kind, "client", max(1, rows // servers))
        if each is not None:
            return each * servers
    return CLIENT_CALLS[task] * servers * costs.platform.host.call_overhead_us * 1e-6


def messages_s(task: str, rows: int, costs, latency_us: float, bandwidth_gb_s: float) -> float:
    """The wire's part of one call of `task` carrying `rows` rows: a request and its reply
    (insert: the chunk out, its acknowledgement back; sample: the batch back with its indices and
    weights), or for update_priorities its indices and |TD| riding on the next sample request."""
    w = costs.workload
    if task == "insert":
        return 2 * message_s(0, latency_us, bandwidth_gb_s) + rows * w.insert_bytes / (bandwidth_gb_s * 1e9)
    if task == "sample":
        return 2 * message_s(0, latency_us, bandwidth_gb_s) + rows * (w.transition_bytes + 16) / (bandwidth_gb_s * 1e9)
    return rows * 12 / (bandwidth_gb_s * 1e9)


def server_s(task: str, costs=None, rows: int | None = None, table_s: float = 0.0, kind: str = "") -> float:
    """The server's handling of one request of `rows` rows on a `kind` table beyond the table's own work `table_s`
    (an update_priorities rides on a sample request: none of its own): the profile's measured
    server CPU per request less `table_s`, or SERVER_REQUEST_US."""
    if task == "update_priorities":
        return 0.0
    if costs is not None and rows is not None:
        whole = measured_s(costs, task, kind, "server", rows)
        if whole is not None:
            return max(0.0, whole - table_s)
    return SERVER_REQUEST_US * 1e-6


def round_trip_s(task: str, rows: int, costs, kind: str, table_s: float) -> float:
    """A `task` request of `rows` rows on a `kind` table as its caller waits for the reply, over
    the cluster's link: the profile's measured round trip, or the client's calls, the messages,
    the server's handling and the table's own work `table_s`."""
    measured = measured_s(costs, task, kind, "rtt", rows)
    if measured is not None:
        return measured
    latency, bandwidth = node_link(costs.platform)
    return client_s(task, costs) + messages_s(task, rows, costs, latency, bandwidth) + server_s(task) + table_s


def agent_pass_s(rings: int, costs, nap: bool = True) -> float:
    """A node agent's pass over its `rings` actor rings (take, copy out, release, the allowance)
    and (`nap`) its nap's call: it makes one per AGENT_NAP_S whether or not its rings hold rows."""
    return (AGENT_CALLS_PER_RING * rings + nap) * costs.platform.host.call_overhead_us * 1e-6


def agent_chunk_s(rows: int, costs, kind: str = "") -> float:
    """A node agent sending one chunk of `rows` rows to a `kind` table: its own calls, the
    client's insert, the rows' copies."""
    host, w = costs.platform.host, costs.workload
    return AGENT_CALLS_PER_CHUNK * host.call_overhead_us * 1e-6 + client_s("insert", costs, rows=rows, kind=kind) + \
        AGENT_COPIES * rows * w.insert_bytes / (host.memory_bandwidth_gb_s / host.cores * 1e9)


def task_seconds(task: str, cand, costs) -> float:
    """One call of replay task `task` of candidate `cand` on its server (`costs`: estimator.costs.Costs):
    the profile's measured round trip where it has one (an update_priorities then rides inside the
    measured sample of a prioritized table), else the parts above over the platform's link."""
    rows, kind = (cand.envs if task == "insert" else cand.batch), cand.replay_kind
    if task == "update_priorities":
        if measured_s(costs, "sample", kind, "rtt", rows) is not None:
            return 0.0
    else:
        rtt = measured_s(costs, task, kind, "rtt", rows)
        if rtt is not None:
            return rtt
    latency, bandwidth = link(costs.platform)
    table = costs.analytic_seconds(task, replace(cand, replay_device="cpu"), costs.platform.host)  # the server's table, a cpu one
    return client_s(task, costs) + messages_s(task, rows, costs, latency, bandwidth) + server_s(task) + table
