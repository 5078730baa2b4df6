"""Reference benchmark clients (OpenAI SDK loop, SGLang's bench_serving) measured side by side against known truth."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import importlib.util
import json
import math
import os
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
REF_PYTHON = (
    REPO / ".venv-ref" / "bin" / "python"
)  # openai, sglang (--no-deps), transformers: requirements-reference.txt
MAIN_PYTHON = REPO / ".venv" / "bin" / "python"  # runs the simulator
DEFAULT_TOKENIZER_DIR = Path(tempfile.gettempdir()) / "orch-ref-tokenizer"
# bench_serving must never reach a hub: there is none here, and a benchmark should not depend on one anyway.
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
}
BENCH_SERVING_MODULES = ("sglang.benchmark.serving", "sglang.bench_serving")  # newest layout first


# ---------------------------------------------------------------------------------------------------------------
# statistics helpers


def _pct(values: Sequence[float], q: float) -> float:
    """Percentile with linear interpolation (numpy's default), so figures compare with bench_serving's np.percentile."""
    if not values:
        return math.nan
    s = sorted(values)
    pos = (len(s) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _ms_stats(prefix: str, seconds: Sequence[float]) -> dict[str, float]:
    if not seconds:
        return {f"mean_{prefix}_ms": math.nan, f"median_{prefix}_ms": math.nan, f"p99_{prefix}_ms": math.nan}
    return {
        f"mean_{prefix}_ms": 1000 * statistics.fmean(seconds),
        f"median_{prefix}_ms": 1000 * statistics.median(seconds),
        f"p99_{prefix}_ms": 1000 * _pct(seconds, 99),
    }


Arrivals = list[tuple[float, float]]  # (seconds on the run's clock, tokens that arrived then)


def steady_rate(requests: Sequence[tuple[float, Arrivals]], concurrency: int) -> dict[str, float]:
    """Aggregate tok/s in the steady window, computed the same way for every client from its own timestamps.

    `requests` are (start, arrivals) on one clock. The window opens when every request of the first wave (the first
    `concurrency` by start time) has its first token (ramp-up over) and closes at the first completion after the
    last request was sent (a stream has run out of work: the drain begins), like orch's own summary. With one wave
    of requests that is [last first token, first completion]. Requests without a token are left out.
    """
    reqs = sorted((r for r in requests if r[1]), key=lambda r: r[0])
    if not reqs:
        return {"tok_s": math.nan, "window_start": math.nan, "window_end": math.nan}
    start = max(arrivals[0][0] for _, arrivals in reqs[:concurrency])
    last_sent = reqs[-1][0]
    end = min((arrivals[-1][0] for _, arrivals in reqs if arrivals[-1][0] >= last_sent), default=math.nan)
    if not end > start:
        return {"tok_s": math.nan, "window_start": start, "window_end": end}
    tokens = sum(k for _, arrivals in reqs for t, k in arrivals if start < t <= end)
    return {"tok_s": tokens / (end - start), "window_start": start, "window_end": end}


# ---------------------------------------------------------------------------------------------------------------
# 1. OpenAI SDK loop


@dataclass
class StreamRecord:
    """What one streamed request looked like to the client."""

    ttft_s: float = math.nan
    e2e_s: float = math.nan
    tokens: int = 0  # usage.completion_tokens at the end, else the number of content chunks
    itl_s: list[float] = field(default_factory=list)  # token-weighted: a chunk of k tokens gives k samples of gap/k
    content_chunks: int = 0  # naive count: one content chunk = one token
    naive_itl_s: list[float] = field(default_factory=list)  # gaps between content chunks
    usage_per_chunk: bool = False  # did the server send cumulative usage with the chunks (continuous_usage_stats)?
    max_tokens_per_chunk: int = 0
    start_s: float = math.nan  # on the run's clock (perf_counter)
    arrivals: Arrivals = field(default_factory=list)  # token-carrying chunks: (perf_counter, tokens)
    error: str | None = None


def get_model_id(base_url: str, timeout_s: float = 10.0) -> str:
    """First model id from `GET /v1/models` (what bench_serving does too)."""
    with urllib.request.urlopen(f"{base_url.rstrip('/')}/v1/models", timeout=timeout_s) as r:
        data = json.load(r)
    return str(data["data"][0]["id"])


async def _openai_one(
    client: Any, model: str, endpoint: str, prompt: str, output_len: int, sem: asyncio.Semaphore | None
) -> StreamRecord:
    rec = StreamRecord()
    opts = {"include_usage": True, "continuous_usage_stats": True}
    extra = {"ignore_eos": True}
    async with sem if sem is not None else contextlib.nullcontext():
        t0 = rec.start_s = time.perf_counter()
        try:
            if endpoint == "chat":
                stream = await client.chat.completions.create(
                    model=model,
                    messages=[{"role": "user", "content": prompt}],
                    max_tokens=output_len,
                    temperature=0.0,
                    stream=True,
                    stream_options=opts,
                    extra_body=extra,
                )
            else:
                stream = await client.completions.create(
                    model=model,
                    prompt=prompt,
                    max_tokens=output_len,
                    temperature=0.0,
                    stream=True,
                    stream_options=opts,
                    extra_body=extra,
                )
            last_ct = 0  # cumulative usage.completion_tokens seen so far
            pending = 0  # tokens reported by usage but not yet attributed to a content chunk (e.g. the chat role chunk)
            prev: float | None = None  # arrival of the previous token-carrying chunk
            prev_naive: float | None = None
            async for chunk in stream:
                now = time.perf_counter()
                usage = getattr(chunk, "usage", None)
                ct = getattr(usage, "completion_tokens", None) if usage is not None else None
                text = ""
                if chunk.choices:
                    c0 = chunk.choices[0]
                    text = (c0.delta.content or "") if endpoint == "chat" else (c0.text or "")
                if ct is not None:
                    pending += max(0, ct - last_ct)
                    last_ct = max(last_ct, ct)
                    if chunk.choices:
                        rec.usage_per_chunk = True
                if not text:
                    continue  # role chunk, finish chunk, usage-only chunk: no token arrives with it
                # naive view: every content chunk is one token
                rec.content_chunks += 1
                if prev_naive is not None:
                    rec.naive_itl_s.append(now - prev_naive)
                prev_naive = now
                # token-weighted view
                k = pending if ct is not None else 1
                pending = 0
                if k <= 0:
                    continue
                rec.max_tokens_per_chunk = max(rec.max_tokens_per_chunk, k)
                rec.arrivals.append((now, k))
                if prev is None:
                    rec.ttft_s = now - t0
                else:
                    rec.itl_s.extend([(now - prev) / k] * k)
                prev = now
            rec.e2e_s = time.perf_counter() - t0
            rec.tokens = last_ct if last_ct > 0 else rec.content_chunks
        except Exception as e:  # a failed request is reported, not fatal for the run
            rec.error = f"{type(e).__name__}: {e}"
            rec.e2e_s = time.perf_counter() - t0
    return rec


async def _run_openai_async(
    base_url: str, concurrency: int, num_requests: int, output_len: int, prompt: str, endpoint: str, warmup: int
) -> dict[str, Any]:
    from openai import AsyncOpenAI  # imported lazily: lives in .venv-ref, not in orch's own venv

    model = get_model_id(base_url)
    client = AsyncOpenAI(base_url=f"{base_url.rstrip('/')}/v1", api_key="EMPTY", max_retries=0, timeout=3600.0)
    try:
        for _ in range(warmup):  # like bench_serving: one short request first, not counted
            await _openai_one(client, model, endpoint, prompt, min(output_len, 32), None)
        sem = asyncio.Semaphore(concurrency)
        cpu0, t0 = time.process_time(), time.perf_counter()
        recs = await asyncio.gather(
            *(_openai_one(client, model, endpoint, prompt, output_len, sem) for _ in range(num_requests))
        )
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    finally:
        await client.close()

    ok = [r for r in recs if r.error is None]
    tokens = sum(r.tokens for r in ok)
    chunks = sum(r.content_chunks for r in ok)
    itl = [x for r in ok for x in r.itl_s]
    naive_itl = [x for r in ok for x in r.naive_itl_s]
    steady = steady_rate([(r.start_s, r.arrivals) for r in ok], concurrency)
    out: dict[str, Any] = {
        "client": f"openai-sdk ({endpoint})",
        "completed": len(ok),
        "errors": [r.error for r in recs if r.error is not None][:5],
        "wall_s": wall,
        "total_output_tokens": tokens,
        "output_throughput": tokens / wall if wall > 0 else math.nan,
        "steady_tok_s": steady["tok_s"],
        "steady_window_s": steady["window_end"] - steady["window_start"],
        "stream_cpu_s": cpu,
        "stream_wall_s": wall,
        "per_stream_tok_s": statistics.fmean(r.tokens / r.e2e_s for r in ok) if ok else math.nan,
        **_ms_stats("itl", itl),
        **_ms_stats("ttft", [r.ttft_s for r in ok]),
        **_ms_stats("e2e", [r.e2e_s for r in ok]),
        "usage_per_chunk": all(r.usage_per_chunk for r in ok) if ok else False,
        "max_tokens_per_chunk": max((r.max_tokens_per_chunk for r in ok), default=0),
        "cpu_s": cpu,
        "cpu_s_per_token": cpu / tokens if tokens else math.nan,
        # what a client that equates one streamed chunk with one token reports
        "naive": {
            "total_output_tokens": chunks,
            "output_throughput": chunks / wall if wall > 0 else math.nan,
            "per_stream_tok_s": statistics.fmean(r.content_chunks / r.e2e_s for r in ok) if ok else math.nan,
            **_ms_stats("itl", naive_itl),
        },
    }
    return out


def run_openai(
    base_url: str,
    *,
    concurrency: int,
    num_requests: int,
    output_len: int,
    prompt: str = "Tell me a long story about a server.",
    endpoint: str = "completions",
    warmup: int = 1,
) -> dict[str, Any]:
    """Stream `num_requests` requests, `concurrency` at a time, through the official `openai` AsyncOpenAI client.

    Returns aggregate output tok/s (tokens / wall), mean per-stream tok/s (tokens / e2e, averaged), mean/median/p99
    ITL (token-weighted via usage deltas), TTFT and E2E in ms, client CPU time (`time.process_time()` over the timed
    phase, all threads) and its per-token cost, and under "naive" the same figures counting one chunk as one token.
    """
    if endpoint not in ("completions", "chat"):
        raise ValueError(f"endpoint must be 'completions' or 'chat', not {endpoint!r}")
    return asyncio.run(_run_openai_async(base_url, concurrency, num_requests, output_len, prompt, endpoint, warmup))


# ---------------------------------------------------------------------------------------------------------------
# 2. SGLang's bench_serving


def _sim_words() -> list[str]:
    """The simulator's output vocabulary (one word = one token), so bench_serving's re-tokenisation counts right."""
    sys.path.insert(0, str(REPO))
    try:
        from orchestrator.sim.engine import WORDS  # stdlib-only module

        return list(WORDS)
    finally:
        sys.path.remove(str(REPO))


def make_tokenizer(path: Path) -> None:
    """Write a word-level fast tokenizer (`save_pretrained` layout) that `AutoTokenizer.from_pretrained` loads offline.

    Vocabulary: <unk>=0, <s>=1, </s>=2 (the simulator's EOS id) and the simulator's output words. No post-processor,
    so `num_special_tokens_to_add()` is 0; decoding joins words with spaces, which the simulator counts one per word.
    Needs `tokenizers` and `transformers` (the reference venv).
    """
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab: dict[str, int] = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for w in _sim_words():
        vocab.setdefault(w, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>", model_max_length=131072
    )
    path.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(path))


def ensure_tokenizer(path: Path = DEFAULT_TOKENIZER_DIR, python: Path = REF_PYTHON) -> Path:
    """Create the local tokenizer directory if missing, in the reference venv's interpreter (works from any venv)."""
    if not (path / "tokenizer.json").is_file():
        cmd = [str(python), str(Path(__file__).resolve()), "make-tokenizer", str(path)]
        proc = subprocess.run(cmd, env=_offline_env(), capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"making the tokenizer failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return path


def _bench_serving_module(python: Path) -> str:
    for mod in BENCH_SERVING_MODULES:
        probe = f"import importlib.util, sys; sys.exit(0 if importlib.util.find_spec({mod!r}) else 1)"
        if subprocess.run([str(python), "-c", probe], capture_output=True).returncode == 0:
            return mod
    raise RuntimeError(f"neither of {BENCH_SERVING_MODULES} is importable by {python}")


def _child_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _offline_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(OFFLINE_ENV)
    env.pop("PYTHONPATH", None)
    return env


# Runs bench_serving unmodified, as `python -m MODULE ARGS` would, but first imports it so that the CPU time of the
# benchmark itself (tokenizer load, prompt generation, warmup request, the run, metrics) can be told apart from the
# ~2 s of importing transformers/datasets/aiohttp. Writes that CPU time (time.process_time, all threads) to a file.
# It also notes, without changing what aiohttp does, when each request is sent (aiohttp's ClientSession._request is
# called right after bench_serving reads its start time `st`) and when each response is done with: bench_serving's
# output has each request's TTFT and ITLs but not its start, which the steady window needs; and the CPU between the
# first timed request and the last response is the streaming alone (not the tokenizer, prompts or metrics).
_WRAPPER = """\
import importlib, json, runpy, sys, time, warnings
import aiohttp
mod, out, marks_out = sys.argv[1], sys.argv[2], sys.argv[3]
importlib.import_module(mod)
marks = []
_request = aiohttp.ClientSession._request
def noted_request(self, method, url, *args, **kwargs):
    marks.append(["send", str(url), time.perf_counter(), time.process_time()])
    return _request(self, method, url, *args, **kwargs)
aiohttp.ClientSession._request = noted_request
_aexit = aiohttp.ClientResponse.__aexit__
async def noted_aexit(self, *exc):
    marks.append(["done", str(self.url), time.perf_counter(), time.process_time()])
    return await _aexit(self, *exc)
aiohttp.ClientResponse.__aexit__ = noted_aexit
sys.argv = [mod, *sys.argv[4:]]
warnings.filterwarnings("ignore", category=RuntimeWarning, module="runpy")
t = time.process_time()
try:
    runpy.run_module(mod, run_name="__main__", alter_sys=True)
finally:
    with open(out, "w") as f:
        f.write(repr(time.process_time() - t))
    with open(marks_out, "w") as f:
        json.dump(marks, f)
"""


def _bench_serving_arrivals(
    res: dict[str, Any], marks: list[list[Any]], path: str, num_requests: int
) -> tuple[list[tuple[float, Arrivals]], float, float]:
    """Each timed request's (start, token arrivals) from bench_serving's TTFTs and ITLs and the noted send times,
    plus the CPU seconds and wall seconds from the first timed send to the last response.

    bench_serving's ITL list has one entry per token (`sglang`: a chunk of k tokens after a gap g gives k entries of
    g/k) or one per chunk (`sglang-oai`); tokens not covered by it arrive with the first chunk, and per-chunk
    entries share the rest evenly (exact for one token per chunk, the capacity sweep's case).
    """
    sends = [m for m in marks if m[0] == "send" and m[1].endswith(path)]
    if len(sends) < num_requests:
        raise RuntimeError(f"noted {len(sends)} requests to {path}, expected at least {num_requests}")
    sends = sends[-num_requests:]  # the warmup request(s) came first
    dones = [m for m in marks if m[0] == "done" and m[1].endswith(path) and m[2] >= sends[0][2]]
    last = max(dones, key=lambda m: m[2]) if dones else None
    cpu = last[3] - sends[0][3] if last else math.nan
    wall = last[2] - sends[0][2] if last else math.nan
    out: list[tuple[float, Arrivals]] = []
    for send, ttft, itls, n in zip(
        sends, res.get("ttfts") or [], res.get("itls") or [], res.get("output_lens") or [], strict=False
    ):
        if not ttft or not n:
            continue
        per_entry = 1.0 if len(itls) <= n - 1 and res.get("backend") != "sglang-oai" else n / (len(itls) + 1)
        t = send[2] + ttft
        arrivals: Arrivals = [(t, n - per_entry * len(itls))]
        for gap in itls:
            t += gap
            arrivals.append((t, per_entry))
        out.append((send[2], arrivals))
    return out, cpu, wall


def _bench_serving_args(
    backend: str,
    base_url: str,
    tok: Path,
    input_len: int,
    output_len: int,
    num_requests: int,
    out_file: Path,
    *,
    seed: int,
) -> list[str]:
    """bench_serving's flags both runs share: fixed-length random-ids prompts, its detailed JSONL output, no bar."""
    return [
        "--backend", backend,
        "--base-url", base_url.rstrip("/"),
        "--tokenizer", str(tok),
        "--dataset-name", "random-ids",
        "--random-input-len", str(input_len),
        "--random-output-len", str(output_len),
        "--random-range-ratio", "1",
        "--num-prompts", str(num_requests),
        "--output-file", str(out_file),
        "--output-details",
        "--disable-tqdm",
        "--seed", str(seed),
    ]  # fmt: skip


def run_bench_serving(
    base_url: str,
    *,
    concurrency: int,
    num_requests: int,
    output_len: int,
    input_len: int,
    backend: str = "sglang",
    python: Path = REF_PYTHON,
    tokenizer_dir: Path | None = None,
    timeout_s: float = 900.0,
) -> dict[str, Any]:
    """Run `python -m sglang.bench_serving` (or `sglang.benchmark.serving`) from the reference venv as a subprocess.

    Fixed-length random-ids prompts (no dataset download), `--random-range-ratio 1`, `--max-concurrency`, request
    rate inf, one warmup request (its default), ignore_eos (its default). Returns its JSONL result plus `cpu_s`
    (RUSAGE_CHILDREN delta: the whole child, imports included), `cpu_s_run` (the child's CPU after its imports: the
    benchmark incl. tokenizer load, prompt generation and warmup) and `cpu_s_per_token` = cpu_s_run / output tokens.
    """
    tok = ensure_tokenizer(tokenizer_dir or DEFAULT_TOKENIZER_DIR, python)
    module = _bench_serving_module(python)
    with tempfile.TemporaryDirectory(prefix="orch-bench-serving-") as tmp:
        out_file, cpu_file, marks_file = Path(tmp) / "result.jsonl", Path(tmp) / "cpu_s", Path(tmp) / "marks.json"
        cmd = [
            str(python), "-c", _WRAPPER, module, str(cpu_file), str(marks_file),
            *_bench_serving_args(backend, base_url, tok, input_len, output_len, num_requests, out_file, seed=1),
            "--max-concurrency", str(concurrency),
        ]  # fmt: skip
        before, t0 = _child_cpu_s(), time.perf_counter()
        proc = subprocess.run(cmd, cwd=tmp, env=_offline_env(), capture_output=True, text=True, timeout=timeout_s)
        wall, cpu = time.perf_counter() - t0, _child_cpu_s() - before
        log = (proc.stdout or "") + (proc.stderr or "")
        if proc.returncode != 0 or not out_file.is_file():
            raise RuntimeError(f"bench_serving failed (exit {proc.returncode}):\n{log[-4000:]}")
        res: dict[str, Any] = json.loads(out_file.read_text().strip().splitlines()[-1])
        cpu_run = float(cpu_file.read_text()) if cpu_file.is_file() else math.nan
        marks = json.loads(marks_file.read_text()) if marks_file.is_file() else []
    path = "/generate" if backend == "sglang" else "/v1/completions"
    requests, stream_cpu, stream_wall = _bench_serving_arrivals(res, marks, path, num_requests)
    steady = steady_rate(requests, concurrency)

    tokens = int(res.get("total_output_tokens") or 0)
    output_lens = res.get("output_lens") or []
    itls = [x for per_req in res.get("itls") or [] for x in per_req]
    errors = [e for e in res.get("errors") or [] if e]
    mean_e2e_ms = res.get("mean_e2e_latency_ms")
    mean_len = statistics.fmean(output_lens) if output_lens else math.nan
    return {
        "client": f"sglang.bench_serving --backend {backend}",
        "module": module,
        "completed": res.get("completed"),
        "errors": errors[:5],
        "duration_s": res.get("duration"),
        "process_wall_s": wall,
        "total_output_tokens": tokens,
        "total_output_tokens_retokenized": res.get("total_output_tokens_retokenized"),
        "output_throughput": res.get("output_throughput"),
        "steady_tok_s": steady["tok_s"],
        "steady_window_s": steady["window_end"] - steady["window_start"],
        "stream_cpu_s": stream_cpu,
        "stream_wall_s": stream_wall,
        # bench_serving reports no per-stream rate; mean length / mean E2E is the closest honest reading of it
        "per_stream_tok_s": mean_len / (mean_e2e_ms / 1000) if mean_e2e_ms else math.nan,
        "mean_tpot_ms": res.get("mean_tpot_ms"),
        "mean_itl_ms": res.get("mean_itl_ms"),
        "median_itl_ms": res.get("median_itl_ms"),
        "p99_itl_ms": res.get("p99_itl_ms"),
        "itl_samples": len(itls),
        "mean_ttft_ms": res.get("mean_ttft_ms"),
        "median_ttft_ms": res.get("median_ttft_ms"),
        "p99_ttft_ms": res.get("p99_ttft_ms"),
        "mean_e2e_ms": mean_e2e_ms,
        "accept_length": res.get("accept_length"),
        "cpu_s": cpu,
        "cpu_s_run": cpu_run,
        "cpu_s_per_token": cpu_run / tokens if tokens else math.nan,
        "cpu_s_per_token_incl_imports": cpu / tokens if tokens else math.nan,
    }


# For an open-loop run the wrapper also notes each gap bench_serving draws for its Poisson schedule: get_request calls
# np.random.exponential once after yielding each request, then sleeps that long. The draw is returned unchanged; the
# schedule it meant to keep is its start plus the running sum of the gaps, so its send lag can be measured as orch's.
_ARGV_LINE = "sys.argv = [mod, *sys.argv[4:]]\n"
_NOTE_DRAWS = """\
import numpy
_exponential = numpy.random.exponential
def noted_exponential(*args, **kwargs):
    x = _exponential(*args, **kwargs)
    marks.append(["gap", float(x), time.perf_counter(), time.process_time()])
    return x
numpy.random.exponential = noted_exponential
"""
_RATE_WRAPPER = _WRAPPER.replace(_ARGV_LINE, _NOTE_DRAWS + _ARGV_LINE, 1)


def run_bench_serving_rate(
    base_url: str,
    *,
    request_rate: float,
    num_requests: int,
    output_len: int,
    input_len: int,
    backend: str = "sglang",
    seed: int = 1,
    python: Path = REF_PYTHON,
    tokenizer_dir: Path | None = None,
    timeout_s: float = 900.0,
) -> dict[str, Any]:
    """bench_serving open loop: `--request-rate R` (its Poisson arrivals), no --max-concurrency, fixed-length
    random-ids prompts, in a subprocess from the reference venv, unmodified (the wrapper only notes).

    Returns its own headline figures (request_throughput = completed / its duration, output_throughput) and, on one
    perf_counter clock: `scheduled` (when each timed request was due: the first gap's draw, when its generator
    started sleeping, plus the running sum of the gaps), `sent` (when each request reached aiohttp, in send order:
    bench_serving's own start `st` is read just before), `done` (when each response was done with), per-request
    `ttfts`, `itls`, `output_lens` (its output, from `st`), `errors`, and `cpu_s` (the child's CPU from the first
    timed send to the last response: the streaming alone).
    """
    if _ARGV_LINE not in _WRAPPER:  # the gaps would go unnoted and the send lag could not be measured
        raise RuntimeError("the bench_serving wrapper no longer sets sys.argv as run_bench_serving_rate expects")
    tok = ensure_tokenizer(tokenizer_dir or DEFAULT_TOKENIZER_DIR, python)
    module = _bench_serving_module(python)
    with tempfile.TemporaryDirectory(prefix="orch-bench-serving-") as tmp:
        out_file, cpu_file, marks_file = Path(tmp) / "result.jsonl", Path(tmp) / "cpu_s", Path(tmp) / "marks.json"
        cmd = [
            str(python), "-c", _RATE_WRAPPER, module, str(cpu_file), str(marks_file),
            *_bench_serving_args(backend, base_url, tok, input_len, output_len, num_requests, out_file, seed=seed),
            "--request-rate", f"{request_rate:g}",
        ]  # fmt: skip
        proc = subprocess.run(cmd, cwd=tmp, env=_offline_env(), capture_output=True, text=True, timeout=timeout_s)
        log = (proc.stdout or "") + (proc.stderr or "")
        if proc.returncode != 0 or not out_file.is_file():
            raise RuntimeError(f"bench_serving failed (exit {proc.returncode}):\n{log[-4000:]}")
        res: dict[str, Any] = json.loads(out_file.read_text().strip().splitlines()[-1])
        marks = json.loads(marks_file.read_text()) if marks_file.is_file() else []
    path = "/generate" if backend == "sglang" else "/v1/completions"
    sends = [m for m in marks if m[0] == "send" and m[1].endswith(path)]
    gaps = [m for m in marks if m[0] == "gap"]
    if len(sends) < num_requests or len(gaps) < num_requests - 1:
        raise RuntimeError(f"noted {len(sends)} sends and {len(gaps)} gaps, expected {num_requests} of each")
    sends = sends[-num_requests:]  # the warmup request came first
    dones = [m for m in marks if m[0] == "done" and m[1].endswith(path) and m[2] >= sends[0][2]]
    origin = min(gaps[0][2], sends[0][2])
    scheduled = [origin]
    for gap in gaps[: num_requests - 1]:
        scheduled.append(scheduled[-1] + gap[1])
    last = max(dones, key=lambda m: m[2]) if dones else None
    return {
        "client": f"sglang.bench_serving --backend {backend} --request-rate {request_rate:g}",
        "module": module,
        "completed": res.get("completed"),
        "errors": [e for e in res.get("errors") or [] if e],
        "duration_s": res.get("duration"),
        "request_throughput": res.get("request_throughput"),
        "output_throughput": res.get("output_throughput"),
        "scheduled": scheduled,
        "sent": [m[2] for m in sends],
        "done": [m[2] for m in dones],
        "ttfts": res.get("ttfts") or [],
        "itls": res.get("itls") or [],
        "output_lens": res.get("output_lens") or [],
        "cpu_s": last[3] - sends[0][3] if last else math.nan,
    }


# ---------------------------------------------------------------------------------------------------------------
# 3. the simulator and the side-by-side demo


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def sim_env(decode_ms: float, seed: int = 1) -> dict[str, str]:
    """Knobs that make the simulator exact: per-stream tok/s = 1000 / decode_ms, ITL = decode_ms, TTFT ≈ 0."""
    return {
        "ORCH_SIM_LOAD_S": "0",
        "ORCH_SIM_WARMUP_S": "0",
        "ORCH_SIM_DECODE_MS": str(decode_ms),
        "ORCH_SIM_JITTER": "0",
        "ORCH_SIM_LAUNCH_NOISE": "0",
        "ORCH_SIM_BATCH_SLOPE": "0",
        "ORCH_SIM_PREFILL_MS": "0",
        "ORCH_SIM_PREFILL_PER_TOKEN_MS": "0",
        "ORCH_SIM_SEED": str(seed),
    }


def _http_status(url: str, timeout_s: float) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except OSError:
        return 0


def _proc_cpu_s(pid: int) -> float:
    """utime + stime of one process from /proc (Linux); NaN elsewhere."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return math.nan


def sim_late_iterations(base_url: str) -> tuple[int, float]:
    """The simulator's own count of decode iterations that ran late (its CPU could not keep up) and the worst."""
    with urllib.request.urlopen(f"{base_url}/server_info", timeout=10) as r:
        info = json.load(r)
    sim = info.get("orch_sim", {})
    return int(sim.get("late_iterations", 0)), float(sim.get("max_late_s", 0.0))


@contextlib.contextmanager
def simulator(
    decode_ms: float, *, extra_args: Sequence[str] = (), log_path: Path | None = None, ready_timeout_s: float = 60.0
) -> Iterator[tuple[str, int]]:
    """Start orch-sim on a free 127.0.0.1 port in its own session; yield (base_url, pid); kill its group at the end."""
    port = free_port()
    env = dict(os.environ)
    env.update(sim_env(decode_ms))
    log = open(log_path or os.devnull, "ab")  # noqa: SIM115 - closed in finally
    proc = subprocess.Popen(
        [str(MAIN_PYTHON), "-m", "orchestrator.sim", "--model-path", "/m", "--host", "127.0.0.1", "--port", str(port),
         *extra_args],
        cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    base_url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + ready_timeout_s
        while _http_status(f"{base_url}/health_generate", 5) != 200:
            if proc.poll() is not None:
                raise RuntimeError(f"simulator exited with {proc.returncode} before it was ready")
            if time.monotonic() > deadline:
                raise TimeoutError(f"simulator not ready after {ready_timeout_s} s")
            time.sleep(0.2)
        yield base_url, proc.pid
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)  # start_new_session: its group id is its pid
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)
        # workers leave with the main process (pdeathsig / pipe EOF); make sure nothing of the group lingers
        time.sleep(0.5)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()


def _fmt(x: Any, nd: int = 1) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:,.{nd}f}"


def _print_case(title: str, truth: dict[str, float], rows: list[dict[str, Any]]) -> None:
    print(f"\n=== {title}")
    print(
        f"truth: aggregate {truth['aggregate']:,.1f} tok/s (steady state), per stream {truth['per_stream']:.1f} tok/s, "
        f"ITL {truth['itl_ms']:.3f} ms, TTFT ≈ 0 ms (prefill costs 0)"
    )
    hdr = (
        f"{'client':<42} {'agg tok/s':>10} {'steady':>10} {'stream tok/s':>12} {'ITL mean':>9} {'ITL med':>8} "
        f"{'ITL p99':>8} "
        f"{'TTFT mean':>9} {'TTFT p99':>8} {'cpu s':>7} {'cpu µs/tok':>10} {'sim late':>9}"
    )
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        if "failed" in r:
            print(f"{r['client']:<42} FAILED: {r['failed']}")
            continue
        cpu = r.get("cpu_s_run", r["cpu_s"])
        print(
            f"{r['client']:<42} {_fmt(r['output_throughput']):>10} {_fmt(r.get('steady_tok_s')):>10} "
            f"{_fmt(r['per_stream_tok_s']):>12} "
            f"{_fmt(r['mean_itl_ms'], 3):>9} {_fmt(r['median_itl_ms'], 3):>8} {_fmt(r['p99_itl_ms'], 3):>8} "
            f"{_fmt(r['mean_ttft_ms'], 2):>9} {_fmt(r['p99_ttft_ms'], 2):>8} {_fmt(cpu, 2):>7} "
            f"{_fmt(1e6 * r['cpu_s_per_token']):>10} {r.get('sim_late', '—')!s:>9}"
        )
        if "naive" in r:
            n = r["naive"]
            print(
                f"{'  ↳ same run, naive (1 chunk = 1 token)':<42} {_fmt(n['output_throughput']):>10} {'':>10} "
                f"{_fmt(n['per_stream_tok_s']):>12} {_fmt(n['mean_itl_ms'], 3):>9} {_fmt(n['median_itl_ms'], 3):>8} "
                f"{_fmt(n['p99_itl_ms'], 3):>8}"
            )
        if r.get("errors"):
            print(f"  errors: {r['errors']}")
        if r.get("cpu_s_run") is not None:
            print(
                f"  (cpu s / µs/tok: bench_serving after its imports; whole child incl. imports {r['cpu_s']:.2f} s; "
                f"accept_length={r.get('accept_length')})"
            )


def _measure(name: str, fn: Callable[[], dict[str, Any]], base_url: str, sim_pid: int) -> dict[str, Any]:
    late0, _ = sim_late_iterations(base_url)
    sim_cpu0 = _proc_cpu_s(sim_pid)
    try:
        r: dict[str, Any] = fn()
    except Exception as e:
        return {"client": name, "failed": f"{type(e).__name__}: {str(e)[-2000:]}"}
    late1, worst = sim_late_iterations(base_url)
    r["sim_late"] = late1 - late0
    r["sim_max_late_ms"] = 1000 * worst
    r["sim_main_cpu_s"] = _proc_cpu_s(sim_pid) - sim_cpu0
    return r


def demo(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--json-out", type=Path, help="also write every result as JSON here")
    p.add_argument("--requests-c1", type=int, default=4, help="requests at concurrency 1 (256 tokens each)")
    p.add_argument("--requests-c64", type=int, default=128, help="requests at concurrency 64 (512 tokens each)")
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--stream-interval", type=int, default=1, help="sim --stream-interval: >1 gives multi-token chunks")
    p.add_argument("--skip-bench-serving", action="store_true")
    p.add_argument("--sim-log", type=Path, help="append the simulator's log here")
    p.add_argument("--smoke", action="store_true", help="both cases at toy sizes (1 and 8 streams): seconds")
    args = p.parse_args(argv)

    cases = [
        ("concurrency 1, output 256, decode 12.195 ms", 1, args.requests_c1, 256, 12.195),
        ("concurrency 64, output 512, decode 3.2 ms", 64, args.requests_c64, 512, 3.2),
    ]
    if args.smoke:
        cases = [
            ("concurrency 1, output 24, decode 12.195 ms", 1, 1, 24, 12.195),
            ("concurrency 8, output 48, decode 3.2 ms", 8, 8, 48, 3.2),
        ]
    prompt = " ".join(["the"] * args.input_len)
    if not args.skip_bench_serving:
        ensure_tokenizer()
    results: list[dict[str, Any]] = []
    for title, conc, n, out_len, decode_ms in cases:
        truth = {"per_stream": 1000 / decode_ms, "aggregate": conc * 1000 / decode_ms, "itl_ms": decode_ms}
        extra = ["--stream-interval", str(args.stream_interval)] if args.stream_interval > 1 else []
        rows: list[dict[str, Any]] = []
        with simulator(decode_ms, extra_args=extra, log_path=args.sim_log) as (url, pid):
            common = {"concurrency": conc, "num_requests": n, "output_len": out_len}
            clients: list[tuple[str, Callable[[], dict[str, Any]]]] = [
                ("openai-sdk (completions)", functools.partial(run_openai, url, prompt=prompt, **common)),
                ("openai-sdk (chat)", functools.partial(run_openai, url, prompt=prompt, endpoint="chat", **common)),
            ]
            if not args.skip_bench_serving:
                for backend in ("sglang", "sglang-oai"):
                    bench = functools.partial(
                        run_bench_serving, url, input_len=args.input_len, backend=backend, **common
                    )
                    clients.append((f"sglang.bench_serving --backend {backend}", bench))
            for name, fn in clients:
                rows.append(_measure(name, fn, url, pid))
        label = f"{title}, {n} requests" + (f", stream-interval {args.stream_interval}" if extra else "")
        _print_case(label, truth, rows)
        results.append({"case": label, "truth": truth, "results": rows})
    print(
        "\nNotes: aggregate truth is the steady state (all streams decoding); 'agg tok/s' is each client's own figure "
        "(tokens / wall: ramp-up and tail included), 'steady' the same tokens counted over the steady window "
        "(steady_rate). 'sim late' counts simulator decode iterations that ran late because this host's CPU was "
        "busy — non-zero means the server side, not only the client, fell behind."
    )
    if args.json_out:
        args.json_out.write_text(json.dumps(results, indent=2, default=str))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["make-tokenizer"] and len(argv) == 2:
        make_tokenizer(Path(argv[1]))
        return 0
    if importlib.util.find_spec("openai") is None and REF_PYTHON.exists():  # e.g. started with orch's own .venv
        os.execv(REF_PYTHON, [str(REF_PYTHON), str(Path(__file__).resolve()), *argv])
    return demo(argv)


if __name__ == "__main__":
    sys.exit(main())
