"""hls/ as a vendor project: `make csim` builds and passes, the Vitis targets expand to the
documented v++ / vitis_hls command lines, and the side tables (timing.json, connectivity.cfg)
agree with the kernel sources and the drivers' signatures."""
from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

from pearl.hls import source_dir
from pearl.kernels.fpga import build
from pearl.kernels.fpga.kernels import POINTER, SIGNATURES

HLS = source_dir()
needs_make = pytest.mark.skipif(shutil.which("make") is None or not build.available(),
                                reason="needs make and a C++ compiler")


@needs_make
def test_make_csim_builds_and_passes_every_testbench(tmp_path):
    result = subprocess.run(["make", "-C", str(HLS), "csim", f"BUILD={tmp_path}"], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert result.stdout.count("PASS") == 3


@needs_make
@pytest.mark.parametrize("target", ["sw_emu", "hw_emu", "hw"])
def test_vitis_targets_expand_to_v_plus_plus(target):
    """A dry run (make -n): the commands an engineer with Vitis gets, unchanged."""
    result = subprocess.run(["make", "-C", str(HLS), "-n", "xclbin", f"TARGET={target}", "BUILD=/tmp/pearl-dry"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.replace("\\\n", " ").splitlines()  # join continued lines
    compiles = [line for line in lines if line.strip().startswith("v++ -c")]
    assert len(compiles) == len(SIGNATURES)
    for kernel in SIGNATURES:
        assert any(f"-k {kernel} " in line and f"-t {target} " in line and
                   "--platform xilinx_u250_gen3x16_xdma_4_1_202210_1" in line for line in compiles)
    link = [line for line in lines if line.strip().startswith("v++ -l")]
    assert len(link) == 1 and "--config connectivity.cfg" in link[0] and "pearl.xclbin" in link[0]
    hls = subprocess.run(["make", "-C", str(HLS), "-n", "csynth"], capture_output=True, text=True, timeout=60)
    assert hls.stdout.count("vitis_hls -f scripts/hls.tcl") == len(SIGNATURES)


def test_connectivity_places_every_memory_argument():
    text = (HLS / "connectivity.cfg").read_text()
    placed = set(re.findall(r"^sp=(\w+)_1\.(\w+):DDR\[0\]$", text, re.M))
    expected = {(kernel, arg) for kernel, args in SIGNATURES.items() for arg, kind in args if kind == POINTER}
    assert placed == expected
    for kernel in SIGNATURES:
        assert f"nk={kernel}:1:{kernel}_1" in text


def test_timing_table_names_loops_of_the_sources():
    table = json.loads((HLS / "timing.json").read_text())["kernels"]
    sources = {"pearl_sumtree": "sumtree", "pearl_mlp_forward": "mlp", "pearl_mlp_train_step": "mlp"}
    for kernel, loops in table.items():
        text = "".join(p.read_text() for p in (HLS / sources[kernel]).glob("*.[ch]*") if "_tb" not in p.name)
        for loop in loops["loops"]:
            assert re.search(rf"^\s*{loop}:", text, re.M), f"{kernel}: no loop labelled {loop}"


def test_kernel_signatures_match_the_hls_tops():
    """The drivers' argument order is the C signature of each Vitis top."""
    tops = {"pearl_sumtree": "sumtree/sumtree.cpp", "pearl_mlp_forward": "mlp/mlp_forward.cpp",
            "pearl_mlp_train_step": "mlp/mlp_train.cpp"}
    for kernel, path in tops.items():
        text = (HLS / path).read_text()
        declaration = re.search(rf'extern "C" void {kernel}\(([^)]*)\)', text).group(1)
        names = [re.split(r"[\s*]+", part.strip())[-1] for part in declaration.split(",")]
        assert names == [arg for arg, _ in SIGNATURES[kernel]]
        for arg, kind in SIGNATURES[kernel]:
            mode = "m_axi" if kind == POINTER else "s_axilite"
            assert re.search(rf"INTERFACE mode = {mode} port = {arg}\b", text), (kernel, arg)


def test_operation_codes_agree_with_the_kernel():
    from pearl.kernels.fpga.timing import SUMTREE_OPS

    enum = re.search(r"enum Op \{([^}]*)\}", (HLS / "sumtree" / "sumtree.h").read_text()).group(1)
    codes = {name.strip()[3:].lower(): int(value) for name, value in
             (item.split("=") for item in enum.split(","))}
    assert codes == SUMTREE_OPS


def test_missing_compiler_is_a_one_line_user_error():
    from pearl.errors import PearlError

    assert issubclass(build.CompilerMissing, PearlError)
