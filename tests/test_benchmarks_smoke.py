"""Every script in benchmarks/ runs end to end in its --smoke mode and prints its tables (no speed is asserted)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BENCHMARKS = REPO / "benchmarks"
REFERENCE_VENV = REPO / ".venv-ref"

# script -> what its smoke run must print: the headers and rows of the tables docs/*.md are written from.
EXPECTED: dict[str, tuple[str, ...]] = {
    "startup.py": ("| command (whole process) | before median", "`orch --version`", "bootstraps per report"),
    "lifecycle_overhead.py": (
        "| per arm (median) | orch local |",
        "bare launch",
        "**wall per arm**",
        "**orch's overhead per arm**",
        "host calls + channel opens during a 0.5 s load",
        "**whole command, 2 launches**",
    ),
    "client_fidelity.py": (
        "## Fidelity",
        "| orch client (/generate) |",
        "| orch client (/v1/completions) |",
        "## Capacity",
        "Every step (tok/s error",
    ),
    "arrival_fidelity.py": (
        "| rate (req/s) | requests | send lag p50 / p90 / p99 / max (ms) |",
        "timer alone (nothing sent)",
        "load average before / after",
    ),
    "capacity.py": (
        "## client-bound: simulator",
        "## server-bound: simulator",
        "| rate (req/s) | requests | client | runs | achieved / scheduled (req/s) |",
        "| orch open-loop client |",
        "- capacity of orch open-loop client",
        "above the server's ceiling",
    ),
    "aa_real.py": ("real A/A experiments", "| # | ratio | 95% CI | MDE | verdict |", "verdicts:"),
    "aa_study.py": ("--blocks auto", "| restart noise | true effect |", "| blocks | A/A faster or slower"),
    "nightly_page.py": (
        "nightly history page: 5 nights × 2 items",
        "| build the model",
        "| **whole page** (in process) |",
        "(whole process)",
    ),
    "nightly_study.py": ("| threshold | confirmation re-run | false alarms", "| threshold | confirmation re-run |"),
    "paired_study.py": ("| scenario | blocks | true ratio | CI | coverage |", "| paired |", "| unpaired |"),
    "repro_study.py": ("| restart noise | blocks | same: reproduced |",),
    "family_aa.py": ("| categories | blocks | any false verdict, uncorrected | any false verdict, Holm |", "| 8 | 3 |"),
    "crossover_study.py": ("true crossover 6", "| truth | restart noise | blocks | crosses | covers x* |"),
    "slo_capacity_study.py": ("true capacities: base 7, arm 4.5 (ratio 0.643)", "linear in log(load)", "covered"),
    "reference_clients.py": ("openai-sdk (completions)", "sglang.bench_serving --backend sglang"),
}


def scripts() -> list[str]:
    """Every runnable script in benchmarks/ (a helper module without a __main__ block is not one)."""
    return sorted(p.name for p in BENCHMARKS.glob("*.py") if 'if __name__ == "__main__":' in p.read_text())


def reference_installed() -> bool:
    return (REFERENCE_VENV / ".installed").exists()


def smoke(script: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(BENCHMARKS / script), "--smoke", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_every_script_has_a_smoke_run() -> None:
    """A new benchmark script must come with its smoke run here, so that it cannot rot unnoticed."""
    assert scripts() and set(scripts()) == set(EXPECTED), f"add the new script to EXPECTED: {scripts()}"


# lifecycle_overhead.py measures orch over SSH too when an sshd is there to start (tests/sshd.py, in its process).
@pytest.mark.parametrize(
    "script", [pytest.param(s, marks=[pytest.mark.ssh] if s == "lifecycle_overhead.py" else []) for s in scripts()]
)
def test_smoke(script: str, tmp_path: Path, sim_profiles: Callable[..., dict[str, Path]]) -> None:
    args: list[str] = []
    expected = list(EXPECTED[script])
    if script == "reference_clients.py" and not reference_installed():
        pytest.skip("the field's clients (.venv-ref, `make bench` installs them) are not installed")
    if script == "aa_real.py":
        args = ["--profile", str(sim_profiles()["baseline"])]  # the bundled profile's port may be taken
    done = smoke(script, *args, cwd=tmp_path)
    assert done.returncode == 0, (
        f"{script} --smoke exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    assert "Traceback" not in done.stderr
    if script == "client_fidelity.py":
        if reference_installed():
            expected += ["| openai SDK loop (completions) |", "| bench_serving --backend sglang-oai |"]
        else:  # orch's side still runs; the reference side says why it did not
            expected += ["reference clients skipped: openai is not importable here and .venv-ref is not installed"]
        expected += ["before ("]  # the pre-issue-14 client (or HEAD, in a clone without that commit)
    if script == "capacity.py":
        if reference_installed():
            expected += [
                "| sglang.bench_serving --request-rate |",
                "achieved ÷ scheduled, orch open-loop client ÷ bench_serving",
            ]
        else:
            expected += ["reference client skipped: "]
    if script == "lifecycle_overhead.py" and Path("/usr/sbin/sshd").exists():
        expected += ["| orch ssh |"]
    missing = [text for text in expected if text not in done.stdout]
    assert not missing, f"{script} --smoke did not print {missing}:\n{done.stdout[-4000:]}"


def test_the_paired_study_on_the_readmes_bundle_prints_what_statistics_md_quotes(tmp_path: Path) -> None:
    """`paired_study.py --bundle` on the shipped README recording: both intervals, the ones docs/statistics.md quotes
    (a pure computation on the file: the same numbers every time)."""
    bundle = BENCHMARKS.parent / "docs" / "examples" / "llamacpp-lookup-friendly.orch.json"
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "paired_study.py"), "--bundle", str(bundle)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    quoted = (BENCHMARKS.parent / "docs" / "statistics.md").read_text()
    for line in done.stdout.splitlines():
        if line.startswith(("|", "block ratios", "paired:", "unpaired:")):
            assert line in quoted, f"docs/statistics.md does not quote {line!r}"
    assert "paired: 1.129x" in done.stdout and "unpaired: " in done.stdout
