"""Peers of an older release, for the rolling-upgrade tests: they leave unset what their release did not know.

:class:`OldWorker` speaks WorkerService.Connect as a worker of a release before ``registered_since``
(39dcae3; 8f1c9f1 and older) does: its Register has no ``registered_since`` (nor, like 9a0217a's, ``gpus``
or ``memory_mb``), and its results carry no ``output``. On the wire an unset field is an absent one, so
this is byte for byte what such a worker sends for the fields both releases know.
"""

from __future__ import annotations

import queue
from collections.abc import Iterable

import grpc

from corral.v1 import workers_pb2 as pb
from corral.v1 import workers_pb2_grpc as pb_grpc


class OldWorker:
    """One Connect stream of an old worker: Register first, then what the test sends."""

    def __init__(
        self,
        channel: grpc.Channel,
        worker_id: str,
        running: Iterable[tuple[str, int]] = (),
        finished: Iterable[tuple[str, int]] = (),
        registered_since: float = 0.0,
    ) -> None:
        """Open the stream and register; ``registered_since`` is for a current worker's Register, to compare."""
        self.worker_id = worker_id
        self._q: queue.Queue[pb.WorkerMessage | None] = queue.Queue()
        register = pb.Register(
            worker_id=worker_id,
            threads=2,
            slots=2,
            hostname="old-host",
            pid=4242,
            version="0.1.0",
            running=[pb.AttemptRef(job_id=j, attempt=a) for j, a in running],
            finished=[pb.AttemptRef(job_id=j, attempt=a) for j, a in finished],
            job_types=[pb.JobTypeInfo(name="noop", payload_schema_json="{}")],
            registered_since=registered_since,
        )
        self._q.put(pb.WorkerMessage(register=register))
        self.stream = pb_grpc.WorkerServiceStub(channel).Connect(iter(self._q.get, None))

    def next(self, kind: str) -> pb.ControlMessage:
        """The next control message of ``kind`` (a oneof name, or ``assign``/``ack``), skipping others."""
        for message in self.stream:
            if message.WhichOneof("msg") == kind or (kind in ("assign", "ack") and message.HasField(kind)):
                found: pb.ControlMessage = message
                return found
        raise AssertionError(f"the stream ended before a {kind} message")

    def result(
        self, job_id: str, attempt: int, outcome: int = pb.JobResult.SUCCEEDED, result_json: str = '{"old": true}'
    ) -> None:
        """Report an attempt's end as an old worker does: no ``output``; ``result_json`` as it is given."""
        result = pb.JobResult(
            attempt=pb.AttemptRef(job_id=job_id, attempt=attempt),
            outcome=outcome,  # type: ignore[arg-type]
            result_json=result_json,
            started_at=1.0,
            finished_at=2.0,
        )
        self._q.put(pb.WorkerMessage(results=pb.Results(results=[result])))

    def close(self) -> None:
        """End the stream (as the worker's process going away does)."""
        self._q.put(None)
        self.stream.cancel()
