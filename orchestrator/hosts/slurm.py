"""Slurm hosts: one allocation per session, orch's agent in a step of it (`srun --overlap`), the same JSON protocol."""

# How it fits together (facts verified on the tests' one-node cluster, tests/slurmcluster.py; see slurm_cli.py):
# - The allocation is asked for when the host is opened and released when it is closed: every arm of an experiment
#   runs on the same node(s). Its name carries this session (slurm_cli.job_name), so the next orch releases it if this
#   one crashes (slurm_cli.release_leftovers); its time limit bounds how long a crash can hold GPUs anyway.
# - The agent is one step: `srun --jobid J --overlap -N1 -n1 -w NODE -u python -c BOOTSTRAP`. Nothing is assumed
#   about shared home directories: the bootstrap reads the agent's files from its stdin (length-prefixed, exact
#   reads, so no byte of the requests that follow is swallowed), writes them to <workdir>/agent-<version>/ on the
#   node once per version (atomically, as over SSH), says where, and starts `orch_agent.py --serve` on the same stdio
#   as its child. Once the agent is gone, however it ended (EOF when orch closes it, is interrupted or dies; SIGTERM,
#   passed on, when Slurm ends the step at the job's time limit or scancel, SIGKILL following after KillWait), the
#   bootstrap tears down the launches it owned (op_down: only launches whose owner is dead): a detached server
#   escapes Slurm's process tracking where that follows parentage (proctrack/linuxproc), and where over SSH the
#   next session cleans up, here the next session may never get that node. After a normal session there is none.
# - The step gets all of the job's GRES (no --gres): the servers the agent launches see the allocated GPUs.
# - Ending srun ends the step (and what Slurm tracks of it), never the allocation; scancel ends both.
# - HTTP from here to a server on the node (the fingerprint's GET, --client local) goes through one small step per
#   connection that relays between its stdio and the node's 127.0.0.1:PORT, like SSH's direct-tcpip channels.

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import select
import socket
import subprocess
import threading
import time
import zlib
from collections import deque
from typing import Any

from orchestrator.agent import ops
from orchestrator.errors import AllocationEnded, HostError
from orchestrator.hosts import slurm_cli
from orchestrator.hosts.agentlink import (
    AGENT_ENTRY,
    AgentLink,
    ConnectionLost,
    Stream,
    agent_files,
    agent_version,
    call_timeout,
)
from orchestrator.hosts.base import CallStats, Host, HostConfig, Progress, default_namespace
from orchestrator.hosts.lock import HeldLock
from orchestrator.hosts.relay import Relay
from orchestrator.hosts.slurm_cli import Allocation, AllocationRequest, QueueState, Slurm, SlurmError
from orchestrator.ui import progress
from orchestrator.ui.events import Events

log = logging.getLogger("orch.slurm")

# Runs on the node with the host's python (3.8+, stdlib only) as `python -c BOOTSTRAP`.
BOOTSTRAP = r"""
import base64, json, os, shutil, signal, sys, zlib
def read(n):
    data = b""
    while len(data) < n:
        chunk = os.read(0, n - len(data))
        if not chunk:
            sys.exit("orch bootstrap: stdin closed early")
        data += chunk
    return data
head = b""
while not head.endswith(b"\n"):
    head += read(1)
payload = json.loads(zlib.decompress(base64.b64decode(read(int(head)))))
workdir = os.path.abspath(os.path.expanduser(payload["workdir"]))
agent = os.path.join(workdir, "agent-" + payload["version"])
if not os.path.exists(os.path.join(agent, ".complete")):
    tmp = "%s.tmp-%d" % (agent, os.getpid())
    for name, data in payload["files"].items():
        path = os.path.join(tmp, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))
    with open(os.path.join(tmp, ".complete"), "w") as f:
        f.write(payload["version"])
    try:
        os.rename(tmp, agent)
    except OSError:  # another session installed the same version meanwhile
        shutil.rmtree(tmp, ignore_errors=True)
os.chdir(workdir)
sys.stdout.write(json.dumps({"workdir": workdir, "agent_dir": agent}) + "\n")
sys.stdout.flush()
argv = [sys.executable, os.path.join(agent, payload["entry"]), "--serve"]
pid = os.fork()
if pid == 0:
    os.execv(sys.executable, argv)
def forward(signum, frame):
    try:
        os.kill(pid, signum)
    except OSError:
        pass
for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
    signal.signal(sig, forward)
status = os.waitpid(pid, 0)[1]
sys.path.insert(0, agent)
from orchestrator.agent import ops
ops.op_down(payload["namespace"], grace_s=2)
sys.exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)
"""

# Relays one TCP connection on the node between the step's stdio and ADDRESS:PORT.
RELAY = r"""
import os, select, socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
s.settimeout(None)
inputs = [0, s]
while True:
    readable = select.select(inputs, [], [])[0]
    if 0 in readable:
        data = os.read(0, 65536)
        if data:
            s.sendall(data)
        else:
            s.shutdown(socket.SHUT_WR)
            inputs.remove(0)
    if s in readable:
        data = s.recv(65536)
        if not data:
            break
        while data:
            data = data[os.write(1, data):]
"""
START_TIMEOUT_S = 60.0
# How long a job Slurm is ending (COMPLETING) is watched for its final state (TIMEOUT, CANCELLED, ...).
ENDING_S = 30.0
# How often a long queue wait is said again in plain output (the live view shows it all the time).
QUEUE_REPEAT_S = 60.0


class _StepStream(Stream):
    """A step's stdin and stdout (srun's pipes); its stderr (the task's and Slurm's messages) kept for errors."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        self.proc = proc
        self.stderr: deque[str] = deque(maxlen=50)
        self._fd = proc.stdout.fileno()
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        # Read concurrently so a chatty step can never fill the pipe and block.
        assert self.proc.stderr is not None
        with contextlib.suppress(Exception):
            for raw in self.proc.stderr:
                self.stderr.append(raw.decode(errors="replace").rstrip())

    def send(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(data)
            self.proc.stdin.flush()
        except (OSError, ValueError) as e:
            raise ConnectionLost(f"the agent's step took no more input ({e})") from e

    def recv(self, timeout: float) -> bytes | None:
        try:
            if not readable(self._fd, timeout):
                return None
            return os.read(self._fd, 65536)
        except (OSError, ValueError) as e:
            raise ConnectionLost(f"reading from the agent's step failed: {e}") from e

    def error_text(self) -> str:
        time.sleep(0.1)  # srun's last words come on stderr right after stdout's EOF
        return "; ".join(line for line in self.stderr if line.strip() and not slurm_cli.noise(line))

    def close(self) -> None:
        """End the step: EOF on the agent's stdin (it exits at once, even mid-request), srun ended if it lingers."""
        with contextlib.suppress(OSError, ValueError):
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.terminate()  # srun cancels its step in about a second
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for pipe in (self.proc.stdout, self.proc.stderr):
            with contextlib.suppress(OSError):
                if pipe is not None:
                    pipe.close()


def _payload(workdir: str, namespace: str) -> bytes:
    files = agent_files()
    data = {
        "workdir": workdir,
        "namespace": namespace,
        "version": agent_version(files),
        "entry": AGENT_ENTRY,
        "files": {name: base64.b64encode(body).decode() for name, body in files.items()},
    }
    blob = base64.b64encode(zlib.compress(json.dumps(data).encode(), 6))
    return str(len(blob)).encode() + b"\n" + blob


def request_for(config: HostConfig, nodes: int = 1) -> AllocationRequest:
    """What orch asks Slurm for on behalf of this host: `nodes` nodes (a multi-node profile's nnodes), the entry's
    partition, account, GRES (per node), time limit."""
    gres = config.gres or (f"gpu:{config.gpus}" if config.gpus else None)
    return AllocationRequest(
        partition=config.partition,
        nodes=nodes,
        time_limit_min=config.time_limit_min,
        gres=gres,
        account=config.account,
        exclusive=config.exclusive,
    )


class SlurmHost(Host):
    """A node of a Slurm allocation held for the session; the agent runs there as one long-lived step.

    Without `node_of` it asks Slurm for the allocation (`nodes` nodes), runs on its first node and releases it when
    closed; with `node_of` (an allocation another SlurmHost holds, and one of its nodes) it only runs there.
    """

    def __init__(
        self,
        config: HostConfig,
        *,
        events: Events | None = None,
        cli: Slurm | None = None,
        poll_s: float = 5.0,
        nodes: int = 1,
        node_of: tuple[Allocation, str] | None = None,
    ) -> None:
        self.config = config
        self.name = config.name
        self.stats = CallStats()
        self.python = config.python or "python3"
        self.cli = cli or Slurm()
        self._events = events
        self._io_lock = threading.RLock()
        self._link: AgentLink | None = None
        self._seq = 0
        self._host_lock = HeldLock()
        self._tunnels: dict[tuple[str, int], _Tunnel] = {}
        self._closed = False
        self._lost: str | None = None
        self._queue_said: tuple[str, str, float] | None = None
        self.workdir = ""
        self.agent_dir = ""
        self.sim_pythonpath = None
        self._namespace = namespace = default_namespace()
        self._address: str | None = None
        self.request = request_for(config, nodes)
        self.owns_allocation = node_of is None
        if node_of is None:
            for left in slurm_cli.release_leftovers(self.cli, namespace):
                self._event(f"released allocation {left.job_id} ({left.state}) left by an orch session that is gone")
            self.allocation = slurm_cli.allocate(
                self.cli, self.request, namespace=namespace, on_state=self._queued, poll_s=poll_s
            )
            self.node = self.allocation.nodes[0]
        else:
            self.allocation, self.node = node_of
        self.job_id = self.allocation.job_id
        if len(self.allocation.nodes) > 1:
            self.name = f"{config.name}/{self.node}"  # each node of a group is named apart (its lock, messages)
        self.display = f"node {self.node} of Slurm job {self.job_id}"
        try:
            self._start_agent()
        except BaseException:
            self._release()
            raise

    # ------------------------------------------------------------ the allocation

    def _event(self, msg: str) -> None:
        if self._events is not None:
            self._events.line(msg)
        else:
            log.warning("%s", msg)

    def _queued(self, st: QueueState) -> None:
        if self._events is not None:
            self._events.phase("slurm queue", job=st.job_id, state=st.state, reason=st.reason, waited_s=st.waited_s)
        said = self._queue_said
        if st.state != "PENDING":
            where = f"partition {self.request.partition}" if self.request.partition else "the default partition"
            self._event(
                f"{self.name}: Slurm granted allocation {st.job_id} in {where} after {progress.duration(st.waited_s)} "
                f"(time limit {self.request.time_limit_min} min)"
            )
            return
        if said is None or (st.state, st.reason) != said[:2] or st.waited_s - said[2] >= QUEUE_REPEAT_S:
            self._queue_said = (st.state, st.reason, st.waited_s)
            first = f"asked Slurm for {self._describe_request()}: " if said is None else ""
            self._event(
                f"{self.name}: {first}allocation {st.job_id} is queued ({st.state}, reason {st.reason}) for "
                f"{progress.duration(st.waited_s)}"
            )

    def _describe_request(self) -> str:
        r = self.request
        parts = [f"{r.nodes} node{'s' if r.nodes > 1 else ''}", f"{r.time_limit_min} min"]
        parts += [f"GRES {r.gres}"] if r.gres else []
        parts += ["exclusive"] if r.exclusive else []
        parts += [f"account {r.account}"] if r.account else []
        return ", ".join(parts)

    @property
    def reach_address(self) -> str | None:
        if self._address is None:
            self._address = slurm_cli.node_address(self.cli, self.node)
        return self._address

    def _release(self) -> None:
        if not self.owns_allocation:
            return  # another node's host holds the allocation and releases it
        try:
            end = slurm_cli.release(self.cli, self.job_id)
        except SlurmError as e:
            log.warning(
                "%s: could not release Slurm allocation %s (%s); cancel it with: scancel %s", self.name,
                self.job_id, e, self.job_id,
            )  # fmt: skip
            return
        if end.state not in ("CANCELLED", "COMPLETED") and self._lost is None:  # a loss already said why
            self._event(f"{self.name}: {end.describe()}")

    def _allocation_ended(self, cause: BaseException) -> None:
        """Raise (and remember) AllocationEnded saying so when the allocation is over; return when it still runs."""
        try:
            state = slurm_cli.job_state(self.cli, self.job_id)
            deadline = time.monotonic() + ENDING_S
            while state.state == "COMPLETING" and time.monotonic() < deadline:
                # Slurm is ending the job (its steps get SIGTERM, then SIGKILL after KillWait): wait for the verdict.
                time.sleep(0.2)
                state = slurm_cli.job_state(self.cli, self.job_id)
        except SlurmError:
            return  # cannot tell: handled as a lost agent
        if state.live:
            return
        why = state.describe()
        if state.state == "TIMEOUT":
            where = (
                f"raise time_limit_min in its inventory entry ({self.config.source})"
                if self.config.source
                else "write an inventory entry with `scheduler: slurm`, this partition and a larger time_limit_min, "
                "and resume with --host ENTRY"
            )
            why += f": orch asked for {self.request.time_limit_min} min; {where} for longer experiments"
        self._lost = f"{self.name}: {why}; its agent on {self.node} is gone ({cause})"
        self._ended = state.state
        raise self._lost_error() from cause

    # Slurm's final state (TIMEOUT, ...) once it ended the allocation; _lost then says so.
    _ended: str | None = None

    def _lost_error(self) -> HostError:
        """The error every call gets once the session is lost: AllocationEnded when Slurm ended the allocation."""
        assert self._lost is not None
        if self._ended is not None:
            return AllocationEnded(self._lost, job_id=self.job_id, state=self._ended)
        return HostError(self._lost)

    # ------------------------------------------------------------ the agent

    def _start_agent(self) -> None:
        argv = [self.python, "-c", BOOTSTRAP]
        try:
            proc = slurm_cli.step(self.cli, self.job_id, self.node, argv)
        except OSError as e:
            raise HostError(f"{self.name}: could not run srun: {e}") from e
        self.stats.record_channel("agent")
        stream = _StepStream(proc)
        link = AgentLink(stream, self._seq)
        try:
            stream.send(_payload(self.config.workdir or "~/.orch", self._namespace))
            where = json.loads(link.line(time.monotonic() + START_TIMEOUT_S, "the agent's start", START_TIMEOUT_S))
            self.workdir, self.agent_dir = where["workdir"], where["agent_dir"]
            self.sim_pythonpath = self.agent_dir
            hello = link.request({"op": "hello", "args": {}}, 30)
        except ConnectionLost as e:
            stream.close()
            self._allocation_ended(e)
            err = stream.error_text()
            raise HostError(
                f"{self.name}: could not start orch's agent on {self.node} with {self.python!r} "
                f"({err or e}); set the host's `python` in hosts.yaml to an interpreter with psutil"
            ) from None
        except BaseException:
            stream.close()
            raise
        self._seq = link.seq
        if not hello.get("ok") or hello["result"].get("protocol") != ops.PROTOCOL_VERSION:
            stream.close()
            raise HostError(f"{self.name}: agent protocol mismatch: {hello}")
        self._link = link

    def _drop_agent(self) -> None:
        link, self._link = self._link, None
        if link is not None:
            self._seq = link.seq
            link.stream.close()

    def _restart_agent(self) -> None:
        self._drop_agent()
        self.stats.reconnects += 1
        self._start_agent()
        self._host_lock.retake(self._request, f"{self.name}: after restarting orch's agent")

    def _request(self, request: dict[str, Any], timeout: float, on_progress: Progress | None = None) -> dict[str, Any]:
        link = self._link
        if link is None:
            raise ConnectionLost("no agent is running")
        try:
            return link.request(request, timeout, on_progress)
        except BaseException:
            # Lost, or Ctrl-C mid-request with a reply in flight: never let a later call read it. Closing the step's
            # stdin ends the agent (and a benchmark running there) at once; the next call starts a fresh one.
            self._drop_agent()
            raise

    def _roundtrip(
        self, request: dict[str, Any], timeout: float | None = None, on_progress: Progress | None = None
    ) -> dict[str, Any]:
        limit = call_timeout(request, timeout)
        op = request["op"]
        with self._io_lock:
            if self._closed:
                raise HostError(f"{self.name}: orch released allocation {self.job_id}; no more host-side calls")
            if self._lost is not None:
                raise self._lost_error()
            try:
                if self._link is None:
                    self._restart_agent()  # after an interrupted call: quietly, one try
                reply = self._request(request, limit, on_progress)
            except ConnectionLost as first:
                self._allocation_ended(first)
                if op == "launch":
                    # Not repeatable: we cannot know whether it started. The marker will find it either way.
                    raise HostError(f"{self.name}: lost orch's agent while launching ({first})") from first
                log.warning(
                    "%s: lost orch's agent on %s during the host-side call %r (%s); starting it again in allocation "
                    "%s, then making that call again", self.name, self.node, op, first, self.job_id,
                )  # fmt: skip
                try:
                    self._restart_agent()
                    reply = self._request(request, limit, on_progress)
                except ConnectionLost as again:
                    self._allocation_ended(again)
                    self._lost = f"{self.name}: lost orch's agent on {self.node} twice ({again})"
                    raise HostError(self._lost) from again
        self._host_lock.note(request, reply)
        return reply

    def ensure_connected(self, force: bool = False) -> None:
        with self._io_lock:
            if self._closed:
                raise HostError(f"{self.name}: orch released allocation {self.job_id}")
            if self._lost is not None:
                raise self._lost_error()
            link = self._link
            stream = link.stream if link is not None else None
            if not force and isinstance(stream, _StepStream) and stream.proc.poll() is None:
                return
            self._allocation_ended(ConnectionLost("the agent's step ended"))
            try:
                self._restart_agent()
            except ConnectionLost as e:
                self._allocation_ended(e)
                raise HostError(f"{self.name}: could not start orch's agent again: {e}") from e

    # ------------------------------------------------------------ HTTP, the end

    def url(self, port: int, address: str = "127.0.0.1") -> str:
        tunnel = self._tunnels.get((address, port))
        if tunnel is None:
            tunnel = self._tunnels[(address, port)] = _Tunnel(self, address, port)
        return f"http://127.0.0.1:{tunnel.local_port}"

    def close(self) -> None:
        """Unlock, end the agent's step and release the allocation if this host holds it (waiting until Slurm
        has ended it)."""
        if self._closed:
            return
        try:
            for tunnel in self._tunnels.values():
                tunnel.close()
            self._tunnels.clear()
            if self._lost is None and self._link is not None:
                self._host_lock.release(self.call)
        finally:
            self._closed = True
            try:
                self._drop_agent()
            finally:
                self._release()


def open_nodes(
    config: HostConfig,
    nodes: int,
    *,
    events: Events | None = None,
    cli: Slurm | None = None,
    poll_s: float = 5.0,
) -> list[SlurmHost]:
    """One allocation of `nodes` nodes and a host on each (its own agent step), in Slurm's node order. The first
    holds the allocation: close it last (closing it releases the allocation, and every step with it)."""
    first = SlurmHost(config, events=events, cli=cli, poll_s=poll_s, nodes=nodes)
    hosts = [first]
    try:
        for node in first.allocation.nodes[1:]:
            hosts.append(SlurmHost(config, events=events, cli=first.cli, node_of=(first.allocation, node)))
    except BaseException:
        for host in reversed(hosts):
            with contextlib.suppress(Exception):
                host.close()
        raise
    return hosts


def readable(fd: int, timeout: float) -> bool:
    """Whether fd has input (or its end) within timeout seconds. poll(), not select(): select() cannot watch a
    descriptor above 1024, which orch's own process reaches with many requests in flight through its tunnels."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(max(0.0, timeout) * 1000))


class _Tunnel(Relay):
    """A local port relayed to address:port on the node, one small step per connection."""

    def __init__(self, host: SlurmHost, address: str, port: int) -> None:
        self.host = host
        self._procs: set[subprocess.Popen[bytes]] = set()
        super().__init__(address, port, backlog=16, name=f"slurm-tunnel-{port}")

    def _serve(self, client: socket.socket) -> None:
        h = self.host
        try:
            h.stats.record_channel("tunnel")
            proc = slurm_cli.step(
                h.cli, h.job_id, h.node, [h.python, "-c", RELAY, self.address, str(self.port)], gres="none"
            )
        except (OSError, SlurmError):
            client.close()  # the HTTP client sees a reset connection, as if the port were closed
            return
        self._procs.add(proc)
        assert proc.stdin is not None and proc.stdout is not None
        stdin = proc.stdin
        threading.Thread(target=self._upstream, args=(client, stdin), daemon=True).start()
        fd = proc.stdout.fileno()
        try:
            while not self.closed:
                if not readable(fd, 1.0):
                    continue
                data = os.read(fd, 65536)
                if not data:
                    return
                client.sendall(data)
        except OSError:
            return
        finally:
            client.close()
            _end(proc)
            self._procs.discard(proc)

    @staticmethod
    def _upstream(client: socket.socket, stdin: Any) -> None:
        with contextlib.suppress(OSError, ValueError):
            while True:
                data = client.recv(65536)
                if not data:
                    break
                stdin.write(data)
                stdin.flush()
        with contextlib.suppress(OSError, ValueError):
            stdin.close()

    def close(self) -> None:
        super().close()
        for proc in list(self._procs):
            _end(proc)


def _end(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        with contextlib.suppress(OSError, ValueError):
            if pipe is not None:
                pipe.close()
