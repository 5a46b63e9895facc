"""/healthz, /readyz and the gRPC health service flip together at the right moments, and /metrics
parses as Prometheus text whose counters move as jobs run (real processes on 127.0.0.1)."""

from __future__ import annotations

import uuid
from typing import Any

from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from corral.v1 import admin_pb2, jobs_pb2
from tests.conftest import ControlProc, wait_until
from tests.integration.test_rest import Rest, http_port
from tests.support.calls import submit, wait_done

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def grpc_health(cp: ControlProc, service: str) -> int:
    stub = health_pb2_grpc.HealthStub(cp.channel())
    status: int = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10).status
    return status


def test_readiness_follows_the_workers_on_http_and_grpc(control_plane: ControlProc, spawn_worker: Any) -> None:
    rest = Rest(http_port(control_plane))
    # Given no worker: alive, not ready (under both names: /health and /ready as well)
    assert rest.get("/healthz").json() == {"status": "SERVING"} == rest.get("/health").json()
    not_ready = rest.get("/readyz")
    assert not_ready.status == 503 and not_ready.json() == {"status": "NOT_SERVING", "reason": "no worker takes work"}
    assert rest.get("/ready").status == 503
    assert grpc_health(control_plane, "") == SERVING
    assert grpc_health(control_plane, "corral.v1.JobService") == NOT_SERVING

    # When a worker registers: ready on both
    worker = spawn_worker(control_plane)
    assert rest.get("/readyz").status == 200 == rest.get("/ready").status
    wait_until(lambda: grpc_health(control_plane, "corral.v1.JobService") == SERVING, what="gRPC readiness")

    # When the operator drains it: not ready on both, at once on HTTP
    control_plane.admin.DrainWorker(admin_pb2.DrainWorkerRequest(id=worker.worker_id), timeout=10)
    assert rest.get("/readyz").status == 503
    wait_until(lambda: grpc_health(control_plane, "corral.v1.JobService") == NOT_SERVING, what="gRPC not ready")
    assert rest.get("/healthz").status == 200 and grpc_health(control_plane, "") == SERVING
    assert worker.wait(30) == 0


def scrape(rest: Rest) -> dict[str, float]:
    """Every sample of /metrics as ``name{label="value",...}`` -> value (labels sorted)."""
    reply = rest.get("/metrics")
    assert reply.status == 200 and reply.headers["Content-Type"].startswith("text/plain")
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(reply.body.decode()):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


def test_metrics_parse_and_move_as_jobs_run(control_plane: ControlProc, spawn_worker: Any) -> None:
    rest = Rest(http_port(control_plane))
    before = scrape(rest)
    assert before["corral_ready"] == 0 and before['corral_queue_depth{queue="ready"}'] == 0
    assert before["corral_rate_limited_requests_total"] == 0 and before["corral_lease_timeouts_total"] == 0
    spawn_worker(control_plane, threads=2, imports=())

    # When three noop jobs succeed, one failing job is retried then dead-lettered, and a key is replayed
    key = uuid.uuid4().hex
    ids = [submit(control_plane, "noop").id for _ in range(2)]
    ids.append(rest.submit({"type": "noop"}, headers={"X-Idempotency-Key": key})["id"])
    assert rest.submit({"type": "noop"}, headers={"X-Idempotency-Key": key})["id"] == ids[-1]
    ids.append(submit(control_plane, "failing", {"message": "boom"}, max_attempts=2).id)
    for job_id in ids:
        wait_done(control_plane, job_id)
    after = scrape(rest)

    # Then the counters, histograms and state gauges say so
    assert after['corral_jobs_submitted_total{type="noop"}'] == 3
    assert after['corral_jobs_submitted_total{type="failing"}'] == 1
    assert after['corral_jobs_succeeded_total{type="noop"}'] == 3
    assert after["corral_idempotent_replays_total"] == 1
    attempts = {k: v for k, v in after.items() if k.startswith("corral_job_attempt_failures_total{reason=")}
    assert sum(attempts.values()) == 2 and all('type="failing"' in k for k in attempts)
    assert sum(v for k, v in after.items() if k.startswith("corral_job_retries_total")) == 1
    assert sum(v for k, v in after.items() if k.startswith("corral_jobs_failed_total{reason=")) == 1
    assert after["corral_dead_letter_jobs"] == 1 and after['corral_jobs{state="SUCCEEDED"}'] == 3
    assert after["corral_dispatch_latency_seconds_count"] == 5  # 3 noop + 2 attempts of the failing job
    assert after['corral_job_run_seconds_count{type="noop"}'] == 3
    assert after['corral_workers{state="AVAILABLE"}'] == 1 and after["corral_ready"] == 1
    assert 0 <= after["corral_worker_heartbeat_age_max_seconds"] < 2
    assert after['corral_queue_depth{queue="ready"}'] == 0 and after['corral_queue_depth{queue="scheduled"}'] == 0
    assert after['corral_http_requests_total{code="200",route="JobService.SubmitJob"}'] == 2
    assert after['corral_http_requests_total{code="200",route="metrics"}'] >= 1
    stats = control_plane.jobs.GetStats(jobs_pb2.GetStatsRequest(), timeout=10)
    assert stats.jobs_by_status["SUCCEEDED"] == after['corral_jobs{state="SUCCEEDED"}']


def test_probes_and_metrics_answer_other_methods_405_with_allow(make_control_plane: Any) -> None:
    # With client tokens on too: these paths are open, so a wrong method is said as such, not as a 401
    cp: ControlProc = make_control_plane(CORRAL_AUTH_TOKENS="alice:" + "a" * 24, CORRAL_WORKER_TOKEN="w" * 24)
    rest = Rest(cp.http_port)
    for path in ("/healthz", "/readyz", "/health", "/ready", "/metrics"):
        for method in ("POST", "PUT", "DELETE"):
            reply = rest.call(method, path, {} if method != "DELETE" else None)
            assert (reply.status, reply.headers.get("Allow")) == (405, "GET, HEAD"), (method, path, reply.body)
        assert rest.call("GET", path).status in (200, 503), path
