"""The control plane's configuration: one frozen dataclass, built and validated by ``from_env``.

Each field's docstring gives its environment variable, default and rule. A bad value stops
start-up with :class:`ConfigError` naming the variable and the rule.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any, TypeVar

T = TypeVar("T")


class ConfigError(ValueError):
    """Raised when a setting is missing its rule: the message names the variable and the rule."""


@dataclass(frozen=True, slots=True)
class ControlConfig:
    """Settings of one control-plane process."""

    host: str = "127.0.0.1"
    """CORRAL_HOST: address the gRPC and HTTP servers bind."""
    grpc_port: int = 50051
    """CORRAL_GRPC_PORT: 0..65535 (0 = any free port)."""
    http_port: int = 8080
    """CORRAL_HTTP_PORT: 0..65535 (0 = any free port)."""
    http_max_body_bytes: int = 64 << 20
    """CORRAL_HTTP_MAX_BODY_BYTES: 1..64 MiB; the largest REST request body (as big as a gRPC message)."""
    gateway_mode: str = "inprocess"
    """CORRAL_GATEWAY_MODE: inprocess (the REST bridge calls the servicers directly) | loopback (over a
    gRPC channel to this process's own port, as grpc-gateway does)."""
    db: str = "corral.db"
    """CORRAL_DB: SQLite file of the store."""
    db_sync: str = "normal"
    """CORRAL_DB_SYNC: normal (survives a process crash) | full (also survives power loss)."""
    heartbeat_interval_sec: float = 2.0
    """CORRAL_HEARTBEAT_INTERVAL_SEC: > 0; how often workers heartbeat."""
    heartbeat_timeout_sec: float = 10.0
    """WORKER_HEARTBEAT_TIMEOUT_SEC: > CORRAL_HEARTBEAT_INTERVAL_SEC; silence after which a worker is lost."""
    lease_grace_sec: float = 10.0
    """CORRAL_LEASE_GRACE_SEC: >= 0; a lease expires at its job's deadline plus this."""
    backoff_base_sec: float = 1.0
    """CORRAL_BACKOFF_BASE_SEC: >= 0; the first retry waits up to this."""
    backoff_cap_sec: float = 300.0
    """CORRAL_BACKOFF_CAP_SEC: >= CORRAL_BACKOFF_BASE_SEC; no retry waits longer."""
    backoff_seed: int | None = None
    """CORRAL_BACKOFF_SEED: integer; makes the jitter deterministic (tests)."""
    default_timeout_sec: float = 3600.0
    """CORRAL_DEFAULT_TIMEOUT_SEC: > 0; timeout_sec of jobs that give none."""
    default_max_attempts: int = 3
    """CORRAL_DEFAULT_MAX_ATTEMPTS: 1..100."""
    max_payload_bytes: int = 1 << 20
    """CORRAL_MAX_PAYLOAD_BYTES: 1..64 MiB; the largest payload, as JSON."""
    max_batch: int = 10_000
    """CORRAL_MAX_BATCH: >= 1; most jobs in one SubmitJobs."""
    selection: str = "round_robin"
    """CORRAL_SELECTION: round_robin | lru."""
    idempotency_ttl_sec: float = 86_400.0
    """IDEMPOTENCY_TTL_SEC: > 0; how long an idempotency key is remembered."""
    shutdown_grace_sec: float = 5.0
    """CORRAL_SHUTDOWN_GRACE_SEC: >= 0; how long in-flight calls may finish on SIGTERM."""
    log_level: str = "info"
    """CORRAL_LOG_LEVEL: debug | info | warning | error."""
    log_format: str = "json"
    """CORRAL_LOG_FORMAT: json | logfmt."""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> ControlConfig:
        """Read every setting from ``environ`` (default os.environ); ``overrides`` (flags) win."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in fields(cls):
            var = _ENV[f.name]
            if overrides.get(f.name) is not None:
                values[f.name] = overrides[f.name]
            elif var in env and env[var] != "":
                values[f.name] = _PARSE[f.name](var, env[var])
        config = cls(**values)
        config.check()
        return config

    def check(self) -> None:
        """Raise ConfigError for the first setting that breaks its rule."""
        _rule(0 <= self.grpc_port <= 65535, "CORRAL_GRPC_PORT", "must be 0..65535", self.grpc_port)
        _rule(0 <= self.http_port <= 65535, "CORRAL_HTTP_PORT", "must be 0..65535", self.http_port)
        _rule(
            1 <= self.http_max_body_bytes <= 64 << 20,
            "CORRAL_HTTP_MAX_BODY_BYTES",
            "must be 1..67108864",
            self.http_max_body_bytes,
        )
        _rule(
            self.gateway_mode in ("inprocess", "loopback"),
            "CORRAL_GATEWAY_MODE",
            "must be inprocess or loopback",
            self.gateway_mode,
        )
        _rule(self.db_sync in ("normal", "full"), "CORRAL_DB_SYNC", "must be normal or full", self.db_sync)
        _rule(
            _pos(self.heartbeat_interval_sec),
            "CORRAL_HEARTBEAT_INTERVAL_SEC",
            "must be > 0",
            self.heartbeat_interval_sec,
        )
        _rule(
            _pos(self.heartbeat_timeout_sec) and self.heartbeat_timeout_sec > self.heartbeat_interval_sec,
            "WORKER_HEARTBEAT_TIMEOUT_SEC",
            f"must be > CORRAL_HEARTBEAT_INTERVAL_SEC ({self.heartbeat_interval_sec:g})",
            self.heartbeat_timeout_sec,
        )
        _rule(_nonneg(self.lease_grace_sec), "CORRAL_LEASE_GRACE_SEC", "must be >= 0", self.lease_grace_sec)
        _rule(_nonneg(self.backoff_base_sec), "CORRAL_BACKOFF_BASE_SEC", "must be >= 0", self.backoff_base_sec)
        _rule(
            _nonneg(self.backoff_cap_sec) and self.backoff_cap_sec >= self.backoff_base_sec,
            "CORRAL_BACKOFF_CAP_SEC",
            f"must be >= CORRAL_BACKOFF_BASE_SEC ({self.backoff_base_sec:g})",
            self.backoff_cap_sec,
        )
        _rule(_pos(self.default_timeout_sec), "CORRAL_DEFAULT_TIMEOUT_SEC", "must be > 0", self.default_timeout_sec)
        _rule(
            1 <= self.default_max_attempts <= 100,
            "CORRAL_DEFAULT_MAX_ATTEMPTS",
            "must be 1..100",
            self.default_max_attempts,
        )
        _rule(
            1 <= self.max_payload_bytes <= 64 << 20,
            "CORRAL_MAX_PAYLOAD_BYTES",
            "must be 1..67108864",
            self.max_payload_bytes,
        )
        _rule(self.max_batch >= 1, "CORRAL_MAX_BATCH", "must be >= 1", self.max_batch)
        _rule(
            self.selection in ("round_robin", "lru"), "CORRAL_SELECTION", "must be round_robin or lru", self.selection
        )
        _rule(_pos(self.idempotency_ttl_sec), "IDEMPOTENCY_TTL_SEC", "must be > 0", self.idempotency_ttl_sec)
        _rule(_nonneg(self.shutdown_grace_sec), "CORRAL_SHUTDOWN_GRACE_SEC", "must be >= 0", self.shutdown_grace_sec)
        _rule(
            self.log_level in ("debug", "info", "warning", "error"),
            "CORRAL_LOG_LEVEL",
            "must be debug, info, warning or error",
            self.log_level,
        )
        _rule(self.log_format in ("json", "logfmt"), "CORRAL_LOG_FORMAT", "must be json or logfmt", self.log_format)


def _pos(x: float) -> bool:
    return math.isfinite(x) and x > 0


def _nonneg(x: float) -> bool:
    return math.isfinite(x) and x >= 0


def _rule(ok: bool, var: str, rule: str, value: object) -> None:
    if not ok:
        raise ConfigError(f"{var} {rule}, got {value!r}")


def _number(kind: Callable[[str], T]) -> Callable[[str, str], T]:
    def parse(var: str, raw: str) -> T:
        try:
            return kind(raw.strip())
        except ValueError:
            raise ConfigError(f"{var} must be {'an integer' if kind is int else 'a number'}, got {raw!r}") from None

    return parse


def _text(var: str, raw: str) -> str:
    return raw.strip()


def _lower(var: str, raw: str) -> str:
    return raw.strip().lower()


_ENV: dict[str, str] = {
    "host": "CORRAL_HOST",
    "grpc_port": "CORRAL_GRPC_PORT",
    "http_port": "CORRAL_HTTP_PORT",
    "http_max_body_bytes": "CORRAL_HTTP_MAX_BODY_BYTES",
    "gateway_mode": "CORRAL_GATEWAY_MODE",
    "db": "CORRAL_DB",
    "db_sync": "CORRAL_DB_SYNC",
    "heartbeat_interval_sec": "CORRAL_HEARTBEAT_INTERVAL_SEC",
    "heartbeat_timeout_sec": "WORKER_HEARTBEAT_TIMEOUT_SEC",
    "lease_grace_sec": "CORRAL_LEASE_GRACE_SEC",
    "backoff_base_sec": "CORRAL_BACKOFF_BASE_SEC",
    "backoff_cap_sec": "CORRAL_BACKOFF_CAP_SEC",
    "backoff_seed": "CORRAL_BACKOFF_SEED",
    "default_timeout_sec": "CORRAL_DEFAULT_TIMEOUT_SEC",
    "default_max_attempts": "CORRAL_DEFAULT_MAX_ATTEMPTS",
    "max_payload_bytes": "CORRAL_MAX_PAYLOAD_BYTES",
    "max_batch": "CORRAL_MAX_BATCH",
    "selection": "CORRAL_SELECTION",
    "idempotency_ttl_sec": "IDEMPOTENCY_TTL_SEC",
    "shutdown_grace_sec": "CORRAL_SHUTDOWN_GRACE_SEC",
    "log_level": "CORRAL_LOG_LEVEL",
    "log_format": "CORRAL_LOG_FORMAT",
}
"""Field -> environment variable."""

_INT = _number(int)
_FLOAT = _number(float)
_PARSE: dict[str, Callable[[str, str], Any]] = {
    "host": _text,
    "grpc_port": _INT,
    "http_port": _INT,
    "http_max_body_bytes": _INT,
    "gateway_mode": _lower,
    "db": _text,
    "db_sync": _lower,
    "heartbeat_interval_sec": _FLOAT,
    "heartbeat_timeout_sec": _FLOAT,
    "lease_grace_sec": _FLOAT,
    "backoff_base_sec": _FLOAT,
    "backoff_cap_sec": _FLOAT,
    "backoff_seed": _INT,
    "default_timeout_sec": _FLOAT,
    "default_max_attempts": _INT,
    "max_payload_bytes": _INT,
    "max_batch": _INT,
    "selection": _lower,
    "idempotency_ttl_sec": _FLOAT,
    "shutdown_grace_sec": _FLOAT,
    "log_level": _lower,
    "log_format": _lower,
}
