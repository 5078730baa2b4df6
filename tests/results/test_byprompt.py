"""Per-prompt results for a small prompt set: each prompt's paired ratio, and the prompt whose ratio is on the other
side of 1 from the verdict, named (issue 36)."""

from __future__ import annotations

import json
import math
import random
import re
from collections.abc import Callable
from pathlib import Path

from orchestrator.cli import main
from orchestrator.report.html import ab_html
from orchestrator.report.jsondoc import ab_json
from orchestrator.report.markdown import ab_markdown
from orchestrator.report.text import ab_text
from orchestrator.results.byprompt import PromptSet, by_prompt, excerpt
from orchestrator.results.model import ABResult, Design, LaunchResult
from orchestrator.results.run import RunResult
from tests.faults.support import FAST

# Three prompts, as `--prompts lookup-friendly` measured on llama.cpp: prompt lookup doubles the first, speeds the
# second up by half, and slows the third (accept length 1.64: drafts that are mostly rejected).
GAIN = {"1": 2.0, "2": 1.5, "3": 0.85}
ACCEPT = {"1": 6.10, "2": 3.12, "3": 1.64}
EXCERPTS = {
    "1": "Rename the variable `total` t...",
    "2": "Turn this CSV into a Markdown...",
    "3": "def add(a, b): <b>|x|</b>",
}


def _launch(arm: int, block: int, rng: random.Random) -> LaunchResult:
    """Run i sends prompt i + 1, one request: base at 50 tok/s on every prompt, spec at 50 × GAIN (1 % noise)."""
    runs = []
    for i, prompt in enumerate(GAIN):
        v = 50.0 * (GAIN[prompt] if arm else 1.0) * math.exp(rng.gauss(0, 0.01))
        row = {"index": 0, "e2e_s": 128 / v, "tokens": 128, **({"accept_length": ACCEPT[prompt]} if arm else {})}
        runs.append(
            RunResult(
                index=i,
                warmup=False,
                tokens=128,
                seconds=128 / v,
                tok_s=v,
                prompt_tokens=20,
                ttft_s=0.02,
                per_request=(row,),
            )
        )
    label = "base" if arm == 0 else "spec"
    fp = {"workload_sha256": "same"}
    return LaunchResult(
        profile=label,
        launch_id=f"L{block}-{arm}",
        runs=tuple(runs),
        ready_s=1.0,
        env_report={"ok": True},
        teardown={},
        spec_steps=None,
        block=block,
        position=arm,
        arm_index=arm,
        gpus=None,
        fingerprint=fp,
    )


def _result(blocks: int = 6) -> ABResult:
    rng = random.Random(3)
    launches = tuple(_launch(arm, b, rng) for b in range(blocks) for arm in (0, 1))
    prompts = PromptSet(runs={(1, 0.0, i): (p,) for i, p in enumerate(GAIN)}, excerpts=EXCERPTS)
    return ABResult(
        experiment_id="exp",
        simulated=True,
        host="local",
        profiles=("base", "spec"),
        launches=launches,
        host_facts={},
        design=Design.make(2, blocks, "fixed", 1),
        prompts=prompts,
    )


def test_each_prompts_ratio_is_shown_and_the_one_against_the_verdict_named() -> None:
    result = _result()
    (overall,) = result.comparisons_at(1)
    assert overall.verdict == "faster" and 1.4 < (overall.ratio or 0) < 1.6  # the launch medians: prompt 2's 1.5x
    bp = by_prompt(result)
    assert bp is not None
    ratios = {c.category: c.ratio for c in bp.table.comparisons}
    assert all(abs((ratios[p] or 0) - GAIN[p]) < 0.05 for p in GAIN), ratios
    accepts = {a.category: a.accept_length for a in bp.table.arms if a.arm_label == "spec"}
    assert all(abs((accepts[p] or 0) - ACCEPT[p]) < 1e-9 for p in ACCEPT), accepts
    # Three per-prompt verdicts printed together: one Holm family.
    assert all(c.adjustment is not None and c.adjustment.over == "3 prompts" for c in bp.table.comparisons)
    (note,) = bp.notes
    assert note.startswith('prompt 3 ("def add(a, b): <b>|x|</b>") runs slower with spec: 0.85x against the FASTER')
    assert note.endswith("the verdict rests on the other 2 prompts")

    text = ab_text(result)
    assert "by prompt @ 1: tok/s per stream from each prompt's requests" in text
    row = next(line for line in text.splitlines() if line.lstrip().startswith('3 "def add'))
    assert re.search(r" 0\.8[45]\dx ", row) and "(al 1.64)" in row and row.endswith("slower"), row
    assert note in text

    md = ab_markdown(result)
    assert "### By prompt at 1" in md
    # The excerpt is untrusted text: its markup and its `|` are escaped, so it stays inside its cell.
    md_row = next(line for line in md.splitlines() if line.startswith("| 3 "))
    assert "<b>" not in md_row and "\\|x\\|" in md_row and re.search(r" 0\.8[45]\dx ", md_row), md_row
    assert "runs slower with spec: 0.85x" in md

    page = ab_html(result)
    assert '<section id="by-prompt">' in page and "&lt;b&gt;|x|&lt;/b&gt;" in page and "<b>|x|" not in page
    assert "runs slower with spec: 0.85x against the FASTER verdict" in page

    doc = json.loads(json.dumps(ab_json(result)))
    (level,) = doc["by_prompt"]
    assert level["prompt_set_size"] == 3 and [p["prompt"] for p in level["prompts"]] == [1, 2, 3]
    assert level["prompts"][2]["excerpt"] == EXCERPTS["3"]
    by_number = {c["prompt"]: c for c in level["comparisons"]}
    assert by_number[3]["ratio"] < 1 < by_number[1]["ratio"] and by_number[3]["adjustment"]["family"] == "3 prompts"
    spec = {a["prompt"]: a["accept_length"] for a in level["arms"] if a["arm_label"] == "spec"}
    assert [round(spec[p], 2) for p in (1, 2, 3)] == [6.10, 3.12, 1.64]
    assert level["notes"] == [note]


def test_no_breakdown_without_a_small_prompt_set() -> None:
    """Orch's builtin mix, random prompts, a dataset broken down by category: no prompt set, no by-prompt table."""
    import dataclasses

    result = dataclasses.replace(_result(), prompts=None)
    assert by_prompt(result) is None and ab_json(result)["by_prompt"] == []
    assert "by prompt @" not in ab_text(result)


def test_an_excerpt_is_one_line_of_printable_text() -> None:
    assert excerpt("a\n\n  b\tc") == "a b c"
    assert excerpt("x\x1b[31m" + "y" * 40) == "x\\x1b[31m" + "y" * 24 + "..."  # 30 characters, then escaped


def test_ab_on_a_small_prompt_set_reports_by_prompt(
    sim_profiles: Callable[..., dict[str, Path]], tmp_path: Path, capsys: object
) -> None:
    profiles = sim_profiles()
    db = str(tmp_path / "r.db")
    # One run of 6 requests (3 streams × 2) sends the 6 prompts of the set, one pass over it.
    common = ["--sim", "--prompts", "lookup-friendly", "--blocks", "2", "--runs", "1", "--concurrency", "3"]
    common += ["--requests-per-stream", "2", "--max-tokens", "8"]
    rc = main(["ab", str(profiles["baseline"]), str(profiles["eagle3"]), *common, *FAST, "--db", db, "--json"])
    out = capsys.readouterr().out  # type: ignore[attr-defined]
    assert rc == 0, out
    (level,) = json.loads(out)["by_prompt"]
    assert level["prompt_set_size"] == 6 and [p["prompt"] for p in level["prompts"]] == [1, 2, 3, 4, 5, 6]
    assert len(level["comparisons"]) == 6 and all(c["blocks"] == 2 and c["paired"] for c in level["comparisons"])
    # The stored experiment reads back the same prompts (its stored workload, checked against its digest).
    assert main(["show", "last", "--db", db]) == 0
    assert "by prompt @ 3" in capsys.readouterr().out  # type: ignore[attr-defined]
