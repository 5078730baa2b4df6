"""`fan_out: true`: each Slurm item of a night runs in a child orch process (its own allocation), all in parallel."""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from orchestrator.hosts.inventory import parse_target
from orchestrator.launch import single
from orchestrator.nightly.result import ItemReport
from orchestrator.nightly.suite import Item, Suite
from orchestrator.ui import progress

if TYPE_CHECKING:
    from orchestrator.nightly.night import NightRunner

# A child stops itself at its item's timeout or the night's deadline; this is only for one that then hangs.
CHILD_GRACE_S = 120.0
# After Ctrl-C (or a hung child): time for a child to tear its servers down and release its allocation.
STOP_WAIT_S = 60.0


def fanned(suite: Suite, items: list[Item], inventory: dict[str, Any]) -> list[Item]:
    """The items that run as their own allocations tonight: those on hosts that allocate nodes (Slurm), when the
    suite fans out."""
    if not suite.fan_out:
        return []
    return [i for i in items if parse_target(i.host, inventory).capabilities.allocates_nodes]


def warnings(suite: Suite, inventory: dict[str, Any]) -> list[str]:
    """What --check says about `fan_out: true` that is valid but may not do what the suite's author expects (hosts
    resolved from the inventory only: Slurm is not asked)."""
    if not suite.fan_out:
        return []
    config = {i.name: parse_target(i.host, inventory) for i in suite.items}
    on_slurm = [i for i in suite.items if config[i.name].capabilities.allocates_nodes]
    others = ", ".join(f"{i.name} (on {i.host})" for i in suite.items if i not in on_slurm)
    out = []
    if not on_slurm:
        out.append(
            "fan_out: true has no effect for this suite: it fans out only items on a Slurm host (`host: "
            "slurm:PARTITION`, or an inventory entry with `scheduler: slurm`), and none is; every item runs in this "
            f"process, one after another: {others}"
        )
    elif others:
        out.append(
            f"fan_out: true has no effect for {others}: only items on a Slurm host run as their own allocations; "
            "these run in this process, one after another, while the Slurm items run in parallel"
        )
    shared = [i for i in on_slurm if not config[i.name].exclusive]
    if len(shared) > 1:
        names = ", ".join(f"{i.name} (on {i.host})" for i in shared)
        out.append(
            f"fan_out: {names} run on Slurm hosts with `exclusive: false`: allocations that land on the same node "
            "take turns on that node's host lock (orch runs one session per machine at a time, so servers never "
            "contend for its ports and GPU memory), so they may not run in parallel; each waits for its turn up to "
            f"the suite's wait: ({progress.duration(suite.wait_s)}). Set `exclusive: true` for parallel items, or a "
            "wait: as long as the others take"
        )
    return out


def allocation_state(line: str, state: str | None) -> str | None:
    """Where an item on Slurm stands, from its progress line (and where it stood before): "queued" while its
    allocation waits in Slurm's queue, "granted" once it runs (SlurmHost says both)."""
    if "Slurm granted allocation" in line:
        return "granted"
    if " is queued (" in line and "allocation" in line:
        return "queued"
    return state


def interrupted_why(state: str | None) -> str:
    """What an interrupted item's summary says, without claiming it ran when it never left Slurm's queue."""
    if state == "queued":
        return "interrupted while queued for its allocation"
    return "interrupted while it ran" if state == "granted" else "interrupted"


@dataclass(kw_only=True)
class _Child:
    item: Item
    proc: subprocess.Popen[str]
    out: Path
    began: float
    budget: float
    reader: threading.Thread
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=5))
    stopping: float | None = None
    why: str | None = None  # set when the parent had to stop it
    allocation: str | None = None  # allocation_state of what it printed


class FanOut:
    """The night's child processes: started together, watched, stopped on Ctrl-C, their reports collected."""

    def __init__(self, runner: NightRunner, deadline: float) -> None:
        self.runner = runner
        self.deadline = deadline
        self.children: list[_Child] = []
        self._dir: str | None = None

    def __contains__(self, item: Item) -> bool:
        return any(c.item.name == item.name for c in self.children)

    def start(self, item: Item) -> None:
        """Start the item in a child process; its report comes from wait() (or stop())."""
        if self._dir is None:
            self._dir = tempfile.mkdtemp(prefix="orch-fanout-")
        remaining = self.deadline - time.monotonic()
        out = Path(self._dir) / f"{item.name}.report"
        spec = {
            "suite": str(self.runner.suite.path),
            "sha256": self.runner.suite.sha256,
            "item": item.name,
            "db": str(self.runner.store.path),
            "night_id": self.runner.night_id,
            "night_at": self.runner.night_at,
            "remaining_s": remaining,
            "out": str(out),
        }
        proc = subprocess.Popen(
            [sys.executable, "-m", "orchestrator.nightly.child", json.dumps(spec)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # Ctrl-C reaches it once, from us, so its teardown is not interrupted twice
        )
        child = _Child(
            item=item,
            proc=proc,
            out=out,
            began=time.monotonic(),
            budget=min(item.timeout_s, remaining),
            reader=threading.Thread(),
        )
        child.reader = threading.Thread(target=self._forward, args=(child, proc.stdout), daemon=True)
        child.reader.start()
        self.children.append(child)

    def _forward(self, child: _Child, stream: IO[str] | None) -> None:
        assert stream is not None
        prefix = f"[{child.item.name}]"
        for line in stream:
            line = line.rstrip("\n")
            child.tail.append(line)
            child.allocation = allocation_state(line, child.allocation)
            self.runner.events.line(line if line.startswith(prefix) else f"{prefix} {line}")

    def wait(self) -> list[ItemReport]:
        """Every child's report, once all have ended; a child past its time is stopped the way Ctrl-C would."""
        while any(c.proc.poll() is None for c in self.children):
            now = time.monotonic()
            for c in self.children:
                if c.proc.poll() is None and c.stopping is None and now > c.began + c.budget + CHILD_GRACE_S:
                    self._interrupt(c, f"still running {CHILD_GRACE_S:.0f}s past its time")
                elif c.stopping is not None and c.proc.poll() is None and now > c.stopping + STOP_WAIT_S:
                    c.proc.kill()
            time.sleep(0.2)
        return self._collect()

    def stop(self) -> list[ItemReport]:
        """Ctrl-C (or SIGTERM, SIGHUP, a failure) in the parent: every child interrupted, given time to release its
        allocation; a second signal meanwhile does not cut that short (the children run in their own sessions, so
        they hear of it only from here)."""
        try:
            with single.shielded(self.runner.events):
                for c in self.children:
                    if c.proc.poll() is None and c.stopping is None:
                        self._interrupt(c, None)
                until = time.monotonic() + STOP_WAIT_S
                while any(c.proc.poll() is None for c in self.children) and time.monotonic() < until:
                    time.sleep(0.2)
        finally:
            for c in self.children:
                if c.proc.poll() is None:
                    c.proc.kill()  # the allocation is time-limited and the next orch on Slurm releases it
                    c.proc.wait()
        return self._collect()

    def _interrupt(self, c: _Child, why: str | None) -> None:
        c.stopping, c.why = time.monotonic(), why
        with contextlib.suppress(ProcessLookupError):
            c.proc.send_signal(signal.SIGINT)

    def _collect(self) -> list[ItemReport]:
        reports = []
        for c in self.children:
            c.reader.join(timeout=5)
            reports.append(self._report(c))
        self.children = []
        if self._dir is not None:
            for f in Path(self._dir).iterdir():
                f.unlink()
            os.rmdir(self._dir)
            self._dir = None
        return reports

    def _report(self, c: _Child) -> ItemReport:
        if c.out.exists():
            with c.out.open("rb") as f:
                report: ItemReport = pickle.load(f)  # written by our own child, in our own private directory
            return report
        tail = " | ".join(c.tail) or "no output"
        if c.why is not None:
            return self.runner._failed(c.item, "timeout", f"its process was {c.why} and was stopped", c.began)
        if c.stopping is not None:
            return self.runner._failed(c.item, "interrupted", interrupted_why(c.allocation), c.began)
        error = f"its process ended (exit {c.proc.returncode}) without a result; last output: {tail}"
        return self.runner._failed(c.item, "failed", error, c.began)
