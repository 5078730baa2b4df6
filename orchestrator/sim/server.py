"""The simulator's main process: readiness phases, the worker processes' fate, HTTP routes and handlers, shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

from orchestrator.sim import logs
from orchestrator.sim.args import SGLANG_VERSION, ServerConfig, SimArgError, parse_server_args
from orchestrator.sim.documents import metrics_text, model_info_obj, models_obj, server_info_obj
from orchestrator.sim.engine import Req, SimEngine, Sink, count_text_tokens
from orchestrator.sim.httpio import HttpError, Request, json_response, read_request, response, stream_head
from orchestrator.sim.knobs import knob_faults, knob_float
from orchestrator.sim.launch import launch, load_knobs
from orchestrator.sim.nodes import NodeGroup
from orchestrator.sim.requests import Body, generate_body, openai_body
from orchestrator.sim.sglang_env import health_check_timeout, rewrite_env
from orchestrator.sim.sinks import GenerateSink, OpenAISink, openai_error
from orchestrator.sim.timing import TimingModel
from orchestrator.sim.workerpool import Worker, report_init_failure, spawn_workers, stop_workers
from orchestrator.sim.workers import WorkerSpec

KEEP_ALIVE_S = 5.0  # uvicorn's timeout_keep_alive default, which SGLang keeps
WORKER_DEATH_GRACE_S = 0.5
WARMUP_TEXT = "The capital city of France is"
WARMUP_MAX_NEW_TOKENS = 8

LOADING, STARTING, UP, UNHEALTHY, SHUTTING_DOWN = "loading", "starting", "up", "unhealthy", "shutting_down"


Handler = Callable[[Request, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[bool]]


class SimServer:
    """Owns the workers, the engine and the HTTP server for one simulated launch."""

    # What a subclass imitating another engine (sim/vllm_server.py) changes.
    engine_version = SGLANG_VERSION
    stop_key = "matched_stop"
    owned_by = "sglang"

    def __init__(
        self,
        cfg: ServerConfig,
        knobs: dict[str, float | int | str | None],
        seed: int,
        speed_factor: float,
        env_changes: list[str],
    ) -> None:
        self.cfg = cfg
        self.knobs = knobs
        self.seed = seed
        self.speed_factor = speed_factor
        self.env_changes = env_changes
        self.faults = knob_faults(knobs)
        self.health_timeout_s = health_check_timeout(os.environ)
        self.phase = LOADING
        self.workers: list[Worker] = []
        self.conns: set[asyncio.StreamWriter] = set()
        self.busy_conns: set[asyncio.StreamWriter] = set()
        self.http: asyncio.base_events.Server | None = None
        self.model = TimingModel.from_knobs(knobs, cfg.spec, speed_factor, cfg.chunked_prefill_size)
        self.engine: SimEngine | None = None
        self._ready = asyncio.Event()
        self._shutdown = asyncio.Event()
        self._init_failure: Worker | None = None
        self._drain_deadline: float | None = None
        self._signals = 0
        # A socket bound before loading (vLLM's way: the port is taken but refuses connections until it listens).
        self.listen_sock: socket.socket | None = None
        self._routes = self.routes()
        self._group_task: asyncio.Future[None] | None = None

    def routes(self) -> dict[str, tuple[tuple[str, ...], Handler]]:
        return {
            "/health": (("GET",), self._health),
            "/health_generate": (("GET",), self._health),
            "/model_info": (("GET",), self._model_info),
            "/get_model_info": (("GET",), self._model_info),
            "/server_info": (("GET",), self._server_info),
            "/get_server_info": (("GET",), self._server_info),
            "/v1/models": (("GET",), self._models),
            "/metrics": (("GET",), self._metrics),
            "/generate": (("POST", "PUT"), self._generate),
            "/v1/completions": (("POST",), self._completions),
            "/v1/chat/completions": (("POST",), self._chat),
            "/flush_cache": (("GET", "POST"), self._flush_cache),
        }

    async def _before_listen(self) -> None:
        """Startup work between loading and listening (SGLang has none: it warms up with the port open)."""

    def _listening_message(self) -> str:
        return f"Uvicorn running on http://{self.cfg.host}:{self.cfg.port} (simulated server; Press CTRL+C to quit)"

    # ---- lifecycle --------------------------------------------------------------------------------------------
    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            if sig == signal.SIGTERM and "ignore-sigterm" in self.faults:
                continue
            loop.add_signal_handler(sig, self._on_signal, sig)
        self._spawn_workers()
        group = self._start_group()
        ready_wait = asyncio.ensure_future(self._ready.wait())
        stop_wait = asyncio.ensure_future(self._shutdown.wait())
        broken = {asyncio.ensure_future(group.broken.wait())} if group is not None else set()
        await asyncio.wait({ready_wait, stop_wait, *broken}, return_when=asyncio.FIRST_COMPLETED)
        ready_wait.cancel()
        if self._init_failure is not None:
            await report_init_failure(self._init_failure)
            await stop_workers(self.workers, kill=True)
            return 1
        if group is not None and group.broken.is_set() and not self._shutdown.is_set():
            return await self._group_failed(group, loading=True)
        if self._shutdown.is_set():
            logs.log("Shutdown requested while loading; stopping workers")
            await stop_workers(self.workers)
            return 0
        if group is not None:
            # Loaded, but no rank finishes initialising before every rank has joined: the port stays closed.
            formed = asyncio.ensure_future(group.formed.wait())
            await asyncio.wait({formed, stop_wait, *broken}, return_when=asyncio.FIRST_COMPLETED)
            formed.cancel()
            if group.broken.is_set() and not self._shutdown.is_set():
                return await self._group_failed(group, loading=True)
            if self._shutdown.is_set():
                logs.log("Shutdown requested while waiting for the other nodes; stopping workers")
                group.close()
                await stop_workers(self.workers)
                return 0
            if self.cfg.node_rank >= 1:
                return await self._serve_health_only(group, stop_wait, broken)
        await self._before_listen()
        if self._shutdown.is_set():
            logs.log("Shutdown requested before the server listened; stopping workers")
            await stop_workers(self.workers)
            return 0
        try:
            if self.listen_sock is not None:
                self.http = await asyncio.start_server(self._on_conn, sock=self.listen_sock, backlog=2048, limit=65536)
            else:
                self.http = await asyncio.start_server(
                    self._on_conn, self.cfg.host, self.cfg.port, reuse_address=True, backlog=2048, limit=64 * 1024
                )
        except OSError as exc:
            logs.log(str(exc), "error")
            await stop_workers(self.workers, kill=True)
            return 1
        self.phase = STARTING
        logs.log(self._listening_message())
        # The two *-after-tokens faults cannot be combined (knobs), so at most one of them sets the count.
        die_after = self.faults.get("die-after-tokens") or self.faults.get("worker-hang-after-tokens")
        self.engine = SimEngine(
            self.model,
            random.Random(f"{self.seed}:engine"),
            max_running=self.cfg.max_running_requests,
            stream_interval=self.cfg.stream_interval,
            decode_log_interval=self.cfg.decode_log_interval,
            cuda_graph=not self.cfg.disable_cuda_graph,
            cuda_graph_max_bs=self.cfg.cuda_graph_max_bs,
            die_after_tokens=die_after,
            on_crash=self._crash,
            diverge_after=_int_knob(self.knobs.get("diverge_after")),
            prefix_cache_entries=_int_knob(self.knobs.get("prefix_cache_entries")) or 0,
        )
        engine_task = asyncio.ensure_future(self.engine.run())
        warmup_task = asyncio.ensure_future(self._warmup())
        await asyncio.wait({stop_wait, *broken}, return_when=asyncio.FIRST_COMPLETED)
        warmup_task.cancel()
        if group is not None and not self._shutdown.is_set():
            engine_task.cancel()
            return await self._group_failed(group, loading=False)
        await self._graceful_shutdown()
        engine_task.cancel()
        return 0

    def _start_group(self) -> NodeGroup | None:
        if self.cfg.nnodes == 1 or self.cfg.dist_init_addr is None:
            return None
        group = NodeGroup(self.cfg.nnodes, self.cfg.node_rank, self.cfg.dist_init_addr)
        self._group_task = asyncio.ensure_future(group.form())
        return group

    async def _group_failed(self, group: NodeGroup, *, loading: bool) -> int:
        """A rank is gone: the collective this node's schedulers wait in fails, and the server kills its own tree."""
        logs.log(f"Scheduler hit an exception: RuntimeError: {group.why}", "error")
        if loading:
            logs.log("Initialization failed. Please see the error messages above.", "error")
        else:
            logs.log("Received sigquit from a child process. It usually means the child failed.", "error")
        group.close()
        if self.http is not None:
            self.http.close()
        for w in list(self.conns):
            w.close()
        await stop_workers(self.workers, kill=True)
        return 1

    async def _serve_health_only(
        self, group: NodeGroup, stop_wait: asyncio.Future[Any], broken: Iterable[asyncio.Future[Any]]
    ) -> int:
        """Node rank >= 1: no tokenizer, no API; SGLang's dummy health app on --host/--port until its schedulers end."""
        ok: tuple[tuple[str, ...], Handler] = (("GET",), self._always_ok)
        self._routes = {"/health": ok, "/health_generate": ok, "/ping": ok}
        try:
            self.http = await asyncio.start_server(
                self._on_conn, self.cfg.host, self.cfg.port, reuse_address=True, backlog=256, limit=64 * 1024
            )
        except OSError as exc:
            logs.log(str(exc), "error")
            group.close()
            await stop_workers(self.workers, kill=True)
            return 1
        self.phase = UP
        logs.log(f"Dummy health check server at {self.cfg.host}:{self.cfg.port} (node rank {self.cfg.node_rank})")
        await asyncio.wait({stop_wait, *broken}, return_when=asyncio.FIRST_COMPLETED)
        if not self._shutdown.is_set():
            first = next(w for w in self.workers if w.spec.role == "scheduler")
            logs.log(f"Scheduler or DataParallelController {first.proc.pid} terminated with 1", "error")
            return await self._group_failed(group, loading=False)
        self.phase = SHUTTING_DOWN
        self.http.close()
        group.close()
        await stop_workers(self.workers)
        logs.log("Shutdown complete (simulated server)")
        return 0

    async def _always_ok(self, req: Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        writer.write(response(200, b"", None, req.keep_alive))
        return req.keep_alive

    def _on_signal(self, sig: int) -> None:
        self._signals += 1
        name = signal.Signals(sig).name
        if self._signals == 1:
            logs.log(f"Received {name}: shutting down gracefully (health -> 503, draining in-flight requests)")
            self._shutdown.set()
        else:
            logs.log(f"Received {name} again: aborting in-flight requests now")
            self._drain_deadline = 0.0

    def _crash(self, tokens: int) -> None:
        if "worker-hang-after-tokens" in self.faults:
            self._hang(tokens)
            return
        logs.log(
            f"FAULT die-after-tokens: {tokens} tokens generated; the server process hard-exits now (simulated crash)",
            "error",
        )
        os._exit(1)

    def _hang(self, tokens: int) -> None:
        # A dead TP rank means no scheduler iteration can complete: nothing more is generated from this moment,
        # not only after the main process notices the death (that takes WORKER_DEATH_GRACE_S).
        assert self.engine is not None
        self.engine.broken = True
        self.engine.crash_pending = False
        victim = next(w for w in self.workers if w.spec.role == "scheduler")
        logs.log(
            f"FAULT worker-hang-after-tokens: {tokens} tokens generated; {victim.label} (pid {victim.proc.pid}) "
            "hard-exits now; the HTTP port stays open but nothing is generated any more (no watchdog)",
            "error",
        )
        try:
            victim.conn.send("die")
        except (OSError, ValueError):
            victim.proc.kill()

    async def _warmup(self) -> None:
        assert self.engine is not None
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        if not self.cfg.skip_server_warmup:
            req = Req(count_text_tokens(WARMUP_TEXT), WARMUP_MAX_NEW_TOKENS, kind="warmup")
            self.engine.submit(req)
            await req.done
            left = knob_float(self.knobs, "warmup_s") - (loop.time() - t0)
            if left > 0:
                await asyncio.sleep(left)
            logs.log(f"End of warmup ({req.completion_tokens} tokens, simulated)")
        if self.phase == STARTING:
            self.phase = UP
            logs.log("The server is fired up and ready to roll!")

    # ---- workers ---------------------------------------------------------------------------------------------
    def _spawn_workers(self) -> None:
        load_s = knob_float(self.knobs, "load_s")
        common: dict[str, Any] = {
            "parent_pid": os.getpid(),
            "load_s": load_s,
            "log_level": self.cfg.log_level,
            "disable_cuda_graph": self.cfg.disable_cuda_graph,
            "escape_linger_s": knob_float(self.knobs, "escape_linger_s"),
        }
        spawn_workers(self._worker_specs(common), self.workers, self._on_worker_readable)

    def _worker_specs(self, common: dict[str, Any]) -> list[WorkerSpec]:
        """SGLang's processes: one scheduler per TP rank and a detokenizer."""
        ranks = self._local_tp_ranks()
        first, last = ranks[0], ranks[-1]
        specs = [
            WorkerSpec(
                role="scheduler",
                rank=rank,
                fault_exit=rank == first and "exit-during-load" in self.faults,
                fault_hang=rank == first and "hang-during-load" in self.faults,
                escape=rank == last and "escape-setsid" in self.faults,
                double_fork=rank == first and "escape-double-fork" in self.faults,
                **common,
            )
            for rank in ranks
        ]
        if self.cfg.node_rank == 0:  # ranks >= 1 run no tokenizer or detokenizer
            specs.append(WorkerSpec(role="detokenizer", rank=0, reexec="reexec-no-marker" in self.faults, **common))
        return specs

    def _local_tp_ranks(self) -> list[int]:
        """The TP ranks whose schedulers run on this node: tp_size is split evenly over the nodes."""
        per_node = max(1, self.cfg.tp_size // self.cfg.nnodes)
        return list(range(self.cfg.node_rank * per_node, (self.cfg.node_rank + 1) * per_node))

    def _on_worker_readable(self, w: Worker) -> None:
        if not w.take_messages():
            self._on_worker_eof(w)
            return
        if self.phase == LOADING and all(x.ready for x in self.workers):
            self._ready.set()

    def _on_worker_eof(self, w: Worker) -> None:
        with contextlib.suppress(ValueError, OSError):
            asyncio.get_running_loop().remove_reader(w.conn.fileno())
        w.dead = True
        if self.phase == SHUTTING_DOWN or self._shutdown.is_set():
            return
        if self.phase == LOADING:
            self._init_failure = w
            self._ready.set()
            return
        # A kill of the whole group delivers SIGTERM to us and to the workers at once; give ours a moment.
        asyncio.get_running_loop().call_later(WORKER_DEATH_GRACE_S, self._worker_died, w)

    def _worker_died(self, w: Worker) -> None:
        if self.phase == SHUTTING_DOWN or self._shutdown.is_set():
            return
        w.proc.join(0.2)
        logs.log(f"Child process unexpectedly failed with exitcode={w.proc.exitcode}. pid={w.proc.pid}", "warning")
        if self.engine is not None and not self.engine.broken:
            logs.log(
                "like SGLang 0.5.x, the server keeps its HTTP port but can no longer generate; health will fail",
                "warning",
            )
            self.engine.broken = True

    async def _graceful_shutdown(self) -> None:
        loop = asyncio.get_running_loop()
        # Like SGLang, keep listening while draining so health can answer 503 and new work is refused.
        self.phase = SHUTTING_DOWN
        engine = self.engine
        if engine is not None:
            drain_s = knob_float(self.knobs, "drain_s")
            self._drain_deadline = loop.time() + drain_s if self._drain_deadline is None else self._drain_deadline
            if engine.busy():
                logs.log(f"Waiting up to drain_s={drain_s:g} s for in-flight requests to finish")
            while engine.busy() and not engine.broken and loop.time() < self._drain_deadline:
                await asyncio.sleep(0.02)
            if engine.busy():
                n = engine.abort_all("The server is shutting down")
                logs.log(f"Aborted {n} in-flight requests at shutdown", "warning")
            engine.stopped = True
            engine.wake.set()
        await asyncio.sleep(0.05)
        if self.http is not None:
            self.http.close()
        for w in list(self.conns):
            w.close()
        await stop_workers(self.workers)
        logs.log("Shutdown complete (simulated server)")

    # ---- HTTP ------------------------------------------------------------------------------------------------
    async def _on_conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.conns.add(writer)
        try:
            while True:
                try:
                    req = await read_request(reader, KEEP_ALIVE_S, writer)
                except HttpError as exc:
                    writer.write(json_response(exc.status, {"error": {"message": exc.message}}, keep_alive=False))
                    break
                if req is None:
                    break
                self.busy_conns.add(writer)
                try:
                    keep = await self._dispatch(req, reader, writer)
                finally:
                    self.busy_conns.discard(writer)
                if not keep:
                    break
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            self.conns.discard(writer)
            with contextlib.suppress(Exception):
                writer.close()

    async def _dispatch(self, req: Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        route = self._routes.get(req.path.rstrip("/") or "/")
        keep = req.keep_alive
        if route is None or (req.path == "/metrics" and not self.cfg.enable_metrics):
            writer.write(json_response(404, openai_error("Not Found", 404) | {"type": "404"}, keep))
            return keep
        methods, handler = route
        if req.method not in methods:
            writer.write(json_response(405, openai_error("Method Not Allowed", 405) | {"type": "405"}, keep))
            return keep
        try:
            return await handler(req, reader, writer) and keep
        except HttpError as exc:
            body = (
                openai_error(exc.message, exc.status)
                if req.path.startswith("/v1/")
                else {"error": {"message": exc.message}}
            )
            writer.write(json_response(exc.status, body, keep))
            return keep
        except Exception as exc:
            logs.log(f"internal simulator error on {req.method} {req.path}: {exc!r}", "error")
            writer.write(json_response(500, {"error": {"message": f"simulator error: {exc!r}"}}, False))
            return False

    # ---- simple endpoints ------------------------------------------------------------------------------------
    async def _health(self, req: Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        keep = req.keep_alive
        if self.phase == SHUTTING_DOWN:
            logs.log("Health check request received during shutdown. Returning 503.")
            writer.write(response(503, b"", None, keep))
            return keep
        if self.phase in (LOADING, STARTING) or self.engine is None:
            writer.write(response(503, b"", None, keep))
            return keep
        engine = self.engine
        tic = time.monotonic()
        if not engine.busy():
            # A busy scheduler answers health through its normal output, as SGLang's does.
            engine.submit(Req(1, 1, kind="health", rid=f"HEALTH_CHECK_{time.time()}"))
        while time.monotonic() < tic + self.health_timeout_s:
            await asyncio.sleep(1)
            if self.phase == SHUTTING_DOWN:
                break
            if engine.last_receive > tic:
                if self.phase == UNHEALTHY:
                    self.phase = UP
                writer.write(response(200, b"", None, keep))
                return keep
        if self.phase != SHUTTING_DOWN:
            logs.log(
                "Health check failed. Server couldn't get a response from detokenizer for last "
                f"{self.health_timeout_s:g} seconds.",
                "error",
            )
            self.phase = UNHEALTHY
        writer.write(response(503, b"", None, keep))
        return keep

    async def _model_info(self, req: Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        writer.write(json_response(200, model_info_obj(self.cfg), req.keep_alive))
        return req.keep_alive

    async def _server_info(self, req: Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        writer.write(json_response(200, server_info_obj(self), req.keep_alive))
        return req.keep_alive

    async def _models(self, req: Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        writer.write(json_response(200, models_obj(self.cfg, self.owned_by), req.keep_alive))
        return req.keep_alive

    async def _flush_cache(self, req: Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        # SGLang's answer (http_server.py): 200, or 400 while any request runs or waits (nothing is flushed then).
        done = self.engine is not None and self.engine.flush_prefix_cache()
        if done:
            logs.log("Cache flushed successfully!")
        body = (
            b"Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting "
            b"requests, the operation will not be performed.)\n"
        )
        writer.write(response(200 if done else 400, body, "text/plain; charset=utf-8", req.keep_alive))
        return req.keep_alive

    def metrics_text(self) -> str:
        return metrics_text(self.engine, self.cfg.served_model_name)

    async def _metrics(self, req: Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        writer.write(response(200, self.metrics_text().encode(), "text/plain; version=0.0.4", req.keep_alive))
        return req.keep_alive

    # ---- generation ------------------------------------------------------------------------------------------
    def _accepting(self) -> None:
        if self.phase == SHUTTING_DOWN or self.engine is None:
            raise HttpError(503, "The server is shutting down")

    async def _run_req(self, r: Req) -> None:
        assert self.engine is not None
        self.engine.submit(r)
        await r.done

    async def _generate(self, req: Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        self._accepting()
        b = generate_body(req.json(), self.cfg.context_length)
        keep = req.keep_alive
        return await self._answer(b, GenerateSink(self, reader, writer, b.stream, keep), writer, keep)

    async def _completions(self, req: Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        return await self._openai(req, reader, writer, chat=False)

    async def _chat(self, req: Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        return await self._openai(req, reader, writer, chat=True)

    async def _openai(
        self, req: Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, chat: bool
    ) -> bool:
        self._accepting()
        ctype = req.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype != "application/json":
            raise HttpError(400, "Unsupported Media Type: Only 'application/json' is allowed")
        b = openai_body(req.json(), self.cfg.context_length, chat=chat)
        keep = req.keep_alive
        sink = OpenAISink(
            self,
            reader,
            writer,
            chat=chat,
            stream=b.stream,
            include_usage=b.include_usage,
            keep=keep,
            continuous_usage=b.continuous_usage,
        )
        return await self._answer(b, sink, writer, keep)

    async def _answer(self, b: Body, sink: Sink, writer: asyncio.StreamWriter, keep: bool) -> bool:
        """Generate for one checked request, its answer written by sink as tokens come."""
        r = Req(
            b.prompt,
            b.max_new,
            min_new_tokens=b.min_new,
            ignore_eos=b.ignore_eos,
            stop=b.stop,
            sink=sink,
            rid=b.rid,
            greedy=b.greedy,
            prompt_key=b.prompt_key,
            prefix_hit=b.prefix_hit,
            reply_key=b.reply_key,
            prefix_blocks=b.prefix_blocks,
        )
        if b.stream:
            writer.write(stream_head(keep))
        await self._run_req(r)
        return keep


# ---- entry point -----------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """Run the simulator's SGLang mode (launch_server's flags); returns an exit code for argument errors, otherwise
    exits the process itself. `serve MODEL ...` (vLLM mode) is vllm_server.main's, picked in sim/__main__.py."""
    args = list(sys.argv[1:] if argv is None else argv)
    logs.banner()
    knobs = load_knobs()
    if knobs is None:
        return 2
    try:
        cfg = parse_server_args(args)
    except SimArgError as exc:
        logs.log(f"{exc}", "error")
        return 1

    def rewrite(drop: list[str]) -> list[str]:
        return rewrite_env(
            os.environ,
            enable_symm_mem=cfg.enable_symm_mem,
            enable_nccl_nvls=cfg.enable_nccl_nvls,
            enable_metrics=cfg.enable_metrics,
            drop=drop,
        )

    # As SGLang's launch_server logs it: every resolved setting, secrets (--api-key) included, in clear.
    settings = "server_args=ServerArgs(" + ", ".join(f"{k}={v!r}" for k, v in cfg.resolved.items()) + ")"
    return launch(cfg, knobs, SimServer, settings, rewrite)


def _int_knob(value: float | int | str | None) -> int | None:
    return int(value) if isinstance(value, int | float) else None
