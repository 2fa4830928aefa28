"""`pearl devices --write FILE`: a draft profile of this machine that the schema accepts."""
from __future__ import annotations

import os

from pearl.cli import main
from pearl.platforms import load_platform


def test_devices_write_drafts_a_valid_profile_of_this_machine(tmp_path, capsys):
    path = tmp_path / "here.yaml"
    assert main(["devices", "--write", str(path)]) == 0
    platform = load_platform(path)
    assert platform.name == "here"
    assert platform.host.cores == len(os.sched_getaffinity(0))
    assert platform.host.peak_gflops > 0 and platform.host.clock_mhz > 0
    assert "assumed (draft)" in path.read_text()  # what was not measured says so


def test_devices_write_refuses_a_non_yaml_name_in_one_line(tmp_path, capsys):
    assert main(["devices", "--write", str(tmp_path / "here.txt")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "expected a .yaml file name" in err
    assert not (tmp_path / "here.txt").exists()
