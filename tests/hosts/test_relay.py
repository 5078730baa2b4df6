"""The relays that carry `--client local` requests to a host's server, at the edge of orch's own descriptors."""

from __future__ import annotations

import subprocess
import sys
import textwrap

# Each case runs in a child process of its own: it exhausts or inflates that process's descriptor table, which must
# not be the test runner's.
ECHO = """
import os, resource, socket, threading

def echo(sock):
    with sock:
        while data := sock.recv(65536):
            sock.sendall(data)
"""


def run_child(body: str) -> str:
    code = textwrap.dedent(ECHO) + textwrap.dedent(body)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_a_relay_out_of_descriptors_for_a_moment_serves_the_connection_once_one_is_free() -> None:
    """An open-loop run at the client's descriptor limit makes the relay's accept() fail with EMFILE; the relay must
    keep listening (the connection waits in the backlog), not end its accept loop and close the port for the run."""
    out = run_child(
        """
        from orchestrator.hosts.relay import Relay

        class Echo(Relay):
            def _serve(self, client):
                echo(client)

        relay = Echo("127.0.0.1", 0, backlog=16, name="echo")
        client = socket.socket()  # its descriptor exists before the table is full
        filler = []
        try:
            while True:
                filler.append(os.open("/dev/null", os.O_RDONLY))
        except OSError:
            pass
        client.connect(("127.0.0.1", relay.local_port))  # queued: accept() now fails with EMFILE
        threading.Event().wait(0.5)
        for fd in filler:
            os.close(fd)
        client.settimeout(10)
        client.sendall(b"ping")
        print(client.recv(16).decode())
        """
    )
    assert out.strip() == "ping"


def test_an_ssh_tunnel_relays_connections_whose_descriptors_are_above_1024() -> None:
    """select() cannot watch a descriptor above 1024 (ValueError), which orch's own process reaches with many requests
    in flight; the tunnel relays such a connection like any other."""
    out = run_child(
        """
        resource.setrlimit(resource.RLIMIT_NOFILE, (4096, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
        filler = [os.open("/dev/null", os.O_RDONLY) for _ in range(1100)]  # every new descriptor is above 1024

        from orchestrator.hosts.ssh import Tunnel

        class Stats:
            def record_channel(self, kind):
                pass

        class Transport:
            def open_channel(self, kind, dest, origin, timeout):
                ours, theirs = socket.socketpair()  # the far end of the channel: the host's server, an echo
                threading.Thread(target=echo, args=(theirs,), daemon=True).start()
                return ours

        class Host:
            stats = Stats()
            def _transport(self):
                return Transport()

        tunnel = Tunnel(Host(), "127.0.0.1", 9)
        client = socket.create_connection(("127.0.0.1", tunnel.local_port), timeout=10)
        assert client.fileno() > 1024
        client.sendall(b"pong")
        print(client.recv(16).decode())
        """
    )
    assert out.strip() == "pong"
