"""After a quiet: how this machine runs code that has not run for a while.

A job crosses four processes (client, control plane, worker agent, runner), and each runs some
hundreds of µs of Python and gRPC for it. When jobs come back to back that code runs hot. When a
process has waited (for a long job to end, or for the next of a client's sequential submissions),
it runs cold: its code and data are no longer in the CPU's caches. How much colder depends on the
machine, and on a shared virtual machine on what its neighbours do. This benchmark times the same
pieces right after quiets of increasing length:

- ``work_us``: a fixed piece of pure Python (JSON round trips of a small job-like object) right
  after the quiet, spent asleep;
- ``work_spun_us``: the same when the quiet was spent spinning on the clock, so that the core never
  idled: if this is as slow, the cost is the caches', not the core waking;
- ``kept_stream_ms``: one message there and back on a kept bidirectional gRPC stream to a bare
  server (:mod:`bench.grpc_floor`) after the quiet: one hop of a job between two processes is half
  of it;
- ``*_x_hot``: each against its figure with no quiet.

Each figure is the median of ``--samples`` tries; each row the median of ``--runs`` runs.
``python -m bench quiet`` prints the table. The benchmarks whose jobs leave processes waiting
(``cpu``: 20 ms jobs on one-slot workers; ``latency``: one job at a time) pay the longer rows.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from bench.grpc_floor import KeptStream, bare_server
from bench.report import rows_by

QUIETS_MS = (0.0, 1.0, 5.0, 25.0, 100.0)
_DOC = {"type": "noop", "payload": {"n": list(range(40))}, "labels": {"team": "a"}, "priority": 5}


def work() -> float:
    """Time a fixed piece of pure Python, in µs."""
    t0 = time.perf_counter()
    for _ in range(20):
        json.loads(json.dumps(_DOC))
    return (time.perf_counter() - t0) * 1e6


def spin(seconds: float) -> None:
    """Keep the core busy on the clock for ``seconds``."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def after(quiet: float, samples: int, kept: KeptStream) -> dict[str, float]:
    """Medians of each piece right after ``quiet`` seconds."""
    asleep, spun, stream = [], [], []
    for _ in range(samples):
        time.sleep(quiet)
        asleep.append(work())
        spin(quiet)
        spun.append(work())
        time.sleep(quiet)
        stream.append(kept.round_trip_ms())
    return {
        "work_us": statistics.median(asleep),
        "work_spun_us": statistics.median(spun),
        "kept_stream_ms": statistics.median(stream),
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--samples", type=int, default=40)
    p.add_argument("--runs", type=int, default=3)
    a = p.parse_args(argv)
    with bare_server() as (_, channel):
        kept = KeptStream(channel)
        for _ in range(20):  # warm up: the stream's first messages set it up
            kept.round_trip_ms()
        runs = [{q: after(q / 1000, a.samples, kept) for q in QUIETS_MS} for _ in range(a.runs)]
        kept.close()
    rows: dict[str, dict[str, float]] = {}
    for q in QUIETS_MS:
        row = {c: statistics.median(run[q][c] for run in runs) for c in runs[0][q]}
        rows[f"{q:g}"] = row
    hot = dict(rows[f"{QUIETS_MS[0]:g}"])
    for row in rows.values():
        row.update({f"{c}_x_hot": row[c] / hot[c] for c in hot})
    rows_by(
        f"after a quiet: the same work, hot and cold (medians of {a.samples} tries, {a.runs} runs)", "quiet_ms", rows
    )


if __name__ == "__main__":
    main()
