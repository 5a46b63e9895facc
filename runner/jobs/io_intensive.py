"""``io_intensive``: write a temporary file of a given size, read it back, and check it.

Payload ``{"size_bytes": int, "block_bytes"?: 1 MiB, "seed"?: 0, "fsync"?: true}``. The content is one
block of ``block_bytes`` seeded pseudo-random bytes (``random.Random(seed).randbytes``) repeated and cut
at ``size_bytes``, so its sha256 is known in advance. The file is created unlinked (``O_TMPFILE`` via
:func:`tempfile.TemporaryFile`) in ``CORRAL_IO_DIR`` (default: the system temporary directory), so
nothing is left behind even when the job is killed. With ``fsync`` the data is flushed to the disk
and dropped from the page cache before it is read back, so both passes touch the device.

Result ``{"bytes", "sha256", "write_seconds", "read_seconds", "write_mb_per_s", "read_mb_per_s"}``.
A read-back that differs from what was written fails with ``IO_MISMATCH``; an OS error (disk full,
...) with ``IO_ERROR``.
"""

from __future__ import annotations

import hashlib
import os
import random
import tempfile
import time
from typing import Any

from corral.jobtypes import BUILTIN_SCHEMAS
from runner.errors import JobFailed
from runner.payload import as_int
from runner.registry import JobContext, JobType, register

DEFAULT_BLOCK = 1 << 20
"""Bytes written per call when the payload does not say."""


def content_block(seed: int, block_bytes: int) -> bytes:
    """The block the file repeats."""
    return random.Random(seed).randbytes(block_bytes)


@register
class IoIntensive(JobType):
    """Write a temporary file of a given size, read it back and compare digests."""

    name = "io_intensive"
    schema = BUILTIN_SCHEMAS["io_intensive"]

    def run(self, payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        """Write, (fsync, drop the cache,) read back, compare."""
        size = as_int(payload["size_bytes"], "size_bytes")
        block = content_block(
            as_int(payload.get("seed", 0), "seed"), as_int(payload.get("block_bytes", DEFAULT_BLOCK), "block_bytes")
        )
        sync = bool(payload.get("fsync", True))
        directory = os.environ.get("CORRAL_IO_DIR") or None
        try:
            with tempfile.TemporaryFile(dir=directory, buffering=0) as file:
                fd = file.fileno()
                written = hashlib.sha256()
                started = time.perf_counter()
                left = size
                while left > 0:
                    chunk = block if left >= len(block) else block[:left]
                    view = memoryview(chunk)
                    while view:
                        view = view[os.write(fd, view) :]
                    written.update(chunk)
                    left -= len(chunk)
                if sync:
                    os.fsync(fd)
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                write_seconds = time.perf_counter() - started
                os.lseek(fd, 0, os.SEEK_SET)
                read = hashlib.sha256()
                total = 0
                started = time.perf_counter()
                while data := os.read(fd, len(block)):
                    read.update(data)
                    total += len(data)
                read_seconds = time.perf_counter() - started
        except OSError as exc:
            raise JobFailed("IO_ERROR", f"{type(exc).__name__}: {exc}") from None
        if total != size or read.digest() != written.digest():
            raise JobFailed("IO_MISMATCH", f"read back {total} bytes that differ from the {size} written")
        return {
            "bytes": size,
            "sha256": written.hexdigest(),
            "write_seconds": round(write_seconds, 6),
            "read_seconds": round(read_seconds, 6),
            "write_mb_per_s": round(size / max(write_seconds, 1e-9) / 1e6, 3),
            "read_mb_per_s": round(size / max(read_seconds, 1e-9) / 1e6, 3),
        }
