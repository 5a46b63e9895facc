"""Bad input found by a sweep of every public surface (REST, the Python clients, the CLI) against a real
control plane: each case is a clear refusal that names the field and the rule, and changes nothing.

The cases that only refuse share one control plane (``refusing_control_plane``) and check that it still
stores no job; the ones that need a job to leave alone make their own.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import grpc
import pytest

from corral import AsyncClient, Client
from corral.errors import InvalidArgument
from corral.v1 import jobs_pb2
from tests.conftest import ControlProc
from tests.integration.test_rest import Rest, http_port
from tests.support.calls import stored, submit
from tests.support.cli import corral

INVALID_ARGUMENT = grpc.StatusCode.INVALID_ARGUMENT.value[0]


# ---- REST ------------------------------------------------------------------------------------------
def test_a_body_that_names_another_job_than_the_path_is_refused_and_changes_nothing(
    control_plane: ControlProc,
) -> None:
    # POST /v1/jobs/A:cancel with {"id": "B"} cancelled A and answered 200: the body's B was dropped
    # without a word, and the caller could not tell which job it had cancelled.
    rest = Rest(http_port(control_plane))
    job = submit(control_plane, "noop")  # no worker: it stays PENDING
    other = submit(control_plane, "noop")
    for method, path in [("POST", f"/v1/jobs/{job.id}:cancel"), ("POST", f"/v1/jobs/{job.id}:retry")]:
        reply = rest.call(method, path, raw=json.dumps({"id": other.id}).encode())
        assert reply.status == 400, (path, reply.body)
        status = reply.json()
        assert status["code"] == INVALID_ARGUMENT and reply.violation() == "id", status
        assert job.id in status["message"] and other.id in status["message"], status
    for job_id in (job.id, other.id):
        assert control_plane.get(job_id).state == jobs_pb2.Job.PENDING
    drained = rest.call("POST", "/v1/workers/w-1:drain", raw=b'{"id": "w-2"}')
    assert drained.status == 400 and drained.violation() == "id", drained.body
    # The same value in both is what was meant: taken
    same = rest.call("POST", f"/v1/jobs/{job.id}:cancel", raw=json.dumps({"id": job.id}).encode())
    assert same.status == 200 and same.json()["state"] == "CANCELLED", same.body
    assert control_plane.get(other.id).state == jobs_pb2.Job.PENDING


def test_a_query_parameter_without_a_name_is_named_as_such(refusing_control_plane: ControlProc) -> None:
    # "?=1" was refused as ": is not a query parameter of ListJobsRequest", a rule about nothing
    rest = Rest(http_port(refusing_control_plane))
    for query in ("=1", "limit=5&=x", "="):
        reply = rest.get(f"/v1/jobs?{query}")
        assert reply.status == 400, (query, reply.body)
        status = reply.json()
        assert status["code"] == INVALID_ARGUMENT and "has no name" in status["message"], (query, status)
    assert stored(refusing_control_plane) == 0


# ---- the Python clients ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("labels", [("team", "edge")]),
        ("labels", "team=edge"),
        ("worker_selector", [("gpu", "a100")]),
        ("worker_selector", "gpu=a100"),
    ],
)
def test_labels_that_are_not_a_mapping_are_invalid_argument_naming_the_field(
    refusing_control_plane: ControlProc, field: str, value: Any
) -> None:
    # An AttributeError ("'list' object has no attribute 'items'") escaped from submit, naming nothing
    with Client(refusing_control_plane.address) as client:
        with pytest.raises(InvalidArgument) as sync_err:
            client.submit("noop", {}, **{field: value})
        with pytest.raises(InvalidArgument) as run_err:
            client.run("noop", {}, **{field: value})

    async def via_async() -> InvalidArgument:
        async with AsyncClient(refusing_control_plane.address) as client:
            with pytest.raises(InvalidArgument) as err:
                await client.submit("noop", {}, **{field: value})
            return err.value

    for err in (sync_err.value, run_err.value, asyncio.run(via_async())):
        assert err.field == field and "mapping" in err.rule, err
    assert stored(refusing_control_plane) == 0


# ---- the CLI ---------------------------------------------------------------------------------------
def _deep(levels: int) -> str:
    return '{"a": ' * levels + "1" + "}" * levels


@pytest.mark.parametrize(
    ("args", "said"),
    [
        # kept the last value and dropped the first without a word (the REST bridge refuses it)
        (("submit", "noop", "--payload", '{"a": 1, "a": 2}'), "'a' is given twice"),
        # a RecursionError traceback from inside argparse, exit 1 as if the server had refused it
        (("submit", "noop", "--payload", _deep(10_000)), "nested too deeply"),
        # a dict of them kept the last: the job was labelled team=b only
        (("submit", "noop", "--label", "team=a", "--label", "team=b"), "'team' given twice"),
        (("submit", "noop", "--on", "gpu=a100", "--on", "gpu=h100"), "'gpu' given twice"),
        # a filter no job can meet was quietly the last one alone
        (("list", "--label", "team=a", "--label", "team=b"), "'team' given twice"),
        (("cancel", "--label", "team=a", "--label", "team=b"), "'team' given twice"),
    ],
)
def test_cli_values_that_mean_two_things_are_usage_errors_and_send_nothing(
    refusing_control_plane: ControlProc, args: tuple[str, ...], said: str
) -> None:
    result = corral(*args, "--control", refusing_control_plane.address)
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    assert said in result.stderr and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert stored(refusing_control_plane) == 0


def test_cli_repeating_a_label_with_the_same_value_is_taken(control_plane: ControlProc) -> None:
    result = corral(
        "submit", "noop", "--label", "team=a", "--label", "team=a", "--json", "--control", control_plane.address
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["labels"] == {"team": "a"}


def test_a_job_file_with_a_key_given_twice_is_refused_and_sends_nothing(
    refusing_control_plane: ControlProc, tmp_path: Path
) -> None:
    # [{"type": "noop", "priority": 1, "priority": 2}] was submitted with priority 2
    for text in [
        '[{"type": "noop", "priority": 1, "priority": 2}]',
        '[{"type": "noop", "labels": {"k": "a", "k": "b"}}]',
    ]:
        path = tmp_path / "jobs.json"
        path.write_text(text)
        result = corral("submit-many", str(path), "--control", refusing_control_plane.address)
        assert result.returncode == 2, (result.returncode, result.stderr)  # a file that is not a batch: usage
        assert "given twice" in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert stored(refusing_control_plane) == 0
