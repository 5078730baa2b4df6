"""orch-sim: a stdlib-only simulator of SGLang's `python -m sglang.launch_server` and of `vllm serve`, for running
orch without a GPU: `server` (the main process, readiness, routes), `vllm_server` (the vLLM mode), `timing` (the
speed model, batching under speculation included), `knobs` (its calibration), `workers` and `workerpool` (the worker
processes), `requests`, `sinks` and `documents` (what the servers read and answer). Shipped to hosts with the agent.
"""

__all__ = [
    "args", "documents", "engine", "httpio", "knobs", "launch", "logs", "nodes", "requests", "server", "sglang_env",
    "sinks", "timing", "vllm_args", "vllm_server", "workerpool", "workers",
]  # fmt: skip
