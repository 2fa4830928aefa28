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
    except (zipfile.BadZipFile, ValueError, KeyError, OSError, EOFError):
        raise PearlError(f"{path}: not a PEARL checkpoint (unreadable or truncated)") from None
    if not isinstance(header, dict):
        raise PearlError(f"{path}: not a PEARL checkpoint (its header is no mapping)")
    if header.get("format") != FORMAT:
        raise PearlError(f"{path}: checkpoint format {header.get('format')!r}, expected {FORMAT!r}")
    return header, arrays


def check_header(path: str | Path, header: dict) -> None:
    """The header's sections are there with the right types, before anything is built from it."""
    for section in ("config", "plan", "learner", "replay", "counters"):
        if not isinstance(header.get(section), dict):
            raise PearlError(f"{path}: header.{section}: missing or not a mapping (not a complete PEARL checkpoint)")
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
