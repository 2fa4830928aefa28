"""Files a run writes: atomic writes (a checkpoint or plan is either the old file or the new one,
never half of one), the run directory's owner lock, and SIGINT deferred while a write must finish."""
from __future__ import annotations

import errno
import fcntl
import os
import signal
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Callable

from pearl.errors import PearlError

LOCK_NAME = ".pearl.lock"
TEMP_SUFFIX = ".tmp"  # of atomic writes' temporary files, ".<name>.<random>.tmp"


def atomic_write(path: str | Path, write: Callable[[BinaryIO], object]) -> None:
    """Calls `write` on a temporary file in the same directory, fsyncs, then renames it over `path`
    (the bytes go straight to the file: a checkpoint of GBs is never held in memory whole). A
    process killed meanwhile leaves the temporary file; `owned_run_dir` removes it at the next start."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with interrupts_deferred():
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TEMP_SUFFIX)
            try:
                with os.fdopen(fd, "wb") as handle:
                    write(handle)
                    handle.flush()
                    os.fsync(handle.fileno())
                os.replace(tmp, path)
            except BaseException:
                os.unlink(tmp)
                raise
    except OSError as err:  # a full disk, a read-only or vanished directory: the user's to fix
        kept = "the previous file is kept" if path.exists() else "nothing was written"
        raise PearlError(f"{path}: could not be written ({err.strerror or err}); {kept}") from err


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write(path, lambda handle: handle.write(text.encode()))


@contextmanager
def interrupts_deferred():
    """A Ctrl-C that arrives inside the block is acted on (by the handler that was installed)
    when the block ends, so what the block writes is complete: a second Ctrl-C must not leave a
    run without the checkpoint the first one asked for. Only the main thread takes signals."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(frame))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if caught:
            if callable(previous):
                previous(signal.SIGINT, caught[0])
            elif previous == signal.SIG_DFL:
                raise KeyboardInterrupt


def _writable(folder: Path) -> bool:
    """By trying (os.access says yes to root on a read-only mount or /proc)."""
    try:
        tempfile.TemporaryFile(dir=folder).close()
    except OSError:
        return False
    return True


def check_output_file(path: str | Path, field: str) -> None:
    """Before any work: `path` can be written (its folder exists and is writable, it is no folder)."""
    path = Path(path)
    if path.is_dir():
        raise PearlError(f"{field} {path}: is a directory; expected a file name")
    if path.parent.exists() and not path.parent.is_dir():
        raise PearlError(f"{field} {path}: {path.parent} is a file; expected a folder")
    if not path.parent.is_dir():
        raise PearlError(f"{field} {path}: no folder {path.parent}; expected an existing folder")
    if not _writable(path.parent):
        raise PearlError(f"{field} {path}: folder {path.parent} is not writable")


def check_run_dir(run_dir: str | Path) -> None:
    """Before any work: `run_dir` is (or can be made) a writable directory that no other run holds."""
    path = Path(run_dir)
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise PearlError(f"{path}: {existing} is a file; expected a run directory")
    if not _writable(existing):
        raise PearlError(f"{path}: {existing} is not writable")
    lock = path / LOCK_NAME
    if path.resolve() in _owned or not lock.is_file():
        return
    fd = os.open(lock, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        raise PearlError(_in_use(path, fd)) from None
    finally:
        os.close(fd)


def _in_use(path: Path, fd: int) -> str:
    holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
    return f"{path}: in use by another run (pid {holder}); wait for it or choose another directory"


_owned: set[Path] = set()  # the run dirs this process holds


@contextmanager
def owned_run_dir(run_dir: str | Path):
    """Holds `run_dir` for this process: an exclusive flock on its lock file, which the kernel
    releases when the process ends however it ends (so a dead owner's lock is never stale). A
    second process gets a one-line PearlError naming the owner's pid. Nested holds in one process
    share the lock. On taking it, removes the temporary files of writes a killed process left."""
    path = Path(run_dir)
    if path.exists() and not path.is_dir():
        raise PearlError(f"{path}: is a file; expected a run directory")
    key = path.resolve()
    if key in _owned:  # the outer hold keeps the lock until it ends
        yield path
        return
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd = os.open(path / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as err:
        raise PearlError(f"{path}: cannot write the run directory ({err.strerror or err})") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
        message = (_in_use(path, fd) if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN)
                   else f"{path}: cannot lock the run directory ({err.strerror})")
        os.close(fd)
        raise PearlError(message) from None
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        for leftover in path.glob(f".*{TEMP_SUFFIX}"):
            leftover.unlink(missing_ok=True)
        _owned.add(key)
        yield path
    finally:
        _owned.discard(key)
        os.close(fd)  # releases the flock
