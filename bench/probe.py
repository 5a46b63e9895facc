"""Another client's view while a benchmark does something large: its GetJob calls, one after another."""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from corral import Client


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
    quantiles = statistics.quantiles(seconds, n=100, method="inclusive")
    return {
        "other_get_p50_ms": quantiles[49] * 1e3,
        "other_get_p99_ms": quantiles[98] * 1e3,
        "other_get_max_ms": max(seconds) * 1e3,
        "other_gets": len(seconds),
    }
