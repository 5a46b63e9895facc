"""``python -m worker``: run one worker agent until it is drained or stopped.

Usage::

    python -m worker [--control HOST:PORT[,HOST:PORT...]] [--threads N] [--slots N] [--gpus N|ID,ID...]
                     [--memory-mb MIB] [--worker-id ID] [--label k=v]... [--import MODULE]... [--drain-timeout SEC] [--log-level info]
                     [--log-format json|logfmt] [--token TOKEN] [--tls-ca FILE] [--tls-cert FILE --tls-key FILE]

Flags override the environment (see :mod:`worker.config` for every variable, default and rule);
a setting without a flag listed here has ``--SETTING-NAME`` (``--kill-grace-sec 0.1``).
``--check-config[=json]`` prints the effective settings and exits 0, or the first bad one and exits 2
(``corral config --check --worker``).
Signals: the first SIGTERM, SIGINT or SIGHUP (a closed terminal) drains (finish running jobs up to the drain timeout, hand back
the rest) and exits 0; a second one stops at once. A bad setting exits 2 with a message naming the
variable, and so does a plug-in that does not import (it would fail the same way on every restart);
runner processes that cannot start for another reason (not ready in time, killed) exit 1.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Mapping

from corral import event_loop, gc_tuning, open_files
from corral.cli.config_check import add_check_flag, add_setting_flags, check, flag_environ, flagged_fields
from corral.logs import configure
from worker.agent import Agent
from worker.config import ConfigError, WorkerConfig, parse_labels
from worker.pool import RunnerStartError

logger = logging.getLogger("worker")

EXIT_OK = 0
EXIT_START_FAILED = 1
EXIT_BAD_CONFIG = 2


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m worker", description="Run a Corral worker agent.")
    p.add_argument(
        "--control",
        metavar="HOST:PORT[,...]",
        help="control plane address, or a comma-separated list: a control plane and its standbys (CORRAL_CONTROL_ADDR)",
    )
    p.add_argument("--threads", metavar="N", help="threads for jobs in total (CORRAL_WORKER_THREADS)")
    p.add_argument("--slots", metavar="N", help="runner processes (CORRAL_WORKER_SLOTS, default = threads)")
    p.add_argument(
        "--gpus",
        metavar="N|ID,ID",
        help="GPUs for jobs: a count or the device ids (CORRAL_WORKER_GPUS, default: found)",
    )
    p.add_argument(
        "--memory-mb", metavar="MIB", help="memory for jobs, in MiB (CORRAL_WORKER_MEMORY_MB, default: the machine's)"
    )
    p.add_argument("--worker-id", metavar="ID", help="worker id (CORRAL_WORKER_ID)")
    p.add_argument("--label", action="append", default=[], metavar="k=v", help="a label (CORRAL_WORKER_LABELS)")
    p.add_argument(
        "--import", dest="imports", action="append", default=[], metavar="MODULE", help="plug-in module of job types"
    )
    p.add_argument("--drain-timeout", metavar="SEC", help="drain deadline (CORRAL_DRAIN_TIMEOUT_SEC)")
    p.add_argument(
        "--token", metavar="TOKEN", help="the worker token (CORRAL_WORKER_TOKEN; the variable keeps it out of ps)"
    )
    p.add_argument("--tls-ca", metavar="FILE", help="CA that verifies the control plane; turns TLS on (CORRAL_TLS_CA)")
    p.add_argument("--tls-cert", metavar="FILE", help="client certificate for mutual TLS (CORRAL_WORKER_TLS_CERT)")
    p.add_argument("--tls-key", metavar="FILE", help="its private key (CORRAL_WORKER_TLS_KEY)")
    p.add_argument("--log-level", metavar="LEVEL", help="debug|info|warning|error (CORRAL_LOG_LEVEL, default info)")
    p.add_argument("--log-format", metavar="FORMAT", help="json|logfmt (CORRAL_LOG_FORMAT, default json)")
    add_check_flag(p)
    # --FIELD-NAME for each setting without a flag of its own (these three have one by another name)
    add_setting_flags(p, WorkerConfig, covered=("control_addr", "labels", "drain_timeout_sec"))
    return p


def config_from(args: argparse.Namespace, environ: dict[str, str]) -> WorkerConfig:
    """The config: the environment with the flags written over it.

    Raises:
        ConfigError: a flag or a variable breaks its rule.
    """
    return WorkerConfig.from_env({**environ, **flag_variables(args, environ)})


def flag_variables(args: argparse.Namespace, environ: Mapping[str, str]) -> dict[str, str]:
    """The variables the given flags set: each flag's value for its variable (``--label`` and
    ``--import`` add to the variable's list), and the ``--FIELD-NAME`` flags of the settings that
    have no flag of their own.

    Raises:
        ConfigError: a ``--label`` is not k=v.
    """
    env: dict[str, str] = {}
    for flag, name in (
        ("control", "CORRAL_CONTROL_ADDR"),
        ("threads", "CORRAL_WORKER_THREADS"),
        ("slots", "CORRAL_WORKER_SLOTS"),
        ("gpus", "CORRAL_WORKER_GPUS"),
        ("memory_mb", "CORRAL_WORKER_MEMORY_MB"),
        ("worker_id", "CORRAL_WORKER_ID"),
        ("drain_timeout", "CORRAL_DRAIN_TIMEOUT_SEC"),
        ("log_level", "CORRAL_LOG_LEVEL"),
        ("log_format", "CORRAL_LOG_FORMAT"),
        ("token", "CORRAL_WORKER_TOKEN"),
        ("tls_ca", "CORRAL_TLS_CA"),
        ("tls_cert", "CORRAL_WORKER_TLS_CERT"),
        ("tls_key", "CORRAL_WORKER_TLS_KEY"),
    ):
        value = getattr(args, flag)
        if value is not None:
            env[name] = str(value)
    if args.label:
        parse_labels(args.label, "--label")
        labels = [environ.get("CORRAL_WORKER_LABELS", ""), *args.label]
        env["CORRAL_WORKER_LABELS"] = ",".join(filter(None, labels))
    if args.imports:
        imports = [environ.get("CORRAL_WORKER_IMPORTS", ""), *args.imports]
        env["CORRAL_WORKER_IMPORTS"] = ",".join(filter(None, imports))
    env.update(flag_environ(args, WorkerConfig))
    return env


async def run(config: WorkerConfig) -> int:
    """Run an agent until it stops; returns the exit code."""
    loop = asyncio.get_running_loop()
    agent = Agent(config)
    signals_seen = 0
    tasks: set[asyncio.Task[None]] = set()

    def on_signal(signum: int) -> None:
        nonlocal signals_seen
        signals_seen += 1
        task = loop.create_task(agent.drain() if signals_seen == 1 else agent.stop())
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    # SIGHUP (a closed terminal) too: by default it would end the worker at once and its jobs would run again.
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(signum, on_signal, signum)
    try:
        await agent.start()
    except ImportError as exc:  # the same on every restart: as bad as a bad setting
        logger.error("worker_start_failed", extra={"error": str(exc)})
        print(f"python -m worker: {exc}", file=sys.stderr)
        await agent.stop()
        return EXIT_BAD_CONFIG
    except RunnerStartError as exc:
        if agent.stopping:  # a signal stopped it while it started: the runners it had were killed, on purpose
            await agent.wait_stopped()
            return EXIT_OK
        logger.error("worker_start_failed", extra={"error": str(exc)})
        await agent.stop()
        return EXIT_START_FAILED
    await agent.wait_stopped()
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code."""
    args = _parser().parse_args(argv)
    environ = dict(os.environ)
    if args.check_config:
        try:
            flags = flag_variables(args, environ)
        except ConfigError:
            flags = {}  # config_from raises it again, and check reports it
        flagged = flagged_fields(args, WorkerConfig, flags)
        return check(
            lambda: config_from(args, environ), {**environ, **flags}, flagged, (ConfigError,), args.check_config
        )
    try:
        config = config_from(args, environ)
    except ConfigError as exc:
        print(f"python -m worker: {exc}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    configure(config.log_level, config.log_format)
    open_files.raise_soft_limit()
    gc_tuning.apply()
    return event_loop.run(run(config), config.event_loop)


if __name__ == "__main__":
    sys.exit(main())
