"""The checkpoint file: arrays go to the file and come back without a copy of the file in memory (a
replay table of GBs is most of a checkpoint), big arrays mapped copy-on-write from the file, and
what is not a whole PEARL checkpoint refused without unpickling anything."""
import json
import tracemalloc
import zipfile

import numpy as np
import pytest

from pearl.checkpoint import MAPPED_BYTES, load_checkpoint, save_checkpoint
from pearl.errors import PearlError

BIG = 3 * 32 * 2**20  # bytes of arrays the memory tests write and read


def some_arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "replay.frames": rng.integers(0, 256, (300, 84, 84), dtype=np.uint8),  # mapped
        "replay.fortran": np.asfortranarray(rng.standard_normal((600, 300))),  # mapped, column order
        "replay.priorities": rng.random(50, dtype=np.float32),
        "replay.done": rng.random(MAPPED_BYTES + 7) < 0.5,  # mapped, an odd length
        "learner.step": np.array(12, np.int64),
        "replay.empty": np.zeros((0, 4), np.float32),
    }


def test_arrays_come_back_equal_and_big_ones_writable_without_changing_the_file(tmp_path):
    path, arrays = tmp_path / "checkpoint.npz", some_arrays()
    save_checkpoint(path, {"counters": {"env_steps": 5}}, arrays)
    header, loaded = load_checkpoint(path)
    assert header["counters"] == {"env_steps": 5} and header["format"].startswith("pearl-checkpoint/")
    assert loaded.keys() == arrays.keys()
    for name, value in arrays.items():
        got = loaded[name]
        assert type(got) is np.ndarray and got.dtype == value.dtype and got.shape == value.shape
        np.testing.assert_array_equal(got, value)
        assert got.flags.f_contiguous == value.flags.f_contiguous
        assert got.flags.writeable
    assert [name for name in loaded if isinstance(loaded[name].base, np.memmap)] == [
        "replay.frames", "replay.fortran", "replay.done"]  # mapped, the others read
    loaded["replay.frames"][...] = 0  # a restored table's own pages, never the file's
    _, again = load_checkpoint(path)
    np.testing.assert_array_equal(again["replay.frames"], arrays["replay.frames"])


def traced_peak(action) -> int:
    tracemalloc.start()
    try:
        action()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_neither_writing_nor_reading_holds_the_file_in_memory(tmp_path):
    path = tmp_path / "checkpoint.npz"
    arrays = {f"replay.part{i}": np.full(BIG // 3, i, np.uint8) for i in range(3)}
    written = traced_peak(lambda: save_checkpoint(path, {}, arrays))
    assert path.stat().st_size > BIG
    assert written < BIG / 2, f"{written / 2**20:.0f} MB held while writing {BIG / 2**20:.0f} MB"
    loaded = {}
    read = traced_peak(lambda: loaded.update(load_checkpoint(path)[1]))
    assert read < BIG / 4, f"{read / 2**20:.0f} MB held while reading {BIG / 2**20:.0f} MB"
    assert all((loaded[f"replay.part{i}"] == i).all() for i in range(3))


def test_a_compressed_npz_still_loads(tmp_path):
    path, arrays = tmp_path / "checkpoint.npz", some_arrays()
    header = np.frombuffer(json.dumps({"format": "pearl-checkpoint/1"}).encode(), np.uint8)
    np.savez_compressed(path, __header__=header, **arrays)
    _, loaded = load_checkpoint(path)
    for name, value in arrays.items():
        np.testing.assert_array_equal(loaded[name], value)


def rewrite_member(path, name: str, data: bytes) -> None:
    with zipfile.ZipFile(path) as source:
        members = {info.filename: source.read(info) for info in source.infolist()}
    members[name] = data
    with zipfile.ZipFile(path, "w") as target:
        for member, content in members.items():
            target.writestr(member, content)


def npy_bytes(array: np.ndarray, header: dict | None = None) -> bytes:
    import io

    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, header or np.lib.format.header_data_from_array_1_0(array))
    return buffer.getvalue() + (b"" if array.dtype.hasobject else array.tobytes())


@pytest.mark.parametrize("case, member", [
    ("a big member's header claims more rows than it holds",
     lambda a: npy_bytes(a, {"descr": "|u1", "fortran_order": False, "shape": (301, 84, 84)})),
    ("a big member's header claims fewer rows than it holds",
     lambda a: npy_bytes(a, {"descr": "|u1", "fortran_order": False, "shape": (299, 84, 84)})),
    ("a big member cut short", lambda a: npy_bytes(a)[:-1000]),
    ("a big member of Python objects", lambda a: npy_bytes(a, {"descr": "|O", "fortran_order": False,
                                                               "shape": (a.size // 8,)})),
])
def test_a_tampered_member_is_refused_in_one_line(tmp_path, case, member):
    path, arrays = tmp_path / "checkpoint.npz", some_arrays()
    save_checkpoint(path, {}, arrays)
    rewrite_member(path, "replay.frames.npy", member(arrays["replay.frames"]))
    with pytest.raises(PearlError, match=r"checkpoint.npz: not a PEARL checkpoint \(unreadable or truncated\)"):
        load_checkpoint(path)
