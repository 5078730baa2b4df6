"""SGLang (`python -m sglang.launch_server`), and orch's simulator of it (`python -m orchestrator.sim`)."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from orchestrator.client.request import Wire, flatten
from orchestrator.engines.base import (
    OPTIONAL_FIELDS,
    CacheFlush,
    Engine,
    Probe,
    ServerProfile,
    SpecCounters,
    SpecSettings,
)

# A real 1-token generation, the request SGLang's own /health_generate submits; asked for directly it answers as
# soon as the token is out, where /health_generate sleeps a whole second before it looks (http_server.py).
GENERATE_ONE = Probe(
    "POST", "/generate", {"input_ids": [0], "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
)

# Algorithms that run a separate draft model and so need its path (SGLang refuses to start without it).
NEEDS_DRAFT_MODEL = ("EAGLE", "EAGLE3", "STANDALONE")


class SGLang(Engine):
    name = "sglang"
    title = "SGLang"
    # /health and /health_generate share one handler in 0.5.x; /model_info and /v1/models answer during warmup
    # and so are not readiness signals. Readiness and health checks use GENERATE_ONE instead (no 1 s wait).
    health_path = "/health_generate"
    env_overrides: Mapping[str, str] = MappingProxyType(
        {
            "CUDA_DEVICE_MAX_CONNECTIONS": "SGLang forces it to 8 before spawning workers",
            "NCCL_CUMEM_ENABLE": "SGLang sets it to 0 when unset",
            "NCCL_NVLS_ENABLE": "SGLang sets it to 0 when unset",
            "CUDA_VISIBLE_DEVICES": "SGLang rewrites it per worker",
        }
    )
    packages = ("sglang", "torch", "flashinfer", "sgl_kernel", "triton")
    version_package = "sglang"
    env_prefixes = ("SGLANG_", "SGL_")
    runtime_packages = ("torch",)
    fields = frozenset(OPTIONAL_FIELDS)
    required = ("tp_size",)
    spec_algorithms = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM")
    spec_fields = frozenset({"draft_model_path", "num_steps", "eagle_topk", "num_draft_tokens"})
    # SGLang picks (num_steps, topk, draft tokens) = (3, 1, 4) when num_steps is unset.
    default_spec_steps = 3
    managed_flags: Mapping[str, str] = MappingProxyType(
        {
            "--model-path": "model_path",
            "--model": "model_path",
            "--tp-size": "tp_size",
            "--tensor-parallel-size": "tp_size",
            "--tp": "tp_size",
            "--port": "port",
            "--host": "host",
            "--served-model-name": "served_model_name",
            "--trust-remote-code": "trust_remote_code",
            "--mem-fraction-static": "mem_fraction_static",
            "--speculative-algorithm": "speculative.algorithm",
            "--speculative-draft-model-path": "speculative.draft_model_path",
            "--speculative-draft-model": "speculative.draft_model_path",
            "--speculative-num-steps": "speculative.num_steps",
            "--speculative-eagle-topk": "speculative.eagle_topk",
            "--speculative-num-draft-tokens": "speculative.num_draft_tokens",
            "--nnodes": "nnodes",
            "--node-rank": "nnodes",
            "--dist-init-addr": "nnodes",
            "--nccl-init-addr": "nnodes",
        }
    )
    endpoints = ("generate", "completions", "chat")
    simulated = True
    # GET or POST, always mounted; 400 "Cache not flushed" while any request runs or waits (http_server.py).
    cache_flush = CacheFlush(request=Probe("POST", "/flush_cache"), means="POST /flush_cache before each timed run")
    info_paths = ("/server_info", "/get_server_info")  # older SGLang: /get_server_info
    # Cached and all prompt tokens (cached_tokens_total carries a cache_source label, summed like every label).
    cache_counters = ("sglang:cached_tokens_total", "sglang:prompt_tokens_total")

    def wire(self, endpoint: str) -> Wire:
        if endpoint != "generate":
            return super().wire(endpoint)
        # Each event is the whole answer so far, its counts in meta_info (the client's "cumulative" stream).
        return Wire(path="/generate", stream="cumulative", metrics_path=self.metrics_path, counters=self.counters)

    def request_body(self, endpoint: str, item: Mapping[str, Any], max_tokens: int, model: str) -> dict[str, Any]:
        if endpoint != "generate":
            return super().request_body(endpoint, item, max_tokens, model)
        # The native API: sampling_params, ignore_eos so every request yields exactly max_tokens; no model name.
        body: dict[str, Any] = {
            "sampling_params": {"max_new_tokens": max_tokens, "ignore_eos": True, "temperature": 0.0},
            "stream": True,
        }
        if item.get("input_ids") is not None:
            body["input_ids"] = item["input_ids"]
        else:
            body["text"] = item.get("text") or flatten(list(item.get("messages") or []))
        return body

    def ready_probe(self, profile: ServerProfile) -> Probe:
        # The port refuses connections until the workers are loaded; from then on a generation is served (SGLang's
        # own 8-token warmup request is one too). orch's warmup requests still come before anything is measured.
        return GENERATE_ONE

    def health_probe(self, profile: ServerProfile) -> Probe:
        return GENERATE_ONE  # needs no model name, so it fits attached servers too

    def node_flags(self, nnodes: int, rank: int, init_addr: str) -> list[str]:
        return ["--nnodes", str(nnodes), "--node-rank", str(rank), "--dist-init-addr", init_addr]

    def rank_probe(self) -> Probe:
        # Ranks >= 1 serve only a dummy app (/health, /health_generate, /ping: always 200) once their schedulers
        # are in the group, i.e. once every rank has joined (entrypoints/engine.py, launch_dummy_health_check_server).
        return Probe("GET", "/health")

    def check_speculative(self, spec: SpecSettings) -> tuple[str, str] | None:
        if spec.algorithm in NEEDS_DRAFT_MODEL and not spec.draft_model_path:
            return "draft_model_path", f"required for {spec.algorithm}"
        if spec.num_steps is None and (spec.eagle_topk is not None or spec.num_draft_tokens is not None):
            # SGLang refuses this combination: without num_steps it picks all three automatically.
            return "num_steps", (
                "required when eagle_topk or num_draft_tokens is set (SGLang only auto-chooses all three together)"
            )
        if spec.eagle_topk == 1 and spec.num_steps is not None:
            want = spec.num_steps + 1
            if spec.num_draft_tokens is not None and spec.num_draft_tokens != want:
                # SGLang silently overrides it; refusing keeps the profile equal to what actually runs.
                return "num_draft_tokens", (
                    f"with eagle_topk 1 SGLang forces it to num_steps + 1 = {want}, got {spec.num_draft_tokens}"
                )
        return None

    def spec_from_counters(self, deltas: Mapping[str, float]) -> SpecCounters | None:
        verify = deltas.get("sglang:spec_verify_calls_total")
        if not verify or verify <= 0:
            return None
        tokens = deltas.get("sglang:generation_tokens_total", 0.0)
        return SpecCounters(
            accept_length=tokens / verify,
            acceptance_rate=None,
            drafted=None,
            accepted=None,
            source="metrics (counter deltas across this run)",
        )

    def server_flags(self, profile: ServerProfile) -> list[str]:
        flags = ["--model-path", profile.model_path, "--tp-size", str(profile.tp_size)]
        flags += ["--host", profile.host, "--port", str(profile.port)]
        if profile.served_model_name:
            flags += ["--served-model-name", profile.served_model_name]
        if profile.trust_remote_code:
            flags.append("--trust-remote-code")
        if profile.mem_fraction_static is not None:
            flags += ["--mem-fraction-static", repr(profile.mem_fraction_static)]
        spec = profile.speculative
        if spec is not None:
            flags += ["--speculative-algorithm", spec.algorithm]
            if spec.draft_model_path:
                flags += ["--speculative-draft-model-path", spec.draft_model_path]
            for flag, value in (
                ("--speculative-num-steps", spec.num_steps),
                ("--speculative-eagle-topk", spec.eagle_topk),
                ("--speculative-num-draft-tokens", spec.num_draft_tokens),
            ):
                if value is not None:
                    flags += [flag, str(value)]
        return flags + list(profile.server_args)

    def launch_argv(self, profile: ServerProfile, python: str, *, simulate: bool) -> list[str]:
        module = "orchestrator.sim" if simulate else "sglang.launch_server"
        return [python, "-m", module, *self.server_flags(profile)]
