"""orch's stop signals in-process: the first one stops orch (at once, or when the teardown in progress ends), the
rest, however many, are only counted until orch goes on by itself; a flood never raises anywhere else."""

from __future__ import annotations

import os
import signal
import socket
import threading
from collections.abc import Iterator

import pytest

from orchestrator.common import stopsignals
from tests.wires import wire


@pytest.fixture
def orchs_handlers() -> Iterator[None]:
    """orch's handlers, as its entry point installs them; the test process's own back afterwards."""
    before = {sig: signal.getsignal(sig) for sig in stopsignals.STOP_SIGNALS}
    stopsignals.install()
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
        stopsignals.rearm()


def _send(sig: signal.Signals, times: int = 1) -> None:
    # Sent to this process from its main thread: the handler has run by the time kill returns to Python code.
    for _ in range(times):
        os.kill(os.getpid(), sig)


def test_the_first_signal_stops_orch_and_the_rest_are_counted_until_it_goes_on(orchs_handlers: None) -> None:
    with pytest.raises(KeyboardInterrupt):
        _send(signal.SIGINT)
    for sig in stopsignals.STOP_SIGNALS:
        _send(sig, 200)  # the teardown the first one started would be cut short here
    stopsignals.rearm()  # a nightly item stopped by its timer: the night goes on
    with pytest.raises(KeyboardInterrupt):
        _send(signal.SIGTERM)


def test_a_teardown_runs_to_its_end_and_its_first_signal_stops_orch_then(orchs_handlers: None) -> None:
    said: list[str] = []
    finished = False
    with pytest.raises(KeyboardInterrupt), stopsignals.deferred(lambda: said.append("teardown in progress")):
        _send(signal.SIGINT, 300)
        _send(signal.SIGHUP, 300)
        finished = True
    assert finished
    assert said == ["teardown in progress"]  # once, not once per signal
    _send(signal.SIGINT, 50)  # the stop was taken: orch is on its way out
    assert signal.getsignal(signal.SIGINT) is stopsignals.raise_interrupt


def test_a_teardown_after_a_stop_raises_nothing_more(orchs_handlers: None) -> None:
    with pytest.raises(KeyboardInterrupt) as first:
        try:
            _send(signal.SIGINT)
        finally:
            with stopsignals.deferred():
                _send(signal.SIGINT, 100)
    assert first.value.__context__ is None  # the Ctrl-C that started it, not one raised during its teardown


def test_under_another_handler_a_teardowns_signal_is_raised_and_then_forgotten() -> None:
    """A caller of orch's core (a test, a library user) keeps its own handler: orch's is in place for the teardown
    alone, and the stop it took there is that caller's, so the next teardown again stops at its first signal."""
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    for _ in range(2):
        with pytest.raises(KeyboardInterrupt), stopsignals.deferred():
            _send(signal.SIGINT, 20)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_flood_during_a_benchmark_run_ends_it_with_one_keyboard_interrupt(orchs_handlers: None) -> None:
    """The client's own handler around its event loop: only the first signal cancels the run, none raises in the
    handler (a closed loop, a stack of cancellations), and orch's handler, back in place, counts the rest."""
    from orchestrator.client import runner as client

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    srv.settimeout(0.2)  # the server's thread sees `stop` between accepts
    port = srv.getsockname()[1]
    flooding = threading.Event()
    stop = threading.Event()

    def serve() -> None:
        # /metrics refused, then one request that never answers: the run waits until it is stopped.
        conns = []
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                continue
            conn.settimeout(None)
            conns.append(conn)
            if conn.recv(65536).startswith(b"GET /metrics"):
                conn.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                conn.close()
            else:
                flooding.set()

    def flood() -> None:
        flooding.wait(30)
        while not stop.is_set():
            os.kill(os.getpid(), signal.SIGINT)

    threads = [threading.Thread(target=serve, daemon=True), threading.Thread(target=flood, daemon=True)]
    for t in threads:
        t.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            client.run("127.0.0.1", port, wire("generate"), [{"text": "x", "stream": True}], [8], 1, timeout=30)
        assert signal.getsignal(signal.SIGINT) is stopsignals.raise_interrupt
        for _ in range(100):  # still flooded: nothing raises once the stop was taken
            os.kill(os.getpid(), signal.SIGINT)
    finally:
        stop.set()
        for t in threads:
            t.join(10)
        srv.close()


def test_a_signal_that_races_settling_is_ignored_without_a_traceback() -> None:
    """A stop signal pending as settle() sets SIG_IGN reaches Python with no handler, which prints "OSError: Signal 2
    ignored due to race condition" and a traceback (seen under a `kill -INT` flood): settle's hook drops exactly
    that, and passes anything else on."""
    import sys
    import types

    handlers = {sig: signal.getsignal(sig) for sig in stopsignals.STOP_SIGNALS}
    hook = sys.unraisablehook
    passed: list[BaseException | None] = []
    sys.unraisablehook = lambda u: passed.append(u.exc_value)
    try:
        stopsignals.settle()
        stopsignals.settle()  # again (orch settles once; a second wrapper must not drop more)
        race = OSError("Signal 2 ignored due to race condition")
        other = OSError("something else")
        for error in (race, other):
            sys.unraisablehook(types.SimpleNamespace(exc_value=error, exc_type=OSError, exc_traceback=None))
        assert passed == [other]
    finally:
        sys.unraisablehook = hook
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
