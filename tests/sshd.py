"""A real OpenSSH server on 127.0.0.1 for tests and benchmarks: keys, configs, start/stop and fault injection."""

# Facts this harness relies on (OpenSSH 9.2p1 on Debian 12, run as root):
# - Process tree: the listener (`sshd: /usr/sbin/sshd -D -f CFG -E LOG [listener] 0 of 50-50 startups`) forks and
#   re-execs one `sshd` per connection. Before authentication that is `sshd: root [priv]` (the monitor) with an
#   unprivileged `sshd: root [net]` child (user sshd); after a *root* login there is no separate privsep child:
#   the monitor itself becomes `sshd: root@notty` (no pty) and the remote commands are its children. Every one
#   of these has comm (psutil `name()`) "sshd", which is how `session_pids` tells them from the commands.
# - PATH on the remote side: with UsePAM no, sshd starts sessions with PATH from `SetEnv` when given (else its
#   built-in default). Debian's bash then sources root's ~/.bashrc even for non-interactive `ssh host CMD`; on this
#   machine that runs `pyenv init` and the cargo env, which *prepend* ~/.cargo/bin and the pyenv shims but keep the
#   rest, so the `path_prepend` directory is still on PATH (behind them: `python3` resolves to the pyenv shim, which
#   has no psutil, but nothing there is named nvidia-smi). `start` verifies it with a real `ssh` whenever
#   `path_prepend` is given and fails clearly if a shell startup file clobbered it. It also costs ~0.1 s per command.
# - PID 1 on these machines does not reap orphans: a killed session process lingers as a zombie; zombies count as dead.

from __future__ import annotations

import atexit
import contextlib
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import psutil

from tests import markers

SSHD_BIN = "/usr/sbin/sshd"
SSH_BIN = "/usr/bin/ssh"
SSH_KEYGEN = "/usr/bin/ssh-keygen"
HOST_ALIAS = "testbox"
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
START_TIMEOUT_S = 10.0
KILL_TIMEOUT_S = 5.0


class SSHDError(RuntimeError):
    """The test sshd could not be configured, started or stopped."""


class TempPathFactory(Protocol):
    """The part of pytest's `tmp_path_factory` this module uses (no pytest import here)."""

    def mktemp(self, basename: str, numbered: bool = True) -> Path: ...


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _keygen(path: Path) -> None:
    for p in (path, path.with_name(path.name + ".pub")):
        p.unlink(missing_ok=True)
    subprocess.run(
        [SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-C", f"orch-test-{path.name}", "-f", str(path)],
        check=True,
        capture_output=True,
        stdin=subprocess.DEVNULL,
    )


def _quote_cfg(value: str | Path) -> str:
    """Quote a config value only when it needs it (paramiko's ssh_config parser is picky about quotes)."""
    text = str(value)
    return f'"{text}"' if any(c.isspace() for c in text) else text


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
    except psutil.AccessDenied:
        return True


def _listening(port: int) -> bool:
    """Whether something listens on 127.0.0.1:port (from /proc/net/tcp, so no probe connection is made)."""
    want = f"0100007F:{port:04X}"
    try:
        lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return False
    return any(parts[1] == want and parts[3] == "0A" for parts in (line.split() for line in lines) if len(parts) > 3)


def _kill_and_wait(procs: list[psutil.Process], timeout: float = KILL_TIMEOUT_S) -> list[int]:
    """SIGKILL each (psutil checks the PID still names the same process) and wait until all are dead or zombies."""
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.ZombieProcess):
            p.kill()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = [p for p in procs if _alive(p)]
        if not left:
            return []
        time.sleep(0.02)
    return [p.pid for p in procs if _alive(p)]


@dataclass
class SSHD:
    """One running sshd on 127.0.0.1:port, everything it needs under `root`, and a client side that trusts it."""

    root: Path
    port: int
    host_key: Path
    client_key: Path
    known_hosts: Path
    ssh_config: Path
    pid: int
    log: Path
    sshd_config: Path
    _proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _born: float = field(default=0.0, repr=False)  # create time of the first listener

    # ---- lifecycle ---------------------------------------------------------------------------------------------

    @classmethod
    def start(cls, root: Path, *, extra_config: str = "", path_prepend: str | None = None) -> SSHD:
        """Generate keys and configs under `root`, start sshd on a free port and wait until it listens.

        `path_prepend` (e.g. a directory holding a fake nvidia-smi) is put in front of the sessions' PATH.
        `extra_config` is appended to sshd_config verbatim.
        """
        markers.require("ssh")
        root = root.resolve()
        root.mkdir(parents=True, exist_ok=True)
        host_key, client_key = root / "host_ed25519", root / "client_ed25519"
        _keygen(host_key)
        _keygen(client_key)
        authorized = root / "authorized_keys"
        authorized.write_text(client_key.with_name(client_key.name + ".pub").read_text())
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # privilege-separation directory

        last_error: SSHDError | None = None
        for _ in range(5):  # a free port can be taken by someone else before sshd binds it: retry on another
            port = _free_port()
            server = cls(
                root=root,
                port=port,
                host_key=host_key,
                client_key=client_key,
                known_hosts=root / "known_hosts",
                ssh_config=root / "ssh_config",
                pid=0,
                log=root / "sshd.log",
                sshd_config=root / "sshd_config",
            )
            server._write_sshd_config(authorized, extra_config, path_prepend)
            server._check_config()
            try:
                server._launch()
            except SSHDError as exc:
                if "Address already in use" not in str(exc):
                    raise
                last_error = exc
                continue
            atexit.register(server.stop)
            server._write_client_files()
            if path_prepend is not None:
                try:
                    server._check_remote_path(path_prepend)
                except BaseException:
                    server.stop()
                    raise
            return server
        raise SSHDError(f"could not bind a free port after 5 tries: {last_error}")

    def stop(self) -> None:
        """Kill the listener, every process of its tree (per-connection sshds and their commands), and orphans.

        The tree is frozen first (SIGSTOP, repeated until no new member appears) so nothing forks or gets
        reparented away while it is being killed. Then `orphan_pids()` (commands that outlived their connection,
        e.g. after `drop_connections`) are killed too, except processes carrying an orch launch marker
        (ORCH_LAUNCH_ID): those are orch's to tear down, and the test session's sweep reports them as leaks.
        Idempotent. Only PIDs of this tree or carrying this server's SSH_CONNECTION are ever signalled.
        """
        atexit.unregister(self.stop)
        self._kill_tree()
        for _ in range(5):  # an orphan may fork while we look
            orphans = self._orphans(include_marked=False)
            if not orphans:
                return
            left = _kill_and_wait(orphans)
            if left:
                raise SSHDError(f"orphaned session processes survived SIGKILL: {left}")

    def _kill_tree(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        victims: dict[int, psutil.Process] = {}
        try:
            listener = psutil.Process(proc.pid)
            with contextlib.suppress(psutil.NoSuchProcess, psutil.ZombieProcess):
                listener.suspend()
            for _ in range(50):
                try:
                    fresh = [c for c in listener.children(recursive=True) if c.pid not in victims]
                except (psutil.NoSuchProcess, psutil.ZombieProcess):
                    break
                if not fresh:
                    break
                for child in fresh:
                    victims[child.pid] = child
                    with contextlib.suppress(psutil.NoSuchProcess, psutil.ZombieProcess):
                        child.suspend()
        except psutil.NoSuchProcess:
            pass
        left = _kill_and_wait(list(victims.values()))
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        try:
            proc.wait(KILL_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            left.append(proc.pid)
        if left:
            raise SSHDError(f"sshd processes survived SIGKILL: {left}")

    def __enter__(self) -> SSHD:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- inspection and faults ---------------------------------------------------------------------------------

    def session_pids(self) -> list[int]:
        """PIDs of the live per-connection sshd processes (descendants of the listener named sshd)."""
        return sorted(p.pid for p in self._sessions())

    def orphan_pids(self, include_marked: bool = True) -> list[int]:
        """Live processes started through this server that are no longer in its tree (reparented to PID 1).

        Found by the SSH_CONNECTION sshd puts in every session's environment (server end 127.0.0.1 PORT) and
        created after this server first started. `include_marked=False` leaves out orch launches (ORCH_LAUNCH_ID).
        """
        return sorted(p.pid for p in self._orphans(include_marked))

    def drop_connections(self) -> list[int]:
        """SIGKILL every per-connection sshd, as if the network dropped; the listener keeps accepting.

        Their TCP sockets close, so clients see the connection die. Commands those sessions ran are not
        signalled (like a real drop: without a pty they run on, reparented, until their pipes break); they
        show up in `orphan_pids()` and `stop()` kills them. Returns the PIDs killed.
        """
        sessions = self._sessions()
        left = _kill_and_wait(sessions)
        if left:
            raise SSHDError(f"session sshd processes survived SIGKILL: {left}")
        return sorted(p.pid for p in sessions)

    def rotate_host_key(self) -> None:
        """Replace the host key and restart sshd on the same port; known_hosts keeps the old key.

        Existing connections are dropped, as when a host is reinstalled. Clients must then see a *changed* key.
        """
        self._kill_tree()
        _keygen(self.host_key)
        self._launch()

    def target(self) -> str:
        """The target string orch takes for this server."""
        return f"root@127.0.0.1:{self.port}"

    def ssh_argv(self, *command: str) -> list[str]:
        """argv running `command` on the server through the OpenSSH client and this server's ssh_config."""
        return [SSH_BIN, "-F", str(self.ssh_config), "-o", "BatchMode=yes", HOST_ALIAS, *command]

    def ssh(self, command: str, timeout: float = 20.0) -> subprocess.CompletedProcess[str]:
        """Run a shell command on the server with the OpenSSH client; output captured as text."""
        return subprocess.run(
            self.ssh_argv(command), capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
        )

    def host_public_key(self) -> str:
        """The current host public key, 'ssh-ed25519 AAAA...'."""
        return " ".join(self.host_key.with_name(self.host_key.name + ".pub").read_text().split()[:2])

    # ---- internals ---------------------------------------------------------------------------------------------

    def _orphans(self, include_marked: bool) -> list[psutil.Process]:
        if not self._born:
            return []
        tree: set[int] = set()
        if self._proc is not None:
            with contextlib.suppress(psutil.NoSuchProcess, psutil.ZombieProcess):
                tree = {self._proc.pid, *(c.pid for c in psutil.Process(self._proc.pid).children(recursive=True))}
        me = os.getpid()
        out = []
        for proc in psutil.process_iter():
            if proc.pid in tree or proc.pid == me:
                continue
            try:
                if proc.create_time() < self._born or proc.status() == psutil.STATUS_ZOMBIE:
                    continue
                env = proc.environ()
            except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied, OSError):
                continue
            conn = env.get("SSH_CONNECTION", "").split()
            ours = len(conn) == 4 and conn[2:] == ["127.0.0.1", str(self.port)]
            if ours and (include_marked or "ORCH_LAUNCH_ID" not in env):
                out.append(proc)
        return out

    def _sessions(self) -> list[psutil.Process]:
        if self._proc is None:
            return []
        try:
            kids = psutil.Process(self._proc.pid).children(recursive=True)
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            return []
        out = []
        for kid in kids:
            try:
                if kid.name() == "sshd" and kid.status() != psutil.STATUS_ZOMBIE:
                    out.append(kid)
            except (psutil.NoSuchProcess, psutil.ZombieProcess):
                continue
        return out

    def _write_sshd_config(self, authorized: Path, extra_config: str, path_prepend: str | None) -> None:
        lines = [
            f"Port {self.port}",
            "ListenAddress 127.0.0.1",
            f"HostKey {_quote_cfg(self.host_key)}",
            f"PidFile {_quote_cfg(self.root / 'sshd.pid')}",
            f"AuthorizedKeysFile {_quote_cfg(authorized)}",
            "StrictModes no",
            "UsePAM no",
            "PermitRootLogin prohibit-password",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "Subsystem sftp internal-sftp",
            # Debian's default: a client's environment requests other than these are silently dropped.
            "AcceptEnv LANG LC_*",
            "ClientAliveInterval 5",
            "ClientAliveCountMax 3",
            "MaxStartups 50",
            "MaxSessions 50",
        ]
        if path_prepend is not None:
            lines.append(f'SetEnv "PATH={path_prepend}:{BASE_PATH}"')
        text = "\n".join(lines) + "\n"
        if extra_config:
            text += extra_config.rstrip("\n") + "\n"
        self.sshd_config.write_text(text)

    def _check_config(self) -> None:
        res = subprocess.run(
            [SSHD_BIN, "-t", "-f", str(self.sshd_config)], capture_output=True, text=True, stdin=subprocess.DEVNULL
        )
        if res.returncode != 0:
            raise SSHDError(
                f"`sshd -t` rejected {self.sshd_config} (exit {res.returncode}):\n{(res.stderr + res.stdout).strip()}"
                f"\n--- sshd_config ---\n{self.sshd_config.read_text()}"
            )

    def _launch(self) -> None:
        """Start the listener in the foreground (so its PID is ours) and wait until it listens."""
        offset = self.log.stat().st_size if self.log.exists() else 0
        out = self.root / "sshd.out"
        with out.open("ab") as stream:
            proc = subprocess.Popen(
                [SSHD_BIN, "-D", "-f", str(self.sshd_config), "-E", str(self.log)],
                stdin=subprocess.DEVNULL,
                stdout=stream,
                stderr=stream,
                start_new_session=True,
            )
        self._proc, self.pid = proc, proc.pid
        if not self._born:
            with contextlib.suppress(psutil.NoSuchProcess):
                self._born = psutil.Process(proc.pid).create_time()
        ready = f"Server listening on 127.0.0.1 port {self.port}."
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            logged = self._log_since(offset)
            if proc.poll() is not None:
                self._proc = None
                raise SSHDError(
                    f"sshd exited with status {proc.returncode} during start:\n{logged}\n{out.read_text()}".rstrip()
                )
            if ready in logged and _listening(self.port):
                return
            time.sleep(0.02)
        self._kill_tree()
        raise SSHDError(
            f"sshd did not listen on 127.0.0.1:{self.port} within {START_TIMEOUT_S}s:\n{self._log_since(0)}"
        )

    def _log_since(self, offset: int) -> str:
        try:
            with self.log.open("rb") as f:
                f.seek(offset)
                return f.read().decode(errors="replace")
        except FileNotFoundError:
            return ""

    def _write_client_files(self) -> None:
        self.known_hosts.write_text(f"[127.0.0.1]:{self.port} {self.host_public_key()}\n")
        self.ssh_config.write_text(
            f"Host {HOST_ALIAS}\n"
            "    HostName 127.0.0.1\n"
            f"    Port {self.port}\n"
            "    User root\n"
            f"    IdentityFile {_quote_cfg(self.client_key)}\n"
            "    IdentitiesOnly yes\n"
            f"    UserKnownHostsFile {_quote_cfg(self.known_hosts)}\n"
            "    StrictHostKeyChecking yes\n"
        )

    def _check_remote_path(self, path_prepend: str) -> None:
        """Fail clearly if the remote shell's startup files dropped `path_prepend` from PATH."""
        res = self.ssh('printf %s "$PATH"')
        if res.returncode != 0:
            raise SSHDError(f"ssh to the test sshd failed (exit {res.returncode}): {res.stderr.strip()}")
        if path_prepend not in res.stdout.split(":"):
            raise SSHDError(
                f"remote PATH lost {path_prepend!r} (a shell startup file on this machine rewrites PATH): "
                f"{res.stdout!r}"
            )
        # Let the check's session process finish so callers start from zero sessions.
        deadline = time.monotonic() + 2.0
        while self._sessions() and time.monotonic() < deadline:
            time.sleep(0.02)


def sshd_fixture(
    tmp_path_factory: TempPathFactory, *, extra_config: str = "", path_prepend: str | None = None
) -> Iterator[SSHD]:
    """Body of a pytest fixture: `yield from sshd_fixture(tmp_path_factory, ...)` in a @pytest.fixture."""
    server = SSHD.start(tmp_path_factory.mktemp("sshd"), extra_config=extra_config, path_prepend=path_prepend)
    try:
        yield server
    finally:
        server.stop()
