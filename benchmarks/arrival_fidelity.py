"""Arrival fidelity of orch's open-loop client: how late each request goes out behind its schedule.

orch's client (`orchestrator/client/openloop.py`, as `orch ab --rate` runs it) sends a Poisson schedule at each rate
to the simulator set to an exactly known speed (benchmarks/reference_clients.simulator), for --seconds per rate.
For every request it records when it was due and when the client began it (opened its connection); the send lag is
the difference. The table gives the lag's percentiles, the rates offered, scheduled (the draw's own), sent and
achieved, the most requests in flight, the client's CPU, and the simulator's late iterations (its own CPU falling
behind, which would show as server-limited). The goal (issue 26): p99 lag <= 1 ms at 100 req/s. Runs with orch's
own venv (`make bench`); the figures go into docs/performance.md. `--smoke` runs one short rate (seconds; figures
mean nothing; tests/test_benchmarks_smoke.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import reference_clients as rc

from orchestrator import engines
from orchestrator.client import openloop, runner
from orchestrator.client.summary import percentile
from orchestrator.config.arrivals import schedule

SGLANG = engines.get("sglang")  # whose native generate the client speaks here

GOAL_P99_MS = 1.0
DECODE_MS = 2.0  # 500 tok/s per stream
OUTPUT_TOKENS = 32  # ~64 ms per request: at 100 req/s about 7 in flight
RATES = (100.0, 300.0, 1000.0)


def measure(base_url: str, rate: float, seconds: float, seed: int) -> dict[str, Any]:
    """One open-loop run at `rate` for `seconds` against base_url: the client's figures and its CPU."""
    host, port = base_url.removeprefix("http://").split(":")
    times = schedule(rate, "poisson", seed=seed, run=0, duration_s=seconds)
    item = {"input_ids": [1000 + i % 500 for i in range(16)]}
    bodies = [SGLANG.request_body("generate", item, OUTPUT_TOKENS, "/m") for _ in times]
    cpu0 = time.process_time()
    s = runner.run(
        host,
        int(port),
        SGLANG.wire("generate"),
        bodies,
        [OUTPUT_TOKENS] * len(bodies),
        0,
        open_loop={"schedule": times, "rate": rate, "arrivals": "poisson", "max_concurrency": None},
    )
    cpu = time.process_time() - cpu0
    lags = [r["send_lag_s"] * 1000 for r in s["per_request"] if r.get("send_lag_s") is not None]
    ol = s["open_loop"]
    late, worst = rc.sim_late_iterations(base_url)
    return {
        "rate": rate,
        "requests": len(times),
        "errors": s["errors"],
        "lag_p50_ms": percentile(lags, 50),
        "lag_p90_ms": percentile(lags, 90),
        "lag_p99_ms": percentile(lags, 99),
        "lag_max_ms": max(lags, default=math.nan),
        "scheduled_rate": ol["scheduled_rate"],
        "sent_rate": ol["sent_rate"],
        "achieved_rate": ol["achieved_rate"],
        "limited": ol["limited"],
        "peak_in_flight": ol["peak_in_flight"],
        "client_cores": cpu / max(s["seconds"], 1e-9),
        "sim_late_iterations": late,
        "sim_max_late_ms": worst * 1000,
    }


def timer_only(rate: float, seconds: float, seed: int) -> dict[str, Any]:
    """The same schedule waited out by the client's timer alone (openloop.until), nothing sent: the lag this machine's
    scheduler and event loop give before any request work, to tell the client's cost from the host's noise."""

    async def wait_all() -> list[float]:
        t0 = time.perf_counter()
        lags = []
        for at in times:
            await openloop.until(t0 + at)
            lags.append((time.perf_counter() - t0 - at) * 1000)
        return lags

    times = schedule(rate, "poisson", seed=seed, run=0, duration_s=seconds)
    lags = asyncio.run(wait_all())
    return {
        "rate": rate,
        "requests": len(times),
        "lag_p50_ms": percentile(lags, 50),
        "lag_p90_ms": percentile(lags, 90),
        "lag_p99_ms": percentile(lags, 99),
        "lag_max_ms": max(lags, default=math.nan),
    }


def _f(x: Any, nd: int = 2) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:,.{nd}f}"


def _load() -> str:
    """The 1-minute load average: other work on the machine shows in the tail of the lag."""
    try:
        return f"{os.getloadavg()[0]:.2f}"
    except OSError:
        return "unknown"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", default=",".join(f"{r:g}" for r in RATES), help="comma-separated requests/s")
    ap.add_argument("--seconds", type=float, default=30.0, help="seconds of arrivals per rate")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json-out", type=Path, help="also write every figure as JSON here")
    ap.add_argument("--smoke", action="store_true", help="one short rate (seconds); figures mean nothing")
    args = ap.parse_args()
    rates = [20.0] if args.smoke else [float(r) for r in args.rates.split(",")]
    seconds = 1.0 if args.smoke else args.seconds
    cpus = os.cpu_count()
    print(
        f"# Arrival fidelity: orch's open-loop client, Poisson arrivals, {seconds:g} s per rate, {OUTPUT_TOKENS}-token "
        f"requests at {1000 / DECODE_MS:.0f} tok/s per stream (simulator, exact)\n"
        f"machine: {platform.machine()}, {cpus} CPUs, Python {platform.python_version()}, {platform.system()} "
        f"{platform.release()}; one run; goal: p99 send lag <= {GOAL_P99_MS:g} ms at 100 req/s\n"
    )
    load_before = _load()
    rows = []
    with rc.simulator(DECODE_MS) as (url, _pid):
        for rate in rates:
            rows.append(measure(url, rate, seconds, args.seed))
    print(
        "| rate (req/s) | requests | send lag p50 / p90 / p99 / max (ms) | scheduled / sent / achieved (req/s) "
        "| peak in flight | client cores | simulator late iterations | limited |"
    )
    print("|---:|---:|---|---|---:|---:|---:|---|")
    for r in rows:
        print(
            f"| {r['rate']:g} | {r['requests']} | {_f(r['lag_p50_ms'], 3)} / {_f(r['lag_p90_ms'], 3)} / "
            f"{_f(r['lag_p99_ms'], 3)} / {_f(r['lag_max_ms'], 3)} | {_f(r['scheduled_rate'])} / {_f(r['sent_rate'])} "
            f"/ {_f(r['achieved_rate'])} | {r['peak_in_flight']} | {_f(r['client_cores'])} | "
            f"{r['sim_late_iterations']} (worst {_f(r['sim_max_late_ms'], 1)} ms) | {r['limited'] or 'no'} |"
        )
    timer = timer_only(rates[0], seconds, args.seed)
    print(
        f"| {timer['rate']:g}, timer alone (nothing sent) | {timer['requests']} | {_f(timer['lag_p50_ms'], 3)} / "
        f"{_f(timer['lag_p90_ms'], 3)} / {_f(timer['lag_p99_ms'], 3)} / {_f(timer['lag_max_ms'], 3)} | — | — | — | — "
        "| — |"
    )
    print(f"\nload average before / after: {load_before} / {_load()}")
    goal = next((r for r in rows if r["rate"] == 100.0), None)
    if goal is not None:
        ok = goal["lag_p99_ms"] <= GOAL_P99_MS
        print(f"\np99 send lag at 100 req/s: {goal['lag_p99_ms']:.3f} ms ({'meets' if ok else 'MISSES'} the goal)")
    if args.json_out:
        args.json_out.write_text(json.dumps({"rows": rows, "timer_only": timer}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
