"""benchmarks/e2e_atari.py's options (the benchmark itself runs minutes: not a test)."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import e2e_atari  # noqa: E402


def test_omp_wait_policy_option():
    assert e2e_atari.parse_args([]).omp_wait_policy is None  # the environment's, as before
    args = e2e_atari.parse_args(["--threads", "2", "--omp-wait-policy", "passive"])
    assert (args.threads, args.omp_wait_policy) == (2, "passive")
    with pytest.raises(SystemExit):
        e2e_atari.parse_args(["--omp-wait-policy", "spin"])
