"""Listing jobs by their labels, on a real control plane: ListJobs (newest first and the queue view),
over gRPC, REST (``labels[team]=edge``), the Python client and the CLI; a job matches when its labels
include every pair asked for, whatever characters the keys hold; bad filters are refused naming the field."""

from __future__ import annotations

import json
import subprocess
import sys
from urllib.parse import quote

import grpc

from corral import Client
from corral.v1 import jobs_pb2
from tests.conftest import ROOT, ControlProc, base_env
from tests.integration.test_rest import Rest, http_port
from tests.support.calls import request, rpc_error, submit_many

ODD_KEY = 'a.b "c" [0]'


def test_jobs_are_listed_by_their_labels(control_plane: ControlProc) -> None:
    # Given jobs with labels, queued (no worker)
    gold, edge, odd, _core = submit_many(
        control_plane,
        [
            request("noop", labels={"team": "edge", "tier": "gold"}),
            request("noop", labels={"team": "edge"}),
            request("noop", labels={ODD_KEY: "ü"}),
            request("noop", labels={"team": "core"}),
        ],
    )

    def ids(labels: dict[str, str], queue: bool = False) -> list[str]:
        order = jobs_pb2.ListJobsRequest.QUEUE if queue else jobs_pb2.ListJobsRequest.NEWEST_FIRST
        page = control_plane.jobs.ListJobs(jobs_pb2.ListJobsRequest(labels=labels, order=order))
        assert page.total == len(page.jobs)
        return [j.id for j in page.jobs]

    # Then each filter finds the jobs that have every pair it names, newest first or in queue order
    for queue in (False, True):
        expected_edge = [gold.id, edge.id] if queue else [edge.id, gold.id]
        assert ids({"team": "edge"}, queue) == expected_edge
        assert ids({"team": "edge", "tier": "gold"}, queue) == [gold.id]
        assert ids({ODD_KEY: "ü"}, queue) == [odd.id]
        assert ids({"team": "nobody"}, queue) == []
    # Over REST, a map's entry is labels[key]=value
    rest = Rest(http_port(control_plane))
    reply = rest.get(f"/v1/jobs?labels[team]=edge&labels[tier]=gold&labels[{quote(ODD_KEY)}]=x")
    assert reply.status == 200 and reply.json()["total"] == "0", reply.body
    reply = rest.get("/v1/jobs?labels%5Bteam%5D=edge&order=QUEUE")
    assert [j["id"] for j in reply.json()["jobs"]] == [gold.id, edge.id]
    # The Python client and the CLI
    with Client(control_plane.address) as client:
        assert [j.id for j in client.list(labels={"team": "edge"}).jobs] == [edge.id, gold.id]
        assert [j.id for j in client.queue(labels={"tier": "gold"}).jobs] == [gold.id]
    listed = subprocess.run(
        [sys.executable, "-m", "corral.cli", "list", "--label", "team=edge", "--label", "tier=gold", "--json",
         "--control", control_plane.address],
        cwd=ROOT, env=base_env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    assert [j["id"] for j in json.loads(listed.stdout)["jobs"]] == [gold.id]


def test_bad_label_filters_are_refused_naming_the_field(control_plane: ControlProc) -> None:
    for labels, field in (({"": "x"}, "labels"), ({"k" * 64: "x"}, f"labels[{'k' * 64}]")):
        err = rpc_error(control_plane.jobs.ListJobs, jobs_pb2.ListJobsRequest(labels=labels))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and (err.details() or "").startswith(f"{field}: ")
    err = rpc_error(control_plane.jobs.ListJobs, jobs_pb2.ListJobsRequest(labels={f"k{i}": "v" for i in range(65)}))
    assert (err.details() or "").startswith("labels: at most 64 labels, got 65")
    rest = Rest(http_port(control_plane))
    for query, field in (
        ("labels[team=edge", "labels[team"),
        ("limit[x]=1", "limit[x]"),
        ("labels[a]=1&labels[a]=2", "labels[a]"),
    ):
        reply = rest.get(f"/v1/jobs?{query}")
        assert reply.status == 400 and reply.violation() == field, reply.body
