"""Another client's view while a benchmark does something large: its GetJob calls, one after another.

That client is a process of its own. A thread of the benchmark's process would share its interpreter
lock with the work it watches: building a 10,000-job request and reading the answer hold it for tens
of ms, which would be counted as the control plane's delay.
"""

from __future__ import annotations

import multiprocessing
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Event
from typing import TypeVar

from bench.cluster import Cluster
from corral import Client

T = TypeVar("T")


def _probe(address: str, job_id: str, ready: Event, stop: Event, out: Connection) -> None:
    """Each call's start (monotonic, shared by every process here) and seconds, sent once stopped."""
    calls: list[tuple[float, float]] = []
    with Client(address) as client:
        client.get(job_id)  # the channel is up before the timing starts
        ready.set()
        while not stop.is_set():
            t0 = time.monotonic()
            client.get(job_id)
            calls.append((t0, time.monotonic() - t0))
    out.send(calls)


@contextmanager
def other_gets(address: str, job_id: str) -> Iterator[list[float]]:
    """GetJob of ``job_id`` from another client process, one call after another, for as long as the
    block runs; the list yielded holds, once the block ends, the seconds of each call that started
    within it."""
    seconds: list[float] = []
    spawn = multiprocessing.get_context("spawn")  # not fork: this process has gRPC's threads
    ready, stop = spawn.Event(), spawn.Event()
    receive, send = spawn.Pipe(duplex=False)
    prober = spawn.Process(target=_probe, args=(address, job_id, ready, stop, send), daemon=True)
    prober.start()
    try:
        if not ready.wait(60):
            raise RuntimeError("the other client did not reach the control plane within 60 s")
        start = time.monotonic()
        yield seconds
        end = time.monotonic()
    finally:
        stop.set()
        calls = receive.recv() if receive.poll(60) else []
        prober.join(10)
    seconds += [took for t0, took in calls if start <= t0 <= end]


def summary(seconds: list[float]) -> dict[str, float]:
    """The p50, p99 and longest of the calls, in ms, and how many there were."""
    if len(seconds) < 2:
        raise RuntimeError(f"the other client finished {len(seconds)} GetJob calls meanwhile: too few to sum up")
    quantiles = statistics.quantiles(seconds, n=100, method="inclusive")
    return {
        "other_get_p50_ms": quantiles[49] * 1e3,
        "other_get_p99_ms": quantiles[98] * 1e3,
        "other_get_max_ms": max(seconds) * 1e3,
        "other_gets": len(seconds),
    }


def beside_gets(cluster: Cluster, job_id: str, jobs: int, step: Callable[[], T]) -> tuple[T, dict[str, float]]:
    """Run ``step`` (work on ``jobs`` jobs) while another client reads ``job_id`` (:func:`other_gets`);
    returns what it returned and a row: its seconds, the control plane's CPU per job, and
    :func:`summary` of the other client's calls."""
    with other_gets(cluster.address, job_id) as probes:
        cpu0 = cluster.cpu_seconds()
        t0 = time.perf_counter()
        result = step()
        seconds = time.perf_counter() - t0
        cpu = cluster.cpu_seconds()
    return result, {
        "seconds": seconds,
        "control_us_per_job": (cpu["control"] - cpu0["control"]) / jobs * 1e6,
        **summary(probes),
    }
