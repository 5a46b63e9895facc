"""Latency: sequential submit -> SUCCEEDED round trips of noop jobs on an idle worker (p50, p99).

A client that waits for its job can make two calls, SubmitJob then WatchJob (the ``p*_ms`` columns),
one, RunJob (``run_*``), or none of its own: send the job on a RunJobs stream kept open from one job to
the next (``kept_*``), as ``corral.Client.run`` does; ``client_p50_ms`` is ``Client.run`` itself, the
Python client's own work included. The ways alternate, job by job. Each round trip is timed from the
first call (or the request) to the arrival of the SUCCEEDED event: the moment the client has its
answer. A call's close (its status, which follows the last event) is read after the clock stops.

``grpc_floor_ms``, ``run_floor_ms`` and ``kept_floor_ms`` are the same shapes against a bare gRPC
server that does nothing (see :mod:`bench.grpc_floor`), measured just before each run: what no
scheduler built on gRPC can go below on this machine; ``*_over_floor_ms`` are the p50s minus them,
what Corral's own work costs. A second table splits the RunJob round trips by the job's own times
(see :func:`_phases`).
"""

from __future__ import annotations

import argparse
import queue
import statistics
import time
from typing import Any

import corral
from bench import grpc_floor
from bench.cluster import Cluster, add_postgres_flag, store_name
from bench.report import table
from corral.v1 import jobs_pb2


def run_once(n: int, postgres: str = "") -> tuple[dict[str, float], dict[str, float]]:
    """One run: the latency row, and where the RunJob round trips' time went."""
    floor = grpc_floor.measure(n)
    with Cluster(workers=1, threads=1, postgres=postgres) as c, corral.Client(c.address) as client:
        req = jobs_pb2.SubmitJobRequest(type="noop")
        for _ in range(20):  # warm up connections and code paths
            job = c.jobs.SubmitJob(req).job
            list(c.jobs.WatchJob(jobs_pb2.WatchJobRequest(id=job.id)))
            list(c.jobs.RunJob(req))
            client.run("noop")
        outbox: queue.SimpleQueue[jobs_pb2.RunJobsRequest | None] = queue.SimpleQueue()
        stream = c.jobs.RunJobs(iter(outbox.get, None))
        two_calls, one_call, kept, through_client, phases = [], [], [], [], []
        for i in range(n):  # the ways alternate, so that the machine's noise falls on all alike
            t0 = time.perf_counter()
            job = c.jobs.SubmitJob(req).job
            two_calls.append(_until_succeeded(c.jobs.WatchJob(jobs_pb2.WatchJobRequest(id=job.id)), t0)[0])
            t0, sent = time.perf_counter(), time.time()
            elapsed, done = _until_succeeded(c.jobs.RunJob(req), t0)
            one_call.append(elapsed)
            phases.append(_phases(done, sent, sent + elapsed / 1000))
            t0 = time.perf_counter()
            outbox.put(jobs_pb2.RunJobsRequest(tag=str(i), job=req))
            kept.append(_until_succeeded((e.event for e in stream), t0, closes=False)[0])
            t0 = time.perf_counter()
            ran = client.run("noop")
            through_client.append((time.perf_counter() - t0) * 1000)
            assert ran.state is corral.JobState.SUCCEEDED, ran
        outbox.put(None)
        assert not list(stream), "events after the last SUCCEEDED"
    row: dict[str, float] = {}
    for name, times, floor_ms in (("", two_calls, floor.two_calls_ms), ("run_", one_call, floor.one_call_ms),
                                  ("kept_", kept, floor.kept_stream_ms)):  # fmt: skip
        p50 = statistics.median(times)
        row |= {
            f"{name}p50_ms": p50,
            f"{name}p99_ms": statistics.quantiles(times, n=100)[98],
            f"{name or 'grpc_'}floor_ms": floor_ms,
            f"{name}over_floor_ms": p50 - floor_ms,
        }
    row["client_p50_ms"] = statistics.median(through_client)
    return row, {name: statistics.median(p[name] for p in phases) for name in phases[0]}


def _phases(job: jobs_pb2.Job, sent: float, answered: float) -> dict[str, float]:
    """Where one RunJob round trip went, in ms, from the job's own times (the control plane's clock,
    which is this machine's): until the job was stored, until it was leased, until its result reached
    the control plane (of which the worker's own run of it: ``exec``), and until the client had it."""
    created, started, finished = (t.ToMicroseconds() / 1e6 for t in (job.created_at, job.started_at, job.finished_at))
    return {
        "to_stored_ms": (created - sent) * 1000,
        "stored_to_leased_ms": (started - created) * 1000,
        "leased_to_result_ms": (finished - started) * 1000,
        "of_which_worker_exec_ms": job.exec_seconds * 1000,
        "result_to_client_ms": (answered - finished) * 1000,
    }


def _until_succeeded(stream: Any, t0: float, closes: bool = True) -> tuple[float, jobs_pb2.Job]:
    """Milliseconds from ``t0`` to the SUCCEEDED event of ``stream``, and that job; the stream's close
    (its status, which follows the last event) is read after the clock stops, if it ``closes`` then."""
    for event in stream:
        if event.job.state == jobs_pb2.Job.SUCCEEDED:
            elapsed = (time.perf_counter() - t0) * 1000
            break
    else:
        raise AssertionError(f"job ended {jobs_pb2.Job.State.Name(event.job.state)}")
    if closes:
        assert not list(stream), "events after SUCCEEDED"
    return elapsed, event.job


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--jobs", type=int, default=300)
    p.add_argument("--runs", type=int, default=3)
    add_postgres_flag(p)
    a = p.parse_args(argv)
    runs = [run_once(a.jobs, a.postgres) for _ in range(a.runs)]
    table(
        f"latency: {a.jobs} sequential submit -> SUCCEEDED round trips, 1 idle worker, {store_name(a.postgres)}",
        [row for row, _ in runs],
    )
    table("where a RunJob round trip went (medians, ms)", [phases for _, phases in runs])


if __name__ == "__main__":
    main()
