"""Health checks of Corral's container images (Docker HEALTHCHECK, Kubernetes exec probes).

Usage::

    python healthcheck.py control   # GET /healthz on CORRAL_HTTP_PORT answers 200
    python healthcheck.py worker    # the worker agent holds its stream to the control plane

``control``: the HTTP liveness endpoint of the control plane in this container, at
``http://CORRAL_HOST:CORRAL_HTTP_PORT/healthz`` (a wildcard CORRAL_HOST such as 0.0.0.0 is reached on
127.0.0.1), or ``https://`` when CORRAL_TLS_CERT is set: that port then speaks HTTPS only. The
certificate is not verified: it names the service, not the address checked here, and the check is of
this container's own process. Liveness, not readiness: a control plane that has no worker yet is healthy.

``worker``: a ``python -m worker`` process in this container has an ESTABLISHED TCP connection to
the port of CORRAL_CONTROL_ADDR, read from /proc (its socket inodes against /proc/PID/net/tcp{,6}).
The worker has no port of its own; that connection is its Connect stream, the thing that makes it
useful. A worker whose control plane restarts reconnects with backoff; the check's retries ride
that out.

Flags given after the image name (``docker run corral-control --http-port 9000``, a worker's
``--control HOST:PORT``) win over the environment, as they do for the process itself: they are read
from the command line of the container's main process, PID 1 (``tini -- python -m control ...``).

Exit status 0 healthy, 1 unhealthy (the reason on stderr), as Docker expects. Standard library only.
"""

from __future__ import annotations

import os
import ssl
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

ESTABLISHED = "01"
"""The TCP state code of an established connection in /proc/net/tcp."""

WILDCARDS = frozenset({"", "0.0.0.0", "::", "[::]"})

CONTROL_FLAGS = {"--host": "CORRAL_HOST", "--http-port": "CORRAL_HTTP_PORT", "--tls-cert": "CORRAL_TLS_CERT"}
"""The control plane's flags a check reads, and the settings they stand for."""
WORKER_FLAGS = {"--control": "CORRAL_CONTROL_ADDR"}
"""The worker's flag a check reads, and the setting it stands for."""


class Unhealthy(Exception):
    """Raised when a check fails; the message says why."""


def main_flags(module: str, names: dict[str, str], proc: Path = Path("/proc")) -> dict[str, str]:
    """The settings that flags ``names`` (flag -> variable) give the container's main process, when it
    runs ``python -m module``: ``--flag VALUE`` or ``--flag=VALUE``, the last one winning, as argparse
    takes them. Empty when PID 1 runs something else (a check run outside such a container)."""
    try:
        argv = [
            a.decode("utf-8", "surrogateescape")
            for a in (proc / "1" / "cmdline").read_bytes().rstrip(b"\0").split(b"\0")
        ]
    except OSError:
        return {}
    for i in range(len(argv) - 1):
        if argv[i : i + 2] == ["-m", module]:
            args = argv[i + 2 :]
            break
    else:
        return {}
    found: dict[str, str] = {}
    for i, arg in enumerate(args):
        flag, eq, value = arg.partition("=")
        if flag in names:
            if eq:
                found[names[flag]] = value
            elif i + 1 < len(args):
                found[names[flag]] = args[i + 1]
    return found


def check_control(environ: dict[str, str], timeout: float = 4.0, proc: Path = Path("/proc")) -> str:
    """GET /healthz of the control plane configured by ``environ`` and the main process's flags;
    returns a one-line summary.

    Raises:
        Unhealthy: the port is not an integer, the request failed, or the answer was not 200.
    """
    environ = {**environ, **main_flags("control", CONTROL_FLAGS, proc)}
    host = environ.get("CORRAL_HOST", "").strip()
    host = "127.0.0.1" if host in WILDCARDS else host
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # an IPv6 literal in a URL
    raw = environ.get("CORRAL_HTTP_PORT", "").strip() or "8080"
    if not raw.isdigit() or not 1 <= int(raw) <= 65535:
        raise Unhealthy(f"CORRAL_HTTP_PORT must be a port in 1..65535 for the health check, got {raw!r}")
    tls = bool(environ.get("CORRAL_TLS_CERT", "").strip())
    url = f"{'https' if tls else 'http'}://{host}:{raw}/healthz"
    context = None
    if tls:
        # Whether this process is alive, not who it is: its certificate names the service, not this address.
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=context) as response:
            status = response.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    except OSError as exc:
        raise Unhealthy(f"{url}: {exc}") from None
    if status != 200:
        raise Unhealthy(f"{url} answered {status}")
    return f"{url} answered 200"


def control_ports(environ: dict[str, str]) -> set[int]:
    """The ports of CORRAL_CONTROL_ADDR (default 127.0.0.1:50051, as the worker's own default): one, or
    one per address of a control plane and its standbys (``HOST:PORT,HOST:PORT``), any of which the
    worker may be connected to.

    Raises:
        Unhealthy: an address is not HOST:PORT.
    """
    addrs = environ.get("CORRAL_CONTROL_ADDR", "").strip() or "127.0.0.1:50051"
    ports = set()
    for addr in addrs.split(","):
        _, sep, port = addr.strip().rpartition(":")
        if not sep or not port.isdigit() or not 1 <= int(port) <= 65535:
            raise Unhealthy(f"CORRAL_CONTROL_ADDR must be HOST:PORT or a comma-separated list of them, got {addrs!r}")
        ports.add(int(port))
    return ports


def worker_pids(proc: Path) -> list[int]:
    """Pids of the ``python -m worker`` processes visible in ``proc``."""
    pids = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:  # gone meanwhile
            continue
        if argv[1:3] == [b"-m", b"worker"]:
            pids.append(int(entry.name))
    return pids


def socket_inodes(proc: Path, pid: int) -> set[int]:
    """Inodes of the sockets process ``pid`` has open."""
    inodes: set[int] = set()
    fds = proc / str(pid) / "fd"
    try:
        names = os.listdir(fds)
    except OSError:
        return inodes
    for name in names:
        try:
            target = os.readlink(fds / name)
        except OSError:
            continue
        if target.startswith("socket:[") and target.endswith("]"):
            inodes.add(int(target[8:-1]))
    return inodes


def established_to(proc: Path, pid: int, ports: set[int]) -> bool:
    """Whether process ``pid`` has an established TCP connection (v4 or v6) to one of remote ``ports``."""
    inodes = socket_inodes(proc, pid)
    for table in ("tcp", "tcp6"):
        try:
            lines = (proc / str(pid) / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            # sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode ...
            fields = line.split()
            if len(fields) < 10 or fields[3] != ESTABLISHED:
                continue
            remote_port = int(fields[2].rsplit(":", 1)[1], 16)
            if remote_port in ports and int(fields[9]) in inodes:
                return True
    return False


def check_worker(environ: dict[str, str], proc: Path = Path("/proc")) -> str:
    """Whether a worker agent here is connected to its control plane (as ``environ`` and the main
    process's flags name it); returns a one-line summary.

    Raises:
        Unhealthy: no worker process, or none connected to the control plane's port.
    """
    ports = control_ports({**environ, **main_flags("worker", WORKER_FLAGS, proc)})
    named = ("port " if len(ports) == 1 else "ports ") + ", ".join(str(p) for p in sorted(ports))
    pids = worker_pids(proc)
    if not pids:
        raise Unhealthy("no `python -m worker` process is running")
    for pid in pids:
        if established_to(proc, pid, ports):
            return f"worker pid {pid} is connected to {named}"
    raise Unhealthy(f"worker pid {pids[0]} has no established connection to the control plane's {named}")


CHECKS: dict[str, Callable[[dict[str, str]], str]] = {"control": check_control, "worker": check_worker}


def main(argv: list[str]) -> int:
    """Run the check named by ``argv[0]``; 0 healthy, 1 unhealthy, 2 usage error."""
    if len(argv) != 1 or argv[0] not in CHECKS:
        print(f"usage: healthcheck.py {'|'.join(CHECKS)}", file=sys.stderr)
        return 2
    try:
        print(CHECKS[argv[0]](dict(os.environ)))
    except Unhealthy as exc:
        print(f"unhealthy: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
