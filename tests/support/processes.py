"""Looking at processes from tests (Linux /proc)."""

from __future__ import annotations

import os


def alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def children(pid: int) -> list[int]:
    """Pids of the direct children of ``pid`` (empty if it is gone)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except FileNotFoundError:
        return []


def stopped(pid: int) -> bool:
    """Whether every thread of ``pid`` is stopped (SIGSTOP has taken effect: the signal is delivered
    a moment after ``kill`` returns, and a thread on another core runs on until then)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
        states = []
        for tid in tasks:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                states.append(f.read().rsplit(")", 1)[1].split()[0])
    except (FileNotFoundError, ProcessLookupError):
        return False
    return bool(states) and all(state in ("T", "t") for state in states)
