"""Which live jobs a call is about: the filters ListJobs-like calls share, tested in memory."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from control.jobs import JobRecord, JobState

__all__ = ["JobSelection"]


@dataclass(frozen=True)
class JobSelection:
    """Jobs of ``job_type`` (any when empty), of one of ``owners`` (any when empty), in one of
    ``states`` (any when empty), whose labels include every pair of ``labels``."""

    job_type: str = ""
    owners: Collection[str] = ()
    states: Collection[JobState] = ()
    labels: Mapping[str, str] = field(default_factory=dict)

    @property
    def narrows(self) -> bool:
        """Whether anything is left out (else every job matches)."""
        return bool(self.job_type or self.owners or self.states or self.labels)

    def matches(self, job: JobRecord) -> bool:
        """Whether ``job`` is selected."""
        return (
            (not self.job_type or job.type == self.job_type)
            and (not self.owners or job.owner in self.owners)
            and (not self.states or job.state in self.states)
            and all(job.labels.get(k) == v for k, v in self.labels.items())
        )
