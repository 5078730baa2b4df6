"""How long the nightly history page takes for a suite of 30 nights × 5 items (`orch history --suite NAME --html`).

A synthetic store, filled the way `orch nightly` fills it (history.start_night, record_item, finish_night): 5 items
(2 A/Bs with 3 tok/s series each — both arms and their ratio — and an accept length; 3 single-profile items with
tok/s and aggregate tok/s @32), 1 % night-to-night noise, an engine upgrade on night 15 (every item), a 6 % slower
box for one item from night 20, one failed night of another on night 25. Timed separately: building the page's
model from the store (nightly/page.build: each series judged night by night, as `orch history` does) and rendering
it (report/nightly_html.render: one matplotlib SVG per series), each the median of --reps runs in this process after
one warm-up (matplotlib's first import is not counted); then the whole command, `orch history --suite NAME --html
FILE`, in its own process (start-up and imports included). `--smoke`: 5 nights × 2 items, one run, in seconds
(tests/test_benchmarks_smoke.py). Results are written up in docs/nightly.md.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from orchestrator.config.workload import BenchConfig
from orchestrator.nightly import history, page
from orchestrator.nightly.suite import Item, Metric
from orchestrator.report import nightly_html
from orchestrator.results.store import Store

REPO = Path(__file__).resolve().parent.parent
SUITE = "synthetic-nightly"
DAY = 86400.0
START = 1795140000.0  # 2026-11-20 02:00 local-ish: only the spacing matters


def items(n: int) -> list[tuple[Item, list[str]]]:
    """n items, alternating A/B and single-profile, each with the arms its series are of."""
    out = []
    for k in range(n):
        ab = k < 2
        metrics = (
            (Metric("tok_s", None, 0.03), Metric("accept_length", None, 0.03))
            if ab
            else (Metric("tok_s", None, 0.02), Metric("agg_tok_s", 32, 0.03))
        )
        item = Item(
            name=f"item-{k}",
            profiles=(),
            host="gpu-box",
            sim=True,
            bench=BenchConfig(),
            blocks=3 if ab else 1,
            order="random",
            metrics=metrics,
            threshold=0.03,
            timeout_s=3600.0,
        )
        out.append((item, ["baseline", "eagle3"] if ab else ["baseline"]))
    return out


def fill(store: Store, nights: int, n_items: int, seed: int = 1) -> None:
    rng = random.Random(seed)
    base = {"baseline": 80.0, "eagle3": 62.0}
    for night in range(nights):
        night_id = f"n{night:04d}"
        at = START + night * DAY
        history.start_night(store, night_id, SUITE, "synthetic.yaml", "0" * 64, at)
        version = "0.5.10" if night >= nights // 2 else "0.5.9"
        for k, (item, arms) in enumerate(items(n_items)):
            envs = {arm: {"engine version": version, "GPU model": "NVIDIA H200"} for arm in arms}
            if k == 3 and night == nights - 5:
                history.record_item(
                    store,
                    night_id,
                    item,
                    status="failed",
                    experiments=(f"e{night}-{k}",),
                    error="baseline: server process 1731 exited during startup after 0.5s",
                    series=(),
                    envs={},
                    simulated=True,
                )
                continue
            slow = 0.94 if k == 2 and night >= 2 * nights // 3 else 1.0
            series = []
            values = {}
            for arm in arms:
                v = base[arm] * slow * math.exp(rng.gauss(0, 0.01))
                values[arm] = v
                env = history.env_key(envs, [arm])
                for m in item.metrics:
                    if m.name == "accept_length" and arm == "baseline":
                        continue
                    x = {"tok_s": v, "agg_tok_s": v * 20, "accept_length": 2.1 * math.exp(rng.gauss(0, 0.01))}[m.name]
                    series.append(
                        history.SeriesValue(
                            series=history.series_name(arm, m.key),
                            arm=arm,
                            metric=m.key,
                            value=x,
                            lo=x * 0.99,
                            hi=x * 1.01,
                            n=3,
                            threshold=m.threshold,
                            higher_is_better=True,
                            env=env,
                            env_arms=(arm,),
                            min_history=5,
                        )
                    )
            if len(arms) == 2:
                r = values["eagle3"] / values["baseline"]
                env = history.env_key(envs, arms)
                series.append(
                    history.SeriesValue(
                        series="eagle3/baseline:tok_s",
                        arm="eagle3/baseline",
                        metric="tok_s",
                        value=r,
                        lo=r * 0.98,
                        hi=r * 1.02,
                        n=3,
                        threshold=0.03,
                        higher_is_better=True,
                        env=env,
                        env_arms=tuple(arms),
                        min_history=5,
                    )
                )
            history.record_item(
                store,
                night_id,
                item,
                status="complete",
                experiments=(f"e{night}-{k}",),
                error=None,
                series=series,
                envs=envs,
                simulated=True,
            )
        history.finish_night(store, night_id, "complete", 0, {})


def timed(fn: object, reps: int) -> tuple[float, object]:
    assert callable(fn)
    times, out = [], None
    for _ in range(reps):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nights", type=int, default=30)
    ap.add_argument("--items", type=int, default=5)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--smoke", action="store_true", help="5 nights × 2 items, one run")
    ap.add_argument("--out", default=None, help="also write the page here")
    args = ap.parse_args()
    if args.smoke:
        args.nights, args.items, args.reps = 5, 2, 1
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "nightly.db")
        fill(store, args.nights, args.items)
        pairs = page.suite_items(store, SUITE)

        def build() -> object:
            return page.build(store, pairs, suite=SUITE)

        model = build()  # warm-up: imports, the store's first reads
        nightly_html.render(model)  # type: ignore[arg-type]
        build_s, model = timed(build, args.reps)
        render_s, text = timed(lambda: nightly_html.render(model), args.reps)  # type: ignore[arg-type]
        store.close()
        command = [
            sys.executable,
            "-m",
            "orchestrator",
            "history",
            "--suite",
            SUITE,
            "--db",
            str(Path(tmp) / "nightly.db"),
            "--html",
            str(Path(tmp) / "page.html"),
        ]
        whole_s, _ = timed(lambda: subprocess.run(command, check=True, capture_output=True, cwd=REPO), args.reps)
    assert isinstance(text, str)
    n_series = sum(len(i.series) for i in model.items)  # type: ignore[attr-defined]
    if args.out:
        Path(args.out).write_text(text)
    print(f"nightly history page: {args.nights} nights × {args.items} items, {n_series} series, median of {args.reps}")
    print()
    print("| step | seconds |")
    print("|---|---|")
    print(f"| build the model (store → series, levels, steps) | {build_s:.2f} |")
    print(f"| render (one SVG per series) | {render_s:.2f} |")
    print(f"| **whole page** (in process) | **{build_s + render_s:.2f}** |")
    print(f"| `orch history --suite {SUITE} --html page.html` (whole process) | {whole_s:.2f} |")
    print()
    print(f"page size: {len(text) / 1e6:.2f} MB, {text.count('<figure')} figures")


if __name__ == "__main__":
    main()
