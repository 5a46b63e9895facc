"""Long streams and the end of a login: a stream opened with a login that ends (the account deleted, every
login ended) delivers nothing more; over gRPC and REST, on a real control plane and worker on 127.0.0.1."""

from __future__ import annotations

import http.client
import json
import secrets
from typing import Any

import grpc
import pytest

import corral
from corral.v1 import jobs_pb2, jobs_pb2_grpc
from tests.conftest import ControlProc

PASSWORD = "correct horse"
RUN_SEC = 5.0
"""How long the watched job runs after it starts: longer than the streams' recheck period (1 s)."""


@pytest.fixture
def site(make_control_plane: Any, spawn_worker: Any) -> tuple[ControlProc, str]:
    ops, worker = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
    cp = make_control_plane(
        CORRAL_ACCOUNTS="open",
        CORRAL_AUTH_TOKENS=f"ops:{ops}",
        CORRAL_WORKER_TOKEN=worker,
        CORRAL_JOB_VISIBILITY="owner",
        CORRAL_AUTH_ADMINS="ops",
        CORRAL_PASSWORD_ROUNDS="10",
    )
    cp.token = ops
    spawn_worker(cp, threads=1, env={"CORRAL_WORKER_TOKEN": worker})
    return cp, ops


def _erin(cp: ControlProc) -> str:
    """Register erin and return a login of hers."""
    with corral.Client(cp.address) as anonymous:
        anonymous.register("erin", PASSWORD)
        return anonymous.login("erin", PASSWORD).token


@pytest.mark.parametrize("how", ["account deleted", "logins ended"])
def test_a_watch_stream_ends_unauthenticated_once_its_login_ends(site: tuple[ControlProc, str], how: str) -> None:
    # Given erin watching her running job over gRPC
    cp, ops = site
    token = _erin(cp)
    meta = (("authorization", f"Bearer {token}"),)
    with corral.Client(cp.address, token=token) as erin:
        job = erin.submit("sleep", {"seconds": RUN_SEC})
    stub = jobs_pb2_grpc.JobServiceStub(cp.channel())
    events = stub.WatchJob(jobs_pb2.WatchJobRequest(id=job.id), metadata=meta, timeout=60)
    for event in events:
        if event.job.state == jobs_pb2.Job.RUNNING:
            break

    # When her login ends while the job runs
    with corral.Client(cp.address, token=ops) as admin:
        if how == "account deleted":
            admin.delete_account("erin")
        else:
            admin.end_all_logins()

    # Then the stream ends UNAUTHENTICATED instead of delivering the job's end (a leaked login whose
    # logins were ended went on reading it)
    with pytest.raises(grpc.RpcError) as caught:
        for event in events:
            assert event.job.state == jobs_pb2.Job.RUNNING, event.job.state
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED  # type: ignore[attr-defined]
    # while the job itself goes on to its end
    with corral.Client(cp.address, token=ops) as admin:
        assert admin.wait(job.id, timeout=60).state is corral.JobState.SUCCEEDED


def test_a_rest_watch_stream_ends_once_its_login_ends(site: tuple[ControlProc, str]) -> None:
    # Given erin watching her running job over REST
    cp, ops = site
    token = _erin(cp)
    with corral.Client(cp.address, token=token) as erin:
        job = erin.submit("sleep", {"seconds": RUN_SEC})
    conn = http.client.HTTPConnection("127.0.0.1", cp.http_port, timeout=60)
    conn.request("GET", f"/v1/jobs/{job.id}:watch", headers={"Authorization": f"Bearer {token}"})
    reply = conn.getresponse()
    assert reply.status == 200
    states: list[str] = []
    while "RUNNING" not in states:
        line = reply.readline()
        assert line, states
        states.append(json.loads(line)["result"]["job"]["state"])

    # When her account is deleted while the job runs
    with corral.Client(cp.address, token=ops) as admin:
        admin.delete_account("erin")

    # Then the stream's last line is an UNAUTHENTICATED error, not the job's end
    rest = [json.loads(line) for line in reply.read().splitlines() if line.strip()]
    conn.close()
    assert [line.get("result", {}).get("job", {}).get("state") for line in rest[:-1]] == ["RUNNING"] * (len(rest) - 1)
    assert rest and rest[-1]["error"]["code"] == grpc.StatusCode.UNAUTHENTICATED.value[0], rest
