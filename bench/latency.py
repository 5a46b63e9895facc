"""Latency: sequential submit -> SUCCEEDED round trips of noop jobs on an idle worker (p50, p99).

Each round trip is one SubmitJob plus a WatchJob, as a client that waits for its job would do it,
timed from the SubmitJob call to the arrival of the SUCCEEDED event: the moment the client has its
answer. The stream's close (its status, which follows the last event) is read after the clock stops.

``grpc_floor_ms`` is the same two calls against a bare gRPC server that does nothing (see
:mod:`bench.grpc_floor`), measured just before each run: what no scheduler built on gRPC can go below
on this machine. ``over_floor_ms`` is the p50 minus that floor: what Corral's own work costs.
"""

from __future__ import annotations

import argparse
import statistics
import time

from bench import grpc_floor
from bench.cluster import Cluster, add_postgres_flag, store_name
from bench.report import table
from corral.v1 import jobs_pb2


def run_once(n: int, postgres: str = "") -> dict[str, float]:
    floor = grpc_floor.measure(n)
    with Cluster(workers=1, threads=1, postgres=postgres) as c:
        req = jobs_pb2.SubmitJobRequest(type="noop")
        for _ in range(20):  # warm up connections and code paths
            job = c.jobs.SubmitJob(req).job
            list(c.jobs.WatchJob(jobs_pb2.WatchJobRequest(id=job.id)))
        samples = []
        for _ in range(n):
            t0 = time.perf_counter()
            job = c.jobs.SubmitJob(req).job
            stream = c.jobs.WatchJob(jobs_pb2.WatchJobRequest(id=job.id))
            for event in stream:
                if event.job.state == jobs_pb2.Job.SUCCEEDED:
                    samples.append((time.perf_counter() - t0) * 1000)
                    break
            else:
                raise AssertionError(f"job {job.id} ended {jobs_pb2.Job.State.Name(event.job.state)}")
            assert not list(stream), "events after SUCCEEDED"  # reads the stream's close
    q = statistics.quantiles(samples, n=100)
    p50 = statistics.median(samples)
    return {
        "p50_ms": p50,
        "p90_ms": q[89],
        "p99_ms": q[98],
        "max_ms": max(samples),
        "grpc_floor_ms": floor,
        "over_floor_ms": p50 - floor,
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--jobs", type=int, default=300)
    p.add_argument("--runs", type=int, default=3)
    add_postgres_flag(p)
    a = p.parse_args(argv)
    table(
        f"latency: {a.jobs} sequential submit -> SUCCEEDED round trips, 1 idle worker, {store_name(a.postgres)}",
        [run_once(a.jobs, a.postgres) for _ in range(a.runs)],
    )


if __name__ == "__main__":
    main()
