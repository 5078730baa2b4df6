"""Command-line flags of sglang.launch_server as the simulator accepts them, and SGLang's resolution rules."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator.sim.timing import SpecConfig

SGLANG_VERSION = "0.5.9"
SPEC_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM")
# SGLang's auto choice for EAGLE-family models of DeepSeek/Kimi architecture; the simulator has no HF config
# to read, so it always takes this one.
AUTO_SPEC_PARAMS = (3, 1, 4)
SPEC_MAX_RUNNING_REQUESTS = 48
NGRAM_DEFAULT_DRAFT_TOKENS = 12
# Stand-ins for values real SGLang derives from the model config and GPU memory.
DEFAULT_CONTEXT_LENGTH = 131072
DEFAULT_MAX_RUNNING_REQUESTS = 1024
DEFAULT_CHUNKED_PREFILL_SIZE = 8192
DEFAULT_CUDA_GRAPH_MAX_BS = 256


class SimArgError(Exception):
    """A flag combination SGLang rejects after parsing (SGLang exits 1 on these)."""


@dataclass(frozen=True, kw_only=True)
class Flag:
    names: tuple[str, ...]
    kind: str  # str | int | float | bool | list
    default: Any
    modelled: bool
    help: str
    choices: tuple[str, ...] | None = None

    @property
    def dest(self) -> str:
        return self.names[0].lstrip("-").replace("-", "_")


def _f(names: str, kind: str, default: Any, modelled: bool, help: str, choices: tuple[str, ...] | None = None) -> Flag:
    return Flag(names=tuple(names.split()), kind=kind, default=default, modelled=modelled, help=help, choices=choices)


# The first name is SGLang's canonical flag (its dest is the ServerArgs field name).
FLAGS: tuple[Flag, ...] = (
    _f("--model-path --model", "str", None, True, "model weights path (only its name is used)"),
    _f("--tokenizer-path", "str", None, False, "tokenizer path"),
    _f("--served-model-name", "str", None, True, "model name in the OpenAI API"),
    _f("--tp-size --tensor-parallel-size", "int", 1, True, "tensor parallel size: one scheduler per rank"),
    _f("--dp-size --data-parallel-size", "int", 1, False, "data parallel size"),
    _f("--pp-size --pipeline-parallel-size", "int", 1, False, "pipeline parallel size"),
    _f("--ep-size --expert-parallel-size", "int", 1, False, "expert parallel size"),
    _f("--host", "str", "127.0.0.1", True, "HTTP host"),
    _f("--port", "int", 30000, True, "HTTP port"),
    _f("--trust-remote-code", "bool", False, False, "allow custom model code"),
    _f("--mem-fraction-static", "float", None, False, "GPU memory fraction for weights + KV cache"),
    _f("--revision", "str", None, False, "model revision"),
    _f("--enable-metrics", "bool", False, True, "serve Prometheus /metrics"),
    _f("--skip-server-warmup", "bool", False, True, "skip the warmup request"),
    _f("--decode-log-interval", "int", 40, True, "log a Decode batch line every N iterations"),
    _f("--stream-interval", "int", 1, True, "stream a chunk every N decode iterations"),
    _f("--watchdog-timeout", "float", 300.0, False, "scheduler watchdog timeout (s)"),
    _f("--context-length", "int", None, True, "max prompt + output tokens per request"),
    _f("--max-running-requests", "int", None, True, "max concurrently decoding requests"),
    _f("--max-total-tokens", "int", None, False, "KV cache size in tokens"),
    _f("--max-prefill-tokens", "int", None, False, "max tokens in one prefill batch"),
    _f("--chunked-prefill-size", "int", None, True, "prefill chunk size (tokens); -1 disables chunking"),
    _f("--random-seed", "int", None, False, "sampling seed (simulator: use ORCH_SIM_SEED)"),
    _f("--log-level", "str", "info", True, "log level"),
    _f("--log-level-http", "str", None, False, "HTTP log level"),
    _f("--log-requests", "bool", False, False, "log request metadata"),
    _f("--speculative-algorithm", "str", None, True, "speculative decoding algorithm", SPEC_ALGORITHMS),
    _f("--speculative-draft-model-path --speculative-draft-model", "str", None, True, "draft model weights"),
    _f("--speculative-draft-model-revision", "str", None, False, "draft model revision"),
    _f("--speculative-num-steps", "int", None, True, "draft steps per cycle"),
    _f("--speculative-eagle-topk", "int", None, True, "draft branching factor per step"),
    _f("--speculative-num-draft-tokens", "int", None, True, "tokens verified per cycle"),
    _f("--speculative-accept-threshold-single", "float", 1.0, False, "single-token accept threshold"),
    _f("--speculative-accept-threshold-acc", "float", 1.0, False, "accumulated accept threshold"),
    _f("--speculative-token-map", "str", None, False, "draft vocabulary map"),
    _f(
        "--speculative-attention-mode",
        "str",
        "prefill",
        False,
        "attention mode of the verify pass",
        ("prefill", "decode"),
    ),
    _f("--speculative-draft-attention-backend", "str", None, False, "draft attention backend"),
    _f("--disable-cuda-graph", "bool", False, False, "disable CUDA graphs"),
    _f("--cuda-graph-max-bs", "int", None, False, "largest batch captured in a CUDA graph"),
    _f("--cuda-graph-bs", "list", None, False, "batch sizes captured in CUDA graphs"),
    _f("--attention-backend", "str", None, False, "attention kernel backend"),
    _f("--prefill-attention-backend", "str", None, False, "prefill attention backend"),
    _f("--decode-attention-backend", "str", None, False, "decode attention backend"),
    _f("--sampling-backend", "str", None, False, "sampling backend"),
    _f("--dtype", "str", "auto", False, "weight/activation dtype"),
    _f("--kv-cache-dtype", "str", "auto", False, "KV cache dtype"),
    _f("--quantization", "str", None, False, "quantization method"),
    _f("--load-format", "str", "auto", False, "weight format"),
    _f("--download-dir", "str", None, False, "weight download dir"),
    _f("--device", "str", None, False, "device type"),
    _f("--base-gpu-id", "int", 0, False, "first GPU id"),
    _f("--nnodes", "int", 1, True, "number of nodes (ranks rendezvous at --dist-init-addr)"),
    _f("--node-rank", "int", 0, True, "this node's rank (0 serves the API; others a health app)"),
    _f("--dist-init-addr --nccl-init-addr", "str", None, True, "distributed init address HOST:PORT"),
    _f("--enable-symm-mem", "bool", False, True, "symmetric memory (sets NCCL_CUMEM_ENABLE/NCCL_NVLS_ENABLE=1)"),
    _f("--enable-nccl-nvls", "bool", False, True, "NCCL NVLS (sets NCCL_NVLS_ENABLE=1)"),
    _f("--disable-custom-all-reduce", "bool", False, False, "disable custom all-reduce"),
    _f("--disable-radix-cache", "bool", False, False, "disable the prefix cache"),
    _f("--disable-overlap-schedule", "bool", False, False, "disable the overlap scheduler"),
    _f("--enable-mixed-chunk", "bool", False, False, "mix prefill chunks into decode batches"),
    _f("--enable-torch-compile", "bool", False, False, "torch.compile the model"),
    _f("--enable-dp-attention", "bool", False, False, "data-parallel attention"),
    _f("--enable-dp-lm-head", "bool", False, False, "data-parallel LM head"),
    _f("--moe-runner-backend", "str", None, False, "MoE kernel backend"),
    _f("--moe-dense-tp-size", "int", None, False, "TP size of dense MoE layers"),
    _f("--page-size", "int", None, False, "KV cache page size"),
    _f("--schedule-policy", "str", "fcfs", False, "request scheduling policy"),
    _f("--schedule-conservativeness", "float", 1.0, False, "scheduler conservativeness"),
    _f("--api-key", "str", None, False, "API key (the simulator does not check it)"),
    _f("--chat-template", "str", None, False, "chat template"),
    _f("--tool-call-parser", "str", None, False, "tool call parser"),
    _f("--reasoning-parser", "str", None, False, "reasoning parser"),
    _f("--enable-cache-report", "bool", False, False, "report cached tokens in usage"),
    _f("--allow-auto-truncate", "bool", False, False, "truncate over-long prompts"),
    _f("--warmups", "str", None, False, "custom warmup functions"),
    _f("--json-model-override-args", "str", "{}", False, "model config overrides"),
)

_FLAG_BY_DEST = {f.dest: f for f in FLAGS}


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid port: {text!r}") from None
    if not 0 < value < 65536:
        raise argparse.ArgumentTypeError(f"port must be in 1..65535, got {value}")
    return value


_POSITIVE = {"tp_size", "dp_size", "pp_size", "ep_size", "decode_log_interval", "stream_interval"}


def build_parser() -> argparse.ArgumentParser:
    """An argparse parser with SGLang's flag names; every default is None so explicit flags can be told apart."""
    parser = argparse.ArgumentParser(
        prog="python -m orchestrator.sim",
        description="SIMULATOR of `python -m sglang.launch_server` (orch). Timings are simulated, not measured.",
        allow_abbrev=False,
    )
    for flag in FLAGS:
        kwargs: dict[str, Any] = {"dest": flag.dest, "default": None, "help": flag.help}
        if flag.kind == "bool":
            kwargs["action"] = "store_true"
        elif flag.kind == "list":
            kwargs["nargs"] = "+"
            kwargs["type"] = int
        else:
            if flag.dest == "port":
                kwargs["type"] = _port
            elif flag.dest in _POSITIVE:
                kwargs["type"] = _positive_int
            else:
                kwargs["type"] = {"str": str, "int": int, "float": float}[flag.kind]
            if flag.choices is not None:
                kwargs["choices"] = list(flag.choices)
        if flag.dest == "model_path":
            kwargs["required"] = True
        parser.add_argument(*flag.names, **kwargs)
    return parser


@dataclass(kw_only=True)
class ServerConfig:
    """Resolved server settings, after defaults and SGLang's speculative rules."""

    model_path: str
    served_model_name: str
    tp_size: int
    host: str
    port: int
    enable_metrics: bool
    skip_server_warmup: bool
    decode_log_interval: int
    stream_interval: int
    context_length: int
    max_running_requests: int
    chunked_prefill_size: int
    log_level: str
    disable_cuda_graph: bool
    cuda_graph_max_bs: int
    enable_symm_mem: bool
    enable_nccl_nvls: bool
    spec: SpecConfig | None
    speculative_draft_model_path: str | None
    nnodes: int = 1
    node_rank: int = 0
    dist_init_addr: tuple[str, int] | None = None
    resolved: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _unknown_warnings(extras: Sequence[str]) -> list[str]:
    out: list[str] = []
    i = 0
    while i < len(extras):
        tok = extras[i]
        if tok.startswith("-"):
            value = ""
            if "=" not in tok and i + 1 < len(extras) and not extras[i + 1].startswith("-"):
                value = f" {extras[i + 1]}"
                i += 1
            out.append(
                f"unknown flag {tok}{value}: not a sglang.launch_server flag the simulator knows; ignored "
                "(real SGLang would refuse it)"
            )
        else:
            out.append(f"unexpected argument {tok!r} ignored")
        i += 1
    return out


def parse_server_args(argv: Sequence[str]) -> ServerConfig:
    """Parse and resolve; argparse errors exit 2, SimArgError means SGLang would refuse to start (exit 1)."""
    parser = build_parser()
    ns, extras = parser.parse_known_args(list(argv))
    given: dict[str, Any] = {k: v for k, v in vars(ns).items() if v is not None and v is not False}
    values: dict[str, Any] = {f.dest: f.default for f in FLAGS}
    values.update(given)

    warnings = _unknown_warnings(extras)
    for dest, value in given.items():
        flag = _FLAG_BY_DEST[dest]
        if not flag.modelled:
            shown = flag.names[0] if flag.kind == "bool" else f"{flag.names[0]}={_show(value)}"
            warnings.append(f"{shown} is accepted but ignored by the simulator (no effect on simulated timing)")
    notes: list[str] = []

    spec, max_running = _resolve_speculative(values, given, warnings, notes)

    context_length = int(values["context_length"] or DEFAULT_CONTEXT_LENGTH)
    if context_length < 2:
        raise SimArgError(f"--context-length must be >= 2, got {context_length}")
    chunk = values["chunked_prefill_size"]
    chunk_size = DEFAULT_CHUNKED_PREFILL_SIZE if chunk is None else int(chunk)
    if chunk_size == 0 or chunk_size < -1:
        raise SimArgError(f"--chunked-prefill-size must be positive or -1, got {chunk_size}")
    if max_running < 1:
        raise SimArgError(f"--max-running-requests must be >= 1, got {max_running}")

    nnodes, node_rank, init_addr = _resolve_nodes(values)
    model_path = str(values["model_path"])
    served = str(values["served_model_name"] or model_path)
    values.update(
        served_model_name=served,
        context_length=context_length,
        chunked_prefill_size=chunk_size,
        max_running_requests=max_running,
        cuda_graph_max_bs=values["cuda_graph_max_bs"] or DEFAULT_CUDA_GRAPH_MAX_BS,
    )
    return ServerConfig(
        model_path=model_path,
        served_model_name=served,
        tp_size=int(values["tp_size"]),
        host=str(values["host"]),
        port=int(values["port"]),
        enable_metrics=bool(values["enable_metrics"]),
        skip_server_warmup=bool(values["skip_server_warmup"]),
        decode_log_interval=int(values["decode_log_interval"]),
        stream_interval=int(values["stream_interval"]),
        context_length=context_length,
        max_running_requests=max_running,
        chunked_prefill_size=chunk_size,
        log_level=str(values["log_level"]).lower(),
        disable_cuda_graph=bool(values["disable_cuda_graph"]),
        cuda_graph_max_bs=int(values["cuda_graph_max_bs"]),
        enable_symm_mem=bool(values["enable_symm_mem"]),
        enable_nccl_nvls=bool(values["enable_nccl_nvls"]),
        spec=spec,
        speculative_draft_model_path=values["speculative_draft_model_path"],
        nnodes=nnodes,
        node_rank=node_rank,
        dist_init_addr=init_addr,
        resolved=values,
        warnings=warnings,
        notes=notes,
    )


def _resolve_nodes(values: dict[str, Any]) -> tuple[int, int, tuple[str, int] | None]:
    """--nnodes / --node-rank / --dist-init-addr, checked the way a multi-node launch needs them."""
    nnodes, rank, addr = int(values["nnodes"]), int(values["node_rank"]), values["dist_init_addr"]
    if nnodes < 1:
        raise SimArgError(f"--nnodes must be >= 1, got {nnodes}")
    if not 0 <= rank < nnodes:
        raise SimArgError(f"--node-rank must be between 0 and --nnodes - 1 = {nnodes - 1}, got {rank}")
    if nnodes == 1:
        return 1, 0, None
    host, sep, port = str(addr or "").rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise SimArgError(f"--nnodes {nnodes} needs --dist-init-addr HOST:PORT (rank 0's address), got {addr!r}")
    return nnodes, rank, (host.strip("[]"), int(port))


def _show(value: Any) -> str:
    if isinstance(value, list):
        return " ".join(str(v) for v in value)
    return str(value)


def _resolve_speculative(
    values: dict[str, Any], given: dict[str, Any], warnings: list[str], notes: list[str]
) -> tuple[SpecConfig | None, int]:
    """Apply SGLang's ServerArgs speculative rules; mutate values to the resolved settings."""
    algorithm = values["speculative_algorithm"]
    max_running = values["max_running_requests"]
    spec_params = ("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens")
    if algorithm is None:
        for dest in (*spec_params, "speculative_draft_model_path"):
            if dest in given:
                warnings.append(
                    f"{_FLAG_BY_DEST[dest].names[0]} has no effect without --speculative-algorithm (SGLang "
                    "ignores it too)"
                )
        return None, int(max_running or DEFAULT_MAX_RUNNING_REQUESTS)

    if algorithm == "NEXTN":
        # SGLang renames NEXTN to EAGLE; for MTP models the draft weights live in the target checkpoint.
        algorithm = "EAGLE"
        values["speculative_algorithm"] = "EAGLE"
        if values["speculative_draft_model_path"] is None:
            values["speculative_draft_model_path"] = values["model_path"]
            notes.append("NEXTN: speculative_draft_model_path defaults to the model path (MTP layers)")

    for dest in spec_params:
        v = values[dest]
        if v is not None and v < 1:
            raise SimArgError(f"{_FLAG_BY_DEST[dest].names[0]} must be >= 1, got {v}")

    if max_running is None:
        max_running = SPEC_MAX_RUNNING_REQUESTS
        notes.append(
            "Max running requests is reset to 48 for speculative decoding. You can override this by "
            "explicitly setting --max-running-requests."
        )

    if algorithm == "NGRAM":
        ndt = values["speculative_num_draft_tokens"] or NGRAM_DEFAULT_DRAFT_TOKENS
        if ndt < 2:
            raise SimArgError(f"--speculative-num-draft-tokens must be >= 2 for NGRAM, got {ndt}")
        steps = values["speculative_num_steps"] or ndt - 1
        topk = values["speculative_eagle_topk"] or 1
    else:
        if values["speculative_draft_model_path"] is None:
            raise SimArgError(
                f"--speculative-algorithm {algorithm} needs --speculative-draft-model-path (alias "
                "--speculative-draft-model): SGLang cannot start a draft worker without draft weights"
            )
        steps, topk, ndt = (values[d] for d in spec_params)
        if steps is None:
            if topk is not None or ndt is not None:
                raise SimArgError(
                    "--speculative-eagle-topk and --speculative-num-draft-tokens must be left unset when "
                    "--speculative-num-steps is unset (SGLang asserts this and then auto-chooses "
                    f"{AUTO_SPEC_PARAMS})"
                )
            steps, topk, ndt = AUTO_SPEC_PARAMS
            notes.append(f"speculative (num_steps, eagle_topk, num_draft_tokens) auto-chosen as {AUTO_SPEC_PARAMS}")
        if topk is None:
            topk = 1
        if ndt is None:
            ndt = steps + 1
        if topk == 1 and ndt != steps + 1:
            warnings.append(
                "speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when "
                f"speculative_eagle_topk == 1 (was {ndt}, now {steps + 1})"
            )
            ndt = steps + 1
    values.update(
        speculative_num_steps=steps,
        speculative_eagle_topk=topk,
        speculative_num_draft_tokens=ndt,
        max_running_requests=max_running,
    )
    return SpecConfig(algorithm, int(steps), int(topk), int(ndt)), int(max_running)
