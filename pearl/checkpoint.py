"""Checkpoints: one .npz file (no pickle) holding arrays plus a JSON header, written atomically."""
from __future__ import annotations

import dataclasses
import json
import threading
import zipfile
from pathlib import Path

import numpy as np

from pearl.config import ExperimentConfig, parse_config, read_yaml
from pearl.errors import ConfigError, PearlError
from pearl.io import atomic_write
from pearl.plan import Plan

FORMAT = "pearl-checkpoint/1"


def save_checkpoint(path: str | Path, header: dict, arrays: dict[str, np.ndarray], frames=None) -> None:
    """Streams the arrays into the file, uncompressed (`load_checkpoint` maps them), so a replay
    table of GBs is written without a copy of it in memory. `frames` (a frame table's
    FrameSnapshot, pearl/replay/frames.py, or a ray run's ShardFrames) is the replay's "frames"
    array, written block by block as the source gives them (`CheckpointThread`)."""
    header = np.frombuffer(json.dumps({"format": FORMAT, **header}).encode(), dtype=np.uint8)

    def write(handle) -> None:  # what np.savez writes, without pickles, the frames from their snapshot
        with zipfile.ZipFile(handle, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
            for name, values in {"__header__": header, **arrays}.items():
                with archive.open(name + ".npy", "w", force_zip64=True) as member:
                    np.lib.format.write_array(member, np.asanyarray(values), allow_pickle=False)
            if frames is not None:
                with archive.open("replay.frames.npy", "w", force_zip64=True) as member:
                    shape = (len(frames), *frames.row_shape)
                    np.lib.format.write_array_header_1_0(member, {
                        "descr": np.lib.format.dtype_to_descr(frames.dtype), "fortran_order": False,
                        "shape": shape})
                    for block in range(frames.blocks):
                        member.write(frames.block(block))

    try:
        atomic_write(path, write)
    finally:
        if frames is not None:  # (written or failed: the table's adds stop copying for it)
            frames.close()


class CheckpointThread(threading.Thread):
    """A run's checkpoint written while the run goes on (`start_checkpoint`); `finish` waits for
    it and raises what it failed with."""

    def __init__(self, path: Path, header: dict, arrays: dict[str, np.ndarray], frames):
        # not a daemon: a process that ends meanwhile finishes the file first
        super().__init__(name="pearl-checkpoint")
        self.error: BaseException | None = None
        self._write = lambda: save_checkpoint(path, header, arrays, frames)
        self.start()

    def run(self) -> None:
        try:
            self._write()
        except BaseException as error:
            self.error = error

    def finish(self) -> None:
        self.join()
        if self.error is not None:
            raise self.error


def start_checkpoint(path: str | Path, parts, counters) -> CheckpointThread | None:
    """A run's checkpoint of `parts` and `counters` as they are now, as save_checkpoint(path,
    *agent_state(...)) writes it. With a frame table (pearl/replay/frames.py; a ray run's on its
    shards, pearl/runtime/ray_replay.py) all but its frames is copied now (the learner's state,
    ~15 bytes a record of the table's) and a thread writes the file, the frames block by block
    from its `snapshot` while the run adds records: a run paused while a 1M-record Atari table
    (6.6 GB) was written (11-15 s) goes on. Any other table is written at once (its rows are
    views of the table: returns None)."""
    snapshot = getattr(parts.replay, "snapshot", None)
    if snapshot is None:
        save_checkpoint(path, *agent_state(parts, counters))
        return None
    # (before the counters, which a ray run's snapshot raises to the env steps its shards hold)
    state, frames = snapshot()
    try:
        # (a learner's state is a copy, pearl/contracts.py: its updates meanwhile leave it alone)
        return CheckpointThread(Path(path), *_agent_state(parts, counters, state), frames)
    except BaseException:
        frames.close()
        raise


def load_checkpoint(path: str | Path) -> tuple[dict, dict[str, np.ndarray]]:
    path = Path(path)
    if not path.is_file():
        raise PearlError(f"{path}: no such checkpoint file")
    try:
        arrays = _read_arrays(path)
        header = json.loads(arrays.pop("__header__").tobytes().decode())
    except (zipfile.BadZipFile, ValueError, KeyError, OSError, EOFError):
        raise PearlError(f"{path}: not a PEARL checkpoint (unreadable or truncated)") from None
    if not isinstance(header, dict):
        raise PearlError(f"{path}: not a PEARL checkpoint (its header is no mapping)")
    if header.get("format") != FORMAT:
        raise PearlError(f"{path}: checkpoint format {header.get('format')!r}, expected {FORMAT!r}")
    return header, arrays


MAPPED_BYTES = 1 << 20  # arrays this big or bigger are mapped from the file rather than read


def _read_arrays(path: Path) -> dict[str, np.ndarray]:
    """The .npz file's arrays (never unpickled). A big one stored uncompressed is mapped
    copy-on-write from the file: resuming a run whose replay table takes most of the memory must
    not need a second copy of the table; the mapped pages are the page cache's, given back under
    pressure, and whoever writes to such an array writes to its own copy of the pages written."""
    arrays = {}
    with open(path, "rb") as handle, zipfile.ZipFile(handle) as archive:
        for member in archive.infolist():
            name = member.filename.removesuffix(".npy")
            mapped = member.compress_type == zipfile.ZIP_STORED and member.file_size >= MAPPED_BYTES
            arrays[name] = (_mapped_member(handle, member) if mapped else
                            np.lib.format.read_array(archive.open(member), allow_pickle=False))
    return arrays


def _mapped_member(handle, member: zipfile.ZipInfo) -> np.ndarray:
    handle.seek(member.header_offset)
    local = handle.read(30)  # a zip local file header: its name and extra field come before the data
    if len(local) != 30 or local[:4] != b"PK\x03\x04":
        raise ValueError(f"{member.filename}: no local file header")
    start = member.header_offset + 30 + int.from_bytes(local[26:28], "little") + int.from_bytes(local[28:30], "little")
    handle.seek(start)
    version = np.lib.format.read_magic(handle)
    read_header = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
    if version not in read_header:
        raise ValueError(f"{member.filename}: .npy format {version}")
    shape, fortran_order, dtype = read_header[version](handle)
    if dtype.hasobject:
        raise ValueError(f"{member.filename}: an object array (would need unpickling)")
    offset = handle.tell()
    if offset - start + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize != member.file_size:
        raise ValueError(f"{member.filename}: its size does not match its header")
    # mapped from the file opened (not its path, which a new checkpoint may have replaced since)
    return np.memmap(handle, dtype, "c", offset, shape, "F" if fortran_order else "C").view(np.ndarray)


def check_header(path: str | Path, header: dict) -> None:
    """The header's sections are there with the right types, before anything is built from it."""
    for section in ("config", "plan", "learner", "replay", "counters"):
        if section == "replay" and section not in header:  # saved without the replay contents
            continue
        if not isinstance(header.get(section), dict):
            raise PearlError(f"{path}: header.{section}: missing or not a mapping (not a complete PEARL checkpoint)")
    schedule = header.get("schedule", {"learning_starts": 0, "updates_before": 0})
    if not isinstance(schedule, dict) or schedule.keys() != {"learning_starts", "updates_before"}:
        raise PearlError(f"{path}: header.schedule: expected a mapping of learning_starts and updates_before")
    for name, value in schedule.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise PearlError(f"{path}: header.schedule.{name}: expected an integer >= 0, got {value!r}")
    for name in ("env_steps", "updates", "episodes"):
        value = header["counters"].get(name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise PearlError(f"{path}: header.counters.{name}: expected an integer >= 0, got {value!r}")
    rng = header.get("rng")  # checkpoints from before RNG states were saved have none
    if rng is not None and not (isinstance(rng, dict) and _is_generator_state(rng.get("agent"))
                                and (rng.get("actor") is None or _is_generator_state(rng["actor"]))):
        raise PearlError(f"{path}: header.rng: expected the agent's and the actor's random generator states")


def _is_generator_state(state) -> bool:
    try:
        np.random.default_rng().bit_generator.state = state
    except (TypeError, ValueError, KeyError):
        return False
    return True


def check_state(path: str | Path, prefix: str, plain: dict, arrays: dict[str, np.ndarray], expected: dict,
                max_rows: int) -> None:
    """A saved state (`split_state`'s parts under `prefix`) has the keys, value types, array dtypes and
    shapes of `expected`, the state of the part the checkpoint's config builds. An array empty in
    `expected` along its first axis (a fresh replay's contents) may hold up to `max_rows` rows."""
    want_plain, want_arrays = split_state(prefix, expected)
    _check_plain(path, prefix, plain, want_plain)
    mine = {name: value for name, value in arrays.items() if name.startswith(prefix + ".")}
    for name in sorted(set(want_arrays) | set(mine)):
        if name not in mine or name not in want_arrays:
            raise PearlError(f"{path}: {name}: {'missing' if name not in mine else 'unexpected'} array "
                             f"(the checkpoint does not match its config)")
        got, want = mine[name], want_arrays[name]
        rows_free = want.ndim > 0 and want.shape[0] == 0
        same_shape = (got.shape[1:] == want.shape[1:] and got.ndim == want.ndim and got.shape[0] <= max_rows
                      if rows_free else got.shape == want.shape)
        if got.dtype != want.dtype or not same_shape:
            shape = ("(N" + "".join(f", {d}" for d in want.shape[1:]) + ")") if rows_free else str(want.shape)
            raise PearlError(f"{path}: {name}: expected {want.dtype} {shape}, got {got.dtype} {got.shape} "
                             f"(the checkpoint does not match its config)")


def _check_plain(path, at: str, value, want) -> None:
    if isinstance(want, dict):
        if not isinstance(value, dict):
            raise PearlError(f"{path}: header.{at}: expected a mapping, got {value!r}")
        for key in want.keys() - value.keys():
            raise PearlError(f"{path}: header.{at}.{key}: missing")
        for key in want:
            _check_plain(path, f"{at}.{key}", value[key], want[key])
    elif isinstance(want, bool) or isinstance(want, (int, float)):
        kinds = (bool,) if isinstance(want, bool) else (int,) if isinstance(want, int) else (int, float)
        if isinstance(value, bool) != isinstance(want, bool) or not isinstance(value, kinds):
            raise PearlError(f"{path}: header.{at}: expected {type(want).__name__}, got {value!r}")
    elif isinstance(want, str) and not isinstance(value, str):
        raise PearlError(f"{path}: header.{at}: expected a string, got {value!r}")


def split_state(prefix: str, state: dict) -> tuple[dict, dict[str, np.ndarray]]:
    """A nested state dict -> (its JSON-able part, its arrays keyed 'prefix.path.to.array')."""
    plain, arrays = {}, {}
    for key, value in state.items():
        name = f"{prefix}.{key}"
        if isinstance(value, np.ndarray):
            arrays[name] = value
        elif isinstance(value, dict):
            plain[key], inner = split_state(name, value)
            arrays.update(inner)
        else:
            plain[key] = value.item() if isinstance(value, np.generic) else value
    return plain, arrays


def join_state(prefix: str, plain: dict, arrays: dict[str, np.ndarray]) -> dict:
    """The inverse of `split_state`."""
    state = {key: join_state(f"{prefix}.{key}", value, arrays) if isinstance(value, dict) else value
             for key, value in plain.items()}
    start = prefix + "."
    for name, value in arrays.items():
        if name.startswith(start) and "." not in name[len(start):]:
            state[name[len(start):]] = value
    return state


# -- an agent's checkpoint: its parts' state and its counters ----------------------------------------
def agent_state(parts, counters, replay: bool = True) -> tuple[dict, dict[str, np.ndarray]]:
    """(header, arrays) of a run (pearl.build.Parts and its Counters), as save_checkpoint takes them;
    without the replay contents unless `replay` (an agent restored from such a file starts with an
    empty table: `restore_state`)."""
    # the replay's state before the counters: a ray run's (pearl/runtime/ray.py _CheckpointView)
    # counts the env steps its shards' tables hold as it is taken
    return _agent_state(parts, counters, parts.replay.state_dict() if replay else None)


def _agent_state(parts, counters, replay_state: dict | None) -> tuple[dict, dict[str, np.ndarray]]:
    parts.learner.sync_to_algo()
    learner_plain, arrays = split_state("learner", parts.learner.state_dict())
    replay_plain, replay_arrays = split_state("replay", replay_state) if replay_state is not None else (None, {})
    actor_rng = getattr(parts._actor, "rng", None)
    header = {"config": parts.config.to_dict(), "plan": parts.plan.to_dict(),
              "learner": learner_plain, "counters": counters.state(),
              "schedule": {"learning_starts": parts.schedule.learning_starts,
                           "updates_before": parts.schedule.updates_before},
              "rng": {"agent": parts.rng.bit_generator.state,
                      "actor": None if actor_rng is None else actor_rng.bit_generator.state}}
    if replay_state is not None:
        header["replay"] = replay_plain
    return header, {**arrays, **replay_arrays}


def read_checkpoint(path: str | Path) -> tuple[Path, dict, dict[str, np.ndarray], ExperimentConfig, Plan]:
    """(file, header, arrays, config, plan) of a checkpoint file or a run directory's, checked: the
    header's sections, its config and plan, and a run directory's config.yaml against it."""
    path = Path(path)
    run_dir = path if path.is_dir() else None
    if run_dir is not None:
        path = path / "checkpoint.npz"
    header, arrays = load_checkpoint(path)
    check_header(path, header)
    try:
        config = parse_config(header["config"])
    except ConfigError as err:
        raise ConfigError(f"{path}: header.config.{err}") from None
    try:
        saved = Plan.from_data({"plan": header["plan"]})
    except ConfigError as err:  # its messages name plan.<field>
        raise ConfigError(f"{path}: header.{err}") from None
    if run_dir is not None:
        _check_run_config(run_dir, config)
    return path, header, arrays, config, saved


def restore_state(path: Path, header: dict, arrays: dict[str, np.ndarray], parts, counters) -> None:
    """Loads a checkpoint read by read_checkpoint into freshly built parts and counters, after
    checking its arrays and values against what those parts hold."""
    capacity = parts.config.replay.capacity
    with_replay = "replay" in header
    fresh = {"learning_starts": parts.schedule.learning_starts, "updates_before": 0}
    if not parts.replay_restartable and not with_replay:
        raise PearlError(f"{path}: saved without its replay contents, which a replay server or a ray run "
                         f"cannot do without (expected a file agent.save wrote whole)")
    if not parts.replay_restartable and header.get("schedule", fresh) != fresh:
        raise PearlError(f"{path}: a run whose replay restarted (header.schedule), which a replay server or a "
                         f"ray run cannot go on from (its servers count the ratio from the run's start)")
    check_state(path, "learner", header["learner"], arrays, parts.learner.state_dict(), capacity)
    if with_replay:
        check_state(path, "replay", header["replay"], arrays, parts.replay.state_dict(), capacity)
    parts.learner.load_state_dict(join_state("learner", header["learner"], arrays))
    if with_replay:
        parts.replay.load_state_dict(join_state("replay", header["replay"], arrays))
    parts.policy.load(parts.learner.policy_weights())
    counters.load(header["counters"])
    if "schedule" in header:  # (checkpoints before replays could restart have none: the config's)
        parts.schedule = dataclasses.replace(parts.schedule, **header["schedule"])
    if not with_replay:  # the table starts empty: updates wait until it holds learning_starts again
        parts.restart_schedule(counters.env_steps, counters.updates)
    if "rng" in header:  # checkpoints from before RNG states were saved have none
        parts.rng.bit_generator.state = header["rng"]["agent"]
        parts.actor_rng_state = header["rng"]["actor"]


def _check_run_config(run_dir: Path, config: ExperimentConfig) -> None:
    """A run directory's config.yaml says what its checkpoint holds (a checkpoint copied in from
    another run must not resume as that run)."""
    written = run_dir / "config.yaml"
    if not written.is_file():
        return
    mine, theirs = _flat(parse_config(read_yaml(written), str(written)).to_dict()), _flat(config.to_dict())
    for key in sorted(mine.keys() | theirs.keys()):
        if mine.get(key) != theirs.get(key):
            raise ConfigError(f"{written}: {key} is {mine.get(key)!r} but checkpoint.npz holds a run with "
                              f"{theirs.get(key)!r}: they are not one run")


def _flat(data: dict, at: str = "") -> dict:
    out = {}
    for key, value in data.items():
        name = f"{at}.{key}" if at else key
        out.update(_flat(value, name) if isinstance(value, dict) else {name: value})
    return out

