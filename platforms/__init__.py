"""Platform profiles (platforms/*.yaml, packaged as `pearl.platforms`): the devices of a machine,
the links between them, power figures, each with its datasheet source. Schema: platforms/README.md.

`load_platform(name_or_path)` validates a profile; a mistake ends in a ConfigError naming the
file and the field.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from pearl.config import read_yaml
from pearl.errors import ConfigError

DEVICE_KINDS = ("cpu", "cuda", "opencl", "fpga")
FPGA_DRIVERS = ("xrt", "pynq")


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
    static_w: float = 0.0
    dynamic_w: float = 0.0

    def power_w(self, utilisation: float) -> float:
        """static + dynamic x utilisation (utilisation clipped to [0, 1])."""
        return self.static_w + self.dynamic_w * min(1.0, max(0.0, utilisation))


@dataclass(frozen=True)
class Platform:
    name: str
    description: str
    devices: tuple[Device, ...]
    links: tuple[Link, ...]
    source: str

    def device(self, device_id: str) -> Device:
        for device in self.devices:
            if device.id == device_id:
                return device
        raise ConfigError(f"{self.source}: no device {device_id!r} (has {', '.join(d.id for d in self.devices)})")

    def link(self, a: str, b: str) -> Link:
        for link in self.links:
            if set(link.between) == {a, b}:
                return link
        raise ConfigError(f"{self.source}: no link between {a} and {b}")


def available_platforms() -> list[str]:
    return sorted(p.stem for p in Path(str(resources.files(__name__))).glob("*.yaml"))


def _number(data: dict, key: str, at: str, positive: bool = True, default=None) -> float:
    if key not in data:
        if default is not None:
            return default
        raise ConfigError(f"{at}.{key}: missing (expected a number)")
    value = data[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (positive and value <= 0) or value < 0:
        raise ConfigError(f"{at}.{key}: expected a {'positive' if positive else 'non-negative'} number, got {value!r}")
    return float(value)


def _string(data: dict, key: str, at: str, default: str | None = None) -> str:
    value = data.get(key, default)
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{at}.{key}: expected a non-empty string, got {value!r}")
    return value


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
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping with name, devices and links")
    known = {"name", "description", "devices", "links"}
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
        if kind not in DEVICE_KINDS:
            raise ConfigError(f"{at}.kind: expected one of {', '.join(DEVICE_KINDS)}, got {kind!r}")
        device_id = _string(d, "id", at)
        if device_id.split(":")[0] != kind:
            raise ConfigError(f"{at}.id: expected '{kind}' or '{kind}:N' for a {kind} device, got {device_id!r}")
        power = d.get("power_w", {})
        if not isinstance(power, dict):
            raise ConfigError(f"{at}.power_w: expected a mapping with static and dynamic")
        resources_ = d.get("resources", {})
        if not isinstance(resources_, dict):
            raise ConfigError(f"{at}.resources: expected a mapping")
        driver = d.get("driver", "")
        if kind == "fpga" and driver not in FPGA_DRIVERS:
            raise ConfigError(f"{at}.driver: expected one of {', '.join(FPGA_DRIVERS)}, got {driver!r}")
        devices.append(Device(
            id=device_id, kind=kind, name=_string(d, "name", at),
            clock_mhz=_number(d, "clock_mhz", at) if kind == "fpga" else _number(d, "clock_mhz", at, default=0.0, positive=False),
            driver=driver, part=str(d.get("part", "")), vitis_platform=str(d.get("vitis_platform", "")),
            resources=dict(resources_),
            static_w=_number(power, "static", f"{at}.power_w", positive=False, default=0.0),
            dynamic_w=_number(power, "dynamic", f"{at}.power_w", positive=False, default=0.0)))
    ids = {d.id for d in devices} | {"cpu"}
    links = []
    for i, link in enumerate(data.get("links") or []):
        at = f"{source}: links[{i}]"
        if not isinstance(link, dict):
            raise ConfigError(f"{at}: expected a mapping")
        between = link.get("between")
        if not isinstance(between, list) or len(between) != 2 or not all(b in ids for b in between):
            raise ConfigError(f"{at}.between: expected two device ids of this platform (or cpu), got {between!r}")
        links.append(Link(between=tuple(between), kind=_string(link, "kind", at),
                          bandwidth_gb_s=_number(link, "bandwidth_gb_s", at),
                          latency_us=_number(link, "latency_us", at, positive=False),
                          launch_us=_number(link, "launch_us", at, positive=False, default=0.0)))
    return Platform(name=name, description=str(data.get("description", "")), devices=tuple(devices),
                    links=tuple(links), source=source)
