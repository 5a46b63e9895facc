"""The Corral control plane.

Domain (no grpc imports): ``jobs`` (record + state machine), ``scheduler`` (live jobs, queues,
commits), ``intake`` (submissions), ``dispatch`` (the dispatch pass, selection policies),
``job_actions`` (cancel, retry), ``feeds`` (the streams of a job's changes), ``sessions`` (worker
protocol), ``reaper`` (lost workers, expired leases), ``queue``, ``registry``, ``backoff``,
``clock``, ``watch``, ``admission`` (validation, idempotency), ``store`` (durable state),
``config``, ``auth`` (who may call what: client and worker tokens), ``tls`` (the TLS files, checked
at start-up).
Edges: ``api`` (gRPC servicers, health, error mapping, interceptors), ``gateway`` (REST bridge,
/healthz, /readyz, /metrics over HTTP), ``metrics`` (every Prometheus metric), ``app`` (composition
root), ``__main__``.
"""

import corral.transport  # noqa: F401  (first: sets gRPC transport defaults before grpc loads)
from control.app import ControlPlane
from control.config import ConfigError, ControlConfig
from control.jobs import JobRecord, JobState

__all__ = ["ConfigError", "ControlConfig", "ControlPlane", "JobRecord", "JobState"]
