"""Control-plane address lists: the one rule for ``"cp-a:50051,cp-b:50051"``, wherever it is given.

A control plane and its standbys on one database answer on different addresses, so a worker
(``CORRAL_CONTROL_ADDR``), a client (``corral.Client(address)``) and the CLI (``--control``) take a
comma-separated list and fail over between its entries. They all parse it here, so a list that one
accepts the others accept too, and a bad one is refused with the same words:

- each entry is ``HOST:PORT`` with a port in 1..65535: the host a name or an IPv4 address (letters,
  digits, ``.``, ``-``, ``_``) or an IPv6 address in brackets (``[::1]:50051``), with no scheme
  (``http://``) and no spaces inside; spaces around an entry are dropped. Without the rule gRPC took
  ``::1:5`` as the host ``::0.1.0.5`` on its default port 443, and ``127.0.0.1`` as port 443;
- no entry is empty (``"a:1,,b:2"``, a trailing comma): a typo that would silently weaken failover;
- no address is listed twice (host names compared without case, ports as numbers);
- at most :data:`MAX_ADDRESSES` entries: a control plane and its standbys, not a fleet to scan.

A client and the CLI take one address more: a ``unix:`` (or ``unix-abstract:``) target alone, a gRPC
Unix-socket address (:func:`parse_targets`).

This module imports only the standard library: each caller turns :class:`AddressError` into its own error type (the
worker's ``ConfigError``, the client's ``InvalidArgument``, the CLI's usage error).
"""

from __future__ import annotations

import ipaddress

__all__ = ["ADDRESS_RULE", "MAX_ADDRESSES", "UNIX_TARGETS", "AddressError", "parse_addresses", "parse_targets"]

ADDRESS_RULE = "an IPv6 host in brackets; no scheme, no spaces"
"""What the rule asks of a host, said after the HOST:PORT rule in every refusal."""
UNIX_TARGETS = ("unix:", "unix-abstract:")
"""How a gRPC Unix-socket target begins: a client's (or the CLI's) one address may be one."""
_HOST_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_")

MAX_ADDRESSES = 16
"""Most entries in an address list: a control plane and its standbys, not a fleet to scan."""


class AddressError(ValueError):
    """Raised when an address list breaks its rule; ``str()`` is ``"<name> <rule>"``.

    Attributes:
        name: What the list was given as (a variable, an argument), first in the message.
        rule: The rule broken and the offending entry, without ``name``.
    """

    def __init__(self, name: str, rule: str) -> None:
        super().__init__(f"{name} {rule}")
        self.name = name
        self.rule = rule


def parse_addresses(raw: str, name: str) -> tuple[str, ...]:
    """``"a:1, b:2"`` -> ``("a:1", "b:2")``: each entry HOST:PORT with a port in 1..65535.

    Args:
        raw: One address, or several separated by commas.
        name: What ``raw`` was given as, to start the error message with (``CORRAL_CONTROL_ADDR``).

    Raises:
        AddressError: an entry breaks the rule or is empty, an address is listed twice, or there are
            more than MAX_ADDRESSES entries.
    """
    entries = [entry.strip() for entry in raw.split(",")]
    if len(entries) > MAX_ADDRESSES:
        raise AddressError(name, f"may list at most {MAX_ADDRESSES} addresses, got {len(entries)}")
    seen: dict[tuple[str, int], str] = {}
    for entry in entries:
        where = f" (in {raw!r})" if len(entries) > 1 else ""
        if not entry and where:  # (a lone empty address falls to the HOST:PORT rule below)
            raise AddressError(name, f"must be comma-separated HOST:PORT entries without an empty one, got {raw!r}")
        host, sep, port = entry.rpartition(":")
        # isascii: "²".isdigit() holds, yet int("²") raises
        if not sep or not _host(host) or not (port.isascii() and port.isdigit()) or not 1 <= int(port) <= 65535:
            rule = "HOST:PORT entries with ports" if where else "HOST:PORT with a port"
            raise AddressError(name, f"must be {rule} in 1..65535 ({ADDRESS_RULE}), got {entry!r}{where}")
        # Host names are case-insensitive and "050051" is port 50051: the same control plane twice.
        key = (host.lower(), int(port))
        if key in seen:
            twice = f"{entry!r} twice" if seen[key] == entry else f"{seen[key]!r} and {entry!r}"
            raise AddressError(name, f"must list each address once, got {twice}{where}")
        seen[key] = entry
    return tuple(entries)


def parse_targets(raw: object, name: str) -> tuple[str, ...]:
    """A client's address argument (``corral.Client(address)``, the CLI's ``--control``): one
    ``unix:``/``unix-abstract:`` target as it is, else :func:`parse_addresses` (one HOST:PORT or a list).

    Raises:
        AddressError: ``raw`` is not a string, or breaks the rule of :func:`parse_addresses`.
    """
    if not isinstance(raw, str):
        raise AddressError(name, f"must be a HOST:PORT string ({ADDRESS_RULE}), got {type(raw).__name__} {raw!r}")
    if "," not in raw and raw.startswith(UNIX_TARGETS) and raw.partition(":")[2].strip():
        return (raw,)
    return parse_addresses(raw, name)


def _host(host: str) -> bool:
    """Whether ``host`` is a name or IPv4 address (letters, digits, ``.-_``) or a bracketed IPv6 address."""
    if host.startswith("[") and host.endswith("]"):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            return False
        return True
    return bool(host) and set(host) <= _HOST_CHARS
