"""`corral backup`: a consistent copy of a live store, which a control plane restores from."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import threading
from contextlib import closing
from pathlib import Path

import pytest

from control.backup import backup as store_backup
from corral.v1 import jobs_pb2
from tests.conftest import FAST_ENV, ControlProc, wait_until
from tests.support.calls import request, submit
from tests.support.cli import corral


def backup(*args: str) -> subprocess.CompletedProcess[str]:
    return corral("backup", *args, timeout=120)


def test_a_backup_taken_while_jobs_pour_in_holds_every_job_acknowledged_before_it(
    control_plane: ControlProc, tmp_path: Path
) -> None:
    # Given a control plane with jobs in every state a queue has (no worker: they stay where they are)
    first = [submit(control_plane, "noop").id for _ in range(200)]
    cancelled = submit(control_plane, "noop").id
    control_plane.jobs.CancelJob(jobs_pb2.CancelJobRequest(id=cancelled))
    # and a client that keeps submitting batches throughout
    acked: list[str] = []
    stop = threading.Event()

    def keep_submitting() -> None:
        while not stop.is_set():
            batch = jobs_pb2.SubmitJobsRequest(jobs=[request("noop") for _ in range(50)])
            acked.extend(j.id for j in control_plane.jobs.SubmitJobs(batch).jobs)

    writer = threading.Thread(target=keep_submitting)
    writer.start()
    try:
        wait_until(lambda: len(acked) >= 500, what="the writes to be under way")
        before = [*first, cancelled, *acked]
        # When the store is backed up meanwhile, at once (the newest of those jobs are still only in
        # the write-ahead log, which a copy of the database file alone would miss)
        dest = tmp_path / "backup.db"
        counts = store_backup(str(control_plane.db), str(dest))
    finally:
        stop.set()
        writer.join(30)
    assert counts["CANCELLED"] == 1 and counts["PENDING"] >= len(before) - 1

    # Then a control plane restored from it has every job acknowledged before the backup began, as it was
    restored = ControlProc(tmp_path / "restored", dict(FAST_ENV))
    restored.workdir.mkdir()
    shutil.copy(dest, restored.db)
    restored.start()
    try:
        states = {job_id: restored.get(job_id).state for job_id in before}
        assert states[cancelled] == jobs_pb2.Job.CANCELLED
        assert {s for job_id, s in states.items() if job_id != cancelled} == {jobs_pb2.Job.PENDING}
    finally:
        restored.close()
    # and the live control plane went on taking jobs all along
    assert len(acked) > 500 and control_plane.get(acked[-1]).state == jobs_pb2.Job.PENDING


def test_corral_backup_prints_what_it_copied(control_plane: ControlProc, tmp_path: Path) -> None:
    for _ in range(3):
        submit(control_plane, "noop")
    dest = tmp_path / "backup.db"
    done = backup(str(dest), "--db", str(control_plane.db))
    assert (done.returncode, done.stdout) == (0, f"backed up {control_plane.db} to {dest}: 3 PENDING\n"), done.stderr


@pytest.mark.parametrize("case", ["dest exists", "no database", "not a database", "postgres"])
def test_a_backup_that_cannot_be_made_says_why_in_one_line_and_writes_nothing(
    control_plane: ControlProc, tmp_path: Path, case: str
) -> None:
    db, dest = control_plane.db, tmp_path / "backup.db"
    if case == "dest exists":
        dest.write_text("keep me")
    elif case == "no database":
        db = tmp_path / "missing.db"
    elif case == "not a database":
        db = tmp_path / "notes.db"
        db.write_text("not sqlite at all " * 100)
    done = backup(str(dest), "--db", "postgresql://u:secret@127.0.0.1/corral" if case == "postgres" else str(db))
    assert done.returncode == 1
    expected = {
        "dest exists": f"{dest} exists: give the backup a new name",
        "no database": f"there is no database {db} (CORRAL_DB, --db)",
        "not a database": f"{db} is not a Corral database",
        "postgres": "postgresql://u:***@127.0.0.1/corral is a PostgreSQL database: back it up with PostgreSQL's own",
    }[case]
    assert done.stderr.startswith(f"corral backup: {expected}") and done.stderr.count("\n") == 1, done.stderr
    assert not Path(f"{dest}.partial").exists()
    assert dest.read_text() == "keep me" if case == "dest exists" else not dest.exists()


def test_corral_backup_takes_the_database_as_the_control_plane_does_from_corral_db(
    control_plane: ControlProc, tmp_path: Path
) -> None:
    # Given a control plane's database named as CORRAL_DB may name it (the control plane opens it so)
    job = submit(control_plane, "noop").id
    dest = tmp_path / "backup.db"
    # When corral backup is run with that CORRAL_DB and no --db
    done = corral("backup", str(dest), env={"CORRAL_DB": f"sqlite:///{control_plane.db}"}, timeout=120)
    # Then it copies that database, rather than saying there is none
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"backed up sqlite:///{control_plane.db} to {dest}: 1 PENDING\n"
    with closing(sqlite3.connect(dest)) as copy:
        assert copy.execute("SELECT id FROM jobs").fetchall() == [(job,)]
