"""The main process's side of the worker processes: spawning them, hearing that they are ready, stopping them."""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

from orchestrator.sim import logs
from orchestrator.sim.workers import WorkerSpec, run_worker

WORKER_STOP_S = 3.0


@dataclass(kw_only=True)
class Worker:
    spec: WorkerSpec
    proc: BaseProcess
    conn: Connection
    ready: bool = False
    dead: bool = False

    @property
    def label(self) -> str:
        return f"Rank {self.spec.rank} scheduler" if self.spec.role == "scheduler" else "Detokenizer"

    def take_messages(self) -> bool:
        """Read what the worker sent (it says when it is ready); False once its pipe is closed: the worker is gone."""
        try:
            while self.conn.poll(0):
                msg = self.conn.recv()
                if isinstance(msg, dict) and msg.get("status") == "ready":
                    self.ready = True
        except (EOFError, OSError):
            return False
        return True


def spawn_workers(specs: list[WorkerSpec], workers: list[Worker], on_readable: Callable[[Worker], None]) -> None:
    """Start one spawned process per spec, appended to workers as it starts; on_readable(worker) runs in the event
    loop whenever that worker's pipe has something to read."""
    ctx = multiprocessing.get_context("spawn")
    loop = asyncio.get_running_loop()
    for spec in specs:
        parent_conn, child_conn = ctx.Pipe(duplex=True)
        proc = ctx.Process(target=run_worker, args=(spec, child_conn), name=spec.title, daemon=False)
        proc.start()
        child_conn.close()
        worker = Worker(spec=spec, proc=proc, conn=parent_conn)
        workers.append(worker)
        loop.add_reader(parent_conn.fileno(), on_readable, worker)
    pids = ", ".join(f"{w.spec.title}={w.proc.pid}" for w in workers)
    logs.log(f"Started {len(workers)} worker processes (spawn): {pids}")


async def report_init_failure(w: Worker) -> None:
    logs.log(f"{w.label} is dead. Please check if there are relevant logs.", "error")
    await asyncio.get_running_loop().run_in_executor(None, w.proc.join, 2.0)
    logs.log(f"Exit code: {w.proc.exitcode}", "error")
    logs.log("Initialization failed. Please see the error messages above.", "error")


async def stop_workers(workers: list[Worker], kill: bool = False) -> None:
    """Stop the workers (a kill: at once), waiting WORKER_STOP_S for them; the escape faults' workers are left."""
    loop = asyncio.get_running_loop()
    # A reexec-no-marker worker answers "stop" by becoming another program: waiting for it (and then
    # SIGKILLing it) would undo the fault, so unless this is a kill it only gets the message.
    reexec = [] if kill else [w for w in workers if w.spec.reexec]
    keep = [w for w in workers if not w.spec.escape and w not in reexec]
    for w in workers:
        with contextlib.suppress(ValueError, OSError):
            loop.remove_reader(w.conn.fileno())
    for w in reexec:
        logs.log(f"FAULT reexec-no-marker: telling the {w.label} (pid {w.proc.pid}) to stop; it re-execs instead")
        with contextlib.suppress(OSError, ValueError, BrokenPipeError):
            w.conn.send("stop")
    for w in keep:
        if kill:
            with contextlib.suppress(OSError, ValueError):
                w.proc.kill()
        else:
            with contextlib.suppress(OSError, ValueError, BrokenPipeError):
                w.conn.send("stop")
    deadline = loop.time() + WORKER_STOP_S
    while any(w.proc.is_alive() for w in keep) and loop.time() < deadline:
        await asyncio.sleep(0.02)
    for w in keep:
        if w.proc.is_alive():
            logs.log(f"{w.label} (pid {w.proc.pid}) did not stop; killing it", "warning")
            w.proc.kill()
            w.proc.join(1.0)
    for w in workers:
        if w.spec.escape:
            logs.log(
                f"FAULT escape-setsid: leaving the escaped scheduler (pid {w.proc.pid}) running; it is not "
                "this process's child any more in spirit and will outlive the server",
                "warning",
            )
