"""One client cannot take the control plane's memory with watches it never reads: the jobs it may watch at
once are bounded (control.feeds.MAX_WATCHED_PER_CLIENT), past which a new watch is RESOURCE_EXHAUSTED with a
retry-after, and what it held is given back when its streams end.

Before the bound, 100 WatchJobs streams of 10,000 ids each from one client that read nothing took the
control plane from 90 MB to 714 MB and held another client's GetJob for up to 15 s (2,000 such streams
would take some 14 GB)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from corral.v1 import jobs_pb2, jobs_pb2_grpc
from tests.conftest import ControlProc, wait_until
from tests.integration.test_rate_limits import metric, retry_after

PER_CLIENT = 100_000  # control.feeds.MAX_WATCHED_PER_CLIENT
BATCH = 10_000  # the most ids one WatchJobs stream takes


def test_one_client_watches_at_most_its_share_of_jobs_and_gets_it_back(control_plane: ControlProc) -> None:
    later = Timestamp()
    later.FromDatetime(datetime.now(UTC) + timedelta(days=1))
    reqs = [jobs_pb2.SubmitJobRequest(type="noop", scheduled_at=later) for _ in range(BATCH)]
    ids = [j.id for j in control_plane.jobs.SubmitJobs(jobs_pb2.SubmitJobsRequest(jobs=reqs), timeout=60).jobs]
    streams = PER_CLIENT // BATCH

    async def attack() -> None:
        async with grpc.aio.insecure_channel(control_plane.address) as channel:
            stub = jobs_pb2_grpc.JobServiceStub(channel)
            # ends_only on jobs that have not ended: each stream is open and sends nothing (nor is it read)
            held = [stub.WatchJobs(jobs_pb2.WatchJobsRequest(ids=ids, ends_only=True)) for _ in range(streams)]
            await asyncio.to_thread(
                wait_until, lambda: metric(control_plane, "corral_watched_jobs") == PER_CLIENT, 30, 0.1, "watches held"
            )
            # When the same client opens one more watch, of a single job
            extra = stub.WatchJob(jobs_pb2.WatchJobRequest(id=ids[0]))
            try:
                await extra.read()
                raise AssertionError("a watch past the client's bound was served")
            except grpc.aio.AioRpcError as err:
                # Then it is refused with a retry-after, as a rate limit is
                assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err
                assert "too many watches" in (err.details() or "")
                assert retry_after(err) >= 1
            # And the control plane still answers everything else
            assert (await stub.GetJob(jobs_pb2.GetJobRequest(id=ids[0]), timeout=10)).id == ids[0]
            # and a RunJob is served: a job it submits is never refused its events once accepted
            run = stub.RunJob(jobs_pb2.SubmitJobRequest(type="noop", scheduled_at=later))
            first = await run.read()
            assert first.job.state == jobs_pb2.Job.SCHEDULED, first
            run.cancel()
            # When one stream ends, its share is given back and a new watch is served
            held.pop().cancel()
            await asyncio.to_thread(
                wait_until,
                lambda: metric(control_plane, "corral_watched_jobs") == PER_CLIENT - BATCH,
                30,
                0.1,
                "a stream given back",
            )
            again = stub.WatchJob(jobs_pb2.WatchJobRequest(id=ids[0]))
            assert (await again.read()).job.id == ids[0]
            again.cancel()
            for call in held:
                call.cancel()

    asyncio.run(attack())
    wait_until(lambda: metric(control_plane, "corral_watched_jobs") == 0, 30, 0.1, "every watch given back")
