"""A run's records reduced to what is stored and compared: percentiles, ITL, steady-window tok/s, validity."""

from __future__ import annotations

import math
from typing import Any

from orchestrator.client.metrics import prefix_cache
from orchestrator.client.request import Record, kept_output


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


# An open-loop run (or level) whose requests completed more than this much slower than they were scheduled is flagged
# as not having served its rate.
SHORTFALL = 0.05


def fitted_rate(times: list[float]) -> float | None:
    """Events per second: 1 / the least-squares slope of the sorted times against their rank. Unlike count / span it
    does not hang on the first and last event alone (one slow last request would otherwise pull a whole run's
    achieved rate down). None below two events or without spread."""
    t = sorted(times)
    n = len(t)
    if n < 2:
        return None
    mid, mean = (n - 1) / 2, sum(t) / n
    sxx = sum((i - mid) ** 2 for i in range(n))
    slope = sum((i - mid) * (x - mean) for i, x in enumerate(t)) / sxx
    return 1.0 / slope if slope > 0 else None


def limit_of(achieved_ratio: float | None, sent_ratio: float | None, held_fraction: float) -> str | None:
    """Who kept an open-loop run (or level) below its rate: None when it completed its requests within SHORTFALL
    of the schedule's rate; "client" when the client sent them late (its own sends fell behind, or the
    --max-concurrency cap held requests back); else "server" (sent on time, answered late: they piled up)."""
    if achieved_ratio is None or achieved_ratio >= 1 - SHORTFALL:
        return None
    if (sent_ratio is not None and sent_ratio < 1 - SHORTFALL) or held_fraction >= SHORTFALL:
        return "client"
    return "server"


def lag_text(seconds: float) -> str:
    """A send lag for people: 0.03 ms, 42 ms, 5.77 s."""
    if seconds < 0.1:
        return f"{seconds * 1000:.2f} ms"
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"


def limit_reason(ol: dict[str, Any]) -> str | None:
    """An open-loop summary's shortfall in words: how far below the rate, and what held it back."""
    limit = ol.get("limited")
    if limit is None:
        return None
    lag = (ol.get("send_lag") or {}).get("p99")
    lag_said = f"send lag p99 {lag_text(lag)}" if lag is not None else "no send lag measured"
    head = (
        f"completed {ol.get('achieved_rate') or 0:.2f} req/s of the {ol.get('scheduled_rate') or 0:.2f} scheduled "
        f"({ol.get('offered_rate') or 0:g} offered)"
    )
    if limit == "client":
        if ol.get("held"):
            wait = (ol.get("queue_wait") or {}).get("p99")
            return (
                f"{head}: limited by the client: the --max-concurrency {ol.get('max_concurrency')} cap held "
                f"{ol.get('held')} of {ol.get('requests')} requests back"
                + (f" (wait p99 {wait:.2f}s, counted in their latency)" if wait is not None else "")
            )
        return (
            f"{head}: limited by the client: it sent {ol.get('sent_rate') or 0:.2f} req/s, behind its schedule "
            f"({lag_said})"
        )
    stopped = ol.get("stopped")
    if stopped:
        return (
            f"limited by the {stopped.get('limited') or 'server'}, {stopped.get('reason')}: sending stopped at "
            f"{stopped.get('at_s', 0):.1f}s after {stopped.get('sent')} of {stopped.get('of')} requests (those sent "
            "finished and are measured)"
        )
    return (
        f"{head}: limited by the server: requests went out on time ({lag_said}) but piled up, up to "
        f"{ol.get('peak_in_flight')} in flight at once"
    )


def client_limited(stopped: dict[str, Any]) -> str:
    """Why an open-loop run that filled its client is invalid, and what to do about it."""
    cut = stopped.get("cut")
    return (
        f"client-limited: {stopped.get('reason')}; sending stopped at {stopped.get('at_s', 0):.2f}s after "
        f"{stopped.get('sent')} of {stopped.get('of')} requests"
        + (f" (the {cut} then in flight were cut, not measured)" if cut else "")
        + ": the run did not apply its schedule and measures this client's limit, not the server's; raise the "
        "open-file limit (ulimit -n) where the client runs, lower --rate, or cap the requests in flight with "
        "--max-concurrency"
    )


def open_loop_summary(records: list[Record], info: dict[str, Any]) -> dict[str, Any]:
    """An open-loop run against its schedule: the rates offered, scheduled, sent and achieved (fitted_rate of the
    due, send and completion times), the send lag behind schedule, the requests the --max-concurrency cap held back,
    and whether (and why) it fell short of its rate. A run that stopped sending early is measured on the requests
    sent; its "schedule" says the whole schedule's size and rate (info["schedule"], the due times)."""
    n = len(records)
    sent = [r for r in records if r.sent is not None]
    ok = [r for r in records if r.error is None and r.end is not None]
    scheduled_rate = fitted_rate([r.start for r in records])
    sent_rate = fitted_rate([r.sent for r in sent if r.sent is not None])
    achieved_rate = fitted_rate([r.end for r in ok if r.end is not None])
    held = [r.queued for r in records if r.queued > 0]
    lags = [r.sent - r.start for r in sent if r.sent is not None]
    achieved_ratio = achieved_rate / scheduled_rate if achieved_rate and scheduled_rate else None
    sent_ratio = sent_rate / scheduled_rate if sent_rate and scheduled_rate else None
    out: dict[str, Any] = {
        "rate": info.get("rate"),
        "arrivals": info.get("arrivals"),
        "max_concurrency": info.get("max_concurrency"),
        "requests": n,
        "sent": len(sent),
        "completed": len(ok),
        "offered_rate": info.get("rate"),
        "scheduled_rate": scheduled_rate,
        "sent_rate": sent_rate,
        "achieved_rate": achieved_rate,
        "achieved_ratio": achieved_ratio,
        "send_lag": {**_dist(lags), "max": max(lags, default=None)},
        "held": len(held),
        "queue_wait": _dist(held),
        "peak_in_flight": info.get("peak_in_flight"),
        "limited": limit_of(achieved_ratio, sent_ratio, len(held) / n if n else 0.0),
    }
    stopped = info.get("stopped")
    if stopped:
        # Sending stopped because the server (or the client) could not keep up: its limit, whatever the rates of
        # the part sent say. Runs stored before the client could be the one say nothing: the server.
        out["stopped"] = stopped
        out["limited"] = stopped.get("limited") or "server"
        schedule = info.get("schedule")
        if isinstance(schedule, list):
            # The rates above are of the part sent; the seeded schedule's own draw is the whole one's.
            out["schedule"] = {"requests": len(schedule), "rate": fitted_rate([float(t) for t in schedule])}
    out["limit_reason"] = limit_reason(out)
    return out


def turn_summary(ok: list[Record]) -> list[dict[str, Any]]:
    """Per turn of the multi-turn sessions (1: the first), over its successful requests: TTFT, tok/s per stream,
    prompt tokens and those the server took from its prefix cache (where it said): a later turn resends the
    conversation so far, which is where the cache shows."""
    out = []
    for turn in sorted({r.turn for r in ok if r.turn is not None}):
        rs = [r for r in ok if r.turn == turn]
        ttft = [r.ttft for r in rs if r.ttft is not None]
        rates = [r.tokens / r.e2e for r in rs if r.e2e]
        cached = [r.cached_tokens for r in rs if r.cached_tokens is not None]
        prompt = sum(r.prompt_tokens for r in rs)
        out.append(
            {
                "turn": turn + 1,
                "requests": len(rs),
                "ttft_s": percentile(ttft, 50),
                "tok_s": sum(rates) / len(rates) if rates else None,
                "prompt_tokens": prompt,
                "cached_tokens": sum(cached) if len(cached) == len(rs) else None,
            }
        )
    return out


def summarize_run(
    records: list[Record],
    window: float,
    concurrency: int,
    deltas: dict[str, Any],
    min_duration_s: float,
    aborted: str | None = None,
    *,
    open_loop: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Reduce one run to its metrics and validity; what is stored and compared. `aborted`: why the run was cut
    short (the watchdog's reason), if it was. `open_loop`: the run's schedule settings (rate, arrivals, cap, peak in
    flight) for an open-loop run, whose records start when they were due (concurrency 0)."""
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
    first_wave = [r.first for r in records if not r.turn][:concurrency]  # a session's first turn starts its stream
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
            f"{len(short)} requests stopped early ({short[0].tokens} of {short[0].max_tokens} tokens, though its "
            "engine's request body asks for exactly that many)"
        )
    full = (open_loop or {}).get("stopped") or {}
    if full.get("capacity"):
        # The client could not hold the schedule's requests in flight: nothing here measures the server at its rate.
        reasons.append(client_limited(full))
    if window < min_duration_s:
        reasons.append(f"run lasted {window:.2f}s, shorter than the minimum {min_duration_s:.2f}s")
    sources = sorted({r.token_source for r in ok})
    summary: dict[str, Any] = {
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
        # its own speculative and prefix-cache counters from them when the responses did not say. Every counter,
        # whatever its name (which only the adapter knows), zeros too: no cache hit in a run, or a draft position a
        # run never reached, is a count.
        "counter_deltas": dict(deltas),
        # How much of the prompts the server took from its prefix cache (client.metrics.prefix_cache): a cache
        # warmed by earlier runs makes prefill cheaper, and arms with different hit rates are not like for like.
        "prefix_cache": prefix_cache([r.cached_tokens for r in ok], [r.prompt_tokens for r in ok]),
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
                # a multi-turn session's turn (1: the first) and the prompt tokens the server had cached
                **({"turn": r.turn + 1, "cached_tokens": r.cached_tokens} if r.turn is not None else {}),
                **(
                    {
                        "scheduled_s": r.start,
                        "send_lag_s": None if r.sent is None else r.sent - r.start,
                        "queued_s": r.queued,
                    }
                    if open_loop is not None
                    else {}
                ),
            }
            for r in records
        ],
    }
    if open_loop is not None:
        summary["open_loop"] = open_loop_summary(records, open_loop)
    if any(r.turn is not None for r in records):
        summary["turns"] = turn_summary(ok)
    accepts = [[r.accept_length, r.tokens] for r in ok if r.accept_length is not None and r.tokens > 0]
    if accepts:
        # (accept length, tokens) per request: the distribution reads without the per-request rows (results/outputs)
        summary["accept_lengths"] = accepts
    kept = [out for r in records if (out := kept_output(r)) is not None]
    if kept:
        summary["outputs"] = kept  # --check-outputs: each request's output, by its index in the run
    return summary
