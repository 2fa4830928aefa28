"""The FPGA timing model (hls/timing.json, csynth report override), the estimator's FPGA task
costs, and the platform profiles' loader."""
from __future__ import annotations

import json

import pytest

from pearl.errors import ConfigError
from pearl.estimator.fpga import task_cost
from pearl.kernels.fpga import timing
from pearl.platforms import available_platforms, load_platform

# A csynth report in the layout Vitis HLS writes to <solution>/syn/report/<top>_csynth.xml
# (trimmed to the parts the parser reads): loops are elements named after their labels, nested
# under PerformanceEstimates/SummaryOfLoopLatency, with TripCount, Latency, PipelineII and
# PipelineDepth; one template instance per tree level repeats a label.
CSYNTH = """<?xml version="1.0" encoding="UTF-8"?>
<profile>
  <ReportVersion><Version>2023.2</Version></ReportVersion>
  <UserAssignments>
    <Part>xcu250-figd2104-2L-e</Part>
    <TopModelName>pearl_sumtree</TopModelName>
    <TargetClockPeriod>3.33</TargetClockPeriod>
  </UserAssignments>
  <PerformanceEstimates>
    <SummaryOfTimingAnalysis><EstimatedClockPeriod>2.915</EstimatedClockPeriod></SummaryOfTimingAnalysis>
    <SummaryOfOverallLatency>
      <Best-caseLatency>3</Best-caseLatency><Worst-caseLatency>undef</Worst-caseLatency>
    </SummaryOfOverallLatency>
    <SummaryOfLoopLatency>
      <load_values>
        <TripCount><range><min>1</min><max>4096</max></range></TripCount>
        <Latency>2 ~ 4097</Latency><PipelineII>1</PipelineII><PipelineDepth>9</PipelineDepth>
      </load_values>
      <descend_level>
        <TripCount>4096</TripCount><Latency>4160</Latency>
        <PipelineII>2</PipelineII><PipelineDepth>64</PipelineDepth>
      </descend_level>
      <descend_level>
        <TripCount>4096</TripCount><Latency>4170</Latency>
        <PipelineII>2</PipelineII><PipelineDepth>75</PipelineDepth>
      </descend_level>
      <clear_outer>
        <TripCount>16</TripCount><Latency>undef</Latency>
        <PipelineII>undef</PipelineII><PipelineDepth>undef</PipelineDepth>
        <clear_level>
          <TripCount>65536</TripCount><PipelineII>1</PipelineII><PipelineDepth>3</PipelineDepth>
        </clear_level>
      </clear_outer>
    </SummaryOfLoopLatency>
  </PerformanceEstimates>
  <AreaEstimates><Resources><DSP>120</DSP><URAM>96</URAM></Resources></AreaEstimates>
</profile>
"""


def declared(kernel):
    from pearl.hls import source_dir

    return json.loads((source_dir() / "timing.json").read_text())["kernels"][kernel]


def test_cycles_follow_the_pipeline_formula():
    t = timing.kernel_timing("pearl_sumtree")
    table = declared("pearl_sumtree")["loops"]
    ii, dep = (lambda name: table[name]["ii"]), (lambda name: table[name]["depth"])
    n, depth = 64, 5
    stages = ["make_prefix"] + ["descend_level"] * (depth - 1) + ["descend_leaf"]
    expected = (declared("pearl_sumtree")["control_cycles"]
                + (n - 1) * ii("load_values") + dep("load_values")
                + (n - 1) * max(ii(s) for s in stages) + sum(dep(s) for s in stages)
                + (n - 1) * ii("store_found") + dep("store_found"))
    assert timing.sumtree_cycles(t, "sample", n, 16, depth) == expected
    # a dataflow chain: each extra member costs one II per pipelined section, not a whole descent
    extra = timing.sumtree_cycles(t, "sample", n + 1, 16, depth) - timing.sumtree_cycles(t, "sample", n, 16, depth)
    assert extra == ii("load_values") + max(ii(s) for s in stages) + ii("store_found")
    assert t.loop("get_leaf", 0) == 0
    assert "declared" in t.source


def test_csynth_report_replaces_declared_figures(tmp_path, monkeypatch):
    report = tmp_path / "pearl_sumtree_csynth.xml"
    report.write_text(CSYNTH)
    parsed = timing.parse_csynth_report(report)
    assert parsed["top"] == "pearl_sumtree" and parsed["clock_ns"] == pytest.approx(3.33)
    assert parsed["estimated_clock_ns"] == pytest.approx(2.915)
    loops = parsed["loops"]
    assert loops["load_values"] == timing.LoopTiming(1, 9)
    assert loops["descend_level"] == timing.LoopTiming(2, 75)  # the worse of the two instances
    assert loops["clear_level"] == timing.LoopTiming(1, 3)  # nested loop found
    assert "clear_outer" not in loops  # not pipelined: no fixed II
    monkeypatch.setenv("PEARL_HLS_REPORTS", str(tmp_path))
    t = timing.kernel_timing("pearl_sumtree")
    assert "csynth report" in t.source and t.loops["descend_level"] == timing.LoopTiming(2, 75)
    assert t.loops["update_leaf"] == timing.LoopTiming(**{k: declared("pearl_sumtree")["loops"]["update_leaf"][k]
                                                          for k in ("ii", "depth")})
    slower = timing.sumtree_cycles(t, "sample", 256, 16, 5)
    monkeypatch.delenv("PEARL_HLS_REPORTS")
    assert slower > timing.sumtree_cycles(timing.kernel_timing("pearl_sumtree"), "sample", 256, 16, 5)


def test_bad_csynth_report_is_one_line(tmp_path):
    bad = tmp_path / "x_csynth.xml"
    bad.write_text("<profile><PerformanceEstimates></profile>")
    with pytest.raises(timing.CsynthReportError, match="not a readable csynth XML"):
        timing.parse_csynth_report(bad)
    bad.write_text("<profile/>")
    with pytest.raises(timing.CsynthReportError, match="no SummaryOfLoopLatency"):
        timing.parse_csynth_report(bad)


def test_task_costs_on_the_platforms():
    u250, zcu = load_platform("alveo_u250"), load_platform("zcu104")
    sample = task_cost("sample", u250, batch=64, capacity=100_000)
    link = u250.link("cpu", "fpga:0")
    device = u250.device("fpga:0")
    assert sample.simulated and sample.cycles > 0
    assert sample.kernel_s == pytest.approx(sample.cycles / 300e6)
    assert sample.transfer_s == pytest.approx(link.transfer_s(64 * 8) + link.transfer_s(64 * 16))
    assert sample.seconds == pytest.approx(sample.kernel_s + sample.transfer_s + link.launch_us * 1e-6)
    assert sample.energy_j == pytest.approx(device.static_w * sample.seconds + device.dynamic_w * sample.kernel_s)
    assert device.static_w < sample.power_w < device.power_w(1.0)
    assert task_cost("sample", zcu, batch=64).kernel_s > sample.kernel_s  # 200 vs 300 MHz
    assert task_cost("sample", u250, batch=256).kernel_s > sample.kernel_s
    insert = task_cost("insert", u250, envs=1)
    assert insert.kernel_s < task_cost("update_priorities", u250, batch=64).kernel_s
    sizes = [4, 64, 64, 2]
    for task in ("act", "learn", "sync_weights"):
        assert task_cost(task, u250, sizes=sizes).seconds > 0
    assert task_cost("learn", u250, sizes=sizes, batch=64).cycles > task_cost("act", u250, sizes=sizes).cycles
    with pytest.raises(ValueError, match="layer sizes"):
        task_cost("act", u250)


def test_shipped_profiles_load_and_cite_sources():
    from pearl.platforms import __file__ as where
    from pathlib import Path

    assert {"alveo_u250", "zcu104"} <= set(available_platforms())
    for name in available_platforms():
        platform = load_platform(name)
        if not platform.has_device("fpga:0"):  # CPU / GPU profiles (tests/test_platform*.py)
            continue
        fpga = platform.device("fpga:0")
        assert fpga.clock_mhz > 0 and fpga.driver in ("xrt", "pynq")
        text = (Path(where).parent / f"{name}.yaml").read_text()
        assert "Sources:" in text and "assumed" in text  # every unsourced figure says so


@pytest.mark.parametrize("body,message", [
    ("name: x\ndevices: []\n", "devices: expected a non-empty list"),
    ("name: x\ndevices:\n  - {id: fpga:0, kind: fpga, name: F, driver: xrt}\n", "devices[0].clock_mhz: missing"),
    ("name: x\ndevices:\n  - {id: fpga:0, kind: fpga, name: F, driver: xrt, clock_mhz: -3}\n",
     "devices[0].clock_mhz: expected a positive number"),
    ("name: x\ndevices:\n  - {id: fpga:0, kind: fpga, name: F, driver: opencl, clock_mhz: 3}\n",
     "devices[0].driver: expected one of xrt, pynq"),
    ("name: x\ndevices:\n  - {id: gpu:0, kind: fpga, name: F, driver: xrt, clock_mhz: 3}\n", "devices[0].id"),
    ("name: x\nlinks: 3\ncolour: red\n", "colour: unknown key"),
    ("name: x\ndevices:\n  - {id: fpga:0, kind: fpga, name: F, driver: xrt, clock_mhz: 3}\n"
     "links:\n  - {between: [cpu, fpga:9], kind: pcie, bandwidth_gb_s: 1, latency_us: 1}\n", "links[0].between"),
])
def test_bad_profiles_name_file_and_field(tmp_path, body, message):
    path = tmp_path / "board.yaml"
    path.write_text(body)
    with pytest.raises(ConfigError) as err:
        load_platform(path)
    assert str(path) in str(err.value) and message in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="no such profile"):
        load_platform("u9000")
