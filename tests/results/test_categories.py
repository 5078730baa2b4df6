"""Per-category results: each arm's tok/s and each comparison's paired ratio by prompt category, on the simulator."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

from orchestrator.cli import main
from orchestrator.config.workload import BenchConfig, request_items, run_categories
from orchestrator.nightly.report import comparison_text
from orchestrator.report.lines import category_rows, comparison_line
from orchestrator.results.categories import ByCategory, CategoryArm, CategoryComparison
from orchestrator.results.comparison import Comparison
from orchestrator.stats.estimates import RatioEstimate
from tests.faults.support import FAST

CATEGORIES = ("code", "summarisation", "translation")


def _sharegpt(path: Path) -> str:
    convs = [
        {
            "id": f"{c}-{i}",
            "category": c,
            "conversations": [
                {"from": "human", "value": f"{c} task {i}: please answer"},
                {"from": "gpt", "value": "ok"},
            ],
        }
        for c in CATEGORIES
        for i in range(3)
    ]
    path.write_text(json.dumps(convs, indent=2))
    return str(path)


def test_run_categories_follow_the_request_sequence(tmp_path: Path) -> None:
    bench = BenchConfig(
        runs=2, warmup=1, concurrency=(1, 2), requests_per_stream=2, prompts=_sharegpt(tmp_path / "d.json")
    )
    items = request_items(bench)
    found = run_categories(bench)
    assert set(found) == {(1, 0.0, 0), (1, 0.0, 1), (2, 0.0, 0), (2, 0.0, 1)}
    # warmup first (1 request), then concurrency 1's runs (2 each), then concurrency 2's (4 each)
    assert list(found[(1, 0.0, 0)]) == [it["category"] for it in items[1:3]]
    assert list(found[(2, 0.0, 1)]) == [it["category"] for it in items[9:13]]


def test_ab_on_a_sharegpt_file_reports_by_category(
    sim_profiles: Callable[..., dict[str, Path]], tmp_path: Path, capsys: object
) -> None:
    profiles = sim_profiles()
    data = _sharegpt(tmp_path / "data.json")
    db = str(tmp_path / "r.db")
    common = ["--sim", "--dataset", data, "--blocks", "2", "--runs", "2", "--concurrency", "3", "--max-tokens", "24"]
    # One request per stream: each run sends 3 of the 9 prompts, one of each category (the covering order).
    common += ["--requests-per-stream", "1"]
    rc = main(["ab", str(profiles["baseline"]), str(profiles["eagle3"]), *common, *FAST, "--db", db, "--json"])
    out = capsys.readouterr().out  # type: ignore[attr-defined]
    assert rc == 0, out
    doc = json.loads(out)
    (bc,) = doc["by_category"]
    assert bc["categories"] == sorted(CATEGORIES)
    assert {a["category"] for a in bc["arms"]} == set(CATEGORIES)
    assert all(a["tok_s"] and a["tok_s"] > 0 and a["requests"] > 0 for a in bc["arms"])
    assert len(bc["comparisons"]) == 3
    for c in bc["comparisons"]:
        # Two requests of a category per launch: its CI is printed, or said to be too wide to print.
        assert c["blocks"] == 2 and c["paired"] is True and c["requests_per_launch"] == 2
        assert (c["ci95"] is None) == c.get("ci_note", "").startswith("too few requests in this category to bound")
        assert c["verdict"] in ("faster", "slower", "no difference", "inconclusive")
        # Three category verdicts printed together are one family: each CI at its Holm level, 1 - 0.05 / k for the
        # k members still open at the step that decided it (docs/statistics.md, "Families of verdicts").
        adj = c["adjustment"]
        assert adj["method"] == "holm" and adj["family_size"] == 3 and adj["family"] == "3 categories"
        assert any(abs(adj["ci_level"] - (1 - 0.05 / k)) < 1e-12 for k in (1, 2, 3)), adj
    assert bc["summary"] and bc["summary"][0].startswith("eagle3 vs baseline (Holm over 3 categories): ")
    # The stored experiment reads back the same breakdown (its per-request rows, its workload's categories).
    assert main(["show", "last", "--db", db]) == 0
    text = capsys.readouterr().out  # type: ignore[attr-defined]
    assert "by category @ 3" in text and "translation" in text and "eagle3 ratio" in text
    assert "Holm over 3 categories" in text and "CI (Holm)" in text
    assert main(["export", "last", "--format", "md", "--db", db]) == 0
    md = capsys.readouterr().out  # type: ignore[attr-defined]
    assert "### By category at 3" in md and "| code |" in md and "Holm over 3 categories" in md
    html = tmp_path / "r.html"
    assert main(["export", "last", "--format", "html", "-o", str(html), "--db", db]) == 0
    page = html.read_text()
    assert '<section id="by-category">' in page and "eagle3 ratio" in page and "Holm over 3 categories" in page


def test_a_prompts_output_len_caps_its_request(
    sim_profiles: Callable[..., dict[str, Path]], tmp_path: Path, capsys: object
) -> None:
    profiles = sim_profiles()
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "short one", "output_len": 5}\n{"prompt": "long one", "output_len": 500}\n')
    db = str(tmp_path / "r.db")
    args = ["--sim", "--dataset", str(data), "--runs", "1", "--concurrency", "2", "--max-tokens", "24", *FAST]
    assert main(["bench", str(profiles["baseline"]), *args, "--db", db]) == 0
    capsys.readouterr()  # type: ignore[attr-defined]
    assert main(["export", "last", "--format", "jsonl", "--db", db]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]  # type: ignore[attr-defined]
    assert sorted(r["tokens"] for r in rows if not r.get("warmup")) == [5, 24]  # its own length, --max-tokens caps it


def test_a_one_category_dataset_says_the_comparison_is_its_verdict(
    sim_profiles: Callable[..., dict[str, Path]], tmp_path: Path, capsys: object
) -> None:
    """HumanEval is all code: no one-row breakdown, a sentence saying the verdict above is the category's."""
    profiles = sim_profiles()
    db = str(tmp_path / "r.db")
    common = ["--sim", "--dataset", "humaneval", "--blocks", "1", "--runs", "1", "--max-tokens", "8"]
    rc = main(["ab", str(profiles["baseline"]), str(profiles["eagle3"]), *common, *FAST, "--db", db])
    out = capsys.readouterr().out  # type: ignore[attr-defined]
    assert rc == 0, out
    assert "by category: every prompt is code; the comparison above is its verdict" in out, out
    assert "by category @" not in out
    assert main(["export", "last", "--format", "md", "--db", db]) == 0
    assert "- by category: every prompt is code" in capsys.readouterr().out  # type: ignore[attr-defined]


def test_a_category_ci_too_wide_to_use_is_said_in_words_not_printed() -> None:
    # Two blocks of one noisy request per launch give intervals like [0.000, 1588779.420]: no number to print.
    wide = RatioEstimate(ratio=1.4, lo=0.0001, hi=1588779.42, blocks=2, method="bootstrap over blocks", log_sd=1.1)
    narrow = RatioEstimate(ratio=1.4, lo=1.3, hi=1.5, blocks=2, method="bootstrap over blocks", log_sd=0.01)
    bc = ByCategory(
        level=3,
        categories=("code", "math"),
        arms=tuple(
            CategoryArm(arm_label=label, category=c, tok_s=10.0, accept_length=None, requests=2)
            for c in ("code", "math")
            for label in ("base", "spec")
        ),
        comparisons=(
            CategoryComparison(
                arm_label="spec",
                vs_label="base",
                category="code",
                estimate=wide,
                verdict="inconclusive",
                paired=True,
                per_launch=1,
            ),
            CategoryComparison(
                arm_label="spec",
                vs_label="base",
                category="math",
                estimate=narrow,
                verdict="faster",
                paired=True,
                per_launch=4,
            ),
        ),
    )
    code, math_row = category_rows(bc)[1:]
    assert "too few requests in this category to bound: 1 per launch" in code
    assert not any("1588779" in cell for cell in code)
    assert "[1.300, 1.500]" in math_row
    doc = bc.to_dict()["comparisons"]
    assert doc[0]["ci95"] is None and doc[0]["ci_note"] == "too few requests in this category to bound: 1 per launch"
    assert doc[1]["ci95"] == [1.3, 1.5] and "ci_note" not in doc[1]


def test_a_minimal_detectable_effect_past_the_threshold_is_not_a_number() -> None:
    est = RatioEstimate(ratio=1.1, lo=0.08, hi=5.2, blocks=2, method="bootstrap over blocks", log_sd=0.9)
    absurd = Comparison(
        arm="spec", vs="base", ratio=1.1, concurrency=3, estimate=est, verdict="inconclusive", mde=684.494
    )
    line = comparison_line(absurd)
    assert "68449" not in line and "minimal detectable effect: cannot be bounded with 2 blocks" in line
    doc = absurd.to_dict()
    assert doc["mde"] is None and doc["mde_note"].startswith("cannot be bounded with 2 blocks")
    usable = dataclasses.replace(absurd, mde=0.25)
    assert "minimal detectable effect 25.0%" in comparison_line(usable) and usable.to_dict()["mde"] == 0.25


def test_a_whole_comparisons_interval_spanning_an_order_of_magnitude_is_said_in_words() -> None:
    # A real noisy llama.cpp A/B (issue 35): 0.648x, CI [0.080, 5.227] over 3 blocks.
    wide = RatioEstimate(ratio=0.648, lo=0.080, hi=5.227, blocks=3, method="bootstrap over blocks", log_sd=0.9)
    c = Comparison(arm="spec", vs="base", ratio=0.648, concurrency=1, estimate=wide, verdict="inconclusive")
    line = comparison_line(c)
    assert "5.227" not in line and "0.080" not in line
    assert "95% CI too wide to bound with 3 blocks at this noise (its ends over 10x apart) -> inconclusive" in line
    doc = c.to_dict()
    assert doc["ci95"] == [0.08, 5.227] and doc["ci_note"].startswith("too wide to bound with 3 blocks")
    assert "5.227" not in comparison_text(doc) and "too wide to bound" in comparison_text(doc)
    narrow = dataclasses.replace(c, estimate=dataclasses.replace(wide, lo=0.5, hi=0.9), verdict="slower")
    assert "[0.500, 0.900] over 3 blocks" in comparison_line(narrow) and "ci_note" not in narrow.to_dict()
