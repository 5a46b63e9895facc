"""The cluster as the client sees it: :class:`Stats`, :class:`WorkerInfo` (+ :class:`WorkerState`) and
:class:`AutoscalerStatus`, each a frozen value built from its ``corral.v1`` message by ``from_proto``.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from corral.job import timestamp_to_datetime
from corral.v1 import admin_pb2, jobs_pb2

__all__ = ["AutoscalerStatus", "ExecRateLimit", "ShareInfo", "Shares", "Stats", "WorkerInfo", "WorkerState"]


class WorkerState(enum.IntEnum):
    """A worker's state; values and names match ``corral.v1.Worker.State``."""

    STATE_UNSPECIFIED = 0
    AVAILABLE = 1
    """Connected with free capacity."""
    BUSY = 2
    """Connected, every slot in use."""
    DRAINING = 3
    """Finishing its jobs, takes nothing new."""
    UNAVAILABLE = 4
    """Stream closed or heartbeats missed."""

    @classmethod
    def of(cls, number: int) -> WorkerState:
        """The state with this wire value; STATE_UNSPECIFIED for a value this client does not know."""
        try:
            return cls(number)
        except ValueError:
            return cls.STATE_UNSPECIFIED


@dataclass(frozen=True)
class ExecRateLimit:
    """One execution rate limit (CORRAL_EXEC_RATE_LIMITS) and the jobs it holds back now."""

    limit: str
    """What it limits: ``type:NAME`` (a job type) or ``key:NAME`` (jobs labelled ``rate_key=NAME``)."""
    per_second: float
    """Starts allowed per second."""
    burst: int
    """Starts allowed at once after a quiet spell."""
    waiting: int
    """Jobs waiting in the queue for this limit now (PENDING, no attempt spent)."""


@dataclass(frozen=True)
class Stats:
    """A snapshot of the control plane (``GetStats``)."""

    queue_depth: int
    """Jobs ready to run (PENDING)."""
    scheduled: int
    """Jobs waiting for their time (SCHEDULED)."""
    running: int
    workers: int
    """Registered workers."""
    workers_by_state: dict[str, int] = field(default_factory=dict)
    jobs_by_status: dict[str, int] = field(default_factory=dict)
    success_rate: float = 0.0
    """SUCCEEDED / (SUCCEEDED + FAILED); 0 when nothing finished."""
    uptime_seconds: float = 0.0
    dead_letter: int = 0
    """FAILED jobs."""
    exec_rate_limits: list[ExecRateLimit] = field(default_factory=list)
    """The execution rate limits and the jobs each holds back now (empty when none is set)."""

    @classmethod
    def from_proto(cls, pb: jobs_pb2.Stats) -> Stats:
        """Build :class:`Stats` from a ``corral.v1.Stats`` message."""
        return cls(
            queue_depth=pb.queue_depth,
            scheduled=pb.scheduled,
            running=pb.running,
            workers=pb.workers,
            workers_by_state=dict(pb.workers_by_state),
            jobs_by_status=dict(pb.jobs_by_status),
            success_rate=pb.success_rate,
            uptime_seconds=pb.uptime_seconds,
            dead_letter=pb.dead_letter,
            exec_rate_limits=[
                ExecRateLimit(limit=r.limit, per_second=r.per_second, burst=r.burst, waiting=r.waiting)
                for r in pb.exec_rate_limits
            ],
        )

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict."""
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class WorkerInfo:
    """One registered worker (``ListWorkers``, ``DrainWorker``)."""

    id: str
    state: WorkerState
    threads: int = 0
    slots: int = 0
    free_threads: int = 0
    free_slots: int = 0
    running_jobs: list[str] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)
    hostname: str = ""
    pid: int = 0
    registered_at: datetime | None = None
    last_heartbeat_at: datetime | None = None
    jobs_completed: int = 0
    jobs_failed: int = 0
    gpus: int = 0
    """GPUs it gives to jobs (CORRAL_WORKER_GPUS; 0: none)."""
    free_gpus: int = 0
    """Those of ``gpus`` its running jobs do not hold."""
    memory_mb: int = 0
    """Memory it gives to jobs, in MiB (CORRAL_WORKER_MEMORY_MB; 0: none)."""
    free_memory_mb: int = 0
    """Of ``memory_mb``, what its running jobs do not hold."""

    @classmethod
    def from_proto(cls, pb: admin_pb2.Worker) -> WorkerInfo:
        """Build :class:`WorkerInfo` from a ``corral.v1.Worker`` message."""
        return cls(
            id=pb.id,
            state=WorkerState.of(pb.state),
            threads=pb.threads,
            slots=pb.slots,
            free_threads=pb.free_threads,
            free_slots=pb.free_slots,
            running_jobs=list(pb.running_jobs),
            labels=dict(pb.labels),
            hostname=pb.hostname,
            pid=pb.pid,
            registered_at=timestamp_to_datetime(pb.registered_at) if pb.HasField("registered_at") else None,
            last_heartbeat_at=(
                timestamp_to_datetime(pb.last_heartbeat_at) if pb.HasField("last_heartbeat_at") else None
            ),
            jobs_completed=pb.jobs_completed,
            jobs_failed=pb.jobs_failed,
            gpus=pb.gpus,
            free_gpus=pb.free_gpus,
            memory_mb=pb.memory_mb,
            free_memory_mb=pb.free_memory_mb,
        )

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict: the state by name, datetimes in ISO 8601."""
        out = dataclasses.asdict(self)
        out["state"] = self.state.name
        for key in ("registered_at", "last_heartbeat_at"):
            value = getattr(self, key)
            out[key] = value.isoformat() if value else None
        return out


@dataclass(frozen=True)
class AutoscalerStatus:
    """What the autoscaler is doing (``GetAutoscaler``); ``mode`` is off, recommend or docker."""

    mode: str
    current_workers: int = 0
    desired_workers: int = 0
    min_workers: int = 0
    max_workers: int = 0
    last_decision: str = ""
    last_decision_at: datetime | None = None
    last_error: str = ""
    last_error_at: datetime | None = None
    last_action: str = ""
    last_action_step: int = 0
    last_action_reason: str = ""
    last_action_at: datetime | None = None
    ready_jobs: int = 0
    ready_threads: int = 0
    oldest_ready_age_sec: float = 0.0
    free_threads: int = 0
    starting_workers: int = 0
    draining_workers: int = 0
    scale_ups: int = 0
    scale_downs: int = 0
    cooldown_remaining_sec: float = 0.0

    @classmethod
    def from_proto(cls, pb: admin_pb2.AutoscalerStatus) -> AutoscalerStatus:
        """Build :class:`AutoscalerStatus` from a ``corral.v1.AutoscalerStatus`` message."""
        return cls(
            mode=pb.mode,
            current_workers=pb.current_workers,
            desired_workers=pb.desired_workers,
            min_workers=pb.min_workers,
            max_workers=pb.max_workers,
            last_decision=pb.last_decision,
            last_decision_at=timestamp_to_datetime(pb.last_decision_at) if pb.HasField("last_decision_at") else None,
            last_error=pb.last_error,
            last_error_at=timestamp_to_datetime(pb.last_error_at) if pb.HasField("last_error_at") else None,
            last_action=pb.last_action,
            last_action_step=pb.last_action_step,
            last_action_reason=pb.last_action_reason,
            last_action_at=timestamp_to_datetime(pb.last_action_at) if pb.HasField("last_action_at") else None,
            ready_jobs=pb.ready_jobs,
            ready_threads=pb.ready_threads,
            oldest_ready_age_sec=pb.oldest_ready_age_sec,
            free_threads=pb.free_threads,
            starting_workers=pb.starting_workers,
            draining_workers=pb.draining_workers,
            scale_ups=pb.scale_ups,
            scale_downs=pb.scale_downs,
            cooldown_remaining_sec=pb.cooldown_remaining_sec,
        )

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict."""
        out = dataclasses.asdict(self)
        for name in ("last_decision_at", "last_error_at", "last_action_at"):
            at = getattr(self, name)
            out[name] = at.isoformat() if at else None
        return out


@dataclass(frozen=True)
class ShareInfo:
    """One share of the cluster (``ListShares``): a group, or an owner in none."""

    name: str
    """The group's name, or the owner's (``""``: jobs sent without a token)."""
    owners: list[str] = field(default_factory=list)
    """The owners whose jobs count against it that have jobs or usage."""
    weight: float = 1.0
    running_jobs: int = 0
    threads: int = 0
    gpus: int = 0
    memory_mb: int = 0
    """Held by its running jobs now."""
    queued_jobs: int = 0
    """Its jobs PENDING now."""
    dominant_share: float = 0.0
    """The largest part of the connected workers' threads, GPUs or memory it holds now."""
    recent_share: float = 0.0
    """Its dominant share lately (with CORRAL_FAIR_SHARE_HALF_LIFE_SEC; 0 without)."""
    rank: float = 0.0
    """(dominant_share + recent_share) / weight: fair share serves the lowest first."""
    thread_seconds: float = 0.0
    gpu_seconds: float = 0.0
    """Used by its jobs' leases (kept across restarts of the control plane)."""

    @classmethod
    def from_proto(cls, pb: admin_pb2.Share) -> ShareInfo:
        """Build :class:`ShareInfo` from a ``corral.v1.Share`` message."""
        return cls(
            name=pb.name,
            owners=list(pb.owners),
            weight=pb.weight,
            running_jobs=pb.running_jobs,
            threads=pb.threads,
            gpus=pb.gpus,
            memory_mb=pb.memory_mb,
            queued_jobs=pb.queued_jobs,
            dominant_share=pb.dominant_share,
            recent_share=pb.recent_share,
            rank=pb.rank,
            thread_seconds=pb.thread_seconds,
            gpu_seconds=pb.gpu_seconds,
        )


@dataclass(frozen=True)
class Shares:
    """The shares of the cluster (``ListShares``), lowest rank first, and the fair-share settings."""

    shares: list[ShareInfo] = field(default_factory=list)
    fair_share: bool = False
    half_life_sec: float = 0.0
    connected_threads: int = 0
    """What the connected workers give jobs in all; 0 threads: none is connected, and each dominant
    share is then the number of threads held rather than a part."""
    connected_gpus: int = 0
    connected_memory_mb: int = 0

    @classmethod
    def from_proto(cls, pb: admin_pb2.ListSharesResponse) -> Shares:
        """Build :class:`Shares` from a ``corral.v1.ListSharesResponse`` message."""
        return cls(
            [ShareInfo.from_proto(s) for s in pb.shares],
            pb.fair_share,
            pb.half_life_sec,
            pb.connected_threads,
            pb.connected_gpus,
            pb.connected_memory_mb,
        )

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict."""
        return dataclasses.asdict(self)
