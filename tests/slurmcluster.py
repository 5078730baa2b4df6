"""A real one-node Slurm cluster for tests: its own munged, slurmctld and slurmd under one private dir, free ports."""

# Facts this harness relies on (Debian 12: slurm-wlm 22.05.8, munge 0.5.15; run as root; see
# ../shared/reference/slurm.md for more):
# - munged runs as root in the foreground when every path is given (`--socket --key-file --pid-file --log-file
#   --seed-file`): Debian's "Logfile is insecure" refusal comes only from its default /var/log/munge. The socket's
#   directory and every parent must be executable by all ("Socket is inaccessible"), which pytest's 0700 tmp dirs
#   are not: the cluster lives in its own `mkdtemp` dir under /tmp (0755), removed on stop. Keys are 0600.
# - slurm.conf `AuthInfo=socket=PATH` points slurmctld, slurmd, slurmstepd and every client at that munged.
#   Clients find the config only through SLURM_CONF, passed in the env of the commands a test runs (`env()`),
#   never exported here: a missing file makes a client retry for 60 s, so `start` writes it before anything runs.
# - With `-D` / `-F` each daemon is the process we started (its Popen PID). slurmctld forks `slurmscriptd`;
#   slurmd forks a detached `slurmstepd` per step (reparented to PID 1, which does not reap here: a finished one
#   lingers as a zombie, and zombies count as gone). Daemons and steps inherit SLURM_CONF (slurmstepd sets it for
#   tasks too): processes carrying this cluster's SLURM_CONF, or its dir in their command line, are this
#   cluster's, and nothing else is ever signalled.
# - NodeName=localhost works whatever the hostname (slurmd falls back to it). GPUs are symlinks to /dev/null listed
#   in gres.conf (`File=` is required: slurmd drops file-less GPUs; regular files are refused).
# - The node's PATH: a step's environment is the srun caller's, so the fake nvidia-smi is put in front of PATH by
#   a TaskProlog (its `export NAME=value` lines go into every task's environment), as a site's prolog would.
# - `scontrol update JobId=J EndTime=now+N` shortens a running job: slurmctld ends it as TIMEOUT at its next
#   time-limit check after N. That check runs every 30 s counted from slurmctld's start (PERIODIC_TIMEOUT in
#   src/slurmctld/controller.c), so the wait is 0-31 s, not the 60-90 s of a real one-minute limit.
# - Start: a client (or slurmd) that finds no controller listening retries one second later, so slurmd is started
#   once slurmctld listens (~0.2 s in all, instead of ~1.1 s).
# - Several nodes on this one machine (`nodes=N`): Debian's slurmd, built without --enable-multiple-slurmd, still
#   runs as the node `-N NAME` says, listening on that node's `Port=`; nodes n1..nN share NodeHostname=localhost
#   and NodeAddr=127.0.0.1, and `%n` in SlurmdSpoolDir, SlurmdPidFile and SlurmdLogFile keeps their files apart.
#   `srun -N2` runs one task on each, `-w n2` picks one: what orch needs of a multi-node allocation.

from __future__ import annotations

import atexit
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from tests import fake_nvidia_smi, markers

DAEMONS = ("munged", "mungekey", "slurmctld", "slurmd")
CLIENTS = ("salloc", "srun", "squeue", "sinfo", "scontrol", "scancel")
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0
PARTITION = "debug"
NODE = "localhost"
LIVE_STATES = "PENDING,RUNNING,SUSPENDED,COMPLETING,CONFIGURING,RESIZING,REQUEUED,SIGNALING,STAGE_OUT"


class SlurmClusterError(RuntimeError):
    """The test cluster could not be configured, started or stopped cleanly."""


def missing_tools() -> list[str]:
    """Slurm and munge programs this harness needs that are not installed (empty: all there)."""
    search = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/bin"])
    return [name for name in (*DAEMONS, *CLIENTS) if shutil.which(name, path=search) is None]


def unavailable_reason() -> str | None:
    """Why this machine cannot run the cluster (Slurm missing, not root), or None when it can."""
    missing = missing_tools()
    if missing:
        return (
            f"Slurm is not installed (missing {', '.join(missing)}): "
            "apt-get install slurmctld slurmd slurm-client munge"
        )
    if os.geteuid() != 0:
        return "a test Slurm cluster needs root (slurmd starts every step as its user)"
    return None


def _tool(name: str) -> str:
    search = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/bin"])
    found = shutil.which(name, path=search)
    if found is None:
        raise SlurmClusterError(f"{name} is not installed")
    return found


def _free_port() -> int:
    # slurmctld and slurmd listen on every address: probe the wildcard, not just 127.0.0.1.
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def _listening(port: int) -> bool:
    """Whether something listens on TCP `port` (from /proc/net, so no probe connection reaches the daemon)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            parts = row.split()
            if len(parts) > 3 and parts[3] == "0A" and parts[1].rsplit(":", 1)[-1] == f"{port:04X}":
                return True
    return False


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
    except psutil.AccessDenied:
        return True


def _node_hardware() -> dict[str, str]:
    """The node line's hardware fields as slurmd itself detects them (`slurmd -C`); a node configured with more
    CPUs or memory than it has registers INVALID."""
    out = subprocess.run(
        [_tool("slurmd"), "-C"], capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL
    ).stdout
    found = dict(re.findall(r"(\w+)=(\S+)", out.splitlines()[0] if out else ""))
    try:
        return {
            "CPUs": found["CPUs"],
            "Sockets": found["SocketsPerBoard"],
            "CoresPerSocket": found["CoresPerSocket"],
            "ThreadsPerCore": found["ThreadsPerCore"],
            # Less than the machine has is fine; --exclusive jobs get all of it either way.
            "RealMemory": str(min(1000, int(found["RealMemory"]))),
        }
    except (KeyError, ValueError) as exc:
        raise SlurmClusterError(f"cannot read the node's hardware from `slurmd -C`: {out!r}") from exc


@dataclass
class SlurmCluster:
    """One running one-node cluster (node `localhost`, partition `debug`, GRES gpu:N) and everything under `root`."""

    root: Path
    name: str
    conf: Path
    gpus: int
    nodes: int = 1
    ctld_port: int = 0
    slurmd_port: int = 0
    node_ports: dict[str, int] = field(default_factory=dict)
    started_in_s: float = 0.0
    stopped_in_s: float = 0.0
    _procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict, repr=False)

    # ---- lifecycle ---------------------------------------------------------------------------------------------

    @classmethod
    def start(cls, *, gpus: int = 8, nodes: int = 1, prefix: str = "orch-slurm-") -> SlurmCluster:
        """Configure and start munged, slurmctld and a slurmd per node in a new private dir; return once every node
        is idle. One node is `localhost`; `nodes` > 1 are n1..nN, all on this machine, `gpus` GPUs each."""
        markers.require("slurm")
        why = unavailable_reason()
        if why is not None:
            raise SlurmClusterError(why)
        t0 = time.monotonic()
        root = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
        root.chmod(0o755)
        cluster = cls(
            root=root, name="t" + root.name.rsplit("-", 1)[-1].lower(), conf=root / "slurm.conf", gpus=gpus, nodes=nodes
        )
        try:
            cluster._prepare()
            cluster._start_munged()
            last: SlurmClusterError | None = None
            for _ in range(5):  # a free port can be taken by someone else before a daemon binds it
                cluster.ctld_port, cluster.slurmd_port = _free_port(), _free_port()
                cluster.node_ports = {n: _free_port() for n in cluster.node_names[1:]}
                cluster.node_ports[cluster.node_names[0]] = cluster.slurmd_port
                cluster._write_conf()
                try:
                    cluster._start_slurm()
                    break
                except SlurmClusterError as exc:
                    if "Address already in use" not in str(exc):
                        raise
                    last = exc
                    cluster._stop_slurm()
            else:
                raise SlurmClusterError(f"could not bind free ports after 5 tries: {last}")
        except BaseException:
            with contextlib.suppress(SlurmClusterError):
                cluster.stop()
            raise
        atexit.register(cluster.stop)
        cluster.started_in_s = time.monotonic() - t0
        return cluster

    def stop(self) -> list[str]:
        """Cancel what still runs, stop slurmd, slurmctld and munged (last), remove the dir; idempotent.

        Returns what had to be cleaned up besides the daemons (jobs still live, processes left after the daemons
        were gone: both were killed); a test fixture treats a non-empty answer as a leak. Raises only if one of
        this cluster's processes survives SIGKILL.
        """
        atexit.unregister(self.stop)
        t0 = time.monotonic()
        leaked: list[str] = []
        if "slurmctld" in self._procs and self._procs["slurmctld"].poll() is None:
            live = self.live_jobs()
            if live:
                leaked += [f"job {j}" for j in live]
                self.cancel_all()
        self._stop_slurm()
        self._stop_daemon("munged")
        left = self.processes(include_daemons=True)
        leaked += [f"process {p.pid} ({_cmdline(p)})" for p in left]
        survivors = _kill_and_wait(left)
        if survivors:
            raise SlurmClusterError(f"processes of the test cluster {self.root} survived SIGKILL: {survivors}")
        shutil.rmtree(self.root, ignore_errors=True)
        self.stopped_in_s = time.monotonic() - t0
        return leaked

    def __enter__(self) -> SlurmCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- using it ----------------------------------------------------------------------------------------------

    @property
    def node_names(self) -> list[str]:
        """Slurm's names of the nodes, in its order."""
        return [NODE] if self.nodes == 1 else [f"n{i}" for i in range(1, self.nodes + 1)]

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """An environment for Slurm clients of this cluster: `base` (default os.environ) plus SLURM_CONF."""
        env = dict(os.environ if base is None else base)
        env["SLURM_CONF"] = str(self.conf)
        return env

    def run(self, *argv: str, timeout: float = 30.0, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client against this cluster; text output captured. `check`: fail with its stderr."""
        res = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=timeout, env=self.env(), stdin=subprocess.DEVNULL
        )
        if check and res.returncode != 0:
            raise SlurmClusterError(f"`{' '.join(argv)}` exited {res.returncode}: {res.stderr.strip()}")
        return res

    def live_jobs(self) -> list[str]:
        """Ids of the jobs that are not finished (pending, running, completing, ...)."""
        out = self.run("squeue", "-h", "-t", LIVE_STATES, "-o", "%i").stdout
        return out.split()

    def cancel_all(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """scancel every live job and wait until none is left (COMPLETING ends once the steps are gone)."""
        jobs = self.live_jobs()
        if jobs:
            self.run("scancel", *jobs)
        deadline = time.monotonic() + timeout
        while self.live_jobs():
            if time.monotonic() > deadline:
                raise SlurmClusterError(f"jobs still live {timeout}s after scancel: {self.live_jobs()}")
            time.sleep(0.1)

    def processes(self, include_daemons: bool = False) -> list[psutil.Process]:
        """Live processes of this cluster: steps, their tasks, Slurm clients run with its SLURM_CONF (and, with
        `include_daemons`, munged, slurmctld, slurmd and their children)."""
        daemons: set[int] = set()
        if not include_daemons:
            for daemon in self._procs.values():
                daemons.add(daemon.pid)
                with contextlib.suppress(psutil.NoSuchProcess, psutil.ZombieProcess):
                    daemons.update(c.pid for c in psutil.Process(daemon.pid).children(recursive=True))
        conf, root, me = str(self.conf), str(self.root), os.getpid()
        out = []
        for proc in psutil.process_iter():
            if proc.pid in daemons or proc.pid == me:
                continue
            try:
                if proc.status() == psutil.STATUS_ZOMBIE:
                    continue
                ours = proc.environ().get("SLURM_CONF") == conf or any(root in a for a in proc.cmdline())
            except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied, OSError):
                continue
            if ours:
                out.append(proc)
        return out

    def wait_no_processes(self, timeout: float = 10.0) -> None:
        """Wait until no step, task or client of this cluster is alive; fail naming them if some stay."""
        deadline = time.monotonic() + timeout
        while True:
            left = self.processes()
            if not left:
                return
            if time.monotonic() > deadline:
                raise SlurmClusterError(f"processes still alive: {[f'{p.pid} {_cmdline(p)}' for p in left]}")
            time.sleep(0.1)

    def log_tail(self, lines: int = 20) -> str:
        """The last lines of each daemon's log, for failure messages."""
        parts = []
        logs = [self.root / f"{name}.log" for name in ("munged", "slurmctld")] + sorted(self.root.glob("slurmd*.log"))
        for path in logs:
            with contextlib.suppress(OSError):
                parts.append(
                    f"--- {path.stem} ---\n" + "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
                )
        return "\n".join(parts)

    # ---- internals ---------------------------------------------------------------------------------------------

    def _prepare(self) -> None:
        for sub in ("state", "spool", "bin"):
            (self.root / sub).mkdir(mode=0o755)
        for i in range(self.gpus):
            (self.root / f"gpu{i}").symlink_to("/dev/null")
        (self.root / "gres.conf").write_text(f"Name=gpu File={self.root}/gpu[0-{self.gpus - 1}]\n")
        fake_nvidia_smi.install(self.root / "bin", self.root / "bin" / "state.json", gpus=self.gpus)
        prolog = self.root / "task_prolog.sh"
        prolog.write_text(f'#!/bin/sh\necho "export PATH={self.root}/bin:$PATH"\n')
        prolog.chmod(0o755)
        key = self.root / "munge.key"
        subprocess.run(
            [_tool("mungekey"), "--create", "--keyfile", str(key), "--bits", "1024"],
            check=True,
            capture_output=True,
            stdin=subprocess.DEVNULL,
        )
        key.chmod(0o600)

    def _node_lines(self) -> list[str]:
        hw = " ".join(f"{k}={v}" for k, v in _node_hardware().items())
        if self.nodes == 1:
            return [f"NodeName={NODE} {hw} Gres=gpu:{self.gpus} State=UNKNOWN"]
        return [
            f"NodeName={name} NodeHostname=localhost NodeAddr=127.0.0.1 Port={self.node_ports[name]} {hw} "
            f"Gres=gpu:{self.gpus} State=UNKNOWN"
            for name in self.node_names
        ]

    def _write_conf(self) -> None:
        r = self.root
        per_node = "" if self.nodes == 1 else "-%n"
        self.conf.write_text(
            "\n".join(
                [
                    f"ClusterName={self.name}",
                    "SlurmctldHost=localhost",
                    f"SlurmctldPort={self.ctld_port}",
                    f"SlurmdPort={self.slurmd_port}",
                    "SlurmUser=root",
                    "SlurmdUser=root",
                    "AuthType=auth/munge",
                    "CredType=cred/munge",
                    f"AuthInfo=socket={r}/munge.sock",
                    f"StateSaveLocation={r}/state",
                    f"SlurmdSpoolDir={r}/spool{per_node}",
                    f"SlurmctldPidFile={r}/slurmctld.pid",
                    f"SlurmdPidFile={r}/slurmd{per_node}.pid",
                    f"SlurmctldLogFile={r}/slurmctld.log",
                    f"SlurmdLogFile={r}/slurmd{per_node}.log",
                    f"TaskProlog={r}/task_prolog.sh",
                    "ProctrackType=proctrack/linuxproc",
                    "TaskPlugin=task/none",
                    "MpiDefault=none",
                    "SelectType=select/cons_tres",
                    "SelectTypeParameters=CR_Core",
                    "GresTypes=gpu",
                    "MailProg=/bin/true",
                    "JobCompType=jobcomp/filetxt",
                    f"JobCompLoc={r}/jobcomp.txt",
                    "KillWait=5",
                    *self._node_lines(),
                    f"PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
                ]
            )
            + "\n"
        )

    def _daemon_env(self) -> dict[str, str]:
        env = self.env()
        env.pop("SLURM_JOB_ID", None)  # a test run inside a Slurm job must not leak that job into our daemons
        return env

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        with (self.root / f"{name}.out").open("ab") as out:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                env=self._daemon_env(),
                cwd=self.root,
                start_new_session=True,  # a terminal's Ctrl-C is for pytest, not for these
            )
        self._procs[name] = proc
        return proc

    def _start_munged(self) -> None:
        r = self.root
        proc = self._spawn(
            "munged",
            [
                _tool("munged"),
                "--foreground",
                f"--socket={r}/munge.sock",
                f"--key-file={r}/munge.key",
                f"--pid-file={r}/munged.pid",
                f"--log-file={r}/munged.log",
                f"--seed-file={r}/munged.seed",
            ],
        )
        self._wait(lambda: (r / "munge.sock").exists(), "munged to create its socket", [proc])

    def _start_slurm(self) -> None:
        ctld = self._spawn("slurmctld", [_tool("slurmctld"), "-D", "-f", str(self.conf)])
        # A client (or slurmd) that finds no controller listening retries a second later: wait for the port first.
        self._wait(lambda: _listening(self.ctld_port), "slurmctld to listen", [ctld])
        if self.nodes == 1:
            slurmds = [self._spawn("slurmd", [_tool("slurmd"), "-D", "-f", str(self.conf)])]
        else:
            slurmds = [
                self._spawn(f"slurmd-{n}", [_tool("slurmd"), "-D", "-N", n, "-f", str(self.conf)])
                for n in self.node_names
            ]

        def idle() -> bool:
            res = self.run("sinfo", "-h", "-N", "-o", "%N %t", check=False, timeout=15)
            states = dict(line.split() for line in res.stdout.splitlines() if len(line.split()) == 2)
            for node, state in states.items():
                if state in ("drain", "drng", "inval", "fail"):
                    raise SlurmClusterError(f"node {node} is {state}:\n{self.log_tail()}")
            return all(states.get(n) == "idle" for n in self.node_names)

        self._wait(idle, "every node to be idle", [ctld, *slurmds])

    def _wait(self, ready: Callable[[], bool], what: str, procs: list[subprocess.Popen[bytes]]) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not ready():
            for proc in procs:
                if proc.poll() is not None:
                    name = next(n for n, p in self._procs.items() if p is proc)
                    out = (self.root / f"{name}.out").read_text(errors="replace")
                    raise SlurmClusterError(
                        f"{name} exited with status {proc.returncode} while waiting for {what}:\n{out}\n"
                        f"{self.log_tail()}".rstrip()
                    )
            if time.monotonic() > deadline:
                raise SlurmClusterError(f"timed out after {START_TIMEOUT_S}s waiting for {what}:\n{self.log_tail()}")
            time.sleep(0.05)

    def _stop_slurm(self) -> None:
        for name in [n for n in self._procs if n.startswith("slurmd")]:
            self._stop_daemon(name)
        self._stop_daemon("slurmctld")

    def _stop_daemon(self, name: str) -> None:
        proc = self._procs.pop(name, None)
        if proc is None:
            return
        kids: list[psutil.Process] = []
        with contextlib.suppress(psutil.NoSuchProcess, psutil.ZombieProcess):
            kids = psutil.Process(proc.pid).children(recursive=True)  # slurmctld's slurmscriptd
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        left = _kill_and_wait([k for k in kids if _alive(k)])
        if left:
            raise SlurmClusterError(f"{name}'s children survived SIGKILL: {left}")


def _cmdline(proc: psutil.Process) -> str:
    try:
        return " ".join(proc.cmdline()) or proc.name()
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return "?"


def _kill_and_wait(procs: list[psutil.Process], timeout: float = 5.0) -> list[int]:
    """SIGKILL each (psutil checks the PID still names the same process); the PIDs still alive after `timeout`."""
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.ZombieProcess):
            p.kill()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(_alive(p) for p in procs):
            return []
        time.sleep(0.02)
    return [p.pid for p in procs if _alive(p)]


def for_module(*, gpus: int = 8, nodes: int = 1) -> Iterator[SlurmCluster]:
    """A module fixture's body (`yield from`): a cluster for the module's tests, stopped afterwards; fails the
    module if anything had to be cleaned up."""
    cluster = SlurmCluster.start(gpus=gpus, nodes=nodes)
    try:
        yield cluster
    finally:
        leaked = cluster.stop()
    assert not leaked, f"the test cluster had to clean up after the tests: {leaked}"


def left_clean(cluster: SlurmCluster) -> None:
    """After a test: cancel what it left, wait for its processes to go; fail if a job was still live."""
    live = cluster.live_jobs()
    cluster.cancel_all()
    cluster.wait_no_processes()
    assert not live, f"the test left jobs live: {live}"


@contextlib.contextmanager
def running(*, gpus: int = 8, nodes: int = 1) -> Iterator[SlurmCluster]:
    """A started cluster, stopped afterwards; fails if anything had to be cleaned up."""
    cluster = SlurmCluster.start(gpus=gpus, nodes=nodes)
    try:
        yield cluster
    finally:
        leaked = cluster.stop()
    if leaked:
        raise SlurmClusterError(f"the test cluster had to clean up: {leaked}")
