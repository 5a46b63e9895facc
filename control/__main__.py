"""``python -m control``: run one control plane until SIGTERM or SIGINT; SIGHUP re-reads CORRAL_AUTH_TOKEN_FILE.

Flags override the environment (:mod:`control.config`); every setting without a flag listed here has
``--SETTING-NAME`` (``--max-batch 500``). ``--check-config[=json]`` prints the effective settings and
exits 0, or the first bad one and exits 2 (``corral config --check``), as start-up would. A part that
cannot start (a port in use, a database another control plane holds) exits 1 with one line naming the setting;
a store that can no longer be written (a full disk) stops it with exit status 3.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import signal
import sys
from pathlib import Path

from control.app import ControlPlane, StartFailed
from control.config import ConfigError, ControlConfig
from corral import event_loop, gc_tuning, logs, open_files
from corral.cli.config_check import add_check_flag, add_setting_flags, check, flag_environ, flagged_fields

logger = logging.getLogger(__name__)

EXIT_STORE_FAILED = 3
"""Exit status when the store could not be written (see ControlPlane._refresh_readiness)."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The flags of ``argv`` (default ``sys.argv[1:]``); a flag not given is None, left to the environment."""
    p = argparse.ArgumentParser(prog="python -m control", description="Run the Corral control plane.")
    p.add_argument("--host", help="bind address (CORRAL_HOST, default 127.0.0.1)")
    p.add_argument("--grpc-port", type=int, help="gRPC port, 0 = any free port (CORRAL_GRPC_PORT, default 50051)")
    p.add_argument("--http-port", type=int, help="HTTP port (CORRAL_HTTP_PORT, default 8080)")
    p.add_argument("--db", help="SQLite file or postgresql:// URL (CORRAL_DB, default corral.db)")
    p.add_argument("--port-file", type=Path, help="write the bound gRPC port here once serving")
    p.add_argument("--http-port-file", type=Path, help="write the bound HTTP port here once serving")
    p.add_argument("--worker-port", type=int, help="mutual-TLS worker port (CORRAL_WORKER_PORT, default 50052)")
    p.add_argument("--worker-port-file", type=Path, help="write the bound worker port here (0 when not served)")
    p.add_argument("--log-level", help="debug|info|warning|error (CORRAL_LOG_LEVEL)")
    p.add_argument("--log-format", help="json|logfmt (CORRAL_LOG_FORMAT)")
    add_check_flag(p)
    add_setting_flags(p, ControlConfig)  # --FIELD-NAME for each setting without a flag of its own
    return p.parse_args(argv)


def _write_port(path: Path, port: int) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(str(port))
    os.replace(tmp, path)


async def serve(
    config: ControlConfig,
    port_file: Path | None,
    http_port_file: Path | None = None,
    worker_port_file: Path | None = None,
) -> int:
    """Run a control plane until SIGTERM or SIGINT (exit status 0) or until its store fails (3).

    The signals are handled from the start: a standby (see :mod:`control.store.postgres`) can wait in
    ``start`` for hours, and a stop must end that wait cleanly."""
    cp = ControlPlane(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    starting = asyncio.ensure_future(cp.start())
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait([starting, stopping], return_when=asyncio.FIRST_COMPLETED)
    if not starting.done():
        starting.cancel()
        await asyncio.gather(starting, return_exceptions=True)
        await cp.stop()
        return 0
    stopping.cancel()
    starting.result()  # StartFailed goes up to main()
    if http_port_file is not None:  # before the gRPC port file: that one says "serving" to waiters
        _write_port(http_port_file, cp.http_port)
    if worker_port_file is not None:
        _write_port(worker_port_file, cp.worker_port)
    if port_file is not None:
        _write_port(port_file, cp.grpc_port)
    loop.add_signal_handler(signal.SIGHUP, cp.reload_tokens)  # the usual "read your config again", not an exit
    waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(cp.failed.wait())]
    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    for waiting in waits:
        waiting.cancel()
    await cp.stop()
    if cp.failed.is_set():
        assert cp.store is not None
        print(
            f"corral control: the store cannot be written ({cp.store.failure}): stopped. What was committed is "
            "kept and running jobs keep running on their workers; start again once it can be written "
            "(a full disk, a read-only file system, a lost volume, a PostgreSQL session that ended).",
            file=sys.stderr,
        )
        return EXIT_STORE_FAILED
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run ``python -m control`` with ``argv`` (default ``sys.argv[1:]``) and return its exit status: 0, or
    1 when a part cannot start, 2 for a bad setting, 3 when the store can no longer be written."""
    args = parse_args(argv)
    environ = {**os.environ, **flag_environ(args, ControlConfig)}

    def build() -> ControlConfig:
        return ControlConfig.from_env(
            environ,
            host=args.host,
            grpc_port=args.grpc_port,
            http_port=args.http_port,
            worker_port=args.worker_port,
            db=args.db,
            log_level=args.log_level,
            log_format=args.log_format,
        )

    if args.check_config:
        return check(build, environ, flagged_fields(args, ControlConfig), (ConfigError,), args.check_config)
    try:
        config = build()
    except ConfigError as exc:
        print(f"corral control: configuration error: {exc}", file=sys.stderr)
        return 2
    logs.configure(config.log_level, config.log_format)
    open_files.raise_soft_limit()
    config = _fit_http_connections(config)
    gc_tuning.apply()
    try:
        code: int = event_loop.run(
            serve(config, args.port_file, args.http_port_file, args.worker_port_file), config.event_loop
        )
    except StartFailed as exc:
        print(f"corral control: cannot start: {exc}", file=sys.stderr)
        return 1
    return code


def _fit_http_connections(config: ControlConfig) -> ControlConfig:
    """``config`` with its HTTP connection cap lowered to what the open-file limit holds, said at warning
    level: REST watch streams filled the descriptors otherwise, and workers, gRPC clients and even the
    probes got nothing (the cap exists to keep those for them)."""
    fitted = open_files.fitted_http_connections(config.http_max_connections)
    if fitted == config.http_max_connections:
        return config
    logger.warning(
        logs.HTTP_CONNECTIONS_LOWERED,
        extra={
            "configured": config.http_max_connections or "no cap",
            "lowered_to": fitted,
            "open_files": open_files.soft_limit(),
            "kept_for_the_rest": open_files.CONTROL_RESERVE,
            "fix": "raise the open-file limit (ulimit -Hn, LimitNOFILE=) or lower CORRAL_HTTP_MAX_CONNECTIONS",
        },
    )
    return dataclasses.replace(config, http_max_connections=fitted)


if __name__ == "__main__":
    sys.exit(main())
