"""Checkpoints: one .npz file (no pickle) holding arrays plus a JSON header, written atomically."""
from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import numpy as np

from pearl.errors import PearlError
from pearl.io import atomic_write_bytes

FORMAT = "pearl-checkpoint/1"


def save_checkpoint(path: str | Path, header: dict, arrays: dict[str, np.ndarray]) -> None:
    buffer = io.BytesIO()
    header = {"format": FORMAT, **header}
    np.savez(buffer, __header__=np.frombuffer(json.dumps(header).encode(), dtype=np.uint8), **arrays)
    atomic_write_bytes(path, buffer.getvalue())


def load_checkpoint(path: str | Path) -> tuple[dict, dict[str, np.ndarray]]:
    path = Path(path)
    if not path.is_file():
        raise PearlError(f"{path}: no such checkpoint file")
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {name: data[name] for name in data.files}
        header = json.loads(arrays.pop("__header__").tobytes().decode())
    except (zipfile.BadZipFile, ValueError, KeyError, OSError):
        raise PearlError(f"{path}: not a PEARL checkpoint (unreadable or truncated)") from None
    if header.get("format") != FORMAT:
        raise PearlError(f"{path}: checkpoint format {header.get('format')!r}, expected {FORMAT!r}")
    return header, arrays


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
