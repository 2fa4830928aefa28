"""Which OpenCL devices count (kernels/opencl/devices.py): only those whose compiler builds a
kernel, numbered in the drivers' order, the others reported with the compiler's message. The
drivers are stand-ins here (a device that fails to build as PoCL 3.0 fails on a CPU newer than its
LLVM), so these run on every machine; tests/test_opencl_kernels.py runs the real devices."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from pearl import cli
from pearl.errors import ConfigError
from pearl.kernels.opencl import backend as opencl_backend
from pearl.kernels.opencl import devices, sumtree
from pearl.kernels.registry import parse_device

POCL_FAILURE = ("clBuildProgram failed: BUILD_PROGRAM_FAILURE - clBuildProgram failed: BUILD_PROGRAM_FAILURE\n\n"
                "Build on <pyopencl.Device 'pthread-AMD EPYC' on 'Portable Computing Language'>:\n\n"
                "error: unknown target CPU 'generic'\nDevice pthread-AMD EPYC failed to build the program\n")


class StubError(Exception):
    pass


class StubCL:
    """The part of pyopencl the discovery uses; `builds` counts each device's program builds."""
    Error = StubError
    device_type = SimpleNamespace(GPU=4)

    def __init__(self, platforms):
        self.platforms, self.builds = platforms, {}

    def get_platforms(self):
        return self.platforms

    def Context(self, chosen):
        return chosen

    def Program(self, context, source):
        assert "__kernel" in source
        (device,) = context
        stub = self

        class Program:
            def build(self):
                key = device.name.strip()
                stub.builds[key] = stub.builds.get(key, 0) + 1
                if device.fails:
                    raise StubError(POCL_FAILURE)
                return self

        return Program()


def device(name: str, fails: bool = False, pointer: int = 0):
    return SimpleNamespace(name=f" {name} ", fails=fails, int_ptr=pointer or id(name), type=2,
                           max_compute_units=2, global_mem_size=2**30)


@pytest.fixture
def drivers(monkeypatch):
    """Two platforms: the wheel's PoCL, whose device builds nothing, and one that works."""
    wheel = SimpleNamespace(name="Portable Computing Language (wheel)", devices=[device("pthread-AMD EPYC", True, 1)])
    distro = SimpleNamespace(name="Portable Computing Language", devices=[device("pthread-skylake-avx512", False, 2),
                                                                         device("second", False, 3)])
    for platform in (wheel, distro):
        platform.get_devices = lambda platform=platform: platform.devices
    stub = StubCL([wheel, distro])
    monkeypatch.setattr(devices, "cl", lambda: stub)
    monkeypatch.setattr(sumtree, "_cl", lambda: stub)
    monkeypatch.setattr(devices, "_PROBED", {})
    monkeypatch.delenv("PEARL_OPENCL_DEVICE", raising=False)
    return stub, wheel, distro


def test_only_devices_that_build_a_kernel_count_and_each_is_probed_once(drivers):
    stub, wheel, distro = drivers
    assert [d for _, d in devices.usable()] == distro.devices
    ((platform, bad, message),) = devices.unusable()
    assert platform is wheel and bad is wheel.devices[0]
    assert message == "error: unknown target CPU 'generic'"  # the compiler's line, not pyopencl's preamble
    devices.usable(), devices.unusable(), sumtree.available()
    assert stub.builds == {"pthread-AMD EPYC": 1, "pthread-skylake-avx512": 1, "second": 1}


def test_the_backend_numbers_the_usable_devices_and_names_the_others(drivers):
    backend = opencl_backend.OpenCLBackend()
    found = backend.detect()
    assert [(d["id"], d["name"]) for d in found] == [("opencl:0", "pthread-skylake-avx512"), ("opencl:1", "second")]
    backend.check(parse_device("opencl:1"))
    with pytest.raises(ConfigError, match=r"^plan.devices.sample: opencl:2: no such OpenCL device \(2 found"):
        backend.check(parse_device("opencl:2"), None, "plan.devices.sample")
    (skipped,) = backend.unusable()
    assert skipped["kind"] == "opencl" and skipped["name"] == "pthread-AMD EPYC"
    assert "unknown target CPU 'generic'" in skipped["reason"] and "\n" not in skipped["reason"]


def test_the_default_device_is_a_usable_one_and_a_named_unusable_one_is_refused(drivers, monkeypatch):
    _, wheel, distro = drivers
    assert sumtree._choose_device() is distro.devices[0]
    monkeypatch.setenv("PEARL_OPENCL_DEVICE", "0:0")
    with pytest.raises(RuntimeError, match=r"PEARL_OPENCL_DEVICE=0:0: pthread-AMD EPYC builds no kernel: "
                                           r"error: unknown target CPU 'generic'$"):
        sumtree._choose_device()
    monkeypatch.setenv("PEARL_OPENCL_DEVICE", "1:1")
    assert sumtree._choose_device() is distro.devices[1]


def test_no_usable_device_means_the_backend_is_unavailable(drivers):
    stub, wheel, distro = drivers
    stub.platforms = [wheel]
    assert not sumtree.available() and devices.usable() == [] and opencl_backend.OpenCLBackend().detect() == []
    with pytest.raises(RuntimeError, match="no usable OpenCL device"):
        sumtree._choose_device()


def test_pearl_devices_prints_an_unusable_device_with_the_compilers_message(drivers, capsys):
    assert cli.main(["devices"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("opencl:0") and "pthread-skylake-avx512" in line for line in lines)
    (unusable,) = [line for line in lines if line.startswith("(unusable)")]
    assert "pthread-AMD EPYC" in unusable and "its compiler builds no kernel: error: unknown target CPU 'generic'" in unusable


def test_every_real_device_counted_builds_the_probe():
    """On this machine's real drivers: what counts builds, what does not has a message."""
    pytest.importorskip("pyopencl")
    for _, real in devices.usable():
        assert devices.compile_error(real) is None
    for _, real, message in devices.unusable():
        assert message and "\n" not in message
