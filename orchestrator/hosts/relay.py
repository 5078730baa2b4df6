"""A local port whose connections a transport relays to a port on the host (SSH channels, Slurm steps)."""

from __future__ import annotations

import contextlib
import errno
import random
import socket
import threading
import time
from abc import ABC, abstractmethod

OUT_OF_DESCRIPTORS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


class Relay(ABC):
    """Listens on 127.0.0.1:local_port; each accepted connection is handed to `_serve` in its own thread."""

    def __init__(self, address: str, port: int, *, backlog: int, name: str) -> None:
        self.address = address
        self.port = port
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        _bind_below_ephemeral(self.sock)
        self.sock.listen(backlog)
        self.local_port = int(self.sock.getsockname()[1])
        self.closed = False
        threading.Thread(target=self._accept, daemon=True, name=name).start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.sock.accept()
            except OSError as e:
                if e.errno in OUT_OF_DESCRIPTORS and not self.closed:
                    # Out of descriptors for a moment (an open-loop run at the client's limit): the connection waits
                    # in the backlog until one is freed; ending the loop would close this port for the whole run.
                    time.sleep(0.05)
                    continue
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


def _bind_below_ephemeral(sock: socket.socket, low: int = 20000) -> None:
    """Bind 127.0.0.1 on a free port below the kernel's ephemeral range: a port the kernel hands out (bind to 0) may
    be the very one a server is about to be launched on when the host is this machine (a free port picked the same
    way), and orch's own relay would then hold it."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            first = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        first = 32768
    for port in random.sample(range(low, first), min(64, max(first - low, 0))):
        try:
            sock.bind(("127.0.0.1", port))
            return
        except OSError:
            continue
    sock.bind(("127.0.0.1", 0))
