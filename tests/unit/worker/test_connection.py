"""The worker side of the Connect protocol, against a scripted in-process control plane.

The fake control plane is a real ``grpc.aio`` server on 127.0.0.1:0 whose Connect handler hands
each stream to the test as a :class:`Session` (what the worker sent, and a way to answer). The
worker is a real :class:`worker.Agent` with real runner processes.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from corral import open_files
from corral.v1 import workers_pb2 as pb
from tests.support.fake_control import FakeControl, job, run_agent
from tests.support.waiting import until
from worker import Agent
from worker.connection import MAX_QUEUED_OUTPUT

ROOT = Path(__file__).resolve().parents[3]
R = pb.JobResult


@pytest.fixture(autouse=True)
def _importable_test_plugins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    monkeypatch.syspath_prepend(str(ROOT))


def scenario(body: Callable[[FakeControl, Agent], Awaitable[None]], **config: Any) -> None:
    settings: dict[str, Any] = {
        "threads": 2,
        "slots": 2,
        "labels": {"zone": "test"},
        "imports": ("tests.support.jobtypes",),
        "drain_timeout_sec": 5.0,
    }
    run_agent(body, **{**settings, **config})


def test_registers_runs_assignments_and_forgets_acknowledged_results():
    async def body(control: FakeControl, agent: Agent) -> None:
        s = await control.session()
        register = await s.next("register")
        assert (register.worker_id, register.threads, register.slots) == ("w-test", 2, 2)
        assert dict(register.labels) == {"zone": "test"}
        assert register.pid == os.getpid() and register.hostname and register.version
        types = {t.name: t for t in register.job_types}
        assert {"noop", "add_numbers", "resize_image", "record", "py_loop"} <= set(types)
        assert json.loads(types["add_numbers"].payload_schema_json)["required"] == ["a", "b"]
        assert not register.running and not register.finished
        s.registered(interval=0.1)
        s.assign(job("j1", "add_numbers", {"a": 1.0, "b": 2}), job("j2", "failing", {"message": "x"}))
        results = await s.results(2)
        ok, bad = results[("j1", 1)], results[("j2", 1)]
        assert (ok.outcome, json.loads(ok.result_json)) == (R.SUCCEEDED, {"sum": 3})
        assert 0 < ok.started_at <= ok.finished_at <= time.time()
        assert (bad.outcome, bad.error_code, bad.error_message) == (R.FAILED, "ERROR", "x")
        assert agent.connection is not None and agent.connection.unacked == 2
        s.ack(("j1", 1), ("j2", 1))
        assert await agent.connection.wait_acked(5)
        # Heartbeats keep coming at the interval asked for.
        assert list((await s.next("heartbeat")).running) == []

    scenario(body)


def test_results_of_one_burst_share_messages():
    async def body(control: FakeControl, agent: Agent) -> None:
        s = await control.session()
        await s.next("register")
        s.registered()
        s.assign(*[job(f"n{i}", "noop") for i in range(40)])
        results = await s.results(40)
        assert all(r.outcome == R.SUCCEEDED for r in results.values())
        assert s.results_messages < 40

    scenario(body)


def test_reconnect_lists_running_and_finished_and_resends_unacked_results():
    async def body(control: FakeControl, agent: Agent) -> None:
        s = await control.session()
        await s.next("register")
        s.registered()
        s.assign(job("quick", "noop"), job("long", "sleep", {"seconds": 1.0}))
        first = await s.results(1)
        assert set(first) == {("quick", 1)}  # not acknowledged
        # When the control plane goes away (the stream is cut) and comes back
        await control.stop()
        await control.start()
        s2 = await control.session()
        register = await s2.next("register")
        # Then the worker re-registers under the same id, listing what runs and what waits for an ack
        assert register.worker_id == "w-test"
        assert [(r.job_id, r.attempt) for r in register.running] == [("long", 1)]
        assert list(register.running_threads) == [1]
        assert [(r.job_id, r.attempt) for r in register.finished] == [("quick", 1)]
        s2.registered(adopted=[pb.AttemptRef(job_id="long", attempt=1)])
        # And resends the unacknowledged result, then reports the job that kept running
        resent = await s2.results(2)
        assert resent[("quick", 1)].outcome == R.SUCCEEDED
        assert resent[("long", 1)].outcome == R.SUCCEEDED
        s2.ack(("quick", 1), ("long", 1))
        assert agent.connection is not None and await agent.connection.wait_acked(5)

    scenario(body)


def test_rejected_attempts_are_killed_and_forgotten():
    async def body(control: FakeControl, agent: Agent) -> None:
        s = await control.session()
        await s.next("register")
        s.registered()
        s.assign(job("stale", "sleep", {"seconds": 30}))
        await until(lambda: agent.pool.holds("stale", 1))
        s.end()  # the stream ends; the worker reconnects
        s2 = await control.session()
        register = await s2.next("register")
        assert [r.job_id for r in register.running] == ["stale"]
        s2.registered(rejected=[pb.AttemptRef(job_id="stale", attempt=1)])
        await until(lambda: not agent.pool.holds("stale", 1) and agent.pool.idle == 2, what="the kill of 'stale'")
        assert agent.connection is not None and agent.connection.unacked == 0

    scenario(body)


def test_cancel_and_timeout():
    async def body(control: FakeControl, agent: Agent) -> None:
        s = await control.session()
        await s.next("register")
        s.registered()
        s.assign(job("cancel-me", "sleep", {"seconds": 30}), job("too-slow", "sleep", {"seconds": 30}, timeout=0.2))
        s.send(cancel=pb.Cancel(attempt=pb.AttemptRef(job_id="cancel-me", attempt=1)))
        results = await s.results(2)
        assert (results[("cancel-me", 1)].outcome, results[("cancel-me", 1)].error_code) == (R.CANCELLED, "CANCELLED")
        assert (results[("too-slow", 1)].outcome, results[("too-slow", 1)].error_code) == (R.TIMEOUT, "TIMEOUT")

    scenario(body, kill_grace_sec=0.01)


def test_a_timeout_states_the_jobs_own_timeout_and_how_long_it_ran():
    async def body(control: FakeControl, agent: Agent) -> None:
        s = await control.session()
        await s.next("register")
        s.registered()
        # Given a job with a 1 s timeout that first waits for the one runner process (busy for 0.5 s)
        s.assign(job("blocker", "sleep", {"seconds": 0.5}), job("too-slow", "sleep", {"seconds": 30}, timeout=1.0))
        results = await s.results(2)
        # Then its TIMEOUT states the timeout it was given (before: "deadline of 0.5 s passed"), and
        # that it ran less than that
        done = results[("too-slow", 1)]
        assert (done.outcome, done.error_code) == (R.TIMEOUT, "TIMEOUT")
        said = re.fullmatch(
            r"timeout of 1 s passed \(ran ([0-9.]+) s\); killed \(signal SIG[A-Z]+\)", done.error_message
        )
        assert said is not None, done.error_message
        assert 0 < float(said[1]) < 1.0

    scenario(body, threads=1, slots=1, kill_grace_sec=0.01)


def test_drain_from_the_control_plane_finishes_running_jobs_hands_back_the_rest_and_stops():
    async def body(control: FakeControl, agent: Agent) -> None:
        s = await control.session()
        await s.next("register")
        s.registered()
        s.assign(job("short", "sleep", {"seconds": 0.3}), job("long", "sleep", {"seconds": 30}))
        await until(lambda: agent.pool.busy == 2)
        # When the control plane asks for a drain with a 1 s deadline
        s.send(drain=pb.Drain(deadline_sec=1.0))
        draining = await s.next("draining")
        assert draining.deadline_sec == 1.0
        # Then new work is handed back at once
        s.assign(job("late", "noop"))
        late = await s.results(1)
        assert late[("late", 1)].outcome == R.HANDED_BACK
        s.ack(("late", 1))
        # The short job finishes; the long one is handed back at the deadline
        rest = await s.results(2, within=5)
        assert rest[("short", 1)].outcome == R.SUCCEEDED
        assert rest[("long", 1)].outcome == R.HANDED_BACK
        s.ack(("short", 1), ("long", 1))
        # And the agent closes the stream and stops
        async with asyncio.timeout(10):
            await agent.wait_stopped()
        assert agent.pool.pids() == []

    scenario(body)


def test_a_drain_keeps_an_unacknowledged_result_until_its_deadline_then_names_it(caplog: pytest.LogCaptureFixture):
    async def body(control: FakeControl, agent: Agent) -> None:
        s = await control.session()
        await s.next("register")
        s.registered()
        s.assign(job("unheard", "sleep", {"seconds": 0.3}))
        await until(lambda: agent.pool.busy == 1, what="the job to run")
        # When the worker drains (3 s deadline) and its control plane goes away for good
        started = time.monotonic()
        drain = asyncio.create_task(agent.drain(3.0))
        await s.next("draining")
        await control.stop()
        # Then the worker keeps trying to deliver the job's result up to its deadline (before: 2 s after the job)
        async with asyncio.timeout(10):
            await drain
        assert time.monotonic() - started >= 3.0
        # and, giving up, says which result the control plane never acknowledged
        (gave_up,) = [r for r in caplog.records if getattr(r, "phase", "") == "unacknowledged"]
        assert (gave_up.levelname, gave_up.getMessage()) == ("WARNING", "worker_draining")
        assert gave_up.__dict__["results"] == "unheard attempt 1 SUCCEEDED"

    scenario(body)


def test_keeps_retrying_while_the_control_plane_is_down():
    async def body(control: FakeControl, agent: Agent) -> None:
        s = await control.session()
        await s.next("register")
        s.registered()
        assert agent.connection is not None
        async with asyncio.timeout(5):
            await agent.connection.registered.wait()
        await control.stop()
        # Several failed attempts later (capped backoff) it is still trying, and still alive.
        tried = agent.connection.connect_attempts
        await until(lambda: agent.connection is not None and agent.connection.connect_attempts >= tried + 4)
        assert not agent.connection.registered.is_set()
        await control.start()
        s2 = await control.session(within=5)
        assert (await s2.next("register")).worker_id == "w-test"
        s2.registered()
        async with asyncio.timeout(5):
            await agent.connection.registered.wait()
        assert agent.connection.sessions == 2, (agent.connection.sessions, agent.connection.connect_attempts)

    scenario(body)


def test_an_unexpected_error_in_one_attempt_is_logged_and_the_next_attempt_registers(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    # Before, any error but a few network ones ended the reconnect loop: the worker ran on, unregistered for good.
    real = open_files.spare
    calls = 0

    def failing_once() -> int:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("a bug in one attempt")
        return real()

    monkeypatch.setattr(open_files, "spare", failing_once)

    async def body(control: FakeControl, agent: Agent) -> None:
        s = await control.session(within=5)
        assert (await s.next("register")).worker_id == "w-test"
        s.registered()
        assert agent.connection is not None
        async with asyncio.timeout(5):
            await agent.connection.registered.wait()
        assert agent.connection.connect_attempts == 2
        assert any("a bug in one attempt" in str(r.exc_info) for r in caplog.records if r.exc_info)

    scenario(body)


def test_registers_its_gpus_and_memory_and_attempts_keep_their_devices_across_a_reconnect(tmp_path: Path):
    gate = tmp_path / "gate"

    def gpu_job(job_id: str, gpus: int) -> pb.Assignment:
        assignment = job(job_id, "visible_devices", {"gate": str(gate)})
        assignment.gpus = gpus
        return assignment

    async def body(control: FakeControl, agent: Agent) -> None:
        def free() -> tuple[str, ...]:
            return agent.pool.free_gpus

        s = await control.session()
        register = await s.next("register")
        # The worker says how many GPUs and how much memory it gives to jobs
        assert (register.gpus, register.memory_mb) == (3, 4096)
        s.registered()
        # Given two attempts holding GPUs, running
        s.assign(gpu_job("two", 2), gpu_job("one", 1))
        await until(lambda: agent.pool.busy == 2, what="both attempts running")
        assert free() == ()
        # When the stream ends and the worker registers again
        s.end()
        s2 = await control.session()
        register = await s2.next("register")
        assert {r.job_id for r in register.running} == {"two", "one"}
        assert (register.gpus, register.memory_mb) == (3, 4096)
        s2.registered(adopted=list(register.running))
        # Then the attempts kept their devices, and a new one finds none free: it is handed back
        assert free() == ()
        s2.assign(gpu_job("late", 1))
        late = await s2.results(1)
        assert late[("late", 1)].outcome == R.HANDED_BACK
        # And the running attempts finish with the devices they had from the start
        gate.touch()
        done = await s2.results(2)
        seen = {key[0]: json.loads(r.result_json)["devices"] for key, r in done.items()}
        assert seen == {"two": "0,1", "one": "2"}
        assert free() == ("0", "1", "2")

    # three slots: the late attempt gets a process at once (devices are picked as an attempt starts)
    scenario(body, slots=3, gpus=("0", "1", "2"), memory_mb=4096, imports=("tests.unit.runner.devices_probe",))


def test_what_a_job_prints_goes_out_live_before_its_result():
    async def body(control: FakeControl, agent: Agent) -> None:
        s = await control.session()
        await s.next("register")
        s.registered()
        # Given a job that prints a line every 0.3 s
        s.assign(job("talk", "chatty", {"lines": 3, "every": 0.3}))
        # Then its output comes in JobOutput messages naming the attempt, all before its result
        outputs: list[pb.JobOutput] = []
        async with asyncio.timeout(10):
            while (message := await s.inbox.get()).WhichOneof("msg") != "results":
                if message.WhichOneof("msg") == "output":
                    outputs.append(message.output)
        assert {(o.attempt.job_id, o.attempt.attempt) for o in outputs} == {("talk", 1)}
        assert outputs[0].offset == 0 and "".join(o.text for o in outputs) == "out 1\nout 2\nout 3\n"
        [result] = message.results.results
        assert (result.attempt.job_id, result.output) == ("talk", "out 1\nout 2\nout 3\n")
        assert agent.connection is not None and agent.connection.output_dropped == 0

    scenario(body)


def test_live_output_is_dropped_and_counted_when_it_cannot_go_out():
    async def body(control: FakeControl, agent: Agent) -> None:
        connection = agent.connection
        assert connection is not None
        s = await control.session()
        await s.next("register")
        # Given no registered session yet, output is dropped (not kept for later)
        connection.printed("j", 1, 0, "early")
        assert connection.output_dropped == 1
        s.registered()
        await until(connection.registered.is_set, what="the session registered")
        # When more output comes than MAX_QUEUED_OUTPUT before the writer can write any (a stalled stream)
        for i in range(MAX_QUEUED_OUTPUT + 6):
            connection.printed("j", 1, i, "x")
        # Then the rest is dropped and counted, and what was queued goes out in order
        assert connection.output_dropped == 1 + 6
        offsets = [(await s.next("output")).offset for _ in range(MAX_QUEUED_OUTPUT)]
        assert offsets == list(range(MAX_QUEUED_OUTPUT))
        # And once written, they no longer count against the bound
        connection.printed("j", 1, 100, "y")
        assert (await s.next("output")).text == "y"
        assert connection.output_dropped == 7

    scenario(body)
