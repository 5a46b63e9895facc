"""Corral's client package: what a program imports to talk to a Corral control plane.

Modules:

- ``client``   :class:`Client`, the blocking gRPC client (submit, get, list, cancel, retry, watch, wait, ...).
- ``aio``      :class:`AsyncClient`, the same methods over ``grpc.aio``.
- ``status``   the one translation from ``grpc.RpcError`` to :mod:`corral.errors` that both clients use.
- ``failover`` how both clients move between a list of addresses (a control plane and its standbys).
- ``addresses`` the rule of an address list, shared by the clients, the CLI and the worker.
- ``job``      :class:`Job`, :class:`JobState`, :class:`JobError`, :class:`JobPage`, :class:`Changed`: jobs as Python values.
- ``spec``     :class:`JobSpec`: what a client submits.
- ``printed``  :class:`OutputChunk`: a piece of what a job printed (``watch_output``).
- ``cluster``  :class:`Stats`, :class:`WorkerInfo`, :class:`WorkerState`, :class:`AutoscalerStatus`,
  :class:`Shares`, :class:`ShareInfo`.
- ``account``  :class:`Account`, :class:`Login`, :class:`Identity`: accounts, logins, who the caller is.
- ``errors``   the error tree shared by every component (client and server raise the same classes).
- ``jobtypes`` the payload JSON Schemas of the built-in job types.
- ``logs``     the JSON log formatter and event names shared by the control plane and workers.
- ``cli``      the ``corral`` command-line tool (``corral up``, ``corral demo``, ``corral submit`` ...).
- ``v1``       the generated ``corral.v1`` gRPC stubs (never edited by hand).

Example::

    import corral

    with corral.Client("127.0.0.1:50051") as client:
        job = client.submit("add_numbers", {"a": 1, "b": 2})
        assert client.wait(job.id, timeout=30).result == {"sum": 3}
"""

from typing import TYPE_CHECKING

from corral import transport  # noqa: F401  (first: sets gRPC transport defaults before grpc loads)

if TYPE_CHECKING:  # what the type checker sees; "X as X" marks each as exported
    from corral.account import Account as Account
    from corral.account import Identity as Identity
    from corral.account import Login as Login
    from corral.aio import AsyncClient as AsyncClient
    from corral.audit import AuditEvent as AuditEvent
    from corral.audit import AuditPage as AuditPage
    from corral.client import Client as Client
    from corral.cluster import AutoscalerStatus as AutoscalerStatus
    from corral.cluster import ExecRateLimit as ExecRateLimit
    from corral.cluster import ShareInfo as ShareInfo
    from corral.cluster import Shares as Shares
    from corral.cluster import Stats as Stats
    from corral.cluster import WorkerInfo as WorkerInfo
    from corral.cluster import WorkerState as WorkerState
    from corral.errors import AlreadyExists as AlreadyExists
    from corral.errors import ClientClosed as ClientClosed
    from corral.errors import CorralError as CorralError
    from corral.errors import DeadlineExceeded as DeadlineExceeded
    from corral.errors import FailedPrecondition as FailedPrecondition
    from corral.errors import Internal as Internal
    from corral.errors import InvalidArgument as InvalidArgument
    from corral.errors import MessageTooLarge as MessageTooLarge
    from corral.errors import NotFound as NotFound
    from corral.errors import PermissionDenied as PermissionDenied
    from corral.errors import RateLimited as RateLimited
    from corral.errors import StaleAttempt as StaleAttempt
    from corral.errors import Unauthenticated as Unauthenticated
    from corral.errors import Unavailable as Unavailable
    from corral.job import Changed as Changed
    from corral.job import Job as Job
    from corral.job import JobError as JobError
    from corral.job import JobPage as JobPage
    from corral.job import JobState as JobState
    from corral.job import Notify as Notify
    from corral.printed import OutputChunk as OutputChunk
    from corral.spec import JobSpec as JobSpec

# The public names, grouped by concept, and the module each lives in. They load on first use (PEP 562):
# a process that needs only a leaf module, such as a runner process reading corral.jobtypes, then does
# not import gRPC, protobuf and the clients (about a tenth of a second and 15 MB in each runner process).
_HOMES = {
    # Clients
    "AsyncClient": "corral.aio",
    "Client": "corral.client",
    # Jobs
    **dict.fromkeys(("Changed", "Job", "JobError", "JobPage", "JobState", "Notify"), "corral.job"),
    "JobSpec": "corral.spec",
    "OutputChunk": "corral.printed",
    # Cluster
    **dict.fromkeys(
        ("AutoscalerStatus", "ExecRateLimit", "ShareInfo", "Shares", "Stats", "WorkerInfo", "WorkerState"),
        "corral.cluster",
    ),
    # Accounts
    **dict.fromkeys(("Account", "Identity", "Login"), "corral.account"),
    # The audit log
    **dict.fromkeys(("AuditEvent", "AuditPage"), "corral.audit"),
    # Errors
    **dict.fromkeys(
        (
            "AlreadyExists",
            "ClientClosed",
            "CorralError",
            "DeadlineExceeded",
            "FailedPrecondition",
            "Internal",
            "InvalidArgument",
            "MessageTooLarge",
            "NotFound",
            "PermissionDenied",
            "RateLimited",
            "StaleAttempt",
            "Unauthenticated",
            "Unavailable",
        ),
        "corral.errors",
    ),
}
__all__ = list(_HOMES)


def __getattr__(name: str) -> object:
    """Import a public name's module the first time the name is asked for."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'corral' has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(home), name)
    globals()[name] = value  # later look-ups are plain attribute reads
    return value


def __dir__() -> list[str]:
    """The module's names, the lazily loaded public ones included."""
    return sorted({*globals(), *_HOMES})
