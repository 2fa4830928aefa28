"""Platform profiles, schema version 2: CPU, CUDA and OpenCL figures beside the FPGA's; every
shipped profile loads and cites its sources; a bad file fails in one line naming file and field."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from pearl.errors import ConfigError
from pearl.platforms import available_platforms, load_platform

CPU = ("  - {id: cpu, kind: cpu, name: C, cores: 4, clock_mhz: 3000, peak_gflops: 100, "
       "memory_bandwidth_gb_s: 50, power_w: {idle: 10, tdp: 65}}\n")
GPU = ("  - {id: cuda:0, kind: cuda, name: G, sms: 10, peak_gflops: 1000, memory_bandwidth_gb_s: 500, "
       "power_w: {idle: 20, tdp: 250}}\n")


def test_shipped_profiles_cover_the_issue_and_cite_every_figure():
    names = set(available_platforms())
    assert {"ci_2core", "workstation_a100", "h100_node", "alveo_u250", "cpu_gpu_fpga", "zcu104"} <= names
    here = Path(load_platform("ci_2core").source).parent
    for name in names:
        platform = load_platform(name)
        assert platform.host.kind == "cpu" and platform.host.cores >= 1
        text = (here / f"{name}.yaml").read_text()
        assert "Sources:" in text
        # Every numeric figure line carries a comment: a [source] or the word assumed.
        for line in text.splitlines():
            if re.match(r"\s*-?\s*[a-z_]+:\s*[0-9.]+\s*(#.*)?$", line) and "between" not in line:
                assert "#" in line, f"{name}: figure without a source: {line.strip()}"
        for device in platform.devices:
            if device.kind in ("cpu", "cuda"):
                assert device.peak_gflops > 0 and device.memory_bandwidth_gb_s > 0
                assert device.power_w(1.0) > device.power_w(0.0) > 0
            if device.id != "cpu" and not device.host:
                assert platform.link("cpu", device.id).bandwidth_gb_s > 0


def test_cpu_and_gpu_figures_and_power_from_idle_and_tdp(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("name: p\ndevices:\n" + CPU + GPU +
                    "links:\n  - {between: [cpu, cuda:0], kind: pcie, bandwidth_gb_s: 16, latency_us: 5}\n")
    platform = load_platform(path)
    gpu = platform.device("cuda:0")
    assert (gpu.sms, gpu.peak_gflops, gpu.memory_bandwidth_gb_s) == (10, 1000.0, 500.0)
    assert gpu.power_w(0.0) == 20 and gpu.power_w(1.0) == 250 and gpu.power_w(0.5) == 135
    assert platform.host.cores == 4
    assert platform.link("cuda:0", "cpu").transfer_s(16e9) == pytest.approx(1 + 5e-6)


def test_opencl_device_on_the_host_needs_no_power_of_its_own():
    ci = load_platform("ci_2core")
    ocl = ci.device("opencl:0")
    assert ocl.host == "cpu" and ocl.power_w(1.0) == 0 and ocl.launch_us > 0


def test_bitstream_path_resolves_against_the_profile(tmp_path):
    (tmp_path / "pearl.xclbin").write_bytes(b"\0")
    path = tmp_path / "b.yaml"
    path.write_text("name: b\ndevices:\n" + CPU + "  - {id: fpga:0, kind: fpga, name: F, driver: xrt, "
                    "clock_mhz: 300, bitstream: pearl.xclbin}\n")
    assert load_platform(path).device("fpga:0").bitstream == str(tmp_path / "pearl.xclbin")


@pytest.mark.parametrize("body,message", [
    # missing fields
    ("devices:\n" + CPU, "name: expected a non-empty string"),
    ("name: x\ndevices:\n  - {id: cpu, kind: cpu, name: C, clock_mhz: 3000, peak_gflops: 1, "
     "memory_bandwidth_gb_s: 1, power_w: {idle: 1, tdp: 2}}\n", "devices[0].cores: expected an integer >= 1"),
    ("name: x\ndevices:\n  - {id: cpu, kind: cpu, name: C, cores: 2, clock_mhz: 3000, "
     "memory_bandwidth_gb_s: 1, power_w: {idle: 1, tdp: 2}}\n", "devices[0].peak_gflops: missing"),
    ("name: x\ndevices:\n" + CPU + "  - {id: cuda:0, kind: cuda, name: G, sms: 10, peak_gflops: 1000, "
     "memory_bandwidth_gb_s: 500}\n", "devices[1].power_w.idle: missing"),
    ("name: x\ndevices:\n" + CPU.replace("name: C, ", ""), "devices[0].name: expected a non-empty string"),
    # negative or impossible figures
    ("name: x\ndevices:\n" + CPU.replace("memory_bandwidth_gb_s: 50", "memory_bandwidth_gb_s: -50"),
     "devices[0].memory_bandwidth_gb_s: expected a positive number"),
    ("name: x\ndevices:\n" + CPU + "links:\n  - {between: [cpu, cpu], kind: x, bandwidth_gb_s: -1, latency_us: 1}\n",
     "links[0].bandwidth_gb_s: expected a positive number"),
    ("name: x\ndevices:\n" + CPU + GPU + "links:\n  - {between: [cpu, cuda:0], kind: x, bandwidth_gb_s: 1, "
     "latency_us: -2}\n", "links[0].latency_us: expected a non-negative number"),
    ("name: x\ndevices:\n" + CPU.replace("tdp: 65", "tdp: 5"), "devices[0].power_w.tdp: 5 W is below the idle"),
    ("name: x\ndevices:\n" + GPU.replace("sms: 10", "sms: 0") + CPU, "devices[0].sms: expected an integer >= 1"),
    # unknown kinds and keys
    ("name: x\ndevices:\n  - {id: tpu:0, kind: tpu, name: T}\n", "devices[0].kind: expected one of cpu, cuda, fpga, opencl"),
    ("name: x\ndevices:\n" + CPU.replace("cores: 4", "cores: 4, hbm_gb_s: 3"), "devices[0].hbm_gb_s: unknown key for a cpu device"),
    ("name: x\ndevices:\n" + CPU.replace("idle: 10", "idle: 10, peak: 9"), "devices[0].power_w.peak: unknown key"),
    ("name: x\ndevices:\n" + CPU + CPU, "devices[1].id: cpu appears twice"),
    ("name: x\ndevices:\n" + GPU, "devices: expected a cpu device"),
    ("name: x\ndevices:\n" + CPU + "  - {id: opencl:0, kind: opencl, name: O, peak_gflops: 1, "
     "memory_bandwidth_gb_s: 1, host: gpu}\n", "devices[1].host: expected cpu"),
    # a bitstream that does not exist
    ("name: x\ndevices:\n" + CPU + "  - {id: fpga:0, kind: fpga, name: F, driver: xrt, clock_mhz: 300, "
     "bitstream: nowhere/pearl.xclbin}\n", "devices[1].bitstream:"),
    ("name: x\ndevices:\n" + CPU + GPU + "links:\n  - {between: [cpu, cuda:0], kind: a, bandwidth_gb_s: 1, latency_us: 1}\n"
     "  - {between: [cuda:0, cpu], kind: b, bandwidth_gb_s: 1, latency_us: 1}\n", "links[1].between: a second link"),
])
def test_bad_profiles_fail_in_one_line_naming_file_and_field(tmp_path, body, message):
    path = tmp_path / "bad.yaml"
    path.write_text(body)
    with pytest.raises(ConfigError) as err:
        load_platform(path)
    text = str(err.value)
    assert str(path) in text and message in text and "\n" not in text, text
