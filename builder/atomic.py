"""Replace an artifact directory atomically, one writer at a time.

A build writes a complete new directory next to the target (same filesystem, so renames are
atomic), then swaps it in. On Linux the swap is one renameat2(RENAME_EXCHANGE): at every instant
the target path is either the whole old directory or the whole new one. Where that call is
missing, it is two renames, and a run that dies between them leaves `.<name>.old-*`, which the
next build (under the lock) renames back. Readers never see a half-written directory; a failed
or killed build leaves the old one byte-identical.

Siblings of `<parent>/<name>`: `.<name>.lock` (flock; kept, since deleting a lock file races
with its next user), `.<name>.tmp-*` (a build in progress) and `.<name>.old-*` (a swap).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from .errors import BuildError

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def fs_message(exc: OSError, target: Path) -> str:
    """An OSError met while writing `target` (or its lock and staging siblings) as one line
    that says what to do; the CLI prints it as `error:` (exit 1) instead of a traceback."""
    where = exc.filename or target
    left = f"{target} was left as it was"
    if exc.errno == errno.ENOSPC:
        return f"no space left on device while writing {where}; free some space; {left}"
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return (f"cannot write {where}: {exc.strerror} (the artifact directory, its parent and "
                f"the lock and staging files beside it must be writable; a read-only or "
                f"immutable directory cannot be built into); {left}")
    if exc.errno == errno.ENOTDIR or (exc.errno == errno.EEXIST and Path(where).exists()
                                      and not Path(where).is_dir()):
        return (f"--out must be a directory path, but {target} lies below a file ({where}: "
                f"{exc.strerror}); {left}")
    if exc.errno == errno.EISDIR:
        return (f"{where} must be a file, but it is a directory (the build puts its lock file "
                f"there): remove it; {left}")
    return f"cannot write {where}: {exc.strerror or exc}; {left}"


@contextlib.contextmanager
def fs_errors(target: Path) -> Iterator[None]:
    """Turn an OSError from the filesystem into a BuildError with fs_message."""
    try:
        yield
    except OSError as exc:
        raise BuildError(fs_message(exc, target)) from exc


def _holder(fd: int) -> str:
    return os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"


class DirLock:
    """Exclusive flock on `.<name>.lock` next to the target; waits up to `timeout` seconds,
    calling `on_wait(message)` once when it has to wait (the CLI prints it: a build that waits
    for another one said nothing for up to 300 s)."""

    def __init__(self, target: Path, timeout: float,
                 on_wait: Callable[[str], None] = lambda message: None) -> None:
        self.target = target
        self.path = target.parent / f".{target.name}.lock"
        self.timeout = timeout
        self.on_wait = on_wait
        self.fd: int | None = None

    def __enter__(self) -> DirLock:
        self.target.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + self.timeout
        waiting = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not waiting and self.timeout > 0:
                    waiting = True
                    self.on_wait(f"waiting for the lock {self.path}, held by pid {_holder(fd)} "
                                 f"(another build writing {self.target}), for up to "
                                 f"{self.timeout:g} s")
                if time.monotonic() >= deadline:
                    holder = _holder(fd)
                    os.close(fd)
                    raise BuildError(
                        f"another build is writing {self.target} (lock {self.path} held by pid "
                        f"{holder}); waited {self.timeout:g} s. Wait for it to finish, or raise "
                        "--lock-timeout") from None
                time.sleep(0.05)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self.fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None


def recover(target: Path) -> None:
    """Undo an interrupted two-rename swap and delete leftovers of killed builds. Call it only
    while holding the lock: then no other build owns these directories."""
    olds = sorted(target.parent.glob(f".{target.name}.old-*"))
    if olds and not target.exists():
        os.rename(olds[-1], target)
        olds = olds[:-1]
    for leftover in [*olds, *target.parent.glob(f".{target.name}.tmp-*")]:
        shutil.rmtree(leftover, ignore_errors=True)


def staging_dir(target: Path) -> Path:
    path = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    # mkdtemp makes it 0700; the installed directory should get the usual umask permissions.
    mask = os.umask(0)
    os.umask(mask)
    path.chmod(0o777 & ~mask)
    return path


def _exchange(a: Path, b: Path) -> bool:
    """Atomically exchange two paths; False where the kernel or filesystem cannot."""
    fn = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if fn is None:
        return False
    rc = fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(err, f"renameat2({a}, {b}, RENAME_EXCHANGE): {os.strerror(err)}")


def swap_in(staging: Path, target: Path) -> None:
    """Make `staging` the target directory; the old target is deleted afterwards."""
    if not target.exists():
        os.rename(staging, target)
        return
    if _exchange(staging, target):
        shutil.rmtree(staging, ignore_errors=True)  # now holds the old directory
        return
    old = target.parent / f".{target.name}.old-{os.getpid()}"
    try:
        os.rename(target, old)
        os.rename(staging, target)
    except BaseException:
        # Also when an interrupt (Ctrl-C, SIGTERM: see build.py) lands between the renames,
        # or right after the first one returned: put the old directory back.
        if old.exists() and not target.exists():
            os.rename(old, target)
        raise
    shutil.rmtree(old, ignore_errors=True)


def check_replaceable(target: Path, manifest_name: str) -> None:
    """Refuse to replace a directory the builder did not write: `--out .` must not delete a
    checkout."""
    if target.exists() and not target.is_dir():
        raise BuildError(f"{target} exists and is not a directory")
    if target.is_dir() and any(target.iterdir()) and not (target / manifest_name).is_file():
        raise BuildError(f"{target} is not empty and holds no {manifest_name}, so it is not an "
                         "artifact directory; refusing to replace it. Pick another --out")
