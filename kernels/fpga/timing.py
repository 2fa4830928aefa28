"""Cycle model of the HLS kernels: cycles = (trip count - 1) x II + pipeline depth per pipelined
loop, with a DATAFLOW chain costing (trips - 1) x its largest II + the sum of its stage depths.

II and depth per loop come from hls/timing.json (declared next to the kernels, design estimates)
or, when Vitis HLS has been run, from its csynth report (`<kernel>_csynth.xml` in
$PEARL_HLS_REPORTS or hls/reports/), which then replaces the declared figures loop by loop.
Trip counts come from each call's shape (batch, tree depth, layer sizes), which is why the
report's static latency is not used directly: the kernels' loops have run-time bounds.
Everything here is a model; figures derived from it are simulated, never measured.
"""
from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path


@dataclass(frozen=True)
class LoopTiming:
    ii: int
    depth: int


class CsynthReportError(ValueError):
    pass


def _int(text: str | None) -> int | None:
    if text is None:
        return None
    text = text.strip()
    try:
        return int(text)
    except ValueError:
        return None  # "undef", "-" or a range: not a fixed figure


def parse_csynth_report(path: str | Path) -> dict:
    """The loops of a Vitis HLS csynth report (`syn/report/<top>_csynth.xml`).

    Returns {"top": name, "clock_ns": target period or None, "estimated_clock_ns": ...,
    "loops": {label: LoopTiming}}. A report lists each loop under
    PerformanceEstimates/SummaryOfLoopLatency as an element named after the loop label (nested
    loops inside it), with PipelineII and PipelineDepth children; loops without a fixed II
    (not pipelined) are skipped. A label seen more than once (one per template instance, e.g.
    one descend stage per tree level) keeps its largest II and depth.
    """
    path = Path(path)
    try:
        root = ET.parse(path).getroot()
    except (ET.ParseError, OSError) as err:
        raise CsynthReportError(f"{path}: not a readable csynth XML report ({err})") from None
    loops: dict[str, LoopTiming] = {}

    def visit(element):
        for child in element:
            ii = _int(child.findtext("PipelineII"))
            depth = _int(child.findtext("PipelineDepth"))
            if ii is not None and depth is not None and ii > 0:
                name = (child.findtext("Name") or child.tag).strip()
                old = loops.get(name)
                loops[name] = LoopTiming(max(ii, old.ii if old else 0), max(depth, old.depth if old else 0))
            visit(child)

    summaries = root.findall(".//SummaryOfLoopLatency")
    if not summaries:
        raise CsynthReportError(f"{path}: no SummaryOfLoopLatency section (is it a csynth.xml report?)")
    for summary in summaries:
        visit(summary)

    def number(tag):
        text = root.findtext(f".//{tag}")
        try:
            return float(text) if text is not None else None
        except ValueError:
            return None

    return {"top": (root.findtext(".//TopModelName") or "").strip() or None,
            "clock_ns": number("TargetClockPeriod"), "estimated_clock_ns": number("EstimatedClockPeriod"),
            "loops": loops}


def _hls_dir() -> Path:
    from pearl.hls import source_dir

    return source_dir()


def report_dirs() -> list[Path]:
    dirs = []
    if os.environ.get("PEARL_HLS_REPORTS"):
        dirs.append(Path(os.environ["PEARL_HLS_REPORTS"]))
    dirs.append(_hls_dir() / "reports")
    return dirs


class KernelTiming:
    """II and depth of every loop of one kernel, and where they came from."""

    def __init__(self, kernel: str, loops: dict[str, LoopTiming], control_cycles: int, source: str):
        self.kernel, self.loops, self.control_cycles, self.source = kernel, loops, control_cycles, source

    def loop(self, name: str, trips: int) -> int:
        """(trips - 1) x II + depth; nothing for a loop that does not run."""
        if trips <= 0:
            return 0
        t = self.loops[name]
        return (trips - 1) * t.ii + t.depth

    def dataflow(self, stages: list[str], trips: int) -> int:
        """A DATAFLOW chain of pipelined stages, each running `trips` iterations: the stages
        overlap, so the slowest II paces the chain and the depths add up."""
        if trips <= 0:
            return 0
        timings = [self.loops[s] for s in stages]
        return (trips - 1) * max(t.ii for t in timings) + sum(t.depth for t in timings)


@lru_cache(maxsize=None)
def _declared() -> dict:
    return json.loads((_hls_dir() / "timing.json").read_text())["kernels"]


def kernel_timing(kernel: str, report: str | Path | None = None) -> KernelTiming:
    """The timing table of `kernel`: declared, with every loop a csynth report names replaced by
    the report's figures (`report`, or <kernel>_csynth.xml in report_dirs())."""
    declared = _declared()
    if kernel not in declared:
        raise KeyError(f"no timing table for kernel {kernel!r} (hls/timing.json has {', '.join(declared)})")
    entry = declared[kernel]
    loops = {name: LoopTiming(int(v["ii"]), int(v["depth"])) for name, v in entry["loops"].items()}
    source = "declared in hls/timing.json (design estimates)"
    candidates = [Path(report)] if report is not None else [d / f"{kernel}_csynth.xml" for d in report_dirs()]
    for candidate in candidates:
        if candidate.is_file():
            parsed = parse_csynth_report(candidate)
            replaced = sorted(set(parsed["loops"]) & set(loops))
            loops.update({name: parsed["loops"][name] for name in replaced})
            source = f"csynth report {candidate} ({len(replaced)} of {len(loops)} loops)"
            break
    return KernelTiming(kernel, loops, int(entry.get("control_cycles", 0)), source)


# -- per-operation cycle counts ----------------------------------------------------------------
SUMTREE_OPS = {"clear": 0, "update": 1, "sample": 2, "find": 3, "get": 4, "root": 5, "info": 6}


def sumtree_cycles(timing: KernelTiming, op: str, n: int, fanout: int, depth: int) -> int:
    """Cycles of one `pearl_sumtree` call (hls/sumtree/sumtree_ops.h) on a batch of n."""
    cycles = timing.control_cycles
    if op == "clear":
        return cycles + sum(timing.loop("clear_level", fanout ** level) for level in range(depth + 1))
    if op == "update":
        stages = ["update_leaf"] + ["update_node"] * (depth - 1) + ["update_root"]
        return cycles + timing.loop("load_update", n) + timing.dataflow(stages, n)
    if op in ("sample", "find"):
        stages = ["make_prefix"] + ["descend_level"] * (depth - 1) + ["descend_leaf"]
        return cycles + timing.loop("load_values", n) + timing.dataflow(stages, n) + timing.loop("store_found", n)
    if op == "get":
        return cycles + timing.loop("load_get", n) + timing.loop("get_leaf", n) + timing.loop("store_get", n)
    if op in ("root", "info"):
        return cycles
    raise ValueError(f"unknown sum-tree operation {op!r}")


def mlp_forward_cycles(timing: KernelTiming, sizes: list[int], batch: int, load_weights: bool = True) -> int:
    """Cycles of one `pearl_mlp_forward` call: one output neuron per cycle per sample."""
    n_params = sum(i * o + o for i, o in zip(sizes[:-1], sizes[1:]))
    cycles = timing.control_cycles + (timing.loop("load_weights", n_params) if load_weights else 0)
    cycles += timing.loop("load_obs", batch * sizes[0])
    cycles += sum(timing.loop("forward_neuron", batch * o) for o in sizes[1:])
    return cycles + timing.loop("store_q", batch * sizes[-1])


def mlp_train_step_cycles(timing: KernelTiming, sizes: list[int], batch: int) -> int:
    """Cycles of one `pearl_mlp_train_step` call (hls/mlp/mlp_train.cpp)."""
    n_params = sum(i * o + o for i, o in zip(sizes[:-1], sizes[1:]))
    cycles = timing.control_cycles + timing.loop("load_weights", 3 * n_params)
    cycles += timing.loop("load_batch", batch * (sizes[0] + 3))
    cycles += sum(timing.loop("forward_neuron", batch * o) for o in sizes[1:])
    cycles += timing.loop("output_grad", batch)
    for layer, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        cycles += timing.loop("grad_weight", n_out * (n_in + 1))
        if layer:
            cycles += timing.loop("backward_input", batch * n_in)
    cycles += timing.loop("grad_norm", n_params) + timing.loop("adam", n_params)
    return cycles + timing.loop("store_weights", 3 * n_params)
