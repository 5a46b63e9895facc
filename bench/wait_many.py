"""Waiting for a batch: N noop jobs submitted in one SubmitJobs call on ``corral up --workers 2``'s
shape, then waited for by the client, three ways:

- ``wait_each``: ``Client.wait`` for each job in turn (one WatchJob stream per job);
- ``wait_all``: ``Client.wait_all`` (one WatchJobs stream that carries only the ends);
- ``watch_many``: ``Client.watch_many`` (the same stream with every change of every job).

Per way: the seconds from the submission to the last end known to the client (every job checked
SUCCEEDED), the messages the client read, and the CPU the control plane and the client used over that
time, per job (it includes running the jobs, the same for every way).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from bench.cluster import Cluster
from bench.report import alternating, table
from corral import Client, Job, JobSpec


def _wait_each(client: Client, ids: list[str]) -> tuple[list[Job], int]:
    return [client.wait(job_id) for job_id in ids], len(ids)


def _wait_all(client: Client, ids: list[str]) -> tuple[list[Job], int]:
    ends = client.wait_all(ids)
    return ends, len(ends)


def _watch_many(client: Client, ids: list[str]) -> tuple[list[Job], int]:
    last: dict[str, Job] = {}
    messages = 0
    for job in client.watch_many(ids):
        last[job.id] = job
        messages += 1
    return [last[job_id] for job_id in ids], messages


WAYS: dict[str, Callable[[Client, list[str]], tuple[list[Job], int]]] = {
    "wait_each": _wait_each,
    "wait_all": _wait_all,
    "watch_many": _watch_many,
}


def run_once(way: str, n: int) -> dict[str, float]:
    with Cluster(workers=2, threads=4) as cluster, Client(cluster.address) as client:
        specs = [JobSpec("noop") for _ in range(n)]
        cpu0 = cluster.cpu_seconds()
        t0 = time.perf_counter()
        ids = [job.id for job in client.submit_many(specs)]
        ends, messages = WAYS[way](client, ids)
        seconds = time.perf_counter() - t0
        cpu = cluster.cpu_seconds()
        assert [job.id for job in ends] == ids and {job.state.name for job in ends} == {"SUCCEEDED"}
    return {
        "seconds": seconds,
        "messages": messages,
        "control_us_per_job": (cpu["control"] - cpu0["control"]) / n * 1e6,
        "client_us_per_job": (cpu["client"] - cpu0["client"]) / n * 1e6,
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--jobs", type=int, default=5000)
    p.add_argument("--runs", type=int, default=3)
    a = p.parse_args(argv)
    for way, runs in alternating(WAYS, lambda way: run_once(way, a.jobs), a.runs).items():
        table(f"waiting for a batch, {way}: {a.jobs} noop jobs, 2 workers x 4 threads", runs)
