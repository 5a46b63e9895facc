"""How the worker cuts the results it sends into Results messages (``worker.connection._cut``).

Every unacknowledged result is resent in one go after a reconnect, each with up to 1 MiB of what its
job printed (CORRAL_JOB_OUTPUT_BYTES): a message over the stream's 64 MiB limit breaks the stream, and
the same message is resent on every session, so no message may grow past the batch budget.
"""

from __future__ import annotations

import pytest

from corral.v1 import workers_pb2 as pb
from worker.connection import RESULTS_BATCH_BYTES, _cut

OUTPUT = 1 << 20  # CORRAL_JOB_OUTPUT_BYTES at its largest


def _result(i: int, output: str = "", result_json: str = "{}", error_message: str = "") -> pb.JobResult:
    return pb.JobResult(
        attempt=pb.AttemptRef(job_id=f"job-{i:06d}", attempt=1),
        outcome=pb.JobResult.Outcome.SUCCEEDED,
        result_json=result_json,
        error_message=error_message,
        started_at=1.0,
        finished_at=2.0,
        output=output,
    )


def _batches(results: list[pb.JobResult]) -> list[list[pb.JobResult]]:
    batches = []
    rest = results
    while rest:
        batch, rest = _cut(rest)
        assert batch, "a cut that takes nothing never ends"
        batches.append(batch)
    return batches


def _message_bytes(batch: list[pb.JobResult]) -> int:
    return pb.WorkerMessage(results=pb.Results(results=batch)).ByteSize()


@pytest.mark.parametrize(
    ("what", "results"),
    [
        ("outputs of 1 MiB", [_result(i, output="o" * OUTPUT) for i in range(80)]),
        ("outputs under half the budget", [_result(i, output="o" * (OUTPUT // 3)) for i in range(200)]),
        ("non-ASCII outputs", [_result(i, output="é😀" * (OUTPUT // 32)) for i in range(200)]),
        (
            "outputs beside results and errors",
            [_result(i, "o" * (OUTPUT // 4), '{"x":"' + "r" * (OUTPUT // 4) + '"}', "e" * 60_000) for i in range(120)],
        ),
    ],
)
def test_no_results_message_grows_past_the_batch_budget(what: str, results: list[pb.JobResult]) -> None:
    # Given the unacknowledged results resent after a reconnect, far more than one message may carry
    assert sum(r.ByteSize() for r in results) > 32 * RESULTS_BATCH_BYTES
    # When they are cut into messages
    batches = _batches(results)
    # Then a message holds one result, or keeps within the budget (either way far below the stream's
    # 64 MiB limit), and every result goes out once, in order
    over = [(len(b), _message_bytes(b)) for b in batches if len(b) > 1 and _message_bytes(b) > RESULTS_BATCH_BYTES]
    assert not over, f"{what}: (results, bytes) of messages over {RESULTS_BATCH_BYTES} bytes: {over}"
    assert [r for b in batches for r in b] == results


def test_a_result_larger_than_the_budget_goes_alone_and_small_ones_share_a_message() -> None:
    big = _result(0, output="o" * (RESULTS_BATCH_BYTES + 1))
    small = [_result(i) for i in range(1, 101)]
    batches = _batches([*small[:50], big, *small[50:]])
    assert [len(b) for b in batches] == [50, 1, 50]
