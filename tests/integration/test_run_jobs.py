"""RunJobs: RunJob for many jobs on one stream that stays open, over gRPC, REST and both clients.

Against a real control plane and worker on 127.0.0.1: each tagged request's job is stored once and
its events come tagged and in order, interleaved with other jobs'; a refused submission is answered
with its error and the stream goes on; the stream ends OK once the caller has sent its last request
and every job has ended, and a stopping control plane ends idle streams too rather than wait for them.
The clients keep one stream for a sequence of ``run`` calls and open a fresh one after a restart.
"""

from __future__ import annotations

import asyncio
import queue
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2

import corral
import corral.client
from corral import JobState
from corral.run_streams import RunStream
from corral.v1 import jobs_pb2
from tests.conftest import ControlProc, wait_until
from tests.integration.test_rest import BAD_REQUEST, Rest
from tests.support.calls import TERMINAL, request, stored


@pytest.fixture
def served(control_plane: ControlProc, spawn_worker: Any) -> ControlProc:
    spawn_worker(control_plane, threads=4, imports=())  # the built-in job types only
    return control_plane


class Stream:
    """A RunJobs call fed from a queue: ``send`` a request, ``end`` the requests, read the answers."""

    def __init__(self, cp: ControlProc) -> None:
        self._requests: queue.SimpleQueue[jobs_pb2.RunJobsRequest | None] = queue.SimpleQueue()
        self.call = cp.jobs.RunJobs(iter(self._requests.get, None), timeout=60)

    def send(self, tag: str, job: jobs_pb2.SubmitJobRequest) -> None:
        self._requests.put(jobs_pb2.RunJobsRequest(tag=tag, job=job))

    def end(self) -> None:
        self._requests.put(None)

    def read_until(self, done: Any) -> list[jobs_pb2.RunJobsEvent]:
        """Answers until ``done(answers so far)``."""
        seen: list[jobs_pb2.RunJobsEvent] = []
        for event in self.call:
            seen.append(event)
            if done(seen):
                return seen
        raise AssertionError(f"the stream ended first: {seen}")


def ended(tags: set[str]) -> Any:
    """``done`` for :meth:`Stream.read_until`: every tag in ``tags`` got a terminal event or an error."""

    def check(seen: list[jobs_pb2.RunJobsEvent]) -> bool:
        closed = {e.tag for e in seen if e.HasField("error") or e.event.job.state in TERMINAL}
        return tags <= closed

    return check


def by_tag(events: list[jobs_pb2.RunJobsEvent]) -> dict[str, list[jobs_pb2.RunJobsEvent]]:
    out: dict[str, list[jobs_pb2.RunJobsEvent]] = {}
    for e in events:
        out.setdefault(e.tag, []).append(e)
    return out


def test_jobs_on_one_stream_run_at_once_and_each_tag_gets_its_own_events_in_order(served: ControlProc) -> None:
    stream = Stream(served)
    # When three jobs are sent on one stream, the slow one first
    stream.send("slow", request("sleep", {"seconds": 0.5}))
    stream.send("sum", request("add_numbers", {"a": 2, "b": 40}))
    stream.send("rev", request("reverse_string", {"text": "héllo"}))
    events = stream.read_until(ended({"slow", "sum", "rev"}))

    # Then each tag's events are one job's, from the committed job to its end, no state twice
    tags = by_tag(events)
    assert set(tags) == {"slow", "sum", "rev"}
    for tag, mine in tags.items():
        jobs = [e.event.job for e in mine]
        assert len({j.id for j in jobs}) == 1, tag
        assert jobs[-1].state == jobs_pb2.Job.SUCCEEDED and jobs[-1].attempts == 1, tag
        assert all(j.state not in TERMINAL for j in jobs[:-1]), tag
        assert len({j.state for j in jobs}) == len(jobs), tag
        assert served.get(jobs[0].id) == jobs[-1]  # the end is the job GetJob answers
    assert dict(tags["sum"][-1].event.job.result) == {"sum": 42}
    # and the short jobs ended while the slow one still ran: they did not wait behind it
    order = [e.tag for e in events if e.event.job.state == jobs_pb2.Job.SUCCEEDED]
    assert order[-1] == "slow", order
    assert stored(served) == 3

    # When the caller sends no more, the stream ends OK (nothing is open)
    stream.end()
    assert list(stream.call) == []
    assert stream.call.code() == grpc.StatusCode.OK


def test_a_refused_submission_is_answered_and_the_stream_goes_on(served: ControlProc) -> None:
    stream = Stream(served)
    stream.send("long", request("sleep", {"seconds": 0.5}))
    first = stream.read_until(lambda seen: len(seen) == 1)[0]
    assert first.tag == "long" and first.HasField("event")

    # When bad requests follow on the same stream
    stream.send("", request("noop"))
    stream.send("x" * 65, request("noop"))
    stream.send("long", request("noop"))  # a tag still open
    stream.send("type", request("nope"))
    stream.send("prio", request("noop", priority=1000))
    stream.send("pay", request("add_numbers", {"a": "1", "b": 2}))
    stream.send("ok", request("noop"))

    def long_done(seen: list[jobs_pb2.RunJobsEvent]) -> bool:
        return any(e.tag == "long" and e.event.job.state in TERMINAL for e in seen)

    events = stream.read_until(
        lambda seen: ended({"", "x" * 65, "type", "prio", "pay", "ok"})(seen) and long_done(seen)
    )

    # Then each is answered INVALID_ARGUMENT naming the field, and nothing of them is stored
    errors = {e.tag: e.error for e in events if e.HasField("error")}
    assert set(errors) == {"", "x" * 65, "long", "type", "prio", "pay"}
    expected = {"": "tag", "x" * 65: "tag", "long": "tag", "type": "job.type", "prio": "job.priority"}
    for tag, status in errors.items():
        assert status.code == grpc.StatusCode.INVALID_ARGUMENT.value[0], (tag, status)
        (detail,) = status.details
        bad = _bad_request(detail)
        if tag in expected:
            assert bad.field_violations[0].field == expected[tag], (tag, status)
        else:
            assert bad.field_violations[0].field.startswith("job.payload"), (tag, status)
    # and the stream went on: the open job and the good one both ran, once each
    mine = by_tag(events)
    assert mine["ok"][-1].event.job.state == jobs_pb2.Job.SUCCEEDED
    assert [e for e in mine["long"] if e.HasField("event")][-1].event.job.state == jobs_pb2.Job.SUCCEEDED
    assert stored(served) == 2
    stream.end()
    assert list(stream.call) == [] and stream.call.code() == grpc.StatusCode.OK


def _bad_request(detail: Any) -> Any:
    bad = error_details_pb2.BadRequest()
    assert detail.Unpack(bad)
    return bad


def test_the_stream_ends_only_once_every_job_sent_has_ended(served: ControlProc) -> None:
    # Given a job still running when the caller says it sends no more
    stream = Stream(served)
    stream.send("a", request("sleep", {"seconds": 0.5}))
    stream.end()

    # Then the stream still carries it to its end, then ends OK
    events = list(stream.call)
    assert events[-1].tag == "a" and events[-1].event.job.state == jobs_pb2.Job.SUCCEEDED
    assert stream.call.code() == grpc.StatusCode.OK


def test_a_caller_that_goes_away_leaves_its_jobs_running(served: ControlProc) -> None:
    stream = Stream(served)
    stream.send("a", request("sleep", {"seconds": 1}))
    stream.send("b", request("sleep", {"seconds": 1}))
    events = stream.read_until(lambda seen: {e.tag for e in seen} == {"a", "b"})
    ids = {e.event.job.id for e in events}
    stream.call.cancel()

    wait_until(lambda: all(served.get(i).state in TERMINAL for i in ids), 30, what="the jobs to end")
    for job_id in ids:
        done = served.get(job_id)
        assert done.state == jobs_pb2.Job.SUCCEEDED and done.attempts == 1
    assert stored(served) == 2


def test_a_stopping_control_plane_ends_open_streams_idle_or_not_without_waiting_for_them(
    make_control_plane: Any, spawn_worker: Any
) -> None:
    # Given a long shutdown grace, an idle stream (its one job done) and one whose job still runs
    cp = make_control_plane(CORRAL_SHUTDOWN_GRACE_SEC=60)
    spawn_worker(cp, threads=2, imports=())
    idle, busy = Stream(cp), Stream(cp)
    idle.send("a", request("noop"))
    idle.read_until(ended({"a"}))
    busy.send("b", request("sleep", {"seconds": 30}))
    busy.read_until(lambda seen: seen[-1].event.job.state == jobs_pb2.Job.RUNNING)

    # When the control plane is stopped
    started = time.monotonic()
    assert cp.stop(signal.SIGTERM, timeout=50) == 0

    # Then it did not wait out the grace for them, and both streams ended UNAVAILABLE (watch again)
    assert time.monotonic() - started < 20
    for stream in (idle, busy):
        with pytest.raises(grpc.RpcError) as broken:
            list(stream.call)
        assert broken.value.code() == grpc.StatusCode.UNAVAILABLE


def test_rest_reads_a_stream_of_requests_and_answers_tagged_newline_delimited_json(served: ControlProc) -> None:
    rest = Rest(served.http_port)
    body = b"\n".join((
        b'{"tag": "r", "job": {"type": "reverse_string", "payload": {"text": "abc"}}}',
        b'{"tag": "n", "job": {"type": "nope"}}',
        b'{"tag": "s", "job": {"type": "add_numbers", "payload": {"a": 1, "b": 2}}}',
    ))  # fmt: skip
    reply = rest.call("POST", "/v1/jobs:runMany", raw=body)
    assert reply.status == 200, reply.body
    assert reply.headers["Content-Type"] == "application/x-ndjson"
    answers = [line["result"] for line in reply.lines()]
    last = {a["tag"]: a for a in answers}
    assert last["r"]["event"]["job"]["state"] == "SUCCEEDED"
    assert last["r"]["event"]["job"]["result"] == {"reversed": "cba"}
    assert last["s"]["event"]["job"]["result"] == {"sum": 3}
    (detail,) = [d for d in last["n"]["error"]["details"] if d["@type"] == BAD_REQUEST]
    assert detail["fieldViolations"][0]["field"] == "job.type"
    assert stored(served) == 2

    # A body that does not parse is refused before anything is called, naming the value
    for raw, field in ((b'{"tag": "a", "job": {"type": "noop"}} [1]', "requests[1]"),
                       (b'{"tag": "a", "job": {"type": "noop", "priority": "high"}}', "requests[0].job.priority"),
                       (b'{"tag": "a", "job": {"type": "noop"}} {"tag": ', "")):  # fmt: skip
        bad = rest.call("POST", "/v1/jobs:runMany", raw=raw)
        assert bad.status == 400, bad.body
        (detail,) = [d for d in bad.json()["details"] if d["@type"] == BAD_REQUEST]
        assert detail["fieldViolations"][0].get("field", "") == field, bad.body
    assert stored(served) == 2

    # An empty body is an empty stream
    empty = rest.call("POST", "/v1/jobs:runMany", raw=b"")
    assert empty.status == 200 and empty.lines() == []

    # One Idempotency-Key cannot name each of a stream's jobs: refused, rather than ignored
    keyed = rest.call("POST", "/v1/jobs:runMany", raw=b'{"tag": "a", "job": {"type": "noop"}}',
                      headers={"Idempotency-Key": '"k-1"'})  # fmt: skip
    (line,) = keyed.lines()  # a stream's error before its first answer: {"error": status}, as grpc-gateway
    (detail,) = [d for d in line["error"]["details"] if d["@type"] == BAD_REQUEST]
    assert keyed.status == 400 and detail["fieldViolations"][0]["field"] == "idempotency-key", keyed.body
    assert stored(served) == 2


def test_each_job_of_a_stream_carries_its_own_idempotency_key(served: ControlProc) -> None:
    stream = Stream(served)
    stream.send("a", request("noop", idempotency_key="k-1"))
    first = stream.read_until(ended({"a"}))[-1].event.job
    stream.send("b", request("noop", idempotency_key="k-1"))
    again = stream.read_until(ended({"b"}))[-1].event.job
    assert again.id == first.id and stored(served) == 1
    stream.end()
    assert list(stream.call) == []

    # The call's idempotency-key metadata is refused, before anything is read
    refused = served.jobs.RunJobs(iter([jobs_pb2.RunJobsRequest(tag="a", job=request("noop"))]),
                                  metadata=(("idempotency-key", "k-2"),), timeout=30)  # fmt: skip
    with pytest.raises(grpc.RpcError) as bad:
        list(refused)
    assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "idempotency-key" in (bad.value.details() or "")
    assert stored(served) == 1


class CountingStream(RunStream):
    opened = 0

    def __init__(self, *args: Any) -> None:
        CountingStream.opened += 1
        super().__init__(*args)


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[CountingStream]]:
    CountingStream.opened = 0
    monkeypatch.setattr(corral.client, "RunStream", CountingStream)
    yield CountingStream


def test_the_client_runs_job_after_job_on_one_stream(served: ControlProc, counted: type[CountingStream]) -> None:
    with corral.Client(served.address) as client:
        results = [client.run("add_numbers", {"a": i, "b": 1}).result for i in range(20)]
        assert results == [{"sum": i + 1} for i in range(20)]
        # A refusal is the caller's error, named as submit names it, and the stream goes on
        with pytest.raises(corral.InvalidArgument) as bad:
            client.run("nope")
        assert bad.value.field == "type"
        assert client.run("noop").state is JobState.SUCCEEDED
    assert counted.opened == 1
    assert stored(served) == 21


def test_a_client_used_from_several_threads_runs_each_job_once(served: ControlProc) -> None:
    ran: list[corral.Job] = []
    errors: list[BaseException] = []

    def runs(client: corral.Client, n: int) -> None:
        try:
            for i in range(n):
                ran.append(client.run("sleep", {"seconds": 0.01}, name=f"{threading.get_ident()}-{i}"))
        except BaseException as exc:
            errors.append(exc)

    with corral.Client(served.address) as client:
        threads = [threading.Thread(target=runs, args=(client, 15)) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert not errors, errors
    assert len(ran) == 90 and {j.state for j in ran} == {JobState.SUCCEEDED}
    assert len({j.id for j in ran}) == 90 and len({j.name for j in ran}) == 90
    assert stored(served) == 90


def test_a_watch_left_early_does_not_disturb_the_next_run(served: ControlProc) -> None:
    with corral.Client(served.address) as client:
        updates = client.submit_and_watch("sleep", {"seconds": 0.5})
        first = next(updates)
        updates.close()  # left before its end: the job goes on
        assert client.run("noop").state is JobState.SUCCEEDED
        wait_until(lambda: client.get(first.id).state is JobState.SUCCEEDED, 30, what="the job left to finish")
    assert stored(served) == 2


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL])
def test_the_client_opens_a_fresh_stream_after_a_restart(served: ControlProc, how: int) -> None:
    async def run_async(address: str) -> corral.Job:
        async with corral.AsyncClient(address) as aclient:
            await aclient.run("noop")
            served.stop(how)
            served.start()
            return await aclient.run("noop")

    with corral.Client(served.address) as client:
        assert client.run("noop").state is JobState.SUCCEEDED
        served.stop(how)
        served.start()
        # The kept stream ended with the control plane: the next run is not refused for it
        assert client.run("noop").state is JobState.SUCCEEDED
    assert asyncio.run(run_async(served.address)).state is JobState.SUCCEEDED
    assert stored(served) == 4


def test_the_async_client_runs_many_jobs_at_once(served: ControlProc) -> None:
    async def main() -> list[corral.Job]:
        async with corral.AsyncClient(served.address) as client:
            with pytest.raises(corral.InvalidArgument) as bad:
                await client.run("add_numbers", {"a": "x", "b": 1})
            assert bad.value.field.startswith("payload")
            return list(await asyncio.gather(*(client.run("add_numbers", {"a": i, "b": 0}) for i in range(40))))

    done = asyncio.run(main())
    assert [j.result for j in done] == [{"sum": i} for i in range(40)]
    assert stored(served) == 40
