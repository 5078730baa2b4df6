"""What the SGLang mode reports about itself: model and server info, /v1/models, /metrics, /generate's payload."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from orchestrator.sim.args import ServerConfig
from orchestrator.sim.engine import MAX_TOTAL_TOKENS, Req, SimEngine

if TYPE_CHECKING:
    from orchestrator.sim.server import SimServer


def model_info_obj(cfg: ServerConfig) -> dict[str, Any]:
    return {
        "model_path": cfg.model_path,
        "tokenizer_path": cfg.resolved.get("tokenizer_path") or cfg.model_path,
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": "default",
        "has_image_understanding": False,
        "has_audio_understanding": False,
        "orch_simulator": True,
    }


def models_obj(cfg: ServerConfig, owned_by: str) -> dict[str, Any]:
    """/v1/models: the one served model."""
    name = cfg.served_model_name
    card = {
        "id": name,
        "object": "model",
        "created": int(time.time()),
        "owned_by": owned_by,
        "root": name,
        "max_model_len": cfg.context_length,
    }
    return {"object": "list", "data": [card]}


def server_info_obj(server: SimServer) -> dict[str, Any]:
    """SGLang's /server_info, with the simulator's own state under `orch_sim` (read by orch's fingerprint)."""
    engine = server.engine
    state = engine.internal_state() if engine is not None else {"last_gen_throughput": 0.0}
    return {
        **server.cfg.resolved,
        "max_total_num_tokens": MAX_TOTAL_TOKENS,
        "max_req_input_len": server.cfg.context_length - 1,
        "internal_states": [state],
        "version": server.knobs.get("version") or server.engine_version,
        "orch_simulator": True,
        "orch_sim": {
            "seed": server.seed,
            "speed_factor": server.speed_factor,
            "knobs": server.knobs,
            "faults": server.faults,
            "env_changes": server.env_changes,
            "expected_single_stream_tok_s": server.model.steady_tokens_per_s(1),
            "mean_accept_length": server.model.mean_accept_length,
            "late_iterations": engine.late_iterations if engine else 0,
            "max_late_s": engine.max_late_s if engine else 0.0,
            "phase": server.phase,
        },
    }


def metrics_text(e: SimEngine | None, model_name: str) -> str:
    """SGLang's /metrics (Prometheus text): its sglang:* counters and gauges, labelled model_name."""
    label = '{model_name="' + model_name.replace("\\", "\\\\").replace('"', '\\"') + '"}'
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
    # The prefix cache's counter and gauge (SGLang's names), after the original rows.
    rows.append(
        ("cached_tokens_total", "counter", "Number of cached prompt tokens.", e.cached_tokens_total if e else 0)
    )
    rows.append(("cache_hit_rate", "gauge", "The prefix cache hit rate.", e.cache_hit_rate() if e else 0.0))
    out = ["# orch-sim: SIMULATED metrics (not measured on a GPU)"]
    for name, kind, help_text, value in rows:
        out.append(f"# HELP sglang:{name} {help_text}")
        out.append(f"# TYPE sglang:{name} {kind}")
        out.append(f"sglang:{name}{label} {float(value)}")
    return "\n".join(out) + "\n"


def generate_payload(req: Req, engine: SimEngine | None, final: bool) -> bytes:
    """One /generate answer (or SSE event): the text so far, its output_ids and meta_info."""
    meta: dict[str, Any] = {
        "id": req.rid,
        "finish_reason": req.finish_reason,
        "prompt_tokens": req.prompt_tokens,
        "weight_version": "default",
        "completion_tokens": req.completion_tokens,
        "cached_tokens": req.cached_tokens,
    }
    if final:
        meta["e2e_latency"] = req.e2e_latency
        if engine is not None:
            meta.update(engine.spec_meta(req))
    # The text is made of plain ASCII words, so it is spliced in without JSON escaping.
    return (
        '{"text":"' + req.text + '","output_ids":[' + req.ids_str + '],"meta_info":' + json.dumps(meta) + "}"
    ).encode()
