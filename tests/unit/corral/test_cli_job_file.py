"""The job file of `corral submit-many`: its two shapes, snake_case and lowerCamelCase keys, and the errors
that name the place; plus the parser entry and the batch table."""

from __future__ import annotations

from datetime import datetime

import pytest

from corral.cli import commands, render
from corral.cli.job_file import FIELDS, parse
from corral.cli.parser import build_parser
from corral.errors import InvalidArgument
from corral.job import Job, JobState
from corral.spec import JobSpec, batch_request


def test_the_array_and_the_batch_submit_body_give_the_same_specs() -> None:
    snake = parse('[{"type": "noop"}, {"type": "noop", "depends_on_index": [0], "thread_demand": 2}]')
    camel = parse('{"jobs": [{"type": "noop"}, {"type": "noop", "dependsOnIndex": [0], "threadDemand": 2}]}')
    assert snake == camel == [JobSpec("noop"), JobSpec("noop", depends_on_index=[0], thread_demand=2)]


def test_every_field_of_jobspec_is_a_key_and_null_leaves_the_default() -> None:
    assert set(FIELDS) >= {"type", "payload", "scheduled_at", "depends_on_index", "gpu_count", "memory_mb"}
    (spec,) = parse('[{"type": "noop", "maxAttempts": null, "scheduledAt": "+30s", "timeout_sec": 1.5}]')
    assert spec.max_attempts is None and spec.timeout_sec == 1.5
    assert isinstance(spec.scheduled_at, datetime) and spec.scheduled_at.tzinfo is not None
    assert parse('[{"type": "noop", "scheduled_at": 1900000000}]')[0].scheduled_at == 1900000000


@pytest.mark.parametrize(
    ("text", "field", "rule"),
    [
        ("[1,", "", "invalid JSON in the job file at line 1 column 4"),
        ("null", "", "must hold a JSON array of jobs or an object"),
        ('{"jobs": [], "extra": 1}', "extra", "unknown field; known fields: jobs"),
        ('{"jobs": {}}', "jobs", "must be a JSON array of job objects, got an object"),
        ('[{"type": "noop"}, "noop"]', "jobs[1]", "must be a JSON object, got a string"),
        ('[{"type": "noop", "colour": 1}]', "jobs[0].colour", "unknown field; known fields: type, payload,"),
        ('[{"type": "noop", "depends_on": [], "dependsOn": []}]', "jobs[0].dependsOn", "given twice"),
        ('[{"type": "noop", "workerSelector": ["a"]}]', "jobs[0].workerSelector", "must be a JSON object"),
        ('[{"type": "noop", "dependsOnIndex": 0}]', "jobs[0].dependsOnIndex", "must be a JSON array, got a number"),
        ('[{"type": "noop", "scheduled_at": "soon"}]', "jobs[0].scheduled_at", "invalid time 'soon'"),
    ],
)
def test_a_bad_file_names_the_place(text: str, field: str, rule: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        parse(text)
    assert caught.value.field == field and rule in caught.value.rule


def test_a_wrong_scalar_is_named_when_the_batch_is_built() -> None:
    specs = parse('[{"type": "noop"}, {"type": "noop", "dependsOnIndex": ["0"]}]')
    with pytest.raises(InvalidArgument) as caught:
        batch_request(specs)
    assert caught.value.field == "jobs[1].depends_on_index[0]"


def test_the_parser_takes_a_file_and_wait() -> None:
    args = build_parser().parse_args(["submit-many", "-", "--wait", "--json", "--control", "127.0.0.1:6000"])
    assert (args.handler, args.file, args.wait, args.json) == (commands.submit_many, "-", True, True)


def test_the_table_shows_links_in_the_batch_by_place_and_others_by_short_id() -> None:
    outside = "f" * 32
    jobs = [
        Job(id="a" * 32, type="noop", state=JobState.SUCCEEDED),
        Job(id="b" * 32, type="noop", state=JobState.SCHEDULED, depends_on=["a" * 32, outside]),
    ]
    console = render.console()
    with console.capture() as captured:
        console.print(render.batch_table(jobs))
    lines = [line.split() for line in captured.get().splitlines() if line.strip()]
    assert lines[0] == ["#", "id", "type", "state", "after"]
    assert lines[2:] == [
        ["0", "a" * 32, "noop", "SUCCEEDED", "-"],
        ["1", "b" * 32, "noop", "SCHEDULED", "0,", "ffffffff"],
    ]
