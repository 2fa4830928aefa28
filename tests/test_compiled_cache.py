"""numba's cache of the CPU kernels is one folder per version of all their sources
(kernels/cpu/__init__.py compiled_cache_folder): a change to any kernel file recompiles its callers."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from pearl.kernels import cpu
from pearl.kernels.cpu import compiled_cache_folder


def test_any_source_change_moves_the_folder(tmp_path):
    (tmp_path / "caller.py").write_text("def step(): return product()\n")
    (tmp_path / "callee.py").write_text("def product(): return 1\n")
    (tmp_path / "notes.txt").write_text("not a source")
    first = compiled_cache_folder(tmp_path)
    assert first.parent == tmp_path / "__pycache__" and compiled_cache_folder(tmp_path) == first
    (tmp_path / "notes.txt").write_text("changed, still not a source")
    assert compiled_cache_folder(tmp_path) == first
    (tmp_path / "callee.py").write_text("def product(): return 2\n")  # the callee alone
    second = compiled_cache_folder(tmp_path)
    assert second != first
    (tmp_path / "callee.py").rename(tmp_path / "other.py")  # same text, another module
    assert compiled_cache_folder(tmp_path) not in (first, second)


def run(code: str, **env) -> str:
    environment = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"} | env
    return subprocess.run([sys.executable, "-c", code], env=environment, capture_output=True, text=True,
                          check=True, timeout=120).stdout.strip()


def test_numba_caches_the_kernels_in_their_sources_folder_unless_told_otherwise(tmp_path):
    want = str(compiled_cache_folder(Path(cpu.__file__).parent))
    before = "import pearl.kernels.cpu, numba; print(numba.config.CACHE_DIR)"
    after = "import numba, pearl.kernels.cpu; print(numba.config.CACHE_DIR)"
    assert run(before) == want and run(after) == want
    assert run(before, NUMBA_CACHE_DIR=str(tmp_path)) == str(tmp_path)
    # a folder of ours inherited from a parent process that ran other sources: worked out again
    assert run(before, NUMBA_CACHE_DIR=str(Path(want).parent / "numba-0123456789abcdef")) == want
