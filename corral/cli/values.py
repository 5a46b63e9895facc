"""The CLI's argument value types: each turns one command-line string into a Python value or says what is wrong.

They are used as argparse ``type=`` callables, so a bad value raises ``argparse.ArgumentTypeError`` and
becomes a usage error (exit status 2) naming the option.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from google.protobuf.descriptor import FieldDescriptor

from corral.addresses import ADDRESS_RULE, AddressError, parse_addresses, parse_targets
from corral.client import auth_metadata
from corral.errors import InvalidArgument
from corral.job import JobState, Notify
from corral.limits import MAX_GPUS, MAX_MEMORY_MB, PROTO_INT_RANGES
from corral.resources import ResourceError, parse_gpus

__all__ = [
    "address",
    "addresses",
    "excerpt",
    "gpu_count",
    "gpus",
    "int32",
    "job_state",
    "json_kind",
    "label",
    "loads_strict",
    "memory_mb",
    "payload",
    "port",
    "positive_int",
    "positive_int32",
    "read_text",
    "readable_file",
    "token",
    "when",
    "worker_memory_mb",
]

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_RELATIVE_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)?")


def readable_file(text: str) -> str:
    """A path to a file this process can read (a CA certificate, a key)."""
    try:
        with open(text, "rb"):
            pass
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"cannot read {text}: {exc.strerror or exc}") from None
    return text


class DuplicateKey(ValueError):
    """A JSON object that gives one key twice (``{"a": 1, "a": 2}``): which value was meant cannot be told."""

    def __init__(self, key: str) -> None:
        super().__init__(f"key {key!r} is given twice in one object: give each key once")
        self.key = key


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateKey(key)
        out[key] = value
    return out


class TooManyDigits(ValueError):
    """A JSON integer longer than Python reads (``sys.get_int_max_str_digits()``, 4,300 digits by default):
    no request field can carry one, and ``json.loads`` raised a bare ValueError for it (a traceback)."""

    def __init__(self, digits: int) -> None:
        super().__init__(f"an integer of {digits:,} digits; at most {sys.get_int_max_str_digits():,} are read")
        self.digits = digits


def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:  # the digit limit: the decoder hands over only well-formed integers
        raise TooManyDigits(len(text.lstrip("-"))) from None


def loads_strict(text: str) -> Any:
    """``json.loads`` that refuses an object with a key given twice, as the REST bridge does (plain
    ``json.loads`` keeps the last value and drops the first without a word), and an integer too long
    to read with an error of its own.

    Raises:
        json.JSONDecodeError: the text is not JSON.
        DuplicateKey: an object gives a key twice.
        TooManyDigits: an integer has more digits than Python reads.
        RecursionError: the text nests deeper than the decoder can follow.
    """
    return json.loads(text, object_pairs_hook=_unique_keys, parse_int=_integer)


STDIN = "-"
"""``@-``: the ``--payload`` is read from standard input."""


def read_text(path: str, source: str) -> str:
    """The UTF-8 text of the file ``path`` (:data:`STDIN`: standard input), for an argument; ``source``
    names it in errors.

    Raises:
        argparse.ArgumentTypeError: it cannot be read, or is not UTF-8 text.
    """
    try:
        data = sys.stdin.buffer.read() if path == STDIN else Path(path).read_bytes()
        return data.decode("utf-8")
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"cannot read {source}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise argparse.ArgumentTypeError(f"cannot read {source}: not UTF-8 text (byte {exc.start})") from None


def payload(text: str) -> dict[str, Any]:
    """A JSON object, given inline, as ``@path`` to a file holding one, or as ``@-``: read from stdin."""
    source = "--payload"
    if text.startswith("@"):
        path = text[1:]
        if not path:
            raise argparse.ArgumentTypeError("give a file after @ (@FILE), or @- for stdin")
        source = "stdin" if path == STDIN else path
        text = read_text(path, source)
    try:
        value = loads_strict(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(
            f"invalid JSON in {source} at line {exc.lineno} column {exc.colno} (char {exc.pos}): {exc.msg}; "
            f"near {excerpt(exc.doc, exc.pos)}"
        ) from None
    except (DuplicateKey, TooManyDigits) as exc:
        raise argparse.ArgumentTypeError(f"invalid JSON in {source}: {exc}") from None
    except RecursionError:  # json's decoder recurses once per level: a traceback, not a usage error
        raise argparse.ArgumentTypeError(f"invalid JSON in {source}: nested too deeply") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"{source} must be a JSON object ({{...}}), got {json_kind(value)}")
    return value


def when(text: str, now: datetime | None = None) -> datetime:
    """A point in time: ``+30s``, ``+5m``, ``+1h30m`` (from now) or ISO 8601 (no offset means local time).

    Relative units are ms, s (the default), m, h and d.
    """
    text = text.strip()
    base = now or datetime.now().astimezone()
    if text.startswith("+"):
        body = text[1:]
        parts = list(_RELATIVE_PART.finditer(body))
        if not body or "".join(m.group(0) for m in parts) != body:
            raise argparse.ArgumentTypeError(
                f"invalid relative time {text!r}: use +N with a unit ms, s, m, h or d, e.g. +30s, +5m, +1h30m"
            )
        seconds = sum(float(m.group(1)) * _UNITS[m.group(2) or "s"] for m in parts)
        try:
            return base + timedelta(seconds=seconds)
        except OverflowError:
            raise argparse.ArgumentTypeError(f"invalid relative time {text!r}: past the year 9999") from None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"invalid time {text!r}: use ISO 8601 (2030-01-02T15:04:05Z) or +N[ms|s|m|h|d] relative to now"
        ) from None
    if moment.tzinfo:
        return moment
    try:
        return moment.astimezone()
    except (OverflowError, ValueError):  # Python finds no local offset within a day of year 1's start or 9999's end
        raise argparse.ArgumentTypeError(
            f"invalid time {text!r}: too near the ends of the years 0001..9999 to read as local time; "
            "give it an offset (0001-01-01T00:00:00Z)"
        ) from None


def label(text: str) -> tuple[str, str]:
    """A ``key=value`` label; the key must not be empty."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"invalid label {text!r}: use key=value")
    return key.strip(), value


def notify_target(text: str) -> Notify:
    """Where to announce a job's end: an ``http://`` or ``https://`` URL (a webhook), else an email address
    (the control plane checks each)."""
    text = text.strip()
    if text.lower().startswith(("http://", "https://")):
        return Notify(webhook_url=text)
    if "@" not in text:
        raise argparse.ArgumentTypeError(f"invalid target {text!r}: use an email address or an http(s):// URL")
    return Notify(email=text)


def end_state(text: str) -> JobState:
    """An end a notification is for: SUCCEEDED, FAILED or CANCELLED (any case)."""
    try:
        state = JobState.parse(text)
    except (InvalidArgument, ValueError):
        state = JobState.STATE_UNSPECIFIED
    if not state.is_terminal:
        raise argparse.ArgumentTypeError(f"invalid end {text!r}: use SUCCEEDED, FAILED or CANCELLED")
    return state


def address(text: str) -> str:
    """A ``host:port`` gRPC address (IPv6 hosts in brackets; a port in 1..65535; no scheme, no spaces), or a
    ``unix:`` target: the rule of :func:`corral.addresses.parse_targets`, which the clients follow too."""
    try:
        (one,) = parse_targets(text, "--control")
    except (AddressError, ValueError):  # ValueError: a comma, which addresses() takes as a list
        raise argparse.ArgumentTypeError(
            f"invalid address {text!r}: use HOST:PORT with a port in 1..65535 ({ADDRESS_RULE}), "
            "e.g. 127.0.0.1:50051 or [::1]:50051"
        ) from None
    return one


def addresses(text: str) -> str:
    """A ``host:port`` gRPC address, or a comma-separated list of them (a control plane and its standbys).

    One address follows :func:`address`; a list follows :func:`corral.addresses.parse_addresses` (no empty
    entry, no address twice, at most 16) and comes back without the spaces around its entries.
    """
    if "," not in text:
        return address(text)
    try:
        return ",".join(parse_addresses(text, "--control"))
    except AddressError as exc:
        raise argparse.ArgumentTypeError(f"invalid address list: {exc.rule}") from None


def port(text: str) -> int:
    """A TCP port, 0 (pick a free one) to 65535."""
    if not text.isdigit() or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"invalid port {text!r}: use 0..65535 (0 picks a free port)")
    return int(text)


def int32(text: str) -> int:
    """An integer a request's int32 field can carry; the control plane checks its own rule (priority 0..100, ...)."""
    return _int_in_range(text, *PROTO_INT_RANGES[FieldDescriptor.CPPTYPE_INT32])


def positive_int32(text: str) -> int:
    """An integer >= 1 that a request's int32 field can carry (a ``--limit``)."""
    return _int_in_range(text, 1, PROTO_INT_RANGES[FieldDescriptor.CPPTYPE_INT32][1])


def token(text: str) -> str:
    """A client token: printable ASCII without spaces (:func:`corral.client.auth_metadata`'s rule)."""
    try:
        auth_metadata(text)
    except InvalidArgument as exc:
        raise argparse.ArgumentTypeError(f"invalid token: {exc.rule}") from None
    return text


def positive_int(text: str) -> int:
    """An integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"invalid value {text!r}: must be an integer >= 1")
    return value


def gpu_count(text: str) -> int:
    """GPUs a job needs: an integer 0..MAX_GPUS."""
    return _int_in_range(text, 0, MAX_GPUS)


def memory_mb(text: str) -> int:
    """Memory in MiB a job needs: an integer 0..MAX_MEMORY_MB (0: none)."""
    return _int_in_range(text, 0, MAX_MEMORY_MB)


def worker_memory_mb(text: str) -> int:
    """Memory in MiB a worker gives to jobs (CORRAL_WORKER_MEMORY_MB): an integer 1..MAX_MEMORY_MB (a worker
    refuses 0; without the setting it gives what the machine has)."""
    return _int_in_range(text, 1, MAX_MEMORY_MB)


def gpus(text: str) -> tuple[str, ...]:
    """GPU device ids: a count ``N`` (devices 0..N-1, N in 0..MAX_GPUS) or a comma list of ids (``0,1`` or
    ``GPU-<uuid>,...``), by the worker's own rule (:func:`corral.resources.parse_gpus`)."""
    try:
        return parse_gpus(text, "--gpus")
    except ResourceError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _int_in_range(text: str, low: int, high: int) -> int:
    try:
        value = int(text)
    except ValueError:
        value = low - 1
    if not low <= value <= high:
        raise argparse.ArgumentTypeError(f"invalid value {text!r}: must be an integer {low}..{high}")
    return value


def positive_seconds(text: str) -> float:
    """A finite number of seconds > 0 (a time this tool waits; 0 or less would fail every call at once)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"invalid value {text!r}: must be a number of seconds > 0")
    return value


def job_state(text: str) -> list[JobState]:
    """One or more job states by name, comma-separated (case-insensitive)."""
    states: list[JobState] = []
    for name in filter(None, (part.strip() for part in text.split(","))):
        try:
            states.append(JobState[name.upper()])
        except KeyError:
            names = ", ".join(s.name for s in JobState if s is not JobState.STATE_UNSPECIFIED)
            raise argparse.ArgumentTypeError(f"unknown state {name!r}: one of {names}") from None
    if not states:
        raise argparse.ArgumentTypeError("empty state")
    return states


def excerpt(doc: str, pos: int, width: int = 20) -> str:
    """The text around ``pos`` with ``<here>`` marking it, on one line."""
    start, end = max(0, pos - width), pos + width
    text = ("..." if start else "") + doc[start:pos] + "<here>" + doc[pos:end] + ("..." if end < len(doc) else "")
    return text.replace("\n", "\\n")


def json_kind(value: Any) -> str:
    """What a decoded JSON value is, for an error message: ``an array``, ``a string``, ``null`` ..."""
    kinds = {
        dict: "an object",
        list: "an array",
        str: "a string",
        bool: "a boolean",
        int: "a number",
        float: "a number",
    }
    return "null" if value is None else kinds.get(type(value), type(value).__name__)
