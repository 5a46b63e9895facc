"""A result that a ``google.protobuf.Struct`` cannot carry (an integer beyond a double's range, a lone
surrogate) fails its attempt, naming the field, and is never stored: stored, it made every read of
its job (GetJob, ListJobs, WatchJob, a submitter's wait) fail with INTERNAL until retention removed it.

The runner refuses it as the job ends; the control plane refuses it too, from a worker that did not
(another release, a hostile one), here a raw stream that sends such a result itself.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from corral.v1 import jobs_pb2
from tests.conftest import ControlProc, WorkerProc
from tests.support.calls import result, submit, wait_all_done, wait_done
from tests.support.old_peers import OldWorker
from tests.support.unreadable_results import FIELDS

S = jobs_pb2.Job


def _reads_work(cp: ControlProc, job_ids: list[str]) -> None:
    """GetJob of each, an unfiltered ListJobs page holding them all, and a WatchJob of each answer."""
    for job_id in job_ids:
        cp.get(job_id)
    listed = {j.id for j in cp.jobs.ListJobs(jobs_pb2.ListJobsRequest(limit=1000), timeout=10).jobs}
    assert set(job_ids) <= listed
    for job_id in job_ids:
        wait_done(cp, job_id)


def test_a_plugin_result_a_struct_cannot_carry_fails_its_job_naming_the_field_and_reads_keep_working(
    control_plane: ControlProc, spawn_worker: Callable[..., WorkerProc]
) -> None:
    # Given a worker with a job type that returns what a Struct cannot carry
    cp = control_plane
    spawn_worker(cp, imports=("tests.support.unreadable_results",))
    # When each kind runs (once), next to one near the limits that a Struct still carries
    kinds = [*FIELDS, "fine"]
    jobs = {kind: submit(cp, "unreadable", {"kind": kind}, max_attempts=1).id for kind in kinds}
    done = dict(zip(kinds, wait_all_done(cp, list(jobs.values())), strict=True))
    # Then each bad one FAILED with ERROR naming its field, and the fine one SUCCEEDED as returned
    for kind, field in FIELDS.items():
        job = done[kind]
        assert (job.state, job.error.code) == (S.FAILED, "ERROR"), (kind, job.error)
        assert f"returned {field}:" in job.error.message, (kind, job.error.message)
        assert not job.result.fields
    fine = done["fine"]
    assert fine.state == S.SUCCEEDED, fine.error
    assert result(fine)["emoji"] == "\U0001f600" and result(fine)["big"] == 2**60
    # And every read of them works
    _reads_work(cp, list(jobs.values()))


@pytest.mark.parametrize(
    ("result_json", "says"),
    [
        ('{"x": ' + "9" * 400 + "}", "result.x: integer of 1329 bits is beyond what a double holds"),
        ('{"s": "\\ud800x"}', "result.s: is not valid UTF-8 (an unpaired surrogate)"),
        ('{"a": {"\\udc00": 1}}', "result.a (key '\\udc00'): is not valid UTF-8"),
        ('{"x": NaN}', "result.x: must be a finite number, got nan"),
        ('{"x": [1e400]}', "result.x[0]: must be a finite number, got inf"),
        ("not json", "result: is not JSON"),
        ("[1, 2]", "result: is a JSON list, not an object"),
        ('{"a": ' * 40 + "1" + "}" * 40, "nests deeper than 32 levels"),
    ],
)
def test_a_worker_that_sends_a_result_a_struct_cannot_carry_fails_the_attempt_and_reads_keep_working(
    control_plane: ControlProc, result_json: str, says: str
) -> None:
    # Given a raw worker stream (another release, or a hostile one) that was assigned a job
    cp = control_plane
    raw = OldWorker(cp.channel(), "raw-w")
    raw.next("registered")
    job = submit(cp, "noop", max_attempts=1)
    assert [(a.job_id, a.attempt) for a in raw.next("assign").assign.assignments] == [(job.id, 1)]
    # When it reports the job SUCCEEDED with a result a Struct cannot carry
    raw.result(job.id, 1, result_json=result_json)
    done = wait_done(cp, job.id)
    raw.close()
    # Then the attempt failed, saying why, and nothing of the result was stored
    assert (done.state, done.error.code) == (S.FAILED, "ERROR"), done.error
    assert "the worker's result cannot be read back" in done.error.message
    assert says in done.error.message, done.error.message
    assert not done.result.fields
    # And every read of the job works
    _reads_work(cp, [job.id])
