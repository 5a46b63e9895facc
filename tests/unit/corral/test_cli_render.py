"""What `corral get` and `corral workers` print: the GPUs and memory a job holds, and those of each worker;
what `corral stats`, `corral whoami` and `corral accounts` print."""

from __future__ import annotations

import io
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone

import pytest
from google.protobuf import timestamp_pb2
from rich.console import Console, RenderableType

from corral.account import Account, Identity
from corral.cli import commands, render
from corral.cluster import Stats, WorkerInfo
from corral.job import Job
from corral.v1 import admin_pb2, jobs_pb2


def text_of(renderable: RenderableType) -> str:
    """The renderable as plain text, as a pipe would get it (wide, no colour)."""
    out = io.StringIO()
    Console(file=out, width=200, color_system=None, highlight=False).print(renderable)
    return out.getvalue()


def rows_of(renderable: RenderableType) -> dict[str, str]:
    """A two-column table's rows as field -> value."""
    rows: dict[str, str] = {}
    for line in text_of(renderable).splitlines():
        name, _, value = line.strip().partition("  ")
        if name:
            rows[name] = value.strip()
    return rows


def test_get_shows_what_a_job_needs_next_to_its_threads() -> None:
    # Given a job that holds GPUs and memory
    job = Job.from_proto(
        jobs_pb2.Job(id="j1", type="train", state=jobs_pb2.Job.RUNNING, thread_demand=2, gpu_count=2, memory_mb=4096)
    )
    # When `corral get` shows it
    text = text_of(render.job_table(job))
    # Then one line says so, right after the threads
    assert rows_of(render.job_table(job))["needs"] == "2 GPUs, 4096 MiB"
    lines = [line.split()[0] for line in text.splitlines() if line.strip()]
    assert lines[lines.index("threads") + 1] == "needs"


@pytest.mark.parametrize(
    ("gpus", "memory", "needs"),
    [(1, 0, "1 GPU"), (0, 512, "512 MiB"), (64, 1 << 30, "64 GPUs, 1073741824 MiB")],
)
def test_get_shows_only_what_a_job_holds(gpus: int, memory: int, needs: str) -> None:
    job = Job.from_proto(jobs_pb2.Job(id="j1", type="train", gpu_count=gpus, memory_mb=memory))
    assert rows_of(render.job_table(job))["needs"] == needs


def test_get_has_no_needs_line_for_a_job_without_gpus_or_memory() -> None:
    job = Job.from_proto(jobs_pb2.Job(id="j1", type="noop", state=jobs_pb2.Job.SUCCEEDED, thread_demand=1))
    rows = rows_of(render.job_table(job))
    assert "needs" not in rows and "threads" in rows and "runs on" in rows
    assert render.needs(job) == ""


def test_workers_shows_gpus_and_memory_free_of_total_and_a_dash_without() -> None:
    # Given a worker with GPUs and memory (some held by its jobs) and one with neither
    workers = [
        WorkerInfo.from_proto(
            admin_pb2.Worker(
                id="gpu-box",
                state=admin_pb2.Worker.BUSY,
                threads=8,
                free_threads=6,
                slots=8,
                free_slots=7,
                gpus=4,
                free_gpus=1,
                memory_mb=65536,
                free_memory_mb=12800,
            )
        ),
        WorkerInfo.from_proto(
            admin_pb2.Worker(id="cpu-box", state=admin_pb2.Worker.AVAILABLE, threads=4, free_threads=4)
        ),
    ]
    # When `corral workers` shows them
    lines = text_of(render.workers_table(workers)).splitlines()
    header = next(line for line in lines if line.lstrip().startswith("id"))
    gpu_box = next(line for line in lines if "gpu-box" in line)
    cpu_box = next(line for line in lines if "cpu-box" in line)
    # Then there is a GPUs and a memory column, free/total, and "-" where a worker has none
    assert "GPUs free/total" in header and "memory free/total" in header
    assert gpu_box.split()[2:6] == ["6/8", "7/8", "1/4", "12.5/64"]
    assert "12.5/64 GiB" in gpu_box
    assert cpu_box.split()[2:6] == ["4/4", "0/0", "-", "-"]


@pytest.mark.parametrize(
    ("free", "total", "text"),
    [
        (0, 0, "-"),
        (256, 512, "256/512 MiB"),
        (1023, 1023, "1023/1023 MiB"),
        (1024, 1024, "1/1 GiB"),
        (1536, 4096, "1.5/4 GiB"),
        (0, 1 << 30, "0/1048576 GiB"),
    ],
)
def test_memory_is_in_one_unit_for_free_and_total(free: int, total: int, text: str) -> None:
    assert render.memory(free, total) == text


NOW = datetime(2026, 11, 27, 10, 0, 0, tzinfo=UTC)
ALICE = Account("alice", "ml", False, datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC), None)


def test_whoami_after_a_login_shows_the_account_and_how_long_the_login_has_left() -> None:
    identity = Identity("alice", False, ALICE, NOW + timedelta(hours=1, minutes=2, seconds=3))
    assert rows_of(render.identity_table(identity, NOW)) == {
        "name": "alice",
        "admin": "no",
        "account": "yes, group ml",
        "expires": "2026-11-27 11:02:03 UTC (in 1h02m)",
    }


@pytest.mark.parametrize(
    ("identity", "account", "expires"),
    [
        (Identity("ci", True, None, None), "no (a configured token)", "never"),
        (Identity("", False, None, None), "no (client auth is off)", "-"),
        (
            Identity("bob", False, Account("bob"), NOW - timedelta(seconds=1)),
            "yes",
            "2026-11-27 09:59:59 UTC (expired)",
        ),
    ],
)
def test_whoami_says_what_kind_of_caller_it_is(identity: Identity, account: str, expires: str) -> None:
    rows = rows_of(render.identity_table(identity, NOW))
    assert (rows["account"], rows["expires"]) == (account, expires)
    assert rows["name"] == (identity.name or "-")
    assert rows["admin"] == ("yes" if identity.admin else "no")


def test_accounts_shows_one_row_per_account_with_a_dash_for_what_is_unset() -> None:
    accounts = [ALICE, Account("root", "", True, None, datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC))]
    lines = text_of(render.accounts_table(accounts)).splitlines()
    header = next(line for line in lines if line.lstrip().startswith("name"))
    alice = next(line for line in lines if "alice" in line).split()
    root = next(line for line in lines if "root" in line).split()
    assert header.split() == ["name", "group", "admin", "created", "password", "changed"]
    assert alice[:3] == ["alice", "ml", "no"] and alice[-1] == "-"
    assert root[:3] == ["root", "-", "yes"] and root[3] == "-"
    assert len(alice) == 6 and len(root) == 6  # a date and a time, or a dash, in each time column


@pytest.mark.parametrize(
    ("name", "seconds", "shown"),
    [
        # Local times the datetime type cannot hold (years 0 and 10000): an OverflowError traceback before
        ("America/New_York", -62_135_596_800, "0001-01-01 00:00:00 UTC"),
        ("Asia/Tokyo", 253_402_300_799, "9999-12-31 23:59:59 UTC"),
        # Those it can are local, with the year in four digits
        ("America/New_York", 253_402_300_799, "9999-12-31 18:59:59"),
        ("UTC", -62_135_596_800, "0001-01-01 00:00:00"),
    ],
)
def test_times_a_zone_cannot_hold_are_shown_in_utc(
    zone: Callable[[str], None], name: str, seconds: int, shown: str
) -> None:
    zone(name)
    job = Job.from_proto(jobs_pb2.Job(id="j1", type="noop", scheduled_at=timestamp_pb2.Timestamp(seconds=seconds)))
    assert rows_of(render.job_table(job))["scheduled"] == shown


def test_utc_time_is_in_utc_to_the_second_whatever_the_zone_given() -> None:
    plus_two = datetime(2026, 11, 27, 13, 2, 3, 999999, tzinfo=timezone(timedelta(hours=2)))
    assert render.utc_time(plus_two) == "2026-11-27 11:02:03 UTC"
    assert render.utc_time(datetime(2026, 11, 27, 11, 2, 3, tzinfo=UTC)) == "2026-11-27 11:02:03 UTC"


@pytest.mark.parametrize(
    ("by_status", "rate", "shown"),
    [
        ({}, 0.0, "-"),
        ({"PENDING": 3, "RUNNING": 1, "CANCELLED": 2}, 0.0, "-"),
        ({"SUCCEEDED": 3, "FAILED": 1}, 0.75, "75.0%"),
        ({"FAILED": 2}, 0.0, "0.0%"),
    ],
)
def test_stats_shows_a_success_rate_only_once_a_job_has_succeeded_or_failed(
    by_status: dict[str, int], rate: float, shown: str
) -> None:
    # Given the control plane's counters, with or without finished jobs (GetStats says 0 for none)
    stats = Stats(queue_depth=0, scheduled=0, running=0, workers=1, jobs_by_status=by_status, success_rate=rate)
    # Then `corral stats` shows a rate only over jobs that ended SUCCEEDED or FAILED: 0.0% means all failed
    assert rows_of(render.stats_table(stats))["success rate"] == shown


@pytest.mark.parametrize(
    ("count", "total", "offset", "footer"),
    [
        (0, 0, 0, "no jobs"),
        (0, 0, 40, "no jobs"),
        (0, 5, 40, "none of 5 jobs"),
        (5, 5, 0, "1-5 of 5 jobs"),
        (50, 120, 0, "1-50 of 120 jobs; next page: --offset 50"),
    ],
)
def test_a_page_s_footer_says_which_rows_it_shows_of_how_many(count: int, total: int, offset: int, footer: str) -> None:
    # `corral list` and `corral queue` end each page with it; nothing matched at all is "no jobs", not "none of 0"
    assert text_of(commands._page_footer(count, total, offset, "jobs")).strip() == footer


def test_text_from_jobs_shows_as_it_is_never_as_markup() -> None:
    """A job's name, error, output or labels went through Rich markup: ``[/x]`` made `corral list` and
    `corral get` fail with a traceback for everyone, and ``[bold]`` restyled the rest of the cell."""
    job = Job.from_proto(
        jobs_pb2.Job(
            id="j1",
            name="[/x] weird",
            type="failing",
            state=jobs_pb2.Job.FAILED,
            error=jobs_pb2.JobError(code="ERROR", message="bad [/x] thing [bold]"),
            labels={"team": "[red]ops"},
            output="[/] printed",
            owner="[b]alice",
        )
    )
    listed = text_of(render.jobs_table([job]))
    assert "[/x] weird" in listed and "[b]alice" in listed
    shown = rows_of(render.job_table(job))
    assert shown["name"] == "[/x] weird"
    assert shown["error"] == "ERROR: bad [/x] thing [bold]"
    assert shown["labels"] == "team=[red]ops"
    assert shown["output"] == "[/] printed"


def test_control_characters_from_jobs_reach_no_terminal() -> None:
    """Rich drops some control characters, not ESC and CSI: a job named with an escape sequence could
    recolour, retitle or rewrite the terminal of whoever listed, got or watched jobs."""
    job = Job.from_proto(
        jobs_pb2.Job(
            id="j1",
            name="\x1b]0;owned\x07\x1b[2Jname",
            type="failing",
            state=jobs_pb2.Job.FAILED,
            worker_id="w\x9b31m1",
            error=jobs_pb2.JobError(code="ERROR", message="two\nlines\tand \x1b[31mred"),
        )
    )
    out = io.StringIO()
    terminal = Console(file=out, width=200, force_terminal=True, color_system="standard", highlight=False)
    for renderable in (render.jobs_table([job]), render.job_table(job), render.job_line(job)):
        terminal.print(renderable)
    printed = out.getvalue()
    # Then none of the job's own control characters is printed (Rich's colours are its own ESC [ ... m)
    assert "\x07" not in printed and "\x9b" not in printed and "\x1b]" not in printed and "\x1b[2J" not in printed
    assert "\x1b[31mred" not in printed
    # and each is shown escaped, where a person can see it; line breaks and tabs stay
    assert "\\x1b]0;owned\\x07\\x1b[2Jname" in text_of(render.jobs_table([job]))
    assert "w\\x9b31m1" in text_of(render.job_line(job))
    got = text_of(render.job_table(job)).splitlines()
    at = next(i for i, line in enumerate(got) if "ERROR: two" in line)
    assert got[at + 1].strip().startswith("lines") and "\\x1b[31mred" in got[at + 1]
