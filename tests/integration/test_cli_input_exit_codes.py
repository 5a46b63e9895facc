"""Bad input to `corral` exits 2 (corral.cli.exitcode.ExitCode.USAGE) with one error line that names the
field or flag and the rule, however it is found: by argparse, by the client before anything is sent, or
by the control plane (INVALID_ARGUMENT). Nothing is stored.

Before, a value the client or the control plane refused exited 1, as a failed request does, while a
malformed one exited 2: `--payload '{"a": NaN}'` exited 1 and `--payload '[1]'` 2; in a submit-many file, a
list where an object belongs exited 2 and a string where a number belongs 1; and a payload or job file
holding an integer of more than 4,300 digits printed a traceback (or argparse's generic "invalid payload
value" with the whole text).
"""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.conftest import ControlProc
from tests.support.calls import stored
from tests.support.cli import corral

HUGE = "9" * 5000  # past Python's 4,300-digit limit of int("...")

SUBMIT_CASES: list[tuple[str, list[str], str]] = [
    ("NaN in the payload", ["--payload", '{"a": NaN}'], "field 'payload.a': must be a finite number"),
    ("Infinity in the payload", ["--payload", '{"a": Infinity}'], "field 'payload.a': must be a finite number"),
    ("-Infinity in the payload", ["--payload", '{"a": -Infinity}'], "field 'payload.a': must be a finite number"),
    ("a float past double range", ["--payload", '{"a": 1e999}'], "field 'payload.a': must be a finite number"),
    ("an integer past 2**53", ["--payload", '{"a": 9007199254740993}'], "field 'payload.a'"),
    ("an integer of 5000 digits", ["--payload", '{"a": ' + HUGE + "}"], "--payload: invalid JSON in --payload"),
    ("a payload not UTF-8", ["--payload", '{"a": "\udcff"}'], "field 'payload.a': is not valid UTF-8"),
    ("a negative --timeout", ["--timeout", "-1"], "field 'timeout_sec': must be > 0 seconds"),
    ("a zero --timeout", ["--timeout", "0"], "field 'timeout_sec': must be > 0 seconds"),
    ("a NaN --timeout", ["--timeout", "nan"], "field 'timeout_sec'"),
    ("an infinite --timeout", ["--timeout", "inf"], "field 'timeout_sec': must be a finite number"),
    ("a huge --timeout", ["--timeout", "1e400"], "field 'timeout_sec': must be a finite number"),
    ("--priority over 100", ["--priority", "101"], "field 'priority': must be between 0 and 100"),
    ("--priority under 0", ["--priority", "-1"], "field 'priority': must be between 0 and 100"),
    ("--threads 0", ["--threads", "0"], "field 'thread_demand': must be between 1 and 1024"),
    ("--threads over the limit", ["--threads", "5000"], "field 'thread_demand': must be between 1 and 1024"),
    ("--max-attempts 0", ["--max-attempts", "0"], "field 'max_attempts': must be between 1 and 100"),
    ("a name not UTF-8", ["--name", "bad\udcffname"], "field 'name': is not valid UTF-8"),
    ("a name too long", ["--name", "n" * 300], "field 'name': must be at most 256 characters"),
    ("an empty --after", ["--after", ""], "field 'depends_on[0]': must be a job id"),
    ("a time before year 1 in UTC", ["--at", "0001-01-01T00:00:00+05:00"], "field 'scheduled_at': must be between"),
]

FLAGS = {
    "--timeout": "--timeout",
    "--priority": "--priority",
    "--threads": "--threads",
    "--max-attempts": "--max-attempts",
    "--name": "--name",
    "--after": "--after",
    "--at": "--at",
}


def _assert_bad_input(done: subprocess.CompletedProcess[str], said: str, what: str) -> None:
    """Exit 2, nothing on stdout, and the last line of stderr is the one error line saying ``said``."""
    assert done.returncode == 2, (what, done.returncode, done.stderr[-500:])
    assert done.stdout == "", what
    error = done.stderr.splitlines()[-1]
    assert "error: " in error and said in error, (what, error[:500])
    assert "Traceback" not in done.stderr, what
    assert len(error) < 2000, (what, "the error line echoes the whole input")


@pytest.mark.parametrize(("what", "args", "said"), SUBMIT_CASES, ids=[case[0] for case in SUBMIT_CASES])
def test_bad_submit_values_exit_2_naming_the_field_and_rule(
    refusing_control_plane: ControlProc, what: str, args: list[str], said: str
) -> None:
    before = stored(refusing_control_plane)
    done = corral("submit", "noop", *args, "--control", refusing_control_plane.address)
    _assert_bad_input(done, said, what)
    flag = FLAGS.get(args[0])
    if flag is not None:  # the flag the value came in is named too
        assert flag in done.stderr.splitlines()[-1], (what, done.stderr)
    assert stored(refusing_control_plane) == before


BAD_VALUES: list[tuple[str, str, str]] = [
    ("a string priority", '[{"type": "noop", "priority": "high"}]', "field 'jobs[0].priority': must be an integer"),
    ("a float priority", '[{"type": "noop", "priority": 1.5}]', "field 'jobs[0].priority': must be an integer"),
    ("a boolean priority", '[{"type": "noop", "priority": true}]', "field 'jobs[0].priority': must be an integer"),
    ("priority out of range", '[{"type": "noop", "priority": 101}]', "field 'jobs[0].priority': must be between"),
    ("a number type", '[{"type": 5}]', "field 'jobs[0].type': must be a string"),
    ("NaN in a payload", '[{"type": "noop", "payload": {"a": NaN}}]', "field 'jobs[0].payload.a': must be a finite"),
    (
        "1e999 in a payload",
        '[{"type": "noop", "payload": {"a": 1e999}}]',
        "field 'jobs[0].payload.a': must be a finite",
    ),
    ("a 5000-digit integer", '[{"type": "noop", "priority": ' + HUGE + "}]", "invalid JSON in "),
    ("a string timeout", '[{"type": "noop", "timeout_sec": "x"}]', "field 'jobs[0].timeout_sec': must be a number"),
    ("a negative timeout", '[{"type": "noop", "timeout_sec": -1}]', "field 'jobs[0].timeout_sec': must be > 0"),
    ("zero threads", '[{"type": "noop", "thread_demand": 0}]', "field 'jobs[0].thread_demand': must be between"),
    ("a number label", '[{"type": "noop", "labels": {"a": 1}}]', "field 'jobs[0].labels[a]': keys and values"),
    ("a number job id", '[{"type": "noop", "depends_on": [1]}]', "field 'jobs[0].depends_on[0]': must be a job id"),
    ("a string index", '[{"type": "noop", "depends_on_index": ["x"]}]', "field 'jobs[0].depends_on_index[0]'"),
    ("a time past 9999", '[{"type": "noop", "scheduled_at": 1e300}]', "field 'jobs[0].scheduled_at': must be between"),
    ("a NaN time", '[{"type": "noop", "scheduled_at": NaN}]', "field 'jobs[0].scheduled_at'"),
    ("a number email", '[{"type": "noop", "notify": [{"email": 5}]}]', "field 'jobs[0].notify[0].email'"),
    ("an unknown start_when", '[{"type": "noop", "start_when": "x"}]', "field 'jobs[0].start_when': must be"),
    ("too many GPUs", '[{"type": "noop", "gpu_count": 1000}]', "field 'jobs[0].gpu_count': must be between 0 and 64"),
    ("a list idempotency key", '[{"type": "noop", "idempotency_key": []}]', "field 'jobs[0].idempotency_key'"),
    ("an unknown job type", '[{"type": "no-such-type"}]', "field 'jobs[0].type': unknown job type"),
    ("no jobs", "[]", "field 'jobs': must hold at least one job"),
]


@pytest.mark.parametrize(("what", "text", "said"), BAD_VALUES, ids=[case[0] for case in BAD_VALUES])
def test_bad_values_in_a_job_file_exit_2_naming_the_place_and_rule(
    refusing_control_plane: ControlProc, tmp_path: Path, what: str, text: str, said: str
) -> None:
    before = stored(refusing_control_plane)
    path = tmp_path / f"jobs-{uuid.uuid4().hex[:8]}.json"
    path.write_text(text)
    from_file = corral("submit-many", str(path), "--control", refusing_control_plane.address)
    from_stdin = corral("submit-many", "-", "--control", refusing_control_plane.address, input=text)
    for done in (from_file, from_stdin):
        _assert_bad_input(done, said, what)
        assert done.stderr.startswith("corral: error: INVALID_ARGUMENT: "), (what, done.stderr[:300])
        assert done.stderr.count("\n") == 1, (what, done.stderr[:300])
    assert stored(refusing_control_plane) == before


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["get", ""], "field 'id': is required"),
        (["get", "bad\udcffid"], "field 'id': is not valid UTF-8"),
        (["cancel"], "field 'all': must be true"),
        (["retry"], "field 'all': must be true"),
        (["list", "--limit", "1001"], "field 'limit': must be between 1 and 1000"),
        (["list", "--type", "bad\udcfftype"], "field 'type': is not valid UTF-8"),
        (["wait", ""], "field 'ids"),
    ],
    ids=["get-empty", "get-not-utf8", "cancel-unfiltered", "retry-unfiltered", "list-limit", "list-type", "wait-empty"],
)
def test_other_commands_refused_input_exits_2(refusing_control_plane: ControlProc, args: list[str], said: str) -> None:
    before = stored(refusing_control_plane)
    done = corral(*args, "--control", refusing_control_plane.address)
    _assert_bad_input(done, said, " ".join(args))
    assert done.stderr.startswith("corral: error: INVALID_ARGUMENT: ") and done.stderr.count("\n") == 1
    assert stored(refusing_control_plane) == before


def test_a_valid_submission_still_exits_0_and_a_server_failure_still_exits_1(control_plane: ControlProc) -> None:
    # The line between 1 and 2: what the request asked for is wrong (2), or the request was refused or
    # failed for another reason (1: here NOT_FOUND and FAILED_PRECONDITION).
    done = corral("submit", "noop", "--payload", '{"a": 1.5}', "--json", "--control", control_plane.address)
    assert done.returncode == 0, done.stderr
    job_id = json.loads(done.stdout)["id"]
    assert corral("get", "no-such-job", "--control", control_plane.address).returncode == 1
    assert corral("cancel", job_id, "--control", control_plane.address).returncode in (0, 1)
    again = corral("retry", job_id, "--control", control_plane.address)
    assert again.returncode == 1 and again.stderr.startswith("corral: error: FAILED_PRECONDITION")
