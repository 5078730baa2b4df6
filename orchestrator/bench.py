"""The benchmark client: streamed generations against a ready server, measured per run."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import httpx

from orchestrator.errors import BenchError

# Short, varied prompts like the seed's (26-34 tokens); the first-order workload is decode speed, so the
# prompt only needs to be realistic, not long. Richer prompt sets come with the workload work.
PROMPTS = (
    "Explain, step by step, how a transformer decoder generates text one token at a time, and why the key-value "
    "cache makes this faster than recomputing attention from scratch for every new token.",
    "Write a Python function that merges two sorted lists into one sorted list without using the built-in sort, "
    "then explain its time and memory complexity in plain words.",
    "Summarise the main causes of the French Revolution for a high-school student, in a few clear paragraphs "
    "that cover the economic, political and social pressures of the time.",
    "A train leaves a station at 9:40 travelling at 72 km/h; a second train follows at 10:05 at 90 km/h. "
    "When and where does the second train catch up? Show your reasoning.",
    "Translate the following into French and then explain any idioms that do not carry over directly: "
    "'We will cross that bridge when we come to it, but let us not burn any bridges today.'",
    "Describe the trade-offs between tensor parallelism and pipeline parallelism when serving a very large "
    "language model on eight GPUs connected by PCIe rather than NVLink.",
)


class StreamBroken(BenchError):
    """The connection to the server broke mid-request; the server itself may be fine (e.g. SSH dropped)."""


@dataclass(frozen=True)
class BenchConfig:
    """How to benchmark one server: the seed's defaults (2 warmups, 5 timed runs of 2048 tokens)."""

    runs: int = 5
    warmup: int = 2
    max_tokens: int = 2048
    warmup_max_tokens: int = 64
    seed: int = 0
    request_timeout_s: float = 600.0


@dataclass(frozen=True)
class RunResult:
    """One streamed request; warmups are recorded too but never enter statistics."""

    index: int
    warmup: bool
    tokens: int
    seconds: float
    tok_s: float
    prompt_tokens: int
    ttft_s: float | None
    spec_accept_length: float | None = None
    spec_verify_ct: int | None = None
    valid: bool = True
    invalid_reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def pick_prompts(seed: int, n: int) -> list[str]:
    """The request sequence: a pure function of the seed, so every arm receives the identical sequence."""
    rng = random.Random(seed)
    return [rng.choice(PROMPTS) for _ in range(n)]


def stream_generate(
    client: httpx.Client, base_url: str, prompt: str, max_tokens: int, timeout_s: float
) -> tuple[int, float, int, float | None, dict[str, Any]]:
    """POST /generate (SGLang native, streamed, ignore_eos); returns tokens, seconds, prompt tokens, TTFT, meta."""
    payload = {
        "text": prompt,
        "sampling_params": {"max_new_tokens": max_tokens, "ignore_eos": True, "temperature": 0.0},
        "stream": True,
    }
    meta: dict[str, Any] = {}
    ttft: float | None = None
    t_end: float | None = None
    done = False
    t0 = time.perf_counter()
    try:
        with client.stream("POST", base_url + "/generate", json=payload, timeout=timeout_s) as resp:
            if resp.status_code != 200:
                resp.read()
                raise BenchError(f"/generate answered HTTP {resp.status_code}: {resp.text[:300]}")
            for line in resp.iter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    done = True
                    break
                now = time.perf_counter()
                try:
                    chunk = json.loads(data)
                except json.JSONDecodeError as e:
                    raise BenchError(f"/generate sent a line that is not JSON: {data[:200]!r}") from e
                meta = chunk.get("meta_info") or {}
                if ttft is None and int(meta.get("completion_tokens", 0)) > 0:
                    ttft = now - t0
                t_end = now
    except httpx.TimeoutException as e:
        raise BenchError(f"/generate timed out after {timeout_s:.0f}s ({type(e).__name__})") from e
    except httpx.TransportError as e:
        got = meta.get("completion_tokens", 0)
        raise StreamBroken(f"the server dropped the stream after {got} tokens: {type(e).__name__}: {e}") from e
    if not done:
        raise StreamBroken(f"the stream ended without [DONE] after {meta.get('completion_tokens', 0)} tokens")
    if t_end is None:
        raise BenchError("/generate streamed no data")
    return int(meta.get("completion_tokens", 0)), t_end - t0, int(meta.get("prompt_tokens", 0)), ttft, meta


MAX_RECOVERIES = 3


def run_benchmark(
    base_url: str,
    config: BenchConfig,
    on_run: Callable[[RunResult], None] | None = None,
    recover: Callable[[StreamBroken], bool] | None = None,
) -> list[RunResult]:
    """Warmups then timed runs, one stream at a time; `on_run` sees each run the moment it finishes.

    When a stream breaks, `recover` may restore the path to the server (reconnect SSH, check the server is
    alive) and return True; the interrupted run is then repeated from the start, never stitched together.
    """
    prompts = pick_prompts(config.seed, config.warmup + config.runs)
    results: list[RunResult] = []
    recoveries = 0
    with httpx.Client(timeout=httpx.Timeout(config.request_timeout_s, connect=5.0)) as client:
        for i, prompt in enumerate(prompts):
            warm = i < config.warmup
            want = config.warmup_max_tokens if warm else config.max_tokens
            while True:
                try:
                    tokens, seconds, prompt_tokens, ttft, meta = stream_generate(
                        client, base_url, prompt, want, config.request_timeout_s
                    )
                    break
                except StreamBroken as e:
                    recoveries += 1
                    if recover is None or recoveries > MAX_RECOVERIES or not recover(e):
                        raise
            reason = None
            if tokens < want:
                reason = f"{tokens} of {want} tokens (stopped early despite ignore_eos)"
            verify = meta.get("spec_verify_ct")
            accept = meta.get("spec_accept_length")
            if accept is None and verify:
                accept = tokens / verify
            run = RunResult(
                index=i if warm else i - config.warmup,
                warmup=warm,
                tokens=tokens,
                seconds=seconds,
                tok_s=tokens / seconds if seconds > 0 else 0.0,
                prompt_tokens=prompt_tokens,
                ttft_s=ttft,
                spec_accept_length=float(accept) if accept is not None else None,
                spec_verify_ct=int(verify) if verify is not None else None,
                valid=reason is None,
                invalid_reason=reason,
            )
            results.append(run)
            if on_run is not None:
                on_run(run)
    return results
