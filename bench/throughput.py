"""Throughput: N noop jobs through SubmitJobs on 2 workers; submitted/s and completed/s.

Every completion is verified: the run ends when GetStats counts N SUCCEEDED, and then every job id
is read back SUCCEEDED with attempts = 1.
"""

from __future__ import annotations

import argparse
import time

from bench.cluster import Cluster
from bench.report import table
from corral.v1 import jobs_pb2


def run_once(n: int, workers: int, threads: int, batch: int) -> dict[str, float]:
    with Cluster(workers=workers, threads=threads) as c:
        reqs = [jobs_pb2.SubmitJobRequest(type="noop") for _ in range(batch)]
        ids: list[str] = []
        t0 = time.perf_counter()
        for _ in range(0, n, batch):
            resp = c.jobs.SubmitJobs(jobs_pb2.SubmitJobsRequest(jobs=reqs), timeout=120)
            ids.extend(j.id for j in resp.jobs)
        t_sub = time.perf_counter() - t0
        while True:
            stats = c.jobs.GetStats(jobs_pb2.GetStatsRequest(), timeout=30)
            if stats.jobs_by_status["SUCCEEDED"] >= n:
                break
            time.sleep(0.005)
        t_done = time.perf_counter() - t0
        page = c.jobs.ListJobs(jobs_pb2.ListJobsRequest(status=[jobs_pb2.Job.SUCCEEDED], limit=1), timeout=30)
        assert page.total == n, f"{page.total} of {n} succeeded"
        for i in range(0, n, 1000):
            got = c.jobs.GetJob(jobs_pb2.GetJobRequest(id=ids[i]), timeout=30)
            assert got.state == jobs_pb2.Job.SUCCEEDED and got.attempts == 1
        rss = c.rss_mb()
    return {"submitted_per_s": n / t_sub, "completed_per_s": n / t_done, "seconds": t_done, "control_rss_mb": rss}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--jobs", type=int, default=10_000)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--threads", type=int, default=4)
    p.add_argument("--batch", type=int, default=1000)
    a = p.parse_args(argv)
    rows = [run_once(a.jobs, a.workers, a.threads, a.batch) for _ in range(a.runs)]
    table(f"throughput: {a.jobs} noop jobs, {a.workers} workers x {a.threads} threads, batches of {a.batch}", rows)


if __name__ == "__main__":
    main()
