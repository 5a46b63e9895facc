"""The demo's scoreboard, :class:`DemoBoard`: the latest state of every demo job and what to print about them."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from rich import box
from rich.table import Table
from rich.text import Text

from corral.cli import render
from corral.job import Job, JobState

__all__ = ["Check", "DemoBoard"]

Check = Callable[[dict[str, Any] | None], bool]
"""Says whether a job's result is the one expected."""

MAX_ROWS = 60
"""Rows of the results table; the summary line still counts every job."""


class DemoBoard:
    """The latest :class:`Job` of each demo job (in submission order) and the checks of their results."""

    def __init__(self, submitted: Sequence[Job], checks: Sequence[Check | None]) -> None:
        self.jobs: dict[str, Job] = {job.id: job for job in submitted}
        self.checks: dict[str, Check | None] = {job.id: check for job, check in zip(submitted, checks, strict=False)}
        self.started = time.monotonic()
        self.ended: float | None = None

    def update(self, job: Job) -> None:
        """Record a newer view of a job (updates of other jobs are ignored)."""
        if job.id in self.jobs:
            self.jobs[job.id] = job
            if self.ended is None and self.finished() == len(self.jobs):
                self.ended = time.monotonic()

    def finished(self) -> int:
        """How many jobs reached a terminal state."""
        return sum(job.is_terminal for job in self.jobs.values())

    def all_succeeded(self) -> bool:
        """True when every job SUCCEEDED."""
        return all(job.state is JobState.SUCCEEDED for job in self.jobs.values())

    def progress_text(self) -> str:
        """The progress bar's description: how many jobs are in each state (retries shown apart)."""
        counts = Counter(job.state for job in self.jobs.values())
        retrying = sum(1 for job in self.jobs.values() if job.state is JobState.SCHEDULED and job.attempts > 0)
        parts = [
            f"[{render.STATE_STYLES[state]}]{state.name.lower()} {counts[state]}[/]"
            for state in (JobState.PENDING, JobState.RUNNING, JobState.SUCCEEDED, JobState.FAILED)
            if counts[state]
        ]
        if retrying:
            parts.append(f"[magenta]retrying {retrying}[/]")
        return "Jobs: " + (", ".join(parts) or "submitted")

    def results_table(self) -> Table:
        """One row per job: short id, type, state, attempts, worker, queue/exec ms, result summary, check."""
        table = Table(title="Results", box=box.SIMPLE_HEAD, title_justify="left")
        for column in ("id", "type", "state", "attempts", "worker", "queue ms", "exec ms", "result", "ok"):
            table.add_column(column, justify="right" if column.endswith("ms") or column == "attempts" else "left")
        rows = list(self.jobs.values())
        for job in rows[:MAX_ROWS]:
            render.add_row(
                table,
                render.short_id(job.id),
                job.type,
                render.state_text(job.state),
                str(job.attempts),
                render.short_id(job.worker_id, 12) or "-",
                render.millis(job.queue_seconds),
                render.millis(job.exec_seconds),
                _outcome(job),
                self._verdict(job),
            )
        if len(rows) > MAX_ROWS:
            table.caption = f"... and {len(rows) - MAX_ROWS} more"
        return table

    def summary_line(self) -> Text:
        """``N succeeded, ... in S s (T jobs/s)``."""
        counts = Counter(job.state for job in self.jobs.values())
        elapsed = (self.ended or time.monotonic()) - self.started
        retried = sum(1 for job in self.jobs.values() if job.attempts > 1)
        wrong = sum(1 for job in self.jobs.values() if self._verdict(job).plain == "✗")
        line = Text()
        line.append(f"{counts[JobState.SUCCEEDED]} succeeded", style="bold green")
        for state in (JobState.FAILED, JobState.CANCELLED):
            if counts[state]:
                line.append(f", {counts[state]} {state.name.lower()}", style=render.STATE_STYLES[state])
        unfinished = len(self.jobs) - self.finished()
        if unfinished:
            line.append(f", {unfinished} unfinished", style="yellow")
        line.append(f" of {len(self.jobs)} jobs in {elapsed:.1f} s ({len(self.jobs) / max(elapsed, 1e-9):.1f} jobs/s)")
        if retried:
            line.append(f"; {retried} needed a retry")
        if wrong:
            line.append(f"; {wrong} wrong results", style="bold red")
        return line

    def _verdict(self, job: Job) -> Text:
        check = self.checks.get(job.id)
        if job.state is not JobState.SUCCEEDED:
            return Text("-", style="dim")
        if check is None:
            return Text("✓", style="green")
        try:
            good = check(job.result)
        except (KeyError, TypeError, ValueError):  # a result of another shape is a wrong result
            good = False
        return Text("✓", style="green") if good else Text("✗", style="bold red")


def _outcome(job: Job) -> str:
    if job.error is not None and job.state is not JobState.SUCCEEDED:
        return f"{job.error.code}: {job.error.message}"[:60]
    return render.summary(job.result)
