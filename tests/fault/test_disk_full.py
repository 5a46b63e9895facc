"""A full disk under a running control plane and under ``corral backup``: a real ENOSPC, from a small
tmpfs filled up while jobs are submitted, run and finished.

Mounting needs root (CAP_SYS_ADMIN): without it these tests skip, saying so, or fail when CI=true (CI runs
as root and must run them), as the Docker tests do.
"""

from __future__ import annotations

import errno
import os
import sqlite3
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from corral.v1 import jobs_pb2
from tests.conftest import FAST_ENV, ROOT, ControlProc, base_env, wait_until
from tests.support.calls import executions, request, submit_many, submitting, wait_all_done

S = jobs_pb2.Job


def _cannot_mount(reason: str) -> None:
    """Skip the test, or fail it in CI (CI=true), where it must run."""
    if os.environ.get("CI", "").strip().lower() in ("1", "true", "yes"):
        pytest.fail(f"{reason} (CI=true: the tests of a full disk must run, as root)")
    pytest.skip(reason)


def _tmpfs(folder: Path, size: str) -> Iterator[Path]:
    if os.geteuid() != 0:
        _cannot_mount("mounts a tmpfs: needs root")
    folder.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        _cannot_mount(f"cannot mount a tmpfs: {mounted.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """An 8 MiB tmpfs, unmounted afterwards."""
    yield from _tmpfs(tmp_path / "disk", "8m")


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs, unmounted afterwards."""
    yield from _tmpfs(tmp_path / "tiny", "1m")


def _fill(folder: Path) -> Path:
    """Write a file into ``folder`` until the disk is full; returns it."""
    filler = folder / "filler"
    with filler.open("wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 65536)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
    return filler


@dataclass
class _ControlOnDisk(ControlProc):
    """A control plane whose database is on ``disk`` (its log and port files stay in ``workdir``)."""

    disk: Path = Path()

    @property
    def db(self) -> Path:
        return self.disk / "corral.db"


def _backup(db: Path, dest: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "control.backup", str(dest), "--db", str(db)],
        cwd=ROOT,
        env=base_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.slow
def test_a_full_disk_refuses_calls_with_unavailable_and_loses_no_job_or_result(
    small_disk: Path, spawn_worker: Any, tmp_path: Path
) -> None:
    workdir = tmp_path / "control"
    workdir.mkdir()
    cp = _ControlOnDisk(workdir, dict(FAST_ENV), disk=small_disk)
    runs = tmp_path / "runs.log"
    try:
        cp.start()
        for _ in range(2):
            spawn_worker(cp, threads=2, imports=("tests.support.jobtypes",))
        # Given clients submitting, listing and watching while two workers run and finish the jobs
        stop = threading.Event()
        records = request("record", {"path": str(runs), "seconds": 0.3}, name="n" * 200)
        with submitting(cp, records) as (acked, refused):

            def listing() -> None:
                stub = cp.jobs
                while not stop.is_set():
                    try:
                        stub.ListJobs(jobs_pb2.ListJobsRequest(limit=20), timeout=10)
                        if acked:
                            for _ in stub.WatchJob(jobs_pb2.WatchJobRequest(id=acked[-1]), timeout=10):
                                pass
                    except grpc.RpcError as err:
                        refused.append(err)
                        return

            lister = threading.Thread(target=listing, daemon=True)
            lister.start()
            wait_until(lambda: len(acked) >= 60 or refused, 60, what="60 jobs acknowledged")
            assert not refused, refused
            # When the disk fills up
            filler = _fill(small_disk)
            # Then the control plane stops, exit status 3, saying why
            assert cp.proc is not None
            assert cp.proc.wait(20) == 3
            cp.proc = None
            assert "corral control: the store cannot be written (database or disk is full)" in cp.log.read_text()
            stop.set()
            lister.join(30)
        # and the calls it refused were refused UNAVAILABLE, a submission saying that the disk is full
        # (none INTERNAL, none hung); after it stopped, a call cannot connect (UNAVAILABLE too)
        assert {err.code() for err in refused} == {grpc.StatusCode.UNAVAILABLE}  # type: ignore[attr-defined]
        details = [err.details() or "" for err in refused]  # type: ignore[attr-defined]
        assert any(d == "store cannot be written: database or disk is full" for d in details) or all(
            "connect" in d.lower() for d in details
        ), details
        # A backup of the store, to another disk, can be made while its own disk is still full
        made = _backup(cp.db, tmp_path / "backup.db")
        assert made.returncode == 0, made.stderr
        with closing(sqlite3.connect(tmp_path / "backup.db")) as conn:
            assert {row[0] for row in conn.execute("SELECT id FROM jobs")} >= set(acked)
        # And once there is room again, a restart has every job acknowledged, each run once: the results
        # its workers reported while the disk was full were kept by them and applied now
        filler.unlink()
        cp.start()
        done = wait_all_done(cp, acked)
        assert Counter((j.state, j.attempts) for j in done) == {(S.SUCCEEDED, 1): len(acked)}
        assert sorted(executions(runs)) == sorted((job_id, 1) for job_id in acked)
        # and so does one after a kill -9
        cp.kill()
        cp.start()
        assert cp.jobs.ListJobs(jobs_pb2.ListJobsRequest(limit=1), timeout=10).total == len(acked)
    finally:
        cp.close()


def test_a_backup_onto_a_full_disk_says_so_in_one_line_and_leaves_nothing_behind(
    control_plane: ControlProc, tiny_disk: Path, tmp_path: Path
) -> None:
    # Given a store of about 3 MB (more than SQLite's page cache holds, so the copy spills to a rollback
    # journal on its way), and a disk with 1 MB of room
    submit_many(control_plane, [request("reverse_string", {"text": "x" * 20_000}) for _ in range(150)])
    dest = tiny_disk / "backup.db"
    # When it is backed up onto that disk
    done = _backup(control_plane.db, dest)
    # Then the backup fails with one line saying why
    assert done.returncode == 1
    assert done.stderr == (f"corral backup: cannot back up {control_plane.db} to {dest}: database or disk is full\n"), (
        done.stderr
    )
    # and leaves nothing on the disk (before: the partial copy's rollback journal stayed there)
    assert sorted(p.name for p in tiny_disk.iterdir()) == []
    # And with room, the same backup holds every job
    assert _backup(control_plane.db, tmp_path / "backup.db").returncode == 0


@pytest.mark.parametrize("database", ["new", "existing"])
def test_start_up_on_a_full_disk_says_so_in_one_line_naming_the_database(
    control_plane: ControlProc, small_disk: Path, database: str
) -> None:
    db = small_disk / "corral.db"
    if database == "existing":
        submit_many(control_plane, [request("noop") for _ in range(20)])
        assert control_plane.stop() == 0
        db.write_bytes(control_plane.db.read_bytes())
    kept = db.read_bytes() if database == "existing" else b""
    filler = _fill(small_disk)
    done = subprocess.run(
        [sys.executable, "-m", "control", "--grpc-port", "0", "--http-port", "0", "--db", str(db)],
        cwd=ROOT,
        env=base_env(),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    # Before: "corral control: cannot start: [Errno 28] No space left on device (CORRAL_DB, --db)", from
    # writing the pid into the lock file, naming no file; and SQLite's "disk I/O error" for an existing one
    assert done.returncode == 1
    why = "database or disk is full" if database == "new" else "disk I/O error (its disk is full)"
    assert done.stderr.strip().splitlines()[-1] == (
        f"corral control: cannot start: cannot open the database {db}: {why} (CORRAL_DB, --db)"
    )
    assert db.read_bytes() == kept
    # And with room again it starts on it, every job there
    filler.unlink()
    again = _ControlOnDisk(control_plane.workdir, dict(FAST_ENV), disk=small_disk)
    try:
        again.start()
        assert again.jobs.ListJobs(jobs_pb2.ListJobsRequest(limit=1), timeout=10).total == (20 if kept else 0)
    finally:
        again.close()
