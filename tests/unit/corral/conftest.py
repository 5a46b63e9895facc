"""Fixtures of the client and CLI unit tests."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest


@pytest.fixture
def zone(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], None]]:
    """Sets the process's local time zone (TZ) for the test; the one it had comes back after it."""

    def set_zone(name: str) -> None:
        monkeypatch.setenv("TZ", name)
        time.tzset()

    yield set_zone
    monkeypatch.undo()
    time.tzset()
