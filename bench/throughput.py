"""Throughput: N noop jobs through SubmitJobs on 2 workers; submitted/s and completed/s.

Every completion is verified: the run ends when GetStats counts N SUCCEEDED (after the last job's
WatchJob stream ended), and then every job id is read back SUCCEEDED with attempts = 1.

The ``*_us_per_job`` columns are the CPU time (user + system) each part used over the timed window,
divided by N: the control plane, the worker agents, their runner processes and this client. Their sum
times ``completed_per_s`` over the machine's cores says how close the run came to using all of them.
"""

from __future__ import annotations

import argparse
import time

from bench.cluster import Cluster, add_postgres_flag, store_name
from bench.report import table
from corral.v1 import jobs_pb2


def run_once(n: int, workers: int, threads: int, batch: int, postgres: str = "") -> dict[str, float]:
    with Cluster(workers=workers, threads=threads, postgres=postgres) as c:
        reqs = [jobs_pb2.SubmitJobRequest(type="noop") for _ in range(batch)]
        ids: list[str] = []
        cpu0 = c.cpu_seconds()
        t0 = time.perf_counter()
        for _ in range(0, n, batch):
            resp = c.jobs.SubmitJobs(jobs_pb2.SubmitJobsRequest(jobs=reqs), timeout=120)
            ids.extend(j.id for j in resp.jobs)
        t_sub = time.perf_counter() - t0
        # Jobs start in submission order, so the last one is about the last to finish: wait on its
        # stream (no polling load on the control plane while it works), then poll for any stragglers.
        for _ in c.jobs.WatchJob(jobs_pb2.WatchJobRequest(id=ids[-1]), timeout=120):
            pass
        deadline = time.monotonic() + 120
        while (done := c.jobs.GetStats(jobs_pb2.GetStatsRequest(), timeout=30).jobs_by_status["SUCCEEDED"]) < n:
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {done} of {n} jobs SUCCEEDED 120 s after the last one finished")
            time.sleep(0.005)
        t_done = time.perf_counter() - t0
        cpu = {part: (used - cpu0[part]) / n * 1e6 for part, used in c.cpu_seconds().items()}
        # Outside the timed part: every job id read back SUCCEEDED on its first attempt.
        seen: dict[str, int] = {}
        offset = 0
        while True:  # a page may hold fewer than its limit: go on from what it held
            page = c.jobs.ListJobs(
                jobs_pb2.ListJobsRequest(status=[jobs_pb2.Job.SUCCEEDED], limit=1000, offset=offset), timeout=30
            )
            if not page.jobs:
                break
            offset += len(page.jobs)
            seen.update((j.id, j.attempts) for j in page.jobs)
        assert page.total == n, f"{page.total} of {n} succeeded"
        assert set(seen) == set(ids), "the SUCCEEDED jobs are not the submitted ones"
        assert set(seen.values()) == {1}, "some job ran more than once"
        rss = c.rss_mb()
    return {
        "submitted_per_s": n / t_sub,
        "completed_per_s": n / t_done,
        "seconds": t_done,
        "control_rss_mb": rss,
        **{f"{part}_us_per_job": us for part, us in cpu.items()},
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--jobs", type=int, default=10_000)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--threads", type=int, default=4)
    p.add_argument("--batch", type=int, default=1000)
    add_postgres_flag(p)
    a = p.parse_args(argv)
    rows = [run_once(a.jobs, a.workers, a.threads, a.batch, a.postgres) for _ in range(a.runs)]
    store = store_name(a.postgres)
    title = f"throughput: {a.jobs} noop jobs, {a.workers} workers x {a.threads} threads, batches of {a.batch}, {store}"
    table(title, rows)


if __name__ == "__main__":
    main()
