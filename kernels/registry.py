"""The backend registry: one Backend per device kind (cpu, cuda, opencl, fpga, ...), each a
subpackage of pearl.kernels that registers itself, found by kind. Device ids are parsed here once:
`kind:index[@platform]` (`cpu` alone is `cpu:0`).

Imports nothing of pearl's but its errors.
"""
from __future__ import annotations

from dataclasses import dataclass

from pearl.errors import ConfigError


@dataclass(frozen=True)
class DeviceId:
    kind: str
    index: int = 0
    platform: str = ""

    def __str__(self) -> str:
        text = self.kind if self.kind == "cpu" and not self.index else f"{self.kind}:{self.index}"
        return f"{text}@{self.platform}" if self.platform else text


def parse_device(text, field: str = "device") -> DeviceId:
    """'cpu', 'cuda', 'cuda:1', 'opencl:0', 'fpga:0@zcu104' -> DeviceId; anything else is a one-line
    ConfigError naming `field`."""
    if not isinstance(text, str) or not text:
        raise ConfigError(f"{field}: expected a device like cpu, cuda:0, opencl:0 or fpga:0, got {text!r}")
    spec, _, platform = text.partition("@")
    kind, colon, index = spec.partition(":")
    if not kind.isidentifier() or (colon and not index.isdigit()) or (platform and not platform.strip()):
        raise ConfigError(f"{field}: expected a device like cpu, cuda:0, opencl:0 or fpga:0, got {text!r}")
    if kind not in known_kinds():
        raise ConfigError(f"{field}: expected a device like cpu, cuda:0, opencl:0 or fpga:0, got {text!r} "
                          f"(device kinds: {', '.join(known_kinds())})")
    return DeviceId(kind, int(index) if colon else 0, platform)


def known_kinds() -> tuple[str, ...]:
    return ("cpu", "cuda", "opencl", "fpga")
