"""The store's files under a running control plane, and at start-up: the write-ahead log or its index
removed, the database replaced (a restore while it runs), and a database it must not open (cut short,
of a newer schema, another program's, not a database at all)."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path
from typing import Any

import grpc
import pytest

from control.store.sqlite import SCHEMA_VERSION
from corral.v1 import jobs_pb2
from tests.conftest import ROOT, ControlProc, base_env, wait_until
from tests.support.calls import executions, request, submit_many, submitting, wait_all_done

S = jobs_pb2.Job


def _records(runs: Path) -> jobs_pb2.SubmitJobRequest:
    return request("record", {"path": str(runs), "seconds": 0.05})


def _stopped_for(cp: ControlProc, what: str) -> str:
    """Wait for the control plane to stop because its store failed; returns its last line."""
    assert cp.proc is not None
    assert cp.proc.wait(15) == 3
    cp.proc = None
    said = cp.log.read_text().strip().splitlines()[-1]
    assert said.startswith(f"corral control: the store cannot be written ({what}"), said
    return said


def _refusals_are_unavailable(refused: list[grpc.RpcError]) -> None:
    for err in refused:
        code, details = err.code(), err.details() or ""  # type: ignore[attr-defined]
        assert code == grpc.StatusCode.UNAVAILABLE, (code, details)


def test_the_write_ahead_log_removed_under_a_running_control_plane_stops_it_and_loses_nothing(
    control_plane: ControlProc, spawn_worker: Any, tmp_path: Path
) -> None:
    # Given a control plane taking jobs one after another, and a worker running them
    cp, runs = control_plane, tmp_path / "runs.log"
    spawn_worker(cp, threads=2, imports=("tests.support.jobtypes",))
    with submitting(cp, _records(runs)) as (acked, refused):
        wait_until(lambda: len(acked) >= 30, 30, what="30 jobs acknowledged")
        # When its write-ahead log and the log's index are removed (a clean-up of "stray" files): before,
        # it went on acknowledging jobs into a log that no longer had a name, all of them lost at its
        # exit, and the database it left could not be opened ("database disk image is malformed")
        os.unlink(f"{cp.db}-wal")
        os.unlink(f"{cp.db}-shm")
        # Then it stops at once, exit status 3, saying which files went and where what it held is
        said = _stopped_for(cp, "corral.db-wal removed, corral.db-shm removed while the control plane ran")
        assert f"what was committed is in {cp.db}" in said
    _refusals_are_unavailable(refused)
    # And a restart has every job acknowledged, each run once
    cp.start()
    done = wait_all_done(cp, acked)
    assert {(j.state, j.attempts) for j in done} == {(S.SUCCEEDED, 1)}
    assert sorted(executions(runs)) == sorted((job_id, 1) for job_id in acked)
    assert cp.jobs.ListJobs(jobs_pb2.ListJobsRequest(limit=1), timeout=10).total == len(acked)


def test_a_database_replaced_under_a_running_control_plane_stops_it_and_saves_what_it_held(
    control_plane: ControlProc, spawn_worker: Any, tmp_path: Path
) -> None:
    cp, runs = control_plane, tmp_path / "runs.log"
    spawn_worker(cp, threads=2, imports=("tests.support.jobtypes",))
    before = [job.id for job in submit_many(cp, [request("noop") for _ in range(10)])]
    backup = tmp_path / "backup.db"
    made = subprocess.run(
        [sys.executable, "-m", "control.backup", str(backup), "--db", str(cp.db)],
        cwd=ROOT,
        env=base_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert made.returncode == 0, made.stderr
    with submitting(cp, _records(runs)) as (acked, refused):
        wait_until(lambda: len(acked) >= 20, 30, what="20 more jobs acknowledged")
        # When the backup is restored while the control plane still runs (the README says to stop it
        # first): before, it went on acknowledging jobs into the replaced file, every one of them lost
        os.replace(backup, cp.db)
        os.unlink(f"{cp.db}-wal")
        os.unlink(f"{cp.db}-shm")
        said = _stopped_for(cp, "corral.db replaced, corral.db-wal removed, corral.db-shm removed")
    _refusals_are_unavailable(refused)
    # Then what it had committed is saved in a copy beside the database, which the message names
    saved = said.split("what was committed is saved in ", 1)[1].split(")", 1)[0]
    assert Path(saved).parent == cp.db.parent
    with closing(sqlite3.connect(saved)) as conn:
        ids = {row[0] for row in conn.execute("SELECT id FROM jobs")}
    assert set(before) | set(acked) <= ids
    # and the database restored is left as it was restored: a restart starts from it
    cp.start()
    assert {cp.get(job_id).state for job_id in before} <= {S.PENDING, S.RUNNING, S.SUCCEEDED}


def _start_control(db: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "control", "--grpc-port", "0", "--http-port", "0", "--db", str(db)],
        cwd=ROOT,
        env=base_env(),
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )


def _corral_db(control_plane: ControlProc) -> bytes:
    """The bytes of a stopped control plane's database holding 200 jobs (4,096-byte pages)."""
    submit_many(control_plane, [request("noop", name="n" * 200) for _ in range(200)])
    assert control_plane.stop() == 0
    return control_plane.db.read_bytes()


@pytest.mark.parametrize("case", ["future schema", "cut short", "cut short within its first page", "not corral's"])
def test_a_database_it_must_not_use_stops_start_up_with_one_line_and_is_left_as_it_was(
    control_plane: ControlProc, tmp_path: Path, case: str
) -> None:
    db = tmp_path / "corral.db"
    if case == "not corral's":  # another program's SQLite database given by mistake
        with closing(sqlite3.connect(db, isolation_level=None)) as conn:
            conn.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY, total REAL)")
    else:
        good = _corral_db(control_plane)
        if case == "future schema":  # what a newer release that changed the schema would leave
            db.write_bytes(good)
            with closing(sqlite3.connect(db, isolation_level=None)) as conn:  # closed: its log is merged
                assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
                conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
        else:
            db.write_bytes(good[: len(good) // 2 + 100 if case == "cut short" else 2048])
    for suffix in ("-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    kept = db.read_bytes()
    # When a control plane is started on it: before, it started on the newer schema and on another
    # program's database (writing its tables into it), and took a file cut within its first page for an
    # empty database and wrote a new one over it
    done = _start_control(db)
    # Then it exits 1 with one line naming the file and why, and the file is as it was
    assert done.returncode == 1, done.stderr[-2000:]
    said = done.stderr.strip().splitlines()[-1]
    why = {
        "future schema": (
            f"it was made by a newer release of Corral (schema version {SCHEMA_VERSION + 1}; this release reads "
            f"up to {SCHEMA_VERSION}): run that release, or restore a backup that this one made"
        ),
        "cut short": f"it is cut short ({len(kept)} bytes, not a whole number of its 4096-byte pages)",
        "cut short within its first page": "it is cut short (2048 bytes, not a whole number of its 4096-byte pages)",
        "not corral's": "it is not a Corral database (it has tables, but no jobs table)",
    }[case]
    assert said == f"corral control: cannot start: cannot open the database {db}: {why} (CORRAL_DB, --db)"
    assert "Traceback" not in done.stderr
    assert db.read_bytes() == kept


def test_random_bytes_for_a_database_stop_start_up_with_one_line_and_are_left_as_they_were(tmp_path: Path) -> None:
    db = tmp_path / "corral.db"
    kept = os.urandom(100_000)
    db.write_bytes(kept)
    done = _start_control(db)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        f"corral control: cannot start: cannot open the database {db}: file is not a database (CORRAL_DB, --db)"
    )
    assert db.read_bytes() == kept


def test_a_lock_file_removed_under_a_running_control_plane_is_taken_again_and_still_keeps_a_second_one_out(
    control_plane: ControlProc, spawn_worker: Any, tmp_path: Path
) -> None:
    # Given a control plane with jobs queued behind a one-slot worker
    cp, runs = control_plane, tmp_path / "runs.log"
    spawn_worker(cp, threads=1, imports=("tests.support.jobtypes",))
    ids = [
        job.id for job in submit_many(cp, [request("record", {"path": str(runs), "seconds": 0.05}) for _ in range(20)])
    ]
    assert cp.proc is not None
    pid, lock = cp.proc.pid, Path(f"{cp.db}.lock")
    # When its lock file is removed (a clean-up of "stale" lock files): before, the lock then held nothing,
    # and a second control plane on the same database started, loaded the same queued jobs and ran them
    lock.unlink()
    # Then the control plane makes and takes it again at once
    wait_until(lambda: lock.exists() and lock.read_text() == f"{pid}\n", 5, what="the lock file again")
    # and a second control plane on the database is refused, naming it
    second = _start_control(cp.db)
    assert second.returncode == 1, second.stderr[-2000:]
    assert f"is in use by another control plane (pid {pid})" in second.stderr.strip().splitlines()[-1]
    # and every job runs once
    wait_all_done(cp, ids)
    assert sorted(executions(runs)) == sorted((job_id, 1) for job_id in ids)


def test_a_damaged_page_found_at_start_up_stops_it_with_one_line(control_plane: ControlProc, tmp_path: Path) -> None:
    # Given a database whose middle pages were overwritten (a bad sector, a copy that went wrong): SQLite
    # opens it, and finds the damage only when start-up reads the jobs
    good = _corral_db(control_plane)
    db = tmp_path / "corral.db"
    db.write_bytes(good)
    for suffix in ("-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    with closing(sqlite3.connect(db)) as conn:
        (root,) = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'jobs'").fetchone()
    at = (root - 1) * 4096
    db.write_bytes(good[:at] + os.urandom(4096) + good[at + 4096 :])  # the jobs table's first page
    # When a control plane is started on it
    done = _start_control(db)
    # Then it exits 1 with one line naming the file (before: a traceback from deep in the recovery)
    assert done.returncode == 1, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    said = done.stderr.strip().splitlines()[-1]
    assert said.startswith(f"corral control: cannot start: cannot read the database {db}: "), said
    assert said.endswith("(CORRAL_DB, --db)")
