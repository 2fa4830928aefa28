"""Replay server benchmark: PEARL's replay server (pearl/server) vs Ray actor calls, one run.

    python benchmarks/replay_server.py ingest  [--rows 2000000] [--chunk 1000] [--repeats 3]
    python benchmarks/replay_server.py latency [--capacity 1000000] [--rounds 3000] [--repeats 3]
    python benchmarks/replay_server.py reverb  [--reverb-python /tmp/reverb-venv/bin/python]
    python benchmarks/replay_server.py all

ingest: 2 writer processes each send --rows CartPole-size transitions (obs 4 float32, int64
  action, reward, next obs, discount: 48 bytes) in chunks of --chunk rows to a uniform table,
  as fast as the protocol lets them, each side at its best measured setting (PEARL: `pearl
  replay-server` process, warm, ReplayClient writers with --window 16 chunks in flight, an ack
  asked for every 8th; Ray: one actor holding the same PEARL UniformReplay, warmed with one chunk,
  2 Ray writer actors calling `table.add.remote(chunk)` - the chunk's 5 arrays as one tuple
  argument - with --ray-window 64 calls in flight, the same chunks). Transitions/s = all rows /
  (last writer done - start signal).
latency: a prioritized table of --capacity rows on a `pearl replay-server` process; the learner
  (this process) samples 256 and sends the previous batch's |TD|: piggybacked (UPDATE_SAMPLE, one
  round trip) and separate (UPDATE then SAMPLE, two), alternating blocks of 250 rounds; per-round
  p50/p99 and the learner's total replay communication time per round; the same on a Ray actor
  (update.remote + sample.remote); the in-process table (no network) as the floor, and the
  server's request handling called in-process (no socket). --spins d/d,0/0,50/50: one server per
  (server spin_us / learner spin_us) configuration, their blocks interleaved (d: the shipped
  default, not passed; @curve: CURVE-authenticated and encrypted loopback TCP, @ipc: plaintext
  over a Unix socket in a private temp dir, else plaintext loopback TCP; the server's CPU per step
  from /proc/PID/task/*/schedstat).
Every run prints the CPU model and `uptime` first. Servers bind 127.0.0.1.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from pearl.kernels.cpu.backend import cpu_model  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
BATCH = 256
WINDOW = 16  # PEARL writers' chunks in flight (ReplayClient window=; an ack asked for every 8th)
# Ray writers' calls in flight, each carrying one chunk as one tuple argument: Ray's best measured
# form (session 10, 50k-row runs under load 13-15: one tuple, 64 in flight 134-156k transitions/s;
# one tuple, 16: 90-151k; five array arguments, 16: 93-127k, 64: 81-147k; ray.put of each chunk
# first, 16: 37k)
RAY_WINDOW = 64
# a Ray instance of our own (address="local"), its files apart: another Ray on the machine is
# neither joined nor made the machine's "current cluster"
RAY_TEMP = "/tmp/ray-pearl-replay-bench"




def header() -> None:
    uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(f"# CPU: {cpu_model()} x {os.cpu_count()} | python {platform.python_version()} | {uptime}")


def chunks(seed: int, rows: int, chunk: int):
    rng = np.random.default_rng(seed)
    out = []
    for start in range(0, rows, chunk):
        n = min(chunk, rows - start)
        obs = rng.normal(size=(n, 4)).astype(np.float32)
        out.append((obs, rng.integers(0, 2, n).astype(np.int64), rng.normal(size=n).astype(np.float32),
                    rng.normal(size=(n, 4)).astype(np.float32), np.full(n, 0.99, np.float32)))
    return out


def start_server(*args: str, keys: dict | None = None, bind: str = "tcp://127.0.0.1:0"):
    """A `pearl replay-server` process at `bind` (default a free loopback port): plaintext, or
    CURVE with keys["server"] (a NAME.key_secret) and keys["allow"] (the client's public certificate)."""
    auth = ("--plaintext",) if keys is None else ("--server-key", str(keys["server"]), "--allow", str(keys["allow"]))
    process = subprocess.Popen([sys.executable, "-m", "pearl.server.cli", "--bind", bind,
                                *auth, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True, cwd=ROOT)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if "listening on" in line:
            return process, line.split("listening on ")[1].split()[0]
        if process.poll() is not None:
            break
    raise RuntimeError(f"replay server did not start: {process.stderr.read()}")


def stop(process) -> None:
    process.terminate()
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()


# ---- ingest ----------------------------------------------------------------------------------
def writer_main(address: str, writer: int, rows: int, chunk: int, window: int = WINDOW) -> None:
    """A writer process: build the chunks, say ready, wait for go, send all, flush, report."""
    from pearl.server.client import ReplayClient

    data = chunks(writer, rows, chunk)
    client = ReplayClient(address, writer=writer, window=window, timeout=60, retain=0)
    print("ready", flush=True)
    sys.stdin.readline()
    cpu = time.process_time()  # every thread of this process: Python and ZeroMQ's I/O thread
    for c in data:
        client.add(*c)
    client.flush()
    print(json.dumps({"done": time.time(), "rows": rows, "cpu": time.process_time() - cpu}), flush=True)
    client.close()


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds so far of process `pid`'s live threads by name (ZeroMQ's are "ZMQbg/..."), from
    /proc/PID/task/*/schedstat: ns, where /proc/PID/stat counts clock ticks (10 ms, i.e. 40 us
    per step over a 250-step block)."""
    out: dict[str, float] = {}
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            name = Path(f"/proc/{pid}/task/{task}/comm").read_text().strip()
            ns = int(Path(f"/proc/{pid}/task/{task}/schedstat").read_text().split()[0])
        except (FileNotFoundError, ProcessLookupError):  # the thread ended meanwhile
            continue
        out[name] = out.get(name, 0.0) + ns / 1e9
    return out


def process_cpu(pid: int) -> float:
    """CPU seconds (all live threads) of process `pid` so far."""
    return sum(thread_cpu(pid).values())


def pearl_ingest(rows: int, chunk: int, writers: int = 2, cpu: list | None = None, spin_us: float | None = None,
                 window: int = WINDOW) -> float:
    """Transitions/s; appends (writer CPU us per chunk, server CPU us per chunk) to `cpu`.
    `spin_us`: the server's (default: `pearl replay-server`'s)."""
    server, address = start_server("--capacity", str(writers * rows), "--kind", "uniform",
                                   *(() if spin_us is None else ("--spin-us", str(spin_us))))
    try:
        procs = [subprocess.Popen([sys.executable, __file__, "_writer", address, str(w + 1), str(rows), str(chunk),
                                   str(window)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
                 for w in range(writers)]
        for p in procs:
            assert p.stdout.readline().strip() == "ready"
        server_cpu = process_cpu(server.pid)
        start = time.time()
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        done = [json.loads(p.stdout.readline()) for p in procs]
        server_cpu = process_cpu(server.pid) - server_cpu
        for p in procs:
            p.wait(60)
        n_chunks = writers * -(-rows // chunk)
        if cpu is not None:
            cpu.append((1e6 * sum(d["cpu"] for d in done) / n_chunks, 1e6 * server_cpu / n_chunks))
        return writers * rows / (max(d["done"] for d in done) - start)
    finally:
        stop(server)


def ray_ingest(rows: int, chunk: int, writers: int = 2, window: int = RAY_WINDOW) -> float:
    import ray

    @ray.remote
    class Table:
        def __init__(self, capacity):
            from pearl.replay import UniformReplay

            self.table = UniformReplay(capacity, 4)

        def add(self, chunk):
            self.table.add(*chunk)

        def size(self):
            return self.table.size

    @ray.remote
    class Writer:  # a writer process: builds its chunks, then sends them when told
        def prepare(self, table, seed, rows, chunk, window):
            self.table, self.data, self.window = table, chunks(seed, rows, chunk), window

        def run(self):
            pending = []
            for c in self.data:
                pending.append(self.table.add.remote(c))
                if len(pending) >= self.window:
                    _, pending = ray.wait(pending, num_returns=1)
            ray.get(pending)
            return time.time()

    table = Table.remote(writers * rows + chunk)
    # one chunk before the clock starts: the actor's first add loads numba's target and kernels
    # (~0.7 s), as the PEARL server does at its start (ReplayService._warm)
    ray.get(table.add.remote(chunks(0, chunk, chunk)[0]))
    procs = [Writer.remote() for _ in range(writers)]
    ray.get([p.prepare.remote(table, w + 1, rows, chunk, window) for w, p in enumerate(procs)])
    start = time.time()
    ends = ray.get([p.run.remote() for p in procs], timeout=600)
    assert ray.get(table.size.remote()) == writers * rows + chunk
    for p in procs + [table]:
        ray.kill(p)
    return writers * rows / (max(ends) - start)


def ingest(args) -> None:
    print(f"## ingest: 2 writer processes x {args.rows} CartPole-size transitions, chunks of {args.chunk} rows")
    cpu = []
    ours = [pearl_ingest(args.rows, args.chunk, cpu=cpu, spin_us=args.ingest_spin_us, window=args.window)
            for _ in range(args.repeats)]
    print(f"pearl replay-server: {', '.join(f'{x / 1e6:.2f}M' for x in ours)} transitions/s; CPU per chunk "
          f"(all threads): writers {', '.join(f'{w:.0f}' for w, _ in cpu)} us, server "
          f"{', '.join(f'{v:.0f}' for _, v in cpu)} us", flush=True)
    theirs = []
    try:
        if args.skip_ray:
            raise ImportError("--skip-ray")
        import ray

        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        ray.init(address="local", num_cpus=3, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False,
                 _temp_dir=RAY_TEMP)
        # warm-up (worker start, imports) outside the timed runs
        ray_ingest(args.chunk * args.ray_window * 2, args.chunk, window=args.ray_window)
        theirs = [ray_ingest(max(args.chunk * 4, args.rows // args.ray_divisor), args.chunk, window=args.ray_window)
                  for _ in range(args.repeats)]
        ray.shutdown()
        print(f"ray {ray.__version__} actor calls: {', '.join(f'{x / 1e3:.1f}k' for x in theirs)} transitions/s")
    except ImportError as error:
        print(f"ray: not installed ({error})")
    if theirs:
        print(f"ratio pearl / ray (median of each): {np.median(ours) / np.median(theirs):.1f}x "
              f"(range {min(ours) / max(theirs):.1f}-{max(ours) / min(theirs):.1f}x)")


# ---- latency ---------------------------------------------------------------------------------
def fill_server(address: str, capacity: int, auth=None) -> None:
    from pearl.server.client import ReplayClient

    client = ReplayClient(address, auth, writer=1, window=WINDOW, timeout=120, retain=0)
    for c in chunks(0, capacity, 16384):
        client.add(*c)
    client.flush()
    client.close()


def rounds_remote(client, rounds: int, piggyback: bool, rng, cpu: list | None = None) -> np.ndarray:
    """Per round: the learner's replay communication time (sample + the previous update), us;
    appends the learner thread's CPU time per round (us; spinning included) to `cpu`."""
    client.piggyback = piggyback
    times = np.empty(rounds)
    batch = client.sample(BATCH)
    cpu0 = time.thread_time()
    for r in range(rounds):
        td = rng.exponential(size=BATCH).astype(np.float32)
        t0 = time.perf_counter_ns()
        client.update_priorities(batch.indices, td)
        batch = client.sample(BATCH)
        times[r] = time.perf_counter_ns() - t0
    if cpu is not None:
        cpu.append(1e6 * (time.thread_time() - cpu0) / rounds)
    client.flush_updates()
    return times / 1e3


def spin_configs(text: str) -> list[tuple[float | None, float | None, str]]:
    """'d/d,0/200,d/d@curve' -> [(server spin_us, learner spin_us, link), ...]; d (None): the
    shipped default, not passed (so the script also measures servers of older commits); link:
    tcp (plaintext loopback, the default), curve (CURVE-authenticated and encrypted loopback) or
    ipc (plaintext over a Unix socket in a private directory)."""
    out = []
    for part in text.split(","):
        part, _, link = part.partition("@")
        if link not in ("", "tcp", "curve", "ipc"):
            raise SystemExit(f"--spins: {link!r} after @ (tcp, curve or ipc)")
        server, _, client = part.partition("/")
        client = client or server
        out.append((*(None if v.strip() == "d" else float(v) for v in (server, client)), link or "tcp"))
    return out


def spin_text(spin: float | None) -> str:
    return "d" if spin is None else f"{spin:g}"


def curve_keys(directory: str) -> dict:
    """A server and a client CURVE key pair in `directory`: the server's start_server keys and the
    client's ClientAuth."""
    from pearl.server.client import ClientAuth
    from pearl.server.keys import generate

    server_public, server_secret = generate(directory, "server")
    client_public, client_secret = generate(directory, "client")
    return {"server": server_secret, "allow": client_public,
            "client": ClientAuth(plaintext=False, client_secret=str(client_secret), server_public=str(server_public))}


def handling_in_process(capacity: int, rounds: int, rng) -> np.ndarray:
    """ReplayService.handle of UPDATE_SAMPLE in this process, back to back (no socket, no
    wake-ups): what validation, packing and Python cost around the table's kernels."""
    from pearl.server.config import ServerConfig, TableConfig
    from pearl.server.service import ReplayService
    from pearl.server.wire import Header, Op, message_arrays, pack, unpack_header

    service = ReplayService(ServerConfig(table=TableConfig(kind="prioritized", capacity=capacity)))
    for c in chunks(0, capacity, 65536):
        service.table.add(*c)
    indices = rng.integers(0, capacity, BATCH)
    times = np.empty(rounds)
    for r in range(rounds + 200):
        td = rng.exponential(size=BATCH).astype(np.float32)
        frames = pack(Header(Op.UPDATE_SAMPLE, rows=BATCH, arg0=BATCH), [indices, td])
        t0 = time.perf_counter_ns()
        (_, reply), = service.handle(b"peer", frames)
        if r >= 200:
            times[r - 200] = (time.perf_counter_ns() - t0) / 1e3
        header, columns = unpack_header(reply[0])
        indices = message_arrays(reply, header, columns)[5].copy()
    return times


def latency(args) -> None:
    from pearl.server.client import ReplayClient

    configs = spin_configs(args.spins)
    print(f"## latency: prioritized table of {args.capacity} rows, sample {BATCH} + the previous batch's "
          f"priority update, per learner step; spin (server/learner us): {args.spins}")
    rng = np.random.default_rng(1)
    servers, clients = [], []
    keys_dir = tempfile.TemporaryDirectory(prefix="pearl-bench-")  # keys and ipc sockets, mode 0700
    keys = curve_keys(keys_dir.name) if any(link == "curve" for _, _, link in configs) else None
    try:
        for k, (server_spin, client_spin, link) in enumerate(configs):
            bind = f"ipc://{keys_dir.name}/server-{k}" if link == "ipc" else "tcp://127.0.0.1:0"
            server, address = start_server("--capacity", str(args.capacity), "--kind", "prioritized",
                                           *(() if server_spin is None else ("--spin-us", str(server_spin))),
                                           keys=keys if link == "curve" else None, bind=bind)
            servers.append(server)
            auth = keys["client"] if link == "curve" else None
            fill_server(address, args.capacity, auth)
            clients.append(ReplayClient(address, auth, timeout=60,
                                        **({} if client_spin is None else {"spin_us": client_spin})))
        for client in clients:
            rounds_remote(client, 300, True, rng)  # warm-up
        piggy = [[] for _ in configs]
        separate = [[] for _ in configs]
        cpu = [[] for _ in configs]  # the learner's CPU per piggybacked round
        server_cpu = [[] for _ in configs]  # the server process's (all threads) per piggybacked round
        server_io = [[] for _ in configs]  # of which its ZeroMQ I/O thread's
        block = 0
        for _ in range(args.repeats):
            for _ in range(args.rounds // 250):
                # interleaved A/B: every configuration in each block, the order rotating
                for k in range(len(configs)):
                    c = (k + block) % len(configs)
                    before = thread_cpu(servers[c].pid)
                    piggy[c].append(rounds_remote(clients[c], 250, True, rng, cpu[c]))
                    after = thread_cpu(servers[c].pid)
                    server_cpu[c].append(1e6 * (sum(after.values()) - sum(before.values())) / 250)
                    server_io[c].append(1e6 * (after.get("ZMQbg/IO/0", 0) - before.get("ZMQbg/IO/0", 0)) / 250)
                    separate[c].append(rounds_remote(clients[c], 250, False, rng))
                block += 1
        stats = [client.stats()["latency"] for client in clients]
        for client in clients:
            client.close()
    finally:
        for server in servers:
            stop(server)
        keys_dir.cleanup()
    from pearl.replay import PrioritizedReplay

    local = PrioritizedReplay(args.capacity, 4)
    for c in chunks(0, args.capacity, 65536):
        local.add(*c)
    floor = np.empty(2000)
    batch = local.sample(BATCH, rng)
    for r in range(len(floor)):
        td = rng.exponential(size=BATCH).astype(np.float32)
        t0 = time.perf_counter_ns()
        local.update_priorities(batch.indices, td)
        batch = local.sample(BATCH, rng)
        floor[r] = (time.perf_counter_ns() - t0) / 1e3
    del local
    handled = handling_in_process(args.capacity, 2000, rng)

    def row(name, t):
        print(f"{name:<52} p50 {np.percentile(t, 50):8.1f} us   p99 {np.percentile(t, 99):8.1f} us   "
              f"mean {t.mean():8.1f} us")

    for (server_spin, client_spin, link), p, q, st, used, used_server, used_io in zip(configs, piggy, separate, stats, cpu,
                                                                               server_cpu, server_io):
        p, q = np.concatenate(p), np.concatenate(q)
        spin = f"spin {spin_text(server_spin)}/{spin_text(client_spin)} us, {link}"
        row(f"pearl piggybacked (UPDATE_SAMPLE, 1 trip), {spin}", p)
        print(f"  CPU per piggybacked step (median of blocks): learner thread {np.median(used):.0f} us, "
              f"server process {np.median(used_server):.0f} us (its ZeroMQ I/O thread {np.median(used_io):.0f} us)")
        row(f"pearl separate (UPDATE + SAMPLE, 2 trips), {spin}", q)
        print(f"  piggybacked cuts the learner's replay communication time by "
              f"{100 * (1 - p.mean() / q.mean()):.0f}% (mean), {100 * (1 - np.median(p) / np.median(q)):.0f}% (p50)")
        print(f"  server-side handling: {json.dumps({k: v for k, v in st.items() if k in ('sample', 'update', 'update_sample')})}")
    row("in-process table, no network (the floor)", floor)
    row("in-process service.handle(UPDATE_SAMPLE), no socket", handled)
    if not args.skip_ray:
        ray_latency(args, rng)


def ray_latency(args, rng) -> None:
    try:
        import ray
    except ImportError as error:
        print(f"ray: not installed ({error})")
        return
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(address="local", num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False,
             _temp_dir=RAY_TEMP)

    @ray.remote
    class Table:
        def __init__(self, capacity):
            from pearl.replay import PrioritizedReplay

            self.table = PrioritizedReplay(capacity, 4)
            self.rng = np.random.default_rng(0)
            for c in chunks(0, capacity, 65536):
                self.table.add(*c)

        def sample(self, batch):
            b = self.table.sample(batch, self.rng)
            return b.obs, b.actions, b.rewards, b.next_obs, b.discounts, b.indices, b.weights

        def update(self, indices, td):
            self.table.update_priorities(indices, td)

        def update_sample(self, indices, td, batch):
            self.table.update_priorities(indices, td)
            return self.sample(batch)

    table = Table.remote(args.capacity)
    batch = ray.get(table.sample.remote(BATCH))
    times = np.empty(min(args.rounds, 2000))
    for r in range(len(times) + 200):
        td = rng.exponential(size=BATCH).astype(np.float32)
        t0 = time.perf_counter_ns()
        batch = ray.get(table.update_sample.remote(batch[5], td, BATCH))
        if r >= 200:
            times[r - 200] = (time.perf_counter_ns() - t0) / 1e3
    print(f"{'ray ' + ray.__version__ + ' actor update_sample (1 call)':<44} p50 {np.percentile(times, 50):8.1f} us   "
          f"p99 {np.percentile(times, 99):8.1f} us   mean {times.mean():8.1f} us")
    ray.shutdown()


# ---- Reverb (its own environment) -------------------------------------------------------------
# ---- image batches --------------------------------------------------------------------------
def image_rows(rng, rows: int, frames: bool, first: bool) -> tuple:
    """A chunk of Atari-sized rows: a frame table's step records of one stream (84 x 84 frames),
    or whole transitions of 4 x 84 x 84 stacks."""
    if frames:
        ids = np.zeros(rows, np.int64)
        ids[0] = ~0 if first else 0
        frame = rng.integers(0, 256, (rows, 84, 84), dtype=np.uint8)
        return (ids, frame, rng.integers(0, 4, rows), np.ones(rows, np.float32), frame, np.zeros(rows, bool),
                np.zeros(rows, bool))
    stack = rng.integers(0, 256, (rows, 4, 84, 84), dtype=np.uint8)
    return stack, rng.integers(0, 4, rows), np.ones(rows, np.float32), stack, np.full(rows, 0.99, np.float32)


def images(args) -> None:
    """Sample round trips of Atari batches from a `pearl replay-server` process over loopback TCP:
    whole 4 x 84 x 84 observations and a frame table's stacks, at each batch size; the tables
    hold --image-rows rows, the sampled batches are checked to be stacks of 84 x 84 uint8."""
    from pearl.server.client import ReplayClient

    rng = np.random.default_rng(0)
    batches = [int(b) for b in args.image_batches.split(",")]
    print(f"image batches: {args.image_rows} rows, batches {batches}, {args.repeats} rounds of {args.image_calls} "
          f"samples each (median us per sample; the server in a process of its own)")
    for label, frames, table in (("whole 4x84x84", False, ("--obs-shape", "4,84,84")),
                                 ("frame table 4 x 84x84", True, ("--obs-shape", "84,84", "--frame-stack", "4"))):
        process, address = start_server("--capacity", str(2 * args.image_rows), "--obs-dtype", "uint8", *table)
        try:
            writer, learner = ReplayClient(address, writer=1), ReplayClient(address)
            for start in range(0, args.image_rows, 100):
                writer.add(*image_rows(rng, 100, frames, start == 0))
            writer.flush()
            for batch in batches:
                medians = []
                for _ in range(args.repeats):
                    for _ in range(10):
                        learner.sample(batch)
                    times = []
                    for _ in range(args.image_calls):
                        start = time.perf_counter()
                        got = learner.sample(batch)
                        times.append(time.perf_counter() - start)
                    assert got.obs.shape == (batch, 4, 84, 84) and got.obs.dtype == np.uint8
                    medians.append(float(np.median(times)) * 1e6)
                server = learner.stats()["latency"]["sample"]
                print(f"  {label}, batch {batch}: sample round trip {', '.join(f'{m:.0f}' for m in medians)} us "
                      f"(server's handling p50 {server['p50_us']:.0f} us)", flush=True)
            writer.close()
            learner.close()
        finally:
            stop(process)


def run_reverb(python: str, *args: str) -> dict | None:
    """benchmarks/reverb_rival.py in the Reverb environment, inside a network namespace with only
    loopback when `unshare -n` works (Reverb's server listens on every interface)."""
    command = [python, str(ROOT / "benchmarks" / "reverb_rival.py"), *args]
    isolated = subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode == 0
    if isolated:
        command = ["unshare", "-n", "--", "sh", "-c", "ip link set lo up && exec " + " ".join(command)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        print(f"reverb failed: {done.stderr.strip().splitlines()[-1:] if done.stderr.strip() else done.returncode}")
        return None
    return json.loads(lines[-1])


def reverb(args) -> None:
    python = args.reverb_python
    if not python or not Path(python).exists():
        print(f"reverb: no environment at {python!r} (docs/BENCHMARKS.md: how to make one)")
        return
    print(f"## vs Reverb 0.14 (its own venv: {python}); items = single transitions, chunks of {args.chunk}")
    print(f"{'writers':>8} {'pearl inserts/s':>18} {'reverb inserts/s':>18} {'pearl / reverb':>15}")
    for writers in (1, 2, 4):
        ours = [pearl_ingest(args.rows // writers, args.chunk, writers) for _ in range(args.repeats)]
        theirs = [run_reverb(python, "ingest", "--writers", str(writers), "--rows", str(args.reverb_rows // writers),
                             "--chunk", str(args.chunk)) for _ in range(args.repeats)]
        theirs = [t["per_s"] for t in theirs if t]
        big = [run_reverb(python, "ingest", "--writers", str(writers), "--rows", str(args.rows // writers // 4),
                          "--chunk", str(args.chunk), "--item-rows", str(args.chunk)) for _ in range(args.repeats)]
        big = [t["per_s"] for t in big if t]
        ratio = f"{np.median(ours) / np.median(theirs):.1f}x" if theirs else "-"
        print(f"{writers:>8} {np.median(ours) / 1e3:>13.0f}k ({min(ours) / 1e3:.0f}-{max(ours) / 1e3:.0f}k) "
              f"{(np.median(theirs) / 1e3 if theirs else float('nan')):>10.1f}k "
              f"({(min(theirs) / 1e3 if theirs else 0):.1f}-{(max(theirs) / 1e3 if theirs else 0):.1f}k) {ratio:>8}"
              + (f"   reverb with {args.chunk}-transition items: {np.median(big) / 1e3:.0f}k "
                 f"({min(big) / 1e3:.0f}-{max(big) / 1e3:.0f}k) transitions/s" if big else ""), flush=True)
    result = run_reverb(python, "latency", "--capacity", str(args.capacity), "--rounds", str(min(args.rounds, 1000)))
    if result:
        print(f"reverb prioritized, {args.capacity} one-transition items, batch 256: "
              f"Client.sample p50 {result['sample_p50_us']:.0f} us (p99 {result['sample_p99_us']:.0f}); "
              f"mutate_priorities + Client.sample p50 {result['round_p50_us']:.0f} us; "
              f"TrajectoryDataset batch p50 {result['dataset_batch_p50_us']:.0f} us "
              f"(p99 {result['dataset_batch_p99_us']:.0f}); mutate_priorities + dataset batch p50 "
              f"{result['dataset_round_p50_us']:.0f} us (p99 {result['dataset_round_p99_us']:.0f}) "
              f"(pearl: the latency section)")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_writer":
        writer_main(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=["ingest", "latency", "reverb", "images", "all"])
    parser.add_argument("--reverb-python", default="/tmp/reverb-venv/bin/python",
                        help="python of the Reverb environment (TensorFlow 2.15 + dm-reverb 0.14)")
    parser.add_argument("--reverb-rows", type=int, default=200_000, help="rows over all Reverb writers")
    parser.add_argument("--rows", type=int, default=2_000_000, help="rows per writer (ingest)")
    parser.add_argument("--chunk", type=int, default=1000)
    parser.add_argument("--ray-divisor", type=int, default=10, help="Ray writers send rows / this (it is slower)")
    parser.add_argument("--capacity", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-ray", action="store_true", help="without the Ray actor comparison")
    parser.add_argument("--window", type=int, default=WINDOW, help="ingest: PEARL writers' chunks in flight")
    parser.add_argument("--ray-window", type=int, default=RAY_WINDOW, help="ingest: Ray writers' calls in flight")
    parser.add_argument("--ingest-spin-us", type=float, help="ingest: the server's spin_us (default: the CLI's)")
    parser.add_argument("--spins", default="d/d",
                        help="latency: server/learner spin_us configurations, interleaved, e.g. d/d,0/0,0/200,d/d@curve "
                             "(d: the shipped default; @curve: CURVE over loopback TCP, @ipc: a Unix socket; "
                             "else plaintext loopback TCP)")
    parser.add_argument("--image-rows", type=int, default=4000, help="images: rows in each table")
    parser.add_argument("--image-batches", default="32,256", help="images: batch sizes")
    parser.add_argument("--image-calls", type=int, default=200, help="images: timed samples per round")
    args = parser.parse_args()
    header()
    if args.what in ("ingest", "all"):
        ingest(args)
    if args.what in ("latency", "all"):
        latency(args)
    if args.what in ("reverb", "all"):
        reverb(args)
    if args.what in ("images", "all"):
        images(args)


if __name__ == "__main__":
    main()
