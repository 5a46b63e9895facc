"""One control plane per database: an exclusive ``flock`` on ``<database>.lock`` for the store's life.

Two control planes on one SQLite file would each load the same queued jobs and dispatch them to their
own workers, and both leases would commit: every such job would run twice. SQLite's own locks cannot
prevent that (each transaction is fine on its own), so the store holds this lock from open to close.

The lock file sits beside the database file itself, wherever the path given leads (through symlinks),
so that every path to one database takes the same lock. The kernel drops the lock when the process
ends, ``kill -9`` included, so a crashed control plane never blocks the next one. The file stays
(removing it would race with a control plane opening it); it holds the pid of its holder, for the
message a second one prints.

Someone may remove the file anyway (a clean-up of "stale" lock files): the lock then holds nothing, since a
second control plane would make and take a new file. So the holder checks, every fraction of a second
(:meth:`DatabaseLock.hold`), that the file at the path is the one it locked, and takes a new one if not.
"""

from __future__ import annotations

import contextlib
import fcntl
import os

__all__ = ["DatabaseLock"]


class DatabaseLock:
    """The lock of one database file, taken when made; :meth:`release` (or process exit) drops it."""

    def __init__(self, database: str) -> None:
        """Take the lock without waiting.

        Raises:
            OSError: another process holds it (the message names the database and that process's pid),
                or the lock file cannot be created.
        """
        # Beside the file the path leads to: a control plane given a symlink to the database (or a path
        # through one) locked ``<symlink>.lock``, and so opened a database another one held.
        self.path = f"{os.path.realpath(database)}.lock"
        try:
            fd = _take(self.path)
        except _Taken as taken:
            raise OSError(
                f"the database {database} is in use by another control plane ({taken.who}): "
                "stop that one first, or give this one a database of its own"
            ) from None
        except _Unlockable as exc:
            raise OSError(f"cannot open the database {database}: {exc}") from exc
        except OSError as exc:  # no such directory, no write permission, a read-only file system, ...
            folder = os.path.dirname(os.path.abspath(database))
            if isinstance(exc, FileNotFoundError) and not os.path.isdir(folder):
                raise OSError(f"cannot open the database {database}: there is no directory {folder}") from None
            raise OSError(f"cannot open the database {database}: cannot create {self.path}: {exc.strerror}") from exc
        self._fd: int | None = fd

    def hold(self) -> bool:
        """Check that the lock file at the path is still the one held; when it was removed or replaced, make
        and take a new one there. Returns whether it had to.

        Raises:
            OSError: another process took the new file first (the message names its pid), or none can be made.
        """
        fd = self._fd
        if fd is None:
            return False
        with contextlib.suppress(OSError):
            now, held = os.stat(self.path), os.fstat(fd)
            if (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino):
                return False
        try:
            new = _take(self.path)
        except _Taken as taken:
            raise OSError(
                f"{self.path} was removed, and another control plane ({taken.who}) has taken the database"
            ) from None
        except _Unlockable as exc:
            raise OSError(f"{self.path} was removed, and the new one cannot be locked: {exc}") from exc
        except OSError as exc:
            raise OSError(f"{self.path} was removed, and cannot be made again: {exc.strerror}") from exc
        self._fd = new
        os.close(fd)
        return True

    def release(self) -> None:
        """Drop the lock. Idempotent."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


class _Taken(Exception):
    """Another process holds the lock file."""

    def __init__(self, holder: int) -> None:
        super().__init__(holder)
        self.who = f"pid {holder}" if holder else "another process"


class _Unlockable(Exception):
    """The lock file opens, but cannot be locked (a file system without locks: some network ones)."""

    def __init__(self, path: str, exc: OSError) -> None:
        super().__init__(f"cannot lock {path}: {exc.strerror} (does this file system support locks? a local disk does)")


def _take(path: str) -> int:
    """Open (or make) the lock file at ``path`` and lock it without waiting; returns its descriptor.

    Raises:
        _Taken: another process holds it.
        _Unlockable: it cannot be locked for another reason.
        OSError: the file cannot be opened or made.
    """
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _read_pid(fd)
        os.close(fd)
        raise _Taken(holder) from None
    except OSError as exc:
        os.close(fd)
        raise _Unlockable(path, exc) from exc
    _write_pid(fd)
    return fd


def _write_pid(fd: int) -> None:
    """Name this process in the lock file, for a second control plane's message. Best effort: on a full
    disk the lock is held all the same (before, start-up stopped with a bare "[Errno 28] No space left on
    device" that named no file, instead of the database's own error)."""
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())


def _read_pid(fd: int) -> int:
    with contextlib.suppress(OSError, ValueError):
        return int(os.pread(fd, 32, 0).decode().strip() or 0)
    return 0
