"""Backlog: control-plane memory with 100,000 queued jobs, how long a restart takes to load them and the
memory after it, how long the queue view takes with them, and the dispatch rate with that backlog
beside the rate with an empty queue.

``queue_view_ms`` is one ``ListJobs`` call with order QUEUE (the first 50 places; the median of 5 calls,
round trip); ``queue_view_filtered_ms`` the same for the last 1,000 jobs of the backlog, which are of
another type (``add_numbers``): the worst case, where the places of a page at the back of the queue need
every job ranked in order."""

from __future__ import annotations

import argparse
import statistics
import time

from bench.cluster import Cluster
from bench.report import table
from corral.v1 import jobs_pb2


def _completed(c: Cluster) -> int:
    return int(c.jobs.GetStats(jobs_pb2.GetStatsRequest()).jobs_by_status["SUCCEEDED"])


def _rate(c: Cluster, base: int, count: int, t0: float) -> float:
    """Completions per second from ``t0`` until ``count`` more than ``base`` have succeeded."""
    while _completed(c) - base < count:
        time.sleep(0.005)
    return count / (time.perf_counter() - t0)


def _queue_view_ms(c: Cluster, job_type: str = "") -> float:
    """The median round trip, in ms, of 5 queue views (the first 50 places of ``job_type``, any when empty)."""
    request = jobs_pb2.ListJobsRequest(order=jobs_pb2.ListJobsRequest.QUEUE, type=job_type, limit=50)
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        c.jobs.ListJobs(request, timeout=60)
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def run_once(backlog: int, measure: int) -> dict[str, float]:
    reqs = [jobs_pb2.SubmitJobRequest(type="noop") for _ in range(1000)]
    others = jobs_pb2.SubmitJobsRequest(jobs=[jobs_pb2.SubmitJobRequest(type="add_numbers") for _ in range(1000)])
    for req in others.jobs:
        req.payload.update({"a": 1, "b": 2})
    with Cluster(workers=0, threads=4) as c:
        empty_rss = c.rss_mb()
        t0 = time.perf_counter()
        for _ in range(backlog // 1000 - 1):
            c.jobs.SubmitJobs(jobs_pb2.SubmitJobsRequest(jobs=reqs), timeout=120)
        c.jobs.SubmitJobs(others, timeout=120)
        submit_rate = backlog / (time.perf_counter() - t0)
        full_rss = c.rss_mb()
        restart_sec = c.restart_control()
        restart_rss = c.rss_mb()
        view_ms = _queue_view_ms(c)
        view_filtered_ms = _queue_view_ms(c, "add_numbers")
        c.add_worker()
        c.add_worker()
        c.wait_for_workers(2)
        busy_rate = _rate(c, _completed(c), measure, time.perf_counter())
    with Cluster(workers=2, threads=4) as c:
        t0 = time.perf_counter()
        for _ in range(measure // 1000):
            c.jobs.SubmitJobs(jobs_pb2.SubmitJobsRequest(jobs=reqs), timeout=120)
        empty_rate = _rate(c, 0, measure, t0)
    return {
        "rss_empty_mb": empty_rss,
        "rss_backlog_mb": full_rss,
        "restart_s": restart_sec,
        "rss_restarted_mb": restart_rss,
        "queue_view_ms": view_ms,
        "queue_view_filtered_ms": view_filtered_ms,
        "submit_per_s": submit_rate,
        "dispatch_backlog_per_s": busy_rate,
        "dispatch_empty_per_s": empty_rate,
        "ratio": busy_rate / empty_rate,
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--backlog", type=int, default=100_000)
    p.add_argument("--measure", type=int, default=10_000)
    p.add_argument("--runs", type=int, default=3)
    a = p.parse_args(argv)
    rows = [run_once(a.backlog, a.measure) for _ in range(a.runs)]
    table(f"backlog: {a.backlog:,} queued noop jobs; dispatch rate over {a.measure:,} completions", rows)


if __name__ == "__main__":
    main()
