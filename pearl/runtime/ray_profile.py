"""`pearl profile --ray`: what a local Ray cluster costs on this machine beyond the work the ray
model prices per call (estimator/costs.py `ray_background`, pearl/schedule/models.py Ray).

Costs per second, whatever the run's rate, and Ray's own work per publish, which session 13's
runs showed the model missing (docs/BENCHMARKS.md "Ray runtime (issue 15)"): on a host whose
cores the nodes share they take cores from the actors and the learner. A cluster of `nodes` nodes
of 1 CPU each on 127.0.0.1 (`local_cluster`, as benchmarks/ray_runtime.py runs the ray plans),
one `IdleAgent` on each node (a Ray actor with a node agent's options, no actor processes), and
three phases of `seconds` each, the CPU of every thread of this process tree read from /proc:
- at rest: Ray's processes (GCS, raylets, their agents, idle workers) and the driver's threads
  other than its main one, per node: `ray|daemon`;
- the agents napping as a node agent's loop does (AGENT_NAP_S between passes): an agent process's
  CPU per second, its Ray threads included: `ray|agent`;
- the driver publishing weights every PUBLISH_S as pearl/runtime/ray.py's _Publisher does (bytes
  inside the call up to INLINE_WEIGHTS_BYTES, else one put; the next once all are delivered):
  the CPU beyond the napping phase per publish per agent, in the agent's process
  (`ray|publish|agent`), in Ray's processes and the driver's other threads (`ray|publish|ray`),
  and in the publishing thread itself, its submits, put and delivery polls (`ray|publish|driver`:
  the runtime's "ray-publisher" thread; the platform's `ray_call_us` priced it at a third of what
  session 14's runs measured there), and the time between publishes (`ray|publish|interval`: the
  runtime's rule, PUBLISH_S or the delivery if longer; the runs sent 52-94 a second, not 100).
Not measured: an actor process waiting at its allowance (processes.py `_wait`: yields, then short
sleeps) takes only cycles nothing else wants; session 15's `ray|actor|wait` (its CPU per second
on an idle core, 0.22 cores on session 16's machine) charged as work under-predicted every plan
that fills the cores by 20-50%.
Tables in us ({"0": us}): per second (cores x 1e6) for `daemon` and `agent`, per
publish for `publish|interval`, per publish per agent for the others.
"""
from __future__ import annotations

import contextlib
import os
import time

import numpy as np

from pearl.schedule import AGENT_NAP_S, INLINE_WEIGHTS_BYTES, PUBLISH_S


# -- CPU accounting (--cpu, --accuracy, --calls): every thread of this process and of its
# descendants (Ray's GCS, raylets, their agents and workers, the node agents and their actor
# processes; the processes runtime's actors), from /proc/PID/task/TID/schedstat (ns on the CPU), by role.
def _processes() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line) of every process."""
    found = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as f:
                    parent = int(f.read().rpartition(b")")[2].split()[1])
                with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                    command = f.read().replace(b"\0", b" ").decode(errors="replace")
            except (OSError, IndexError, ValueError):
                continue
            found[int(entry.name)] = (parent, command)
    return found


def _role(command: str) -> str:
    if "actor_main" in command:
        return "actor processes"
    for key, role in (("ray::NodeAgent", "node agents"), ("ray::IdleAgent", "node agents"), ("ray::ReplayShard", "replay shards"),
                      ("gcs_server", "ray: gcs"), ("raylet", "ray: raylets"), ("dashboard", "ray: dashboard agents"),
                      ("DashboardAgent", "ray: dashboard agents"), ("runtime_env", "ray: runtime-env agents"),
                      ("RuntimeEnvAgent", "ray: runtime-env agents"), ("log_monitor", "ray: log monitors"),
                      ("monitor.py", "ray: monitor"), ("ray::", "ray: idle workers")):
        if key in command:
            return role
    return "other: " + command[:60]


def _maps_rings(pid: int) -> bool:
    """Whether the process maps a shared-memory ring (an actor process does; a resource tracker not)."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            return "/psm_" in f.read()
    except OSError:
        return False


def cpu_snapshot(threads: dict[int, str]) -> dict[tuple[int, int], tuple[str, int]]:
    """(pid, tid) -> (role, ns on the CPU) for this process (its threads by `threads`: native id ->
    role, the rest "driver: other threads") and every descendant."""
    root = os.getpid()
    table = _processes()
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in table.items():
        children.setdefault(parent, []).append(pid)
    tree, todo = [root], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            tree.append(child)
            todo.append(child)
    snapshot = {}
    for pid in tree:
        role = None if pid == root else _role(table[pid][1])
        if role is not None and role.startswith("other") and _maps_rings(pid):
            role = "actor processes"  # (one's /proc cmdline sometimes reads empty under a Ray worker)
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    ns = int(f.read().split()[0])
                with open(f"/proc/{pid}/task/{tid}/comm") as f:
                    zmq = f.read().startswith("ZMQbg")  # libzmq's I/O threads name themselves
            except (OSError, ValueError, IndexError):
                continue
            name = role or threads.get(int(tid), "driver: other threads (Ray core worker)")
            snapshot[pid, int(tid)] = (("driver" if role is None else role) + ": zmq I/O" if zmq else name, ns)
    return snapshot


def driver_threads() -> dict[int, str]:
    """This process's threads by role (cpu_snapshot's `threads`): the learner's, the replay server's, the publisher's."""
    import threading

    threads = {threading.main_thread().native_id: "driver: learner (main thread)"}
    names = {"replay-server": "driver: replay-server thread", "ray-publisher": "driver: publisher thread"}
    threads.update({t.native_id: names[t.name] for t in threading.enumerate() if t.name in names})
    return threads


# cpu_snapshot's roles as the ray model's sides (--accuracy); Ray's own processes are the rest
MODEL_ROLES = (("driver", "driver"), ("node agents", "agents"), ("replay shards", "servers"),
               ("actor processes", "actors"))


def model_role(role: str) -> str:
    return next((side for prefix, side in MODEL_ROLES if role.startswith(prefix)), "ray")


def cpu_delta(before: dict, after: dict) -> dict[str, float]:
    """Seconds on the CPU by role between two snapshots (threads born since count whole)."""
    spent: dict[str, float] = {}
    for key, (role, ns) in after.items():
        spent[role] = spent.get(role, 0.0) + (ns - before.get(key, (role, 0))[1]) * 1e-9
    return spent


def idle_cpu(seconds: float) -> dict[str, float]:
    """CPU per second by role with no run going: what the cluster's own processes cost at rest."""
    first = cpu_snapshot({})
    time.sleep(seconds)
    return {role: s / seconds for role, s in cpu_delta(first, cpu_snapshot({})).items()}




@contextlib.contextmanager
def local_cluster(nodes: int, store: int = 150 * 2**20):
    """A local Ray cluster of `nodes` nodes of 1 CPU each on 127.0.0.1, this process its driver."""
    from ray.cluster_utils import Cluster

    from pearl.runtime.ray import loopback_ray

    ray = loopback_ray()

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "node_ip_address": "127.0.0.1",
                                                            "object_store_memory": store, "include_dashboard": False})
    try:
        for _ in range(nodes - 1):
            cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1", object_store_memory=store)
        ray.init(address=cluster.address, _node_ip_address="127.0.0.1", log_to_driver=False)
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


class IdleAgent:
    """A node agent's Ray process without its work: its nap loop and its publish call's handling
    (pearl/runtime/node_agent.py NodeAgent.publish reads the weights the same way)."""

    def __init__(self):
        import threading

        self.napping = threading.Event()
        self.weights = None

    def ready(self) -> int:
        return os.getpid()

    def nap(self, seconds: float) -> None:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            time.sleep(AGENT_NAP_S)

    def publish(self, weights, epsilon: float) -> None:
        if isinstance(weights, bytes):
            weights = np.frombuffer(weights, np.float32)
        self.weights, self.epsilon = weights, epsilon


def _rates(first: dict, last: dict, seconds: float) -> dict[str, float]:
    """CPU us per second by side (model_role; the driver's main thread apart) between snapshots."""
    out: dict[str, float] = {}
    for role, spent in cpu_delta(first, last).items():
        side = "main" if role == "driver: main" else model_role(role)
        side = "ray" if side == "driver" else side  # the driver's other threads: Ray's core worker
        out[side] = out.get(side, 0.0) + 1e6 * spent / seconds
    return out


def ray_us(n_params: int, nodes: int = 3, seconds: float = 3.0, log=None) -> dict:
    """estimator/profile.py's RAY_TABLES (the module doc) for weights of `n_params` float32 numbers."""
    import threading

    import ray

    main = {threading.main_thread().native_id: "driver: main"}
    with local_cluster(nodes):
        agents = [ray.remote(IdleAgent).options(num_cpus=1, max_concurrency=4).remote() for _ in range(nodes)]
        ray.get([agent.ready.remote() for agent in agents])
        weights = np.zeros(n_params, np.float32)
        ray.get([agent.publish.remote(weights.tobytes(), 0.0) for agent in agents])  # the first call's set-up
        time.sleep(1.0)
        s0 = cpu_snapshot(main)
        time.sleep(seconds)
        rest = _rates(s0, cpu_snapshot(main), seconds)
        naps = [agent.nap.remote(2 * seconds + 2.0) for agent in agents]
        time.sleep(1.0)
        s0, t0 = cpu_snapshot(main), time.perf_counter()
        time.sleep(seconds)
        s1, t1 = cpu_snapshot(main), time.perf_counter()
        napping = _rates(s0, s1, t1 - t0)
        publishes, end = 0, t1 + seconds
        while time.perf_counter() < end:
            started = time.perf_counter()
            payload = weights.tobytes() if weights.nbytes <= INLINE_WEIGHTS_BYTES else ray.put(weights)
            busy = [agent.publish.remote(payload, 0.1) for agent in agents]
            while busy:
                busy = ray.wait(busy, num_returns=len(busy), timeout=0.05)[1]
            publishes += 1
            time.sleep(max(0.0, PUBLISH_S - (time.perf_counter() - started)))
        s2, t2 = cpu_snapshot(main), time.perf_counter()
        publishing = _rates(s1, s2, t2 - t1)
        ray.get(naps)
    per_publish = (t2 - t1) / (publishes * nodes)  # seconds of the phase per publish per agent
    out = {"ray|daemon": rest.get("ray", 0.0) / nodes,
           "ray|agent": napping.get("agents", 0.0) / nodes,
           "ray|publish|agent": max(0.0, publishing.get("agents", 0.0) - napping.get("agents", 0.0)) * per_publish,
           "ray|publish|ray": max(0.0, publishing.get("ray", 0.0) - napping.get("ray", 0.0)) * per_publish,
           "ray|publish|driver": max(0.0, publishing.get("main", 0.0) - napping.get("main", 0.0)) * per_publish,
           "ray|publish|interval": 1e6 * (t2 - t1) / publishes}
    if log:
        log(f"ray: {nodes} nodes, {publishes} publishes in {t2 - t1:.1f} s: " +
            ", ".join(f"{name} {us:.1f} us" for name, us in out.items()) + " (per second: daemon, agent; per publish "
            f"per agent: the others; load average {os.getloadavg()[0]:.1f})")
    return {name: {"0": round(us, 3)} for name, us in out.items()}
