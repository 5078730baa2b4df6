"""Slurm through its command line: allocations (request, wait, nodes, steps, state, release) and orch's leftovers."""

# Verified against slurm-wlm 22.05.8 (Debian 12) on the tests' real one-node cluster (tests/slurmcluster.py).
# - `salloc --no-shell` blocks until the allocation is granted, then exits 0 and leaves the job running (until its
#   time limit or scancel). It prints `Pending job allocation J` as soon as the job is queued and `Granted job
#   allocation J` on stderr; SIGINT while pending makes it cancel the job itself ("Job aborted due to signal").
# - `scancel J` is silent, exit 0, even for an unknown or finished job: release reads the state afterwards.
# - `squeue -t all -j J` knows a finished job for MinJobAge (300 s by default), then answers "Invalid job id
#   specified" (exit 1); sacct knows it later only where accounting (slurmdbd) is set up.
# - A missing SLURM_CONF file makes every client retry for 60 s: it is checked here first. munged down fails in
#   ~2 s with "Protocol authentication error"; a stopped munged or controller hangs a client, hence the timeouts.
# - Steps: `srun --jobid J --overlap` shares the allocation with other steps (GPUs too); `-u` gives the task a pty
#   for stdout (line-buffered, no CR added) and keeps stdin a pipe; a step without --gres gets all the job's GRES.
#   SIGTERM/SIGKILL to srun ends that step in ~1 s, never the allocation.

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from orchestrator.agent import processes
from orchestrator.errors import HostError, InputError

NAME_PREFIX = "orch"
# Slurm's words for a job that still holds (or waits for) resources; every other state is an end.
LIVE_STATES = frozenset(
    {
        "PENDING",
        "CONFIGURING",
        "RUNNING",
        "COMPLETING",
        "SUSPENDED",
        "RESIZING",
        "REQUEUED",
        "REQUEUE_HOLD",
        "REQUEUE_FED",
        "SIGNALING",
        "STAGE_OUT",
        "STOPPED",
        "RESV_DEL_HOLD",
    }
)
# orch's word (not Slurm's) for a job Slurm no longer lists and no accounting remembers.
GONE = "GONE"
ENDINGS = {
    "COMPLETED": "ended (every step finished)",
    "CANCELLED": "was cancelled",
    "TIMEOUT": "was ended by Slurm at its time limit",
    "FAILED": "failed",
    "NODE_FAIL": "lost a node (NODE_FAIL)",
    "PREEMPTED": "was preempted",
    "BOOT_FAIL": "could not boot its nodes",
    "DEADLINE": "missed its deadline",
    "OUT_OF_MEMORY": "ran out of memory",
    GONE: "is no longer known to Slurm",
}
_TOKEN_RE = re.compile(r"^[A-Za-z0-9_.,:+/=-]{1,200}\Z")
_LABEL_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}\Z")
_JOB_LINE_RE = re.compile(r"\b(Pending|Granted) job allocation (\S+)")
# Client noise on Debian builds without PMIx; never the reason a command failed.
_NOISE_RE = re.compile(r"mpi/pmix|MPI: Cannot create context|Couldn't load specified plugin|select/\w+: ")
_TERM_S = 5.0


class SlurmError(HostError):
    """Slurm failed, refused a request or cannot be reached (not on PATH, munge down, no controller)."""


class SlurmInputError(SlurmError, InputError):
    """A request Slurm rejects as invalid (partition, account, GRES, node count, time limit): exit 2."""


@dataclass(frozen=True)
class Slurm:
    """How orch runs Slurm's commands: `conf` becomes SLURM_CONF for them (None: Slurm's own lookup)."""

    conf: str | None = None
    timeout_s: float = 30.0

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment for a Slurm command: `base` (default os.environ) with SLURM_CONF when `conf` is set."""
        env = dict(os.environ if base is None else base)
        if self.conf is not None:
            env["SLURM_CONF"] = self.conf
        return env

    def argv(self, tool: str, *args: str) -> list[str]:
        """`tool args` with the tool resolved on PATH; SlurmError when Slurm is not there or SLURM_CONF is missing."""
        path = shutil.which(tool, path=self.env().get("PATH"))
        if path is None:
            raise SlurmError(
                f"Slurm's `{tool}` is not on PATH: run orch on a machine that can submit Slurm jobs "
                "(a login node), or install Slurm's client commands (Debian: slurm-client)"
            )
        conf = self.env().get("SLURM_CONF")
        if conf and not os.path.isfile(conf):
            # Slurm's clients would retry for a minute before saying so.
            raise SlurmError(f"SLURM_CONF={conf} does not exist: point it at the cluster's slurm.conf")
        return [path, *args]

    def run(self, tool: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run one Slurm command to completion (bounded by `timeout_s`); with `check`, a failure is a SlurmError."""
        argv = self.argv(tool, *args)
        try:
            res = subprocess.run(
                argv, capture_output=True, text=True, timeout=self.timeout_s, env=self.env(), stdin=subprocess.DEVNULL
            )
        except subprocess.TimeoutExpired as exc:
            raise SlurmError(
                f"`{tool}` did not answer within {self.timeout_s:g}s: is the Slurm controller (slurmctld) "
                "reachable and munged running on this machine?"
            ) from exc
        if check and res.returncode != 0:
            raise failure(tool, res.returncode, res.stderr)
        return res


def noise(line: str) -> bool:
    """Whether a line a Slurm client printed is known noise (a missing PMIx plugin), never why it failed."""
    return bool(_NOISE_RE.search(line))


def _message(stderr: str) -> str:
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip() and not _NOISE_RE.search(ln)]
    return "; ".join(lines[-4:]) or "(no message)"


def failure(tool: str, rc: int, stderr: str, request: AllocationRequest | None = None) -> SlurmError:
    """The SlurmError (or SlurmInputError) for a failed Slurm command, from what it printed."""
    msg = _message(stderr)
    low = stderr.lower()
    if "authentication error" in low or "munge" in low:
        return SlurmError(
            f"Slurm could not authenticate `{tool}` through munge ({msg}): is munged running on this machine, "
            "with the cluster's key?"
        )
    if "could not establish a configuration source" in low or "unable to process configuration file" in low:
        return SlurmError(f"`{tool}` found no Slurm configuration ({msg}): set SLURM_CONF to the cluster's slurm.conf")
    if "unable to contact slurm controller" in low or "connection refused" in low:
        return SlurmError(f"`{tool}` cannot reach the Slurm controller ({msg})")
    req = request
    if "invalid partition" in low:
        part = req.partition if req else None
        return SlurmInputError(f"Slurm has no partition {part!r} ({msg})")
    if "invalid account" in low or "invalid qos" in low:
        return SlurmInputError(f"Slurm refused account {req.account if req else None!r} ({msg})")
    if "invalid generic resource" in low or "invalid gres" in low:
        return SlurmInputError(
            f"Slurm refused GRES {req.gres if req else None!r}: write it as NAME[:TYPE]:COUNT ({msg})"
        )
    if "requested node configuration is not available" in low or "node count specification invalid" in low:
        what = f"{req.nodes} node(s) with GRES {req.gres!r} in partition {req.partition!r}" if req else "that"
        return SlurmInputError(f"no node of the partition can ever satisfy {what} ({msg})")
    if "time limit" in low and ("invalid" in low or "exceeds" in low):
        return SlurmInputError(f"Slurm refused time limit {req.time_limit_min if req else None!r} min ({msg})")
    return SlurmError(f"`{tool}` failed (exit {rc}): {msg}")


# ---- names: which allocations are orch's, and of which session ----------------------------------------------


def session_id() -> str:
    """This orch process as a session: `<hostname>:<pid>:<start time>[@<start ticks>]` (processes.self_owner: a
    reused PID is another session, a wall-clock step is not)."""
    return f"{socket.gethostname()}:{processes.self_owner()}"


def job_name(namespace: str, session: str | None = None, label: str | None = None) -> str:
    """The job name orch gives an allocation: `orch:<namespace>:<host>:<pid>:<start>[:<label>]` (`<start>`: the
    create time, and `@` the start ticks since boot where the system has them)."""
    if not _LABEL_RE.match(namespace):
        raise InputError(f"namespace {namespace!r} is invalid: use 1-64 letters, digits, '_', '.' or '-'")
    if label is not None and not _LABEL_RE.match(label):
        raise InputError(f"allocation label {label!r} is invalid: use 1-64 letters, digits, '_', '.' or '-'")
    parts = [NAME_PREFIX, namespace, session or session_id()]
    return ":".join(parts + ([label] if label else []))


@dataclass(frozen=True)
class JobName:
    """A parsed orch job name."""

    namespace: str
    host: str
    owner: str  # `<pid>:<start time>[@<start ticks>]`, as processes.owner_state takes it
    label: str | None


def parse_name(name: str) -> JobName | None:
    """The parts of an orch job name, or None for any other job's name."""
    parts = name.split(":")
    if parts[0] != NAME_PREFIX or len(parts) not in (5, 6) or not all(parts[1:]):
        return None
    _, ns, host, pid, created, *label = parts
    if not pid.isdigit():
        return None
    return JobName(ns, host, f"{pid}:{created}", label[0] if label else None)


# ---- requesting and waiting ----------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class AllocationRequest:
    """What orch asks Slurm for: `salloc --no-shell -N nodes -p partition --time --exclusive --gres [-A]`."""

    partition: str | None = None  # None: the cluster's default partition
    nodes: int = 1
    time_limit_min: int = 60
    gres: str | None = None  # e.g. "gpu:8"
    account: str | None = None
    exclusive: bool = True

    def __post_init__(self) -> None:
        if not 1 <= self.nodes <= 100_000:
            raise InputError(f"nodes: {self.nodes!r} is invalid: use a whole number from 1")
        if not 1 <= self.time_limit_min <= 525_600:
            raise InputError(f"time limit: {self.time_limit_min!r} min is invalid: use 1 to 525600 minutes")
        for key in ("partition", "gres", "account"):
            value = getattr(self, key)
            if value is not None and not _TOKEN_RE.match(value):
                raise InputError(f"{key}: {value!r} is invalid: use letters, digits and _ . , : + / = -")

    def salloc_args(self, name: str) -> list[str]:
        """salloc's arguments for this request under job name `name`."""
        args = ["--no-shell", "-J", name, f"--time={self.time_limit_min}", "-N", str(self.nodes)]
        if self.exclusive:
            args.append("--exclusive")
        if self.gres:
            args.append(f"--gres={self.gres}")
        if self.partition:
            args += ["-p", self.partition]
        if self.account:
            args += ["-A", self.account]
        return args


@dataclass(frozen=True)
class QueueState:
    """Where a requested allocation stands while orch waits: Slurm's state and reason (PENDING, `Resources`)."""

    job_id: str
    state: str
    reason: str
    waited_s: float


@dataclass(frozen=True)
class Allocation:
    """A granted allocation: Slurm's job id, orch's job name for it, and its nodes (Slurm's node names)."""

    job_id: str
    name: str
    nodes: tuple[str, ...]
    partition: str


class _SallocOutput:
    """salloc's stderr, read on a thread: the job id as soon as it is queued, and every line for errors."""

    def __init__(self, stream: Iterator[str]) -> None:
        self.job_id: str | None = None
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: Iterator[str]) -> None:
        for line in stream:
            self.lines.append(line)
            m = _JOB_LINE_RE.search(line)
            if m and self.job_id is None:
                self.job_id = m.group(2)

    def join(self) -> str:
        self._thread.join(_TERM_S)
        return "".join(self.lines)


def allocate(
    slurm: Slurm,
    request: AllocationRequest,
    *,
    namespace: str,
    label: str | None = None,
    on_state: Callable[[QueueState], None] | None = None,
    wait_s: float | None = None,
    poll_s: float = 5.0,
) -> Allocation:
    """Request an allocation and wait until Slurm grants it; `on_state` hears its queue state every `poll_s`
    while it waits (first after 0.5 s) and once when it is granted.

    An error, a timeout (`wait_s`) or an interrupt (Ctrl-C) while waiting, or before this returns, cancels the
    request: nothing is left queued or held. Once this returns, the caller owns the job (`held` releases it).
    """
    name = job_name(namespace, label=label)
    argv = slurm.argv("salloc", *request.salloc_args(name))
    started = time.monotonic()
    # Its own session: a terminal's Ctrl-C reaches orch, which cancels; salloc must not race it.
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=slurm.env(),
        start_new_session=True,
    )
    assert proc.stderr is not None
    out = _SallocOutput(proc.stderr)
    try:
        last: tuple[str, str] | None = None
        delay = min(0.5, poll_s)  # the first look soon, so a queued request is shown at once
        while True:
            if wait_s is not None:
                delay = max(0.05, min(delay, started + wait_s - time.monotonic()))
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(delay)
            delay = poll_s
            if proc.returncode is not None:
                break
            if out.job_id is None:  # salloc quietened (SALLOC_QUIET): find the request by its name
                out.job_id = _job_by_name(slurm, name)
            if out.job_id is not None:
                st = job_state(slurm, out.job_id)
                last = (st.state, st.reason)
                if on_state is not None:
                    on_state(QueueState(out.job_id, st.state, st.reason, time.monotonic() - started))
            if wait_s is not None and time.monotonic() - started >= wait_s:
                why = f" ({last[0]}, reason {last[1]})" if last else ""
                raise SlurmError(f"Slurm did not grant allocation {out.job_id or name} within {wait_s:g}s{why}")
        text = out.join()
        if proc.returncode != 0:
            raise failure("salloc", proc.returncode, text, request)
        job_id = out.job_id or _job_by_name(slurm, name)
        if job_id is None:
            raise SlurmError(f"salloc granted an allocation but printed no job id, and none is named {name}: {text}")
        out.job_id = job_id
        info = slurm.run("squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T|%P|%N").stdout.strip().split("|")
        if len(info) != 3 or info[0] not in LIVE_STATES - {"PENDING"}:
            raise SlurmError(f"allocation {job_id} is {info[0] or 'gone'} right after it was granted")
        alloc = Allocation(job_id, name, expand_hostnames(slurm, info[2]), info[1])
        if on_state is not None:
            on_state(QueueState(job_id, info[0], "None", time.monotonic() - started))
        return alloc
    except BaseException:
        _abandon(slurm, proc, out, name)
        raise


def _abandon(slurm: Slurm, proc: subprocess.Popen[str], out: _SallocOutput, name: str) -> None:
    """Undo a request that will not be handed to the caller, whatever stage it reached."""
    waiting = proc.poll() is None
    if waiting:
        proc.send_signal(signal.SIGINT)  # salloc cancels its own pending job
        try:
            proc.wait(_TERM_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    out.join()
    # A salloc that failed by itself printed the id of any job it made; one stopped mid-request may not have yet.
    job_id = out.job_id or (_job_by_name(slurm, name) if waiting or proc.returncode == 0 else None)
    if job_id is not None:
        release(slurm, job_id)


def _job_by_name(slurm: Slurm, name: str) -> str | None:
    res = slurm.run("squeue", "-h", "--me", "-n", name, "-o", "%i", check=False)
    ids = res.stdout.split()
    return ids[0] if res.returncode == 0 and ids else None


@contextlib.contextmanager
def held(
    slurm: Slurm,
    request: AllocationRequest,
    *,
    namespace: str,
    label: str | None = None,
    on_state: Callable[[QueueState], None] | None = None,
    wait_s: float | None = None,
    poll_s: float = 5.0,
) -> Iterator[Allocation]:
    """An allocation for the body of a `with`, released at its end however it ends (errors, Ctrl-C)."""
    alloc = allocate(slurm, request, namespace=namespace, label=label, on_state=on_state, wait_s=wait_s, poll_s=poll_s)
    try:
        yield alloc
    finally:
        release(slurm, alloc.job_id)


# ---- a granted allocation ------------------------------------------------------------------------------------


def expand_hostnames(slurm: Slurm, nodelist: str) -> tuple[str, ...]:
    """Slurm's compact node list (`gpu[01-02]`) as node names, in Slurm's order."""
    if not nodelist or nodelist in ("(null)", "None assigned"):
        return ()
    return tuple(slurm.run("scontrol", "show", "hostnames", nodelist).stdout.split())


def nodes(slurm: Slurm, job_id: str) -> tuple[str, ...]:
    """The nodes of a running allocation, in Slurm's order (rank 0 first)."""
    return expand_hostnames(slurm, slurm.run("squeue", "-h", "-t", "all", "-j", job_id, "-o", "%N").stdout.strip())


def node_address(slurm: Slurm, node: str) -> str:
    """Where other nodes reach `node`: its NodeAddr in slurm.conf (the node name when that is not set)."""
    out = slurm.run("scontrol", "show", "node", "-o", node).stdout
    m = re.search(r"(?:^|\s)NodeAddr=(\S+)", out)
    return m.group(1) if m else node


def step(
    slurm: Slurm,
    job_id: str,
    node: str,
    argv: Sequence[str],
    *,
    gres: str | None = None,
    env: Mapping[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """Start `argv` as one task of a step of the allocation on `node`, its stdin, stdout and stderr piped to us.

    `--overlap` shares the allocation with every other step; `gres` (e.g. "gpu:8", or "none" for a helper that
    needs no GPU) limits what the step gets, and without it the step sees all of the job's GRES. The task's stdout
    is line-buffered (`-u`); Slurm's own messages come on stderr with the task's. Ending srun (closing stdin for a
    task that exits on EOF, or terminate()) ends the step, never the allocation. `env` is the task's environment
    (default: ours), as srun passes its own on.
    """
    args = ["--jobid", job_id, "--overlap", "-N1", "-n1", "-w", node, "-u", "--quiet"]
    if gres:
        args.append(f"--gres={gres}")
    return subprocess.Popen(
        slurm.argv("srun", *args, *argv),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=slurm.env(env),
        start_new_session=True,  # orch decides when a step ends, not a terminal's Ctrl-C
    )


@dataclass(frozen=True)
class JobState:
    """A job's state as Slurm reports it (RUNNING, PENDING, TIMEOUT, CANCELLED, ... or orch's GONE)."""

    job_id: str
    state: str
    reason: str

    @property
    def live(self) -> bool:
        """Whether the job still holds or waits for resources."""
        return self.state in LIVE_STATES

    def describe(self) -> str:
        """One line for a user: `allocation 42 was ended by Slurm at its time limit (TIMEOUT)`."""
        if self.live:
            why = f", reason {self.reason}" if self.reason not in ("", "None") else ""
            return f"allocation {self.job_id} is {self.state}{why}"
        return f"allocation {self.job_id} {ENDINGS.get(self.state, 'ended')} ({self.state})"


def job_state(slurm: Slurm, job_id: str) -> JobState:
    """The job's current state; after Slurm forgot it (MinJobAge), accounting's, else GONE."""
    res = slurm.run("squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T|%r", check=False)
    line = res.stdout.strip()
    if res.returncode == 0 and line:
        state, _, reason = line.splitlines()[0].partition("|")
        return JobState(job_id, state, reason)
    if res.returncode != 0 and "invalid job id" not in res.stderr.lower():
        raise failure("squeue", res.returncode, res.stderr)
    if shutil.which("sacct", path=slurm.env().get("PATH")):
        acct = slurm.run("sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State,Reason", check=False)
        first = acct.stdout.strip().splitlines()[:1]
        if acct.returncode == 0 and first:
            state, _, reason = first[0].partition("|")
            return JobState(job_id, state.split()[0] if state else GONE, reason)  # "CANCELLED by 0"
    return JobState(job_id, GONE, "not listed by squeue (ended over MinJobAge ago) and no accounting")


def release(slurm: Slurm, job_id: str, wait_s: float = 120.0, poll_s: float = 0.2) -> JobState:
    """Cancel the allocation (every step gets SIGTERM, SIGKILL after KillWait) and wait until it has ended."""
    state = job_state(slurm, job_id)
    if state.live:
        slurm.run("scancel", job_id)
    deadline = time.monotonic() + wait_s
    while state.live:
        if time.monotonic() > deadline:
            raise SlurmError(f"allocation {job_id} is still {state.state} {wait_s:g}s after scancel")
        time.sleep(poll_s)
        state = job_state(slurm, job_id)
    return state


# ---- leftovers of crashed sessions ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Leftover:
    """A live allocation named for this namespace whose orch session (on this machine) is gone."""

    job_id: str
    name: str
    state: str


def find_leftovers(slurm: Slurm, namespace: str) -> list[Leftover]:
    """This user's live allocations that orch named for `namespace` and whose owning session is dead.

    Only a session that ran on this machine can be judged dead; another user's job, another namespace's, a job
    named by anyone else, and a live session's are never listed.
    """
    # `-t all` and a filter here: the state names squeue accepts differ between Slurm versions.
    res = slurm.run("squeue", "-h", "--me", "-t", "all", "-o", "%i|%T|%j")
    host = socket.gethostname()
    out = []
    for line in res.stdout.splitlines():
        job_id, state, name = [*line.split("|", 2), "", ""][:3]
        parsed = parse_name(name)
        if state not in LIVE_STATES or state == "COMPLETING":  # already on its way out
            continue
        if parsed is None or parsed.namespace != namespace or parsed.host != host:
            continue
        if processes.owner_state(parsed.owner) == "dead":
            out.append(Leftover(job_id, name, state))
    return out


def release_leftovers(slurm: Slurm, namespace: str) -> list[Leftover]:
    """Release every leftover of `namespace` (see find_leftovers); returns what was released."""
    found = find_leftovers(slurm, namespace)
    for left in found:
        release(slurm, left.job_id)
    return found
