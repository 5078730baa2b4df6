"""Real A/A experiments through the whole pipeline: `orch ab baseline baseline --sim --blocks N` run K times.

Where benchmarks/aa_study.py checks the statistics on synthetic numbers, this runs the real thing: real simulator
launches (each draws its own speed, like a restart), the real client, the real store and report. Every verdict
should be `no difference` or `inconclusive`; a `faster`/`slower` is a false alarm. Prints a Markdown table for
docs/statistics.md. Takes about a minute per experiment with the defaults.
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--experiments", type=int, default=8)
    p.add_argument("--blocks", type=int, default=3)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--profile", default="baseline")
    p.add_argument("--smoke", action="store_true", help="one experiment of 2 blocks, 16 tokens: every step, seconds")
    args = p.parse_args()
    extra: list[str] = []
    if args.smoke:
        args.experiments, args.blocks, args.runs, args.max_tokens = 1, 2, 1, 16
        extra = ["--warmup", "0", "--min-run-s", "0"]
    counts: collections.Counter[str] = collections.Counter()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "aa.db"
        for i in range(args.experiments):
            cmd = [
                sys.executable,
                "-m",
                "orchestrator",
                "ab",
                args.profile,
                args.profile,
                "--sim",
                "--blocks",
                str(args.blocks),
                "--runs",
                str(args.runs),
                "--max-tokens",
                str(args.max_tokens),
                "--order-seed",
                str(i),
                "--json",
                "--db",
                str(db),
                *extra,
            ]
            proc = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, env=None, check=False)
            if proc.returncode != 0:
                sys.exit(f"experiment {i + 1} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
            cmp = json.loads(proc.stdout)["comparisons"][0]
            counts[cmp["verdict"]] += 1
            lo, hi = cmp["ci95"]
            rows.append((i + 1, cmp["ratio"], lo, hi, cmp["mde"], cmp["verdict"]))
            print(f"experiment {i + 1}: {cmp['ratio']:.4f} [{lo:.4f}, {hi:.4f}] {cmp['verdict']}", file=sys.stderr)
    print(
        f"{args.experiments} real A/A experiments (`orch ab {args.profile} {args.profile} --sim --blocks {args.blocks}"
        f" --runs {args.runs} --max-tokens {args.max_tokens}`)\n"
    )
    print("| # | ratio | 95% CI | MDE | verdict |\n|---|---|---|---|---|")
    for n, r, lo, hi, mde, v in rows:
        print(f"| {n} | {r:.4f} | [{lo:.4f}, {hi:.4f}] | {mde * 100:.1f}% | {v} |")
    false = counts["faster"] + counts["slower"]
    print(f"\nverdicts: {dict(counts)}; false faster/slower: {false} of {args.experiments}")


if __name__ == "__main__":
    main()
