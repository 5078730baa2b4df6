"""orch's benchmark client against the field's clients, side by side on one simulator set to an exactly known rate.

Fidelity: |measured - true| / true for tok/s and ITL at 1 stream (82 tok/s) and 64 streams (20,000 tok/s aggregate),
and under multi-token chunks. Capacity: the highest aggregate rate one orch client process ingests with its tok/s
error <= 1 %, and CPU time per token. Runs with .venv-ref's Python (openai, sglang's bench_serving; see
benchmarks/README-reference.md); orch's client is stdlib-only, so it runs there too. `make bench` runs this; the
tables go into docs/performance.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
REF_PYTHON = REPO / ".venv-ref" / "bin" / "python"
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from orchestrator import client  # noqa: E402


def run_orch(
    base_url: str, *, concurrency: int, num_requests: int, output_len: int, input_len: int, endpoint: str = "generate"
) -> dict[str, Any]:
    """orch's own client, in this process, exactly as the host-side agent runs it."""
    host, port = base_url.removeprefix("http://").split(":")
    item = {"input_ids": [1000 + i % 500 for i in range(input_len)]}
    bodies = [client.build_body(endpoint, item, output_len, "/m") for _ in range(num_requests)]
    cpu0, t0 = time.process_time(), time.perf_counter()
    s = client.run(host, int(port), endpoint, bodies, [output_len] * num_requests, concurrency)
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    return {
        "client": f"orch client ({endpoint})",
        "output_throughput": s["aggregate_tok_s"],
        "per_stream_tok_s": s["tok_s"],
        "mean_itl_ms": 1000 * s["itl"]["mean"],
        "median_itl_ms": 1000 * s["itl"]["p50"],
        "p99_itl_ms": 1000 * s["itl"]["p99"],
        "mean_ttft_ms": 1000 * s["ttft"]["mean"],
        "p99_ttft_ms": 1000 * s["ttft"]["p99"],
        "cpu_s": cpu,
        "cpu_s_per_token": cpu / s["tokens"] if s["tokens"] else float("nan"),
        "wall_s": wall,
        "errors": s["errors"],
        "valid": s["valid"],
    }


def err(measured: float | None, truth: float) -> float:
    return float("nan") if measured is None else abs(measured - truth) / truth


def fidelity(rc: Any, skip_bench_serving: bool) -> list[dict[str, Any]]:
    cases = [
        # (title, concurrency, requests, output tokens, decode ms, stream interval)
        ("1 stream, 82 tok/s", 1, 4, 256, 12.195, 1),
        ("64 streams, 20,000 tok/s aggregate", 64, 64, 2048, 3.2, 1),
        ("1 stream, 4 tokens per chunk (like speculation)", 1, 4, 256, 12.195, 4),
    ]
    out = []
    for title, conc, n, out_len, decode_ms, interval in cases:
        # tokens / e2e of one request is N tokens over N-1 decode steps (prefill costs 0 here); the aggregate in
        # the steady window (all streams decoding) is exactly c / decode time.
        truth = {
            "per_stream": out_len / ((out_len - 1) * decode_ms / 1000),
            "aggregate": conc * 1000 / decode_ms,
            "itl_ms": decode_ms,
        }
        extra = ["--stream-interval", str(interval)] if interval > 1 else []
        common = {"concurrency": conc, "num_requests": n, "output_len": out_len}
        rows = []
        with rc.simulator(decode_ms, extra_args=extra) as (url, pid):
            clients: list[tuple[str, Callable[[], dict[str, Any]]]] = [
                ("orch client (/generate)", lambda u=url, k=common: run_orch(u, input_len=128, **k)),
                (
                    "orch client (/v1/completions)",
                    lambda u=url, k=common: run_orch(u, input_len=128, endpoint="completions", **k),
                ),
                (
                    "openai SDK loop (completions)",
                    lambda u=url, k=common: rc.run_openai(u, prompt=" ".join(["the"] * 128), **k),
                ),
            ]
            if not skip_bench_serving:
                for backend in ("sglang", "sglang-oai"):
                    clients.append(
                        (
                            f"bench_serving --backend {backend}",
                            lambda u=url, b=backend, k=common: rc.run_bench_serving(u, input_len=128, backend=b, **k),
                        )
                    )
            for name, fn in clients:
                r = rc._measure(name, fn, url, pid)
                r["client"] = name
                rows.append(r)
        out.append({"case": title, "truth": truth, "concurrency": conc, "rows": rows})
    return out


def capacity(rc: Any) -> list[dict[str, Any]]:
    """Raise the aggregate rate until orch's client (one process) misses it by more than 1 %."""
    steps = []
    for conc, decode_ms in ((64, 3.2), (128, 3.2), (128, 2.0), (256, 2.0)):
        truth = conc * 1000 / decode_ms
        with rc.simulator(decode_ms) as (url, pid):
            r = rc._measure(
                "orch",
                lambda u=url, c=conc: run_orch(u, concurrency=c, num_requests=2 * c, output_len=512, input_len=128),
                url,
                pid,
            )
        steps.append({"concurrency": conc, "truth": truth, **r})
        if "failed" in r or err(r["output_throughput"], truth) > 0.01:
            break
    return steps


def fmt(x: Any, nd: int = 1) -> str:
    return "-" if x is None or (isinstance(x, float) and x != x) else f"{x:,.{nd}f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--skip-bench-serving", action="store_true")
    ap.add_argument("--skip-capacity", action="store_true")
    args = ap.parse_args()
    if importlib.util.find_spec("openai") is None:
        if not REF_PYTHON.exists():
            print(
                "needs the reference venv: python3 -m venv .venv-ref && .venv-ref/bin/pip install --no-deps "
                "-r benchmarks/requirements-reference.txt (make bench does this)",
                file=sys.stderr,
            )
            return 2
        os.execv(REF_PYTHON, [str(REF_PYTHON), str(Path(__file__).resolve()), *sys.argv[1:]])
    import reference_clients as rc

    if not args.skip_bench_serving:
        rc.ensure_tokenizer()
    print("## Fidelity: measured vs the simulator's exactly known rate (one run, same simulator per case)\n")
    for case in fidelity(rc, args.skip_bench_serving):
        t = case["truth"]
        key = "per_stream" if case["concurrency"] == 1 else "aggregate"
        print(
            f"### {case['case']}: truth {fmt(t[key])} tok/s {'per stream' if key == 'per_stream' else 'aggregate'},"
            f" ITL {t['itl_ms']:.3f} ms\n"
        )
        print(
            "| client | tok/s | tok/s error | ITL mean ms | ITL error | ITL p50 ms | TTFT p99 ms | CPU µs/token | "
            "sim late |"
        )
        print("|---|---|---|---|---|---|---|---|---|")
        for r in case["rows"]:
            if "failed" in r:
                print(f"| {r['client']} | failed: {r['failed'][:80]} | | | | | | | | |")
                continue
            tok = r["per_stream_tok_s"] if key == "per_stream" else r["output_throughput"]
            print(
                f"| {r['client']} | {fmt(tok)} | {100 * err(tok, t[key]):.2f} % | {fmt(r['mean_itl_ms'], 3)} | "
                f"{100 * err(r['mean_itl_ms'], t['itl_ms']):.2f} % | {fmt(r['median_itl_ms'], 3)} | "
                f"{fmt(r['p99_ttft_ms'], 1)} | {fmt(1e6 * r['cpu_s_per_token'])} | {r.get('sim_late', '-')} |"
            )
            if "naive" in r and case["case"].startswith("1 stream, 4"):
                n = r["naive"]
                print(
                    f"| ↳ same run counted 1 chunk = 1 token | {fmt(n['per_stream_tok_s'])} | "
                    f"{100 * err(n['per_stream_tok_s'], t[key]):.2f} % | {fmt(n['mean_itl_ms'], 3)} | "
                    f"{100 * err(n['mean_itl_ms'], t['itl_ms']):.2f} % | | | | |"
                )
        print()
    if not args.skip_capacity:
        print(
            "## Capacity: one orch client process (/v1/completions), aggregate rate raised until its error exceeds "
            "1 %\n"
        )
        print("| streams | true aggregate tok/s | measured | error | CPU µs/token | client CPU / wall | sim late |")
        print("|---|---|---|---|---|---|---|")
        for s in capacity(rc):
            if "failed" in s:
                print(f"| {s['concurrency']} | {fmt(s['truth'], 0)} | failed: {s['failed'][:60]} | | | | |")
                continue
            print(
                f"| {s['concurrency']} | {fmt(s['truth'], 0)} | {fmt(s['output_throughput'], 0)} | "
                f"{100 * err(s['output_throughput'], s['truth']):.2f} % | {fmt(1e6 * s['cpu_s_per_token'])} | "
                f"{s['cpu_s'] / s['wall_s']:.2f} | {s.get('sim_late', '-')} |"
            )
        print(
            "\n'sim late' > 0 means the simulator itself (same 2-core machine) fell behind: the limit is then the "
            "machine, not the client."
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
