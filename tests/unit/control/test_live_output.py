"""Live output on the control plane: only the worker holding an attempt's lease adds to it, a watch
sees each character once and in order (the backlog first, the stored end last), and the backlog is
bounded and gone once the job stops running.

On a real Scheduler and SQLite store; the worker is a stand-in link (the stream itself is tested in
tests/integration/test_live_output.py with real workers)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from control.admission import Submission
from control.clock import FakeClock
from control.config import ControlConfig
from control.feeds import PENDING_CHARS, PENDING_PIECES
from control.live_output import BACKLOG_CHARS, MAX_CHUNK_CHARS, LiveOutput
from control.scheduler import Scheduler
from control.sessions import Hello, Outcome, Report, WorkerSessions
from control.store import SQLiteStore
from corral.errors import NotFound, Unavailable
from corral.printed import OutputChunk, cut_note
from tests.support.links import RecordingLink
from tests.support.waiting import until


async def _turns(n: int = 20) -> None:
    for _ in range(n):  # loop turns, not time: dispatch and commits run on the next ones
        await asyncio.sleep(0)


def test_the_backlog_keeps_the_end_of_contiguous_pieces_and_starts_again_after_a_gap() -> None:
    live = LiveOutput()
    live.add("j", 1, 0, "a" * 5000)
    live.add("j", 1, 5000, "b" * 5000)
    kept = live.backlog("j")
    assert kept is not None and (kept.offset, len(kept.text)) == (10_000 - BACKLOG_CHARS, BACKLOG_CHARS)
    assert kept.text.endswith("b" * 5000)
    live.add("j", 1, 20_000, "c")  # text left out before it: the backlog starts here
    assert live.backlog("j") == OutputChunk(1, 20_000, "c")
    live.add("j", 2, 0, "d")  # another attempt
    assert live.backlog("j") == OutputChunk(2, 0, "d")
    # a piece longer than any worker sends keeps its end, at its place
    heard: list[OutputChunk] = []
    live.listen("k", heard.append)
    live.add("k", 1, 7, "x" * (MAX_CHUNK_CHARS + 10))
    assert (heard[0].offset, len(heard[0].text)) == (17, MAX_CHUNK_CHARS)
    live.stopped("j")
    live.stopped("k")
    assert live.backlog("j") is None and len(live) == 0


def test_only_the_lease_holder_adds_and_a_watch_sees_each_character_once(tmp_path: Path) -> None:
    async def main() -> None:
        store = SQLiteStore(str(tmp_path / "c.db"))
        scheduler = Scheduler(store, ControlConfig.from_env({}), FakeClock())
        sessions, link, other = WorkerSessions(scheduler), RecordingLink(), RecordingLink()
        try:
            # Given a job running on w1 (w2 is connected too)
            sessions.register(Hello("w1", threads=1, slots=1), link)
            (job,) = await scheduler.intake.submit([Submission("noop", {}, payload_json="{}")])
            await _turns()
            (a,) = link.assigned
            sessions.register(Hello("w2", threads=1, slots=1), other)
            sessions.printed("w1", job.id, a.attempt, 0, "one\n")

            # When a watch starts, it gets what was printed so far
            seen: list[OutputChunk] = []

            async def watch() -> None:
                async for chunk in scheduler.feeds.watch_output(job.id):
                    seen.append(chunk)

            watching = asyncio.ensure_future(watch())
            await until(lambda: len(seen) == 1, 5, "the backlog")
            # and each piece from w1 for its attempt, but nothing from another worker or attempt
            sessions.printed("w2", job.id, a.attempt, 4, "not w2's job\n")
            sessions.printed("w1", job.id, a.attempt + 1, 0, "a later attempt\n")
            sessions.printed("w1", job.id, a.attempt, 4, "two\n")
            await until(lambda: len(seen) == 2, 5, "the second piece")
            # Then when the attempt ends, its stored end adds only what the watch has not seen
            stored = cut_note(2) + "e\ntwo\nthree\n"
            report = Report(job.id, a.attempt, Outcome.SUCCEEDED, "{}", output=stored)
            sessions.results("w1", [report], link)
            await asyncio.wait_for(watching, 5)
            assert [(c.attempt, c.offset, c.text) for c in seen] == [
                (1, 0, "one\n"),
                (1, 4, "two\n"),
                (1, 8, "three\n"),
            ]
            assert scheduler.live_output.backlog(job.id) is None  # gone with the attempt
            # And a watch of the ended job gets the stored output at its place, then ends
            after = [c async for c in scheduler.feeds.watch_output(job.id)]
            assert after == [OutputChunk(1, 2, "e\ntwo\nthree\n")]
            with pytest.raises(NotFound):
                async for _ in scheduler.feeds.watch_output("nope"):
                    pass
        finally:
            store.close()

    asyncio.run(main())


def test_a_watch_is_answered_at_once_and_ends_unavailable_when_the_control_plane_stops(tmp_path: Path) -> None:
    async def main() -> None:
        store = SQLiteStore(str(tmp_path / "c.db"))
        scheduler = Scheduler(store, ControlConfig.from_env({}), FakeClock())
        try:
            (job,) = await scheduler.intake.submit([Submission("noop", {}, payload_json="{}")])  # no worker: PENDING
            seen: list[OutputChunk] = []

            async def watch() -> None:
                async for chunk in scheduler.feeds.watch_output(job.id):
                    seen.append(chunk)

            watching = asyncio.ensure_future(watch())
            await _turns()
            # the first message comes at once, empty (nothing printed yet): the caller knows it was heard
            assert seen == [OutputChunk(0, 0, "")]
            scheduler.watchers.close()
            with pytest.raises(Unavailable):
                await asyncio.wait_for(watching, 5)
        finally:
            store.close()

    asyncio.run(main())


def test_a_watch_that_stops_reading_holds_only_the_end_of_what_the_job_prints(tmp_path: Path) -> None:
    async def main() -> None:
        store = SQLiteStore(str(tmp_path / "c.db"))
        scheduler = Scheduler(store, ControlConfig.from_env({}), FakeClock())
        sessions, link = WorkerSessions(scheduler), RecordingLink()
        try:
            # Given a running job and a watch that read the first piece, then stopped reading
            sessions.register(Hello("w1", threads=1, slots=1), link)
            (job,) = await scheduler.intake.submit([Submission("noop", {}, payload_json="{}")])
            await _turns()
            (a,) = link.assigned
            sessions.printed("w1", job.id, a.attempt, 0, "start\n")
            feed = scheduler.feeds.watch_output(job.id)
            assert await anext(feed) == OutputChunk(1, 0, "start\n")
            # When the job prints 40 MiB on, in pieces, and then pieces with text left out between them
            piece, offset = "x" * 16 * 1024, 6
            for _ in range(2560):
                sessions.printed("w1", job.id, a.attempt, offset, piece)
                offset += len(piece)
            contiguous_end = offset
            for i in range(3 * PENDING_PIECES):
                sessions.printed("w1", job.id, a.attempt, offset + 1, str(i % 10))
                offset += 2
            # Then once it reads again, it gets the latest pieces only, the rest as jumps in offset
            got: list[OutputChunk] = []
            while not got or got[-1].end < offset:
                got.append(await anext(feed))
            assert len(got) <= PENDING_PIECES and sum(len(c.text) for c in got) <= PENDING_CHARS
            assert got[-1] == OutputChunk(1, offset - 1, str((3 * PENDING_PIECES - 1) % 10))
            assert got[0].offset >= contiguous_end  # none of the 40 MiB was still held
            # and the feed goes on to the job's end as before
            sessions.results("w1", [Report(job.id, a.attempt, Outcome.SUCCEEDED, "{}")], link)
            assert [c async for c in feed] == []
        finally:
            store.close()

    asyncio.run(main())
