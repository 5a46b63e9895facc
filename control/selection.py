"""Which live jobs a call is about: the filters ListJobs-like calls share, tested in memory."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from control.jobs import JobRecord, JobState

__all__ = ["JobSelection"]


@dataclass(frozen=True)
class JobSelection:
    """Jobs of ``job_type`` (any when empty), of one of ``owners`` (any when empty), in one of
    ``states`` (any when empty), whose labels include every pair of ``labels``, whose latest attempt
    ended with ``error_code`` (any when empty)."""

    job_type: str = ""
    owners: Collection[str] = ()
    states: Collection[JobState] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    error_code: str = ""

    @property
    def narrows(self) -> bool:
        """Whether anything is left out (else every job matches)."""
        return bool(self.job_type or self.owners or self.states or self.labels or self.error_code)

    def matches(self, job: JobRecord) -> bool:
        """Whether ``job`` is selected."""
        return (
            (not self.job_type or job.type == self.job_type)
            and (not self.owners or job.owner in self.owners)
            and (not self.states or job.state in self.states)
            and (not self.error_code or job.error_code == self.error_code)
            and all(job.labels.get(k) == v for k, v in self.labels.items())
        )
