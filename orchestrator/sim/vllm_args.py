"""`vllm serve MODEL` flags as the simulator's vLLM mode accepts them, and vLLM's speculative-config rules.

Checked against vllm-project/vllm's source (engines.md pins the 0.33.0 wheel): vllm/entrypoints/cli/main.py
(commit 00a5fdd2), vllm/config/speculative.py (002e77c1: SpeculativeConfig fields, method inference, "forbid"
extra fields via vllm/config/utils.py `config`), vllm/v1/spec_decode/metrics.py (016a8587).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from orchestrator.sim import logs
from orchestrator.sim.args import DEFAULT_CONTEXT_LENGTH, ServerConfig, SimArgError, parse_server_args
from orchestrator.sim.timing import SpecConfig

VLLM_VERSION = "0.33.0"
DEFAULT_PORT = 8000
# vLLM's default for the OpenAI server on a large GPU; the simulator has no GPU memory to size it from.
DEFAULT_MAX_NUM_SEQS = 1024
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192
# Methods the simulator models (vLLM's SpeculativeMethod has more: medusa, suffix, dflash, ...).
SPEC_METHODS = ("eagle", "eagle3", "ngram", "draft_model", "mtp")
# Every SpeculativeConfig field a user may set; vLLM refuses any other key (pydantic extra="forbid").
SPEC_FIELDS = (
    "enforce_eager", "num_speculative_tokens", "model", "method", "draft_tensor_parallel_size",
    "tensor_parallel_size", "quantization", "moe_backend", "attention_backend", "kv_cache_dtype", "max_model_len",
    "revision", "code_revision", "index_share_for_mtp_iteration", "disable_padded_drafter_batch",
    "disable_eagle_block_drop", "use_local_argmax_reduction", "use_heterogeneous_vocab", "prompt_lookup_max",
    "prompt_lookup_min", "parallel_drafting", "num_speculative_tokens_per_batch_size",
    "suffix_decoding_max_tree_depth", "suffix_decoding_max_cached_requests", "suffix_decoding_max_spec_factor",
    "suffix_decoding_min_token_prob", "draft_load_config", "rejection_sample_method", "synthetic_acceptance_rates",
    "synthetic_acceptance_length", "enable_adaptive_verification", "draft_sample_method", "dspark_draft_topk",
    "speculative_token_tree",
)  # fmt: skip
_SPEC_MODELLED = ("method", "model", "num_speculative_tokens", "draft_tensor_parallel_size")

# (names, kind, modelled, help); kind: str | int | float | bool | names (nargs +) | spec
_FLAGS: tuple[tuple[str, str, bool, str], ...] = (
    ("--model", "str", True, "the model (vllm serve takes it as the positional MODEL)"),
    ("--served-model-name", "names", True, "model name(s) in the OpenAI API; the first labels the metrics"),
    ("--tensor-parallel-size -tp", "int", True, "tensor parallel size: one worker per rank"),
    ("--data-parallel-size -dp", "int", False, "data parallel size"),
    ("--pipeline-parallel-size -pp", "int", False, "pipeline parallel size"),
    ("--host", "str", True, "HTTP host (unset: all interfaces)"),
    ("--port", "int", True, "HTTP port"),
    ("--speculative-config -sc", "spec", True, "speculative decoding config as JSON"),
    ("--trust-remote-code", "bool", False, "allow custom model code"),
    ("--gpu-memory-utilization", "float", False, "GPU memory fraction for weights + KV cache"),
    ("--max-model-len", "len", True, "max prompt + output tokens per request (e.g. 32768 or 32k)"),
    ("--max-num-seqs", "int", True, "max concurrently running requests"),
    ("--max-num-batched-tokens", "int", True, "max tokens per scheduler step (the prefill chunk)"),
    ("--seed", "int", False, "sampling seed (simulator: use ORCH_SIM_SEED)"),
    ("--enforce-eager", "bool", True, "no CUDA graphs"),
    ("--disable-log-stats", "bool", True, "no stats: the Prometheus counters are not updated"),
    ("--enable-log-requests", "bool", False, "log request metadata"),
    ("--dtype", "str", False, "weight/activation dtype"),
    ("--quantization -q", "str", False, "quantization method"),
    ("--kv-cache-dtype", "str", False, "KV cache dtype"),
    ("--block-size", "int", False, "KV cache block size"),
    ("--enable-prefix-caching", "bool", False, "prefix caching"),
    ("--enable-chunked-prefill", "bool", False, "chunked prefill"),
    ("--async-scheduling", "bool", False, "async scheduling"),
    ("--enable-expert-parallel", "bool", False, "expert parallelism for MoE layers"),
    ("--disable-custom-all-reduce", "bool", False, "disable custom all-reduce"),
    ("--compilation-config -cc", "str", False, "torch.compile / CUDA graph config (JSON)"),
    ("--distributed-executor-backend", "str", False, "mp or ray"),
    ("--revision", "str", False, "model revision"),
    ("--tokenizer", "str", False, "tokenizer path"),
    ("--download-dir", "str", False, "weight download dir"),
    ("--load-format", "str", False, "weight format"),
    ("--generation-config", "str", False, "generation config source"),
    ("--chat-template", "str", False, "chat template"),
    ("--enable-auto-tool-choice", "bool", False, "auto tool choice"),
    ("--tool-call-parser", "str", False, "tool call parser"),
    ("--reasoning-parser", "str", False, "reasoning parser"),
    ("--api-key", "str", False, "API key (the simulator does not check it)"),
    ("--uvicorn-log-level", "str", False, "uvicorn's log level"),
    ("--shutdown-timeout", "int", False, "seconds to drain on SIGTERM (simulator: ORCH_SIM_DRAIN_S)"),
)
_MODELLED = {names.split()[0].lstrip("-").replace("-", "_") for names, _, modelled, _ in _FLAGS if modelled}


@dataclass
class VllmServerConfig(ServerConfig):
    """A ServerConfig resolved from vLLM's flags; what only vLLM has on top."""

    served_model_names: tuple[str, ...] = ()
    num_speculative_tokens: int = 0
    disable_log_stats: bool = False


class _Parser(argparse.ArgumentParser):
    """vLLM's parser exits 2 on an unknown flag; so does this one, with the message on the simulator's log."""

    def error(self, message: str) -> NoReturn:
        logs.log(f"vllm serve: error: {message} (as real vLLM would refuse it; see `serve --help`)", "error")
        sys.exit(2)


def _human_int(text: str) -> int:
    """vLLM's human-readable ints for --max-model-len: 32768, 32k, 1m (k = 1000, K = 1024)."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgG]?)", text.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"invalid length {text!r}: expected an integer like 32768 or 32k")
    scale = {"": 1, "k": 1000, "K": 1024, "m": 10**6, "M": 2**20, "g": 10**9, "G": 2**30}[m.group(2)]
    return int(float(m.group(1)) * scale)


def _spec_json(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON ({exc.msg}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m orchestrator.sim serve",
        description="SIMULATOR of `vllm serve` (orch). Timings are simulated, not measured.",
        allow_abbrev=False,
    )
    parser.add_argument("model_tag", nargs="?", default=None, help="the model to serve")
    for names, kind, _modelled, help_text in _FLAGS:
        flags = names.split()
        dest = flags[0].lstrip("-").replace("-", "_")
        kwargs: dict[str, Any] = {"dest": dest, "default": None, "help": help_text}
        if kind == "bool":
            kwargs["action"] = argparse.BooleanOptionalAction
        elif kind == "names":
            kwargs["nargs"] = "+"
        else:
            kwargs["type"] = {"str": str, "int": int, "float": float, "len": _human_int, "spec": _spec_json}[kind]
        parser.add_argument(*flags, **kwargs)
    return parser


def _normalise(argv: Sequence[str]) -> list[str]:
    """vLLM's FlexibleArgumentParser takes --max_model_len for --max-model-len."""
    out = []
    for tok in argv:
        if tok.startswith("--"):
            name, eq, value = tok.partition("=")
            tok = name.replace("_", "-") + eq + value
        out.append(tok)
    return out


def parse_vllm_args(argv: Sequence[str]) -> VllmServerConfig:
    """Parse `serve`'s arguments (without the word serve); argparse errors exit 2, SimArgError means vLLM would
    fail while building its config (exit 1)."""
    ns = build_parser().parse_args(_normalise(argv))
    given = {k: v for k, v in vars(ns).items() if v is not None}
    model = given.pop("model_tag", None)
    if model is not None and given.get("model") not in (None, model):
        raise SimArgError(f"the model is given twice, as MODEL {model!r} and --model {given['model']!r}")
    model = model or given.get("model")
    if not model:
        raise SimArgError("no model: give it as `serve MODEL` (the simulator has no default model)")
    warnings = [
        f"--{k.replace('_', '-')}={v} is accepted but ignored by the simulator (no effect on simulated timing)"
        for k, v in given.items()
        if k not in _MODELLED and k != "api_key"
    ]
    if "api_key" in given:
        warnings.append("--api-key is accepted but not checked by the simulator")
    tp = int(given.get("tensor_parallel_size", 1))
    port = int(given.get("port", DEFAULT_PORT))
    for name, value, lo, hi in (("--tensor-parallel-size", tp, 1, 1024), ("--port", port, 1, 65535)):
        if not lo <= value <= hi:
            raise SimArgError(f"{name} must be in {lo}..{hi}, got {value}")
    names = tuple(given.get("served_model_name") or (model,))
    notes: list[str] = []
    spec, draft_model, k = _resolve_spec(given.get("speculative_config"), model, tp, warnings, notes)
    context = int(given.get("max_model_len", DEFAULT_CONTEXT_LENGTH))
    max_seqs = int(given.get("max_num_seqs", DEFAULT_MAX_NUM_SEQS))
    chunk = int(given.get("max_num_batched_tokens", DEFAULT_MAX_NUM_BATCHED_TOKENS))
    for name, value in (
        ("--max-model-len", context),
        ("--max-num-seqs", max_seqs),
        ("--max-num-batched-tokens", chunk),
    ):
        if value < 1:
            raise SimArgError(f"{name} must be >= 1, got {value}")
    resolved = {"model": model, "served_model_name": list(names), "tensor_parallel_size": tp, **given}
    resolved.update(host=given.get("host"), port=port, max_model_len=context, max_num_seqs=max_seqs)
    return VllmServerConfig(
        model_path=model,
        served_model_name=names[0],
        tp_size=tp,
        # vLLM without --host listens on every interface.
        host=str(given.get("host") or "0.0.0.0"),
        port=port,
        enable_metrics=True,  # vLLM always mounts /metrics
        skip_server_warmup=True,  # vLLM warms up (profiling, CUDA graphs) before it listens, not over HTTP
        decode_log_interval=10**9,  # vLLM logs no SGLang-style decode lines
        stream_interval=1,
        context_length=context,
        max_running_requests=max_seqs,
        chunked_prefill_size=chunk,
        log_level="info",
        disable_cuda_graph=bool(given.get("enforce_eager", False)),
        cuda_graph_max_bs=512,
        enable_symm_mem=False,
        enable_nccl_nvls=False,
        spec=spec,
        speculative_draft_model_path=draft_model,
        resolved=resolved,
        warnings=warnings,
        notes=notes,
        served_model_names=names,
        num_speculative_tokens=k,
        disable_log_stats=bool(given.get("disable_log_stats", False)),
    )


def _resolve_spec(
    raw: dict[str, Any] | None, model: str, tp: int, warnings: list[str], notes: list[str]
) -> tuple[SpecConfig | None, str | None, int]:
    """SpeculativeConfig.__post_init__'s rules, for the methods the simulator models."""
    if raw is None:
        return None, None, 0
    for key in raw:
        if key not in SPEC_FIELDS:
            raise SimArgError(
                f"--speculative-config: unknown field {key!r} (vLLM's SpeculativeConfig forbids extra fields); "
                f"known: {', '.join(SPEC_FIELDS)}"
            )
    for key, value in raw.items():
        if key not in _SPEC_MODELLED:
            warnings.append(f"--speculative-config {key}={value!r} is accepted but ignored by the simulator")
    method, draft, k = raw.get("method"), raw.get("model"), raw.get("num_speculative_tokens")
    if method is not None and not isinstance(method, str):
        raise SimArgError(f"--speculative-config method: expected a string, got {method!r}")
    if draft is not None and not isinstance(draft, str):
        raise SimArgError(f"--speculative-config model: expected a string, got {draft!r}")
    if method is None:
        # vLLM's inference: "ngram" as the model means n-gram; any other model is a draft model, named by its path.
        method = "ngram" if draft in ("ngram", "[ngram]") else "draft_model"
        if draft is not None and "eagle-" in draft.lower():
            method = "eagle"
        elif draft is not None and "eagle3" in draft.lower():
            method = "eagle3"
        notes.append(f"speculative method inferred as {method!r} from model {draft!r}")
    elif method.endswith("_mtp"):
        warnings.append(f"method `{method}` is deprecated and replaced with mtp.")
        method = "mtp"
    if method not in SPEC_METHODS:
        raise SimArgError(
            f"--speculative-config method: {method!r} is not one the simulator models (vLLM's names are lowercase); "
            f"expected one of {', '.join(SPEC_METHODS)}"
        )
    if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
        raise SimArgError(f"--speculative-config num_speculative_tokens: expected an integer > 0, got {k!r}")
    if draft is None:
        if method == "mtp":
            draft = model  # the MTP layers live in the target checkpoint
        elif method == "ngram":
            draft = "ngram"
        else:
            raise SimArgError("num_speculative_tokens was provided but without speculative model.")
    if k is None:
        if method != "mtp":
            raise SimArgError(
                "num_speculative_tokens must be provided with speculative model unless the draft model config "
                "contains an n_predict parameter."
            )
        k = 1
        notes.append("mtp: num_speculative_tokens taken as 1 (the simulator has no draft config to read n_predict)")
    draft_tp = raw.get("draft_tensor_parallel_size")
    if draft_tp is not None and draft_tp not in (1, tp):
        raise SimArgError(
            f"speculative_draft_tensor_parallel_size={draft_tp} cannot be other value than 1 or target model "
            f"tensor_parallel_size={tp}"
        )
    # One verify of the K drafts plus the bonus token; n-gram drafts come from a CPU lookup, not a model.
    algorithm = "NGRAM" if method == "ngram" else method.upper()
    return SpecConfig(algorithm, k, 1, k + 1), (None if method == "ngram" else draft), k


def parse_launch_args(argv: Sequence[str]) -> ServerConfig:
    """The simulator's arguments in either mode: `serve MODEL ...` (vLLM) or sglang.launch_server's flags."""
    args = list(argv)
    if args[:1] == ["serve"]:
        return parse_vllm_args(args[1:])
    return parse_server_args(args)
