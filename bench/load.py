"""Load shapes shared by the benchmarks: sequential latencies and concurrent throughput of a call."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


def latencies_ms(call: Callable[[], None], n: int, warmup: int = 30) -> list[float]:
    """``n`` sequential calls (after ``warmup`` untimed ones), each one's time in ms."""
    for _ in range(warmup):  # connections and code paths warm
        call()
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        call()
        out.append((time.perf_counter() - t0) * 1000)
    return out


def throughput(make: Callable[[], Callable[[], None]], threads: int, per_thread: int) -> float:
    """Calls per second of ``threads`` threads, each making ``per_thread`` calls with its own ``make()``."""
    calls = [make() for _ in range(threads)]
    start = threading.Barrier(threads + 1)

    def work(call: Callable[[], None]) -> None:
        start.wait()
        for _ in range(per_thread):
            call()

    pool = [threading.Thread(target=work, args=(c,)) for c in calls]
    for t in pool:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in pool:
        t.join()
    return threads * per_thread / (time.perf_counter() - t0)
