"""Open-loop capacity of orch's client side by side with SGLang's bench_serving, against the same simulator.

Two cases, one simulator launch each (benchmarks/reference_clients.simulator: exact timing, own free port):
- **client-bound**: a server far faster than either client (short requests, 1 ms per token, 1024 slots), so the
  rate at which a client stops keeping up is the client's own;
- **server-bound**: a server with a known ceiling (--max-running-requests slots, each request holding one for
  output-1 decode steps: `slots / ((output - 1) * decode)` requests/s), offered below and above it, so both clients
  should report the same achieved rate above it: a check that they agree on a known truth.

At every rate both tools send the same number of requests (Poisson arrivals, --seconds of them, at least
--min-requests) of the same lengths to /generate: orch's open-loop client (`orchestrator/client/openloop.py`, in this
process, as `orch ab --rate` runs it) and SGLang 0.5.9's unmodified `python -m sglang.bench_serving --backend sglang
--request-rate R` (from .venv-ref; its Poisson gaps and send times noted by a wrapper, see
reference_clients.run_bench_serving_rate). Runs are paired rate by rate and interleaved A B B A, --repeats times.
Every figure is computed the same way for both from each tool's own timestamps: scheduled, sent and achieved rates
are orch's fitted_rate (1 / the least-squares slope of the due, send and completion times against their rank) of
that run; a tool keeps up at a rate when its achieved rate is within 3 % of its own schedule's (achieved >= 0.97 x
scheduled: the draw's own rate, as the two tools draw different Poisson sequences). Send lag = when a request went
out - when its schedule said. TTFT is each tool's own: orch's counts from when a request was due, bench_serving's
from when it was sent. Runs with orch's venv (`make bench`); the figures go into docs/performance.md. `--smoke`: one
short rate per case, one pair (seconds; figures mean nothing; without .venv-ref the reference side is skipped and
says so).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import reference_clients as rc

from orchestrator import engines
from orchestrator.client import runner
from orchestrator.client.summary import fitted_rate, percentile
from orchestrator.config.arrivals import schedule

SGLANG = engines.get("sglang")  # whose native generate the client speaks here

KEEP_UP = 0.97  # achieved >= 0.97 x scheduled: the tool kept up at that rate
INPUT_TOKENS = 16
ORCH = "orch open-loop client"
BENCH = "sglang.bench_serving --request-rate"


@dataclass(frozen=True)
class Case:
    name: str
    decode_ms: float
    output_tokens: int
    slots: int  # --max-running-requests
    rates: tuple[float, ...]

    @property
    def ceiling(self) -> float:
        """Requests/s the server completes at most: each holds a slot for output-1 decode steps (prefill is free)."""
        return self.slots * 1000 / ((self.output_tokens - 1) * self.decode_ms)


CLIENT_BOUND = Case("client-bound", 1.0, 8, 1024, (25, 50, 100, 200, 400, 800, 1200, 1600))
SERVER_BOUND = Case("server-bound", 10.0, 11, 20, (100, 150, 300, 400))


def _ms(values: list[float], q: float) -> float:
    p = percentile(values, q)
    return math.nan if p is None else 1000 * p


def _rates(scheduled: list[float], sent: list[float], done: list[float]) -> dict[str, float]:
    def rate(times: list[float]) -> float:
        r = fitted_rate(times)
        return math.nan if r is None else r

    s, a = rate(scheduled), rate(done)
    return {"scheduled_rate": s, "sent_rate": rate(sent), "achieved_rate": a, "kept": a / s if s > 0 else math.nan}


def run_orch(url: str, case: Case, rate: float, n: int, seed: int) -> dict[str, Any]:
    """One open-loop run of orch's client at `rate`, n requests; its figures on its own clock."""
    host, port = url.removeprefix("http://").split(":")
    times = schedule(rate, "poisson", seed=0, run=seed, requests=n)
    item = {"input_ids": [1000 + i % 500 for i in range(INPUT_TOKENS)]}
    bodies = [SGLANG.request_body("generate", item, case.output_tokens, "/m") for _ in times]
    cpu0 = time.process_time()
    s = runner.run(
        host,
        int(port),
        SGLANG.wire("generate"),
        bodies,
        [case.output_tokens] * n,
        0,
        open_loop={"schedule": times, "rate": rate, "arrivals": "poisson", "max_concurrency": None},
    )
    cpu = time.process_time() - cpu0
    reqs = s["per_request"]
    ok = [r for r in reqs if r["error"] is None and r["e2e_s"] is not None]
    sent = [r["scheduled_s"] + r["send_lag_s"] for r in reqs if r["send_lag_s"] is not None]
    done = [r["scheduled_s"] + r["e2e_s"] for r in ok]
    lags = [r["send_lag_s"] for r in reqs if r["send_lag_s"] is not None]
    span = max(done, default=math.nan) - min(sent, default=math.nan)
    return {
        "requests": n,
        "errors": s["errors"],
        **_rates(times, sent, done),
        "own_rate": s["open_loop"]["achieved_rate"],
        "out_tok_s": sum(r["tokens"] for r in ok) / span if span > 0 else math.nan,
        "ttft_p50_ms": _ms([r["ttft_s"] for r in ok if r["ttft_s"] is not None], 50),
        "ttft_p99_ms": _ms([r["ttft_s"] for r in ok if r["ttft_s"] is not None], 99),
        "itl_p50_ms": math.nan if s["itl"]["p50"] is None else 1000 * s["itl"]["p50"],  # 0.0 is a figure
        "itl_p99_ms": math.nan if s["itl"]["p99"] is None else 1000 * s["itl"]["p99"],
        "lag_p50_ms": _ms(lags, 50),
        "lag_p99_ms": _ms(lags, 99),
        "lag_max_ms": 1000 * max(lags, default=math.nan),
        "client_cores": cpu / span if span > 0 else math.nan,
    }


def run_bench(url: str, case: Case, rate: float, n: int, seed: int) -> dict[str, Any]:
    """One bench_serving run at `rate`, n requests; the same figures from its own output and the noted times."""
    r = rc.run_bench_serving_rate(
        url,
        request_rate=rate,
        num_requests=n,
        output_len=case.output_tokens,
        input_len=INPUT_TOKENS,
        backend="sglang",
        seed=seed + 1,
    )
    lags = [a - b for a, b in zip(r["sent"], r["scheduled"], strict=True)]
    ok = [i for i, t in enumerate(r["ttfts"]) if t]
    itls = [x for i in ok for x in r["itls"][i]]
    ttfts = [r["ttfts"][i] for i in ok]
    span = max(r["done"], default=math.nan) - min(r["sent"], default=math.nan)
    return {
        "requests": n,
        "errors": n - int(r["completed"] or 0),
        **_rates(r["scheduled"], r["sent"], r["done"]),
        "own_rate": r["request_throughput"],
        "out_tok_s": sum(r["output_lens"][i] for i in ok) / span if span > 0 else math.nan,
        "ttft_p50_ms": _ms(ttfts, 50),
        "ttft_p99_ms": _ms(ttfts, 99),
        "itl_p50_ms": _ms(itls, 50),
        "itl_p99_ms": _ms(itls, 99),
        "lag_p50_ms": _ms(lags, 50),
        "lag_p99_ms": _ms(lags, 99),
        "lag_max_ms": 1000 * max(lags, default=math.nan),
        "client_cores": r["cpu_s"] / span if span > 0 else math.nan,
    }


def measure(url: str, case: Case, tool: str, rate: float, n: int, seed: int) -> dict[str, Any]:
    late0, _ = rc.sim_late_iterations(url)
    fn = run_orch if tool == ORCH else run_bench
    try:
        out = fn(url, case, rate, n, seed)
    except Exception as e:  # one failed run is reported, the others still run
        out = {"failed": f"{type(e).__name__}: {str(e)[-1500:]}"}
    late1, worst = rc.sim_late_iterations(url)
    return {"tool": tool, "rate": rate, "seed": seed, **out, "sim_late": late1 - late0, "sim_worst_ms": 1000 * worst}


def run_case(case: Case, rates: list[float], tools: list[str], args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every rate: --repeats rounds of A B B A (A B in a smoke run), each pair on the same seed index."""
    rows: list[dict[str, Any]] = []
    order = tools if len(tools) < 2 or args.smoke else [tools[0], tools[1], tools[1], tools[0]]
    with rc.simulator(case.decode_ms, extra_args=["--max-running-requests", str(case.slots)]) as (url, _pid):
        for rate in rates:
            n = max(args.min_requests, round(rate * args.seconds))
            for rep in range(args.repeats):
                for k, tool in enumerate(order):
                    seed = 2 * rep + k // 2  # A B B A: each adjacent pair shares a seed index (its pairing)
                    rows.append(measure(url, case, tool, rate, n, seed))
                    print(f"  {case.name} {rate:g} req/s {tool}: {_brief(rows[-1])}", file=sys.stderr, flush=True)
    return rows


def _brief(r: dict[str, Any]) -> str:
    if "failed" in r:
        return f"FAILED {r['failed'][:200]}"
    return f"achieved/scheduled {r['kept']:.3f}, lag p99 {r['lag_p99_ms']:.2f} ms, sim late {r['sim_late']}"


def _f(x: Any, nd: int = 2) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:,.{nd}f}"


def _med(rows: list[dict[str, Any]], key: str) -> float:
    vals = [r[key] for r in rows if isinstance(r.get(key), (int, float)) and not math.isnan(r[key])]
    return statistics.median(vals) if vals else math.nan


def _spread(vals: list[float], nd: int = 3) -> str:
    vals = [v for v in vals if not math.isnan(v)]
    if not vals:
        return "—"
    med = statistics.median(vals)
    return _f(med, nd) if len(vals) == 1 else f"{_f(med, nd)} ({_f(min(vals), nd)}–{_f(max(vals), nd)})"


def keeps_up(rows: list[dict[str, Any]]) -> bool | None:
    """The median run's achieved rate within 3 % of its schedule's; None when no run completed."""
    kept = _med(rows, "kept")
    return None if math.isnan(kept) else kept >= KEEP_UP


def capacity_text(rows: list[dict[str, Any]], rates: list[float]) -> str:
    """The highest offered rate kept up with, and the first one not (rates in order)."""
    ok: float | None = None
    for rate in rates:
        verdict = keeps_up([r for r in rows if r["rate"] == rate])
        if verdict is None:
            continue
        if not verdict:
            return f"{_f(ok, 0) + ' req/s' if ok is not None else 'none'} (falls behind at {rate:g} req/s)"
        ok = rate
    return f"≥ {_f(ok, 0)} req/s (kept up at every rate tried)" if ok is not None else "none measured"


def print_case(case: Case, rates: list[float], tools: list[str], rows: list[dict[str, Any]], n_of: Any) -> None:
    print(
        f"\n## {case.name}: simulator {case.decode_ms:g} ms per token, {case.output_tokens}-token outputs, "
        f"{INPUT_TOKENS}-token prompts, --max-running-requests {case.slots} (ceiling "
        f"{case.ceiling:,.0f} req/s)\n"
    )
    print(
        "| rate (req/s) | requests | client | runs | achieved / scheduled (req/s) | achieved ÷ scheduled | "
        "tool's own req/s | output tok/s | TTFT p50 / p99 (ms) | ITL p50 / p99 (ms) | send lag p50 / p99 / max (ms) "
        "| client cores | sim late | keeps up |"
    )
    print("|---:|---:|---|---:|---|---|---:|---:|---|---|---|---:|---:|---|")
    for rate in rates:
        for tool in tools:
            rs = [r for r in rows if r["rate"] == rate and r["tool"] == tool]
            ok = [r for r in rs if "failed" not in r]
            failed = len(rs) - len(ok)
            if not ok:
                why = rs[0]["failed"].splitlines()[0][:160] if rs else "not run"
                print(f"| {rate:g} | {n_of(rate)} | {tool} | 0 | failed: {why} | | | | | | | | | |")
                continue
            verdict = keeps_up(ok)
            print(
                f"| {rate:g} | {n_of(rate)} | {tool} | {len(ok)}{f' (+{failed} failed)' if failed else ''} | "
                f"{_f(_med(ok, 'achieved_rate'), 1)} / {_f(_med(ok, 'scheduled_rate'), 1)} | "
                f"{_spread([r['kept'] for r in ok])} | {_f(_med(ok, 'own_rate'), 1)} | "
                f"{_f(_med(ok, 'out_tok_s'), 0)} | "
                f"{_f(_med(ok, 'ttft_p50_ms'))} / {_f(_med(ok, 'ttft_p99_ms'))} | "
                f"{_f(_med(ok, 'itl_p50_ms'))} / {_f(_med(ok, 'itl_p99_ms'))} | "
                f"{_f(_med(ok, 'lag_p50_ms'), 3)} / {_f(_med(ok, 'lag_p99_ms'), 3)} / "
                f"{_f(_med(ok, 'lag_max_ms'), 1)} | "
                f"{_f(_med(ok, 'client_cores'))} | {sum(r['sim_late'] for r in ok)} | {'yes' if verdict else 'no'} |"
            )
    if len(tools) == 2:
        # Each tool draws its own Poisson sequence: below the ceiling the achieved rates differ by the draws too, so
        # the first ratio compares how well each kept its own schedule; above it both should see the same ceiling.
        print(
            f"\n| rate (req/s) | achieved ÷ scheduled, {ORCH} ÷ bench_serving, per pair | achieved rate, orch ÷ "
            "bench_serving, per pair | send lag p99, bench_serving ÷ orch |"
        )
        print("|---:|---|---|---|")
        for rate in rates:
            a = [r for r in rows if r["rate"] == rate and r["tool"] == tools[0]]
            b = [r for r in rows if r["rate"] == rate and r["tool"] == tools[1]]
            pairs = [(x, y) for x in a for y in b if x["seed"] == y["seed"] and "failed" not in x and "failed" not in y]
            kept = [x["kept"] / y["kept"] for x, y in pairs]
            ratio = [x["achieved_rate"] / y["achieved_rate"] for x, y in pairs]
            lag = [y["lag_p99_ms"] / x["lag_p99_ms"] for x, y in pairs if x["lag_p99_ms"] > 0]
            print(f"| {rate:g} | {_spread(kept)} | {_spread(ratio)} | {_spread(lag, 0)} |")
    print()
    for tool in tools:
        rs = [r for r in rows if r["tool"] == tool]
        print(f"- capacity of {tool} (highest rate kept within 3 % of its schedule): {capacity_text(rs, rates)}")
    if case is SERVER_BOUND or case.ceiling < max(rates):
        over = [rate for rate in rates if rate > case.ceiling * 1.2]
        for tool in tools:
            ach = [r["achieved_rate"] for r in rows if r["tool"] == tool and r["rate"] in over and "failed" not in r]
            if ach:
                print(
                    f"- {tool} above the server's ceiling ({', '.join(f'{x:g}' for x in over)} req/s offered): "
                    f"achieved {_spread(ach, 1)} req/s against the truth {case.ceiling:,.1f}"
                )


def _load() -> str:
    try:
        return f"{os.getloadavg()[0]:.2f}"
    except OSError:
        return "unknown"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--client-rates", help="comma-separated req/s for the client-bound case (default: %(default)s)")
    ap.add_argument("--server-rates", help="comma-separated req/s for the server-bound case")
    ap.add_argument("--seconds", type=float, default=4.0, help="seconds of arrivals per run: requests = rate x this")
    ap.add_argument("--min-requests", type=int, default=200, help="at least this many requests per run")
    ap.add_argument("--repeats", type=int, default=2, help="rounds of A B B A per rate")
    ap.add_argument("--skip-reference", action="store_true", help="orch's client alone")
    ap.add_argument("--json-out", type=Path, help="also write every run as JSON here")
    ap.add_argument("--smoke", action="store_true", help="one short rate per case, one pair; figures mean nothing")
    args = ap.parse_args()
    cases = [
        (CLIENT_BOUND, [float(x) for x in args.client_rates.split(",")] if args.client_rates else CLIENT_BOUND.rates),
        (SERVER_BOUND, [float(x) for x in args.server_rates.split(",")] if args.server_rates else SERVER_BOUND.rates),
    ]
    if args.smoke:
        cases = [(CLIENT_BOUND, [50.0]), (SERVER_BOUND, [400.0])]
        args.seconds, args.min_requests, args.repeats = 0.0, 20, 1
    tools = [ORCH]
    skipped = None
    if args.skip_reference:
        skipped = "--skip-reference"
    elif not (rc.REF_PYTHON.parent.parent / ".installed").exists():
        skipped = f"{rc.REF_PYTHON.parent.parent} is not installed (`make bench` installs it)"
    else:
        tools.append(BENCH)
        rc.ensure_tokenizer()
    print(
        f"# Open-loop capacity: {' vs '.join(tools)}, Poisson arrivals, /generate, paired rate by rate "
        f"({'A B' if args.smoke or len(tools) < 2 else 'A B B A'} x {args.repeats})\n"
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"{platform.system()} {platform.release()}; load average before: {_load()}"
    )
    if skipped:
        print(f"\nreference client skipped: {skipped}; orch's side runs alone")
    t0 = time.perf_counter()
    out = []
    for case, rates in cases:
        rows = run_case(case, rates, tools, args)

        def n_of(rate: float) -> int:
            return max(args.min_requests, round(rate * args.seconds))

        print_case(case, rates, tools, rows, n_of)
        out.append({"case": case.name, "ceiling": case.ceiling, "rates": rates, "runs": rows})
    print(
        f"\nkeeps up = the median run's achieved rate within 3 % of its own schedule's (fitted rates); 'sim late' = "
        f"simulator iterations more than 10 ms late (its CPU fell behind: then the server, not only the client, "
        f"limited that rate). Whole script: {time.perf_counter() - t0:.0f} s; load average after: {_load()}"
    )
    if args.json_out:
        args.json_out.write_text(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
