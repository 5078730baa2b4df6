"""A local port whose connections a transport relays to a port on the host (SSH channels, Slurm steps)."""

from __future__ import annotations

import contextlib
import socket
import threading
from abc import ABC, abstractmethod


class Relay(ABC):
    """Listens on 127.0.0.1:local_port; each accepted connection is handed to `_serve` in its own thread."""

    def __init__(self, address: str, port: int, *, backlog: int, name: str) -> None:
        self.address = address
        self.port = port
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(backlog)
        self.local_port = int(self.sock.getsockname()[1])
        self.closed = False
        threading.Thread(target=self._accept, daemon=True, name=name).start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    @abstractmethod
    def _serve(self, client: socket.socket) -> None:
        """Relay one connection until either side closes it; close `client` at the end."""

    def close(self) -> None:
        self.closed = True
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept(); close() alone does not on Linux
        with contextlib.suppress(OSError):
            self.sock.close()
