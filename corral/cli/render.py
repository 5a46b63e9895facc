"""How the CLI shows things: rich tables and coloured states for people, JSON for programs.

Every read command prints either a table built here or, with ``--json``, the value's ``to_dict()``
through :func:`print_json` (one document; :func:`print_json_line` for streams such as ``watch``).
"""

from __future__ import annotations

import errno
import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from rich import box
from rich.console import Console, RenderableType
from rich.table import Table
from rich.text import Text

from corral.account import Account, Identity
from corral.audit import AuditEvent
from corral.cli.exitcode import discard_writes
from corral.cluster import Shares, Stats, WorkerInfo, WorkerState
from corral.job import Job, JobState, Notify

__all__ = [
    "accounts_table",
    "add_row",
    "audit_table",
    "batch_table",
    "console",
    "identity_table",
    "job_line",
    "job_table",
    "jobs_table",
    "memory",
    "millis",
    "needs",
    "print_json",
    "print_json_line",
    "short_id",
    "shown",
    "state_text",
    "stats_table",
    "summary",
    "utc_time",
    "workers_table",
]

STATE_STYLES: dict[JobState, str] = {
    JobState.STATE_UNSPECIFIED: "dim",
    JobState.SCHEDULED: "magenta",
    JobState.PENDING: "blue",
    JobState.RUNNING: "cyan",
    JobState.SUCCEEDED: "green",
    JobState.FAILED: "bold red",
    JobState.CANCELLED: "yellow",
}

WORKER_STYLES: dict[WorkerState, str] = {
    WorkerState.STATE_UNSPECIFIED: "dim",
    WorkerState.AVAILABLE: "green",
    WorkerState.BUSY: "cyan",
    WorkerState.DRAINING: "yellow",
    WorkerState.UNAVAILABLE: "red",
}


class _Console(Console):
    """A rich Console whose reader going away is a ``BrokenPipeError``, as it is for ``print``.

    Rich's own answer to a broken pipe is ``SystemExit(1)``: ``corral list | head -1`` exited 1, a failure
    (under ``set -o pipefail`` a script stopped there), where ``corral list --json | head -1`` exited 0.
    :func:`corral.cli.main.main` turns the error into exit 0 for both."""

    def on_broken_pipe(self) -> None:
        """Print nothing more (a stop's last lines, say), send the stream's later writes (Python's flush at
        exit among them) to the null device, and raise ``BrokenPipeError``."""
        self.quiet = True
        discard_writes(self.file)
        raise BrokenPipeError(errno.EPIPE, "the reader of the output went away")


def console(stderr: bool = False) -> Console:
    """A console on stdout (or stderr); wide and colourless when not a terminal, so pipes get whole lines.
    A reader that goes away (``corral list | head``) raises ``BrokenPipeError``."""
    stream = sys.stderr if stderr else sys.stdout
    tty = stream.isatty()
    return _Console(file=stream, highlight=False, width=None if tty else 200, soft_wrap=not tty)


def print_json(value: Any) -> None:
    """Print ``value`` as one indented JSON document on stdout."""
    print(json.dumps(value, indent=2, ensure_ascii=False, default=str), flush=True)


def print_json_line(value: Any) -> None:
    """Print ``value`` as one compact JSON line on stdout (JSON Lines, for streams)."""
    print(json.dumps(value, ensure_ascii=False, default=str), flush=True)


def state_text(state: JobState) -> Text:
    """The state's name in its colour."""
    return Text(state.name, style=STATE_STYLES.get(state, ""))


def short_id(job_id: str, length: int = 8) -> str:
    """The first characters of an id, enough to tell jobs apart in a table."""
    return job_id[:length]


def add_row(table: Table, *cells: RenderableType) -> None:
    """Add a row whose text cells show as they are: a job's name, error, output or label that holds
    [brackets] is data, never Rich markup (``[/x]`` raised an error and ``[bold]`` restyled the rest, so
    one job could break ``corral list`` for everyone), and its control characters are shown escaped
    (:func:`shown`)."""
    table.add_row(*(Text(shown(cell)) if isinstance(cell, str) else cell for cell in cells))


_CONTROLS = {c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7F, 0xA0)) if chr(c) not in "\n\t"}


def shown(text: str) -> str:
    """``text`` with its control characters (but line breaks and tabs) written as ``\\xNN``. A job's name,
    error or result is anyone's text: an escape sequence in it would reach the terminal of whoever lists
    jobs (Rich drops some control characters, not ESC and CSI), to recolour, retitle or rewrite the screen."""
    return text.translate(_CONTROLS)


def millis(seconds: float) -> str:
    """Seconds as whole milliseconds, or '-' when zero (not measured)."""
    return f"{seconds * 1000:,.0f}" if seconds else "-"


def summary(value: Mapping[str, Any] | None, width: int = 48) -> str:
    """Compact JSON of a result or payload, cut to ``width`` characters."""
    if value is None:
        return "-"
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)
    return text if len(text) <= width else text[: width - 1] + "…"


def job_table(job: Job) -> Table:
    """Every field of one job, one per row."""
    table = Table(box=box.SIMPLE, show_header=False, pad_edge=False)
    table.add_column("field", style="bold")
    table.add_column("value", overflow="fold")
    rows: list[tuple[str, Text | str]] = [
        ("id", job.id),
        ("name", job.name or "-"),
        ("type", job.type),
        ("state", state_text(job.state)),
        ("attempts", attempts_text(job)),
        ("priority", str(job.priority)),
        ("threads", f"{job.thread_demand} asked, {job.threads_granted} granted"),
        *([("needs", needs(job))] if job.gpu_count or job.memory_mb else []),
        ("timeout", f"{job.timeout_sec:g} s" if job.timeout_sec else "-"),
        ("worker", job.worker_id or "-"),
        ("payload", summary(job.payload, 400)),
        ("result", summary(job.result, 400)),
        ("error", f"{job.error.code}: {job.error.message}" if job.error else "-"),
        ("created", _time(job.created_at)),
        ("scheduled", _time(job.scheduled_at)),
        ("ready", _time(job.ready_at)),
        ("started", _time(job.started_at)),
        ("finished", _time(job.finished_at)),
        (
            "queue/exec/total ms",
            f"{millis(job.queue_seconds)} / {millis(job.exec_seconds)} / {millis(job.total_seconds)}",
        ),
        ("owner", job.owner or "-"),
        ("idempotency key", job.idempotency_key or "-"),
        ("labels", ", ".join(f"{k}={v}" for k, v in sorted(job.labels.items())) or "-"),
        ("runs on", ", ".join(f"{k}={v}" for k, v in sorted(job.worker_selector.items())) or "any worker"),
        ("after", _dependencies(job) or "-"),
        *([("start when", job.start_when)] if job.depends_on else []),
        *([("notify", notify_targets(job.notify))] if job.notify else []),
        ("output", _last_lines(job.output, 10) or "-"),
    ]
    for name, value in rows:
        add_row(table, name, value)
    return table


def needs(job: Job) -> str:
    """What a job holds on its worker besides threads: ``2 GPUs, 4096 MiB`` ("" for neither)."""
    parts = []
    if job.gpu_count:
        parts.append(f"{job.gpu_count} GPU" + ("s" if job.gpu_count != 1 else ""))
    if job.memory_mb:
        parts.append(f"{job.memory_mb} MiB")  # as --memory-mb took it, so it can be typed again
    return ", ".join(parts)


def memory(free_mb: int, total_mb: int) -> str:
    """``free/total`` memory in one unit, GiB from 1 GiB of total up (else MiB); '-' when there is none."""
    if not total_mb:
        return "-"
    if total_mb < 1024:
        return f"{free_mb}/{total_mb} MiB"
    return f"{_gib(free_mb)}/{_gib(total_mb)} GiB"


def _held_memory(mb: int) -> str:
    """MiB held, in one unit as :func:`memory` gives them; '-' for none."""
    if not mb:
        return "-"
    return f"{mb} MiB" if mb < 1024 else f"{_gib(mb)} GiB"


def _gib(mb: int) -> str:
    """MiB as GiB with at most one decimal, and none when it is whole (``1.5``, ``64``)."""
    return f"{mb / 1024:.1f}".removesuffix(".0")


def notify_targets(targets: Sequence[Notify]) -> str:
    """Where a job's ends are announced: ``ops@example.com (FAILED), https://hooks.example/x``."""
    return ", ".join(
        (t.email or t.webhook_url) + (f" ({', '.join(s.name for s in t.on)})" if t.on else "") for t in targets
    )


def _dependencies(job: Job) -> str:
    """The jobs ``job`` starts after, those it still waits for marked."""
    waiting = set(job.waiting_on)
    return ", ".join(f"{d} (waiting)" if d in waiting else d for d in job.depends_on)


def _last_lines(text: str, count: int) -> str:
    """The last ``count`` lines of ``text``, saying how many came before (``corral output ID`` has all)."""
    lines = text.rstrip("\n").splitlines()
    if len(lines) <= count:
        return "\n".join(lines)
    return f"[{len(lines) - count} lines before; corral output ID shows them]\n" + "\n".join(lines[-count:])


def jobs_table(jobs: Iterable[Job], title: str | None = None) -> Table:
    """One row per job: the columns ``corral list`` shows (with an owner column when jobs have owners)."""
    jobs = list(jobs)
    owners = any(job.owner for job in jobs)
    table = Table(title=title, box=box.SIMPLE_HEAD)
    columns = ("id", "name", "type", "state", "attempts", "prio", "worker", "created", "total ms")
    for column in columns + (("owner",) if owners else ()):
        table.add_column(column, no_wrap=column in ("id", "state"))
    for job in jobs:
        cells: list[Text | str] = [
            job.id,
            job.name or "-",
            job.type,
            state_text(job.state),
            f"{job.attempts}/{job.max_attempts}",
            str(job.priority),
            job.worker_id or "-",
            _time(job.created_at),
            millis(job.total_seconds),
        ]
        add_row(table, *cells, *([job.owner or "-"] if owners else []))
    return table


def batch_table(jobs: Sequence[Job]) -> Table:
    """``corral submit-many``: one row per job of a batch, by its place in it, with the jobs it starts
    after: those of the batch by place (as ``depends_on_index`` named them), others by short id."""
    place: dict[str, int] = {}
    for index, job in enumerate(jobs):
        place.setdefault(job.id, index)
    table = Table(box=box.SIMPLE_HEAD)
    for column in ("#", "id", "type", "state", "after"):
        table.add_column(column, no_wrap=column != "after", justify="right" if column == "#" else "left")
    for index, job in enumerate(jobs):
        in_batch = [str(place[d]) for d in job.depends_on if d in place]
        others = [short_id(d) for d in job.depends_on if d not in place]
        add_row(table, str(index), job.id, job.type, state_text(job.state), ", ".join(in_batch + others) or "-")
    return table


def queue_table(jobs: Iterable[Job], now: datetime) -> Table:
    """``corral queue``: one row per PENDING job in queue order, with how long it has waited and when it
    should start (as of ``now``)."""
    jobs = list(jobs)
    owners = any(job.owner for job in jobs)
    table = Table(box=box.SIMPLE_HEAD)
    columns = ("#", "id", "name", "type", "prio", "threads", "waited", "starts in")
    for column in columns + (("owner",) if owners else ()):
        table.add_column(column, no_wrap=column in ("#", "id"), justify="right" if column == "#" else "left")
    for job in jobs:
        waited = (now - job.ready_at).total_seconds() if job.ready_at else 0.0
        starts = (job.estimated_start - now).total_seconds() if job.estimated_start else None
        cells = [
            str(job.queue_position),
            job.id,
            job.name or "-",
            job.type,
            str(job.priority),
            str(job.thread_demand),
            duration(waited),
            "unknown" if starts is None else f"~{duration(starts)}",
        ]
        add_row(table, *cells, *([job.owner or "-"] if owners else []))
    return table


def duration(seconds: float) -> str:
    """A span for people: ``0.4s``, ``42s``, ``3m05s``, ``2h07m``, ``3d04h`` (negative spans as 0)."""
    seconds = max(0.0, seconds)
    if seconds < 10:
        return f"{seconds:.1f}s"
    whole = round(seconds)
    if whole < 60:
        return f"{whole}s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours:02d}h"


def attempts_text(job: Job) -> str:
    """``2/3``, and how many of them were not charged when some were not (``3/1, 2 not charged``): a
    count past max_attempts otherwise reads as a broken limit."""
    text = f"{job.attempts}/{job.max_attempts}"
    if uncharged := job.uncharged_attempts:
        text += f", {uncharged} not charged (handed back unfinished, or before a retry)"
    return text


def job_line(job: Job) -> Text:
    """One line about a job's latest change, for ``corral watch``."""
    line = Text(datetime.now().strftime("%H:%M:%S.%f")[:-3] + "  ", style="dim")
    line.append(state_text(job.state))
    line.append(f"  attempt {job.attempts}/{job.max_attempts}")
    if job.worker_id:
        line.append(f"  worker {shown(job.worker_id)}")
    if job.state is JobState.SUCCEEDED:
        line.append(f"  result {shown(summary(job.result, 120))}", style="green")
    if job.error:
        line.append(f"  {shown(job.error.code)}: {shown(job.error.message)}", style="red")
    return line


def stats_table(stats: Stats) -> Table:
    """The control plane's counters, one per row."""
    table = Table(box=box.SIMPLE, show_header=False, pad_edge=False)
    table.add_column("name", style="bold")
    table.add_column("value")
    add_row(table, "queue depth", str(stats.queue_depth))
    add_row(table, "scheduled", str(stats.scheduled))
    add_row(table, "running", str(stats.running))
    add_row(table, "dead letter", str(stats.dead_letter))
    add_row(table, "workers", f"{stats.workers}  {_counts(stats.workers_by_state)}")
    add_row(table, "jobs", _counts(stats.jobs_by_status) or "-")
    finished = stats.jobs_by_status.get("SUCCEEDED", 0) + stats.jobs_by_status.get("FAILED", 0)
    # A rate over no finished job is no rate: "-", as the dashboard shows, not a 0% that reads as all failing.
    add_row(table, "success rate", f"{stats.success_rate:.1%}" if finished else "-")
    add_row(table, "uptime", f"{stats.uptime_seconds:,.0f} s")
    for r in stats.exec_rate_limits:
        add_row(table, f"rate limit {r.limit}", f"{r.per_second:g}/s, burst {r.burst}: {r.waiting} waiting")
    return table


def workers_table(workers: Iterable[WorkerInfo]) -> Table:
    """One row per worker."""
    table = Table(box=box.SIMPLE_HEAD)
    columns = (
        "id",
        "state",
        "threads free/total",
        "slots free/total",
        "GPUs free/total",
        "memory free/total",
        "running",
        "done",
        "failed",
        "host",
        "pid",
    )
    for column in columns:
        table.add_column(column, no_wrap=column in ("id", "memory free/total"))
    for w in workers:
        add_row(
            table,
            w.id,
            Text(w.state.name, style=WORKER_STYLES.get(w.state, "")),
            f"{w.free_threads}/{w.threads}",
            f"{w.free_slots}/{w.slots}",
            f"{w.free_gpus}/{w.gpus}" if w.gpus else "-",
            memory(w.free_memory_mb, w.memory_mb),
            str(len(w.running_jobs)),
            str(w.jobs_completed),
            str(w.jobs_failed),
            w.hostname or "-",
            str(w.pid or "-"),
        )
    return table


NO_TOKEN = "(no token)"
"""How the owner ``""`` is shown: jobs sent to a control plane that asks for no token."""


def shares_table(shares: Shares) -> Table:
    """One row per share, lowest fair-share rank first; the title says whether fair share is on."""
    if shares.fair_share:
        title = "fair share on" + (f", half-life {shares.half_life_sec:,g} s" if shares.half_life_sec else "")
    else:
        title = "fair share off (CORRAL_FAIR_SHARE): rank shown, not used"
    # With no worker connected there is no whole to take a part of: the parts would be thread counts.
    connected = bool(shares.connected_threads)
    title += f"; {_connected(shares)}" if connected else "; no worker connected: dominant shares not known"
    table = Table(box=box.SIMPLE_HEAD, title=title, title_justify="left")
    columns = ("share", "owners", "weight", "running", "queued", "threads", "GPUs", "memory", "dominant", "lately",
               "rank", "thread-h", "GPU-h")  # fmt: skip
    for column in columns:
        table.add_column(
            column, no_wrap=column == "share", justify="left" if column in ("share", "owners") else "right"
        )
    for row in shares.shares:
        add_row(
            table,
            row.name or NO_TOKEN,
            ", ".join(o or NO_TOKEN for o in row.owners) or "-",
            f"{row.weight:g}",
            str(row.running_jobs),
            str(row.queued_jobs),
            str(row.threads),
            str(row.gpus) if row.gpus else "-",
            _held_memory(row.memory_mb),
            f"{row.dominant_share:.1%}" if connected else "-",
            f"{row.recent_share:.1%}" if shares.half_life_sec and connected else "-",
            f"{row.rank:.3f}",
            f"{row.thread_seconds / 3600:,.2f}",
            f"{row.gpu_seconds / 3600:,.2f}" if row.gpu_seconds else "-",
        )
    return table


def _connected(shares: Shares) -> str:
    """What the connected workers give jobs, e.g. ``16 threads, 1 GPU, 32 GiB connected``."""
    parts = [f"{shares.connected_threads} thread" + ("s" if shares.connected_threads != 1 else "")]
    if shares.connected_gpus:
        parts.append(f"{shares.connected_gpus} GPU" + ("s" if shares.connected_gpus != 1 else ""))
    if shares.connected_memory_mb:
        parts.append(_held_memory(shares.connected_memory_mb))
    return ", ".join(parts) + " connected"


def accounts_table(accounts: Iterable[Account]) -> Table:
    """One row per account: the columns ``corral accounts`` shows."""
    table = Table(box=box.SIMPLE_HEAD)
    for column in ("name", "group", "admin", "created", "password changed"):
        table.add_column(column, no_wrap=column == "name")
    for account in accounts:
        add_row(
            table,
            account.name,
            account.group or "-",
            Text("yes", style="bold") if account.admin else "no",
            _time(account.created_at),
            _time(account.password_changed_at),
        )
    return table


def identity_table(identity: Identity, now: datetime) -> Table:
    """Who the control plane takes the caller for (``corral whoami``), one field per row; how long the
    login has left is counted from ``now``."""
    table = Table(box=box.SIMPLE, show_header=False, pad_edge=False)
    table.add_column("field", style="bold")
    table.add_column("value")
    if identity.account is not None:
        group = f", group {identity.account.group}" if identity.account.group else ""
        account = f"yes{group}"
    else:
        account = "no (a configured token)" if identity.name else "no (client auth is off)"
    if identity.expires_at is None:
        expires = "never" if identity.name else "-"
    else:
        left = (identity.expires_at - now).total_seconds()
        expires = f"{utc_time(identity.expires_at)} ({f'in {duration(left)}' if left > 0 else 'expired'})"
    add_row(table, "name", identity.name or "-")
    add_row(table, "admin", "yes" if identity.admin else "no")
    add_row(table, "account", account)
    add_row(table, "expires", expires)
    return table


def utc_time(value: datetime) -> str:
    """An aware time in UTC, to the second, saying so: ``2026-11-27 11:02:03 UTC`` (what a login lasts until)."""
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _time(value: datetime | None) -> str:
    if not value:
        return "-"
    try:
        return _clock(value.astimezone())
    except (OverflowError, OSError):  # 0001-01-01 UTC is in year 0 west of Greenwich, which no datetime holds
        return f"{_clock(value.astimezone(UTC))} UTC"


def _clock(value: datetime) -> str:
    # isoformat, not strftime: glibc's %Y writes the year 1 as "1", not "0001"
    return value.replace(tzinfo=None).isoformat(sep=" ", timespec="seconds")


def _counts(counts: Mapping[str, int]) -> str:
    return "  ".join(f"{name.lower()} {count}" for name, count in sorted(counts.items()) if count)


def audit_table(events: Iterable[AuditEvent]) -> Table:
    """One row per audit event, newest first; a refusal's outcome in red."""
    table = Table(box=box.SIMPLE_HEAD)
    for column in ("time", "actor", "action", "target", "outcome", "request id"):
        table.add_column(column, no_wrap=column in ("time", "action", "outcome"))
    for e in events:
        outcome = Text(e.outcome, style="green" if e.outcome == "OK" else "red")
        add_row(table, _time(e.time), e.actor or "-", e.action, e.target or "-", outcome, e.request_id or "-")
    return table
