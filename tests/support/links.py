"""A stand-in for a worker's stream on the control plane's side (control.registry.WorkerLink), for
tests of the scheduler and sessions that need a worker but not a process: it records what it is sent."""

from __future__ import annotations

from control.registry import Assignment, AttemptKey


class RecordingLink:
    """Records the assignments and cancels it is sent; the rest of what a link does is taken and dropped."""

    def __init__(self) -> None:
        self.assigned: list[Assignment] = []
        self.cancelled: list[AttemptKey] = []

    def assign(self, assignments: list[Assignment]) -> None:
        self.assigned += assignments

    def cancel(self, job_id: str, attempt: int) -> None:
        self.cancelled.append((job_id, attempt))

    def ack(self, attempts: list[AttemptKey]) -> None: ...
    def drain(self, deadline_sec: float) -> None: ...
    def close(self) -> None: ...
