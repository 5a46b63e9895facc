"""A new client does not inherit another client's view of a control plane that was down.

gRPC shares connections between channels to the same address in one process. A channel that saw the
control plane go keeps its connection failing, and backing off, for a while; a new channel sharing it
failed its first call at once with the old "Connection refused", although the control plane was back
on the same port. Found as a rare failure of an unrelated test, whose fresh control plane had been
given a port an earlier test's had used."""

from __future__ import annotations

import pytest

from corral import Client
from corral.errors import Unavailable
from tests.conftest import ControlProc


def test_a_new_client_reaches_a_control_plane_back_on_the_same_port(control_plane: ControlProc) -> None:
    with Client(control_plane.address, timeout=5) as before:
        before.stats()
        # Given a client that saw the control plane go
        control_plane.stop()
        with pytest.raises(Unavailable):
            before.stats()
        # When it is back on the same port
        control_plane.start()
        # Then a new client's first call reaches it
        with Client(control_plane.address, timeout=5) as after:
            assert after.stats().uptime_seconds >= 0
