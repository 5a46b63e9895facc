"""ListJobs by labels on a large SQLite store: N finished jobs (1,000,000 by default), one in ten
labelled ``batch=b<0..99>`` and ``team=edge``, written straight through the store (no control plane:
this measures the store's read).

Per run, in ms: a page of 50 for one label (first page, and at offset 5,000), for both labels, and for
a label no job has, each with its total, through ``SQLiteStore.list_jobs`` (the label index); beside
each, the same page read by a scan of every job's labels (``json_each``, how it was read before the
index). And the seconds the store took to open a copy of the database without the index (it builds
the index from the stored labels, once).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sqlite3
import tempfile
import time
from pathlib import Path

from bench.report import table
from control.jobs import JobRecord, JobState
from control.store.rows import COLUMNS
from control.store.sqlite import SQLiteStore

QUERIES = {
    "one": {"batch": "b50"},
    "one_deep": {"batch": "b50"},
    "two": {"batch": "b50", "team": "edge"},
    "none": {"batch": "nope"},
}
"""Each query's labels; ``one_deep`` reads the page at offset 5,000."""


def _build(path: str, n: int) -> None:
    store = SQLiteStore(path)
    for at in range(0, n, 20_000):
        jobs = []
        for seq in range(at + 1, min(n, at + 20_000) + 1):
            job = JobRecord(id=f"job-{seq:09d}", seq=seq, type="noop", payload_json="{}", created_at=float(seq))
            if seq % 10 == 0:
                job.labels = {"batch": f"b{seq % 100}", "team": "edge"}
            job.state = JobState.SUCCEEDED
            jobs.append(job)
        store.insert(jobs)
        store.commit_now()
    store.close()


def _scan(path: str, labels: dict[str, str], offset: int) -> float:
    """The page and its total as read before the index: every job's labels through json_each."""
    where = " AND ".join(["EXISTS (SELECT 1 FROM json_each(jobs.labels) WHERE key = ? AND value = ?)"] * len(labels))
    args = [part for pair in labels.items() for part in pair]
    with sqlite3.connect(path) as conn:
        t0 = time.perf_counter()
        conn.execute(f"SELECT {COLUMNS} FROM jobs WHERE {where} ORDER BY seq DESC LIMIT 50 OFFSET ?", (*args, offset))
        conn.execute(f"SELECT COUNT(*) FROM jobs WHERE {where}", args).fetchone()
        return (time.perf_counter() - t0) * 1000


def run_once(n: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="corral-bench-") as tmp:
        path = str(Path(tmp) / "labels.db")
        _build(path, n)
        row: dict[str, float] = {}
        store = SQLiteStore(path)
        loop = asyncio.new_event_loop()
        try:
            for name, labels in QUERIES.items():
                offset = 5000 if name == "one_deep" else 0
                t0 = time.perf_counter()
                loop.run_until_complete(store.list_jobs([], "", 50, offset, (), labels))
                row[f"{name}_ms"] = (time.perf_counter() - t0) * 1000
                row[f"{name}_scan_ms"] = _scan(path, labels, offset)
        finally:
            loop.close()
            store.close()
        old = str(Path(tmp) / "old.db")
        shutil.copy(path, old)
        with sqlite3.connect(old) as conn:
            conn.execute("DROP TABLE job_labels")
        t0 = time.perf_counter()
        SQLiteStore(old).close()
        row["open_build_s"] = time.perf_counter() - t0
    return row


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--jobs", type=int, default=1_000_000)
    p.add_argument("--runs", type=int, default=3)
    a = p.parse_args(argv)
    rows = [run_once(a.jobs) for _ in range(a.runs)]
    table(f"ListJobs by labels: {a.jobs:,} jobs, one in ten labelled, SQLite", rows)
