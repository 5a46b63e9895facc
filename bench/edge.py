"""The price of the edge: gRPC submit throughput and latency with auth, rate limits and idempotency
keys all on, against all off (same machine, runs alternated).

"On" means: a bearer token checked on every call, the global and the per-client submission token
buckets both enabled (with limits far above the load, so every call pays the check and none is
refused), and a fresh idempotency key on every job (looked up, reserved and stored). The ratio
column is on / off: 1.00 costs nothing, 0.85 is the floor.
"""

from __future__ import annotations

import argparse
import statistics
import uuid
from collections.abc import Callable

from bench.cluster import Cluster
from bench.load import latencies_ms, throughput
from bench.report import table
from corral.v1 import jobs_pb2

TOKEN = "bench-client-token-0123456789abcdef"
LIMITS = {
    "RATE_LIMIT_JOBS_PER_MIN": "600000000",
    "CORRAL_RATE_LIMIT_PER_CLIENT_JOBS_PER_MIN": "600000000",
}


def _submitter(c: Cluster, keyed: bool) -> Callable[[], None]:
    def submit() -> None:
        req = jobs_pb2.SubmitJobRequest(type="noop", idempotency_key=uuid.uuid4().hex if keyed else "")
        c.jobs.SubmitJob(req, metadata=c.metadata, timeout=30)

    return submit


def measure(on: bool, n: int, threads: int, per_thread: int) -> tuple[float, float]:
    """(submits/s with ``threads`` concurrent submitters, sequential p50 in ms)."""
    with Cluster(workers=1, threads=2, env=LIMITS if on else {}, token=TOKEN if on else None) as c:
        submit = _submitter(c, keyed=on)
        for _ in range(50):  # warm up
            submit()
        # The submitter is stateless (one channel, a fresh key per call): every thread may share it
        return throughput(lambda: submit, threads, per_thread), statistics.median(latencies_ms(submit, n))


def run_once(n: int, threads: int, per_thread: int) -> dict[str, float]:
    off_tp, off_p50 = measure(False, n, threads, per_thread)
    on_tp, on_p50 = measure(True, n, threads, per_thread)
    return {
        "off_jobs_s": off_tp,
        "on_jobs_s": on_tp,
        "tput_ratio": on_tp / off_tp,
        "off_p50_ms": off_p50,
        "on_p50_ms": on_p50,
        "p50_ratio": on_p50 / off_p50,
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--jobs", type=int, default=500, help="sequential submits for the p50")
    p.add_argument("--threads", type=int, default=8, help="concurrent submitters for throughput")
    p.add_argument("--per-thread", type=int, default=250, help="submits per submitter")
    p.add_argument("--runs", type=int, default=3)
    a = p.parse_args(argv)
    table(
        f"edge cost: gRPC SubmitJob with auth + rate limits + idempotency keys on vs off, "
        f"{a.threads}x{a.per_thread} concurrent, {a.jobs} sequential",
        [run_once(a.jobs, a.threads, a.per_thread) for _ in range(a.runs)],
    )


if __name__ == "__main__":
    main()
