"""A large batch: one SubmitJobs call of N noop jobs (no worker, so none starts), and what another
client saw meanwhile: the p50, p99 and longest of GetJob calls it made one after another.

The batch goes in with one commit, all of it or none. Its conversion, its checks, the making of its
records and store rows (for a batch without idempotency keys or dependencies) and its answer take
loop turns of 1,000 jobs (``control.turns``); the jobs are then queued in one go, and the transaction
that writes them runs on the store's writer thread (``control.store.sqlite.OFFLOAD_ROWS``), so the
longest call measures what still holds the event loop in one piece. The other client is a process of
its own (``bench.probe``).
"""

from __future__ import annotations

import argparse

from bench.cluster import Cluster
from bench.probe import beside_gets
from bench.report import table
from corral import Client, JobSpec


def run_once(n: int) -> dict[str, float]:
    with Cluster(workers=0) as cluster, Client(cluster.address) as client:
        other = client.submit("noop").id
        specs = [JobSpec("noop") for _ in range(n)]
        jobs, row = beside_gets(cluster, other, n, lambda: client.submit_many(specs))
        assert len(jobs) == n
        page = client.list(status=["PENDING"], limit=1)
        assert page.total == n + 1, f"{page.total} of {n + 1} PENDING"
    return row


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--jobs", type=int, default=10_000)
    p.add_argument("--runs", type=int, default=3)
    a = p.parse_args(argv)
    table(f"a large batch: one SubmitJobs of {a.jobs:,} noop jobs, another client's GetJob meanwhile",
          [run_once(a.jobs) for _ in range(a.runs)])  # fmt: skip
