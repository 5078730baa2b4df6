"""SSH hosts: paramiko with ssh_config, verified host keys, one reused connection, a shipped host-side agent."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import logging
import os
import selectors
import shlex
import socket
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paramiko
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    retry_if_not_exception_type,
    stop_after_attempt,
    stop_before_delay,
    wait_random_exponential,
)

from orchestrator import yamlfile
from orchestrator.agent import ops
from orchestrator.errors import HostError
from orchestrator.hosts.agentlink import (
    AGENT_ENTRY,
    AgentLink,
    ConnectionLost,
    Stream,
    agent_files,
    agent_version,
    call_timeout,
)
from orchestrator.hosts.base import CallStats, Host, HostConfig, Progress
from orchestrator.hosts.inventory import TARGET_RE
from orchestrator.hosts.lock import HeldLock
from orchestrator.hosts.relay import Relay

log = logging.getLogger("orch.ssh")


class _QuietRefusedChannels(logging.Filter):
    # While a server loads its port refuses connections; each tunnelled readiness poll then makes paramiko log
    # "Secsh channel N open FAILED". That is the expected state, not an error worth showing.
    def filter(self, record: logging.LogRecord) -> bool:
        return "open FAILED" not in record.getMessage()


logging.getLogger("paramiko.transport").addFilter(_QuietRefusedChannels())


class _ChannelStream(Stream):
    """The agent's SSH channel as the byte stream AgentLink reads and writes."""

    def __init__(self, host: SSHHost, channel: paramiko.Channel) -> None:
        self.host = host
        self.channel = channel

    def send(self, data: bytes) -> None:
        try:
            self.channel.sendall(data)
        except (OSError, EOFError, paramiko.SSHException) as e:
            raise ConnectionLost(f"send failed: {e}") from e

    def recv(self, timeout: float) -> bytes | None:
        self.channel.settimeout(timeout)
        try:
            return bytes(self.channel.recv(65536))
        except TimeoutError:
            self.host._transport()  # raises if the transport died meanwhile
            return None
        except (OSError, EOFError, paramiko.SSHException) as e:
            raise ConnectionLost(f"receive failed: {e}") from e

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.channel.close()


def fingerprint(key: paramiko.PKey) -> str:
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def _connect_failure(e: Exception) -> str:
    """What went wrong while connecting, in words (paramiko's NoValidConnectionsError hides the errno)."""
    if isinstance(e, paramiko.ssh_exception.NoValidConnectionsError):
        errnos = {getattr(x, "errno", None) for x in e.errors.values()}
        if errnos <= {111, 61}:  # ECONNREFUSED (Linux, BSD)
            return "connection refused (nothing listens on that port)"
    if isinstance(e, ConnectionRefusedError):
        return "connection refused (nothing listens on that port)"
    return f"{type(e).__name__}: {e}"


def known_hosts_name(host: str, port: int) -> str:
    return host if port == 22 else f"[{host}]:{port}"


def keyscan_command(host: str, port: int, known_hosts: Path) -> str:
    """The shell line that adds a host's keys to known_hosts (ssh-keyscan writes `[host]:port` itself off port 22)."""
    port_arg = "" if port == 22 else f"-p {port} "
    return f"ssh-keyscan {port_arg}{shlex.quote(host)} >> {shlex.quote(str(known_hosts))}"


class _HostKeyPolicy(paramiko.MissingHostKeyPolicy):
    """Unknown keys are refused (with the fingerprint and how to accept), unless accept-new was asked for."""

    def __init__(self, accept_new: bool, known_hosts: Path, host: str, port: int) -> None:
        self.accept_new = accept_new
        self.known_hosts = known_hosts
        self.keyscan = keyscan_command(host, port, known_hosts)

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        fp = fingerprint(key)
        if not self.accept_new:
            raise HostError(
                f"unknown host key for {hostname}: {key.get_name()} {fp}. Check this fingerprint with the host's "
                f"administrator, then accept it with --accept-new-host-key (adds it to {self.known_hosts}) or "
                f"add it yourself, e.g. {self.keyscan}"
            )
        self.known_hosts.parent.mkdir(parents=True, exist_ok=True)
        with self.known_hosts.open("a") as f:
            f.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")
        client.get_host_keys().add(hostname, key.get_name(), key)
        log.warning("accepted new host key for %s: %s %s (saved to %s)", hostname, key.get_name(), fp, self.known_hosts)


@dataclass(frozen=True, kw_only=True)
class Endpoint:
    """Where and how to connect, after applying ~/.ssh/config (paramiko parses it but never applies it)."""

    hostname: str
    user: str
    port: int
    identity_files: tuple[str, ...]
    identities_only: bool
    known_hosts: Path
    proxy_jump: str | None
    proxy_command: str | None

    @property
    def display(self) -> str:
        return f"{self.user}@{self.hostname}:{self.port}"


def resolve_endpoint(
    cfg: paramiko.SSHConfig, alias: str, user: str | None, port: int | None, extra_identity_files: tuple[str, ...]
) -> Endpoint:
    entry = cfg.lookup(alias)
    for f in extra_identity_files:
        if not yamlfile.is_file(Path(f).expanduser()):
            raise HostError(f"identity_file {f[:200]}: no such file (set in the host inventory for {alias})")
    # Like ssh, IdentityFile entries from ssh_config that do not exist are skipped.
    ids = [str(Path(f).expanduser()) for f in (*extra_identity_files, *entry.get("identityfile", []))]
    try:
        config_port = int(entry.get("port", 22))
    except ValueError:
        raise HostError(f"ssh config: Port {entry.get('port')!r} for {alias} is not a number") from None

    def opt(name: str) -> str | None:
        value = entry.get(name)
        return None if value is None or str(value).lower() == "none" else str(value)

    return Endpoint(
        hostname=entry.get("hostname", alias),
        user=user or entry.get("user") or os.environ.get("USER") or "root",
        port=port or config_port,
        identity_files=tuple(f for f in ids if yamlfile.is_file(Path(f))),
        identities_only=str(entry.get("identitiesonly", "no")).lower() == "yes",
        known_hosts=Path(str(entry.get("userknownhostsfile", "~/.ssh/known_hosts")).split()[0]).expanduser(),
        proxy_jump=opt("proxyjump"),
        proxy_command=opt("proxycommand"),
    )


def load_ssh_config(path: str | None = None) -> paramiko.SSHConfig:
    """The ssh_config orch applies: `path`, else $ORCH_SSH_CONFIG, else ~/.ssh/config (empty if it does not exist)."""
    p = Path(path or os.environ.get("ORCH_SSH_CONFIG") or "~/.ssh/config").expanduser()
    if not p.is_file():
        return paramiko.SSHConfig()
    try:
        return paramiko.SSHConfig.from_path(str(p))
    except (OSError, paramiko.ConfigParseError) as e:
        raise HostError(f"{p}: cannot parse ssh config: {e}") from e


def effective_endpoint(config: HostConfig, ssh_config_path: str | None = None) -> Endpoint:
    """Where orch would connect for this inventory host: its own user/port, else ssh_config's, else defaults."""
    return resolve_endpoint(
        load_ssh_config(ssh_config_path), config.address or config.name, config.user, config.port, config.identity_file
    )


class SSHHost(Host):
    """A remote host. One SSH connection for the session; the agent runs there as one long-lived process."""

    def __init__(
        self, config: HostConfig, *, accept_new_host_key: bool = False, ssh_config_path: str | None = None
    ) -> None:
        assert config.address is not None
        self.config = config
        self.name = config.name
        self.stats = CallStats()
        self.python = config.python or "python3"
        self._accept_new = accept_new_host_key
        self._io_lock = threading.RLock()
        self._client: paramiko.SSHClient | None = None
        self._jump: paramiko.SSHClient | None = None
        self._agent: paramiko.Channel | None = None
        self._link: AgentLink | None = None
        self._stderr: deque[str] = deque(maxlen=50)
        self._tunnels: dict[tuple[str, int], Tunnel] = {}
        self._host_lock = HeldLock()
        self._closed = False
        self._agent_abandoned = False  # orch closed the agent channel on purpose (Ctrl-C mid-request)
        self._closing = False
        self._lost: str | None = None  # set once reconnecting has failed for good
        self._seq = 0
        self._resolve_ssh_config(ssh_config_path)
        self.workdir = ""
        self.agent_dir = ""
        self.sim_pythonpath = None
        self._connect_with_retry(attempts=3)

    @property
    def reach_address(self) -> str | None:
        return self.endpoint.hostname  # an ssh_config alias resolved: what other nodes can reach too

    # ------------------------------------------------------------ connecting

    def _resolve_ssh_config(self, path: str | None) -> None:
        self._ssh_config = load_ssh_config(path)
        self.endpoint = resolve_endpoint(
            self._ssh_config, self.config.address or "", self.config.user, self.config.port, self.config.identity_file
        )
        self.display = self.endpoint.display

    def _connect_client(self, ep: Endpoint, sock: Any) -> paramiko.SSHClient:
        client = paramiko.SSHClient()
        with contextlib.suppress(OSError):
            client.load_system_host_keys()
        if ep.known_hosts.is_file():
            try:
                client.load_host_keys(str(ep.known_hosts))
            except (OSError, paramiko.SSHException) as e:
                raise HostError(f"{ep.known_hosts}: cannot read known hosts: {e}") from e
        client.set_missing_host_key_policy(_HostKeyPolicy(self._accept_new, ep.known_hosts, ep.hostname, ep.port))
        try:
            client.connect(
                ep.hostname,
                port=ep.port,
                username=ep.user,
                key_filename=list(ep.identity_files) or None,  # type: ignore[arg-type]  # stubs lag: a list works
                timeout=self.config.connect_timeout_s,
                banner_timeout=15,
                auth_timeout=30,
                channel_timeout=30,
                allow_agent=not ep.identities_only,
                look_for_keys=not ep.identities_only,
                sock=sock,
            )
        except paramiko.BadHostKeyException as e:
            client.close()
            name = known_hosts_name(ep.hostname, ep.port)
            raise HostError(
                f"HOST KEY CHANGED for {name}: known_hosts has {fingerprint(e.expected_key)}, the server offered "
                f"{fingerprint(e.key)}. orch refuses to connect (this is what a man-in-the-middle looks like). If the "
                f"host was reinstalled, remove the old key: ssh-keygen -R '{name}' -f {ep.known_hosts}"
            ) from e
        except paramiko.AuthenticationException as e:
            client.close()
            tried = ", ".join(ep.identity_files) or "ssh-agent and default keys"
            raise HostError(
                f"{ep.display}: authentication failed ({e}); tried {tried}. Put the public key of one of them in "
                f"~{ep.user}/.ssh/authorized_keys on the host, or name the right key with `identity_file` in "
                "hosts.yaml (or IdentityFile in ssh_config)"
            ) from e
        except BaseException:
            client.close()
            raise
        transport = client.get_transport()
        assert transport is not None
        transport.set_keepalive(15)
        return client

    def _open_socket(self, ep: Endpoint) -> Any:
        if ep.proxy_command:
            return paramiko.ProxyCommand(ep.proxy_command)
        if ep.proxy_jump:
            # paramiko has no ProxyJump: connect to the jump host and tunnel a direct-tcpip channel through it.
            m = TARGET_RE.match(ep.proxy_jump.split(",")[0].strip())
            if not m:
                raise HostError(f"ProxyJump {ep.proxy_jump!r} for {ep.display}: cannot parse it")
            jump = resolve_endpoint(
                self._ssh_config, m["addr"].strip("[]"), m["user"], int(m["port"]) if m["port"] else None, ()
            )
            self._jump = self._connect_client(jump, self._open_socket(jump))
            transport = self._jump.get_transport()
            assert transport is not None
            return transport.open_channel("direct-tcpip", (ep.hostname, ep.port), ("127.0.0.1", 0), timeout=30)
        return None

    def _connect_with_retry(self, attempts: int | None = None) -> None:
        stop = stop_after_attempt(attempts) if attempts else stop_before_delay(self.config.reconnect_s)
        retrying = Retrying(
            stop=stop,
            wait=wait_random_exponential(multiplier=0.5, max=5),
            # A name that does not resolve will not resolve on the next try either.
            retry=retry_if_exception_type((OSError, EOFError, paramiko.SSHException, ConnectionLost))
            & retry_if_not_exception_type(socket.gaierror),
            before_sleep=self._log_retry,
            reraise=True,
        )
        try:
            for attempt in retrying:
                with attempt:
                    self._connect()
        except HostError:
            raise
        except (OSError, EOFError, paramiko.SSHException, ConnectionLost) as e:
            hint = ""
            if not self.config.source:
                hint = f" ({self.config.name!r} is not in a host inventory, so it was used as an SSH address)"
            raise HostError(
                f"cannot connect to {self.name} ({self.display}): {_connect_failure(e)}{hint}. "
                + self._connect_advice(e)
            ) from e

    def _log_retry(self, state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        wait = state.next_action.sleep if state.next_action is not None else 0.0
        what = _connect_failure(exc) if isinstance(exc, Exception) else "failed"
        attempts = getattr(state.retry_object.stop, "max_attempt_number", None)
        bound = f"attempt {state.attempt_number} of {attempts}" if attempts else f"attempt {state.attempt_number}"
        limit = "" if attempts else f", for up to {self.config.reconnect_s:.0f}s in all"
        log.warning(
            "%s: the SSH connection to %s failed on %s: %s; connecting again in %.1fs%s",
            self.name, self.display, bound, what, wait, limit,
        )  # fmt: skip

    def _connect_advice(self, e: BaseException) -> str:
        ep = self.endpoint
        if isinstance(e, socket.gaierror):
            return f"Check the address {ep.hostname!r} (hosts.yaml `address`, or HostName in ssh_config)"
        if isinstance(e, TimeoutError | socket.timeout):
            return (
                f"Check that {ep.hostname} is up and reachable from here (no firewall dropping port {ep.port}); "
                f"connect_timeout_s in hosts.yaml is {self.config.connect_timeout_s:g}s"
            )
        return (
            f"Check that {ep.hostname} is up and its sshd listens on port {ep.port} "
            f"(try: ssh -p {ep.port} {ep.user}@{ep.hostname}), or set `port` in hosts.yaml / Port in ssh_config"
        )

    def _connect(self) -> None:
        self._drop()
        self._client = self._connect_client(self.endpoint, self._open_socket(self.endpoint))
        self._install_agent()
        self._start_agent()
        self._retake_lock()

    def _retake_lock(self) -> None:
        self._host_lock.retake(self._request, f"{self.name}: after reconnecting")

    def _drop(self) -> None:
        for ch in (self._agent,):
            if ch is not None:
                with contextlib.suppress(Exception):
                    ch.close()
        for c in (self._client, self._jump):
            if c is not None:
                with contextlib.suppress(Exception):
                    c.close()
        self._agent = self._client = self._jump = None
        self._link = None

    def _transport(self) -> paramiko.Transport:
        t = self._client.get_transport() if self._client else None
        if t is None or not t.is_active():
            raise ConnectionLost("the SSH transport is not active")
        return t

    def _install_agent(self) -> None:
        """Copy the agent (and the simulator) to <workdir>/agent-<version>/ once per version, atomically."""
        assert self._client is not None
        files = agent_files()
        version = agent_version(files)
        sftp = self._client.open_sftp()
        self.stats.record_channel("sftp")
        try:
            home = sftp.normalize(".")
            workdir = self.config.workdir or ".orch"
            if workdir.startswith("~/"):
                workdir = workdir[2:]
            self.workdir = workdir if workdir.startswith("/") else f"{home}/{workdir}"
            self.agent_dir = f"{self.workdir}/agent-{version}"
            self.sim_pythonpath = self.agent_dir
            _sftp_makedirs(sftp, self.workdir)
            try:
                sftp.stat(f"{self.agent_dir}/.complete")
                return
            except OSError:
                pass
            tmp = f"{self.agent_dir}.tmp-{uuid.uuid4().hex[:8]}"
            for name, data in files.items():
                _sftp_makedirs(sftp, os.path.dirname(f"{tmp}/{name}"))
                sftp.putfo(io.BytesIO(data), f"{tmp}/{name}")
            sftp.putfo(io.BytesIO(version.encode()), f"{tmp}/.complete")
            # Fails only when another orch installed the same version meanwhile; ours stays behind as a temp dir.
            with contextlib.suppress(OSError):
                sftp.posix_rename(tmp, self.agent_dir)
        finally:
            sftp.close()

    def _start_agent(self) -> None:
        transport = self._transport()
        cmd = (
            f"cd {shlex.quote(self.workdir)} && exec {shlex.quote(self.python)} "
            f"{shlex.quote(self.agent_dir + '/' + AGENT_ENTRY)} --serve"
        )
        try:
            self.stats.record_channel("agent")
            channel = transport.open_session(timeout=30)
            channel.exec_command(cmd)
        except (OSError, EOFError, paramiko.SSHException) as e:
            # A transport closing under us: a lost connection (reconnect), never an EOFError that click would turn
            # into a bare "Aborted."
            raise ConnectionLost(f"could not start the agent: {type(e).__name__}: {e}") from e
        self._agent = channel
        self._link = AgentLink(_ChannelStream(self, channel), self._seq)
        self._stderr.clear()
        threading.Thread(target=self._drain_stderr, args=(channel,), daemon=True).start()
        try:
            hello = self._request({"op": "hello", "args": {}}, timeout=30)
        except ConnectionLost:
            time.sleep(0.2)
            if channel.exit_status_ready() and channel.recv_exit_status() != 0:
                err = " ".join(self._stderr).strip()
                raise HostError(
                    f"{self.name}: could not start orch's agent with {self.python!r} ({err or 'it exited'}); "
                    "set the host's `python` in hosts.yaml to an interpreter with psutil"
                ) from None
            raise
        if not hello.get("ok") or hello["result"].get("protocol") != ops.PROTOCOL_VERSION:
            raise HostError(f"{self.name}: agent protocol mismatch: {hello}")

    def _drain_stderr(self, channel: paramiko.Channel) -> None:
        # Read stderr concurrently so a chatty agent can never fill the window and deadlock the channel.
        with contextlib.suppress(Exception):
            while True:
                data = channel.recv_stderr(4096)
                if not data:
                    return
                self._stderr.append(data.decode(errors="replace"))

    # ------------------------------------------------------------ requests

    def _request(self, request: dict[str, Any], timeout: float, on_progress: Progress | None = None) -> dict[str, Any]:
        """Send one request and read its reply, by id, under our own deadlines (paramiko's would wait forever).
        Heartbeats carrying an operation's progress events go to on_progress, a run's live counts to the display."""
        channel, link = self._agent, self._link
        if channel is None or link is None or channel.closed or channel.exit_status_ready():
            raise ConnectionLost("the agent channel is closed")
        try:
            return link.request(request, timeout, on_progress)
        except ConnectionLost:
            self._drop()
            raise
        except BaseException:
            # Ctrl-C (or any other error of ours) mid-request leaves a reply in flight; never let a later call read
            # it. Closing the agent's channel makes that agent exit (it sees EOF), so an abandoned benchmark run
            # stops at once. The SSH connection itself is fine: keep it, so the next call (the teardown) quietly
            # starts a fresh agent on it instead of looking like, and being handled as, a network failure.
            self._abandon_agent()
            raise
        finally:
            self._seq = link.seq

    def _abandon_agent(self) -> None:
        if self._agent is not None:
            with contextlib.suppress(Exception):
                # This orch lives on and its next agent takes the host lock over from a keeper: closing the channel
                # alone would release the lock to a session waiting for the host while this one still tears down.
                self._agent.sendall(ops.ABANDON + b"\n")
            with contextlib.suppress(Exception):
                self._agent.close()
        self._agent = None
        self._link = None
        self._agent_abandoned = True

    def _restart_abandoned_agent(self) -> None:
        """After _abandon_agent: a new agent on the same connection (one try; no reconnect loop, no warning)."""
        self._agent_abandoned = False
        try:
            self._transport()
        except ConnectionLost:
            return  # the network did fail meanwhile: the caller's normal loss handling says so and reconnects
        self._start_agent()
        self._retake_lock()

    def _roundtrip(
        self, request: dict[str, Any], timeout: float | None = None, on_progress: Progress | None = None
    ) -> dict[str, Any]:
        timeout = call_timeout(request, timeout)
        with self._io_lock:
            if self._closed:
                # A call after close() (e.g. from a late tunnel thread) is our doing, not a network failure.
                raise HostError(f"{self.name}: the SSH connection was closed by orch; no more host-side calls")
            if self._lost is not None:
                raise HostError(self._lost)  # fail fast: reconnecting already failed for the full bound
            try:
                if self._agent_abandoned:
                    self._restart_abandoned_agent()
                reply = self._request(request, timeout, on_progress)
            except ConnectionLost as first:
                if request["op"] == "launch":
                    # Not repeatable: we cannot know whether it started. The marker will find it either way.
                    raise HostError(f"{self.name}: connection lost while launching ({first})") from first
                log.warning(
                    "%s: the SSH connection was lost during the host-side call %r (%s); reconnecting for up to %.0fs, "
                    "then making that call again",
                    self.name, request["op"], first, self.config.reconnect_s,
                )  # fmt: skip
                self.ensure_connected(force=True)
                reply = self._request(request, timeout, on_progress)
        self._host_lock.note(request, reply)
        return reply

    def ensure_connected(self, force: bool = False) -> None:
        with self._io_lock:
            if self._closed:
                raise HostError(f"{self.name}: the SSH connection was closed by orch")
            if not force and self._agent_abandoned:
                with contextlib.suppress(ConnectionLost):
                    self._restart_abandoned_agent()
            if not force:
                try:
                    self._transport()
                    if self._agent is not None and not self._agent.closed:
                        return
                except ConnectionLost:
                    pass
            if self._lost is not None:
                raise HostError(self._lost)
            self.stats.reconnects += 1
            try:
                self._connect_with_retry()
            except HostError as e:
                self._lost = (
                    f"lost the SSH connection to {self.name} and could not reconnect within "
                    f"{self.config.reconnect_s:.0f}s ({e}). Servers orch started there keep running: stop them "
                    f"with `orch down --host {self.name}` (the next orch run on that host also cleans them up)"
                )
                raise HostError(self._lost) from e

    # ------------------------------------------------------------ HTTP through the connection

    def url(self, port: int, address: str = "127.0.0.1") -> str:
        tunnel = self._tunnels.get((address, port))
        if tunnel is None:
            tunnel = self._tunnels[(address, port)] = Tunnel(self, address, port)
        return f"http://127.0.0.1:{tunnel.local_port}"

    def close(self) -> None:
        if self._closed or self._closing:
            return
        self._closing = True
        for tunnel in self._tunnels.values():
            tunnel.close()
        self._tunnels.clear()
        if self._lost is None and not self._agent_abandoned:
            self._host_lock.release(self.call)
        self._closed = True
        self._drop()


def _sftp_makedirs(sftp: paramiko.SFTPClient, path: str) -> None:
    parts = path.strip("/").split("/")
    current = ""
    for part in parts:
        current += "/" + part
        try:
            sftp.stat(current)
        except OSError:
            with contextlib.suppress(OSError):
                sftp.mkdir(current)


class Tunnel(Relay):
    """A local port forwarded to address:port on the host through `direct-tcpip` channels."""

    def __init__(self, host: SSHHost, address: str, port: int) -> None:
        self.host = host
        super().__init__(address, port, backlog=128, name=f"tunnel-{port}")

    def _serve(self, client: socket.socket) -> None:
        try:
            # The current transport: after a reconnect new connections use the new one.
            self.host.stats.record_channel("tunnel")
            channel = self.host._transport().open_channel(
                "direct-tcpip", (self.address, self.port), client.getpeername(), timeout=10
            )
        except Exception:
            client.close()  # the HTTP client sees a refused/reset connection, as if the port were closed
            return
        # selectors (epoll), not select(): select() cannot watch a descriptor above 1024, which an open-loop run with
        # many requests in flight reaches.
        watch = selectors.DefaultSelector()
        try:
            watch.register(client, selectors.EVENT_READ)
            watch.register(channel, selectors.EVENT_READ)
            while True:
                readable = [key.fileobj for key, _ in watch.select(1.0)]
                if self.closed:
                    return
                if client in readable:
                    data = client.recv(65536)
                    if not data:
                        return
                    channel.sendall(data)
                if channel in readable:
                    data = channel.recv(65536)
                    if not data:
                        return
                    client.sendall(data)
        except (OSError, EOFError, paramiko.SSHException):
            return
        finally:
            watch.close()
            with contextlib.suppress(Exception):
                channel.close()
            client.close()
