"""Checkpoints of a replay server: no pickle, atomic on disk, taken while the server keeps serving.

Consistency: at the start the server thread records, in one step between two requests, the
counters (table cursor, size, inserted, max priority, env steps, updates, each writer's
acknowledged sequence number and credit, the rate limiter's counts, the sampling RNG's state) and
a copy of the priorities (8 bytes per row). The rows themselves are copied by a background thread
in blocks of BLOCK rows while inserts and samples go on: before an insert overwrites rows of a
block the thread has not copied yet, the server thread copies that block first (copy-on-write), so
the file holds exactly the rows as they were at the start. Samples and priority updates never
change stored rows. A frame table (table.frame_stack) writes each stream's records and the
validity of older transitions as it goes, so its state but the frames (pearl/replay/frames.py
`snapshot`: ~15 bytes a record) is copied whole in that step; its frames (7 KB a record for
Atari) are read block by block from its FrameSnapshot, which the table's `add` keeps as they were.

On disk: DIR/ckpt-NNNNNN/ with one .npy per field (+ priorities.npy) and manifest.json, written in
DIR/.tmp-ckpt-NNNNNN, fsynced, renamed into place, then DIR/LATEST (the name of the newest
checkpoint) replaced atomically. A crash at any point leaves the previous checkpoint intact and
LATEST naming a complete one. Loading uses np.load(allow_pickle=False).
"""
from __future__ import annotations

import json
import os
import shutil
import threading
import time
from pathlib import Path

import numpy as np

from pearl.replay.base import CopyOnWriteBlocks
from pearl.server.wire import info_frames

BLOCK = 16_384
KEEP = 2  # checkpoints kept on disk


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Snapshot:
    def __init__(self, service, peer):
        table = service.table
        self.service, self.peer = service, peer
        self.started = time.perf_counter()
        self.directory = Path(service.config.checkpoint_dir)
        self.directory.mkdir(parents=True, exist_ok=True)
        number = _latest_number(self.directory) + 1
        self.name = f"ckpt-{number:06d}"
        self.size = int(table.size)
        self.frames = bool(service.config.table.frame_stack)
        self.table = table
        if self.frames:  # a private copy of all but the frames, which go block by block
            state, self.frame_rows = table.snapshot()
            counts = {"inserted": int(state.pop("inserted")), "max_priority": float(state.pop("max_priority")),
                      "progress": int(state.pop("progress"))}
            state.pop("rate_limiter", None)
            self.fields = {name: np.asarray(values) for name, values in state.items()}
            described = {"size": self.size, **counts}
        else:
            self.fields = {name: view for name, view in table.storage.items()}
            described = {"cursor": int(table.cursor), "size": self.size, "inserted": int(table.inserted),
                         "progress": int(table.progress)}
        self.manifest = {
            "format": 1, "name": self.name, "time": time.time(), "frame_table": self.frames,
            "table": described,
            "config_table": {k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(service.config.table).items()},
            "env_steps": service.env_steps, "updates": service.updates,
            "acked": {str(k): v for k, v in service.acked.items()},
            "writer_steps": {str(k): v for k, v in service.writer_steps.items()},
            "credit": {str(k): v for k, v in service.credit.items()},
            "counts": dict(service.counts), "rng": service.rng.bit_generator.state,
            "fields": {name: {"dtype": str(v.dtype), "shape": list(v.shape[1:])} for name, v in self.fields.items()},
        }
        if self.frames:
            rows = self.frame_rows
            self.manifest["fields"]["frames"] = {"dtype": str(rows.dtype), "shape": list(rows.row_shape)}
        if table.rate_limiter is not None:
            self.manifest["rate_limiter"] = table.rate_limiter.state_dict()
        self.priorities = None
        if table.prioritized and not self.frames:  # (a frame table's state holds its priorities)
            self.manifest["table"]["max_priority"] = float(table.max_priority)
            self.priorities = np.array(table.tree.get(np.arange(self.size)), dtype=np.float64)
        # the rows, read block by block: a frame table's frames, or the ring's fields
        self.taken = self.frame_rows if self.frames else _StoredRows(self.fields, self.size)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="replay-checkpoint", daemon=True)
        self.thread.start()

    def before_write(self, start: int, count: int) -> None:
        """Called by the server thread before a ring's rows [start, start + count) (mod capacity) change."""
        if not self.taken.pending:
            return
        capacity = len(next(iter(self.fields.values())))
        first, last = start, start + count - 1
        spans = [(first, min(last, capacity - 1))] + ([(0, last - capacity)] if last >= capacity else [])
        blocks = [range(lo // BLOCK, min(hi, self.size - 1) // BLOCK + 1) for lo, hi in spans if lo < self.size]
        self.taken.save_first([block for span in blocks for block in span])

    def _run(self) -> None:
        try:
            tmp = self.directory / f".tmp-{self.name}"
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
            blocked = {"frames": self.manifest["fields"]["frames"]} if self.frames else self.manifest["fields"]
            outputs = {name: np.lib.format.open_memmap(tmp / f"{name}.npy", mode="w+", dtype=field["dtype"],
                                                       shape=(self.taken.rows, *field["shape"]))
                       for name, field in blocked.items()}
            if self.frames:  # the rest of a frame table's state: copied whole at the start
                for name, values in self.fields.items():
                    np.save(tmp / f"{name}.npy", values, allow_pickle=False)
            for block in range(self.taken.blocks):
                lo, data = block * self.taken.block_rows, self.taken.block(block)
                for name, values in ({"frames": data} if self.frames else data).items():
                    outputs[name][lo:lo + len(values)] = values
            for name, out in outputs.items():
                out.flush()
                del out
            outputs.clear()
            if self.priorities is not None:
                np.save(tmp / "priorities.npy", self.priorities, allow_pickle=False)
            (tmp / "manifest.json").write_text(json.dumps(self.manifest))
            for path in tmp.iterdir():
                _fsync(path)
            _fsync(tmp)
            final = self.directory / self.name
            shutil.rmtree(final, ignore_errors=True)
            os.rename(tmp, final)
            latest_tmp = self.directory / "LATEST.tmp"
            latest_tmp.write_text(self.name + "\n")
            _fsync(latest_tmp)
            os.replace(latest_tmp, self.directory / "LATEST")
            _fsync(self.directory)
            for old in sorted(self.directory.glob("ckpt-*"))[:-KEEP]:
                shutil.rmtree(old, ignore_errors=True)
        except BaseException as error:  # reported to the requester by `finish`
            self.error = error
        finally:
            if self.frames:  # (written or failed: the table's adds stop copying for it)
                self.frame_rows.close()

    @property
    def finished(self) -> bool:
        return not self.thread.is_alive()

    def join(self) -> None:
        self.thread.join()

    def finish(self) -> list:
        """Called by the server thread once `finished`: the reply to whoever asked, if anyone."""
        service = self.service
        service.snapshot = None
        if self.error is not None:
            from pearl.server.wire import ErrorCode, error_frames

            service.last_error = f"checkpoint failed: {self.error}"
            return [] if self.peer is None else [(self.peer, error_frames(ErrorCode.INTERNAL, service.last_error))]
        service.counts["checkpoints"] += 1
        for writer, seq in self.manifest["acked"].items():
            service.durable[int(writer)] = seq
        info = {"name": self.name, "path": str(self.directory / self.name), "size": self.size,
                "env_steps": self.manifest["env_steps"], "acked": self.manifest["acked"],
                "seconds": round(time.perf_counter() - self.started, 4), "cow_blocks": self.taken.copied_first}
        return [] if self.peer is None else [(self.peer, info_frames(json.dumps(info)))]


class _StoredRows(CopyOnWriteBlocks):
    """A ring's stored rows (field views) in blocks of BLOCK rows, as they were when taken."""

    def __init__(self, fields: dict, size: int):
        super().__init__(-(-size // BLOCK), BLOCK)
        self.fields, self.rows = fields, size

    def _copy(self, block: int) -> dict:
        lo, hi = block * BLOCK, min(self.rows, (block + 1) * BLOCK)
        return {name: view[lo:hi].copy() for name, view in self.fields.items()}


def start_checkpoint(service, peer) -> Snapshot:
    return Snapshot(service, peer)


def _latest_number(directory: Path) -> int:
    name = latest(directory)
    return int(name.split("-")[1]) if name else 0


def latest(directory: str | Path) -> str | None:
    path = Path(directory) / "LATEST"
    if not path.is_file():
        return None
    name = path.read_text().strip()
    if not name.startswith("ckpt-") or not name[5:].isdigit():
        raise ValueError(f"{path}: {name!r} is not a checkpoint name")
    return name


def restore(service, directory: str | Path, name: str | None = None) -> dict | None:
    """Loads the latest (or the named) checkpoint of `directory` into a fresh service: table rows,
    priorities, counters, writers' sequence numbers. Returns its manifest, or None if none."""
    name = name or latest(directory)
    if name is None:
        return None
    path = Path(directory) / name
    manifest = json.loads((path / "manifest.json").read_text())
    mine = {k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(service.config.table).items()}
    # (keys older checkpoints lack)
    saved = {"obs_shape": [], "obs_dtype": "float32", "frame_stack": 0, "streams": 1, "n_step": 1, "gamma": 0.99,
             **manifest["config_table"]}
    for key in ("kind", "capacity", "obs_dim", "obs_shape", "obs_dtype", "action_dtype", "action_shape",
                "frame_stack") + (("streams", "n_step", "gamma") if mine["frame_stack"] else ()):
        if saved[key] != mine[key]:
            raise ValueError(f"{path}: checkpoint table.{key} = {saved[key]!r}, the server's is {mine[key]!r}")
    t = manifest["table"]
    if manifest.get("frame_table"):  # the frame table's state_dict, array by array
        state = {f: np.load(path / f"{f}.npy", allow_pickle=False, mmap_mode="r") for f in manifest["fields"]}
        state.update(inserted=t["inserted"], max_priority=t["max_priority"], progress=t["progress"])
    else:
        state = {"storage": {f: np.load(path / f"{f}.npy", allow_pickle=False, mmap_mode="r")
                             for f in manifest["fields"]}, "cursor": t["cursor"], "size": t["size"],
                 "inserted": t["inserted"]}
        if service.table.prioritized:
            state.update(priorities=np.load(path / "priorities.npy", allow_pickle=False),
                         max_priority=t["max_priority"], progress=t["progress"])
    if "rate_limiter" in manifest:
        state["rate_limiter"] = manifest["rate_limiter"]
    service.table.load_state_dict(state)
    service.table.progress = t["progress"]
    service.env_steps, service.updates = manifest["env_steps"], manifest["updates"]
    service.acked = {int(k): v for k, v in manifest["acked"].items()}
    service.durable = dict(service.acked)
    service.writer_steps = {int(k): v for k, v in manifest.get("writer_steps", {}).items()}
    service.credit = {int(k): v for k, v in manifest["credit"].items()}
    service.counts.update({k: v for k, v in manifest["counts"].items() if k in service.counts})
    service.rng.bit_generator.state = manifest["rng"]
    return manifest
