"""A worker stream whose messages do not decode (a string that is not UTF-8) is refused INVALID_ARGUMENT
naming the field, at its first message or later, as every other call is; not UNKNOWN, and not an OK end
that a worker would take for a restart and reconnect to at once."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from corral.v1 import workers_pb2
from tests.conftest import ControlProc
from tests.support.calls import field_of

MARK = b"MARK"
NOT_UTF8 = b"\xff\xfe\xfd\xfc"


def _connect(cp: ControlProc) -> grpc.StreamStreamMultiCallable:
    return cp.channel().stream_stream(
        "/corral.v1.WorkerService/Connect", request_serializer=lambda b: b, response_deserializer=lambda b: b
    )


def _register(worker_id: str) -> bytes:
    msg = workers_pb2.WorkerMessage()
    msg.register.worker_id = worker_id
    msg.register.threads = 1
    msg.register.slots = 1
    return msg.SerializeToString()


def _refused(cp: ControlProc, messages: list[bytes]) -> grpc.RpcError:
    def requests() -> Iterator[bytes]:
        yield from messages

    with pytest.raises(grpc.RpcError) as err:
        for _ in _connect(cp)(requests(), timeout=10):
            pass
    return err.value


def test_a_register_that_does_not_decode_is_refused_naming_the_field(control_plane: ControlProc) -> None:
    err = _refused(control_plane, [_register("MARK").replace(MARK, NOT_UTF8)])
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    assert field_of(err) == "register.worker_id"
    assert control_plane.workers() == []


def test_a_later_message_that_does_not_decode_ends_the_stream_naming_the_field(control_plane: ControlProc) -> None:
    heartbeat = workers_pb2.WorkerMessage()
    heartbeat.output.attempt.job_id = "MARK"
    err = _refused(control_plane, [_register("w1"), heartbeat.SerializeToString().replace(MARK, NOT_UTF8)])
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    assert field_of(err) == "output.attempt.job_id"
