"""CPU-bound: pure-Python loops over range(N) on 2 one-slot workers, against the 2-core ideal.

The ideal is jobs x (one loop's time, measured here in-process) / 2. Efficiency = ideal / makespan.
"""

from __future__ import annotations

import argparse
import statistics
import time

from bench.cluster import Cluster
from bench.report import table
from corral.v1 import jobs_pb2


def one_loop(n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        pass
    return time.perf_counter() - t0


def run_once(jobs: int, n: int) -> dict[str, float]:
    single = statistics.median(one_loop(n) for _ in range(5))
    with Cluster(workers=2, threads=1, imports=("tests.support.jobtypes",)) as c:
        req = jobs_pb2.SubmitJobRequest(type="py_loop")
        req.payload.update({"n": n})
        t0 = time.perf_counter()
        c.jobs.SubmitJobs(jobs_pb2.SubmitJobsRequest(jobs=[req] * jobs))
        while c.jobs.GetStats(jobs_pb2.GetStatsRequest()).jobs_by_status["SUCCEEDED"] < jobs:
            time.sleep(0.01)
        makespan = time.perf_counter() - t0
    ideal = jobs * single / 2
    return {"one_loop_s": single, "ideal_s": ideal, "makespan_s": makespan, "efficiency_pct": 100 * ideal / makespan}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--jobs", type=int, default=40)
    p.add_argument("--n", type=int, default=2_000_000)
    p.add_argument("--runs", type=int, default=3)
    a = p.parse_args(argv)
    rows = [run_once(a.jobs, a.n) for _ in range(a.runs)]
    table(f"cpu-bound: {a.jobs} jobs of `for _ in range({a.n:,})`, 2 workers x 1 slot", rows)


if __name__ == "__main__":
    main()
