"""Multi-node ranks: rank 0 waits at --dist-init-addr until every rank has joined; a lost rank breaks the group."""

# What this imitates (SGLang 0.5.x, entrypoints/engine.py and torch.distributed): every rank's schedulers join one
# process group whose store lives at --dist-init-addr on rank 0, so no rank finishes initialising (and rank 0 never
# opens its HTTP port) until all --nnodes ranks are there. Ranks >= 1 then serve only a dummy health app on
# --host/--port (/health, /health_generate, /ping: always 200) and wait on their schedulers. When a rank dies, the
# group's connections break: the simulator's choice for what follows is the error path (the scheduler's exception
# makes its server kill its own tree and exit 1) on every surviving rank, at once. Real NCCL may instead hang until
# its watchdog fires; the simulator does not model that wait.

from __future__ import annotations

import asyncio
import contextlib

from orchestrator.sim import logs

JOIN_RETRY_S = 0.1


class NodeGroup:
    """One rank's side of the group: form it (listen or join), then notice when a peer goes away."""

    def __init__(self, nnodes: int, rank: int, addr: tuple[str, int]) -> None:
        self.nnodes, self.rank, self.addr = nnodes, rank, addr
        self.formed = asyncio.Event()
        self.broken = asyncio.Event()  # formation failed or a peer left: `why` says which
        self.why = ""
        self._writers: list[asyncio.StreamWriter] = []
        self._joined: dict[int, tuple[asyncio.StreamReader, asyncio.StreamWriter]] = {}
        self._server: asyncio.base_events.Server | None = None
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def where(self) -> str:
        return f"{self.addr[0]}:{self.addr[1]}"

    async def form(self) -> None:
        try:
            if self.rank == 0:
                await self._listen()
            else:
                await self._join()
        except OSError as exc:
            self._break(f"distributed init at {self.where} failed: {exc}")

    def _break(self, why: str) -> None:
        if not self.broken.is_set():
            self.why = why
            self.broken.set()

    async def _listen(self) -> None:
        host, port = self.addr
        try:
            self._server = await asyncio.start_server(self._on_join, host, port, reuse_address=True)
        except OSError as exc:
            if "Cannot assign requested address" not in str(exc):
                raise
            # The init address names this host as the others reach it; like torch's store, listen on every
            # interface when that name is not one of ours.
            self._server = await asyncio.start_server(self._on_join, None, port, reuse_address=True)
        logs.log(f"node rank 0: waiting for node ranks 1..{self.nnodes - 1} to join at {self.where}")

    async def _on_join(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = (await reader.readline()).decode(errors="replace").split()
        except (ConnectionError, OSError):
            writer.close()
            return
        rank = int(line[1]) if len(line) == 2 and line[0] == "rank" and line[1].isdigit() else -1
        if not 1 <= rank < self.nnodes or rank in self._joined or self.formed.is_set():
            logs.log(f"refused a join at {self.where}: {' '.join(line) or 'nothing'} (not a missing rank)", "warning")
            writer.close()
            return
        self._joined[rank] = (reader, writer)
        self._writers.append(writer)
        # Watched from the moment it joins: a rank that dies while the others load breaks the group too.
        self._tasks.append(asyncio.ensure_future(self._watch(reader, f"node rank {rank}")))
        missing = [r for r in range(1, self.nnodes) if r not in self._joined]
        logs.log(f"node rank {rank} joined" + (f"; still waiting for {missing}" if missing else "; group complete"))
        if missing:
            return
        for _, writer_ in sorted(self._joined.items()):
            writer_[1].write(b"go\n")
        if self._server is not None:
            self._server.close()
        self.formed.set()

    async def _join(self) -> None:
        host, port = self.addr
        said = False
        while not self.broken.is_set():
            try:
                reader, writer = await asyncio.open_connection(host, port)
                break
            except OSError:
                if not said:
                    logs.log(f"node rank {self.rank}: waiting for node rank 0 at {self.where}")
                    said = True
                await asyncio.sleep(JOIN_RETRY_S)
        else:
            return
        writer.write(f"rank {self.rank}\n".encode())
        await writer.drain()
        if (await reader.readline()).strip() != b"go":
            self._break(f"node rank 0 at {self.where} closed the connection before the group was complete")
            return
        logs.log(f"node rank {self.rank}: joined the group of {self.nnodes} nodes at {self.where}")
        self._writers.append(writer)
        self._tasks.append(asyncio.ensure_future(self._watch(reader, "node rank 0")))
        self.formed.set()

    async def _watch(self, reader: asyncio.StreamReader, peer: str) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while await reader.read(4096):
                pass
        self._break(f"connection to {peer} lost: the distributed group is broken")

    def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for writer in self._writers:
            with contextlib.suppress(Exception):
                writer.close()
        if self._server is not None:
            self._server.close()
