"""WorkerConfig: every setting of a worker agent, read from the environment once and checked then.

Flags of ``python -m worker`` override the environment: the command line writes them over a copy
of the environment before :meth:`WorkerConfig.from_env` reads it, so both go through the same rules
and a bad value is reported under the variable's name.

==========================  =====================================  ======================================
variable                    default                                rule
==========================  =====================================  ======================================
CORRAL_CONTROL_ADDR         127.0.0.1:50051                        HOST:PORT, port 1..65535; or a comma-
                                                                   separated list of up to 16 distinct
                                                                   ones (the worker fails over between them)
CORRAL_WORKER_THREADS       os.cpu_count() (at most 1024)          integer 1..1024
CORRAL_WORKER_SLOTS         = threads                              integer 1..1024, and at most what the
                                                                   open-file hard limit (ulimit -Hn)
                                                                   holds: 3 per slot and 72 more
CORRAL_WORKER_GPUS          CUDA_VISIBLE_DEVICES, else the count   integer 0..64 (devices 0..N-1), or a
                            of /proc/driver/nvidia/gpus/, else 0   comma-separated list of up to 64
                                                                   distinct device ids (1..64 printable
                                                                   ASCII characters, no space or comma)
CORRAL_WORKER_MEMORY_MB     physical memory or the cgroup limit,   integer 1..1073741824 (MiB)
                            the smaller
CORRAL_WORKER_ID            <hostname>-<pid>-<random>              [A-Za-z0-9._:-]{1,128}
CORRAL_WORKER_LABELS        (none)                                 k=v,k=v (keys unique, non-empty)
CORRAL_WORKER_IMPORTS       (none)                                 comma-separated module names
CORRAL_DRAIN_TIMEOUT_SEC    30                                     number >= 0
CORRAL_KILL_GRACE_SEC       0.025                                  number >= 0
CORRAL_RECONNECT_MAX_SEC    2.0                                    number > 0
CORRAL_RUNNER_MAX_JOBS      0 (never)                              integer >= 0: replace a runner process
                                                                   after this many jobs
CORRAL_RUNNER_MAX_RSS_MB    0 (never)                              integer >= 0: replace a runner process
                                                                   after a job that left it this large
CORRAL_JOB_MEMORY_LIMIT_MB  0 (no limit)                           integer 0..1073741824 (MiB) and at most
                                                                   the RLIMIT_AS hard limit (ulimit -Hv):
                                                                   what each job may allocate beyond an
                                                                   idle runner process (runner.limits)
CORRAL_LOG_LEVEL            info                                   debug | info | warning | error
CORRAL_LOG_FORMAT           json                                   json | logfmt
CORRAL_WORKER_TOKEN         (none)                                 the control plane's worker token
CORRAL_TLS_CA               (none)                                 readable PEM file: TLS, verifying the
                                                                   control plane against this CA
CORRAL_WORKER_TLS_CERT      (none)                                 readable PEM file: this worker's client
                                                                   certificate (mutual TLS); with the key
CORRAL_WORKER_TLS_KEY       (none)                                 readable PEM file: its private key
==========================  =====================================  ======================================

Several control-plane addresses (``a:50051,b:50051``) are for a standby control plane on the same
database: the worker uses one at a time and, when a session cannot be made or ends, tries the next
(see :mod:`worker.connection`). Each entry follows the single-address rule; an empty entry or an address
listed twice is refused, since either is a typo that would silently weaken the failover.

GPUs: the worker hands each job that asks for GPUs that many of its free devices (see
:mod:`worker.pool`) and shows the job only those, through ``CUDA_VISIBLE_DEVICES``. A single integer
is a count, so one device other than ``0`` is given by its UUID (``nvidia-smi -L``), e.g.
``GPU-8f6c1e2a-...``. Unset, the worker takes the devices an orchestrator gave it in its own
``CUDA_VISIBLE_DEVICES`` (an empty list, ``-1`` or ``NoDevFiles`` there is passed over), else one
device per entry of ``/proc/driver/nvidia/gpus/`` (the NVIDIA driver lists each GPU there), else none.
Memory is only counted (the control plane places jobs that ask for memory within it); unset, it is what
the worker may use: the machine's memory, or its cgroup's limit when that is lower.

TLS is on when CORRAL_TLS_CA or a client certificate is set (without CORRAL_TLS_CA the system's CAs
verify the control plane). With mutual TLS the worker connects to the control plane's worker port
(CORRAL_WORKER_PORT there), not its client port.
"""

from __future__ import annotations

import math
import os
import re
import secrets
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from corral import open_files
from corral.addresses import MAX_ADDRESSES, AddressError, parse_addresses
from corral.event_loop import LOOPS
from corral.limits import (
    DEFAULT_OUTPUT_BYTES,
    MAX_LABEL_KEY,
    MAX_LABEL_VALUE,
    MAX_LABELS,
    MAX_MEMORY_MB,
    MAX_OUTPUT_BYTES,
    MAX_THREADS,
)
from corral.logs import FORMATS, LEVELS
from corral.resources import ResourceError, check_gpus, detect_gpus, detect_memory_mb, parse_gpus
from runner.limits import MIB, hard_limit_bytes

__all__ = ["ConfigError", "WorkerConfig"]

_WORKER_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
MAX_CONTROL_ADDRS = MAX_ADDRESSES
"""Most entries in CORRAL_CONTROL_ADDR: a control plane and its standbys, not a fleet to scan."""
MAX_RECYCLE = 1 << 31
"""Upper bound of CORRAL_RUNNER_MAX_JOBS and CORRAL_RUNNER_MAX_RSS_MB (beyond it, say 0: never)."""
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


class ConfigError(ValueError):
    """Raised when a setting breaks its rule; the message names the variable and the rule."""


_T = TypeVar("_T")


def _setting(make: Callable[..., _T], *args: Any) -> _T:
    """``make(*args)``, its :class:`ResourceError` raised as the worker's :class:`ConfigError`."""
    try:
        return make(*args)
    except ResourceError as exc:
        raise ConfigError(str(exc)) from None


def default_worker_id() -> str:
    """``<hostname>-<pid>-<6 hex>``: unique per agent process, stable for its life."""
    host = re.sub(r"[^A-Za-z0-9._:-]", "-", socket.gethostname()) or "worker"
    return f"{host[:64]}-{os.getpid()}-{secrets.token_hex(3)}"


@dataclass(frozen=True)
class WorkerConfig:
    """The settings of one worker agent."""

    control_addr: str = "127.0.0.1:50051"
    """CORRAL_CONTROL_ADDR: the control plane's gRPC address, HOST:PORT, or a comma-separated list of
    them (a control plane and its standbys; kept as ``a:1,b:2``, see :attr:`control_addrs`)."""
    threads: int = field(default_factory=lambda: min(os.cpu_count() or 1, MAX_THREADS))
    """CORRAL_WORKER_THREADS: threads this worker gives to jobs in total (>= 1)."""
    slots: int = 0
    """CORRAL_WORKER_SLOTS: runner processes = jobs run at once (>= 1; 0 here means "= threads")."""
    gpus: tuple[str, ...] = field(default_factory=lambda: _setting(detect_gpus))
    """CORRAL_WORKER_GPUS: the ids of the GPU devices this worker gives to jobs, in the order they are
    handed out (a count N is ``("0", ..., "N-1")``; empty: none)."""
    memory_mb: int = field(default_factory=lambda: detect_memory_mb())
    """CORRAL_WORKER_MEMORY_MB: memory this worker gives to jobs, in MiB (1..MAX_MEMORY_MB)."""
    worker_id: str = field(default_factory=default_worker_id)
    """CORRAL_WORKER_ID: the id the worker registers under, stable across reconnects."""
    labels: Mapping[str, str] = field(default_factory=dict)
    """CORRAL_WORKER_LABELS: k=v,k=v labels sent at registration."""
    imports: tuple[str, ...] = ()
    """CORRAL_WORKER_IMPORTS: plug-in modules that register more job types."""
    drain_timeout_sec: float = 30.0
    """CORRAL_DRAIN_TIMEOUT_SEC: how long a drain lets running jobs finish (>= 0)."""
    kill_grace_sec: float = 0.025
    """CORRAL_KILL_GRACE_SEC: SIGTERM -> SIGKILL grace when a job is killed (>= 0)."""
    reconnect_max_sec: float = 2.0
    """CORRAL_RECONNECT_MAX_SEC: cap of the reconnect backoff (> 0)."""
    runner_max_jobs: int = 0
    """CORRAL_RUNNER_MAX_JOBS: a runner process is replaced after this many jobs (>= 0; 0: never)."""
    runner_max_rss_mb: int = 0
    """CORRAL_RUNNER_MAX_RSS_MB: a runner process is replaced after a job that left it using more
    resident memory than this, in MiB (>= 0; 0: never); the job's own answer is kept."""
    job_memory_limit_mb: int = 0
    """CORRAL_JOB_MEMORY_LIMIT_MB: MiB each job may allocate beyond an idle runner process (0: no limit;
    at most MAX_MEMORY_MB, and the RLIMIT_AS hard limit the worker and its runners have); see
    :mod:`runner.limits`."""
    job_output_bytes: int = DEFAULT_OUTPUT_BYTES
    """CORRAL_JOB_OUTPUT_BYTES: how much of what a job prints (its sys.stdout and sys.stderr) is kept
    with each attempt, the end of it (0 to 1 MiB; 0: nothing is caught)."""
    log_level: str = "info"
    """CORRAL_LOG_LEVEL: debug | info | warning | error."""
    log_format: str = "json"
    """CORRAL_LOG_FORMAT: json | logfmt; one event per line either way."""
    event_loop: str = "uvloop"
    """CORRAL_EVENT_LOOP: uvloop | asyncio; the event loop the agent runs on (corral.event_loop)."""
    token: str = field(default="", repr=False)
    """CORRAL_WORKER_TOKEN: sent as ``authorization: Bearer <token>`` on the worker stream."""
    tls_ca: str = ""
    """CORRAL_TLS_CA: PEM CA certificates that verify the control plane (turns TLS on)."""
    tls_cert: str = ""
    """CORRAL_WORKER_TLS_CERT: PEM client certificate for mutual TLS (with CORRAL_WORKER_TLS_KEY)."""
    tls_key: str = ""
    """CORRAL_WORKER_TLS_KEY: the PEM private key of CORRAL_WORKER_TLS_CERT."""

    @property
    def control_addrs(self) -> tuple[str, ...]:
        """The addresses of CORRAL_CONTROL_ADDR in order (one for a single address)."""
        return tuple(self.control_addr.split(","))

    @property
    def tls(self) -> bool:
        """Whether the worker speaks TLS to the control plane."""
        return bool(self.tls_ca or self.tls_cert)

    def __post_init__(self) -> None:
        """Apply the derived default (slots = threads) and check every rule."""
        if self.slots == 0:
            object.__setattr__(self, "slots", self.threads)
        # Normalised ("a:1, b:2" -> "a:1,b:2") so that control_addrs can split it back.
        object.__setattr__(self, "control_addr", ",".join(parse_control_addrs(self.control_addr)))
        if not 1 <= self.threads <= MAX_THREADS:
            raise ConfigError(f"CORRAL_WORKER_THREADS must be 1..{MAX_THREADS}, got {self.threads}")
        if not 1 <= self.slots <= MAX_THREADS:
            raise ConfigError(f"CORRAL_WORKER_SLOTS must be 1..{MAX_THREADS}, got {self.slots}")
        object.__setattr__(self, "gpus", tuple(self.gpus))
        _setting(check_gpus, self.gpus, "CORRAL_WORKER_GPUS")
        if not 1 <= self.memory_mb <= MAX_MEMORY_MB:
            raise ConfigError(f"CORRAL_WORKER_MEMORY_MB must be 1..{MAX_MEMORY_MB} (MiB), got {self.memory_mb}")
        if not _WORKER_ID.fullmatch(self.worker_id):
            raise ConfigError(f"CORRAL_WORKER_ID must match [A-Za-z0-9._:-]{{1,128}}, got {self.worker_id!r}")
        if len(self.labels) > MAX_LABELS:
            first = ", ".join(list(self.labels)[:3])
            raise ConfigError(
                f"CORRAL_WORKER_LABELS may hold at most {MAX_LABELS} labels, got {len(self.labels)} ({first}, ...)"
            )
        for key, text in self.labels.items():
            if not key or "=" in key or "," in key:
                raise ConfigError(f"CORRAL_WORKER_LABELS keys must be non-empty without '=' or ',', got {key!r}")
            if len(key) > MAX_LABEL_KEY or len(text) > MAX_LABEL_VALUE or "\x00" in key + text:
                raise ConfigError(
                    f"CORRAL_WORKER_LABELS keys must be at most {MAX_LABEL_KEY} characters and values at most "
                    f"{MAX_LABEL_VALUE}, without NUL, got {key!r} ({len(key)}) = {len(text)} characters"
                )
        for module in self.imports:
            if not _MODULE.fullmatch(module):
                raise ConfigError(f"CORRAL_WORKER_IMPORTS must list dotted module names, got {module!r}")
        if self.log_level not in LEVELS:
            raise ConfigError(f"CORRAL_LOG_LEVEL must be debug, info, warning or error, got {self.log_level!r}")
        if self.log_format not in FORMATS:
            raise ConfigError(f"CORRAL_LOG_FORMAT must be json or logfmt, got {self.log_format!r}")
        if self.event_loop not in LOOPS:
            raise ConfigError(f"CORRAL_EVENT_LOOP must be uvloop or asyncio, got {self.event_loop!r}")
        for name, value, low, strict in (
            ("CORRAL_DRAIN_TIMEOUT_SEC", self.drain_timeout_sec, 0.0, False),
            ("CORRAL_KILL_GRACE_SEC", self.kill_grace_sec, 0.0, False),
            ("CORRAL_RECONNECT_MAX_SEC", self.reconnect_max_sec, 0.0, True),
        ):
            if not math.isfinite(value) or value < low or (strict and value == low):
                raise ConfigError(f"{name} must be {'>' if strict else '>='} {low:g}, got {value}")
        for name, count in (
            ("CORRAL_RUNNER_MAX_JOBS", self.runner_max_jobs),
            ("CORRAL_RUNNER_MAX_RSS_MB", self.runner_max_rss_mb),
        ):
            if not 0 <= count <= MAX_RECYCLE:
                raise ConfigError(f"{name} must be 0 (never) to {MAX_RECYCLE}, got {count}")
        self._check_job_memory_limit()
        self._check_open_files()
        if not 0 <= self.job_output_bytes <= MAX_OUTPUT_BYTES:
            raise ConfigError(
                f"CORRAL_JOB_OUTPUT_BYTES must be 0 (keep none) to {MAX_OUTPUT_BYTES}, got {self.job_output_bytes}"
            )
        if self.token and not all("!" <= c <= "~" for c in self.token):
            raise ConfigError("CORRAL_WORKER_TOKEN must be printable ASCII without spaces")
        if bool(self.tls_cert) != bool(self.tls_key):
            given, missing = ("CERT", "KEY") if self.tls_cert else ("KEY", "CERT")
            raise ConfigError(f"CORRAL_WORKER_TLS_{missing} must be set together with CORRAL_WORKER_TLS_{given}")
        for name, path in (
            ("CORRAL_TLS_CA", self.tls_ca),
            ("CORRAL_WORKER_TLS_CERT", self.tls_cert),
            ("CORRAL_WORKER_TLS_KEY", self.tls_key),
        ):
            if path and not os.access(path, os.R_OK):
                raise ConfigError(f"{name} must be a readable file, got {path!r}")

    def _check_job_memory_limit(self) -> None:
        """Refuse a CORRAL_JOB_MEMORY_LIMIT_MB that every runner process would fail to apply."""
        limit_mb = self.job_memory_limit_mb
        if not 0 <= limit_mb <= MAX_MEMORY_MB:
            raise ConfigError(
                f"CORRAL_JOB_MEMORY_LIMIT_MB must be 0 (no limit) to {MAX_MEMORY_MB} (MiB), got {limit_mb}"
            )
        hard = hard_limit_bytes()
        if hard is not None and limit_mb * MIB > hard:
            raise ConfigError(
                "CORRAL_JOB_MEMORY_LIMIT_MB must be at most the worker's address-space hard limit "
                f"(RLIMIT_AS, ulimit -Hv) of {hard // MIB} MiB, got {limit_mb}"
            )

    def _check_open_files(self) -> None:
        """Refuse more runner processes than the worker's hard open-file limit can hold, which it raises
        its soft limit to as it starts (:mod:`corral.open_files`): it would fail part-way through starting
        them, or later, when gRPC aborts the process for want of a descriptor to reconnect with."""
        most = open_files.most_slots()
        if most is not None and self.slots > most:
            raise ConfigError(
                f"CORRAL_WORKER_SLOTS (= CORRAL_WORKER_THREADS unless set) of {self.slots} needs "
                f"{open_files.needed_by_worker(self.slots)} open files, more than the worker's hard limit "
                f"(RLIMIT_NOFILE, ulimit -Hn) of {open_files.hard_limit()}: at most {most} slots fit; lower it "
                "or raise the limit"
            )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> WorkerConfig:
        """Build the config from ``environ`` (default ``os.environ``); unset or empty -> default.

        Raises:
            ConfigError: a value is malformed or breaks its rule (the message names the variable).
        """
        env = os.environ if environ is None else environ

        def get(name: str) -> str | None:
            value = env.get(name, "").strip()
            return value or None

        kwargs: dict[str, object] = {}
        if (addr := get("CORRAL_CONTROL_ADDR")) is not None:
            kwargs["control_addr"] = addr
        if (threads := get("CORRAL_WORKER_THREADS")) is not None:
            kwargs["threads"] = _int("CORRAL_WORKER_THREADS", threads)
        if (slots := get("CORRAL_WORKER_SLOTS")) is not None:
            kwargs["slots"] = _int("CORRAL_WORKER_SLOTS", slots)
            if kwargs["slots"] == 0:
                raise ConfigError(f"CORRAL_WORKER_SLOTS must be 1..{MAX_THREADS}, got 0")
        gpus = get("CORRAL_WORKER_GPUS")
        kwargs["gpus"] = _setting(detect_gpus, env) if gpus is None else _setting(parse_gpus, gpus)
        if (memory_mb := get("CORRAL_WORKER_MEMORY_MB")) is not None:
            kwargs["memory_mb"] = _int("CORRAL_WORKER_MEMORY_MB", memory_mb)
        for name, attr in (
            ("CORRAL_RUNNER_MAX_JOBS", "runner_max_jobs"),
            ("CORRAL_RUNNER_MAX_RSS_MB", "runner_max_rss_mb"),
            ("CORRAL_JOB_OUTPUT_BYTES", "job_output_bytes"),
        ):
            if (raw := get(name)) is not None:
                kwargs[attr] = _int(name, raw)
        if (raw := get("CORRAL_JOB_MEMORY_LIMIT_MB")) is not None:
            kwargs["job_memory_limit_mb"] = _int("CORRAL_JOB_MEMORY_LIMIT_MB", raw, "an integer number of MiB")
        if (worker_id := get("CORRAL_WORKER_ID")) is not None:
            kwargs["worker_id"] = worker_id
        if (labels := get("CORRAL_WORKER_LABELS")) is not None:
            kwargs["labels"] = parse_labels(labels.split(","), "CORRAL_WORKER_LABELS")
        if (imports := get("CORRAL_WORKER_IMPORTS")) is not None:
            kwargs["imports"] = tuple(m.strip() for m in imports.split(",") if m.strip())
        for name, attr in (
            ("CORRAL_DRAIN_TIMEOUT_SEC", "drain_timeout_sec"),
            ("CORRAL_KILL_GRACE_SEC", "kill_grace_sec"),
            ("CORRAL_RECONNECT_MAX_SEC", "reconnect_max_sec"),
        ):
            if (raw := get(name)) is not None:
                kwargs[attr] = _float(name, raw)
        for name, attr in (
            ("CORRAL_LOG_LEVEL", "log_level"),
            ("CORRAL_LOG_FORMAT", "log_format"),
            ("CORRAL_EVENT_LOOP", "event_loop"),
        ):
            if (raw := get(name)) is not None:
                kwargs[attr] = raw.lower()
        for name, attr in (
            ("CORRAL_WORKER_TOKEN", "token"),
            ("CORRAL_TLS_CA", "tls_ca"),
            ("CORRAL_WORKER_TLS_CERT", "tls_cert"),
            ("CORRAL_WORKER_TLS_KEY", "tls_key"),
        ):
            if (raw := get(name)) is not None:
                kwargs[attr] = raw
        return cls(**kwargs)  # type: ignore[arg-type]


def parse_labels(items: list[str], name: str = "CORRAL_WORKER_LABELS") -> dict[str, str]:
    """``["k=v", ...]`` -> ``{"k": "v"}``; blank items are skipped.

    Raises:
        ConfigError: an item has no '=' or an empty key, or a key repeats.
    """
    labels: dict[str, str] = {}
    for item in items:
        item = item.strip()
        if not item:
            continue
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"{name} must be k=v pairs, got {item!r}")
        if key in labels:
            raise ConfigError(f"{name} repeats the key {key!r}")
        labels[key] = value.strip()
    return labels


def parse_control_addrs(raw: str, name: str = "CORRAL_CONTROL_ADDR") -> tuple[str, ...]:
    """``"a:1, b:2"`` -> ``("a:1", "b:2")``: each entry HOST:PORT with a port in 1..65535.

    The rule is :func:`corral.addresses.parse_addresses`, shared with the client and the CLI.

    Raises:
        ConfigError: an entry breaks the rule or is empty, an address is listed twice, or there are
            more than MAX_CONTROL_ADDRS entries.
    """
    try:
        return parse_addresses(raw, name)
    except AddressError as exc:
        raise ConfigError(str(exc)) from None


def _int(name: str, raw: str, what: str = "an integer") -> int:
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be {what}, got {raw!r}") from None


def _float(name: str, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number, got {raw!r}") from None
    if not math.isfinite(value):  # "inf >= 0" would pass the range rules
        raise ConfigError(f"{name} must be a finite number, got {raw!r}")
    return value
