"""The simulator's vLLM mode (`python -m orchestrator.sim serve MODEL ...`): vLLM's startup, routes and metrics.

What it imitates (checked in vllm-project/vllm's source, see vllm_args.py): the port is bound at once but refuses
connections until the engine is up (profiling and CUDA graph capture happen before uvicorn listens); then
`/health` is 200 (503 once the engine is dead), `/v1/models`, `/v1/completions`, `/v1/chat/completions` (with
`stream_options.include_usage` / `continuous_usage_stats`), `/version`, and `/metrics` (always mounted) with
`vllm:*` counters labelled model_name and engine. No SGLang `/generate` (404). Worker env: what vLLM's CLI and
workers set when unset. Timings come from the same timing model as the SGLang mode; num_speculative_tokens plays
the part of SGLang's num_steps.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import socket
from collections.abc import MutableMapping, Sequence
from typing import Any

from orchestrator.sim import logs
from orchestrator.sim.args import SimArgError
from orchestrator.sim.httpio import Request, json_response, response
from orchestrator.sim.knobs import knob_float
from orchestrator.sim.launch import launch, load_knobs
from orchestrator.sim.server import SHUTTING_DOWN, UP, Handler, SimServer
from orchestrator.sim.vllm_args import VLLM_VERSION, VllmServerConfig, parse_vllm_args
from orchestrator.sim.workers import WorkerSpec

SIMULATED = "orch-sim (simulated vLLM)"


def rewrite_vllm_env(env: MutableMapping[str, str], drop: Sequence[str] = ()) -> list[str]:
    """What vLLM sets for its workers when unset (entrypoints/common/startup.py, env_override.py,
    set_multiprocessing_worker_envs), plus drop_env; describe the changes."""
    changes: list[str] = []
    for key, value in (
        ("VLLM_WORKER_MULTIPROC_METHOD", "spawn"),
        ("PYTORCH_NVML_BASED_CUDA_CHECK", "1"),
        ("TORCHINDUCTOR_COMPILE_THREADS", "1"),
        ("OMP_NUM_THREADS", "1"),
    ):
        if key not in env:
            env[key] = value
            changes.append(f"{key}={value}")
    for name in drop:
        if name in env:
            del env[name]
            changes.append(f"{name} removed (drop_env)")
    return changes


class VllmSimServer(SimServer):
    """SimServer with vLLM's readiness, processes, routes and metrics."""

    engine_version = VLLM_VERSION
    stop_key = "stop_reason"
    owned_by = SIMULATED
    cfg: VllmServerConfig

    def routes(self) -> dict[str, tuple[tuple[str, ...], Handler]]:
        return {
            "/health": (("GET",), self._health),
            "/ping": (("GET", "POST"), self._health),
            "/version": (("GET",), self._version),
            "/v1/models": (("GET",), self._models),
            "/metrics": (("GET",), self._metrics),
            "/v1/completions": (("POST",), self._completions),
            "/v1/chat/completions": (("POST",), self._chat),
            # Real vLLM serves /server_info only with VLLM_SERVER_DEV_MODE=1; orch's fingerprint reads the
            # simulator's knobs from it, so the simulator always serves it.
            "/server_info": (("GET",), self._server_info),
            # A dev route, as in vLLM: mounted only with VLLM_SERVER_DEV_MODE=1 (404 otherwise, like any unknown path).
            **(
                {"/reset_prefix_cache": (("POST",), self._reset_prefix_cache)}
                if os.environ.get("VLLM_SERVER_DEV_MODE", "0") == "1"
                else {}
            ),
        }

    async def run(self) -> int:
        # vLLM takes the port before loading: a port in use fails at once, and until the engine is up the port is
        # bound but not listening, so connections are refused.
        family = socket.AF_INET6 if ":" in self.cfg.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.cfg.host, self.cfg.port))
        except OSError as exc:
            sock.close()
            logs.log(f"could not bind {self.cfg.host}:{self.cfg.port}: {exc}", "error")
            return 1
        self.listen_sock = sock
        return await super().run()

    async def _before_listen(self) -> None:
        # vLLM profiles memory and captures CUDA graphs before uvicorn starts: warmup_s is spent with no listener.
        warmup_s = knob_float(self.knobs, "warmup_s")
        if warmup_s > 0:
            logs.log(f"Memory profiling and CUDA graph capture (simulated: sleeping warmup_s={warmup_s:g} s)")
            stop = asyncio.ensure_future(self._shutdown.wait())
            await asyncio.wait({stop}, timeout=warmup_s)
            stop.cancel()

    def _listening_message(self) -> str:
        return f"Starting vLLM API server 0 on http://{self.cfg.host}:{self.cfg.port} (simulated server)"

    async def _warmup(self) -> None:
        if self.phase != SHUTTING_DOWN:
            self.phase = UP
            logs.log("Application startup complete.")

    def _worker_specs(self, common: dict[str, Any]) -> list[WorkerSpec]:
        """vLLM's processes under the API server: one engine core and a worker per TP rank (flat here)."""
        specs = super()._worker_specs(common)
        return [
            dataclasses.replace(s, name=f"sim:Worker_TP{s.rank}" if s.role == "scheduler" else "sim:EngineCore")
            for s in specs
        ]

    async def _health(self, req: Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        ok = self.phase == UP and self.engine is not None and not self.engine.broken
        writer.write(response(200 if ok else 503, b"", None, req.keep_alive))
        return req.keep_alive

    async def _reset_prefix_cache(
        self, req: Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        # vLLM answers 200 with no body once reset; a reset refused while requests run is an error (500 here).
        done = self.engine is not None and self.engine.flush_prefix_cache()
        writer.write(response(200 if done else 500, b"", None, req.keep_alive))
        return req.keep_alive

    async def _version(self, req: Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        body = {"version": self.knobs.get("version") or VLLM_VERSION, "orch_simulator": True}
        writer.write(json_response(200, body, req.keep_alive))
        return req.keep_alive

    async def _models(self, req: Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        cards = [
            {
                "id": name,
                "object": "model",
                "created": 0,
                "owned_by": SIMULATED,
                "root": self.cfg.model_path,
                "parent": None,
                "max_model_len": self.cfg.context_length,
                "orch_simulator": True,
            }
            for name in self.cfg.served_model_names
        ]
        writer.write(json_response(200, {"object": "list", "data": cards}, req.keep_alive))
        return req.keep_alive

    def metrics_text(self) -> str:
        e = self.engine
        name = self.cfg.served_model_name.replace("\\", "\\\\").replace('"', '\\"')
        labels = f'model_name="{name}",engine="0"'
        # Counters freeze under --disable-log-stats, as vLLM's stat loggers are then never called.
        live = e is not None and not self.cfg.disable_log_stats
        rows: list[tuple[str, str, str, str, float]] = [
            ("num_requests_running", "gauge", "Number of requests in model execution batches.", "",
             float(len(e.running)) if e else 0.0),
            ("num_requests_waiting", "gauge", "Number of requests waiting to be processed.", "",
             float(len(e.waiting)) if e else 0.0),
            ("prompt_tokens", "counter", "Number of prefill tokens processed.", "",
             float(e.prompt_tokens_total) if live and e else 0.0),
            ("generation_tokens", "counter", "Number of generation tokens processed.", "",
             float(e.gen_tokens_total) if live and e else 0.0),
        ]  # fmt: skip
        if e is not None and e.prefix_cache_entries > 0:
            # vLLM's prefix-cache counters, in tokens (v1/metrics/loggers.py); exported while the simulated cache is
            # on (off is like --no-enable-prefix-caching: nothing to attest).
            rows += [
                ("prefix_cache_queries", "counter", "Prefix cache queries, in terms of number of queried tokens.",
                 "", float(e.prompt_tokens_total) if live else 0.0),
                ("prefix_cache_hits", "counter", "Prefix cache hits, in terms of number of cached tokens.", "",
                 float(e.cached_tokens_total) if live else 0.0),
            ]  # fmt: skip
        if self.cfg.spec is not None:
            rows += [
                ("spec_decode_num_drafts", "counter", "Number of spec decoding drafts.", "",
                 float(e.spec_drafts_total) if live and e else 0.0),
                ("spec_decode_num_draft_tokens", "counter", "Number of draft tokens.", "",
                 float(e.spec_draft_tokens_total) if live and e else 0.0),
                ("spec_decode_num_accepted_tokens", "counter", "Number of accepted tokens.", "",
                 float(e.spec_accepted_total) if live and e else 0.0),
            ]  # fmt: skip
            per_pos = e.spec_accepted_per_pos if live and e else [0] * self.cfg.num_speculative_tokens
            for pos, count in enumerate(per_pos):
                rows.append(
                    ("spec_decode_num_accepted_tokens_per_pos", "counter", "Accepted tokens per draft position.",
                     f',position="{pos}"', float(count))
                )  # fmt: skip
        out = ["# orch-sim: SIMULATED metrics (not measured on a GPU)"]
        described: set[str] = set()
        for metric, kind, help_text, extra, value in rows:
            if metric not in described:
                described.add(metric)
                out += [f"# HELP vllm:{metric} {help_text}", f"# TYPE vllm:{metric} {kind}"]
            suffix = "_total" if kind == "counter" else ""
            out.append(f"vllm:{metric}{suffix}{{{labels}{extra}}} {value}")
        return "\n".join(out) + "\n"


def main(argv: Sequence[str]) -> int:
    """`python -m orchestrator.sim serve MODEL [flags]`."""
    logs.banner("vllm serve")
    knobs = load_knobs()
    if knobs is None:
        return 2
    try:
        cfg = parse_vllm_args(argv)
    except SimArgError as exc:
        logs.log(f"{exc}", "error")
        return 1
    logs.log(f"vLLM API server version {VLLM_VERSION} (simulated by orch-sim)")

    settings = "non-default args: " + ", ".join(f"{k}: {v!r}" for k, v in cfg.resolved.items() if k != "api_key")
    return launch(cfg, knobs, VllmSimServer, settings, lambda drop: rewrite_vllm_env(os.environ, drop))
