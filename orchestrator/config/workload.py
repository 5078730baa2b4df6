"""A benchmark workload: how each launch is measured (BenchConfig), and the request sequence it sends."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from orchestrator.config import prompts

CLIENT_PLACES = ("host", "local")


@dataclass(frozen=True)
class BenchConfig:
    """How to benchmark one server: by default the seed's (2 warmups, 5 timed runs of 2048 tokens, 1 stream)."""

    runs: int = 5
    warmup: int = 2
    max_tokens: int = 2048
    warmup_max_tokens: int = 64
    seed: int = 0
    request_timeout_s: float = 600.0
    concurrency: tuple[int, ...] = (1,)
    requests_per_stream: int = 1  # a run at concurrency c sends c × this many requests
    endpoint: str = "generate"
    prompts: str = "builtin"  # builtin | random | path to a JSONL file
    input_len: int | None = None  # random prompts only
    client: str = "host"  # where the client runs: next to the server, or on the orch machine
    min_run_s: float = 1.0  # a timed run shorter than this is invalid (too short to measure)
    stall_timeout_s: float = 60.0  # a request with no new token for this long fails (the server hangs)
    first_token_timeout_s: float = 180.0  # ... and with no first token within this long

    def requests_per_run(self, concurrency: int) -> int:
        return concurrency * self.requests_per_stream

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "concurrency": list(self.concurrency)}


def request_items(config: BenchConfig) -> list[dict[str, Any]]:
    """Every input the benchmark will send, in order: identical for every arm (a pure function of the config)."""
    total = config.warmup + sum(config.runs * config.requests_per_run(c) for c in config.concurrency)
    return [
        it.to_dict()
        for it in prompts.request_sequence(config.prompts, total, seed=config.seed, input_len=config.input_len)
    ]
