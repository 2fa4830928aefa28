"""Platform profiles (platforms/*.yaml, packaged as `pearl.platforms`): the devices of a machine,
the links between them, power figures, each with its datasheet source. Schema: platforms/README.md.

`load_platform(name_or_path)` validates a profile; a mistake ends in a ConfigError naming the
file and the field.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from pearl.config import read_yaml
from pearl.errors import ConfigError
from pearl.kernels import registry

FPGA_DRIVERS = ("xrt", "pynq")

# Keys every device takes; the keys of each kind come from its backend (pearl.kernels.registry:
# `platform_keys`, `power_keys`), each validated by its name below. The analytic cost model needs
# the throughput figures (peak_gflops, memory_bandwidth_gb_s) of every device a plan may put a task
# on, so backends costed analytically require them; FPGA time comes from the HLS cycle model at
# clock_mhz, so the FPGA keeps the version-1 fields.
_COMMON_KEYS = {"id", "kind", "name", "power_w", "launch_us", "notes"}


@dataclass(frozen=True)
class Link:
    between: tuple[str, str]
    kind: str
    bandwidth_gb_s: float
    latency_us: float
    launch_us: float = 0.0

    def transfer_s(self, nbytes: float) -> float:
        """One transfer of `nbytes` over the link (0 bytes: no transfer, no cost)."""
        return 0.0 if nbytes <= 0 else self.latency_us * 1e-6 + nbytes / (self.bandwidth_gb_s * 1e9)


@dataclass(frozen=True)
class Device:
    id: str
    kind: str
    name: str
    clock_mhz: float = 0.0
    driver: str = ""
    part: str = ""
    vitis_platform: str = ""
    resources: dict = field(default_factory=dict)
    static_w: float = 0.0  # idle power (cpu/cuda: the datasheet idle figure)
    dynamic_w: float = 0.0  # added at full utilisation (cpu/cuda: TDP - idle)
    cores: int = 0  # cpu
    sms: int = 0  # cuda
    compute_units: int = 0  # opencl
    peak_gflops: float = 0.0  # float32, the whole device
    memory_bandwidth_gb_s: float = 0.0  # DRAM / HBM
    launch_us: float = 0.0  # fixed cost of one kernel call on the device (cuda launch, OpenCL enqueue)
    call_overhead_us: float = 0.0  # cpu: interpreter cost of one task call (Python + numpy dispatch)
    bitstream: str = ""  # fpga: the .xclbin / .bit, resolved against the profile's folder
    host: str = ""  # opencl: "cpu" when the OpenCL device is the host CPU (PoCL): its power is the cpu's

    def power_w(self, utilisation: float) -> float:
        """static + dynamic x utilisation (utilisation clipped to [0, 1])."""
        return self.static_w + self.dynamic_w * min(1.0, max(0.0, utilisation))


@dataclass(frozen=True)
class Nodes:
    """The nodes of a cluster that `runtime: ray` plans use beside the learner's node (the
    platform's devices): node agents and replay servers on nodes of their own. `cores`: each
    node's cores (Ray's num_cpus); `shared_cores`: when every node runs on one host (a local
    cluster, ray.cluster_utils.Cluster), the host's cores they all share with the learner, else 0;
    `link`: between two nodes (None: loopback, estimator/wire.py); the driver's time for one Ray
    actor call (`ray_call_us`), one `ray.put` of the weights (`ray_put_us`), one `ray.wait` on calls
    in flight (`ray_wait_us`), and a publish of the weights to one node agent until it has read
    them (`ray_publish_us`: a put, a call, the object's fetch); `daemon_cores`: the cores each node's Ray
    daemons (raylet, agents) keep busy."""

    count: int
    cores: int
    shared_cores: int = 0
    link: Link | None = None
    ray_call_us: float = 1.0
    ray_put_us: float = 1.0
    ray_wait_us: float = 1.0
    ray_publish_us: float = 1.0
    daemon_cores: float = 0.0


@dataclass(frozen=True)
class Platform:
    name: str
    description: str
    devices: tuple[Device, ...]
    links: tuple[Link, ...]
    source: str
    nodes: Nodes | None = None  # a cluster for runtime: ray (the `nodes:` section), or none

    def device(self, device_id: str) -> Device:
        for device in self.devices:
            if device.id == device_id:
                return device
        raise ConfigError(f"{self.source}: no device {device_id!r} (has {', '.join(d.id for d in self.devices)})")

    def has_device(self, device_id: str) -> bool:
        return any(device.id == device_id for device in self.devices)

    def link(self, a: str, b: str) -> Link:
        for link in self.links:
            if set(link.between) == {a, b}:
                return link
        raise ConfigError(f"{self.source}: no link between {a} and {b}")

    @property
    def host(self) -> Device:
        """The host CPU (the device `cpu` of every profile; Python and the environments run there)."""
        for device in self.devices:
            if device.kind == "cpu":
                return device
        raise ConfigError(f"{self.source}: no cpu device (every platform needs its host cpu)")


def available_platforms() -> list[str]:
    return sorted(p.stem for p in Path(str(resources.files(__name__))).glob("*.yaml"))


def _number(data: dict, key: str, at: str, positive: bool = True, default=None) -> float:
    if key not in data:
        if default is not None:
            return default
        raise ConfigError(f"{at}.{key}: missing (expected a number)")
    value = data[key]
    # NaN compares false with everything, so it is refused by name, as infinity is: no figure of a
    # device is unbounded, and either would make every plan's prediction NaN or 0
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
            or (positive and value <= 0) or value < 0):
        raise ConfigError(f"{at}.{key}: expected a {'positive' if positive else 'non-negative'} number, got {value!r}"
                          + (" (not finite)" if isinstance(value, float) and not math.isfinite(value) else ""))
    return float(value)


def _string(data: dict, key: str, at: str, default: str | None = None) -> str:
    value = data.get(key, default)
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{at}.{key}: expected a non-empty string, got {value!r}")
    return value


def _count(data: dict, key: str, at: str, default=None) -> int:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{at}.{key}: expected an integer >= 1, got {value!r}")
    return value


def _host(data: dict, key: str, at: str) -> str:
    host = data.get(key, "")
    if host not in ("", "cpu"):
        raise ConfigError(f"{at}.{key}: expected cpu (a device on the host CPU) or nothing, got {host!r}")
    return host


def _bitstream(data: dict, key: str, at: str, path: Path) -> str:
    bitstream = _string(data, key, at)
    resolved = Path(bitstream) if Path(bitstream).is_absolute() else path.parent / bitstream
    if not resolved.is_file():
        raise ConfigError(f"{at}.{key}: {resolved} does not exist (build it with hls/Makefile, "
                          f"or leave bitstream out to use PEARL_FPGA_BITSTREAM)")
    return str(resolved)


# How each device figure is read (key -> (data, at, path) -> value for the Device); a key without
# a rule is free-form (part, vitis_platform, resources, memory_gib: checked where used). clock_mhz,
# driver and power_w are read in load_platform.
_FIGURES = {
    "cores": lambda d, at, path: _count(d, "cores", at),
    "sms": lambda d, at, path: _count(d, "sms", at),
    "compute_units": lambda d, at, path: _count(d, "compute_units", at, default=1),
    "peak_gflops": lambda d, at, path: _number(d, "peak_gflops", at),
    "memory_bandwidth_gb_s": lambda d, at, path: _number(d, "memory_bandwidth_gb_s", at),
    "call_overhead_us": lambda d, at, path: _number(d, "call_overhead_us", at, positive=False, default=0.0),
    "host": lambda d, at, path: _host(d, "host", at),
    "bitstream": lambda d, at, path: _bitstream(d, "bitstream", at, path),
}
# Read even when absent (their default is not the Device's)
_DEFAULTED = {"compute_units", "call_overhead_us", "host"}


def _kind_figures(d: dict, keys: dict[str, bool], at: str, path: Path) -> dict:
    """The kind-specific figures of one device entry (`keys`: its backend's platform_keys), validated."""
    return {key: _FIGURES[key](d, at, path) for key, required in keys.items()
            if key in _FIGURES and (required or key in d or key in _DEFAULTED)}


def _power(power: dict, keys: tuple[str, str], at: str, required: bool) -> tuple[float, float]:
    """(static, dynamic) watts; datasheet (idle, tdp) figures become (idle, tdp - idle)."""
    low, high = keys
    for key in power:
        if key not in (low, high):
            raise ConfigError(f"{at}.power_w.{key}: unknown key (expected {low} and {high})")
    default = None if required else 0.0
    first = _number(power, low, f"{at}.power_w", positive=False, default=default)
    second = _number(power, high, f"{at}.power_w", positive=False, default=default)
    if (low, high) != ("idle", "tdp"):
        return first, second
    if second < first:
        raise ConfigError(f"{at}.power_w.tdp: {second:g} W is below the idle figure ({first:g} W)")
    return first, second - first


def load_platform(name_or_path: str | Path) -> Platform:
    """A shipped profile by name (`alveo_u250`, `zcu104`) or a YAML file path."""
    text = str(name_or_path)
    path = Path(text)
    if not text.endswith((".yaml", ".yml")) and not path.is_file():
        shipped = Path(str(resources.files(__name__))) / f"{text}.yaml"
        if not shipped.is_file():
            raise ConfigError(f"platform {text!r}: no such profile (shipped: {', '.join(available_platforms())}; "
                              f"or give a path to a .yaml file)")
        path = shipped
    source = str(path)
    data = read_yaml(path, "platform")
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping with name, devices and links")
    known = {"name", "description", "devices", "links", "nodes"}
    for key in data:
        if key not in known:
            raise ConfigError(f"{source}: {key}: unknown key (expected one of {', '.join(sorted(known))})")
    name = _string(data, "name", source)
    devices_data = data.get("devices")
    if not isinstance(devices_data, list) or not devices_data:
        raise ConfigError(f"{source}: devices: expected a non-empty list")
    devices = []
    for i, d in enumerate(devices_data):
        at = f"{source}: devices[{i}]"
        if not isinstance(d, dict):
            raise ConfigError(f"{at}: expected a mapping")
        kind = _string(d, "kind", at)
        if kind not in registry.kinds():
            raise ConfigError(f"{at}.kind: expected one of {', '.join(registry.kinds())}, got {kind!r}")
        backend = registry.backend(kind)
        device_id = _string(d, "id", at)
        if device_id.split(":")[0] != kind:
            raise ConfigError(f"{at}.id: expected '{kind}' or '{kind}:N' for a {kind} device, got {device_id!r}")
        unknown = set(d) - _COMMON_KEYS - set(backend.platform_keys)
        if unknown:
            raise ConfigError(f"{at}.{sorted(unknown)[0]}: unknown key for a {kind} device (expected one of "
                              f"{', '.join(sorted(_COMMON_KEYS | set(backend.platform_keys)))})")
        if device_id in {dev.id for dev in devices}:
            raise ConfigError(f"{at}.id: {device_id} appears twice")
        power = d.get("power_w", {})
        if not isinstance(power, dict):
            raise ConfigError(f"{at}.power_w: expected a mapping with {' and '.join(backend.power_keys)}")
        resources_ = d.get("resources", {})
        if not isinstance(resources_, dict):
            raise ConfigError(f"{at}.resources: expected a mapping")
        driver = d.get("driver", "")
        if "driver" in backend.platform_keys and driver not in FPGA_DRIVERS:
            raise ConfigError(f"{at}.driver: expected one of {', '.join(FPGA_DRIVERS)}, got {driver!r}")
        figures = _kind_figures(d, backend.platform_keys, at, path)
        static_w, dynamic_w = _power(power, backend.power_keys, at,
                                     required=backend.power_required and figures.get("host") != "cpu")
        devices.append(Device(
            id=device_id, kind=kind, name=_string(d, "name", at),
            clock_mhz=(_number(d, "clock_mhz", at) if backend.platform_keys.get("clock_mhz")
                       else _number(d, "clock_mhz", at, default=0.0, positive=False)),
            driver=driver, part=str(d.get("part", "")), vitis_platform=str(d.get("vitis_platform", "")),
            resources=dict(resources_), static_w=static_w, dynamic_w=dynamic_w,
            launch_us=_number(d, "launch_us", at, positive=False, default=0.0), **figures))
    if not any(dev.kind == "cpu" for dev in devices) and any(
            registry.backend(dev.kind).default_platform is None for dev in devices):
        # Version-1 FPGA profiles describe the board only (devices a profile names); devices
        # found on a machine run beside Python on a host.
        raise ConfigError(f"{source}: devices: expected a cpu device (the host that runs Python and the envs)")
    ids = {d.id for d in devices} | {"cpu"}
    links = []
    for i, link in enumerate(data.get("links") or []):
        at = f"{source}: links[{i}]"
        if not isinstance(link, dict):
            raise ConfigError(f"{at}: expected a mapping")
        between = link.get("between")
        if not isinstance(between, list) or len(between) != 2 or not all(b in ids for b in between):
            raise ConfigError(f"{at}.between: expected two device ids of this platform (or cpu), got {between!r}")
        if {tuple(sorted(between))} & {tuple(sorted(link_.between)) for link_ in links}:
            raise ConfigError(f"{at}.between: a second link between {between[0]} and {between[1]}")
        links.append(_link(link, tuple(between), at))
    return Platform(name=name, description=str(data.get("description", "")), devices=tuple(devices),
                    links=tuple(links), source=source,
                    nodes=_nodes(data["nodes"], f"{source}: nodes") if "nodes" in data else None)


def _link(link: dict, between: tuple, at: str) -> Link:
    return Link(between=between, kind=_string(link, "kind", at), bandwidth_gb_s=_number(link, "bandwidth_gb_s", at),
                latency_us=_number(link, "latency_us", at, positive=False),
                launch_us=_number(link, "launch_us", at, positive=False, default=0.0))


_NODE_KEYS = ("count", "cores", "shared_cores", "link", "ray_call_us", "ray_put_us", "ray_wait_us", "ray_publish_us",
              "daemon_cores", "notes")


def _nodes(data, at: str) -> Nodes:
    """The `nodes:` section (platforms/README.md), each field checked like a device's."""
    if not isinstance(data, dict):
        raise ConfigError(f"{at}: expected a mapping with count and cores")
    for key in data:
        if key not in _NODE_KEYS:
            raise ConfigError(f"{at}.{key}: unknown key (expected one of {', '.join(_NODE_KEYS)})")
    link = data.get("link")
    if link is not None:
        if not isinstance(link, dict):
            raise ConfigError(f"{at}.link: expected a mapping with kind, bandwidth_gb_s and latency_us")
        link = _link(link, ("node", "node"), f"{at}.link")
    shared = data.get("shared_cores", 0)
    nodes = Nodes(count=_count(data, "count", at), cores=_count(data, "cores", at),
                  shared_cores=_count(data, "shared_cores", at) if shared else 0, link=link,
                  **{key: _number(data, key, at) for key in ("ray_call_us", "ray_put_us", "ray_wait_us",
                                                             "ray_publish_us")},
                  daemon_cores=_number(data, "daemon_cores", at, positive=False, default=0.0))
    if nodes.shared_cores and nodes.daemon_cores * nodes.count >= nodes.shared_cores:
        raise ConfigError(f"{at}.daemon_cores: {nodes.count} nodes x {nodes.daemon_cores:g} cores leave none of the "
                          f"{nodes.shared_cores} shared cores")
    return nodes
