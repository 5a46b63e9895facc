"""DockerBackend: one control plane's worker containers, through the Docker API (the docker SDK).

Every container it starts carries the labels ``io.corral.role=worker``,
``io.corral.group=<CORRAL_AUTOSCALE_GROUP>`` and ``io.corral.worker-id=<worker id>``, and is told
through its environment whom to dial and who it is: ``CORRAL_CONTROL_ADDR``, ``CORRAL_WORKER_ID``,
``CORRAL_WORKER_THREADS``, ``CORRAL_WORKER_TOKEN`` (when set), ``CORRAL_WORKER_LABELS``
(``container=<name>``) and ``CORRAL_WORKER_MEMORY_MB`` (its share of the host's memory, also its Docker
memory limit: what it advertises is what it may use, and containers do not each claim the whole host). Against a TLS control plane each container also gets the CA to verify it with
and, for mutual TLS, a client certificate, copied into :data:`TLS_DIR` before it starts. The worker
id is also the container's name, so a job record's worker id names the container that ran it. Only
containers with this group's labels are listed, adopted or removed.

The image is never pulled (``create`` fails when it is missing, where ``run`` would pull). Every
method blocks; the autoscaler calls them through ``asyncio.to_thread``. Failures become
:class:`BackendError` with a message that says what is wrong and what to do.
"""

from __future__ import annotations

import contextlib
import io
import os
import secrets
import tarfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from control.tls import ContainerTls

__all__ = [
    "LABEL_GROUP",
    "LABEL_ROLE",
    "LABEL_WORKER",
    "TLS_DIR",
    "WORKER_LABEL_CONTAINER",
    "WORKER_LABEL_GROUP",
    "BackendError",
    "ContainerSpec",
    "DockerBackend",
    "WorkerContainer",
    "tls_archive",
]

LABEL_ROLE = "io.corral.role"
LABEL_GROUP = "io.corral.group"
LABEL_WORKER = "io.corral.worker-id"

WORKER_LABEL_CONTAINER = "container"
"""The worker label (CORRAL_WORKER_LABELS) naming a worker's own container: unique to each one."""
WORKER_LABEL_GROUP = "autoscale_group"
"""The worker label (CORRAL_WORKER_LABELS) every worker of one CORRAL_AUTOSCALE_GROUP carries."""

TLS_DIR = "/run/corral-tls"
"""Where a container finds ca.pem (CORRAL_TLS_CA), and cert.pem / key.pem (CORRAL_WORKER_TLS_CERT/KEY)."""

_NETWORK_MODES = ("host", "bridge", "none")
_LIVE = ("created", "running", "restarting")


class BackendError(Exception):
    """Raised when Docker cannot do what was asked; ``kind`` is the metric label
    (docker_unreachable | image_missing | docker_api)."""

    def __init__(self, kind: str, message: str) -> None:
        """Keep the kind next to the message."""
        super().__init__(message)
        self.kind = kind
        self.message = message


@dataclass(frozen=True, slots=True)
class ContainerSpec:
    """What every worker container of this control plane gets."""

    image: str
    """WORKER_IMAGE."""
    group: str
    """CORRAL_AUTOSCALE_GROUP: the io.corral.group label value."""
    control_address: str
    """HOST:PORT the worker dials (CORRAL_CONTROL_ADDR inside the container)."""
    threads: int
    """CORRAL_WORKER_THREADS inside the container."""
    network: str = "host"
    """CORRAL_WORKER_NETWORK: host | bridge | none | container:NAME, else the name of a network."""
    token: str = ""
    """CORRAL_WORKER_TOKEN inside the container (omitted when empty)."""
    tls: ContainerTls | None = None
    """TLS material copied into each container before it starts (see :data:`TLS_DIR`); None: plaintext."""
    memory_mb: int | None = None
    """CORRAL_AUTOSCALE_WORKER_MEMORY_MB (or its default): the container's CORRAL_WORKER_MEMORY_MB and its
    Docker memory limit (``mem_limit``); None: neither (the worker then advertises the whole host's)."""
    api_timeout_sec: float = 15.0
    """Timeout of one Docker API call."""


@dataclass(frozen=True, slots=True)
class WorkerContainer:
    """One labelled container as Docker reports it."""

    id: str
    name: str
    worker_id: str
    status: str
    """created | running | restarting | paused | exited | dead | removing."""
    exit_code: int = 0
    oom_killed: bool = False

    @property
    def live(self) -> bool:
        """Started, or about to be: it holds (or will hold) a worker."""
        return self.status in _LIVE

    @property
    def exited_cleanly(self) -> bool:
        """Ended by itself with exit code 0: a worker that drained and left (not to be replaced)."""
        return self.status == "exited" and self.exit_code == 0 and not self.oom_killed


class DockerBackend:
    """Start, list and remove this group's worker containers."""

    def __init__(self, spec: ContainerSpec, client_factory: Callable[[], Any] | None = None) -> None:
        """``client_factory`` builds a docker client (default: ``docker.from_env`` with the API timeout,
        so DOCKER_HOST and friends apply)."""
        self.spec = spec
        self._factory = client_factory or (lambda: _sdk().from_env(timeout=int(max(1.0, spec.api_timeout_sec))))
        self._client: Any = None
        self._lock = threading.Lock()  # calls come from several threads (parallel starts, removals)

    # ---- connection ---------------------------------------------------------------------------
    def connect(self) -> None:
        """Reach the daemon and check that WORKER_IMAGE is there.

        Raises:
            BackendError: the daemon does not answer (docker_unreachable) or the image is missing
                (image_missing).
        """
        client = self._call(self._get_client)
        try:
            self._call(lambda: client.images.get(self.spec.image))
        except BackendError as exc:
            if exc.kind == "image_missing":
                raise self._image_missing() from None
            raise

    def close(self) -> None:
        """Drop the client (the next call reconnects)."""
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):  # closing a broken connection may fail: nothing to do
                client.close()

    def _get_client(self) -> Any:
        with self._lock:
            if self._client is None:
                client = self._factory()
                client.ping()
                self._client = client
            return self._client

    # ---- containers ---------------------------------------------------------------------------
    def containers(self) -> list[WorkerContainer]:
        """Every container of this group, whatever its state."""
        filters = {"label": [f"{LABEL_ROLE}=worker", f"{LABEL_GROUP}={self.spec.group}"]}
        # ignore_removed: a container removed between the listing and its inspection is just gone
        found = self._call(lambda: self._get_client().containers.list(all=True, filters=filters, ignore_removed=True))
        return [self._describe(c) for c in found]

    def start(self, worker_id: str) -> WorkerContainer:
        """Create and start one worker container named ``worker_id``.

        Raises:
            BackendError: image missing, daemon unreachable, or the API refused.
        """
        spec = self.spec
        env = {
            "CORRAL_CONTROL_ADDR": spec.control_address,
            "CORRAL_WORKER_ID": worker_id,
            "CORRAL_WORKER_THREADS": str(spec.threads),
            "CORRAL_WORKER_LABELS": f"{WORKER_LABEL_CONTAINER}={worker_id},{WORKER_LABEL_GROUP}={spec.group}",
            "PYTHONUNBUFFERED": "1",
        }
        if spec.token:
            env["CORRAL_WORKER_TOKEN"] = spec.token
        limits: dict[str, int] = {}
        if spec.memory_mb is not None:
            env["CORRAL_WORKER_MEMORY_MB"] = str(spec.memory_mb)
            limits["mem_limit"] = spec.memory_mb << 20
        if spec.tls is not None:
            env["CORRAL_TLS_CA"] = f"{TLS_DIR}/ca.pem"
            if spec.tls.cert:
                env["CORRAL_WORKER_TLS_CERT"] = f"{TLS_DIR}/cert.pem"
                env["CORRAL_WORKER_TLS_KEY"] = f"{TLS_DIR}/key.pem"
        network: dict[str, str] = (
            {"network_mode": spec.network}
            if spec.network in _NETWORK_MODES or spec.network.startswith("container:")
            else {"network": spec.network}
        )
        labels = {LABEL_ROLE: "worker", LABEL_GROUP: spec.group, LABEL_WORKER: worker_id}

        def create_and_start() -> Any:
            container = self._get_client().containers.create(
                spec.image,
                name=worker_id,
                labels=labels,
                environment=env,
                detach=True,
                restart_policy={"Name": "no"},
                **network,
                **limits,
            )
            try:
                if spec.tls is not None:
                    container.put_archive("/", tls_archive(spec.tls))
                container.start()
            except Exception:
                container.remove(force=True)  # never leave a created-but-dead container behind
                raise
            container.reload()
            return container

        try:
            return self._describe(self._call(create_and_start))
        except BackendError as exc:
            if exc.kind == "image_missing":
                raise self._image_missing() from None
            raise

    def remove(self, container_id: str, stop_timeout_sec: float = 10.0) -> None:
        """Stop (SIGTERM, SIGKILL after ``stop_timeout_sec``) and remove a container; gone already is fine."""

        errors = _sdk().errors

        def stop_and_remove() -> None:
            try:
                container = self._get_client().containers.get(container_id)
            except errors.NotFound:
                return
            if container.status in ("running", "restarting", "paused"):
                container.stop(timeout=max(0, round(stop_timeout_sec)))
            try:
                container.remove(force=True)
            except errors.NotFound:
                pass
            except errors.APIError as exc:
                if exc.status_code != 409:  # 409: a removal is already in progress: it will be gone
                    raise

        self._call(stop_and_remove)

    @staticmethod
    def new_worker_id(group: str) -> str:
        """``<group>-worker-<8 hex>``: the container's name and its worker's id."""
        return f"{group}-worker-{secrets.token_hex(4)}"

    # ---- helpers ------------------------------------------------------------------------------
    def _describe(self, c: Any) -> WorkerContainer:
        state = (c.attrs or {}).get("State") or {}
        labels = (c.attrs.get("Config") or {}).get("Labels") or {}
        return WorkerContainer(
            id=c.id,
            name=c.name,
            worker_id=labels.get(LABEL_WORKER) or c.name,
            status=c.status,
            exit_code=int(state.get("ExitCode") or 0),
            oom_killed=bool(state.get("OOMKilled")),
        )

    def _image_missing(self) -> BackendError:
        return BackendError(
            "image_missing",
            f"WORKER_IMAGE {self.spec.image!r} is not on the Docker daemon (it is never pulled): build it "
            f"(docker build -f deploy/... -t {self.spec.image} .) or set WORKER_IMAGE to an image that exists",
        )

    def _call(self, fn: Callable[[], Any]) -> Any:
        """Run one Docker interaction, turning every failure into a BackendError."""
        errors = _sdk().errors
        try:
            return fn()
        except BackendError:
            raise
        except errors.ImageNotFound as exc:
            raise BackendError("image_missing", str(exc)) from exc
        except errors.APIError as exc:
            raise BackendError("docker_api", f"the Docker API refused: {exc.explanation or exc}") from exc
        except (errors.DockerException, OSError) as exc:  # requests' errors are OSErrors
            self.close()
            raise BackendError(
                "docker_unreachable",
                f"Docker is unreachable (DOCKER_HOST={_docker_host()}): {exc}; the autoscaler retries every interval",
            ) from exc


def _sdk() -> Any:  # the SDK has no type hints
    """The docker SDK, imported when a backend first needs it: importing it (and requests) takes about a
    tenth of a second, which a control plane that never runs the docker mode need not spend at start."""
    import docker
    import docker.errors

    return docker


def _docker_host() -> str:
    return os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"


def tls_archive(tls: ContainerTls) -> bytes:
    """A tar of TLS_DIR with the CA, and the client certificate and key when there are some.

    Copied in rather than bind-mounted: it works with a remote Docker engine too, and the files are
    readable by whatever user the image runs as. The key is readable by everyone in the container; the
    container is the boundary (the jobs run there as the worker's user and could read it either way).
    """
    files = {"ca.pem": tls.ca}
    if tls.cert:
        files |= {"cert.pem": tls.cert, "key.pem": tls.key}
    out = io.BytesIO()
    now = time.time()
    with tarfile.open(fileobj=out, mode="w") as tar:
        folder = tarfile.TarInfo(TLS_DIR.lstrip("/"))
        folder.type, folder.mode, folder.mtime = tarfile.DIRTYPE, 0o755, now
        tar.addfile(folder)
        for name, data in files.items():
            info = tarfile.TarInfo(f"{TLS_DIR.lstrip('/')}/{name}")
            info.size, info.mode, info.mtime = len(data), 0o444, now
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()
