"""`corral submit-many FILE`, as a subprocess against a real control plane and worker: a graph of jobs from
a JSON file (or stdin) in one batch, shown as a table or JSON; ``--wait`` exits 0 only when every job
SUCCEEDED; a bad file is refused with one line naming the place, and nothing is stored."""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path
from typing import Any

import pytest

from corral.v1 import jobs_pb2
from tests.conftest import ControlProc
from tests.support.calls import result, stored
from tests.support.cli import corral

S = jobs_pb2.Job
ROW = re.compile(r"^\s*(\d+)\s+([0-9a-f]{32})\s+(\w+)\s+([A-Z]+)\s+(.+?)\s*$")
"""A row of the table: place, id, type, state, after."""


@pytest.fixture
def served(control_plane: ControlProc, spawn_worker: Any) -> ControlProc:
    """A control plane with one worker of two threads, running the built-in job types."""
    spawn_worker(control_plane, threads=2, imports=())
    return control_plane


def _file(tmp_path: Path, document: Any) -> str:
    """Write ``document`` (JSON, or text as it is) to a fresh file and return its path."""
    path = tmp_path / f"jobs-{uuid.uuid4().hex[:8]}.json"
    path.write_text(document if isinstance(document, str) else json.dumps(document, indent=2))
    return str(path)


def _rows(table: str) -> list[tuple[int, str, str, str, str]]:
    """The rows of a ``submit-many`` table, in order."""
    found = [ROW.match(line) for line in table.splitlines()]
    return [(int(m[1]), m[2], m[3], m[4], m[5]) for m in found if m]


def _ns(ts: Any) -> int:
    return int(ts.ToNanoseconds())


def test_a_diamond_from_a_file_runs_in_order_and_waits(served: ControlProc, tmp_path: Path) -> None:
    # Given a file with A; B and C after A; D after B and C
    path = _file(
        tmp_path,
        [
            {"type": "sleep", "payload": {"seconds": 0.2}, "name": "A"},
            {"type": "sleep", "payload": {"seconds": 0.2}, "depends_on_index": [0]},
            {"type": "sleep", "payload": {"seconds": 0.1}, "depends_on_index": [0]},
            {"type": "add_numbers", "payload": {"a": 1, "b": 2}, "depends_on_index": [1, 2]},
        ],
    )

    # When it is submitted and waited for
    done = corral("submit-many", path, "--wait", "--control", served.address)

    # Then every job SUCCEEDED, and the table shows each by place with the places it came after
    assert done.returncode == 0, done.stderr
    rows = _rows(done.stdout)
    assert [(place, kind, state, after) for place, _, kind, state, after in rows] == [
        (0, "sleep", "SUCCEEDED", "-"),
        (1, "sleep", "SUCCEEDED", "0"),
        (2, "sleep", "SUCCEEDED", "0"),
        (3, "add_numbers", "SUCCEEDED", "1, 2"),
    ]
    a, b, c, d = (served.get(job_id) for _, job_id, *_ in rows)
    assert list(d.depends_on) == [b.id, c.id] and result(d) == {"sum": 3}
    # and each started only after what it names had finished
    for job, before in ((b, a), (c, a), (d, b), (d, c)):
        assert _ns(job.started_at) >= _ns(before.finished_at), (job.id, before.id)


def test_the_batch_submit_body_from_stdin_in_camel_case_prints_json(served: ControlProc) -> None:
    # Given REST's batchSubmit body, with protojson's lowerCamelCase keys
    key = uuid.uuid4().hex
    body = {
        "jobs": [
            {"type": "noop", "maxAttempts": 2, "idempotencyKey": key, "labels": {"who": "cli"}},
            {
                "type": "add_numbers",
                "payload": {"a": 2, "b": 3},
                "threadDemand": 2,
                "timeoutSec": 30,
                "dependsOnIndex": [0],
                "workerSelector": {},
                "scheduledAt": "+0s",
            },
        ]
    }
    before = stored(served)

    # When it is piped in with --json
    done = corral("submit-many", "-", "--json", "--control", served.address, input=json.dumps(body))

    # Then the output is the list of jobs as submitted, each field taken from its camelCase key
    assert done.returncode == 0, done.stderr
    first, second = json.loads(done.stdout)
    assert (first["type"], first["max_attempts"], first["idempotency_key"], first["labels"]) == (
        "noop",
        2,
        key,
        {"who": "cli"},
    )
    assert (second["thread_demand"], second["timeout_sec"], second["depends_on"]) == (2, 30, [first["id"]])
    assert stored(served) == before + 2


def test_wait_exits_1_when_a_job_fails_and_its_dependent_is_cancelled(served: ControlProc, tmp_path: Path) -> None:
    # Given a job that fails its only attempt, and one after it
    path = _file(
        tmp_path,
        {"jobs": [{"type": "failing", "payload": {}, "max_attempts": 1}, {"type": "noop", "depends_on_index": [0]}]},
    )

    # When it is submitted and waited for
    done = corral("submit-many", path, "--wait", "--json", "--control", served.address)

    # Then the JSON shows both ended, and the exit status and one line on stderr say the batch did not succeed
    failed, cancelled = json.loads(done.stdout)
    assert (failed["state"], cancelled["state"]) == ("FAILED", "CANCELLED")
    assert done.returncode == 1
    assert done.stderr.startswith(f"corral: error: 2 of 2 jobs did not succeed; job '{failed['id']}' ended FAILED: ")
    assert done.stderr.count("\n") == 1


# Whatever is wrong with the file is bad input, exit status 2, as a --payload that is not a JSON object is:
# its JSON, its shape, its keys, and a value refused (a type or a range, a link), whether the client or the
# control plane refuses it. Before, every bad file was 1; then a refused value was still 1.
BAD_FILES: list[tuple[str, str, str, int]] = [
    (
        "malformed JSON",
        '[\n  {"type": "noop"},\n  {"type": "noop"\n]',
        "at line 4 column 1: Expecting ',' delimiter",
        2,
    ),
    ("not a batch", '"noop"', 'must hold a JSON array of jobs or an object {"jobs": [...]}, got a string', 2),
    (
        "a job not an object",
        '{"jobs": [{"type": "noop"}, {"type": "noop"}, ["noop"]]}',
        "field 'jobs[2]': must be a JSON object",
        2,
    ),
    (
        "an unknown key",
        '[{"type": "noop"}, {"type": "noop", "colour": "red"}]',
        "field 'jobs[1].colour': unknown field; known fields: type, ",
        2,
    ),
    ("a wrong type", '[{"type": "noop", "priority": "high"}]', "field 'jobs[0].priority': must be an integer", 2),
    (
        "a link to a later job",
        '[{"type": "noop"}, {"type": "noop", "depends_on_index": [2]}, {"type": "noop"}]',
        "field 'jobs[1].depends_on_index[0]'",
        2,
    ),
]


def test_a_bad_file_is_refused_naming_the_place_and_nothing_is_stored(
    control_plane: ControlProc, tmp_path: Path
) -> None:
    before = stored(control_plane)
    for what, text, said, status in BAD_FILES:
        done = corral("submit-many", _file(tmp_path, text), "--control", control_plane.address)
        assert done.returncode == status, (what, done.stderr)
        assert done.stderr.startswith("corral: error: INVALID_ARGUMENT: "), (what, done.stderr)
        assert said in done.stderr and done.stderr.count("\n") == 1, (what, done.stderr)
        assert done.stdout == "", what
    missing = corral("submit-many", str(tmp_path / "none.json"), "--control", control_plane.address)
    assert missing.returncode == 2  # a file that cannot be read is a usage error too
    assert (
        missing.stderr
        == f"corral: error: INVALID_ARGUMENT: cannot read {tmp_path / 'none.json'}: No such file or directory\n"
    )
    assert stored(control_plane) == before
