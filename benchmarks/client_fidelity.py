"""orch's benchmark client against the field's clients, side by side on one simulator set to an exactly known rate.

Every client is measured the same way, from its own timestamps: aggregate tok/s over the steady window (from the
moment every stream of the first wave has its first token to the first completion after the last request was sent;
`reference_clients.steady_rate`), CPU over its streaming (first request sent to last response), per-stream tok/s as
tokens / E2E. Fidelity: |measured - true| / true at 1 stream (82 tok/s), 64 streams (20,000 tok/s aggregate) and
under multi-token chunks. Capacity: each client's highest aggregate rate tracked within 1 %, one wave of requests
(every stream sends exactly one long request, so no stream switches inside the window), the CPU cores it used
there, and its tok/s per core against the best reference client's at the same rate. orch's client runs in a
subprocess, both as it is now and as it was at `--before REF` (materialised with `git archive`), in the same run.
Runs with .venv-ref's Python (openai, sglang's bench_serving; see
benchmarks/README-reference.md). `make bench` runs this; the tables go into docs/performance.md. `--no-reference`
measures orch's clients only (from orch's own venv). `--smoke` runs every step once at toy sizes, in seconds
(tests/test_benchmarks_smoke.py); without .venv-ref it measures orch's side only and says why.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from trees import ISSUE_14_BEFORE, before_ref, materialize

REPO = Path(__file__).resolve().parent.parent
REF_PYTHON = REPO / ".venv-ref" / "bin" / "python"
CAPACITY_DECODE_MS = 2.0  # 500 tok/s per stream; the sweep raises the number of streams
CAPACITY_STREAMS = (32, 64, 96, 128, 192, 256)
DEFAULT_BEFORE = ISSUE_14_BEFORE

# Runs orch's client from whichever tree PYTHONPATH names, exactly as the host-side agent runs it (client.run is
# run_requests + summarize_run), and writes every request's start and token arrivals for the common steady window.
ORCH_RUNNER = r"""
import json, sys, time
args = json.loads(sys.argv[1])
try:  # the package layout
    from orchestrator.client import runner as client
except ImportError:  # a tree from before the packages
    from orchestrator import client
assert client.__file__.startswith(args["tree"]), client.__file__
item = {"input_ids": [1000 + i % 500 for i in range(args["input_len"])]}
n, out_len, conc = args["num_requests"], args["output_len"], args["concurrency"]
try:  # engines speak their own protocol: SGLang's native generate, vLLM's OpenAI API
    from orchestrator import engines
    speaker = engines.get("sglang" if args["endpoint"] == "generate" else "vllm")
    target = speaker.wire(args["endpoint"])
    bodies = [speaker.request_body(args["endpoint"], item, out_len, "/m") for _ in range(n)]
except AttributeError:  # a tree from before: the client built the body and knew the paths
    target = args["endpoint"]
    bodies = [client.build_body(args["endpoint"], item, out_len, "/m") for _ in range(n)]
cpu0, t0 = time.process_time(), time.perf_counter()
records, window, deltas, aborted = client._run_interruptibly(
    lambda: client.run_requests(args["host"], args["port"], target, bodies, [out_len] * n, conc, 600.0)
)
cpu, wall = time.process_time() - cpu0, time.perf_counter() - t0
s = client.summarize_run(records, window, conc, deltas, 0.0, aborted)
with open(args["out"], "w") as f:
    json.dump({
        "summary": {k: v for k, v in s.items() if k != "per_request"},
        "requests": [[r.start, r.arrivals] for r in records if r.error is None],
        "errors": [r.error for r in records if r.error is not None][:5],
        "cpu_s": cpu,
        "wall_s": wall,
    }, f)
"""


@contextlib.contextmanager
def checkout(ref: str) -> Iterator[Path]:
    """orch's package as it was at ref, in a temporary directory (git archive: no worktree left behind)."""
    with tempfile.TemporaryDirectory(prefix="orch-before-") as tmp:
        materialize(ref, Path(tmp))
        yield Path(tmp)


def run_orch(
    base_url: str,
    *,
    tree: Path,
    concurrency: int,
    num_requests: int,
    output_len: int,
    input_len: int,
    endpoint: str = "generate",
) -> dict[str, Any]:
    """orch's client from `tree` in a subprocess; its figures in the reference clients' vocabulary."""
    import reference_clients as rc

    host, port = base_url.removeprefix("http://").split(":")
    with tempfile.TemporaryDirectory(prefix="orch-client-run-") as tmp:
        out = Path(tmp) / "result.json"
        args = {
            "tree": str(tree),
            "host": host,
            "port": int(port),
            "endpoint": endpoint,
            "concurrency": concurrency,
            "num_requests": num_requests,
            "output_len": output_len,
            "input_len": input_len,
            "out": str(out),
        }
        env = {**os.environ, "PYTHONPATH": str(tree)}
        proc = subprocess.run(
            [sys.executable, "-c", ORCH_RUNNER, json.dumps(args)], cwd=tmp, env=env, capture_output=True, text=True
        )
        if proc.returncode != 0 or not out.is_file():
            raise RuntimeError(f"orch's client failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
        res = json.loads(out.read_text())
    s = res["summary"]
    steady = rc.steady_rate([(start, [tuple(a) for a in arr]) for start, arr in res["requests"]], concurrency)

    def ms(x: float | None) -> float:
        return math.nan if x is None else 1000 * x

    return {
        "output_throughput": s["aggregate_tok_s"],  # orch's own summary (the same window, from the same records)
        "steady_tok_s": steady["tok_s"],
        "steady_window_s": steady["window_end"] - steady["window_start"],
        "per_stream_tok_s": s["tok_s"],
        "mean_itl_ms": ms(s["itl"]["mean"]),
        "median_itl_ms": ms(s["itl"]["p50"]),
        "p99_itl_ms": ms(s["itl"]["p99"]),
        "mean_ttft_ms": ms(s["ttft"]["mean"]),
        "p99_ttft_ms": ms(s["ttft"]["p99"]),
        "total_output_tokens": s["tokens"],
        "stream_cpu_s": res["cpu_s"],
        "stream_wall_s": res["wall_s"],
        "errors": res["errors"],
        "valid": s["valid"],
    }


def err(measured: float | None, truth: float) -> float:
    return math.nan if measured is None or measured != measured else abs(measured - truth) / truth


def cores(r: dict[str, Any]) -> float:
    wall = r.get("stream_wall_s") or math.nan
    return float(r.get("stream_cpu_s", math.nan)) / wall


def us_per_token(r: dict[str, Any]) -> float:
    tokens = r.get("total_output_tokens") or 0
    return 1e6 * float(r.get("stream_cpu_s", math.nan)) / tokens if tokens else math.nan


Client = tuple[str, str, Callable[..., dict[str, Any]]]  # (name, kind: orch / reference, runner)


def clients(
    rc: Any, before: tuple[str, Path] | None, skip_bench_serving: bool, *, reference: bool = True, input_len: int = 128
) -> list[Client]:
    """Every client of the comparison; `before` adds orch's pre-issue client (both endpoints); `reference` the
    field's clients."""
    prompt = " ".join(["the"] * input_len)
    out: list[Client] = []
    trees = [("", REPO)] + ([(f", before ({before[0]})", before[1])] if before else [])
    for suffix, tree in trees:
        for endpoint, path in (("generate", "/generate"), ("completions", "/v1/completions")):
            out.append(
                (
                    f"orch client ({path}){suffix}",
                    "orch",
                    lambda url, t=tree, e=endpoint, **k: run_orch(url, tree=t, endpoint=e, input_len=input_len, **k),
                )
            )
    if not reference:
        return out
    out.append(("openai SDK loop (completions)", "reference", lambda url, **k: rc.run_openai(url, prompt=prompt, **k)))
    if not skip_bench_serving:
        for backend in ("sglang", "sglang-oai"):
            out.append(
                (
                    f"bench_serving --backend {backend}",
                    "reference",
                    lambda url, b=backend, **k: rc.run_bench_serving(url, input_len=input_len, backend=b, **k),
                )
            )
    return out


def measure(rc: Any, name: str, fn: Callable[..., dict[str, Any]], url: str, pid: int, **kw: Any) -> dict[str, Any]:
    r: dict[str, Any] = rc._measure(name, lambda: fn(url, **kw), url, pid)
    r["client"] = name
    return r


# ---------------------------------------------------------------- fidelity

CASES = [
    # (title, concurrency, requests, output tokens, decode ms, stream interval, with the before client)
    ("1 stream, 82 tok/s", 1, 2, 256, 12.195, 1, False),
    ("64 streams, 20,000 tok/s aggregate", 64, 64, 2048, 3.2, 1, True),
    ("1 stream, 4 tokens per chunk (like speculation)", 1, 2, 256, 12.195, 4, False),
]


# The same three cases at toy sizes: every step runs, no figure means anything.
SMOKE_CASES = [
    ("1 stream, 82 tok/s", 1, 1, 24, 12.195, 1, False),
    ("8 streams, 2,500 tok/s aggregate", 8, 8, 48, 3.2, 1, True),
    ("1 stream, 4 tokens per chunk (like speculation)", 1, 1, 24, 12.195, 4, False),
]


def fidelity(rc: Any, everyone: list[Client], cases: list[Any] = CASES) -> list[dict[str, Any]]:
    out = []
    for title, conc, n, out_len, decode_ms, interval, with_before in cases:
        # tokens / e2e of one request is N tokens over N-1 decode steps (prefill costs 0 here); the aggregate in
        # the steady window (all streams decoding) is exactly c / decode time.
        truth = {
            "per_stream": out_len / ((out_len - 1) * decode_ms / 1000),
            "aggregate": conc * 1000 / decode_ms,
            "itl_ms": decode_ms,
        }
        extra = ["--stream-interval", str(interval)] if interval > 1 else []
        rows = []
        with rc.simulator(decode_ms, extra_args=extra) as (url, pid):
            for name, _, fn in everyone:
                if "before" in name and not with_before:
                    continue
                rows.append(measure(rc, name, fn, url, pid, concurrency=conc, num_requests=n, output_len=out_len))
        out.append({"case": title, "truth": truth, "concurrency": conc, "requests": n, "rows": rows})
    return out


def print_fidelity(cases: list[dict[str, Any]]) -> None:
    print("## Fidelity: measured vs the simulator's exactly known rate (one run, same simulator per case)\n")
    for case in cases:
        t = case["truth"]
        key = "per_stream" if case["concurrency"] == 1 else "aggregate"
        what = "per stream (tokens / E2E)" if key == "per_stream" else "aggregate (steady window)"
        print(f"### {case['case']}: truth {fmt(t[key])} tok/s {what}, ITL {t['itl_ms']:.3f} ms\n")
        print(
            "| client | tok/s | tok/s error | ITL mean ms | ITL error | ITL p50 ms | TTFT p99 ms | CPU µs/token | "
            "sim late |"
        )
        print("|---|---|---|---|---|---|---|---|---|")
        for r in case["rows"]:
            if "failed" in r:
                print(f"| {r['client']} | failed: {r['failed'][:80]} | | | | | | | |")
                continue
            tok = r["per_stream_tok_s"] if key == "per_stream" else r["steady_tok_s"]
            shown = fmt(tok) if tok == tok else "no steady window"
            print(
                f"| {r['client']} | {shown} | {pct(err(tok, t[key]))} | {fmt(r['mean_itl_ms'], 3)} | "
                f"{pct(err(r['mean_itl_ms'], t['itl_ms']))} | {fmt(r['median_itl_ms'], 3)} | "
                f"{fmt(r['p99_ttft_ms'], 1)} | {fmt(us_per_token(r))} | {r.get('sim_late', '-')} |"
            )
            if "naive" in r and case["case"].startswith("1 stream, 4"):
                n = r["naive"]
                print(
                    f"| ↳ same run counted 1 chunk = 1 token | {fmt(n['per_stream_tok_s'])} | "
                    f"{pct(err(n['per_stream_tok_s'], t[key]))} | {fmt(n['mean_itl_ms'], 3)} | "
                    f"{pct(err(n['mean_itl_ms'], t['itl_ms']))} | | | | |"
                )
        print()


# ---------------------------------------------------------------- capacity


def capacity(rc: Any, everyone: list[Client], streams: tuple[int, ...], seconds: float) -> dict[str, Any]:
    """Raise the aggregate rate (more streams at 500 tok/s each) until each client misses it by more than 1 %.

    One wave per step: every stream sends one request of `seconds` worth of tokens. A client passes a step within
    1 %, and leaves the sweep at its first step above 1 % (or failed, or without a steady window: it never saw every
    stream's first token before a stream ended). A step where the simulator itself ran late in more than 1 % of its
    iterations (the 2 cores, not only the client, were saturated) has no known truth: it is run once more, and late
    again the client leaves with "machine limit" — its capacity is then at least its last clean step.
    """
    decode_ms = CAPACITY_DECODE_MS
    output_len = max(64, round(seconds * 1000 / decode_ms))
    late_limit = output_len // 100  # simulator iterations more than 10 ms late, of output_len
    active = list(everyone)
    steps: list[dict[str, Any]] = []
    verdicts: dict[str, dict[str, Any]] = {name: {"client": name, "kind": kind} for name, kind, _ in everyone}
    for conc in streams:
        if not active:
            break
        truth = conc * 1000 / decode_ms
        rows = []
        with rc.simulator(decode_ms) as (url, pid):
            for name, kind, fn in list(active):
                for attempt in (1, 2):
                    r = measure(rc, name, fn, url, pid, concurrency=conc, num_requests=conc, output_len=output_len)
                    r["error"] = err(r.get("steady_tok_s"), truth)
                    r["attempt"] = attempt
                    if "failed" in r or r.get("sim_late", 0) <= late_limit:
                        break
                rows.append(r)
                v = verdicts[name]
                if "failed" in r:
                    v["stopped"] = f"failed at {fmt(truth, 0)}: {r['failed'][:80]}"
                elif r.get("sim_late", 0) > late_limit:
                    v["stopped"] = f"simulator late at {fmt(truth, 0)} (machine limit)"
                elif r["error"] != r["error"]:
                    v["stopped"] = f"no steady window at {fmt(truth, 0)}"
                elif r["error"] > 0.01:
                    v["stopped"] = f"error {pct(r['error'])} at {fmt(truth, 0)}"
                else:
                    r["per_core"] = r["steady_tok_s"] / cores(r)
                    v.update(
                        best=truth,
                        measured=r["steady_tok_s"],
                        at_error=r["error"],
                        streams=conc,
                        cores=cores(r),
                        per_core=r["per_core"],
                        us_per_token=us_per_token(r),
                    )
                    continue
                active.remove((name, kind, fn))
        steps.append({"streams": conc, "truth": truth, "output_len": output_len, "rows": rows})
    for v in verdicts.values():
        v.setdefault("stopped", f"not reached (passed every step up to {fmt(v.get('best'), 0)})")
        v.update(compare_to_references(v["client"], steps, {name: kind for name, kind, _ in everyone}))
    return {
        "decode_ms": decode_ms,
        "output_len": output_len,
        "late_limit": late_limit,
        "steps": steps,
        "summary": list(verdicts.values()),
    }


def compare_to_references(name: str, steps: list[dict[str, Any]], kinds: dict[str, str]) -> dict[str, Any]:
    """tok/s per core against the best reference at the same rate: the highest step this client and at least one
    reference passed, where the simulator kept time. (Per-core figures improve with the rate, as more events
    arrive per wake-up, and the machine may stop one client's sweep earlier than another's: comparing each client at
    its own maximum would reward luck.)"""
    for step in reversed(steps):
        passed = {r["client"]: r["per_core"] for r in step["rows"] if "per_core" in r}
        refs = [pc for client, pc in passed.items() if kinds.get(client) == "reference"]
        if name in passed and refs:
            return {"vs_best_reference": passed[name] / max(refs), "compared_at": step["truth"]}
    return {"vs_best_reference": math.nan, "compared_at": math.nan}


def print_capacity(cap: dict[str, Any]) -> None:
    print(
        f"## Capacity: one client process, one wave of {cap['output_len']}-token requests at "
        f"{1000 / cap['decode_ms']:.0f} tok/s per stream, streams raised until the error exceeds 1 %\n"
    )
    print(
        "| client | max tok/s within 1 % | error there | CPU cores used | tok/s per core | CPU µs/token | "
        "tok/s per core vs the best reference at the same rate | sweep stopped by |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for v in cap["summary"]:
        if "per_core" not in v:
            print(f"| {v['client']} | none | | | | | | {v['stopped']} |")
            continue
        print(
            f"| {v['client']} | {fmt(v['measured'], 0)} ({v['streams']} streams) | {pct(v['at_error'])} | "
            f"{v['cores']:.2f} | {fmt(v['per_core'], 0)} | {fmt(v['us_per_token'])} | "
            f"{ratio(v['vs_best_reference'])} at {fmt(v['compared_at'], 0)} | {v['stopped']} |"
        )
    print("\nEvery step (tok/s error; CPU µs/token; simulator iterations late):\n")
    names = [v["client"] for v in cap["summary"]]
    print("| streams | true tok/s | " + " | ".join(names) + " |")
    print("|---|---|" + "---|" * len(names))
    for step in cap["steps"]:
        cells = {r["client"]: r for r in step["rows"]}
        row = []
        for name in names:
            r = cells.get(name)
            if r is None:
                row.append("")
            elif "failed" in r:
                row.append("failed")
            elif r["error"] != r["error"]:
                row.append(f"no steady window; {fmt(us_per_token(r))}; {r.get('sim_late', '-')}")
            else:
                row.append(f"{pct(r['error'])}; {fmt(us_per_token(r))}; {r.get('sim_late', '-')}")
        print(f"| {step['streams']} | {fmt(step['truth'], 0)} | " + " | ".join(row) + " |")
    print(
        f"\n'sim late': simulator iterations more than 10 ms late (it shares the 2 cores). Above {cap['late_limit']} "
        "(1 % of a request's iterations) the truth of that step is unknown; late twice, the sweep stops there for "
        "that client: the machine's limit, not (only) the client's. 'no steady window': the client never had every "
        "stream's first token before a stream ended (it fell seconds behind)."
    )


def fmt(x: Any, nd: int = 1) -> str:
    return "-" if x is None or (isinstance(x, float) and x != x) else f"{x:,.{nd}f}"


def pct(x: float) -> str:
    return "-" if x != x else f"{100 * x:.2f} %"


def ratio(x: float) -> str:
    return "-" if x != x else f"{x:.2f}x"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", default=DEFAULT_BEFORE, help="git ref of orch's pre-issue client ('' to skip)")
    ap.add_argument("--skip-bench-serving", action="store_true")
    ap.add_argument("--skip-fidelity", action="store_true")
    ap.add_argument("--skip-capacity", action="store_true")
    ap.add_argument("--capacity-streams", default=",".join(map(str, CAPACITY_STREAMS)), help="the sweep's steps")
    ap.add_argument("--capacity-seconds", type=float, default=3.0, help="length of each capacity request")
    ap.add_argument("--json-out", type=Path, help="also write every figure as JSON here")
    ap.add_argument("--no-reference", action="store_true", help="orch's clients only (no openai, no bench_serving)")
    ap.add_argument("--smoke", action="store_true", help="every step once at toy sizes (seconds); figures mean nothing")
    args = ap.parse_args()
    if args.smoke:
        args.capacity_streams, args.capacity_seconds = "4", 0.25
    try:
        streams = tuple(int(x) for x in args.capacity_streams.split(",") if x.strip())
    except ValueError:
        print(f"--capacity-streams: {args.capacity_streams!r} is not a comma-separated list of counts", file=sys.stderr)
        return 2
    if any(s < 1 for s in streams) or not math.isfinite(args.capacity_seconds) or args.capacity_seconds <= 0:
        print("--capacity-streams must be above 0 and --capacity-seconds finite and above 0", file=sys.stderr)
        return 2
    reference = not args.no_reference
    if reference and importlib.util.find_spec("openai") is None:
        # A smoke run (CI) uses .venv-ref only once `make` has finished installing it: a half-made one is not a
        # reason to fail the suite.
        if REF_PYTHON.exists() and (not args.smoke or (REF_PYTHON.parent.parent / ".installed").exists()):
            os.execv(REF_PYTHON, [str(REF_PYTHON), str(Path(__file__).resolve()), *sys.argv[1:]])
        hint = (
            "python3 -m venv .venv-ref && .venv-ref/bin/pip install --no-deps -r "
            "benchmarks/requirements-reference.txt (make bench does this)"
        )
        if not args.smoke:
            print(f"needs the reference venv: {hint}; or --no-reference for orch's clients only", file=sys.stderr)
            return 2
        reference = False
        print(f"reference clients skipped: openai is not importable here and .venv-ref is not installed ({hint})\n")
    import reference_clients as rc

    if reference and not args.skip_bench_serving:
        rc.ensure_tokenizer()
    started, load0 = time.monotonic(), os.getloadavg()
    results: dict[str, Any] = {"before": args.before or None, "reference": reference}
    with contextlib.ExitStack() as stack:
        before = None
        if args.before:
            args.before, note = before_ref(args.before, smoke=args.smoke)
            if note:
                print(note + "\n")
            before = (args.before, stack.enter_context(checkout(args.before)))
            results["before"] = args.before
        everyone = clients(rc, before, args.skip_bench_serving, reference=reference)
        if not args.skip_fidelity:
            results["fidelity"] = fidelity(rc, everyone, SMOKE_CASES if args.smoke else CASES)
            print_fidelity(results["fidelity"])
        if not args.skip_capacity:
            results["capacity"] = capacity(rc, everyone, streams, args.capacity_seconds)
            print_capacity(results["capacity"])
    wall = time.monotonic() - started
    results["machine"] = {"cpus": os.cpu_count(), "loadavg_before": load0, "loadavg_after": os.getloadavg()}
    results["wall_s"] = wall
    print(
        f"\n{os.cpu_count()} CPUs, load average {load0[0]:.2f} before and {os.getloadavg()[0]:.2f} after; "
        f"took {wall:.0f} s. Aggregate tok/s: steady window for every client; CPU: from its first request sent to "
        "its last response."
    )
    if args.json_out:
        args.json_out.write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
