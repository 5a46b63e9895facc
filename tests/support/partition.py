"""A TCP relay on 127.0.0.1 that can cut its open connections silently, as a network partition does.

``cut()`` makes every connection open at that moment drop what either side sends, without closing
anything: no FIN, no RST, so neither end is told. That is a peer whose host lost power, a cable
pulled, a NAT or load balancer that forgot the flow. Connections made after the cut are relayed
again (the way back is healed for new connections), which is how a client that notices can recover.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType


class _Flow:
    def __init__(self) -> None:
        self.cut = False
        self.sockets: list[socket.socket] = []


class PartitionableRelay:
    """``with PartitionableRelay(target_port) as relay: connect to relay.address; relay.cut()``."""

    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self._target = (target_host, target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._flows: list[_Flow] = []
        self._lock = threading.Lock()
        self._closed = False
        self.connections = 0
        """Connections accepted so far."""

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def __enter__(self) -> PartitionableRelay:
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self._closed = True
        self._listener.close()
        with self._lock:
            for flow in self._flows:
                for s in flow.sockets:
                    with contextlib.suppress(OSError):
                        s.close()

    def cut(self) -> int:
        """Silently drop everything on the connections open now; returns how many were cut."""
        with self._lock:
            live = [f for f in self._flows if not f.cut]
            for flow in live:
                flow.cut = True
        return len(live)

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self._target)
            except OSError:
                client.close()
                continue
            flow = _Flow()
            flow.sockets = [client, upstream]
            with self._lock:
                self._flows.append(flow)
                self.connections += 1
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(flow, src, dst), daemon=True).start()

    @staticmethod
    def _pump(flow: _Flow, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                if not flow.cut:
                    dst.sendall(data)
        except OSError:
            pass
        if not flow.cut:  # a cut flow stays half-open: nobody is told
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)
