"""Following many jobs on one stream (WatchJobs), on a real control plane and real workers: every job's
states in order, each once, until the last one ends; only the ends with ``ends_only``; across a
restart of the control plane (the Python client watches the jobs not ended yet again); over gRPC, REST
(newline-delimited JSON), the Python clients and ``corral wait``; bad lists refused naming the entry."""

from __future__ import annotations

import asyncio
import itertools
import json
import signal
import threading
from collections import defaultdict
from collections.abc import Callable

import grpc
import pytest

from corral import AsyncClient, Client, Job, job_ids
from corral.cli import commands
from corral.errors import DeadlineExceeded, InvalidArgument, NotFound
from corral.job_ids import MAX_WATCHED_JOBS
from corral.v1 import jobs_pb2
from tests.conftest import ControlProc, WorkerProc, wait_until
from tests.integration.test_health_metrics import scrape
from tests.integration.test_rest import Rest, http_port
from tests.support import cli
from tests.support.calls import request, rpc_error, seconds_from_now, submit_many

TERMINAL = {jobs_pb2.Job.SUCCEEDED, jobs_pb2.Job.FAILED, jobs_pb2.Job.CANCELLED}


def test_a_set_of_jobs_is_followed_to_the_last_end_on_one_stream(
    control_plane: ControlProc, spawn_worker: Callable[..., WorkerProc]
) -> None:
    # Given a job that already ended, one that will fail, one to be cancelled while queued, and sleeps
    first = submit_many(control_plane, [request("noop")])[0]
    spawn_worker(control_plane, threads=2)
    wait_until(lambda: control_plane.get(first.id).state == jobs_pb2.Job.SUCCEEDED, what="the first job")
    jobs = submit_many(
        control_plane,
        [request("failing", max_attempts=1), *[request("sleep", {"seconds": 0.3}) for _ in range(4)]],
    )
    cancelled = submit_many(control_plane, [request("noop", scheduled_at=seconds_from_now(3600))])[0]
    ids = [first.id, *(j.id for j in jobs), cancelled.id]
    # When one stream follows them all
    stream = control_plane.jobs.WatchJobs(jobs_pb2.WatchJobsRequest(ids=ids), timeout=60)
    seen: dict[str, list[jobs_pb2.Job]] = defaultdict(list)
    order: list[str] = []
    for event in stream:
        order.append(event.job.id)
        seen[event.job.id].append(event.job)
        if len(order) == len(ids):  # every job's state now has come: end the scheduled one
            control_plane.jobs.CancelJob(jobs_pb2.CancelJobRequest(id=cancelled.id))
    # Then it began with each job as it was, in the order asked; but a job whose change was being
    # committed as the stream began (the failing job failing just then, a sleep starting or ending) comes
    # once that commit ends, after the others (control.feeds.JobFeeds.watch_many): a job's first event never
    # shows a change before it is committed. The first job ended long before and the scheduled one does not
    # change until it is cancelled, so those two are always in their places.
    rank = {job_id: i for i, job_id in enumerate(ids)}
    in_place = [order[0]]
    for job_id in order[1:]:
        if job_id in in_place or rank[job_id] < rank[in_place[-1]]:
            break
        in_place.append(job_id)
    assert in_place[0] == first.id and cancelled.id in in_place, (order, ids)
    assert sorted(dict.fromkeys(order)) == sorted(ids)  # every job came
    assert seen[first.id][0].state == jobs_pb2.Job.SUCCEEDED and len(seen[first.id]) == 1
    # and it ended (OK) once the last of them ended, with each job's end as GetJob has it
    assert stream.code() == grpc.StatusCode.OK
    for job_id in ids:
        states = seen[job_id]
        assert states[-1].state in TERMINAL and states[-1] == control_plane.get(job_id)
        assert all(s.state not in TERMINAL for s in states[:-1]), "a state after the end"
        assert all(earlier != later for earlier, later in itertools.pairwise(states)), "a state repeated"
    assert seen[jobs[0].id][-1].state == jobs_pb2.Job.FAILED
    assert seen[cancelled.id][-1].state == jobs_pb2.Job.CANCELLED
    for sleep in jobs[1:]:
        assert [s.state for s in seen[sleep.id]][-2:] == [jobs_pb2.Job.RUNNING, jobs_pb2.Job.SUCCEEDED]

    # And with ends_only, each job once, at its end (the ended ones at once)
    ends = list(control_plane.jobs.WatchJobs(jobs_pb2.WatchJobsRequest(ids=ids, ends_only=True), timeout=30))
    assert [e.job.id for e in ends] == ids and all(e.job.state in TERMINAL for e in ends)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "kill-9"])
def test_wait_all_returns_every_end_in_order_across_a_control_plane_restart(
    control_plane: ControlProc, spawn_worker: Callable[..., WorkerProc], sig: signal.Signals
) -> None:
    # Given 2,000 quick jobs and 4 that run for a while, on a worker that stays up
    spawn_worker(control_plane, threads=4)
    quick = submit_many(control_plane, [request("noop") for _ in range(2000)])
    slow = submit_many(control_plane, [request("sleep", {"seconds": 2}) for _ in range(4)])
    ids = [j.id for j in quick + slow]
    ended: list[Job] = []
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            with Client(control_plane.address) as client:
                ended.extend(client.wait_all(ids, timeout=60))
        except BaseException as exc:
            errors.append(exc)

    waiter = threading.Thread(target=wait)
    waiter.start()
    # When the control plane restarts while the slow ones run
    wait_until(lambda: control_plane.get(slow[-1].id).state == jobs_pb2.Job.RUNNING, what="the slow jobs to run")
    control_plane.stop(sig)
    control_plane.start()
    waiter.join(60)
    # Then the wait rode through it and returned each job as it ended, in the order asked
    assert not waiter.is_alive() and not errors, errors
    assert [j.id for j in ended] == ids
    assert {j.state.name for j in ended} == {"SUCCEEDED"}
    assert all(j.attempts == 1 for j in ended[-4:]), "a running job ran again"


def test_the_clients_watch_many_and_time_out_naming_what_is_left(
    control_plane: ControlProc, spawn_worker: Callable[..., WorkerProc]
) -> None:
    spawn_worker(control_plane, threads=2)
    done, long_one = submit_many(control_plane, [request("noop"), request("sleep", {"seconds": 30})])
    with Client(control_plane.address) as client:
        # watch_many yields each state once, the iteration ending with the last end
        states = [(j.id, j.state.name) for j in client.watch_many([done.id])]
        assert states[-1] == (done.id, "SUCCEEDED")
        # a timeout says how many had not ended, and which came first
        with pytest.raises(
            DeadlineExceeded, match=rf"1 of 2 jobs not finished after 0.5 s \(the first: '{long_one.id}'\)"
        ):
            client.wait_all([done.id, long_one.id], timeout=0.5)
        client.cancel(long_one.id)

    # and the asyncio client does the same
    async def main() -> list[Job]:
        async with AsyncClient(control_plane.address) as aclient:
            seen = [j.state.name async for j in aclient.watch_many([long_one.id])]
            assert seen == ["CANCELLED"]
            return await aclient.wait_all([long_one.id, done.id])

    assert [(j.id, j.state.name) for j in asyncio.run(main())] == [(long_one.id, "CANCELLED"), (done.id, "SUCCEEDED")]


def test_corral_wait_prints_the_ends_and_exits_1_unless_all_succeeded(
    control_plane: ControlProc, spawn_worker: Callable[..., WorkerProc]
) -> None:
    spawn_worker(control_plane, threads=2)
    ok, bad = submit_many(control_plane, [request("noop"), request("failing", max_attempts=1)])
    args = ("--control", control_plane.address)
    good = cli.corral("wait", ok.id, ok.id, "--json", *args)
    assert good.returncode == 0, good.stderr
    assert [(j["id"], j["state"]) for j in json.loads(good.stdout)] == [(ok.id, "SUCCEEDED")] * 2
    both = cli.corral("wait", ok.id, bad.id, *args)
    assert both.returncode == 1
    assert ok.id in both.stdout and bad.id in both.stdout
    assert f"1 of 2 jobs did not succeed; job '{bad.id}' ended FAILED: ERROR: failing on purpose" in both.stderr
    missing = cli.corral("wait", "no-such-job", *args)
    assert missing.returncode != 0 and "job 'no-such-job' not found" in missing.stderr
    late = cli.corral("wait", bad.id, "--timeout", "-1", *args)
    assert late.returncode == 2 and "--timeout" in late.stderr


def test_a_stream_the_caller_ends_early_leaves_no_job_followed(control_plane: ControlProc) -> None:
    # Given 3 queued jobs (no worker) followed by one stream, and one followed by a second stream and
    # by a WatchJob
    jobs = submit_many(control_plane, [request("noop") for _ in range(3)])
    rest = Rest(http_port(control_plane))
    first = control_plane.jobs.WatchJobs(jobs_pb2.WatchJobsRequest(ids=[j.id for j in jobs]), timeout=30)
    second = control_plane.jobs.WatchJobs(jobs_pb2.WatchJobsRequest(ids=[jobs[0].id]), timeout=30)
    single = control_plane.jobs.WatchJob(jobs_pb2.WatchJobRequest(id=jobs[0].id), timeout=30)
    assert [next(first).job.id for _ in jobs] == [j.id for j in jobs] and next(second).job.id == jobs[0].id
    assert next(single).job.id == jobs[0].id
    assert scrape(rest)["corral_watched_jobs"] == 5
    # When the callers go away before the jobs end
    for call in (first, second, single):
        call.cancel()
    # Then the control plane stops following them
    wait_until(lambda: scrape(rest)["corral_watched_jobs"] == 0, what="the watches to be let go")


def test_the_cli_waits_for_more_jobs_than_one_stream_takes_one_stream_after_another(
    control_plane: ControlProc, spawn_worker: Callable[..., WorkerProc], monkeypatch: pytest.MonkeyPatch
) -> None:
    spawn_worker(control_plane, threads=2)
    ids = [j.id for j in submit_many(control_plane, [request("noop") for _ in range(5)])]
    # 10,000 in truth; here the client refuses a third id on one stream, so 3 streams it must be
    monkeypatch.setattr(job_ids, "MAX_WATCHED_JOBS", 2)
    monkeypatch.setattr(commands, "MAX_WATCHED_JOBS", 2)
    with Client(control_plane.address) as client:
        ended = commands._wait_all(client, [*ids, ids[0]], progress=False, timeout=30)
    assert [j.id for j in ended] == [*ids, ids[0]] and {j.state.name for j in ended} == {"SUCCEEDED"}


def test_bad_lists_are_refused_naming_the_entry(control_plane: ControlProc) -> None:
    (job,) = submit_many(control_plane, [request("noop")])

    def refused(ids: list[str]) -> grpc.RpcError:
        return rpc_error(lambda: list(control_plane.jobs.WatchJobs(jobs_pb2.WatchJobsRequest(ids=ids), timeout=10)))

    for ids, field, rule in (
        ([], "ids", "must hold 1 to 10,000 job ids, got 0"),
        ([job.id] * 2, "ids[1]", "repeats ids[0]"),
        ([job.id, ""], "ids[1]", "is required"),
        (["x" * 129], "ids[0]", "must be at most 128 characters"),
        ([f"j{i}" for i in range(MAX_WATCHED_JOBS + 1)], "ids", "got 10,001"),
    ):
        err = refused(ids)
        assert (
            err.code() == grpc.StatusCode.INVALID_ARGUMENT
            and err.details().startswith(f"{field}: ")
            and rule in err.details()
        ), err.details()
    missing = refused([job.id, "no-such-job"])
    assert missing.code() == grpc.StatusCode.NOT_FOUND and "'no-such-job'" in missing.details()
    # The clients refuse the same before sending, and a lone id passed as a string
    with Client(control_plane.address) as client:
        for bad, field in (("abc", "ids"), ([job.id, 7], "ids[1]"), ([], "ids"), ([job.id, job.id], "ids[1]")):
            with pytest.raises(InvalidArgument) as err:
                client.wait_all(bad)  # type: ignore[arg-type]
            assert err.value.field == field
        with pytest.raises(NotFound, match="no-such-job"):
            client.wait_all([job.id, "no-such-job"])


def test_watch_many_over_rest_is_newline_delimited_json(
    control_plane: ControlProc, spawn_worker: Callable[..., WorkerProc]
) -> None:
    spawn_worker(control_plane)
    a, b = submit_many(control_plane, [request("noop"), request("add_numbers", {"a": 1, "b": 2})])
    rest = Rest(http_port(control_plane))
    reply = rest.post("/v1/jobs:watchMany", {"ids": [a.id, b.id], "endsOnly": True})
    assert reply.status == 200 and reply.headers["Content-Type"] == "application/x-ndjson", reply.body
    ends = [line["result"]["job"] for line in reply.lines()]
    assert sorted((j["id"], j["state"]) for j in ends) == sorted([(a.id, "SUCCEEDED"), (b.id, "SUCCEEDED")])
    assert next(j for j in ends if j["id"] == b.id)["result"] == {"sum": 3}
    # Wrong JSON types are refused as the body is read; the control plane's own rules as a stream's
    # error line (as for WatchJob), with the error's HTTP status since nothing was sent before it
    for body, field in (({"ids": a.id}, "ids"), ({"ids": [a.id, 1]}, "ids[1]")):
        reply = rest.post("/v1/jobs:watchMany", body)
        assert reply.status == 400 and reply.violation() == field, reply.body
    repeated = rest.post("/v1/jobs:watchMany", {"ids": [a.id, a.id]})
    assert repeated.status == 400 and repeated.lines()[0]["error"]["message"].startswith("ids[1]: repeats ids[0]")
    missing = rest.post("/v1/jobs:watchMany", {"ids": [a.id, "nope"]})
    assert missing.status == 404 and missing.lines()[0]["error"]["message"] == "job 'nope' not found"
