"""Cancelling a batch: N queued noop jobs (no worker, so none starts), all with one label, cancelled
two ways, alternated run by run:

- ``cancel_each``: ``Client.cancel`` for each job in turn (one CancelJob call, one commit each);
- ``cancel_many``: ``Client.cancel_many(labels=...)``, one CancelJobs call (10,000 jobs at most,
  committed 1,000 to a transaction with a loop turn between).

Per way: the seconds from the first call to the last answer (every job then read back CANCELLED), the
control plane's CPU per job, and what another client saw meanwhile: the p50 and p99 of GetJob calls it
made one after another for the whole time (a large cancel must not stall the control plane's other
calls).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from bench.cluster import Cluster
from bench.probe import beside_gets
from bench.report import alternating, table
from corral import Client, JobSpec

LABEL = {"batch": "bench"}


def _cancel_each(client: Client, ids: list[str]) -> None:
    for job_id in ids:
        client.cancel(job_id)


def _cancel_many(client: Client, ids: list[str]) -> None:
    done = client.cancel_many(labels=LABEL)
    assert done.ids == ids and done.remaining == 0


WAYS: dict[str, Callable[[Client, list[str]], None]] = {"cancel_each": _cancel_each, "cancel_many": _cancel_many}


def run_once(way: str, n: int) -> dict[str, float]:
    with Cluster(workers=0) as cluster, Client(cluster.address) as client:
        ids = [job.id for job in client.submit_many([JobSpec("noop", labels=LABEL) for _ in range(n)])]
        other = client.submit("noop").id
        _, row = beside_gets(cluster, other, n, lambda: WAYS[way](client, ids))
        page = client.list(status=["CANCELLED"], limit=1)
        assert page.total == n, f"{page.total} of {n} CANCELLED"
    return row


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--jobs", type=int, default=10_000)
    p.add_argument("--runs", type=int, default=3)
    a = p.parse_args(argv)
    for way, runs in alternating(WAYS, lambda way: run_once(way, a.jobs), a.runs).items():
        table(f"cancelling a batch, {way}: {a.jobs} queued noop jobs, one label", runs)
