"""Latency: sequential submit -> SUCCEEDED round trips of noop jobs on an idle worker (p50, p99).

A client that waits for its job can make two calls, SubmitJob then WatchJob (the ``p*_ms`` columns),
or one, RunJob (the ``run_*`` columns); the two alternate. Each round trip is timed from the first
call to the arrival of the SUCCEEDED event: the moment the client has its answer. The stream's close
(its status, which follows the last event) is read after the clock stops.

``grpc_floor_ms`` is the same two calls against a bare gRPC server that does nothing (see
:mod:`bench.grpc_floor`), measured just before each run, and ``run_floor_ms`` the one stream call:
what no scheduler built on gRPC can go below on this machine. ``over_floor_ms`` and
``run_over_floor_ms`` are the p50s minus those floors: what Corral's own work costs.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from bench import grpc_floor
from bench.cluster import Cluster, add_postgres_flag, store_name
from bench.report import table
from corral.v1 import jobs_pb2


def run_once(n: int, postgres: str = "") -> dict[str, float]:
    floor, run_floor = grpc_floor.measure(n)
    with Cluster(workers=1, threads=1, postgres=postgres) as c:
        req = jobs_pb2.SubmitJobRequest(type="noop")
        for _ in range(20):  # warm up connections and code paths
            job = c.jobs.SubmitJob(req).job
            list(c.jobs.WatchJob(jobs_pb2.WatchJobRequest(id=job.id)))
            list(c.jobs.RunJob(req))
        two_calls, one_call = [], []
        for _ in range(n):  # the two ways alternate, so that the machine's noise falls on both alike
            t0 = time.perf_counter()
            job = c.jobs.SubmitJob(req).job
            two_calls.append(_until_succeeded(c.jobs.WatchJob(jobs_pb2.WatchJobRequest(id=job.id)), t0))
            t0 = time.perf_counter()
            one_call.append(_until_succeeded(c.jobs.RunJob(req), t0))
    q = statistics.quantiles(two_calls, n=100)
    p50 = statistics.median(two_calls)
    run_q = statistics.quantiles(one_call, n=100)
    run_p50 = statistics.median(one_call)
    return {
        "p50_ms": p50,
        "p90_ms": q[89],
        "p99_ms": q[98],
        "max_ms": max(two_calls),
        "grpc_floor_ms": floor,
        "over_floor_ms": p50 - floor,
        "run_p50_ms": run_p50,
        "run_p99_ms": run_q[98],
        "run_floor_ms": run_floor,
        "run_over_floor_ms": run_p50 - run_floor,
    }


def _until_succeeded(stream: Any, t0: float) -> float:
    """Milliseconds from ``t0`` to the SUCCEEDED event of ``stream``; the stream's close (its status,
    which follows the last event) is read after the clock stops."""
    for event in stream:
        if event.job.state == jobs_pb2.Job.SUCCEEDED:
            elapsed = (time.perf_counter() - t0) * 1000
            break
    else:
        raise AssertionError(f"job ended {jobs_pb2.Job.State.Name(event.job.state)}")
    assert not list(stream), "events after SUCCEEDED"
    return elapsed


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
