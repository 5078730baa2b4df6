"""A run's records reduced to what is stored and compared: percentiles, ITL, steady-window tok/s, validity."""

from __future__ import annotations

import math
from typing import Any

from orchestrator.client.request import Record


def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (q in 0..100); None for an empty list."""
    if not values:
        return None
    s = sorted(values)
    pos = (len(s) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def itl_samples(rec: Record) -> list[float]:
    """Per-token inter-token latencies: a chunk of k tokens after a gap g gives k samples of g/k."""
    out: list[float] = []
    for (t_prev, _), (t, k) in zip(rec.arrivals, rec.arrivals[1:], strict=False):
        n = max(1, round(k))
        out.extend([(t - t_prev) / n] * n)
    return out


# The token-arrival profile kept per request: when 0 %, 10 %, ..., 100 % of its output tokens had arrived.
ARRIVAL_STEPS = 10


def arrival_profile(rec: Record) -> list[float] | None:
    """Seconds from the request's start until each tenth of its tokens had arrived (11 values, the first the TTFT,
    the last the final token): the shape of the stream in a fixed, small size, whatever the number of tokens."""
    times = [t for t, _ in rec.arrivals]
    cumulative: list[float] = []
    for _, k in rec.arrivals:
        cumulative.append((cumulative[-1] if cumulative else 0.0) + k)
    if not cumulative or cumulative[-1] <= 0:
        return None
    total, out, i = cumulative[-1], [], 0
    for step in range(ARRIVAL_STEPS + 1):
        want = total * step / ARRIVAL_STEPS
        while i < len(cumulative) - 1 and (cumulative[i] < want or cumulative[i] <= 0):
            i += 1
        out.append(round(times[i] - rec.start, 6))
    return out


def _dist(values: list[float]) -> dict[str, float | None]:
    return {
        "mean": sum(values) / len(values) if values else None,
        "p50": percentile(values, 50),
        "p90": percentile(values, 90),
        "p99": percentile(values, 99),
    }


def summarize_run(
    records: list[Record],
    window: float,
    concurrency: int,
    deltas: dict[str, Any],
    min_duration_s: float,
    aborted: str | None = None,
) -> dict[str, Any]:
    """Reduce one run to its metrics and validity; what is stored and compared. `aborted`: why the run was cut
    short (the watchdog's reason), if it was."""
    ok = [r for r in records if r.error is None and r.end is not None]
    errors = [r for r in records if r.error is not None]
    short = [r for r in ok if r.tokens < r.max_tokens]
    itl: list[float] = []
    for r in ok:
        itl.extend(itl_samples(r))
    ttft = [r.ttft for r in ok if r.ttft is not None]
    e2e = [r.e2e for r in ok if r.e2e is not None]
    tpot = [(r.e2e - r.ttft) / (r.tokens - 1) for r in ok if r.e2e and r.ttft is not None and r.tokens > 1]
    per_stream = [r.tokens / r.e2e for r in ok if r.e2e]
    # Steady state: from the moment the first c streams all have their first token (ramp-up over) to the moment
    # the first stream runs out of work (drain begins). Tokens received inside it measure throughput at exactly
    # concurrency c. A run too short to have such an interval falls back to [0, window].
    first_wave = [r.first for r in records[:concurrency]]
    start = max((t for t in first_wave if t is not None), default=0.0)
    if any(t is None for t in first_wave) or start >= window:
        start = 0.0
    steady = window - start
    in_window = sum(k for r in records for t, k in r.arrivals if start < t <= window)
    # The run lasted until its last request stopped, a failed one included: a request that stalled for 60 s after
    # its last token must not leave the run looking 0.7 s long.
    stops = [t for r in records for t in (r.end, r.failed) if t is not None]
    wall = max(stops, default=window)
    accept, source = None, None
    if any(r.drafted is not None for r in ok):
        # llama-server leaves draft_n out of a response that drafted nothing: on a drafting server, such a request
        # ran one target pass per token (accept length 1), and leaving it out would flatter the run.
        for r in ok:
            if r.timings and r.drafted is None and r.tokens:
                r.drafted, r.accepted, r.verify_ct, r.accept_length = 0, 0, r.tokens, 1.0
    verified = [r for r in ok if r.verify_ct]
    if verified:
        accept = sum(r.tokens for r in verified) / sum(r.verify_ct or 0 for r in verified)
        source = (
            "timings (tokens / (tokens - draft_n_accepted) of this run's requests)"
            if all(r.accepted is not None for r in verified)
            else "meta_info (completion_tokens / spec_verify_ct of this run's requests)"
        )
    drafting = [r for r in ok if r.drafted is not None]
    drafted = sum(r.drafted or 0 for r in drafting)
    accepted = sum(r.accepted or 0 for r in drafting)
    reasons = [f"aborted: {aborted}"] if aborted else []
    if errors:
        reasons.append(f"{len(errors)} of {len(records)} requests failed (first: {errors[0].error})")
    if short:
        reasons.append(
            f"{len(short)} requests stopped early ({short[0].tokens} of {short[0].max_tokens} tokens "
            "despite ignore_eos)"
        )
    if window < min_duration_s:
        reasons.append(f"run lasted {window:.2f}s, shorter than the minimum {min_duration_s:.2f}s")
    sources = sorted({r.token_source for r in ok})
    return {
        "concurrency": concurrency,
        "requests": len(records),
        "errors": len(errors),
        "tokens": sum(r.tokens for r in ok),
        "seconds": wall,
        "window_s": window,
        "tok_s": sum(per_stream) / len(per_stream) if per_stream else 0.0,
        "aggregate_tok_s": in_window / steady if steady > 0 else 0.0,
        "steady_window_s": [start, window],
        "prompt_tokens": round(sum(r.prompt_tokens for r in ok) / len(ok)) if ok else 0,
        "ttft_s": percentile(ttft, 50),
        "ttft": _dist(ttft),
        "itl": _dist(itl),
        "tpot": _dist(tpot),
        "e2e": _dist(e2e),
        "chunks": sum(r.chunks for r in ok),
        "multi_token_chunks": sum(1 for r in ok for _, k in r.arrivals if k > 1),
        "token_source": sources[0] if len(sources) == 1 else ", ".join(sources),
        "spec_accept_length": accept,
        "spec_verify_ct": sum(r.verify_ct or 0 for r in verified) if verified else None,
        "accept_source": source,
        "spec": {
            "drafted": drafted if drafting else None,
            "accepted": accepted if drafting else None,
            "acceptance_rate": accepted / drafted if drafted else None,
        },
        # Deltas of the server's /metrics counters across the run ({} without /metrics): the engine adapter reads
        # its own speculative counters from them when the responses carried no per-request statistics.
        # Per draft position even when 0: positions a run never reached still count (their drafts were rejected).
        "counter_deltas": {
            k: v for k, v in deltas.items() if (v or "_per_pos_" in k) and ("spec" in k or "token" in k)
        },
        "valid": not reasons,
        "invalid_reason": "; ".join(reasons) or None,
        "aborted": aborted or None,
        "per_request": [
            {
                "index": r.index,
                "tokens": r.tokens,
                "prompt_tokens": r.prompt_tokens,
                "ttft_s": r.ttft,
                "e2e_s": r.e2e,
                "chunks": r.chunks,
                "accept_length": r.accept_length,
                "drafted": r.drafted,
                "accepted": r.accepted,
                "error": r.error,
                "arrivals_s": arrival_profile(r),
            }
            for r in records
        ],
    }
