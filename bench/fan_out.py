"""Fan-out: one job that N others wait for (``depends_on_index``, all in one SubmitJobs batch), on
``corral up --workers 2``'s shape. When it ends, all N become ready at once.

Per run: how long the batch took to go in; the rate at which the N then completed (every one checked
SUCCEEDED); and the slowest of the ``GetStats`` calls a prober makes every 10 ms meanwhile (how long the
control plane kept other calls waiting). Beside them the same two figures for N jobs that all fall due
at one ``scheduled_at`` instead: the same burst of ready jobs without dependencies.
"""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Callable

from bench.cluster import Cluster
from bench.report import table
from corral import Client, JobSpec


class _Prober:
    """Calls GetStats every 10 ms on its own thread; ``worst`` is the slowest round trip, in ms."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.worst = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            t0 = time.perf_counter()
            self.client.stats()
            self.worst = max(self.worst, (time.perf_counter() - t0) * 1000)
            self._stop.wait(0.01)

    def __enter__(self) -> _Prober:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _burst(
    n: int, specs: Callable[[], list[JobSpec]], ready_at: Callable[[Client, list[str]], None]
) -> tuple[float, float, float]:
    """Submit ``specs()`` (a root first, then n jobs), wait until the n may start (``ready_at``), then for
    all n: (submit seconds, completions per second after they became ready, slowest GetStats ms)."""
    with Cluster(workers=2, threads=4) as cluster, Client(cluster.address) as client:
        t0 = time.perf_counter()
        jobs = client.submit_many(specs())
        submit_s = time.perf_counter() - t0
        ids = [job.id for job in jobs[1:]]
        with _Prober(client) as prober:
            ready_at(client, [jobs[0].id])
            t1 = time.perf_counter()
            while client.stats().jobs_by_status.get("SUCCEEDED", 0) < n + 1:
                time.sleep(0.005)
            rate = n / (time.perf_counter() - t1)
        ended = [client.get(job_id) for job_id in ids]
        if any(job.state.name != "SUCCEEDED" for job in ended):
            raise SystemExit("a job of the burst did not succeed")
        return submit_s, rate, prober.worst


def run_once(n: int) -> dict[str, float]:
    def graph() -> list[JobSpec]:
        return [JobSpec("sleep", {"seconds": 0.5})] + [JobSpec("noop", depends_on_index=[0]) for _ in range(n)]

    def root_done(client: Client, root: list[str]) -> None:
        client.wait(root[0])

    submit_s, fan_rate, fan_worst = _burst(n, graph, root_done)
    due = time.time() + 3.0

    def timed() -> list[JobSpec]:
        return [JobSpec("noop")] + [JobSpec("noop", scheduled_at=due) for _ in range(n)]

    def due_now(client: Client, root: list[str]) -> None:
        time.sleep(max(0.0, due - time.time()))

    _, due_rate, due_worst = _burst(n, timed, due_now)
    return {
        "submit_s": submit_s,
        "fan_out_per_s": fan_rate,
        "fan_out_slowest_call_ms": fan_worst,
        "due_at_once_per_s": due_rate,
        "due_at_once_slowest_call_ms": due_worst,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench fan_out", description=__doc__)
    # With the one they wait for, a batch of 10,000: CORRAL_MAX_BATCH's default.
    parser.add_argument("--jobs", type=int, default=9_999, help="jobs waiting for the one (default 9999)")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    rows = [run_once(args.jobs) for _ in range(args.runs)]
    table(f"fan-out: {args.jobs} jobs waiting for one, 2 workers x 4 threads, SQLite", rows)
