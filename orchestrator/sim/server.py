"""The simulator's main process: env rewrite, worker spawn, readiness phases, HTTP API and shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing
import os
import random
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from orchestrator.sim import logs
from orchestrator.sim.args import SGLANG_VERSION, ServerConfig, SimArgError, parse_server_args
from orchestrator.sim.engine import (
    HEALTH_CHECK_TIMEOUT_S,
    MAX_TOTAL_TOKENS,
    Engine,
    Req,
    Sink,
    count_chat_tokens,
    count_text_tokens,
)
from orchestrator.sim.httpio import (
    LAST_CHUNK,
    HttpError,
    Request,
    chunk,
    json_response,
    read_request,
    response,
    stream_head,
)
from orchestrator.sim.knobs import knob_faults, knob_float
from orchestrator.sim.launch import launch, load_knobs
from orchestrator.sim.nodes import NodeGroup
from orchestrator.sim.timing import TimingModel
from orchestrator.sim.workers import WorkerSpec, run_worker

KEEP_ALIVE_S = 5.0  # uvicorn's timeout_keep_alive default, which SGLang keeps
WORKER_STOP_S = 3.0
WORKER_DEATH_GRACE_S = 0.5
WARMUP_TEXT = "The capital city of France is"
WARMUP_MAX_NEW_TOKENS = 8

LOADING, STARTING, UP, UNHEALTHY, SHUTTING_DOWN = "loading", "starting", "up", "unhealthy", "shutting_down"


def rewrite_env(
    env: MutableMapping[str, str],
    *,
    enable_symm_mem: bool = False,
    enable_nccl_nvls: bool = False,
    enable_metrics: bool = False,
    drop: Sequence[str] = (),
    run_id: str | None = None,
) -> list[str]:
    """Apply SGLang's pre-spawn env rules (engine.py `_set_envs_and_config`) plus drop_env; describe changes."""
    changes: list[str] = []

    def put(key: str, value: str) -> None:
        old = env.get(key)
        if old != value:
            changes.append(f"{key}={value}" + ("" if old is None else f" (was {old})"))
        env[key] = value

    if "NCCL_CUMEM_ENABLE" not in env or enable_symm_mem:
        put("NCCL_CUMEM_ENABLE", str(int(enable_symm_mem)))
    if "NCCL_NVLS_ENABLE" not in env or enable_nccl_nvls or enable_symm_mem:
        put("NCCL_NVLS_ENABLE", str(int(enable_nccl_nvls or enable_symm_mem)))
    put("CUDA_DEVICE_MAX_CONNECTIONS", "8")
    put("CUDA_MODULE_LOADING", "AUTO")
    if env.get("TRTLLM_ENABLE_PDL", "1") != "0":
        put("TRTLLM_ENABLE_PDL", "1")
    if env.get("CUTE_DSL_LOG_LEVEL") is None:
        put("CUTE_DSL_LOG_LEVEL", "30")
    if env.get("CUTE_DSL_LOG_TO_CONSOLE") is None:
        put("CUTE_DSL_LOG_TO_CONSOLE", "1")
    put("SGLANG_RUN_ID", run_id or f"sglang-run-{time.time()}-{random.randint(0, 100000000)}")
    if enable_metrics and "PROMETHEUS_MULTIPROC_DIR" not in env:
        # SGLang points this at a fresh temp dir; the simulator writes no metric files, so it only names one.
        put("PROMETHEUS_MULTIPROC_DIR", os.path.join(tempfile.gettempdir(), f"orch-sim-prometheus-{os.getpid()}"))
    for name in drop:
        if name in env:
            del env[name]
            changes.append(f"{name} removed (drop_env)")
    return changes


def health_check_timeout(environ: Mapping[str, str]) -> float:
    """SGLang's SGLANG_HEALTH_CHECK_TIMEOUT (seconds health waits for output before 503), default 20."""
    raw = environ.get("SGLANG_HEALTH_CHECK_TIMEOUT", "").strip()
    if not raw:
        return HEALTH_CHECK_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not (0 < value < 86400):
        logs.log(f"SGLANG_HEALTH_CHECK_TIMEOUT={raw!r} is not a positive number of seconds; using 20", "warning")
        return HEALTH_CHECK_TIMEOUT_S
    return value


def _openai_error(message: str, status: int = 400) -> dict[str, Any]:
    kind = {400: "BadRequestError", 404: "NotFoundError", 503: "ServiceUnavailableError"}.get(status, str(status))
    return {"object": "error", "message": message, "type": kind, "param": None, "code": status}


def _openai_finish(reason: dict[str, Any] | None) -> tuple[str | None, Any]:
    if reason is None:
        return None, None
    kind = str(reason.get("type"))
    return kind, reason.get("matched")


# ---- output sinks ---------------------------------------------------------------------------------------------


class _HttpSink(Sink):
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    def disconnected(self) -> bool:
        return self.writer.transport.is_closing() or self.reader.at_eof()

    def _data(self, payload: bytes) -> None:
        if not self.writer.transport.is_closing():
            self.writer.write(chunk(b"data: " + payload + b"\n\n"))

    def _done(self) -> None:
        if not self.writer.transport.is_closing():
            self.writer.write(chunk(b"data: [DONE]\n\n") + LAST_CHUNK)


class GenerateSink(_HttpSink):
    """Native /generate: cumulative text and output_ids; streamed as SSE or returned once."""

    def __init__(
        self, server: SimServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, stream: bool, keep: bool
    ) -> None:
        super().__init__(reader, writer)
        self.server = server
        self.stream = stream
        self.keep = keep

    def emit(self, req: Req) -> None:
        if self.stream:
            self._data(self.server.generate_payload(req, final=False))

    def finish(self, req: Req) -> None:
        payload = self.server.generate_payload(req, final=True)
        if self.stream:
            self._data(payload)
            self._done()
        elif not self.writer.transport.is_closing():
            self.writer.write(response(200, payload, "application/json", self.keep))


class OpenAISink(_HttpSink):
    """OpenAI /v1/completions and /v1/chat/completions: text deltas, optional usage chunk."""

    def __init__(
        self,
        server: SimServer,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        chat: bool,
        stream: bool,
        include_usage: bool,
        keep: bool,
        continuous_usage: bool = False,
    ) -> None:
        super().__init__(reader, writer)
        self.server = server
        self.chat = chat
        self.stream = stream
        self.include_usage = include_usage
        # stream_options.continuous_usage_stats (vLLM's name, also honoured by other OpenAI-compatible servers):
        # every chunk carries the cumulative usage, so a client can count the tokens in a multi-token chunk.
        self.continuous_usage = continuous_usage
        self.keep = keep
        self.created = int(time.time())
        self.role_sent = False

    def _chunk_obj(self, req: Req, choice: dict[str, Any]) -> bytes:
        obj = {
            "id": req.rid,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.server.cfg.served_model_name,
            "choices": [choice],
            "usage": self._usage(req) if self.continuous_usage else None,
        }
        return json.dumps(obj).encode()

    def _delta(self, content: str | None, role: str | None = None) -> dict[str, Any]:
        return {"role": role, "content": content, "reasoning_content": None, "tool_calls": None}

    def _take(self, req: Req) -> str:
        delta = req.text[req.sent_text :]
        req.sent_text = len(req.text)
        return delta

    def _role(self, req: Req) -> None:
        if self.chat and not self.role_sent:
            self.role_sent = True
            choice = {"index": 0, "delta": self._delta("", "assistant"), "logprobs": None, "finish_reason": None}
            self._data(self._chunk_obj(req, choice))

    def emit(self, req: Req) -> None:
        if not self.stream:
            return
        self._role(req)
        delta = self._take(req)
        if not delta:
            return
        if self.chat:
            choice = {"index": 0, "delta": self._delta(delta), "logprobs": None, "finish_reason": None}
        else:
            choice = {"index": 0, "text": delta, "logprobs": None, "finish_reason": None, self.server.stop_key: None}
        self._data(self._chunk_obj(req, choice))

    def _usage(self, req: Req) -> dict[str, Any]:
        return {
            "prompt_tokens": req.prompt_tokens,
            "completion_tokens": req.completion_tokens,
            "total_tokens": req.prompt_tokens + req.completion_tokens,
            "prompt_tokens_details": None,
        }

    def finish(self, req: Req) -> None:
        reason, matched = _openai_finish(req.finish_reason)
        if not self.stream:
            self._finish_once(req, reason, matched)
            return
        self._role(req)
        delta = self._take(req)
        if self.chat:
            if delta:
                choice = {"index": 0, "delta": self._delta(delta), "logprobs": None, "finish_reason": None}
                self._data(self._chunk_obj(req, choice))
            choice = {
                "index": 0,
                "delta": self._delta(None),
                "logprobs": None,
                "finish_reason": reason,
                self.server.stop_key: matched,
            }
        else:
            stop = self.server.stop_key
            choice = {"index": 0, "text": delta, "logprobs": None, "finish_reason": reason, stop: matched}
        self._data(self._chunk_obj(req, choice))
        if self.include_usage:
            obj: dict[str, Any] = {
                "id": req.rid,
                "object": "chat.completion.chunk" if self.chat else "text_completion",
                "created": self.created,
                "model": self.server.cfg.served_model_name,
                "choices": [],
                "usage": self._usage(req),
            }
            self._data(json.dumps(obj).encode())
        self._done()

    def _finish_once(self, req: Req, reason: str | None, matched: Any) -> None:
        if self.chat:
            message = {"role": "assistant", "content": req.text, "reasoning_content": None, "tool_calls": None}
            choice = {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": reason,
                self.server.stop_key: matched,
            }
            obj_type = "chat.completion"
        else:
            choice = {
                "index": 0,
                "text": req.text,
                "logprobs": None,
                "finish_reason": reason,
                self.server.stop_key: matched,
            }
            obj_type = "text_completion"
        obj: dict[str, Any] = {
            "id": req.rid,
            "object": obj_type,
            "created": self.created,
            "model": self.server.cfg.served_model_name,
            "choices": [choice],
            "usage": self._usage(req),
        }
        if not self.writer.transport.is_closing():
            self.writer.write(json_response(200, obj, self.keep))


# ---- workers --------------------------------------------------------------------------------------------------


@dataclass
class _Worker:
    spec: WorkerSpec
    proc: BaseProcess
    conn: Connection
    ready: bool = False
    dead: bool = False

    @property
    def label(self) -> str:
        return f"Rank {self.spec.rank} scheduler" if self.spec.role == "scheduler" else "Detokenizer"


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
        self.workers: list[_Worker] = []
        self.conns: set[asyncio.StreamWriter] = set()
        self.busy_conns: set[asyncio.StreamWriter] = set()
        self.http: asyncio.base_events.Server | None = None
        self.model = TimingModel.from_knobs(knobs, cfg.spec, speed_factor, cfg.chunked_prefill_size)
        self.engine: Engine | None = None
        self._ready = asyncio.Event()
        self._shutdown = asyncio.Event()
        self._init_failure: _Worker | None = None
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
            await self._report_init_failure(self._init_failure)
            await self._stop_workers(kill=True)
            return 1
        if group is not None and group.broken.is_set() and not self._shutdown.is_set():
            return await self._group_failed(group, loading=True)
        if self._shutdown.is_set():
            logs.log("Shutdown requested while loading; stopping workers")
            await self._stop_workers()
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
                await self._stop_workers()
                return 0
            if self.cfg.node_rank >= 1:
                return await self._serve_health_only(group, stop_wait, broken)
        await self._before_listen()
        if self._shutdown.is_set():
            logs.log("Shutdown requested before the server listened; stopping workers")
            await self._stop_workers()
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
            await self._stop_workers(kill=True)
            return 1
        self.phase = STARTING
        logs.log(self._listening_message())
        # The two *-after-tokens faults cannot be combined (knobs), so at most one of them sets the count.
        die_after = self.faults.get("die-after-tokens") or self.faults.get("worker-hang-after-tokens")
        self.engine = Engine(
            self.model,
            random.Random(f"{self.seed}:engine"),
            max_running=self.cfg.max_running_requests,
            stream_interval=self.cfg.stream_interval,
            decode_log_interval=self.cfg.decode_log_interval,
            cuda_graph=not self.cfg.disable_cuda_graph,
            cuda_graph_max_bs=self.cfg.cuda_graph_max_bs,
            die_after_tokens=die_after,
            on_crash=self._crash,
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
        await self._stop_workers(kill=True)
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
            await self._stop_workers(kill=True)
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
        await self._stop_workers()
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
        ctx = multiprocessing.get_context("spawn")
        loop = asyncio.get_running_loop()
        load_s = knob_float(self.knobs, "load_s")
        common: dict[str, Any] = {
            "parent_pid": os.getpid(),
            "load_s": load_s,
            "log_level": self.cfg.log_level,
            "disable_cuda_graph": self.cfg.disable_cuda_graph,
            "escape_linger_s": knob_float(self.knobs, "escape_linger_s"),
        }
        for spec in self._worker_specs(common):
            parent_conn, child_conn = ctx.Pipe(duplex=True)
            proc = ctx.Process(target=run_worker, args=(spec, child_conn), name=spec.title, daemon=False)
            proc.start()
            child_conn.close()
            worker = _Worker(spec, proc, parent_conn)
            self.workers.append(worker)
            loop.add_reader(parent_conn.fileno(), self._on_worker_readable, worker)
        pids = ", ".join(f"{w.spec.title}={w.proc.pid}" for w in self.workers)
        logs.log(f"Started {len(self.workers)} worker processes (spawn): {pids}")

    def _worker_specs(self, common: dict[str, Any]) -> list[WorkerSpec]:
        """SGLang's processes: one scheduler per TP rank and a detokenizer."""
        ranks = self._local_tp_ranks()
        first, last = ranks[0], ranks[-1]
        specs = [
            WorkerSpec(
                "scheduler",
                rank,
                fault_exit=rank == first and "exit-during-load" in self.faults,
                fault_hang=rank == first and "hang-during-load" in self.faults,
                escape=rank == last and "escape-setsid" in self.faults,
                double_fork=rank == first and "escape-double-fork" in self.faults,
                **common,
            )
            for rank in ranks
        ]
        if self.cfg.node_rank == 0:  # ranks >= 1 run no tokenizer or detokenizer
            specs.append(WorkerSpec("detokenizer", 0, reexec="reexec-no-marker" in self.faults, **common))
        return specs

    def _local_tp_ranks(self) -> list[int]:
        """The TP ranks whose schedulers run on this node: tp_size is split evenly over the nodes."""
        per_node = max(1, self.cfg.tp_size // self.cfg.nnodes)
        return list(range(self.cfg.node_rank * per_node, (self.cfg.node_rank + 1) * per_node))

    def _on_worker_readable(self, w: _Worker) -> None:
        try:
            while w.conn.poll(0):
                msg = w.conn.recv()
                if isinstance(msg, dict) and msg.get("status") == "ready":
                    w.ready = True
        except (EOFError, OSError):
            self._on_worker_eof(w)
            return
        if self.phase == LOADING and all(x.ready for x in self.workers):
            self._ready.set()

    def _on_worker_eof(self, w: _Worker) -> None:
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

    def _worker_died(self, w: _Worker) -> None:
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

    async def _report_init_failure(self, w: _Worker) -> None:
        logs.log(f"{w.label} is dead. Please check if there are relevant logs.", "error")
        await asyncio.get_running_loop().run_in_executor(None, w.proc.join, 2.0)
        logs.log(f"Exit code: {w.proc.exitcode}", "error")
        logs.log("Initialization failed. Please see the error messages above.", "error")

    async def _stop_workers(self, kill: bool = False) -> None:
        loop = asyncio.get_running_loop()
        # A reexec-no-marker worker answers "stop" by becoming another program: waiting for it (and then
        # SIGKILLing it) would undo the fault, so unless this is a kill it only gets the message.
        reexec = [] if kill else [w for w in self.workers if w.spec.reexec]
        keep = [w for w in self.workers if not w.spec.escape and w not in reexec]
        for w in self.workers:
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
        for w in self.workers:
            if w.spec.escape:
                logs.log(
                    f"FAULT escape-setsid: leaving the escaped scheduler (pid {w.proc.pid}) running; it is not "
                    "this process's child any more in spirit and will outlive the server",
                    "warning",
                )

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
        await self._stop_workers()
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
            writer.write(json_response(404, _openai_error("Not Found", 404) | {"type": "404"}, keep))
            return keep
        methods, handler = route
        if req.method not in methods:
            writer.write(json_response(405, _openai_error("Method Not Allowed", 405) | {"type": "405"}, keep))
            return keep
        try:
            return await handler(req, reader, writer) and keep
        except HttpError as exc:
            body = (
                _openai_error(exc.message, exc.status)
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

    def _model_info_obj(self) -> dict[str, Any]:
        return {
            "model_path": self.cfg.model_path,
            "tokenizer_path": self.cfg.resolved.get("tokenizer_path") or self.cfg.model_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": "default",
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "orch_simulator": True,
        }

    async def _model_info(self, req: Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        writer.write(json_response(200, self._model_info_obj(), req.keep_alive))
        return req.keep_alive

    def server_info_obj(self) -> dict[str, Any]:
        engine = self.engine
        state = engine.internal_state() if engine is not None else {"last_gen_throughput": 0.0}
        return {
            **self.cfg.resolved,
            "max_total_num_tokens": MAX_TOTAL_TOKENS,
            "max_req_input_len": self.cfg.context_length - 1,
            "internal_states": [state],
            "version": self.knobs.get("version") or self.engine_version,
            "orch_simulator": True,
            "orch_sim": {
                "seed": self.seed,
                "speed_factor": self.speed_factor,
                "knobs": self.knobs,
                "faults": self.faults,
                "env_changes": self.env_changes,
                "expected_single_stream_tok_s": self.model.steady_tokens_per_s(1),
                "mean_accept_length": self.model.mean_accept_length,
                "late_iterations": engine.late_iterations if engine else 0,
                "max_late_s": engine.max_late_s if engine else 0.0,
                "phase": self.phase,
            },
        }

    async def _server_info(self, req: Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        writer.write(json_response(200, self.server_info_obj(), req.keep_alive))
        return req.keep_alive

    async def _models(self, req: Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        name = self.cfg.served_model_name
        card = {
            "id": name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": self.owned_by,
            "root": name,
            "max_model_len": self.cfg.context_length,
        }
        writer.write(json_response(200, {"object": "list", "data": [card]}, req.keep_alive))
        return req.keep_alive

    async def _flush_cache(self, req: Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        body = b"Cache flushed.\nPlease check backend logs for more details. (simulated: there is no cache)\n"
        writer.write(response(200, body, "text/plain; charset=utf-8", req.keep_alive))
        return req.keep_alive

    def metrics_text(self) -> str:
        e = self.engine
        label = '{model_name="' + self.cfg.served_model_name.replace("\\", "\\\\").replace('"', '\\"') + '"}'
        rows: list[tuple[str, str, str, float]] = [
            ("generation_tokens_total", "counter", "Number of generation tokens processed.", 0.0),
            ("prompt_tokens_total", "counter", "Number of prefill tokens processed.", 0.0),
            ("spec_verify_calls_total", "counter", "Number of speculative verify calls.", 0.0),
            ("spec_accept_length", "gauge", "The average acceptance length of speculative decoding.", 0.0),
            ("gen_throughput", "gauge", "The generation throughput (token/s).", 0.0),
            ("num_running_reqs", "gauge", "The number of running requests.", 0.0),
            ("num_queue_reqs", "gauge", "The number of requests in the waiting queue.", 0.0),
        ]
        if e is not None:
            values = [
                e.gen_tokens_total,
                e.prompt_tokens_total,
                e.verify_calls_total,
                e.last_accept_len,
                e.last_gen_throughput,
                len(e.running),
                len(e.waiting),
            ]
            rows = [(n, k, h, float(v)) for (n, k, h, _), v in zip(rows, values, strict=False)]
        out = ["# orch-sim: SIMULATED metrics (not measured on a GPU)"]
        for name, kind, help_text, value in rows:
            out.append(f"# HELP sglang:{name} {help_text}")
            out.append(f"# TYPE sglang:{name} {kind}")
            out.append(f"sglang:{name}{label} {float(value)}")
        return "\n".join(out) + "\n"

    async def _metrics(self, req: Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        writer.write(response(200, self.metrics_text().encode(), "text/plain; version=0.0.4", req.keep_alive))
        return req.keep_alive

    # ---- generation ------------------------------------------------------------------------------------------
    def generate_payload(self, req: Req, final: bool) -> bytes:
        meta: dict[str, Any] = {
            "id": req.rid,
            "finish_reason": req.finish_reason,
            "prompt_tokens": req.prompt_tokens,
            "weight_version": "default",
            "completion_tokens": req.completion_tokens,
            "cached_tokens": 0,
        }
        if final:
            meta["e2e_latency"] = req.e2e_latency
            if self.engine is not None:
                meta.update(self.engine.spec_meta(req))
        # The text is made of plain ASCII words, so it is spliced in without JSON escaping.
        return (
            '{"text":"' + req.text + '","output_ids":[' + req.ids_str + '],"meta_info":' + json.dumps(meta) + "}"
        ).encode()

    def _check_budget(self, prompt: int, max_new: int | None) -> int:
        ctx = self.cfg.context_length
        if prompt >= ctx:
            raise HttpError(
                400, f"The input ({prompt} tokens) is longer than the model's context length ({ctx} tokens)."
            )
        if max_new is None:
            return ctx - prompt
        if prompt + max_new > ctx:
            raise HttpError(
                400,
                f"Requested token count exceeds the model's maximum context length of {ctx} tokens. You requested "
                f"a total of {prompt + max_new} tokens: {prompt} tokens from the input messages and {max_new} "
                "tokens for the completion. Please reduce the number of tokens in the input messages or the "
                "completion to fit within the limit.",
            )
        return max_new

    def _accepting(self) -> None:
        if self.phase == SHUTTING_DOWN or self.engine is None:
            raise HttpError(503, "The server is shutting down")

    async def _run_req(self, r: Req) -> None:
        assert self.engine is not None
        self.engine.submit(r)
        await r.done

    async def _generate(self, req: Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        self._accepting()
        body = req.json()
        if not isinstance(body, dict):
            raise HttpError(400, "request body must be a JSON object")
        text, input_ids = body.get("text"), body.get("input_ids")
        if isinstance(text, list):
            text = _single(text, "text")
        if isinstance(input_ids, list) and input_ids and isinstance(input_ids[0], list):
            input_ids = _single(input_ids, "input_ids")
        if text is None and input_ids is None:
            raise HttpError(400, "Either text or input_ids should be provided.")
        if text is not None and not isinstance(text, str):
            raise HttpError(400, "text must be a string")
        if input_ids is not None and not (isinstance(input_ids, list) and all(isinstance(t, int) for t in input_ids)):
            raise HttpError(400, "input_ids must be a list of integers")
        prompt = count_text_tokens(text) if isinstance(text, str) else len(input_ids or [0]) or 1
        sp = body.get("sampling_params") or {}
        if not isinstance(sp, dict):
            raise HttpError(400, "sampling_params must be an object")
        max_new = _opt_int(sp, "max_new_tokens", 128)
        min_new = _opt_int(sp, "min_new_tokens", 0) or 0
        max_new = self._check_budget(prompt, max_new)
        stream = bool(body.get("stream", False))
        keep = req.keep_alive
        r = Req(
            prompt,
            max_new,
            min_new_tokens=min_new,
            ignore_eos=bool(sp.get("ignore_eos", False)),
            stop=_stops(sp.get("stop")),
            sink=GenerateSink(self, reader, writer, stream, keep),
            rid=body.get("rid") if isinstance(body.get("rid"), str) else None,
        )
        if stream:
            writer.write(stream_head(keep))
        await self._run_req(r)
        return keep

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
        body = req.json()
        if not isinstance(body, dict):
            raise HttpError(400, "request body must be a JSON object")
        if int(body.get("n") or 1) != 1:
            raise HttpError(400, "the simulator supports n=1 only")
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise HttpError(400, "messages must be a non-empty list")
            prompt = count_chat_tokens(messages)
            max_new = _opt_int(body, "max_completion_tokens", None)
            if max_new is None:
                max_new = _opt_int(body, "max_tokens", None)
        else:
            p = body.get("prompt")
            if isinstance(p, list) and p and isinstance(p[0], (str, list)):
                p = _single(p, "prompt")
            if isinstance(p, str):
                prompt = count_text_tokens(p)
            elif isinstance(p, list) and all(isinstance(t, int) for t in p):
                prompt = max(1, len(p))
            else:
                raise HttpError(400, "prompt must be a string or a list of token ids")
            max_new = _opt_int(body, "max_tokens", 16)
        max_new = self._check_budget(prompt, max_new)
        stream = bool(body.get("stream", False))
        opts = body.get("stream_options") or {}
        include_usage = bool(opts.get("include_usage")) if isinstance(opts, dict) else False
        continuous = bool(opts.get("continuous_usage_stats")) if isinstance(opts, dict) else False
        keep = req.keep_alive
        sink = OpenAISink(
            self,
            reader,
            writer,
            chat=chat,
            stream=stream,
            include_usage=include_usage,
            keep=keep,
            continuous_usage=continuous,
        )
        r = Req(
            prompt,
            max_new,
            min_new_tokens=_opt_int(body, "min_tokens", 0) or 0,
            ignore_eos=bool(body.get("ignore_eos", False)),
            stop=_stops(body.get("stop")),
            sink=sink,
        )
        if stream:
            writer.write(stream_head(keep))
        await self._run_req(r)
        return keep


def _single(items: list[Any], name: str) -> Any:
    if len(items) != 1:
        raise HttpError(400, f"batched {name} ({len(items)} items) is not supported by the simulator; send one")
    return items[0]


def _opt_int(obj: dict[str, Any], key: str, default: int | None) -> int | None:
    value = obj.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise HttpError(400, f"{key} must be an integer, got {value!r}")
    if value < 0:
        raise HttpError(400, f"{key} must be >= 0, got {value}")
    return value


def _stops(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        return list(value)
    raise HttpError(400, "stop must be a string or a list of strings")


# ---- entry point -----------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """Run the simulator; returns an exit code for argument errors, otherwise exits the process itself.
    `serve MODEL ...` (vLLM's command line) imitates vLLM, anything else SGLang's launch_server."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["serve"]:
        from orchestrator.sim.vllm_server import main as vllm_main

        return vllm_main(args[1:])
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
