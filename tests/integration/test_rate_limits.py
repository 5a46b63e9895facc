"""Rate limits against a real control plane (and real workers) on 127.0.0.1.

* Submission limits: a burst past RATE_LIMIT_JOBS_PER_MIN / its burst is RESOURCE_EXHAUSTED (gRPC) or
  429 (REST) with a Retry-After that works when honoured; nothing is stored for a refused request; a
  batch counts its jobs, all or nothing; an idempotent replay is not charged; per-client buckets
  keep one caller from slowing another.
* Execution limits: jobs of one rate_key limited to 10/s start at <= 10/s across three workers,
  each on its first attempt, while jobs of another key submitted with them are not slowed.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import time
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2
from prometheus_client.parser import text_string_to_metric_families

from corral import Client, ExecRateLimit
from corral.errors import RateLimited
from corral.v1 import jobs_pb2
from tests.conftest import ControlProc, wait_until
from tests.integration.test_rest import Rest
from tests.support.calls import request, submit, wait_all_done
from tests.support.cli import corral

RETRY_INFO = "type.googleapis.com/google.rpc.RetryInfo"


def total(cp: ControlProc) -> int:
    """Jobs stored, as ListJobs counts them."""
    return int(cp.jobs.ListJobs(jobs_pb2.ListJobsRequest(limit=1), timeout=10).total)


def refused(call: Any) -> grpc.RpcError:
    """Run a gRPC call that must fail; returns its error."""
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value


def retry_after(err: grpc.RpcError) -> int:
    """The ``retry-after`` trailer of a RESOURCE_EXHAUSTED call, checked against its RetryInfo detail."""
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err
    trailers = dict(err.trailing_metadata() or ())  # type: ignore[attr-defined]
    seconds = int(trailers["retry-after"])
    status = status_pb2.Status.FromString(trailers["grpc-status-details-bin"])
    (detail,) = status.details
    info = error_details_pb2.RetryInfo()
    assert detail.Unpack(info)
    assert info.retry_delay.seconds == seconds >= 1
    return seconds


def metric(cp: ControlProc, name: str, labels: dict[str, str] | None = None) -> float:
    """One sample of /metrics."""
    body = Rest(cp.http_port).get("/metrics").body.decode()
    for family in text_string_to_metric_families(body):
        for s in family.samples:
            if s.name == name and s.labels == (labels or {}):
                return float(s.value)
    raise AssertionError(f"no sample {name}{labels or ''}")


def post_from(cp: ControlProc, source: str, body: dict[str, Any]) -> tuple[int, dict[str, str], dict[str, Any]]:
    """POST /v1/jobs from the loopback address ``source`` (another client, to the per-client limit)."""
    conn = http.client.HTTPConnection("127.0.0.1", cp.http_port, timeout=30, source_address=(source, 0))
    try:
        conn.request("POST", "/v1/jobs", body=json.dumps(body), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, dict(resp.headers), json.loads(resp.read())
    finally:
        conn.close()


# ---- submission limits ----------------------------------------------------------------------------


def test_a_burst_past_the_limit_is_refused_with_a_retry_after_that_works(make_control_plane: Any) -> None:
    # Given 30 jobs a minute (a token every 2 s) with a burst of 4, and no worker (jobs stay stored)
    cp = make_control_plane(RATE_LIMIT_JOBS_PER_MIN=30, CORRAL_RATE_LIMIT_BURST=4)
    for _ in range(4):
        submit(cp, "noop")

    # When a 5th comes at once over gRPC: RESOURCE_EXHAUSTED, retry-after + RetryInfo, nothing stored
    err = refused(lambda: submit(cp, "noop"))
    wait = retry_after(err)
    assert "submission rate limit" in (err.details() or "")  # type: ignore[attr-defined]
    assert total(cp) == 4
    # Then honouring it works (the client waits as it is told: this sleep is the behaviour under test)
    time.sleep(wait)
    submit(cp, "noop")
    assert total(cp) == 5

    # The same over REST: 429 with Retry-After and a google.rpc.Status body carrying RetryInfo
    rest = Rest(cp.http_port)
    reply = rest.post("/v1/jobs", {"type": "noop"})
    assert reply.status == 429, reply.body
    wait = int(reply.headers["Retry-After"])
    body = reply.json()
    assert body["code"] == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
    assert body["details"] == [{"@type": RETRY_INFO, "retryDelay": f"{wait}s"}]
    assert rest.total() == 5
    time.sleep(wait)
    assert rest.post("/v1/jobs", {"type": "noop"}).status == 200
    assert rest.total() == 6

    # The Python client surfaces the delay on the error
    with Client(cp.address) as client, pytest.raises(RateLimited) as info:
        client.submit("noop")
    assert 1 <= info.value.retry_after <= 2
    assert f"retry after {info.value.retry_after:g}s" in info.value.message  # the same figure as the trailer's
    assert total(cp) == 6
    assert metric(cp, "corral_rate_limited_requests_total") == 3


def batch(n: int) -> jobs_pb2.SubmitJobsRequest:
    """A SubmitJobs of ``n`` noop jobs."""
    return jobs_pb2.SubmitJobsRequest(jobs=[request("noop") for _ in range(n)])


def test_a_batch_counts_its_jobs_all_or_nothing_and_a_replay_is_free(make_control_plane: Any) -> None:
    # Given one job a second with a burst of 10
    cp = make_control_plane(RATE_LIMIT_JOBS_PER_MIN=60, CORRAL_RATE_LIMIT_BURST=10)

    # A batch larger than the burst can never pass: said plainly (not a Retry-After), nothing stored
    err = refused(lambda: cp.jobs.SubmitJobs(batch(11), timeout=10))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "jobs: a batch of 11 jobs can never fit" in (err.details() or "")  # type: ignore[attr-defined]
    assert total(cp) == 0

    # 8 of 10 pass, and a keyed one among them
    keyed = request("add_numbers", {"a": 1, "b": 2}, idempotency_key="order-1")
    first = cp.jobs.SubmitJobs(jobs_pb2.SubmitJobsRequest(jobs=[keyed, *batch(7).jobs]), timeout=10)
    # When a batch of 3 finds 2 tokens, it is refused whole, nothing stored
    wait = retry_after(refused(lambda: cp.jobs.SubmitJobs(batch(3), timeout=10)))
    assert total(cp) == 8
    # An idempotent replay creates nothing, so it is not charged: it answers even now
    replay = cp.jobs.SubmitJob(keyed, timeout=10).job
    assert replay.id == first.jobs[0].id and total(cp) == 8
    # Honouring Retry-After, the batch of 3 passes
    time.sleep(wait)
    cp.jobs.SubmitJobs(batch(3), timeout=10)
    assert total(cp) == 11
    assert metric(cp, "corral_rate_limited_requests_total") == 1
    assert metric(cp, "corral_idempotent_replays_total") == 1


def test_each_client_has_its_own_budget(make_control_plane: Any) -> None:
    # Given 2 jobs at once per client (6 a minute), and two clients on two loopback addresses
    cp = make_control_plane(CORRAL_RATE_LIMIT_PER_CLIENT_JOBS_PER_MIN=6, CORRAL_RATE_LIMIT_PER_CLIENT_BURST=2)
    for _ in range(2):
        assert post_from(cp, "127.0.0.1", {"type": "noop"})[0] == 200
    # When the first one goes on, over REST or gRPC (the same caller: the peer address), it is refused
    status, headers, body = post_from(cp, "127.0.0.1", {"type": "noop"})
    assert status == 429 and int(headers["Retry-After"]) >= 1
    assert "per-client limit of 6 jobs/min (client ipv4:127.0.0.1)" in body["message"]
    retry_after(refused(lambda: submit(cp, "noop")))
    # Then the other client is not slowed by it
    for _ in range(2):
        assert post_from(cp, "127.0.0.2", {"type": "noop"})[0] == 200
    assert post_from(cp, "127.0.0.2", {"type": "noop"})[0] == 429
    assert total(cp) == 4


# ---- execution limits -----------------------------------------------------------------------------

LIMITED, FREE = "slow.example.com", "fast.example.com"
RATE, WINDOW = 10.0, 5.0


def seconds(ts: Any) -> float:
    return float(ts.seconds + ts.nanos / 1e9)


def most_in_any_window(times: list[float], window: float) -> int:
    """The most of ``times`` that fall in any closed interval of ``window`` seconds."""
    times = sorted(times)
    best, j = 0, 0
    for i, start in enumerate(times):
        while j < len(times) and times[j] <= start + window:
            j += 1
        best = max(best, j - i)
    return best


def test_one_key_is_paced_across_workers_while_other_keys_flow(make_control_plane: Any, spawn_worker: Any) -> None:
    # Given a limit of 10 starts a second on one rate_key, and three workers
    cp = make_control_plane(CORRAL_EXEC_RATE_LIMITS=f"key:{LIMITED}=10/s")
    for _ in range(3):
        spawn_worker(cp, threads=2, imports=())

    # When 200 jobs on that key and 200 on another are submitted together, interleaved
    reqs = [request("noop", labels={"rate_key": key}) for _ in range(200) for key in (LIMITED, FREE)]
    t0 = time.time()
    jobs = cp.jobs.SubmitJobs(jobs_pb2.SubmitJobsRequest(jobs=reqs), timeout=30).jobs
    limited_ids = [j.id for j in jobs if j.labels["rate_key"] == LIMITED]
    free_ids = [j.id for j in jobs if j.labels["rate_key"] == FREE]

    # Then the limited ones wait in the queue (GetStats shows them), the others run at once
    def waiting() -> int:
        stats = cp.jobs.GetStats(jobs_pb2.GetStatsRequest(), timeout=10)
        (limit,) = stats.exec_rate_limits
        assert (limit.limit, limit.per_second, limit.burst) == (f"key:{LIMITED}", RATE, 1)
        return int(limit.waiting)

    wait_until(lambda: waiting() > 100, what="limited jobs to wait")
    free = wait_all_done(cp, free_ids, timeout=60)
    limited = wait_all_done(cp, limited_ids, timeout=120)

    assert all(j.state == jobs_pb2.Job.SUCCEEDED and j.attempts == 1 for j in free + limited)
    starts = [seconds(j.started_at) for j in limited]
    # ... at <= 10/s (+5%) over any 5 s window, counted from the recorded start times
    assert most_in_any_window(starts, WINDOW) <= RATE * WINDOW * 1.05
    # ... yet kept flowing near the limit (199 gaps of 0.1 s: about 20 s; no stalls)
    span = max(starts) - min(starts)
    assert 199 / RATE * 0.95 <= span <= 199 / 8.0
    # ... while the other key was not slowed: all done long before the last limited job started
    free_done = max(seconds(j.finished_at) for j in free)
    assert free_done - t0 < 5.0 and max(starts) - free_done > 10.0
    assert waiting() == 0
    delayed = metric(cp, "corral_exec_rate_delayed_jobs_total", {"limit": f"key:{LIMITED}"})
    assert 100 < delayed <= 200
    assert metric(cp, "corral_exec_rate_waiting_jobs", {"limit": f"key:{LIMITED}"}) == 0


def test_the_clients_and_corral_stats_show_the_execution_rate_limits(make_control_plane: Any) -> None:
    # Given execution rate limits (GetStats carried them; Client.stats() and `corral stats` left them out)
    cp = make_control_plane(CORRAL_EXEC_RATE_LIMITS=f"type:sleep=1/m,key:{LIMITED}=10/s")
    grpc_view = cp.jobs.GetStats(jobs_pb2.GetStatsRequest(), timeout=10).exec_rate_limits
    want = [ExecRateLimit(r.limit, r.per_second, r.burst, r.waiting) for r in grpc_view]
    assert [r.limit for r in want] == ["type:sleep", f"key:{LIMITED}"]

    # Then the Python client, the CLI's JSON and its table show each
    with Client(cp.address) as client:
        assert client.stats().exec_rate_limits == want
    as_json = corral("stats", "--json", "--control", cp.address)
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout)["exec_rate_limits"] == [dataclasses.asdict(r) for r in want]
    table = corral("stats", "--control", cp.address)
    assert table.returncode == 0, table.stderr
    assert "rate limit type:sleep" in table.stdout and f"rate limit key:{LIMITED}" in table.stdout, table.stdout
    assert "10/s, burst" in table.stdout, table.stdout
