"""Backlog: control-plane memory with 100,000 queued jobs, how long a restart takes to load them and the
memory after it, and the dispatch rate with that backlog beside the rate with an empty queue."""

from __future__ import annotations

import argparse
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


def run_once(backlog: int, measure: int) -> dict[str, float]:
    reqs = [jobs_pb2.SubmitJobRequest(type="noop") for _ in range(1000)]
    with Cluster(workers=0, threads=4) as c:
        empty_rss = c.rss_mb()
        t0 = time.perf_counter()
        for _ in range(backlog // 1000):
            c.jobs.SubmitJobs(jobs_pb2.SubmitJobsRequest(jobs=reqs), timeout=120)
        submit_rate = backlog / (time.perf_counter() - t0)
        full_rss = c.rss_mb()
        restart_sec = c.restart_control()
        restart_rss = c.rss_mb()
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
