"""A PostgreSQL database a control plane must not use is refused at start with one line and left as it
was: one a newer release made (a higher schema version), one whose tables named like Corral's are
another program's; a standby refuses to take over once a newer release has led the database. One that
an earlier release made, before the schema version was kept, is used and gains it, however many
control planes start on it at once. Real control planes and PostgreSQL (``tests/support/postgres.py``)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from control.jobs import JobRecord
from control.store import open_store
from control.store.postgres import SCHEMA_VERSION
from corral.dburl import describe
from tests.conftest import FAST_ENV, ROOT, ControlProc, base_env, wait_until
from tests.support.ports import free_port
from tests.support.postgres import Cluster

_CONTENTS = (
    "SELECT c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
    "WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p') ORDER BY 1"
)


def _contents(postgres: Cluster, url: str) -> dict[str, object]:
    """Everything a control plane could change in the database's schema: each table's columns and
    rows, each index."""
    seen: dict[str, object] = {
        "indexes": postgres.sql(
            url, "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = current_schema() ORDER BY 1"
        )
    }
    for (table,) in postgres.sql(url, _CONTENTS):
        columns = postgres.sql(
            url,
            "SELECT column_name, data_type, column_default FROM information_schema.columns "
            f"WHERE table_schema = current_schema() AND table_name = '{table}' ORDER BY ordinal_position",
        )
        rows = postgres.sql(
            url, f"SELECT md5(coalesce(string_agg(t::text, '|' ORDER BY t::text), '')) FROM \"{table}\" t"
        )
        seen[str(table)] = (columns, rows)
    return seen


def _made_by_this_release(url: str, jobs: int = 0) -> None:
    """A database as this release leaves it, with ``jobs`` jobs (through the store: no worker needed)."""
    s = open_store(url)
    try:
        asyncio.run(s.lead())
        if jobs:
            s.insert(
                [
                    JobRecord(id=f"job-{n}", seq=n, type="noop", payload_json="{}", created_at=float(n))
                    for n in range(1, jobs + 1)
                ]
            )
            asyncio.run(s.commit())
    finally:
        s.close()


def _start(url: str, workdir: Path) -> tuple[int | None, str]:
    """Start ``python -m control`` on ``url``; its exit status and stderr, or (None, stderr) when it
    served instead of exiting (it is then stopped)."""
    port_file = workdir / "control.port"
    err = workdir / "control.err"
    with err.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "control", "--grpc-port", "0", "--http-port", "0", "--db", url,
             "--port-file", str(port_file)],
            cwd=ROOT, env=base_env(FAST_ENV), stdout=subprocess.DEVNULL, stderr=out,
        )  # fmt: skip
    try:
        wait_until(lambda: proc.poll() is not None or port_file.exists(), 30, what="the control plane to exit")
        if proc.poll() is None:  # it serves
            proc.terminate()
            proc.wait(20)
            return None, err.read_text()
        return proc.returncode, err.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def _newer(postgres: Cluster, url: str) -> str:
    _made_by_this_release(url, jobs=3)
    # What a newer release that changed the schema would leave
    postgres.sql(url, f"UPDATE corral_schema SET version = {SCHEMA_VERSION + 1}")
    return (
        f"it was made by a newer release of Corral (schema version {SCHEMA_VERSION + 1}; this release reads up to "
        f"{SCHEMA_VERSION}): run that release, or restore a backup that this one made"
    )


def _their_jobs(postgres: Cluster, url: str) -> str:
    # Another program's database given by mistake, with a table of the name Corral's main one has
    postgres.sql(url, "CREATE TABLE jobs (id SERIAL PRIMARY KEY, title TEXT NOT NULL, done BOOLEAN)")
    postgres.sql(url, "INSERT INTO jobs (title, done) VALUES ('invoice run', false), ('backup', true)")
    return (
        "it is not a Corral database (its table jobs has no column seq, name, type and 29 more; it has jobs but no "
        "idempotency_keys, job_types; and it records no schema version)"
    )


def _their_accounts(postgres: Cluster, url: str) -> str:
    # A database another program shares, with tables of names Corral's later tables have
    postgres.sql(url, "CREATE TABLE accounts (id SERIAL PRIMARY KEY, email TEXT NOT NULL)")
    postgres.sql(url, "CREATE TABLE settings (name TEXT PRIMARY KEY, value TEXT NOT NULL)")
    postgres.sql(url, "INSERT INTO settings VALUES ('theme', 'dark')")
    return (
        "it is not a Corral database (its table accounts has no column name, password_hash, session and 2 more; "
        "it has accounts, settings but no jobs, idempotency_keys, job_types; and it records no schema version)"
    )


@pytest.mark.parametrize("case", ["newer release", "another program's jobs table", "another program's accounts"])
def test_a_postgres_database_it_must_not_use_stops_start_up_with_one_line_and_is_left_as_it_was(
    postgres: Cluster, tmp_path: Path, case: str
) -> None:
    url = postgres.new_database()
    why = {
        "newer release": _newer,
        "another program's jobs table": _their_jobs,
        "another program's accounts": _their_accounts,
    }[case](postgres, url)
    kept = _contents(postgres, url)
    # When a control plane is started on it: before, no schema version was kept, so it used a newer
    # release's database as its own; it failed on another program's jobs table with a driver error
    # about a column, and made its tables beside another program's settings table, to write into it
    code, stderr = _start(url, tmp_path)
    # Then it exits 1 with one line naming the database, why, and the setting, and the database is as it was
    assert code == 1, stderr[-2000:]
    said = stderr.strip().splitlines()[-1]
    assert said == f"corral control: cannot start: cannot open the database {describe(url)}: {why} (CORRAL_DB, --db)"
    assert "Traceback" not in stderr
    assert _contents(postgres, url) == kept


def test_a_standby_refuses_to_take_over_a_database_a_newer_release_has_led_meanwhile(
    shared_pair: tuple[ControlProc, ControlProc, str], postgres: Cluster
) -> None:
    # Given an active control plane of this release and a standby of it
    first, second, url = shared_pair
    second.start_standby()
    assert second.proc is not None
    # When a newer release has led the database meanwhile (its version recorded), and the active one goes
    # (the standby held still until then, so that what the active one left is what the standby finds)
    os.kill(second.proc.pid, signal.SIGSTOP)
    try:
        postgres.sql(url, f"UPDATE corral_schema SET version = {SCHEMA_VERSION + 1}")
        assert first.stop(signal.SIGTERM) == 0
        kept = _contents(postgres, url)
    finally:
        os.kill(second.proc.pid, signal.SIGCONT)
    # Then the standby does not take over: it exits 1 with one line, and has changed nothing
    assert second.proc.wait(30) == 1
    said = second.log.read_text().strip().splitlines()[-1]
    assert said == (
        f"corral control: cannot start: cannot open the database {describe(url)}: it was made by a newer release of "
        f"Corral (schema version {SCHEMA_VERSION + 1}; this release reads up to {SCHEMA_VERSION}): run that release, "
        "or restore a backup that this one made (CORRAL_DB, --db)"
    )
    assert not (second.workdir / "control.port").exists()
    assert _contents(postgres, url) == kept


@pytest.mark.parametrize("made", ["new", "before the version was kept"])
def test_control_planes_started_at_once_on_a_database_one_leads_the_others_stand_by_and_the_version_is_kept(
    postgres: Cluster, tmp_path: Path, made: str
) -> None:
    url = postgres.new_database()
    if made != "new":
        # As a release before this one left it: this release's tables, with jobs, and no corral_schema
        _made_by_this_release(url, jobs=5)
        postgres.sql(url, "DROP TABLE corral_schema")
    planes = []
    for name in ("a", "b", "c"):
        workdir = tmp_path / f"control-{name}"
        workdir.mkdir()
        planes.append(ControlProc(workdir, dict(FAST_ENV), port=free_port(), http_port=free_port(), db_url=url))
    try:
        # When three start at once
        for cp in planes:
            cp.start(wait=False)

        # Then one leads and serves, and the others stand by: none stops with an error
        def serving() -> list[ControlProc]:
            return [cp for cp in planes if cp.serving()]

        (leader,) = wait_until(serving, 30, what="one to lead")
        leader.wait_serving()
        for cp in planes:
            if cp is not leader:
                wait_until(lambda: cp.events("store_standby"), 30, what="the others to stand by")  # noqa: B023
                assert not cp.serving()
        # and the database records this release's schema version, its jobs kept
        assert postgres.sql(url, "SELECT version FROM corral_schema") == [(SCHEMA_VERSION,)]
        assert postgres.sql(url, "SELECT count(*) FROM jobs") == [(0 if made == "new" else 5,)]
    finally:
        for cp in planes:
            cp.close()
