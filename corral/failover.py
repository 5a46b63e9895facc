"""Failover of a client between control-plane addresses: which address a call goes to, and when a failed
call may go on to the next one.

A client given several addresses (``"cp-a:50051,cp-b:50051"``: an active control plane and its
standbys on one database, see ``control.standby``) keeps one connection per address and a *current*
address. A call goes to the current address; it goes on to the next one, round the list and to each
address at most once per call, only when its failure proves that no control plane acted on it
(:func:`moves_on`):

- a standby answered: ``UNAVAILABLE`` whose message begins with
  :data:`corral.errors.STANDBY_PREFIX` (a standby does nothing with any call);
- the call never left this process: ``UNAVAILABLE`` made by gRPC's own channel because it had no
  connection to give the call (the address refused the connection or dropped it before the HTTP/2
  handshake ended, did not resolve, failed the TLS handshake). grpcio 1.85 words these
  ``failed to connect to all addresses; last error: ...`` (the load balancer found no connection
  to pick) and ``errors resolving ...`` (the resolver; older releases ``DNS resolution failed ...``),
  and they carry no trailing metadata, whereas every error a control plane sends carries its
  ``google.rpc.Status`` trailer (``CorralError.answered``), so a server's message that merely looks
  like one does not count. ``tests/unit/corral/test_failover.py`` pins the wording against a real
  socket: a grpcio that words it otherwise makes a client stop at the first address and raise, as a
  client of one address does, never resend.

- the client itself proved the request never left: an ``UNAVAILABLE`` it made whose message begins
  with :data:`NOT_SENT_PREFIX` (an asyncio ``RunJobs`` stream that the server ended before its request
  could be written, e.g. a standby's refusal racing the write; gRPC then reports only
  ``INTERNAL: Internal error from Core``, which hid the refusal and stopped the call at the standby).

Any other failure is raised, and the address where it happened becomes current: an answer, even an
error, and ``UNAVAILABLE`` after the request may have reached a server (``Stream removed (Socket
closed)``: a connection reset mid-call, or a control plane killed between calls before this process
noticed), because a submission must never be sent twice (with an idempotency key or without: the
caller decides whether to submit again). The address that took a call becomes current, so later calls
go straight to the active control plane. When every address passed the call on, :meth:`Attempts.exhausted`
is an :class:`~corral.errors.Unavailable` naming each address and its reason.

A call that a stopping control plane cut is :class:`~corral.errors.Unavailable` too, never a bare
``CorralError`` with gRPC's ``CANCELLED`` (:func:`cut_by_stop`): gRPC cancels the calls a server had
received but not yet taken up when it stops (a SIGTERM, a store that failed), and those still running
at the end of its shutdown grace. Such a call may or may not have been carried out, as with any
``Unavailable`` after the request left, so it is raised and never sent elsewhere; a caller that keyed
it submits again with the key (found by the failover soak: 14 of 16 submissions in flight when the
active control plane got SIGTERM came back ``CorralError('CANCELLED')``).

A client of one address never fails over: its errors are raised as they come (exactly as before
lists, but for :func:`cut_by_stop`), and its channel keeps gRPC's reconnect schedule; a list's channels
use :data:`RECONNECT_OPTIONS`.

During a takeover (about a second) no control plane takes calls: the old one is gone and the standby
still refuses, so calls fail :class:`~corral.errors.Unavailable` (following a job with
``wait``/``watch`` rides through it, :mod:`corral.follow`); after it, a client that called meanwhile
may need up to a second more to connect to the new active one (:data:`RECONNECT_OPTIONS`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Generic, TypeVar

from corral.addresses import AddressError, parse_targets
from corral.errors import STANDBY_PREFIX, CorralError, DeadlineExceeded, InvalidArgument, Unavailable

__all__ = [
    "NEVER_SENT",
    "NOT_SENT_PREFIX",
    "RECONNECT_OPTIONS",
    "UNREACHED_PREFIX",
    "Attempts",
    "Failover",
    "client_addresses",
    "cut_by_stop",
    "moves_on",
    "unreached",
]

C = TypeVar("C")

NEVER_SENT = ("failed to connect to all addresses", "errors resolving ", "DNS resolution failed")
"""How grpcio begins the message of an ``UNAVAILABLE`` it made itself because the call got no
connection (see the module docstring): the request was never sent."""

NOT_SENT_PREFIX = "not sent: "
"""How the message of an ``UNAVAILABLE`` begins that the client made itself for a request it knows it
never sent (a write that gRPC refused because the call had already ended): any address may take it."""

UNREACHED_PREFIX = "cannot reach the control plane"
"""How the message of an ``Unavailable`` begins that the client made for a deadline that passed before any
control plane was reached (:func:`unreached`, and a follow's :meth:`corral.follow.Follow.timed_out`)."""

RECONNECT_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
)
"""Channel options of a client given a list. While a channel waits out gRPC's reconnect backoff
(1 s at first, growing to 120 s) every call on it fails at once with ``failed to connect``, and a
standby's port is closed for a moment while it takes over (between its standby front and its real
servers): a client that called during that moment kept skipping the control plane that had just
become active for as long as its backoff had grown. With these the wait is 1 s at most, so a client
reaches the new active control plane within about a second of its serving (measured on grpcio 1.85
after 3 s of refused calls: a port that came up was used 0.7 s later with these, 2-3 s later with
gRPC's schedule, which keeps growing with the outage). The cost: gRPC keeps trying an address that
failed in the background until the channel idles (30 minutes after its last call), and that is then
about one connection attempt a second instead of fewer."""


def client_addresses(address: object) -> tuple[str, ...]:
    """The addresses of a client's ``address`` argument, in order.

    One address or a comma-separated list, by the rule of :func:`corral.addresses.parse_targets` (the
    CLI's too): HOST:PORT with a port in 1..65535, an IPv6 host in brackets, no scheme, no spaces; or a
    ``unix:`` target alone. Nothing is left for gRPC to guess: it took ``"127.0.0.1"`` as port 443,
    ``"::1:5"`` as the host ``::0.1.0.5``, and printed its own error lines for ``""``.

    Raises:
        InvalidArgument: field ``address``, when it breaks the rule (the rule and the entry are named).
    """
    try:
        return parse_targets(address, "address")
    except AddressError as exc:
        raise InvalidArgument("address", exc.rule) from None


def moves_on(error: CorralError) -> bool:
    """Whether a call that failed with ``error`` may be sent to the next address: a standby refused
    it, or gRPC never sent it (see the module docstring)."""
    if not isinstance(error, Unavailable):
        return False
    if error.message.startswith(STANDBY_PREFIX):
        return True
    return not error.answered and error.message.startswith((*NEVER_SENT, NOT_SENT_PREFIX))


def unreached(error: CorralError, address: str, connected: bool) -> CorralError:
    """``error``, or the :class:`~corral.errors.Unavailable` it stands for when it is a deadline that passed
    while the channel to ``address`` had no connection (``connected`` False: not READY, e.g. a port that
    accepts and never speaks HTTP/2): no control plane was reached, so the address is what is wrong,
    not the time given. Not ``answered``, and not passed on by :func:`moves_on` (gRPC may have been
    sending it when the deadline passed)."""
    if not isinstance(error, DeadlineExceeded) or error.answered or connected:
        return error
    gone = Unavailable(f"{UNREACHED_PREFIX} at {address}: no connection before the deadline ({error.message})")
    gone.answered = False
    return gone


def cut_by_stop(error: CorralError) -> CorralError:
    """``error``, or the :class:`~corral.errors.Unavailable` it stands for when it is gRPC's ``CANCELLED``
    that no control plane answered (no ``google.rpc.Status`` trailer, which every error a control plane
    sends carries): a server that stopped under the call cancelled it (see the module docstring). Not
    ``answered``, and not passed on by :func:`moves_on`: the request had reached a control plane.

    (Its ``__cause__`` stays unset: :mod:`corral.follow` reads a ``CorralError`` cause as a call that
    every address passed on.)"""
    if error.code != "CANCELLED" or error.answered or isinstance(error, Unavailable):
        return error
    if "Locally cancelled" in error.message:  # this process cancelled it (grpcio's words): no server stopped
        return error
    cut = Unavailable(
        f"the control plane stopped under the call ({error.message}): it may or may not have been carried out"
    )
    cut.answered = False
    return cut


class Failover(Generic[C]):
    """A client's addresses, one connection of type ``C`` each (made by ``connect`` on first use),
    and the current address.

    Calls from several threads may share it (two that settle at once only race over which address
    is current). A connection is made under a lock, so two threads that need the same one at once (a
    :class:`corral.Client` used again after :meth:`~corral.Client.close`) make one, not two with one
    of them never closed.
    """

    def __init__(self, addresses: Sequence[str], connect: Callable[[str], C]) -> None:
        """Start with the first address current; no connection is made yet.

        Raises:
            ValueError: ``addresses`` is empty.
        """
        if not addresses:
            raise ValueError("Failover needs at least one address")
        self.addresses = tuple(addresses)
        self._connect = connect
        self._connections: dict[str, C] = {}
        self._making = threading.Lock()
        self._index = 0

    @property
    def current(self) -> str:
        """The address the next call goes to first: the one that took the last call."""
        return self.addresses[self._index]

    def connection(self, address: str) -> C:
        """The connection to ``address``, made now if it was not yet."""
        made = self._connections.get(address)
        if made is None:
            with self._making:
                made = self._connections.get(address)
                if made is None:
                    made = self._connections[address] = self._connect(address)
        return made

    def connections(self) -> list[C]:
        """The connections made so far."""
        return list(self._connections.values())

    def take_connections(self) -> list[C]:
        """The connections made so far, forgotten here (to close them; later calls make new ones)."""
        with self._making:
            made, self._connections = list(self._connections.values()), {}
        return made

    def attempts(self) -> Attempts[C]:
        """The way of one call round the list, from the current address."""
        return Attempts(self)

    def _settle(self, address: str) -> None:
        self._index = self.addresses.index(address)


class Attempts(Generic[C]):
    """One call's way round the addresses: iterate ``(address, connection)``, and for each try say
    :meth:`took` or :meth:`failed`; after the loop, raise :meth:`exhausted`.

    Example::

        attempts = failover.attempts()
        for address, conn in attempts:
            try:
                with translate_errors():
                    response = conn.jobs.GetJob(request)
            except CorralError as exc:
                attempts.failed(address, exc)  # raises it unless the next address may have the call
                continue
            attempts.took(address)
            return response
        raise attempts.exhausted()
    """

    def __init__(self, failover: Failover[C]) -> None:
        """Start at ``failover``'s current address."""
        self._failover = failover
        self._start = failover._index
        self._refusals: list[tuple[str, CorralError]] = []

    def __iter__(self) -> Iterator[tuple[str, C]]:
        addresses = self._failover.addresses
        for step in range(len(addresses)):
            address = addresses[(self._start + step) % len(addresses)]
            yield address, self._failover.connection(address)

    def took(self, address: str) -> None:
        """The call reached a control plane at ``address`` that acted on it: later calls go there first."""
        self._failover._settle(address)

    def failed(self, address: str, error: CorralError) -> None:
        """Record that the call failed at ``address`` with ``error``, which passes it on to the next
        address when :func:`moves_on` allows (and there is a list).

        Raises:
            CorralError: ``error`` (:func:`cut_by_stop`), when the call must not go on; ``address``
                becomes current.
        """
        if len(self._failover.addresses) == 1 or not moves_on(error):
            self.took(address)
            raise cut_by_stop(error)
        self._refusals.append((address, error))

    def exhausted(self) -> Unavailable:
        """The error when every address passed the call on: each address and its reason, ``answered``
        when a control plane (a standby) answered, caused by the last one."""
        reasons = "; ".join(f"{address}: {error.message}" for address, error in self._refusals)
        error = Unavailable(f"none of the {len(self._refusals)} control-plane addresses took the call: {reasons}")
        error.answered = any(refusal.answered for _, refusal in self._refusals)
        if self._refusals:
            error.__cause__ = self._refusals[-1][1]
        return error
