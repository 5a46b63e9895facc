"""control.api.status: the one mapping from Corral errors to gRPC status, message and details."""

from __future__ import annotations

import grpc
from google.rpc import error_details_pb2, status_pb2

from control.api.status import MAX_MESSAGE, rich_status
from corral.errors import InvalidArgument, NotFound


def test_a_message_quoting_a_huge_value_is_cut_to_fit_the_metadata_limit() -> None:
    # Status and details travel as metadata, which gRPC caps at 16 KiB: past it the caller got
    # RESOURCE_EXHAUSTED "Stream removed" instead of the error
    code, message, trailers = rich_status(NotFound("worker '" + "x" * 20_000 + "' not found"))
    assert code == grpc.StatusCode.NOT_FOUND
    assert len(message) <= MAX_MESSAGE and message.startswith("worker 'xxx") and message.endswith("' not found")
    assert sum(len(value) for _, value in trailers) < 4 * MAX_MESSAGE


def test_a_field_rule_is_cut_the_same_way_and_short_ones_are_kept() -> None:
    _, message, trailers = rich_status(InvalidArgument("payload.a", "y" * 50_000))
    status = status_pb2.Status.FromString(dict(trailers)["grpc-status-details-bin"])  # type: ignore[arg-type]
    bad = error_details_pb2.BadRequest()
    status.details[0].Unpack(bad)
    assert bad.field_violations[0].field == "payload.a" and len(bad.field_violations[0].description) <= MAX_MESSAGE
    assert len(message) <= MAX_MESSAGE
    assert rich_status(InvalidArgument("priority", "must be between 0 and 100, got 101"))[1] == (
        "priority: must be between 0 and 100, got 101"
    )
