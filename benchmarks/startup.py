"""Start-up of the orch CLI, before and after side by side: `orch --version`, `orch list` (a 100k-run store and an
empty one), `orch show` on a 3-arm, 3-level experiment, and the show's report in-process (with its bootstraps counted).

The pre-issue code (`--before REF`) is taken from git into a temporary directory and run from there
(PYTHONPATH=<that tree>, `python -m orchestrator ...`); this checkout's package is copied beside it and run the same
way, both byte-compiled first. Every measurement
alternates before and after, rep by rep, so a noisy machine slows both alike; ratios are what to read.
The store is built with the before code's schema (its own Store creates the file) and filled by direct inserts
(executemany, one transaction). The after code upgrades a copy of it in place at its first open (it adds indexes,
timed once, shown below the table); the before code only ever reads the original.
The before side runs through the CLI only (and the frozen tree's own Store to make its schema), so it keeps working
as the code changes. `--smoke`: one run per command on a small store, in seconds (tests/test_benchmarks_smoke.py).
Run with `make bench` or `python benchmarks/startup.py`; results are written up in docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from trees import ISSUE_14_BEFORE, before_ref, materialize

REPO = Path(__file__).resolve().parent.parent
BEFORE_REF = ISSUE_14_BEFORE
SHOW_ID = "20260101-000000-3level"
Row = dict[str, Any]

# In-process: the show's report as `orch show` makes it (open the store, rebuild the result, render the text), with
# every bootstrap (results.ratio_ci) counted. Works on the before and the after code alike.
# The store, from a tree of either layout.
IMPORT_STORE = """
try:
    from orchestrator.results.store import Store
except ImportError:  # a tree from before the packages
    from orchestrator.store import Store
"""

SHOW_IN_PROCESS = """
import json, sys, time
try:  # the package layout
    from orchestrator.report.text import ab_text
    from orchestrator.results import model as results
    from orchestrator.results.load import load_result
    from orchestrator.results.store import Store
except ImportError:  # a tree from before the packages (orchestrator/results.py, report.py, store.py)
    from orchestrator import results
    from orchestrator.report import ab_text
    from orchestrator.store import Store
    try:
        from orchestrator.results_load import load_result
    except ImportError:  # a tree from before results_load
        load_result = results.load_result
calls = [0]
bootstrap = results.ratio_ci
def counted(*a, **k):
    calls[0] += 1
    return bootstrap(*a, **k)
results.ratio_ci = counted
out = {"s": [], "bootstraps": []}
for _ in range(int(sys.argv[3])):
    calls[0] = 0
    t = time.perf_counter()
    store = Store(sys.argv[1])
    try:
        text = ab_text(load_result(store, sys.argv[2]))
    finally:
        store.close()
    out["s"].append(time.perf_counter() - t)
    out["bootstraps"].append(calls[0])
print(json.dumps(out))
"""


def host_facts() -> dict[str, Any]:
    return {
        "hostname": "gpu-node-07", "os": "Linux", "kernel": "6.8.0-45-generic", "machine": "x86_64",
        "python": "3.11.7", "python_executable": "/opt/venv/bin/python3", "psutil": "7.2.2", "sglang": "0.5.9",
        "torch": "2.8.0", "cpu_count": 224, "mem_total_bytes": 2164339163136, "boot_time": 1767225600.0,
        "gpus": [{"index": i, "name": "NVIDIA H200", "driver": "570.86.15", "memory.total": 143771} for i in range(8)],
        "gpu_error": None,
    }  # fmt: skip


def profile(name: str, port: int, spec: bool) -> dict[str, Any]:
    return {
        "name": name, "extends_chain": [name, "kimi-k25-int4-tp8"], "engine": "sglang",
        "model_path": "/models/Kimi-K2.5-INT4", "served_model_name": None, "tp_size": 8, "host": "127.0.0.1",
        "port": port, "trust_remote_code": True, "mem_fraction_static": None,
        "speculative": {"algorithm": "EAGLE3", "draft_model_path": "/models/Kimi-K25-eagle3", "num_steps": 3,
                        "eagle_topk": 1, "num_draft_tokens": 4} if spec else None,
        "server_args": [], "env": {"NCCL_ALGO": "Ring", "NCCL_BUFFSIZE": "16777216", "NCCL_PROTO": "LL"},
        "ready_timeout_s": 1800.0,
    }  # fmt: skip


def experiment_row(exp_id: str, created: float, arms: list[str], levels: list[int], design: dict[str, Any]) -> Row:
    profiles = [profile(a, 30000 + i, i > 0) for i, a in enumerate(arms)]
    bench = {"runs": 5, "warmup": 2, "max_tokens": 2048, "seed": 0, "concurrency": levels, "requests_per_stream": 1,
             "endpoint": "generate", "prompts": "builtin", "client": "host", "min_run_s": 1.0,
             "stall_timeout_s": 60.0, "first_token_timeout_s": 180.0}  # fmt: skip
    config = {
        "bench": bench,
        "requests_sha256": "d6e0ee7521ae32e8cf64d0926ac668fb64f939ed93d8e280685eaa890ec040e5",
        "host_facts": host_facts(),
        "strict_env": False,
        "ports": [p["port"] for p in profiles],
        "profiles": profiles,
        "profile_sources": [f"/home/me/profiles/{a}.yaml" for a in arms],
        "min_effect": 0.02,
        "target_tps": None,
        "host_spec": "gpu-node-07",
        "namespace": "orch-me",
    }
    return {
        "id": exp_id,
        "kind": "ab",
        "created_at": created,
        "finished_at": created + 900,
        "status": "complete",
        "simulated": 0,
        "host": "gpu-node-07",
        "arms_json": json.dumps(arms),
        "config_json": json.dumps(config),
        "orch_version": "0.1.0",
        "design_json": json.dumps(design),
        "owner_json": json.dumps({"pid": 4242, "create_time": created - 1, "host": "laptop"}),
    }


class Filler:
    """Rows of experiments as orch stores them: launches in a seeded random order per block, 2 warmups and then the
    timed runs at each concurrency level per launch, one per-request row per stream."""

    METRICS = json.dumps(
        {k: {"mean": 0.0122, "p50": 0.0121, "p90": 0.0127, "p99": 0.0139} for k in ("ttft", "itl", "tpot", "e2e")}
        | {"window_s": 24.9, "chunks": 2048}
    )
    ENV_REPORT = json.dumps({"processes": 10, "ok": True, "mismatches": [], "inherited": {}})
    TEARDOWN = json.dumps({"found": list(range(10)), "sigterm": True, "sigkill": [], "port_free": True, "seconds": 2.1})

    def __init__(self) -> None:
        self.rng = random.Random(0)
        self.rows: dict[str, list[Row]] = {"experiments": [], "launches": [], "runs": [], "requests": []}

    def add(
        self, exp_id: str, arms: list[str], levels: list[int], blocks: int, start: float, speed: list[float]
    ) -> None:
        order = [self.rng.sample(range(len(arms)), len(arms)) for _ in range(blocks)]
        auto = {"min_blocks": 3, "max_blocks": 8, "alpha": 0.05, "spending": "pocock"}  # `orch ab`'s default
        design = {"blocks": blocks, "order": "random", "seed": 7, "schedule": order, "auto": auto}
        self.rows["experiments"].append(experiment_row(exp_id, start, arms, levels, design))
        for b, positions in enumerate(order):
            shift = self.rng.gauss(1, 0.01)  # restart-to-restart noise
            for pos, arm in enumerate(positions):
                lid = f"orch-me:{exp_id}-{b}-{arm}"
                at = start + (b * len(arms) + pos) * 120
                self.rows["launches"].append(self.launch(lid, exp_id, arms[arm], arm, b, pos, at))
                plan = [(1, 1, i) for i in range(2)] + [(0, c, i) for c in levels for i in range(5)]
                for warmup, c, i in plan:
                    tok_s = speed[arm] * shift * self.rng.gauss(1, 0.003) / (1 + 0.01 * (c - 1))
                    self.rows["runs"].append(self.run(lid, warmup, c, i, tok_s, arm > 0, at + 30))
                    self.rows["requests"] += [
                        {"launch_id": lid, "run_warmup": warmup, "run_concurrency": c, "run_idx": i, "idx": j,
                         "tokens": 2048, "prompt_tokens": 120, "ttft_s": 0.05, "e2e_s": 2048 / tok_s, "chunks": 2048}
                        for j in range(c)
                    ]  # fmt: skip

    def launch(self, lid: str, exp_id: str, name: str, arm: int, block: int, position: int, at: float) -> Row:
        return {
            "launch_id": lid,
            "experiment_id": exp_id,
            "arm_index": arm,
            "profile": name,
            "profile_json": json.dumps(profile(name, 30000 + arm, arm > 0)),
            "argv_json": json.dumps(["python3", "-m", "sglang.launch_server", "--tp-size", "8"]),
            "env_json": "{}",
            "pid": 1000 + arm,
            "started_at": at,
            "ready_s": 95.0,
            "preflight_json": "{}",
            "env_report_json": self.ENV_REPORT,
            "teardown_json": self.TEARDOWN,
            "status": "complete",
            "block": block,
            "position": position,
        }

    def run(self, lid: str, warmup: int, c: int, i: int, tok_s: float, spec: bool, at: float) -> Row:
        return {
            "launch_id": lid,
            "idx": i,
            "warmup": warmup,
            "concurrency": c,
            "tokens": 2048,
            "seconds": 2048 / tok_s,
            "tok_s": tok_s,
            "aggregate_tok_s": tok_s * c,
            "prompt_tokens": 120,
            "ttft_s": 0.05,
            "spec_accept_length": 2.9 if spec else None,
            "spec_verify_ct": 700 if spec else None,
            "accept_source": "meta_info" if spec else None,
            "token_source": "meta_info",
            "requests": c,
            "errors": 0,
            "metrics_json": self.METRICS,
            "valid": 1,
            "finished_at": at,
        }


def fill(db: Path, experiments: int, show_levels: list[int]) -> dict[str, int]:
    """`experiments` ordinary A/B experiments (2 arms x 3 blocks, 2 warmups + 5 timed runs per launch, one request per
    run) and the 3-arm, 3-level experiment `orch show` reads; direct inserts in one transaction."""
    filler = Filler()
    for n in range(experiments):
        exp_id = f"20250101-{n:06d}-{n * 7919 % 65536:04x}"
        filler.add(exp_id, ["baseline", "eagle3-3step"], [1], 3, 1735689600.0 + n * 3600, [82.2, 110.0])
        if n == experiments // 2:  # in the middle: neither the newest nor the oldest
            arms = ["baseline", "eagle3-3step", "eagle3-5step"]
            filler.add(SHOW_ID, arms, show_levels, 3, 1735689600.0 + n * 3600 + 1, [82.2, 110.0, 104.5])
    conn = sqlite3.connect(db)
    with conn:
        for table, rows in filler.rows.items():
            names = list(rows[0])
            sql = f"INSERT INTO {table} ({', '.join(names)}) VALUES ({', '.join('?' * len(names))})"
            conn.executemany(sql, ([row.get(n) for n in names] for row in rows))
    conn.close()
    return {table: len(rows) for table, rows in filler.rows.items()}


def run(tree: Path | None, argv: list[str], env: dict[str, str]) -> float:
    """Wall time of one whole process (start-up, work, exit); output discarded, failure raised. It runs in the
    store's directory: `python -m` puts the working directory first on sys.path, ahead of PYTHONPATH."""
    e = {**env, "PYTHONPATH": str(tree)} if tree is not None else env
    t = time.perf_counter()
    done = subprocess.run(argv, env=e, cwd=env["ORCH_BENCH_DIR"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True)  # fmt: skip
    elapsed = time.perf_counter() - t
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} (PYTHONPATH={tree}) failed ({done.returncode}): {done.stderr[-2000:]}")
    return elapsed


def stats_ms(values: list[float]) -> dict[str, float]:
    return {"median_ms": statistics.median(values) * 1000, "min_ms": min(values) * 1000}


def prepare(tmp: Path, ref: str, experiments: int, env: dict[str, str]) -> dict[str, Any]:
    """The before tree, and the stores: made by the before code's Store (its schema), filled, then copied for the
    after code, which upgrades its copies at their first open."""
    before_tree, after_tree = tmp / "before", tmp / "after"
    materialize(ref, before_tree)
    shutil.copytree(REPO / "orchestrator", after_tree / "orchestrator", ignore=shutil.ignore_patterns("__pycache__"))
    for tree in (before_tree, after_tree):
        # Byte-compiled, as pip installs a package: otherwise each run would compile every module it imports again
        # (where PYTHONDONTWRITEBYTECODE is set) and measure the compiler.
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree)], check=True)
    dbs: dict[str, dict[str, Path]] = {"before": {}, "after": {}}
    for kind in ("big", "empty"):
        path = tmp / f"{kind}-before.db"
        run(
            before_tree,
            [sys.executable, "-c", f"{IMPORT_STORE}\nStore({str(path)!r})"],
            env,
        )
        dbs["before"][kind] = path
    t = time.perf_counter()
    counts = fill(dbs["before"]["big"], experiments, [1, 8, 32])
    build_s = time.perf_counter() - t
    upgrade_s: dict[str, float] = {}
    for kind, path in dbs["before"].items():
        dbs["after"][kind] = tmp / f"{kind}-after.db"
        shutil.copyfile(path, dbs["after"][kind])
        upgrade_s[kind] = run(
            REPO, [sys.executable, "-m", "orchestrator", "list", "--db", str(dbs["after"][kind])], env
        )
    return {"trees": {"before": before_tree, "after": after_tree}, "dbs": dbs, "counts": counts, "build_s": build_s,
            "upgrade_s": upgrade_s}  # fmt: skip


def measure(setup: dict[str, Any], reps: int, show_reps: int, env: dict[str, str]) -> dict[str, Any]:
    """Every command `reps` times per side, before and after alternating (which goes first swaps every rep)."""
    py, trees, dbs = sys.executable, setup["trees"], setup["dbs"]
    n_runs = setup["counts"]["runs"]
    size = f"{n_runs // 1000}k" if n_runs >= 1000 else str(n_runs)
    commands: dict[str, tuple[str, dict[str, list[str]]]] = {
        "orch --version": ("≤ 60 ms", {side: ["--version"] for side in trees}),
        f"orch list ({size}-run store)": ("≤ 120 ms", {s: ["list", "--db", str(dbs[s]["big"])] for s in trees}),
        "orch list (empty store)": ("", {side: ["list", "--db", str(dbs[side]["empty"])] for side in trees}),
        "orch show (3 arms x 3 levels)": ("", {s: ["show", SHOW_ID, "--db", str(dbs[s]["big"])] for s in trees}),
    }
    floors = {"python -c pass": [py, "-c", "pass"], 'python -c "import click"': [py, "-c", "import click"]}
    out: dict[str, Any] = {"commands": {n: {"goal": g, "before": [], "after": []} for n, (g, _) in commands.items()}}
    out["floors"] = {name: [] for name in floors}
    for rep in range(reps):
        for name, argv in floors.items():
            out["floors"][name].append(run(None, argv, env))
        for name, (_, args) in commands.items():
            for side in ("before", "after") if rep % 2 == 0 else ("after", "before"):
                out["commands"][name][side].append(run(trees[side], [py, "-m", "orchestrator", *args[side]], env))
    out["show_in_process"] = {}
    for side in ("before", "after"):
        done = subprocess.run(
            [py, "-c", SHOW_IN_PROCESS, str(dbs[side]["big"]), SHOW_ID, str(show_reps)],
            env={**env, "PYTHONPATH": str(trees[side])},
            cwd=env["ORCH_BENCH_DIR"],
            capture_output=True,
            text=True,
            check=True,
        )
        out["show_in_process"][side] = json.loads(done.stdout)
    return out


def table(results: dict[str, Any]) -> list[str]:
    """The Markdown table for docs/performance.md."""
    rows = [
        "| command (whole process) | before median (min) ms | after median (min) ms | after / before | goal |",
        "|---|---|---|---|---|",
    ]
    for name, m in results["commands"].items():
        b, a = stats_ms(m["before"]), stats_ms(m["after"])
        rows.append(
            f"| `{name}` | {b['median_ms']:.0f} ({b['min_ms']:.0f}) | {a['median_ms']:.0f} ({a['min_ms']:.0f}) "
            f"| {a['median_ms'] / b['median_ms']:.2f}x | {m['goal']} |"
        )
    for name, values in results["floors"].items():
        f = stats_ms(values)
        rows.append(f"| `{name}` (floor: Python alone, same venv) | | {f['median_ms']:.0f} ({f['min_ms']:.0f}) | | |")
    b, a = results["show_in_process"]["before"], results["show_in_process"]["after"]
    bm, am = stats_ms(b["s"]), stats_ms(a["s"])
    rows.append(
        f"| `orch show`'s report in-process (store → result → text) | {bm['median_ms']:.0f} ({bm['min_ms']:.0f}) "
        f"| {am['median_ms']:.0f} ({am['min_ms']:.0f}) | {am['median_ms'] / bm['median_ms']:.2f}x | |"
    )
    rows.append(
        f"| bootstraps per report (`results.ratio_ci` calls) | {max(b['bootstraps'])} | {max(a['bootstraps'])} | "
        "| once per comparison: 2 arms vs the baseline x 3 levels = 6 |"
    )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--before", default=BEFORE_REF, help=f"git ref of the code to compare with [{BEFORE_REF}]")
    ap.add_argument("--reps", type=int, default=20, help="whole-process runs per command and side [20]")
    ap.add_argument("--show-reps", type=int, default=5, help="in-process reports per side [5]")
    ap.add_argument(
        "--experiments", type=int, default=2400, help="A/B experiments in the big store, 42 runs each [2400]"
    )
    ap.add_argument("--json-out", type=Path, default=None, help="also write the raw numbers (seconds) here")
    ap.add_argument("--smoke", action="store_true", help="1 run per command, a 20-experiment store: seconds")
    args = ap.parse_args()
    if args.smoke:
        args.reps, args.show_reps, args.experiments = 1, 1, 20
    args.before, note = before_ref(args.before, smoke=args.smoke)
    if note:
        print(note)
    with tempfile.TemporaryDirectory(prefix="orch-startup-") as tmp_name:
        tmp = Path(tmp_name)
        env = {**os.environ, "XDG_DATA_HOME": str(tmp / "data"), "XDG_CONFIG_HOME": str(tmp / "config"),
               "XDG_STATE_HOME": str(tmp / "state"), "ORCH_BENCH_DIR": str(tmp)}  # fmt: skip
        env.pop("ORCH_DEBUG", None)
        setup = prepare(tmp, args.before, args.experiments, env)
        results = measure(setup, args.reps, args.show_reps, env)
    c, up = setup["counts"], setup["upgrade_s"]
    print(
        f"store: {c['experiments']:,} experiments, {c['launches']:,} launches, {c['runs']:,} runs, {c['requests']:,} "
        f"per-request rows, built in {setup['build_s']:.1f} s with the before code's schema; the after code upgraded "
        f"its copy in place at the first open (indexes added): {up['big'] * 1000:.0f} ms for that whole `orch list` "
        f"({up['empty'] * 1000:.0f} ms on the empty store)"
    )
    print(
        f"before: {args.before} (git archive); after: {REPO} (copied); both byte-compiled, run as PYTHONPATH=TREE "
        f"`python -m orchestrator ...`, {args.reps} "
        f"runs per command and side, interleaved; in-process: {args.show_reps} reports per side\n"
    )
    print("\n".join(table(results)))
    if args.json_out:
        raw = {"before_ref": args.before, "store": c, "build_s": setup["build_s"], "upgrade_s": up, **results}
        args.json_out.write_text(json.dumps(raw, indent=2) + "\n")


if __name__ == "__main__":
    main()
