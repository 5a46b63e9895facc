"""ControlPlane: the composition root. It builds the components, starts them in dependency order
(store -> scheduler -> sessions/reaper -> gRPC server -> HTTP gateway) and stops them in reverse.

On a shared store a standby control plane waits in :meth:`ControlPlane.start` until it leads the
store (see :mod:`control.store.postgres`), meanwhile answering health checks only on its ports
(:mod:`control.standby`); the parts above start once it leads."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import sqlite3
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import TYPE_CHECKING, TypeVar

import grpc

from control.admission import IdempotencySweeper
from control.api import (
    MAX_MESSAGE_BYTES,
    SERVICES,
    AccountServicer,
    AdminServicer,
    Health,
    JobServicer,
    WorkerServicer,
    add_port,
    create_server,
    server_credentials,
)
from control.audit import AuditLog
from control.auth import Authenticator
from control.autoscale import Autoscaler
from control.clock import Clock, SystemClock
from control.config import ControlConfig
from control.gateway import Gateway, HttpLimits, InProcess, Invoker, Loopback, http_routes
from control.metrics import Metrics
from control.reaper import Reaper
from control.retention import RetentionSweeper
from control.scheduler import Scheduler
from control.sessions import WorkerSessions
from control.share_history import ShareHistory
from control.standby import StandbyFront
from control.store import Store, open_store
from control.tls import ServerTls
from control.token_reload import TokenFileWatcher
from corral import logs
from corral.dburl import describe
from corral.transport import host_port, loopback

if TYPE_CHECKING:
    from control.accounts import Accounts

_T = TypeVar("_T")

logger = logging.getLogger(__name__)


class StartFailed(Exception):
    """Raised by :meth:`ControlPlane.start` when a part cannot start; the message names the setting."""


@contextlib.contextmanager
def _readable(db: str) -> Iterator[None]:
    """A database found damaged as it is read at start-up (SQLite reads a page only when it needs it)
    as StartFailed naming it, not a traceback."""
    try:
        yield
    except sqlite3.DatabaseError as exc:
        raise StartFailed(f"cannot read the database {describe(db)}: {exc} (CORRAL_DB, --db)") from exc


def _started(open_part: Callable[[], _T], settings: str) -> _T:
    """``open_part()``, its OSError turned into StartFailed naming ``settings``."""
    try:
        return open_part()
    except OSError as exc:
        raise StartFailed(f"{exc} ({settings})") from exc


class ControlPlane:
    """One control-plane process: ``async with ControlPlane(config) as cp: ...``."""

    def __init__(self, config: ControlConfig, clock: Clock | None = None, rng: random.Random | None = None) -> None:
        self.config = config
        self.clock = clock or SystemClock()
        self.rng = rng
        self.grpc_port = 0
        self.http_port = 0
        self.worker_port = 0
        """The mutual-TLS port for workers (0: not served; only with CORRAL_TLS_CLIENT_CA)."""
        self.store: Store | None = None
        self.scheduler: Scheduler | None = None
        self.health = Health()
        self.metrics = Metrics()
        self.gateway: Gateway | None = None
        self.autoscaler: Autoscaler | None = None
        self.token_watcher: TokenFileWatcher | None = None
        """Reloads CORRAL_AUTH_TOKEN_FILE (set when that file is in use)."""
        self.accounts: Accounts | None = None
        """The accounts people log in to (CORRAL_ACCOUNTS; None when off)."""
        self.share_history: ShareHistory | None = None
        """Fair share's history, kept in the store (control.share_history)."""
        self._server: grpc.aio.Server | None = None
        self.failed = asyncio.Event()
        """Set when the store could not be written: the process should stop (see _refresh_readiness)."""
        self._tasks: list[asyncio.Task[None]] = []
        self._reaping: asyncio.Task[None] | None = None
        self._stopped = False
        self._standby: StandbyFront | None = None
        """What a standby serves while it waits to lead (see control.standby)."""

    async def start(self) -> None:
        """Open the store, serve gRPC and HTTP, start the background loops.

        Raises:
            StartFailed: a part cannot start (a port in use, a database that cannot be opened or that
                another control plane holds); what had started is stopped again.
        """
        try:
            await self._start()
        except StartFailed:
            await self.stop()
            raise

    async def _start(self) -> None:
        cfg = self.config
        self.store = _started(lambda: open_store(cfg.db, sync=cfg.db_sync), "CORRAL_DB, --db")
        tls = ServerTls.load(cfg.tls_cert, cfg.tls_key, cfg.tls_client_ca) if cfg.tls_cert else None
        try:
            # A standby waits here, answering health checks only (control.standby), until the leader has gone.
            await self.store.lead(lambda leader: self._stand_by(leader, tls))
        except OSError as exc:
            raise StartFailed(f"{exc} (CORRAL_DB, --db)") from exc
        finally:
            if self._standby is not None:
                await self._standby.stop()
                self._standby = None
        self.metrics.active.set(1)
        with _readable(cfg.db):  # what it loads may find a damaged page
            scheduler = self.scheduler = Scheduler(self.store, cfg, self.clock, self.rng)
            scheduler.metrics = self.metrics
            self.metrics.watch(scheduler, lambda: self.not_ready_reason() is None)
            if scheduler.exec_limits is not None:
                self.metrics.watch_exec_limits(scheduler.exec_limits)
            scheduler.recover()
            self.share_history = ShareHistory(scheduler.usage, self.store, self.clock)
            self.share_history.load()
            sessions = WorkerSessions(scheduler)
            reaper = Reaper(scheduler)
            self.autoscaler = Autoscaler(cfg, scheduler, sessions, self.metrics, self.clock)
            scheduler.on_change = self._update_readiness
            accounts = self.accounts = self._accounts()
        audit = AuditLog(self.store, self.clock, cfg.audit_retention_sec)
        auth = Authenticator.from_config(cfg, accounts)
        servicers = (
            JobServicer(scheduler, audit, auth),
            WorkerServicer(sessions),
            AdminServicer(sessions, autoscaler=self.autoscaler, audit=audit),
            AccountServicer(accounts, scheduler.access, audit),
        )
        if accounts is not None and auth is not None:
            accounts.reserved = lambda: auth.token_names
        if auth is not None:
            auth.on_refused = lambda role: self.metrics.auth_refused.labels(role.value).inc()
            if cfg.auth_token_file:
                self.token_watcher = TokenFileWatcher(auth, cfg.auth_tokens, cfg.auth_token_file, self.metrics)
        server = self._server = create_server(*servicers, self.health, auth=auth)
        credentials = server_credentials(tls) if tls else None
        self.grpc_port = _started(
            lambda: add_port(server, host_port(cfg.host, cfg.grpc_port), credentials), "CORRAL_GRPC_PORT, --grpc-port"
        )
        if tls is not None and tls.client_ca is not None:
            mutual = server_credentials(tls, require_client_cert=True)
            self.worker_port = _started(
                lambda: add_port(server, host_port(cfg.host, cfg.worker_port), mutual),
                "CORRAL_WORKER_PORT, --worker-port",
            )
        bridge_target = host_port(loopback(cfg.host), self.grpc_port)
        if tls is not None and cfg.gateway_mode == "loopback":
            # The bridge's own way in, plaintext on 127.0.0.1 only: tokens are still checked there, and no
            # worker passes the certificate check on it (no TLS session, no verified certificate).
            bridge_target = f"127.0.0.1:{add_port(self._server, '127.0.0.1:0', None)}"
        await self._server.start()
        await self.health.start()
        invoker: Invoker
        if cfg.gateway_mode == "loopback":
            invoker = Loopback(bridge_target, MAX_MESSAGE_BYTES)
        else:
            invoker = InProcess({s.full_name: servicer for s, servicer in zip(SERVICES, servicers, strict=True)})
        self.gateway = Gateway(
            cfg.host,
            cfg.http_port,
            invoker,
            http_routes(SERVICES),
            self.readiness,
            self.metrics,
            cfg.http_max_body_bytes,
            cfg.shutdown_grace_sec,
            auth=auth,
            ssl_context=tls.ssl_context() if tls else None,
            limits=HttpLimits.from_config(cfg),
        )
        try:
            await self.gateway.start()
        except OSError as exc:
            raise StartFailed(f"{exc} (CORRAL_HTTP_PORT, --http-port)") from exc
        self.http_port = self.gateway.port
        self._reaping = asyncio.ensure_future(reaper.run())
        self._tasks = [
            asyncio.ensure_future(scheduler.run_timer()),
            self._reaping,
            asyncio.ensure_future(IdempotencySweeper(scheduler.idempotency, self.store, self.clock).run()),
            asyncio.ensure_future(
                RetentionSweeper(
                    scheduler, self.clock, succeeded_sec=cfg.job_retention_sec, failed_sec=cfg.failed_retention_sec
                ).run()
            ),
            asyncio.ensure_future(self._refresh_readiness()),
            asyncio.ensure_future(audit.run()),
            asyncio.ensure_future(self.share_history.run()),
        ]
        if self.token_watcher is not None:
            self._tasks.append(asyncio.ensure_future(self.token_watcher.run()))
        scheduler.dispatch_soon()
        await self.autoscaler.start(self.grpc_port, self.worker_port)
        logger.info(
            logs.CONTROL_STARTED,
            extra={
                "grpc": host_port(cfg.host, self.grpc_port),
                "http": host_port(cfg.host, self.http_port),
                "worker_grpc": host_port(cfg.host, self.worker_port) if self.worker_port else "",
                "tls": tls is not None,
                "auth": auth is not None,
                "db": describe(cfg.db),
                "recovered_jobs": len(scheduler.active),
            },
        )

    async def _stand_by(self, leader: str, tls: ServerTls | None) -> None:
        cfg = self.config
        self._standby = StandbyFront(
            host=cfg.host,
            grpc_port=cfg.grpc_port,
            http_port=cfg.http_port,
            worker_port=cfg.worker_port if tls is not None and tls.client_ca is not None else None,
            tls=tls,
            services=list(SERVICES),
            metrics=self.metrics,
            leader=leader,
            http_max_body_bytes=cfg.http_max_body_bytes,
            http_limits=HttpLimits.from_config(cfg),
        )
        try:
            await self._standby.start()
        except OSError as exc:
            raise StartFailed(f"{exc} (a standby serves health on the control plane's ports)") from exc

    def reload_tokens(self) -> None:
        """Read CORRAL_AUTH_TOKEN_FILE again now (SIGHUP); see :mod:`control.token_reload`."""
        if self.token_watcher is None:
            logger.info(logs.AUTH_TOKENS_RELOADED, extra={"why": "signal", "tokens": 0, "note": "no token file set"})
            return
        self.token_watcher.reload_soon()

    def not_ready_reason(self) -> str | None:
        """None while ready (a connected worker takes work, the store can be written, not shutting
        down), else why not: the rule of both /readyz and the gRPC readiness service."""
        s = self.scheduler
        if s is None:
            return "starting"
        if self.health.shutting_down:
            return "shutting down"
        if not s.store.healthy:
            return "the store cannot be written"
        if not any(w.connected and not w.draining for w in s.registry.all()):
            return "no worker takes work"
        return None

    def readiness(self) -> str | None:
        """:meth:`not_ready_reason`, also pushed to the gRPC health service."""
        reason = self.not_ready_reason()
        self.health.update(reason is None)
        return reason

    def _update_readiness(self) -> None:
        self.readiness()

    async def _refresh_readiness(self) -> None:
        """Re-check readiness every second: a store that stops accepting writes raises no event.

        Such a store stops the control plane (:attr:`failed`): what it holds in memory is then ahead
        of what was committed, and only a restart from the store is consistent again. Nothing
        committed is lost, workers keep their running jobs for the next control plane, and an
        orchestrator's restart (or the operator's, once the disk has room) brings it back."""
        while True:
            await asyncio.sleep(1.0)
            self._update_readiness()
            store = self.store
            if store is not None and not store.healthy and not self.failed.is_set():
                logger.critical(logs.STORE_FAILED, extra={"error": store.failure, "db": describe(self.config.db)})
                self.failed.set()

    async def wait(self) -> None:
        """Block until the server terminates."""
        if self._server is not None:
            await self._server.wait_for_termination()

    def _accounts(self) -> Accounts | None:
        """The accounts (CORRAL_ACCOUNTS), read from the store that this process now leads."""
        cfg = self.config
        if cfg.accounts == "off" or self.store is None:
            return None
        from control.accounts import Accounts  # bcrypt and the JWT library only where accounts are on

        accounts = Accounts(self.store, cfg.accounts, cfg.login_ttl_sec, cfg.password_rounds, clock=self.clock)
        accounts.on_login = lambda outcome: self.metrics.logins.labels(outcome).inc()
        return accounts

    async def stop(self) -> None:
        """Stop intake, let in-flight calls finish (up to the shutdown grace), persist, close. Idempotent.

        Running jobs stay RUNNING: their workers keep them going, reconnect to the next control plane
        and are re-adopted there, so a restart re-runs nothing."""
        if self._stopped:
            return
        self._stopped = True
        logger.info(logs.CONTROL_STOPPING)
        if self.autoscaler is not None:  # first: no container is started or removed while stopping
            await self.autoscaler.stop()
        if self._server is not None:
            await self.health.shutdown()
            if self.scheduler is not None:
                # Before the HTTP side stops too: an open watch, gRPC or REST, would hold it for the whole grace.
                self.scheduler.watchers.close()
            if self.gateway is not None:
                await self.gateway.stop()
            if self.scheduler is not None:
                # The reaper stops first: the workers cannot be heard from once their streams close, and a
                # grace longer than the heartbeat timeout would have it fail every running job as lost.
                if self._reaping is not None:
                    self._reaping.cancel()
                for w in self.scheduler.registry.all():
                    if w.link is not None:
                        w.link.close()
            await self._server.stop(self.config.shutdown_grace_sec)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.store is not None:
            if self.share_history is not None:
                self.share_history.save()
            try:
                await self.store.commit()
            except Exception:
                logger.exception("final_commit_failed")
            self.store.close()
        if self.accounts is not None:
            self.accounts.close()
        logger.info(logs.CONTROL_STOPPED)

    async def __aenter__(self) -> ControlPlane:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()
