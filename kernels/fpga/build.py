"""C-simulation builds of the HLS kernels: g++ compiles the kernel sources (the same files Vitis
HLS synthesizes) into a shared library or a testbench executable, lazily and cached.

Cache: $PEARL_HLS_CACHE, else $XDG_CACHE_HOME/pearl/hls, else ~/.cache/pearl/hls. The file name
carries a hash of the compiler, the flags, the defines and every source and header of the
kernel, so an edit to any of them builds afresh; a build goes to a temporary file renamed into
place, so concurrent builders never see half a library.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path

from pearl.errors import PearlError

# -ffp-contract=off: no fused multiply-adds, so float results do not depend on the host's FMA
# support and float64 sums keep numpy's rounding; -Wno-unknown-pragmas: g++ ignores #pragma HLS.
CXXFLAGS = ("-O2", "-std=c++14", "-ffp-contract=off", "-Wno-unknown-pragmas", "-Wno-unused-label",
            "-Wno-maybe-uninitialized")


class CompilerMissing(PearlError, RuntimeError):
    """No C++ compiler on this machine: the FPGA simulation cannot run (the CLI prints one line)."""


def hls_dir() -> Path:
    from pearl.hls import source_dir

    return source_dir()


@lru_cache(maxsize=None)
def compiler() -> tuple[str, str]:
    """(path, version line) of $CXX, g++ or c++."""
    for name in (os.environ.get("CXX"), "g++", "c++"):
        if name and shutil.which(name):
            path = shutil.which(name)
            try:
                version = subprocess.run([path, "--version"], capture_output=True, text=True,
                                         timeout=30).stdout.splitlines()[0]
            except (OSError, subprocess.SubprocessError, IndexError):
                continue
            return path, version
    raise CompilerMissing("no C++ compiler found (set CXX or install g++): the FPGA simulation "
                          "backend compiles the HLS kernels with it")


def available() -> bool:
    try:
        compiler()
        return True
    except CompilerMissing:
        return False


def cache_dir() -> Path:
    explicit = os.environ.get("PEARL_HLS_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "pearl" / "hls"


def _kernel_files(kernel: str) -> list[Path]:
    root = hls_dir()
    files = sorted((root / kernel).glob("*.[ch]*")) + sorted((root / "include").glob("*.h"))
    return [f for f in files if f.suffix in (".h", ".cpp")]


def build(kernel: str, sources: list[str], defines: dict[str, object] | None = None,
          shared: bool = True) -> Path:
    """The cached build of hls/`kernel`/`sources` with `defines` (-DNAME=value; value None for a
    bare -DNAME): a shared library, or an executable when `shared` is false."""
    cxx, version = compiler()
    root = hls_dir()
    flags = [*CXXFLAGS, *(["-shared", "-fPIC"] if shared else []),
             f"-I{root / 'include'}", f"-I{root / kernel}"]
    flags += [f"-D{k}" if v is None else f"-D{k}={v}" for k, v in sorted((defines or {}).items())]
    digest = hashlib.sha256()
    digest.update("\0".join([version, *flags, *sources]).encode())
    for path in _kernel_files(kernel):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    stem = "-".join([kernel, *(s.rsplit(".", 1)[0] for s in sources)])
    target = cache_dir() / f"{stem}-{digest.hexdigest()[:20]}{'.so' if shared else ''}"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    os.close(fd)
    try:
        command = [cxx, *flags, *(str(root / kernel / s) for s in sources), "-o", tmp]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"C-simulation build of hls/{kernel} failed:\n{' '.join(command)}\n"
                               f"{result.stderr[-4000:]}")
        os.chmod(tmp, 0o755)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target
