"""Power sensors: energy counters this machine exposes, read around a measured run.

Every watt the estimator predicts is modelled (estimator/model.py: idle + dynamic x utilisation
from a platform file's figures). A watt is "measured" only when one of these counters read it:
- Linux powercap RAPL (`/sys/class/powercap/intel-rapl:N/energy_uj`, the CPU packages; AMD's
  RAPL appears under the same name): microjoules since boot, wrapping at `max_energy_range_uj`.
  Only the packages are summed: their subzones (`intel-rapl:N:M`, core / uncore / dram) are
  parts of them, and `intel-rapl-mmio` repeats a package's counter. A package counter counts
  everything running on it, other processes included (on a shared machine, their load too).
- NVML (`pynvml`, when installed and a driver answers): each NVIDIA GPU's total energy in mJ.

`PEARL_POWERCAP_ROOT` points the RAPL reader at another tree (the tests' fake counters).
A machine with none of these (a VM, like this project's 2-core one) has no sensor: its figures
stay labelled modelled.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

POWERCAP_ROOT_ENV = "PEARL_POWERCAP_ROOT"
POWERCAP_ROOT = "/sys/class/powercap"
_PACKAGE_ZONE = re.compile(r"^intel-rapl:\d+$")


@dataclass(frozen=True)
class Counter:
    """One energy counter: `read()` gives joules since an arbitrary origin; `wrap_j` is where it
    rolls over to 0 (0: never)."""

    name: str
    path: Path | None = None  # RAPL: the energy_uj file
    wrap_j: float = 0.0
    nvml_index: int = -1

    def read(self) -> float:
        if self.path is not None:
            return int(self.path.read_text().strip()) * 1e-6
        import pynvml

        return pynvml.nvmlDeviceGetTotalEnergyConsumption(pynvml.nvmlDeviceGetHandleByIndex(self.nvml_index)) * 1e-3

    def joules_between(self, before: float, after: float) -> float:
        """Energy between two reads, allowing for one wrap of the counter."""
        delta = after - before
        return delta + self.wrap_j if delta < 0 and self.wrap_j else delta


def rapl_counters(root: str | Path | None = None) -> list[Counter]:
    """The RAPL package counters under `root` (default $PEARL_POWERCAP_ROOT or /sys/class/powercap)
    that this process can read."""
    base = Path(root or os.environ.get(POWERCAP_ROOT_ENV) or POWERCAP_ROOT)
    out = []
    if not base.is_dir():
        return out
    for zone in sorted(base.iterdir()):
        energy = zone / "energy_uj"
        if not _PACKAGE_ZONE.match(zone.name) or not energy.is_file():
            continue
        try:
            int(energy.read_text().strip())  # unreadable without privileges on recent kernels
            name = (zone / "name").read_text().strip() if (zone / "name").is_file() else zone.name
            wrap = zone / "max_energy_range_uj"
            wrap_j = int(wrap.read_text().strip()) * 1e-6 if wrap.is_file() else 0.0
        except (OSError, ValueError):
            continue
        out.append(Counter(f"rapl {name}", path=energy, wrap_j=wrap_j))
    return out


def nvml_counters() -> list[Counter]:
    """One counter per NVIDIA GPU whose driver reports total energy (pynvml installed), else none."""
    try:
        import pynvml

        pynvml.nvmlInit()
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            counter = Counter(f"nvml gpu{i}", nvml_index=i)
            counter.read()  # GPUs before Volta have no energy counter: this raises
            out.append(counter)
        return out
    except Exception:  # no module, no driver, no GPU, no counter: no sensor, whatever the reason
        return []


class Sensors:
    """The counters of this machine, read together: `read()` a snapshot, `joules_since(snapshot)`
    the energy every counter saw since, summed."""

    def __init__(self, counters: list[Counter]):
        self.counters = counters

    @classmethod
    def here(cls, root: str | Path | None = None) -> Sensors:
        return cls(rapl_counters(root) + nvml_counters())

    def __bool__(self) -> bool:
        return bool(self.counters)

    @property
    def source(self) -> str:
        """What read the power, for a label: e.g. "rapl package-0 + nvml gpu0"."""
        return " + ".join(c.name for c in self.counters)

    def read(self) -> list[float]:
        return [c.read() for c in self.counters]

    def joules_since(self, snapshot: list[float]) -> float:
        return sum(c.joules_between(b, a) for c, b, a in zip(self.counters, snapshot, self.read()))
