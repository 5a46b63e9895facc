"""Another client's view while a benchmark does something large: its GetJob calls, one after another."""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from bench.cluster import Cluster
from corral import Client

T = TypeVar("T")


def _probe(address: str, job_id: str, stop: threading.Event, out: list[float]) -> None:
    with Client(address) as client:
        client.get(job_id)  # the channel is up before the timing starts
        while not stop.is_set():
            t0 = time.perf_counter()
            client.get(job_id)
            out.append(time.perf_counter() - t0)


@contextmanager
def other_gets(address: str, job_id: str) -> Iterator[list[float]]:
    """GetJob of ``job_id`` from another client, one call after another, for as long as the block
    runs; the list yielded holds each call's seconds once the block ends (the calls of the first
    0.2 s, while that client settles, are not counted)."""
    seconds: list[float] = []
    stop = threading.Event()
    prober = threading.Thread(target=_probe, args=(address, job_id, stop, seconds))
    prober.start()
    time.sleep(0.2)
    seconds.clear()
    try:
        yield seconds
    finally:
        stop.set()
        prober.join()


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
