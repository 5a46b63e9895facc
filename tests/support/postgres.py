"""A throw-away PostgreSQL cluster for the tests: Debian's ``postgresql`` binaries, a data directory in
/tmp, listening on 127.0.0.1 only, started once per test session and removed after it.

It runs with ``fsync=off``: a cluster that is thrown away never needs to survive a power loss, and
what the tests kill is the control plane, never the server (a commit is in the server's memory and
its WAL when the control plane dies). As root (CI) the server runs as the ``postgres`` user, which
PostgreSQL requires. Without the binaries the tests that need it skip, saying what to install, as
the Docker tests do without Docker; with CI=true they fail instead (``.ci/run`` installs them).
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from tests.support.ports import free_port

USER = "corral"


def _bin_dir() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"), key=lambda p: int(p.split("/")[4]))
    if not found:
        reason = "PostgreSQL is not installed: apt-get install postgresql (.ci/run does)"
        if os.environ.get("CI", "").strip().lower() in ("1", "true", "yes"):
            pytest.fail(f"{reason}; CI=true: the shared-store tests must run")
        pytest.skip(reason)
    return Path(found[-1]).parent


@dataclass
class Cluster:
    """A running cluster; :meth:`new_database` gives each test a database of its own."""

    port: int
    datadir: Path
    proc: subprocess.Popen[bytes]

    def url(self, database: str) -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """A fresh, empty database; returns its URL."""
        name = f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.url(name)

    def sql(self, url: str, query: str) -> list[tuple[object, ...]]:
        """Run ``query`` on the database at ``url`` (a fresh connection) and return its rows."""
        with psycopg.connect(url, autocommit=True) as conn:
            cur = conn.execute(query)
            return cur.fetchall() if cur.description else []


def _as_postgres() -> list[str]:
    """The prefix that runs a command as the ``postgres`` user when we are root (else nothing)."""
    if os.geteuid() != 0:
        return []
    return ["runuser", "-u", "postgres", "--"]


@contextlib.contextmanager
def running_cluster() -> Iterator[Cluster]:
    """Start a cluster, yield it, stop it and remove its files."""
    bindir = _bin_dir()
    datadir = Path(tempfile.mkdtemp(prefix="corral-pg-"))
    try:
        if os.geteuid() == 0:
            pg = pwd.getpwnam("postgres")
            os.chown(datadir, pg.pw_uid, pg.pw_gid)
        subprocess.run(
            [*_as_postgres(), str(bindir / "initdb"), "-D", str(datadir / "data"), "-U", USER, "-A", "trust",
             "-E", "UTF8", "--no-sync"],
            check=True, capture_output=True,
        )  # fmt: skip
        port = free_port()
        log = open(datadir / "server.log", "ab")  # noqa: SIM115 (closed below, after the server stops)
        proc = subprocess.Popen(
            [*_as_postgres(), str(bindir / "postgres"), "-D", str(datadir / "data"), "-p", str(port),
             "-c", "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={datadir}", "-c", "fsync=off",
             "-c", "max_connections=200", "-c", "shared_buffers=64MB"],
            stdout=log, stderr=log,
        )  # fmt: skip
        cluster = Cluster(port, datadir, proc)

        def accepting() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"postgres exited: {(datadir / 'server.log').read_text()[-2000:]}")
            try:
                psycopg.connect(cluster.url("postgres"), connect_timeout=2).close()
            except psycopg.OperationalError:
                return False
            return True

        try:
            deadline = time.monotonic() + 30
            while not accepting():
                if time.monotonic() > deadline:
                    pytest.fail("PostgreSQL did not accept connections within 30 s")
                time.sleep(0.05)
            yield cluster
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
            log.close()
    finally:
        shutil.rmtree(datadir, ignore_errors=True)
