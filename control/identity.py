"""Who is calling: the identity that per-client limits and logs key on.

The authenticated principal when auth is on (set by the auth check of the gRPC interceptor or of
the REST bridge, in :data:`PRINCIPAL`), else the caller's address without its port, so that one
client's connections share one identity.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

from corral import logs

PRINCIPAL: ContextVar[str | None] = logs.current_principal
"""The authenticated caller of the current call, or None when auth is off. The same variable as
:data:`corral.logs.current_principal`, so every line logged for a call names its caller."""

PEER: ContextVar[str | None] = ContextVar("corral_peer", default=None)
"""The caller's address where the gRPC context is out of reach: the REST bridge sets it for each call,
the gRPC interceptor for each stream (the feeds' bounds, :mod:`control.feeds`, read it)."""


def client_identity(context: Any) -> str:
    """The principal of this call, else its peer address without the port (``ipv4:127.0.0.1``), from
    :data:`PEER` or else ``context`` (None: ``unknown``)."""
    principal = PRINCIPAL.get()
    if principal:
        return f"principal:{principal}"
    peer = PEER.get()
    if peer is None:
        peer_fn = getattr(context, "peer", None)
        peer = peer_fn() if callable(peer_fn) else "unknown"
    return _strip_port(str(peer))


def _strip_port(peer: str) -> str:
    """``ipv4:127.0.0.1:5555`` -> ``ipv4:127.0.0.1``; ``ipv6:[::1]:5555`` -> ``ipv6:[::1]``."""
    if peer.startswith("ipv6:[") and "]" in peer:
        return peer[: peer.index("]") + 1]
    if peer.startswith("ipv4:") and peer.count(":") == 2:
        return peer.rsplit(":", 1)[0]
    return peer
