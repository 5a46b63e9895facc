"""REST vs gRPC: single-job submit latency (p50, p99) and submit throughput, side by side.

Each run starts a control plane (with the REST bridge in the chosen mode) and one worker on
127.0.0.1, then times sequential ``SubmitJob`` of a noop job over gRPC (one channel) and over REST
(``POST /v1/jobs`` on one keep-alive connection), and ``--threads`` concurrent submitters of each.
The ratio columns are REST / gRPC (latency) and REST / gRPC (throughput).
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
from collections.abc import Callable

from bench.cluster import Cluster
from bench.load import latencies_ms, throughput
from bench.report import table
from corral.v1 import jobs_pb2

BODY = json.dumps({"type": "noop"}).encode()
HEADERS = {"Content-Type": "application/json"}


def _rest_submitter(port: int) -> Callable[[], None]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

    def submit() -> None:
        conn.request("POST", "/v1/jobs", body=BODY, headers=HEADERS)
        resp = conn.getresponse()
        body = resp.read()
        if resp.status != 200:
            raise RuntimeError(f"REST submit failed: {resp.status} {body[:200]!r}")

    return submit


def _grpc_submitter(c: Cluster) -> Callable[[], None]:
    req = jobs_pb2.SubmitJobRequest(type="noop")

    def submit() -> None:
        c.jobs.SubmitJob(req, timeout=30)

    return submit


def run_once(mode: str, n: int, threads: int, per_thread: int) -> dict[str, float]:
    with Cluster(workers=1, threads=2, env={"CORRAL_GATEWAY_MODE": mode}) as c:
        port = c.http_port
        grpc_ms = latencies_ms(_grpc_submitter(c), n)
        rest_ms = latencies_ms(_rest_submitter(port), n)
        grpc_tp = throughput(lambda: _grpc_submitter(c), threads, per_thread)
        rest_tp = throughput(lambda: _rest_submitter(port), threads, per_thread)
    g50, r50 = statistics.median(grpc_ms), statistics.median(rest_ms)
    g99, r99 = statistics.quantiles(grpc_ms, n=100)[98], statistics.quantiles(rest_ms, n=100)[98]
    return {
        "grpc_p50_ms": g50,
        "rest_p50_ms": r50,
        "p50_ratio": r50 / g50,
        "grpc_p99_ms": g99,
        "rest_p99_ms": r99,
        "p99_ratio": r99 / g99,
        "grpc_jobs_s": grpc_tp,
        "rest_jobs_s": rest_tp,
        "tput_ratio": rest_tp / grpc_tp,
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--jobs", type=int, default=500, help="sequential submits per protocol")
    p.add_argument("--threads", type=int, default=8, help="concurrent submitters for throughput")
    p.add_argument("--per-thread", type=int, default=150, help="submits per submitter")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--mode", choices=["inprocess", "loopback", "both"], default="inprocess")
    a = p.parse_args(argv)
    for mode in ("inprocess", "loopback") if a.mode == "both" else (a.mode,):
        table(
            f"rest vs grpc ({mode} bridge): {a.jobs} sequential noop submits, {a.threads}x{a.per_thread} concurrent",
            [run_once(mode, a.jobs, a.threads, a.per_thread) for _ in range(a.runs)],
        )


if __name__ == "__main__":
    main()
