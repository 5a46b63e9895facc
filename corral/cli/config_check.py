"""``corral config --check``: the effective configuration of a control plane or a worker, or its first error.

Generic over a process's configuration dataclass (``control.config.ControlConfig``,
``worker.config.WorkerConfig``): each field is a setting, and its attribute docstring starts with its
environment variable (``CORRAL_GRPC_PORT: 0..65535 ...``), so a new field shows up here, gets
a flag and is checked with no more work. The process itself does the checking (``python -m control
--check-config``, ``python -m worker --check-config``), with the same flags, environment and rules as
a start-up, and calls :func:`check`; ``corral config`` only runs it (this package never imports the
control plane or the worker).

For each setting the check prints the variable, the value (secrets masked) and where it came from:
``default``, ``env`` or ``flag``. Exit status 0; or, for a bad setting, the error (naming the variable
and the rule) on stderr and exit status 2, exactly as the process would stop at start-up.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import itertools
import json
import os
import re
import sys
import textwrap
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from corral.cli.exitcode import discard_writes
from corral.dburl import describe

__all__ = [
    "CHECK_FLAG",
    "Setting",
    "add_setting_flags",
    "check",
    "effective",
    "env_names",
    "flag_environ",
    "flagged_fields",
    "main",
]

CHECK_FLAG = "--check-config"
"""The flag of ``python -m control`` / ``python -m worker`` that prints the check instead of starting."""
EXIT_OK = 0
EXIT_BAD_CONFIG = 2
MASK = "********"
"""Shown instead of a secret (a field declared with ``repr=False``)."""

_VAR = re.compile(r"\s*([A-Z][A-Z0-9_]*):")
_FLAG_DEST = "setting__"


@dataclass(frozen=True)
class Setting:
    """One setting as the process will run with it."""

    field: str
    """The dataclass field, e.g. ``grpc_port``."""
    env: str
    """Its environment variable, e.g. ``CORRAL_GRPC_PORT``."""
    value: str
    """The value as text (secrets masked)."""
    source: str
    """``default``, ``env`` or ``flag``."""


def env_names(cls: type) -> dict[str, str]:
    """Field -> environment variable of a configuration dataclass, from each field's docstring.

    Raises:
        TypeError: a field has no docstring starting with ``VARIABLE:`` (every field must have one).
    """
    names = _NAMES.get(cls)
    if names is None:
        names = _NAMES[cls] = _read_env_names(cls)
    return names


_NAMES: dict[type, dict[str, str]] = {}


def _read_env_names(cls: type) -> dict[str, str]:
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    found: dict[str, str] = {}
    for stmt, after in itertools.pairwise(body):
        if (
            isinstance(stmt, ast.AnnAssign)
            and isinstance(stmt.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
            and (match := _VAR.match(after.value.value))
        ):
            found[stmt.target.id] = match.group(1)
    missing = [f.name for f in dataclasses.fields(cls) if f.name not in found]
    if missing:
        raise TypeError(f"{cls.__name__} fields without a 'VARIABLE: rule' docstring: {', '.join(missing)}")
    return {f.name: found[f.name] for f in dataclasses.fields(cls)}


def add_check_flag(parser: argparse.ArgumentParser) -> None:
    """Add ``--check-config [table|json]`` (dest ``check_config``) to a process's own parser."""
    parser.add_argument(
        CHECK_FLAG,
        dest="check_config",
        nargs="?",
        const="table",
        choices=("table", "json"),
        help="print every setting (variable, value, source) and exit 0, or the first bad one and exit 2",
    )


def add_setting_flags(parser: argparse.ArgumentParser, cls: type, covered: Collection[str] = ()) -> None:
    """Add ``--field-name VALUE`` for every field of ``cls`` that has no flag yet (neither an option
    of that name nor one whose destination is the field, nor one of ``covered``). A value given so is
    written over the field's variable (see :func:`flag_environ`), so it passes the same rules."""
    taken = {opt for action in parser._actions for opt in action.option_strings}
    dests = {action.dest for action in parser._actions}
    for name, var in env_names(cls).items():
        flag = "--" + name.replace("_", "-")
        if flag in taken or name in dests or name in covered:
            continue
        parser.add_argument(flag, dest=_FLAG_DEST + name, metavar="VALUE", help=f"sets {var}")


def flag_environ(args: argparse.Namespace, cls: type) -> dict[str, str]:
    """Variable -> value of the flags :func:`add_setting_flags` added that were given."""
    out: dict[str, str] = {}
    for name, var in env_names(cls).items():
        value = getattr(args, _FLAG_DEST + name, None)
        if value is not None:
            out[var] = str(value)
    return out


def flagged_fields(args: argparse.Namespace, cls: type, flag_vars: Collection[str] = ()) -> set[str]:
    """Fields of ``cls`` a flag set: a given flag whose destination is the field (``--grpc-port`` ->
    ``grpc_port``; None or an empty list is "not given"), a flag of :func:`add_setting_flags`, or one
    that wrote a variable of ``flag_vars``."""
    names = env_names(cls)
    given = set(flag_vars) | set(flag_environ(args, cls))
    return {name for name, var in names.items() if getattr(args, name, None) not in (None, []) or var in given}


def effective(config: Any, environ: Mapping[str, str], flagged: Collection[str]) -> list[Setting]:
    """Every setting of the dataclass instance ``config``, with where its value came from: ``flag``
    for the fields in ``flagged``, ``env`` when its variable is set (not blank) in ``environ``, else
    ``default``."""
    out: list[Setting] = []
    names = env_names(type(config))
    for f in dataclasses.fields(config):
        var = names[f.name]
        if f.name in flagged:
            source = "flag"
        elif environ.get(var, "").strip():
            source = "env"
        else:
            source = "default"
        value = getattr(config, f.name)
        out.append(Setting(f.name, var, _text(value, secret=not f.repr), source))
    return out


def _text(value: Any, secret: bool) -> str:
    if secret:
        return MASK if value else ""
    if value is None:
        return ""
    if isinstance(value, str):
        return describe(value)  # a PostgreSQL URL's password: people paste this table into tickets
    if isinstance(value, Mapping):
        return ",".join(f"{k}={v}" for k, v in value.items())
    if isinstance(value, tuple | list):
        return ",".join(str(v) for v in value)
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)  # 1209600, not 1.2096e+06
    return str(value)


def check(
    build: Callable[[], Any],
    environ: Mapping[str, str],
    flagged: Collection[str],
    errors: tuple[type[Exception], ...],
    fmt: str = "table",
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """Build the configuration and print it (:func:`effective`) as ``fmt`` (``table`` or ``json``);
    returns 0, or prints the first error of ``errors`` and returns 2."""
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        config = build()
    except errors as exc:
        print(f"configuration error: {exc}", file=err)
        return EXIT_BAD_CONFIG
    settings = effective(config, environ, flagged)
    try:
        if fmt == "json":
            json.dump([dataclasses.asdict(s) for s in settings], out, indent=2)
            out.write("\n")
        else:
            _table(settings, out)
        out.flush()
    except BrokenPipeError:  # `corral config --check | head`: the reader left, which is no failure
        discard_writes(out)
    return EXIT_OK


def _table(settings: Sequence[Setting], out: TextIO) -> None:
    rows = [("SETTING", "VARIABLE", "VALUE", "SOURCE")] + [(s.field, s.env, s.value, s.source) for s in settings]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    for row in rows:
        out.write("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)) + f"  {row[3]}\n")
    out.write("configuration OK\n")


def main(argv: Sequence[str]) -> int:
    """``corral config [--check] [--worker] [--json] [FLAG ...]``: run the process's own check.

    Replaces this process with ``python -m control --check-config ...`` (or ``worker``); the other
    flags are that process's own (``--grpc-port 9000``, ``--threads 4``, ...), so they are checked too.
    """
    parser = argparse.ArgumentParser(
        prog="corral config",
        description="Print the effective configuration of a control plane (or, with --worker, a worker): every "
        "setting, its environment variable, its value and where it came from (default, env or flag); exit 0. "
        "A bad setting prints the error, naming the variable and the rule, and exits 2. Other flags are those "
        "of `corral control` (or `corral worker`).",
    )
    parser.add_argument("--check", action="store_true", help="check the configuration (the default action)")
    parser.add_argument("--worker", action="store_true", help="the worker's configuration, not the control plane's")
    parser.add_argument("--json", action="store_true", help="print JSON: [{field, env, value, source}, ...]")
    args, rest = parser.parse_known_args(argv)
    module = "worker" if args.worker else "control"
    flag = f"{CHECK_FLAG}=json" if args.json else CHECK_FLAG
    os.execv(sys.executable, [sys.executable, "-m", module, flag, *rest])
