"""Prints benchmark runs as a table, with the median of each column."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable

from rich.console import Console
from rich.table import Table


def table(title: str, rows: list[dict[str, float]]) -> dict[str, float]:
    """Print one row per run plus the median row; returns the medians."""
    cols = list(rows[0])
    medians = {c: statistics.median(r[c] for r in rows) for c in cols}
    t = Table(title=title)
    t.add_column("run")
    for c in cols:
        t.add_column(c, justify="right")
    for i, r in enumerate(rows, 1):
        t.add_row(str(i), *(f"{r[c]:,.2f}" for c in cols))
    t.add_row("median", *(f"{medians[c]:,.2f}" for c in cols), style="bold")
    _print(t, cols)
    return medians


def rows_by(title: str, key: str, rows: dict[str, dict[str, float]]) -> None:
    """Print one row per value of ``key`` (the row's name in ``rows``), with no median row: for
    tables whose rows are settings, each holding medians already, not repeated runs."""
    cols = list(next(iter(rows.values())))
    t = Table(title=title)
    t.add_column(key)
    for c in cols:
        t.add_column(c, justify="right")
    for name, r in rows.items():
        t.add_row(name, *(f"{r[c]:,.2f}" for c in cols))
    _print(t, cols)


def _print(t: Table, cols: list[str]) -> None:
    # Wide enough for every column even when the output is a file or a pipe (rich assumes 80 there).
    Console(width=max(80, 10 + sum(max(len(c), 12) + 3 for c in cols))).print(t)


def alternating(
    ways: Iterable[str], run_once: Callable[[str], dict[str, float]], runs: int
) -> dict[str, list[dict[str, float]]]:
    """``runs`` runs of each way, the ways taking turns (so that a slow stretch of this shared machine
    hits each of them, not one): each way's rows, for :func:`table`."""
    rows: dict[str, list[dict[str, float]]] = {way: [] for way in ways}
    for _ in range(runs):
        for way in rows:
            rows[way].append(run_once(way))
    return rows
