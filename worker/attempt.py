"""An attempt as the worker handles it: what to run (JobSpec) and how it ended (Completion, Outcome).

The pool takes JobSpecs and reports Completions; the connection turns Assignments into JobSpecs
and Completions into JobResults. The fencing token of an attempt is ``(job_id, attempt)``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["Completion", "JobSpec", "Outcome"]


class Outcome(enum.Enum):
    """How an attempt ended; the names are those of ``corral.v1.JobResult.Outcome``."""

    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    TIMEOUT = "TIMEOUT"
    CANCELLED = "CANCELLED"
    HANDED_BACK = "HANDED_BACK"


@dataclass(slots=True)
class JobSpec:
    """One attempt to run."""

    job_id: str
    attempt: int
    type: str
    payload_json: str = "{}"
    """The payload, a JSON object, as text (it is passed through unparsed)."""
    threads: int = 1
    deadline: float | None = None
    """``time.time()`` at which the attempt is killed and reported TIMEOUT; None for no deadline."""
    gpus: int = 0
    """GPU devices the attempt holds; the pool picks which of the worker's free ones."""
    timeout_sec: float = 0.0
    """The job's timeout as the assignment gave it (0: none): what a TIMEOUT message states. ``deadline``
    is reckoned from it when the assignment arrived, so the attempt may run less than this after waiting
    for a runner process."""

    @property
    def key(self) -> tuple[str, int]:
        """The fencing token (job_id, attempt)."""
        return (self.job_id, self.attempt)


@dataclass(frozen=True, slots=True)
class Completion:
    """The end of one attempt."""

    job_id: str
    attempt: int
    outcome: Outcome
    result_json: str = ""
    """The result, a JSON object (SUCCEEDED only)."""
    error_code: str = ""
    error_message: str = ""
    started_at: float = 0.0
    """``time.time()`` when the attempt was handed to its process."""
    finished_at: float = 0.0
    output: str = ""
    """The end of what the job printed (its sys.stdout and sys.stderr), when the worker keeps it."""
