"""The control plane's configuration: one frozen dataclass, built and validated by ``from_env``.

Each field's docstring gives its environment variable, default and rule. A bad value stops
start-up with :class:`ConfigError` naming the variable and the rule.
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

from control.access import VISIBILITIES, parse_groups
from control.auth import PRINCIPAL_NAME, TokenError, client_tokens, token_problem
from control.dispatch import POLICIES
from control.exec_limits import parse_exec_limits
from control.shares import ShareRules
from control.tls import ContainerTls, ServerTls, TlsError
from corral.event_loop import LOOPS
from corral.limits import MAX_MEMORY_MB
from corral.transport import loopback

T = TypeVar("T")

ACCOUNT_MODES = ("off", "admin", "open")
"""The values of CORRAL_ACCOUNTS."""


class ConfigError(ValueError):
    """Raised when a setting is missing its rule: the message names the variable and the rule."""


_KEPT_AT_LEAST_A_TTL = ("job_retention_sec", "failed_retention_sec")
"""Settings that keep finished jobs, which must outlive the idempotency keys that name them."""


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
    http_header_timeout_sec: float = 10.0
    """CORRAL_HTTP_HEADER_TIMEOUT_SEC: > 0; a REST request's line and headers must be all in this long after
    the connection opened (after its TLS handshake, which has as long again), or after the response before
    on a kept-alive connection, else the connection is closed: an idle kept-alive one too (the gRPC
    handshake's 10 s)."""
    http_body_timeout_sec: float = 10.0
    """CORRAL_HTTP_BODY_TIMEOUT_SEC: > 0; the longest a REST request body may go without a byte before its
    connection is closed. Nothing bounds how long an answer (a WatchJob stream) takes."""
    http_max_connections: int = 1000
    """CORRAL_HTTP_MAX_CONNECTIONS: >= 0; HTTP connections open at once (0 = no cap); one more is answered
    503 and closed, so that REST clients cannot take the descriptors that workers reconnect with."""
    gateway_mode: str = "inprocess"
    """CORRAL_GATEWAY_MODE: inprocess (the REST bridge calls the servicers directly) | loopback (over a
    gRPC channel to this process's own port, as grpc-gateway does)."""
    db: str = "corral.db"
    """CORRAL_DB: the store: a SQLite file, or a ``postgresql://`` URL (shared: one active control plane,
    the others stand by; see control.store.postgres)."""
    db_sync: str = "normal"
    """CORRAL_DB_SYNC: normal (survives a process crash) | full (also survives power loss); SQLite only
    (PostgreSQL commits as its server is set to)."""
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
    """CORRAL_SELECTION: round_robin | lru | least_loaded (control.dispatch)."""
    idempotency_ttl_sec: float = 86_400.0
    """IDEMPOTENCY_TTL_SEC: > 0; how long an idempotency key is remembered."""
    job_retention_sec: float = 7 * 86_400.0
    """CORRAL_JOB_RETENTION_SEC: 0, or >= IDEMPOTENCY_TTL_SEC; SUCCEEDED and CANCELLED jobs are deleted
    this long after they finished (0 keeps them for ever). Unset, it is at least IDEMPOTENCY_TTL_SEC."""
    failed_retention_sec: float = 14 * 86_400.0
    """CORRAL_FAILED_RETENTION_SEC: 0, or >= IDEMPOTENCY_TTL_SEC; FAILED jobs (the dead-letter queue)
    are deleted this long after they failed (0 keeps them until retried). Unset, it is at least
    IDEMPOTENCY_TTL_SEC."""
    rate_limit_jobs_per_min: float = 0.0
    """RATE_LIMIT_JOBS_PER_MIN: >= 0; jobs submitted per minute across all clients (0 = no limit)."""
    rate_limit_burst: int = 0
    """CORRAL_RATE_LIMIT_BURST: >= 0; jobs that may be submitted at once (the largest batch that can
    pass); 0 = a minute's worth (RATE_LIMIT_JOBS_PER_MIN rounded up)."""
    rate_limit_per_client_jobs_per_min: float = 0.0
    """CORRAL_RATE_LIMIT_PER_CLIENT_JOBS_PER_MIN: >= 0; jobs per minute for each client (the
    authenticated principal, else the peer address); 0 = no per-client limit."""
    rate_limit_per_client_burst: int = 0
    """CORRAL_RATE_LIMIT_PER_CLIENT_BURST: >= 0; a client's burst; 0 = a minute of its rate."""
    exec_rate_limits: str = ""
    """CORRAL_EXEC_RATE_LIMITS: comma-separated ``type:NAME=RATE/UNIT[:BURST]`` or
    ``key:RATE_KEY=RATE/UNIT[:BURST]`` rules (unit s, m or h; burst >= 1, default 1), e.g.
    ``type:webhook=10/s,key:api.example.com=5/s:10``: how fast such jobs may start (control.exec_limits)."""
    shutdown_grace_sec: float = 5.0
    """CORRAL_SHUTDOWN_GRACE_SEC: >= 0; how long in-flight calls may finish on SIGTERM."""
    log_level: str = "info"
    """CORRAL_LOG_LEVEL: debug | info | warning | error."""
    log_format: str = "json"
    """CORRAL_LOG_FORMAT: json | logfmt."""
    event_loop: str = "uvloop"
    """CORRAL_EVENT_LOOP: uvloop | asyncio; the event loop the control plane runs on (corral.event_loop)."""
    auth_tokens: tuple[str, ...] = field(default=(), repr=False)
    """CORRAL_AUTH_TOKENS: comma-separated client tokens, each ``TOKEN`` or ``NAME:TOKEN`` (a token: >= 16
    printable ASCII characters without spaces, ',' or ':'; a name: [A-Za-z0-9._@-]{1,64}). Any client
    token set: every JobService/AdminService call and REST route needs one (control.auth)."""
    auth_token_file: str = ""
    """CORRAL_AUTH_TOKEN_FILE: a readable file of more client tokens, one ``TOKEN`` or ``NAME:TOKEN`` a
    line (blank lines and ``#`` comments skipped), read at start-up and again when it changes or on SIGHUP
    (control.token_reload)."""
    job_visibility: str = "all"
    """CORRAL_JOB_VISIBILITY: all | group | owner. ``owner``: a client sees and manages only the jobs it
    submitted; ``group``: those of its group (CORRAL_GROUPS). Both need client tokens (control.access)."""
    groups: str = ""
    """CORRAL_GROUPS: ``physics=alice,bob;bio=carol``: client token names by group, one group each; what
    ``group`` visibility and fair share (control.shares) go by."""
    auth_admins: tuple[str, ...] = ()
    """CORRAL_AUTH_ADMINS: comma-separated client token (or account) names that see and manage every job
    and may call AdminService when CORRAL_JOB_VISIBILITY=owner, and manage accounts."""
    accounts: str = "off"
    """CORRAL_ACCOUNTS: off | admin | open. ``admin``: people log in with a name and a password to
    accounts that admins create; ``open``: anyone may register one (control.accounts)."""
    login_ttl_sec: float = 3600.0
    """CORRAL_LOGIN_TTL_SEC: 60..2592000 (30 days); how long a login lasts."""
    password_rounds: int = 12
    """CORRAL_PASSWORD_ROUNDS: 10..16; bcrypt's cost (each one more doubles a login's work)."""
    audit_retention_sec: float = 7_776_000.0
    """CORRAL_AUDIT_RETENTION_SEC: >= 0; how long the audit log keeps an event (90 days; 0: for ever)."""
    notify_webhook_secret: str = field(default="", repr=False)
    """CORRAL_NOTIFY_WEBHOOK_SECRET: signs the webhooks that announce jobs' ends (control.notify): 16..1024
    characters, or empty for none. Each then carries ``X-Corral-Timestamp`` and ``X-Corral-Signature:
    sha256=<hex HMAC-SHA256 of "<timestamp>.<body>" with this secret>``, so an endpoint can tell that it
    came from this control plane, unchanged."""
    fair_share: str = "off"
    """CORRAL_FAIR_SHARE: on | off. ``on``: a freed slot goes to the owner with the smallest dominant share
    (the largest part of the workers' threads, GPUs or memory its running jobs hold) for its weight
    (control.shares)."""
    owner_weights: str = ""
    """CORRAL_OWNER_WEIGHTS: ``alice=3,bob=1``: owners' weights for fair share (> 0; default 1 each)."""
    fair_share_half_life_sec: float = 0.0
    """CORRAL_FAIR_SHARE_HALF_LIFE_SEC: >= 0, with CORRAL_FAIR_SHARE=on; a share is ranked by what it holds
    now plus what it held lately, where what it held this long ago counts half (control.shares). 0: only
    what it holds now."""
    owner_max_running: str = ""
    """CORRAL_OWNER_MAX_RUNNING: ``N`` or ``N,alice=M``: the most jobs an owner may have running (0 or
    unset: no cap)."""
    priority_aging_sec: float = 0.0
    """CORRAL_PRIORITY_AGING_SEC: >= 0; each this many seconds a ready job has waited counts as one more
    priority level, so that no job waits for ever behind higher-priority ones (control.queue.QueueOrder).
    0: strict priority, then age."""
    tls_cert: str = ""
    """CORRAL_TLS_CERT: PEM certificate chain; with CORRAL_TLS_KEY, the gRPC port speaks TLS and the HTTP
    port HTTPS (set both or neither)."""
    tls_key: str = ""
    """CORRAL_TLS_KEY: the unencrypted PEM private key of CORRAL_TLS_CERT."""
    tls_client_ca: str = ""
    """CORRAL_TLS_CLIENT_CA: PEM CA certificates that sign workers' certificates; needs CORRAL_TLS_CERT.
    Opens the worker port (CORRAL_WORKER_PORT, mutual TLS) and makes WorkerService accept only calls
    whose TLS session carries a certificate it verified (control.tls says why a port of its own)."""
    worker_port: int = 50052
    """CORRAL_WORKER_PORT: 0..65535 (0 = any free port), not CORRAL_GRPC_PORT or CORRAL_HTTP_PORT; the
    mutual-TLS gRPC port for workers, served only with CORRAL_TLS_CLIENT_CA."""
    autoscale_mode: str = "off"
    """AUTOSCALE_MODE: off | recommend (decisions are logged and counted only) | docker (acts)."""
    autoscale_interval_sec: float = 5.0
    """AUTOSCALE_INTERVAL: > 0; seconds between two looks at the queue."""
    queue_threshold_high: int = 10
    """QUEUE_THRESHOLD_HIGH: >= 1; more ready jobs than this (beyond free capacity) scale up."""
    queue_threshold_low: int = 2
    """QUEUE_THRESHOLD_LOW: 0..QUEUE_THRESHOLD_HIGH-1; fewer ready jobs than this, for
    SCALE_DOWN_STABLE_SEC with capacity to spare, scale down (0 = never scale down)."""
    min_workers: int = 1
    """MIN_WORKERS: >= 0; the autoscaler never goes below this."""
    max_workers: int = 10
    """MAX_WORKERS: >= MIN_WORKERS and >= 1; the autoscaler never goes above this."""
    scale_down_stable_sec: float = 60.0
    """SCALE_DOWN_STABLE_SEC: >= 0; how long the queue must stay low before a scale-down."""
    scale_cooldown_sec: float = 30.0
    """CORRAL_SCALE_COOLDOWN_SEC: >= 0; no second scale action (either way) sooner than this after one."""
    scale_max_wait_sec: float = 60.0
    """CORRAL_SCALE_MAX_WAIT_SEC: >= 0; a ready job waiting this long scales up even under
    QUEUE_THRESHOLD_HIGH (0 = the age of the oldest job is not a trigger)."""
    worker_image: str = "corral-worker:latest"
    """WORKER_IMAGE: the image of the worker containers the docker autoscaler starts (never pulled)."""
    worker_threads: int = 4
    """CORRAL_WORKER_THREADS: >= 1; threads of each worker container (its CORRAL_WORKER_THREADS)."""
    worker_network: str = "host"
    """CORRAL_WORKER_NETWORK: host | bridge | none | container:NAME | a network name; where worker
    containers run (host: they reach a control plane bound to 127.0.0.1). In docker mode, any other
    needs CORRAL_AUTOSCALE_CONTROL_ADDRESS when CORRAL_HOST is a loopback or wildcard address."""
    autoscale_control_address: str = ""
    """CORRAL_AUTOSCALE_CONTROL_ADDRESS: HOST:PORT the worker containers dial (default: CORRAL_HOST, or
    the loopback address when that is a wildcard, and the bound gRPC port, or the bound worker port
    under mutual TLS)."""
    autoscale_tls_ca: str = ""
    """CORRAL_AUTOSCALE_TLS_CA: PEM CA certificates the worker containers verify the control plane with
    (their CORRAL_TLS_CA); required in docker mode when CORRAL_TLS_CERT is set, refused there when it
    is not."""
    autoscale_tls_cert: str = ""
    """CORRAL_AUTOSCALE_TLS_CERT: the client certificate the worker containers present on the worker port
    (their CORRAL_WORKER_TLS_CERT); with CORRAL_AUTOSCALE_TLS_KEY, required in docker mode when
    CORRAL_TLS_CLIENT_CA is set. The files are read at start-up and copied into each container."""
    autoscale_tls_key: str = ""
    """CORRAL_AUTOSCALE_TLS_KEY: the unencrypted PEM private key of CORRAL_AUTOSCALE_TLS_CERT."""
    autoscale_group: str = "corral"
    """CORRAL_AUTOSCALE_GROUP: [A-Za-z0-9][A-Za-z0-9_.-]{0,63} (it starts the container names, and Docker
    wants those to start with a letter or digit); the label value that marks this control plane's
    worker containers (it adopts and removes only those)."""
    autoscale_worker_memory_mb: int | None = None
    """CORRAL_AUTOSCALE_WORKER_MEMORY_MB: 1..2^30 MiB; the memory each worker container gives to jobs
    (its CORRAL_WORKER_MEMORY_MB) and may use (its Docker memory limit). Unset: this machine's memory
    (or its cgroup's limit when lower) divided by MAX_WORKERS, as ``corral up`` divides it among its
    workers. Jobs asking more memory_mb than this are not backlog (no container could run them)."""
    worker_token: str = field(default="", repr=False)
    """CORRAL_WORKER_TOKEN: the worker token; passed to the worker containers the autoscaler starts. Set:
    WorkerService calls need it (>= 16 printable ASCII characters without spaces, ',' or ':'; not a client
    token). Required when client tokens are set, unless CORRAL_TLS_CLIENT_CA is (else anyone could
    register a worker and take jobs)."""

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
        defaults = {f.name: f.default for f in fields(cls)}
        for name in _KEPT_AT_LEAST_A_TTL:
            if name not in values and "idempotency_ttl_sec" in values:
                # Unset, it follows a longer key TTL: a release before retention accepted any TTL, and
                # refusing one at start after an upgrade, naming a setting never set, helps no one.
                values[name] = max(defaults[name], values["idempotency_ttl_sec"])
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
        for var, timeout in (
            ("CORRAL_HTTP_HEADER_TIMEOUT_SEC", self.http_header_timeout_sec),
            ("CORRAL_HTTP_BODY_TIMEOUT_SEC", self.http_body_timeout_sec),
        ):
            _rule(_pos(timeout), var, "must be > 0", timeout)
        _rule(
            self.http_max_connections >= 0,
            "CORRAL_HTTP_MAX_CONNECTIONS",
            "must be >= 0 (0: no cap)",
            self.http_max_connections,
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
            self.selection in POLICIES,
            "CORRAL_SELECTION",
            "must be round_robin, lru or least_loaded",
            self.selection,
        )
        _rule(_pos(self.idempotency_ttl_sec), "IDEMPOTENCY_TTL_SEC", "must be > 0", self.idempotency_ttl_sec)
        for name in _KEPT_AT_LEAST_A_TTL:
            var, keep = _ENV[name], getattr(self, name)
            _rule(_nonneg(keep), var, "must be >= 0 (0 keeps finished jobs for ever)", keep)
            _rule(
                keep == 0 or keep >= self.idempotency_ttl_sec,
                var,
                f"must be 0 or at least IDEMPOTENCY_TTL_SEC ({self.idempotency_ttl_sec:g}): "
                "a replayed submission must still find its job",
                keep,
            )
        self._check_rate_limits()
        _rule(_nonneg(self.shutdown_grace_sec), "CORRAL_SHUTDOWN_GRACE_SEC", "must be >= 0", self.shutdown_grace_sec)
        _rule(
            self.log_level in ("debug", "info", "warning", "error"),
            "CORRAL_LOG_LEVEL",
            "must be debug, info, warning or error",
            self.log_level,
        )
        _rule(self.log_format in ("json", "logfmt"), "CORRAL_LOG_FORMAT", "must be json or logfmt", self.log_format)
        _rule(self.event_loop in LOOPS, "CORRAL_EVENT_LOOP", "must be uvloop or asyncio", self.event_loop)
        _rule(
            _nonneg(self.priority_aging_sec),
            "CORRAL_PRIORITY_AGING_SEC",
            "must be >= 0 (0: no aging)",
            self.priority_aging_sec,
        )
        self._check_auth()
        _rule(
            _nonneg(self.audit_retention_sec),
            "CORRAL_AUDIT_RETENTION_SEC",
            "must be >= 0 (0: keep for ever)",
            self.audit_retention_sec,
        )
        _rule(
            not self.notify_webhook_secret or 16 <= len(self.notify_webhook_secret) <= 1024,
            "CORRAL_NOTIFY_WEBHOOK_SECRET",
            "must be 16..1024 characters, or empty for unsigned webhooks",
            f"{len(self.notify_webhook_secret)} characters",
        )
        try:
            ShareRules.parse(
                self.fair_share, self.owner_weights, self.owner_max_running, half_life_sec=self.fair_share_half_life_sec
            )
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        self._check_tls()
        self._check_autoscale()

    def _check_auth(self) -> None:
        try:
            clients = client_tokens(self.auth_tokens, self.auth_token_file)
        except TokenError as exc:
            raise ConfigError(str(exc)) from None
        self._check_accounts(bool(clients))
        self._check_visibility(set(clients.values()))
        if self.worker_token:
            problem = token_problem(self.worker_token)
            if problem is not None:
                raise ConfigError(f"CORRAL_WORKER_TOKEN: {problem}")
            if self.worker_token in clients:
                raise ConfigError("CORRAL_WORKER_TOKEN must differ from every client token")
        elif (clients or self.accounts != "off") and not self.tls_client_ca:
            raise ConfigError(
                "CORRAL_WORKER_TOKEN must be set when client tokens are (CORRAL_AUTH_TOKENS, CORRAL_AUTH_TOKEN_FILE)"
                " or accounts (CORRAL_ACCOUNTS), else anyone could register a worker and take jobs (or set"
                " CORRAL_TLS_CLIENT_CA)"
            )

    def _check_accounts(self, has_tokens: bool) -> None:
        _rule(self.accounts in ACCOUNT_MODES, "CORRAL_ACCOUNTS", "must be off, admin or open", self.accounts)
        _rule(
            60 <= self.login_ttl_sec <= 2_592_000,
            "CORRAL_LOGIN_TTL_SEC",
            "must be 60..2592000 (a minute to 30 days)",
            self.login_ttl_sec,
        )
        _rule(10 <= self.password_rounds <= 16, "CORRAL_PASSWORD_ROUNDS", "must be 10..16", self.password_rounds)
        if self.accounts == "admin" and not has_tokens:
            raise ConfigError(
                "CORRAL_ACCOUNTS=admin needs a client token (CORRAL_AUTH_TOKENS, CORRAL_AUTH_TOKEN_FILE) to create"
                " the first account with; or use CORRAL_ACCOUNTS=open, where anyone may register"
            )

    def _check_visibility(self, principals: set[str]) -> None:
        _rule(
            self.job_visibility in VISIBILITIES,
            "CORRAL_JOB_VISIBILITY",
            "must be all, group or owner",
            self.job_visibility,
        )
        accounts = self.accounts != "off"  # their names are known only at run time
        if self.job_visibility != "all" and not principals and not accounts:
            raise ConfigError(
                f"CORRAL_JOB_VISIBILITY={self.job_visibility} needs client tokens (CORRAL_AUTH_TOKENS,"
                " CORRAL_AUTH_TOKEN_FILE) or accounts (CORRAL_ACCOUNTS): without them no call says who it comes from"
            )
        if self.auth_admins and self.job_visibility == "all":
            raise ConfigError(
                "CORRAL_AUTH_ADMINS needs CORRAL_JOB_VISIBILITY=owner or group (with 'all' every client sees every job)"
            )
        for name in self.auth_admins:
            if accounts:
                if not PRINCIPAL_NAME.fullmatch(name):
                    raise ConfigError(f"CORRAL_AUTH_ADMINS: {name!r} must match [A-Za-z0-9._@-]{{1,64}}")
            elif name not in principals:
                raise ConfigError(f"CORRAL_AUTH_ADMINS: {name!r} is not the name of any client token")
        try:
            group_of = parse_groups(self.groups)
        except ValueError as exc:
            raise ConfigError(f"CORRAL_GROUPS: {exc}") from None
        if self.job_visibility == "group" and not group_of:
            raise ConfigError("CORRAL_JOB_VISIBILITY=group needs CORRAL_GROUPS (which clients are in which group)")
        for name in group_of:
            if name not in principals and not accounts:
                raise ConfigError(f"CORRAL_GROUPS: {name!r} is not the name of any client token")

    def _check_tls(self) -> None:
        _rule(0 <= self.worker_port <= 65535, "CORRAL_WORKER_PORT", "must be 0..65535", self.worker_port)
        if bool(self.tls_cert) != bool(self.tls_key):
            cert, key = "CORRAL_TLS_CERT", "CORRAL_TLS_KEY"
            given, missing = (cert, key) if self.tls_cert else (key, cert)
            raise ConfigError(f"{missing} must be set together with {given}")
        if self.tls_client_ca and not self.tls_cert:
            raise ConfigError("CORRAL_TLS_CLIENT_CA needs CORRAL_TLS_CERT and CORRAL_TLS_KEY (mutual TLS is TLS first)")
        if self.tls_cert:
            try:
                ServerTls.load(self.tls_cert, self.tls_key, self.tls_client_ca)
            except TlsError as exc:
                raise ConfigError(str(exc)) from None
        if self.tls_client_ca and self.worker_port:
            _rule(
                self.worker_port not in (self.grpc_port, self.http_port),
                "CORRAL_WORKER_PORT",
                f"must differ from CORRAL_GRPC_PORT ({self.grpc_port}) and CORRAL_HTTP_PORT ({self.http_port})",
                self.worker_port,
            )

    def _check_rate_limits(self) -> None:
        _rule(
            _nonneg(self.rate_limit_jobs_per_min),
            "RATE_LIMIT_JOBS_PER_MIN",
            "must be >= 0",
            self.rate_limit_jobs_per_min,
        )
        _rule(self.rate_limit_burst >= 0, "CORRAL_RATE_LIMIT_BURST", "must be >= 0", self.rate_limit_burst)
        _rule(
            _nonneg(self.rate_limit_per_client_jobs_per_min),
            "CORRAL_RATE_LIMIT_PER_CLIENT_JOBS_PER_MIN",
            "must be >= 0",
            self.rate_limit_per_client_jobs_per_min,
        )
        _rule(
            self.rate_limit_per_client_burst >= 0,
            "CORRAL_RATE_LIMIT_PER_CLIENT_BURST",
            "must be >= 0",
            self.rate_limit_per_client_burst,
        )
        try:
            parse_exec_limits(self.exec_rate_limits)
        except ValueError as exc:
            raise ConfigError(f"CORRAL_EXEC_RATE_LIMITS {exc}") from None

    def _check_autoscale(self) -> None:
        _rule(
            self.autoscale_mode in ("off", "recommend", "docker"),
            "AUTOSCALE_MODE",
            "must be off, recommend or docker",
            self.autoscale_mode,
        )
        _rule(_pos(self.autoscale_interval_sec), "AUTOSCALE_INTERVAL", "must be > 0", self.autoscale_interval_sec)
        _rule(self.queue_threshold_high >= 1, "QUEUE_THRESHOLD_HIGH", "must be >= 1", self.queue_threshold_high)
        _rule(
            0 <= self.queue_threshold_low < self.queue_threshold_high,
            "QUEUE_THRESHOLD_LOW",
            f"must be >= 0 and < QUEUE_THRESHOLD_HIGH ({self.queue_threshold_high})",
            self.queue_threshold_low,
        )
        _rule(self.min_workers >= 0, "MIN_WORKERS", "must be >= 0", self.min_workers)
        _rule(
            self.max_workers >= max(1, self.min_workers),
            "MAX_WORKERS",
            f"must be >= 1 and >= MIN_WORKERS ({self.min_workers})",
            self.max_workers,
        )
        _rule(_nonneg(self.scale_down_stable_sec), "SCALE_DOWN_STABLE_SEC", "must be >= 0", self.scale_down_stable_sec)
        _rule(_nonneg(self.scale_cooldown_sec), "CORRAL_SCALE_COOLDOWN_SEC", "must be >= 0", self.scale_cooldown_sec)
        _rule(_nonneg(self.scale_max_wait_sec), "CORRAL_SCALE_MAX_WAIT_SEC", "must be >= 0", self.scale_max_wait_sec)
        _rule(bool(self.worker_image), "WORKER_IMAGE", "must not be empty", self.worker_image)
        _rule(self.worker_threads >= 1, "CORRAL_WORKER_THREADS", "must be >= 1", self.worker_threads)
        _rule(bool(self.worker_network), "CORRAL_WORKER_NETWORK", "must not be empty", self.worker_network)
        host, sep, port = self.autoscale_control_address.rpartition(":")
        _rule(
            not self.autoscale_control_address or (bool(sep and host) and port.isdigit() and 1 <= int(port) <= 65535),
            "CORRAL_AUTOSCALE_CONTROL_ADDRESS",
            "must be HOST:PORT with a port in 1..65535 (or empty for CORRAL_HOST:<gRPC port>)",
            self.autoscale_control_address,
        )
        if (
            self.autoscale_mode == "docker"
            and self.worker_network != "host"
            and not self.autoscale_control_address
            and _loopback_only(self.host)
        ):
            raise ConfigError(
                "CORRAL_AUTOSCALE_CONTROL_ADDRESS must be set when CORRAL_WORKER_NETWORK is not host and"
                f" AUTOSCALE_MODE=docker: the default, {loopback(self.host)} (from CORRAL_HOST), is the container's"
                f" own loopback inside its network, got CORRAL_WORKER_NETWORK={self.worker_network!r}"
            )
        _rule(
            re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", self.autoscale_group) is not None,
            "CORRAL_AUTOSCALE_GROUP",
            "must match [A-Za-z0-9][A-Za-z0-9_.-]{0,63} (1..64 characters, the first a letter or digit: it"
            " starts the worker containers' names)",
            self.autoscale_group,
        )
        _rule(
            self.autoscale_worker_memory_mb is None or 1 <= self.autoscale_worker_memory_mb <= MAX_MEMORY_MB,
            "CORRAL_AUTOSCALE_WORKER_MEMORY_MB",
            f"must be 1..{MAX_MEMORY_MB} (MiB), or unset for this machine's memory divided by MAX_WORKERS",
            self.autoscale_worker_memory_mb,
        )
        self._check_container_tls()

    def _check_container_tls(self) -> None:
        """The worker containers must be able to reach this control plane: TLS needs a CA for them to
        trust, mutual TLS a client certificate as well."""
        cert, key = self.autoscale_tls_cert, self.autoscale_tls_key
        if bool(cert) != bool(key):
            given, missing = ("CERT", "KEY") if cert else ("KEY", "CERT")
            raise ConfigError(f"CORRAL_AUTOSCALE_TLS_{missing} must be set together with CORRAL_AUTOSCALE_TLS_{given}")
        if cert and not self.autoscale_tls_ca:
            raise ConfigError("CORRAL_AUTOSCALE_TLS_CERT needs CORRAL_AUTOSCALE_TLS_CA (mutual TLS is TLS first)")
        if self.autoscale_mode == "docker" and self.autoscale_tls_ca and not self.tls_cert:
            raise ConfigError(
                "CORRAL_AUTOSCALE_TLS_CA needs CORRAL_TLS_CERT when AUTOSCALE_MODE=docker: without it the control"
                " plane speaks plaintext, and worker containers given a CA would try TLS against it"
            )
        if self.autoscale_mode == "docker" and self.tls_cert and not self.autoscale_tls_ca:
            raise ConfigError(
                "CORRAL_AUTOSCALE_TLS_CA must be set when CORRAL_TLS_CERT is and AUTOSCALE_MODE=docker: the worker"
                " containers must verify the control plane with it"
            )
        if self.autoscale_mode == "docker" and self.tls_client_ca and not cert:
            raise ConfigError(
                "CORRAL_AUTOSCALE_TLS_CERT and CORRAL_AUTOSCALE_TLS_KEY must be set when CORRAL_TLS_CLIENT_CA is and"
                " AUTOSCALE_MODE=docker: the worker containers need a client certificate for the worker port"
            )
        if self.autoscale_tls_ca:
            try:
                ContainerTls.load(self.autoscale_tls_ca, cert, key)
            except TlsError as exc:
                raise ConfigError(str(exc)) from None


def _loopback_only(host: str) -> bool:
    """Whether the address worker containers dial by default, from CORRAL_HOST, is a loopback one: from
    a container with a network namespace of its own it reaches the container, not this control plane."""
    name = loopback(host).strip("[]")
    if name.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:  # a host name: it may well resolve to an address the containers reach
        return False


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
            value = kind(raw.strip())
        except ValueError:
            raise ConfigError(f"{var} must be {'an integer' if kind is int else 'a number'}, got {raw!r}") from None
        if isinstance(value, float) and not math.isfinite(value):  # "inf >= 0" would pass the range rules
            raise ConfigError(f"{var} must be a finite number, got {raw!r}")
        return value

    return parse


def _text(var: str, raw: str) -> str:
    return raw.strip()


def _lower(var: str, raw: str) -> str:
    return raw.strip().lower()


def _list(var: str, raw: str) -> tuple[str, ...]:
    """Comma-separated items, blanks dropped."""
    return tuple(item for part in raw.split(",") if (item := part.strip()))


_ENV: dict[str, str] = {
    "host": "CORRAL_HOST",
    "grpc_port": "CORRAL_GRPC_PORT",
    "http_port": "CORRAL_HTTP_PORT",
    "http_max_body_bytes": "CORRAL_HTTP_MAX_BODY_BYTES",
    "http_header_timeout_sec": "CORRAL_HTTP_HEADER_TIMEOUT_SEC",
    "http_body_timeout_sec": "CORRAL_HTTP_BODY_TIMEOUT_SEC",
    "http_max_connections": "CORRAL_HTTP_MAX_CONNECTIONS",
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
    "job_retention_sec": "CORRAL_JOB_RETENTION_SEC",
    "failed_retention_sec": "CORRAL_FAILED_RETENTION_SEC",
    "rate_limit_jobs_per_min": "RATE_LIMIT_JOBS_PER_MIN",
    "rate_limit_burst": "CORRAL_RATE_LIMIT_BURST",
    "rate_limit_per_client_jobs_per_min": "CORRAL_RATE_LIMIT_PER_CLIENT_JOBS_PER_MIN",
    "rate_limit_per_client_burst": "CORRAL_RATE_LIMIT_PER_CLIENT_BURST",
    "exec_rate_limits": "CORRAL_EXEC_RATE_LIMITS",
    "shutdown_grace_sec": "CORRAL_SHUTDOWN_GRACE_SEC",
    "log_level": "CORRAL_LOG_LEVEL",
    "log_format": "CORRAL_LOG_FORMAT",
    "event_loop": "CORRAL_EVENT_LOOP",
    "auth_tokens": "CORRAL_AUTH_TOKENS",
    "auth_token_file": "CORRAL_AUTH_TOKEN_FILE",
    "job_visibility": "CORRAL_JOB_VISIBILITY",
    "groups": "CORRAL_GROUPS",
    "auth_admins": "CORRAL_AUTH_ADMINS",
    "accounts": "CORRAL_ACCOUNTS",
    "login_ttl_sec": "CORRAL_LOGIN_TTL_SEC",
    "password_rounds": "CORRAL_PASSWORD_ROUNDS",
    "audit_retention_sec": "CORRAL_AUDIT_RETENTION_SEC",
    "fair_share": "CORRAL_FAIR_SHARE",
    "fair_share_half_life_sec": "CORRAL_FAIR_SHARE_HALF_LIFE_SEC",
    "owner_weights": "CORRAL_OWNER_WEIGHTS",
    "owner_max_running": "CORRAL_OWNER_MAX_RUNNING",
    "priority_aging_sec": "CORRAL_PRIORITY_AGING_SEC",
    "tls_cert": "CORRAL_TLS_CERT",
    "tls_key": "CORRAL_TLS_KEY",
    "tls_client_ca": "CORRAL_TLS_CLIENT_CA",
    "worker_port": "CORRAL_WORKER_PORT",
    "autoscale_mode": "AUTOSCALE_MODE",
    "autoscale_interval_sec": "AUTOSCALE_INTERVAL",
    "queue_threshold_high": "QUEUE_THRESHOLD_HIGH",
    "queue_threshold_low": "QUEUE_THRESHOLD_LOW",
    "min_workers": "MIN_WORKERS",
    "max_workers": "MAX_WORKERS",
    "scale_down_stable_sec": "SCALE_DOWN_STABLE_SEC",
    "scale_cooldown_sec": "CORRAL_SCALE_COOLDOWN_SEC",
    "scale_max_wait_sec": "CORRAL_SCALE_MAX_WAIT_SEC",
    "worker_image": "WORKER_IMAGE",
    "worker_threads": "CORRAL_WORKER_THREADS",
    "worker_network": "CORRAL_WORKER_NETWORK",
    "autoscale_control_address": "CORRAL_AUTOSCALE_CONTROL_ADDRESS",
    "autoscale_group": "CORRAL_AUTOSCALE_GROUP",
    "autoscale_worker_memory_mb": "CORRAL_AUTOSCALE_WORKER_MEMORY_MB",
    "autoscale_tls_ca": "CORRAL_AUTOSCALE_TLS_CA",
    "autoscale_tls_cert": "CORRAL_AUTOSCALE_TLS_CERT",
    "autoscale_tls_key": "CORRAL_AUTOSCALE_TLS_KEY",
    "worker_token": "CORRAL_WORKER_TOKEN",
    "notify_webhook_secret": "CORRAL_NOTIFY_WEBHOOK_SECRET",
}
"""Field -> environment variable."""

_INT = _number(int)
_FLOAT = _number(float)
_PARSE: dict[str, Callable[[str, str], Any]] = {
    "host": _text,
    "grpc_port": _INT,
    "http_port": _INT,
    "http_max_body_bytes": _INT,
    "http_header_timeout_sec": _FLOAT,
    "http_body_timeout_sec": _FLOAT,
    "http_max_connections": _INT,
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
    "job_retention_sec": _FLOAT,
    "failed_retention_sec": _FLOAT,
    "rate_limit_jobs_per_min": _FLOAT,
    "rate_limit_burst": _INT,
    "rate_limit_per_client_jobs_per_min": _FLOAT,
    "rate_limit_per_client_burst": _INT,
    "exec_rate_limits": _text,
    "shutdown_grace_sec": _FLOAT,
    "log_level": _lower,
    "log_format": _lower,
    "event_loop": _lower,
    "auth_tokens": _list,
    "auth_token_file": _text,
    "job_visibility": _lower,
    "groups": _text,
    "auth_admins": _list,
    "accounts": _lower,
    "login_ttl_sec": _FLOAT,
    "password_rounds": _INT,
    "audit_retention_sec": _FLOAT,
    "fair_share": _lower,
    "fair_share_half_life_sec": _FLOAT,
    "owner_weights": _text,
    "owner_max_running": _text,
    "priority_aging_sec": _FLOAT,
    "tls_cert": _text,
    "tls_key": _text,
    "tls_client_ca": _text,
    "worker_port": _INT,
    "autoscale_mode": _lower,
    "autoscale_interval_sec": _FLOAT,
    "queue_threshold_high": _INT,
    "queue_threshold_low": _INT,
    "min_workers": _INT,
    "max_workers": _INT,
    "scale_down_stable_sec": _FLOAT,
    "scale_cooldown_sec": _FLOAT,
    "scale_max_wait_sec": _FLOAT,
    "worker_image": _text,
    "worker_threads": _INT,
    "worker_network": _text,
    "autoscale_control_address": _text,
    "autoscale_group": _text,
    "autoscale_worker_memory_mb": _INT,
    "autoscale_tls_ca": _text,
    "autoscale_tls_cert": _text,
    "autoscale_tls_key": _text,
    "worker_token": _text,
    "notify_webhook_secret": _text,
}
