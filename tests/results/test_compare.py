"""Two experiments side by side and claims: statuses, one-sided arms, and the text/JSON/Markdown renderings.
Synthetic ABResults, no servers (built like tests/stats/test_design.py)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence

import pytest

from orchestrator.errors import InputError
from orchestrator.report.compare import claim_json, claim_text, compare_json, compare_markdown, compare_text
from orchestrator.results.compare import claim_verdict, compare, compare_levels
from orchestrator.results.model import ABResult, Design, LaunchResult
from orchestrator.results.run import Rate, RunResult

# Deterministic per-block launch factors (restart noise of ~0.3 %), the same for every arm of a block.
FACTORS = (1.0, 1.004, 0.996, 1.002, 0.998)


def _run(i: int, tok_s: float, ttft: float = 0.02) -> RunResult:
    return RunResult(
        index=i,
        warmup=False,
        tokens=2048,
        seconds=2048 / tok_s,
        tok_s=tok_s,
        prompt_tokens=30,
        ttft_s=ttft,
        concurrency=1,
        aggregate_tok_s=tok_s,
        metrics={"itl": {"p50": 1 / tok_s, "p99": 1.2 / tok_s}},
    )


def _result(exp_id: str, speeds: dict[str, float], *, blocks: int = 5, factors: Sequence[float] = FACTORS) -> ABResult:
    names = tuple(speeds)
    launches = []
    for b in range(blocks):
        for i, name in enumerate(names):
            value = speeds[name] * factors[b % len(factors)]
            launches.append(
                LaunchResult(
                    profile=name,
                    launch_id=f"{exp_id}-{b}-{i}",
                    runs=tuple(_run(k, value * (1 + 0.0005 * k)) for k in range(3)),
                    ready_s=4.0,
                    env_report={"ok": True},
                    teardown={},
                    block=b,
                    position=i,
                    arm_index=i,
                )
            )
    design = Design.make(len(names), blocks, "fixed", 0)
    return ABResult(
        experiment_id=exp_id,
        simulated=True,
        host="local",
        profiles=names,
        launches=tuple(launches),
        host_facts={},
        design=design,
    )


SPEEDS = {"baseline": 83.0, "eagle3-3step": 60.8}


def test_same_state_reproduces_every_arm_and_ratio() -> None:
    c = compare(_result("A", SPEEDS), _result("B", SPEEDS), tolerance=0.03)
    assert c.status == "reproduced" and c.exit_code == 0
    assert [r.verdict.status for r in c.arms if r.verdict] == ["reproduced", "reproduced"]
    assert [(q.arm, q.vs) for q in c.ratios] == [("eagle3-3step", "baseline")]
    assert c.ratios[0].verdict is not None and c.ratios[0].verdict.status == "reproduced"
    assert c.only_in_a == [] and c.only_in_b == []
    assert compare_text(c).splitlines()[0] == "REPRODUCED: all 3 values agree within ±3.0%"


def test_a_slower_server_is_not_reproduced_in_absolute_terms_but_the_ratio_is() -> None:
    slow = {k: v * 0.94 for k, v in SPEEDS.items()}
    causes = ["worker env NCCL_P2P_DISABLE: 1 -> (unset)", "host kernel 6.8.0 -> 6.8.1"]
    c = compare(_result("A", SPEEDS), _result("B", slow), tolerance=0.03, causes=causes)
    assert c.status == "not reproduced" and c.exit_code == 3
    base = c.arms[0].verdict
    assert base is not None and base.status == "not reproduced" and base.change == pytest.approx(-0.06, abs=1e-3)
    assert c.ratios[0].verdict is not None and c.ratios[0].verdict.status == "reproduced"
    text = compare_text(c)
    assert text.startswith("NOT REPRODUCED: beyond ±3.0%: baseline tok/s -6.0%, eagle3-3step tok/s -6.0%")
    a, b = c.arms[0].a, c.arms[0].b
    assert a is not None and a.tok_s is not None and b is not None and b.tok_s is not None and b.tok_s.lo
    assert b.tok_s.value == pytest.approx(83.0 * 0.94 * 1.0005, rel=1e-3)  # the median run is 0.05 % up
    assert f"{a.tok_s.value:.1f} [{a.tok_s.lo:.1f}, " in text and f"{b.tok_s.value:.1f} [{b.tok_s.lo:.1f}, " in text
    # The causes come under the verdict, most likely first, in the caller's order.
    lines = text.splitlines()
    at = lines.index("  likely causes, most likely first:")
    assert lines[at + 1 : at + 3] == [f"    1. {causes[0]}", f"    2. {causes[1]}"]


def test_arms_on_one_side_only_keep_it_inconclusive() -> None:
    more = {**SPEEDS, "ngram": 70.0}
    c = compare(_result("A", SPEEDS), _result("B", more), tolerance=0.03)
    assert c.only_in_b == ["ngram"] and c.only_in_a == []
    assert c.status == "inconclusive" and c.exit_code == 4 and "on one side only: ngram" in c.reason
    ngram = [q for q in c.ratios if q.arm == "ngram"]
    assert len(ngram) == 1 and ngram[0].a is None and ngram[0].verdict is None
    assert "only in B: ngram" in compare_text(c)
    back = compare(_result("B", more), _result("A", SPEEDS), tolerance=0.03)
    assert back.only_in_a == ["ngram"]


def test_noisy_short_experiments_are_inconclusive_with_the_blocks_that_would_decide() -> None:
    noisy = (1.0, 1.03)
    c = compare(_result("A", SPEEDS, blocks=2, factors=noisy), _result("B", SPEEDS, blocks=2, factors=(0.99, 1.02)))
    assert c.status == "inconclusive"
    assert c.arms[0].verdict is not None and c.arms[0].verdict.status == "inconclusive"
    assert "undecided: baseline tok/s" in c.reason


def test_json_document_has_stable_fields_and_serialises() -> None:
    c = compare(_result("A", SPEEDS), _result("B", {k: v * 0.94 for k, v in SPEEDS.items()}), causes=["x"])
    doc = json.loads(json.dumps(compare_json(c)))
    assert set(doc) == {
        "status",
        "reason",
        "exit_code",
        "tolerance",
        "concurrency",
        "a",
        "b",
        "arms",
        "ratios",
        "only_in_a",
        "only_in_b",
        "arm_map",
        "causes",
        "dataset_change",
        "not_judged_levels",
    }
    assert doc["not_judged_levels"] == []
    assert doc["status"] == "not reproduced" and doc["exit_code"] == 3 and doc["causes"] == ["x"]
    assert doc["a"] == {"experiment_id": "A", "host": "local", "simulated": True, "blocks": 5, "dataset": None}
    arm = doc["arms"][0]
    assert arm["label"] == "baseline" and set(arm["a"]) == {"tok_s", "ttft_s", "itl_p50_s", "accept_length"}
    assert arm["a"]["tok_s"]["n"] == 5 and len(arm["a"]["tok_s"]["ci95"]) == 2
    assert arm["verdict"]["status"] == "not reproduced" and arm["verdict"]["change"] == pytest.approx(-0.06, abs=1e-3)
    assert doc["ratios"][0]["verdict"]["status"] == "reproduced"


def test_markdown_is_a_table_with_the_verdict_on_top() -> None:
    c = compare(_result("A", SPEEDS), _result("B", {k: v * 0.94 for k, v in SPEEDS.items()}), causes=["gpu clocks"])
    md = compare_markdown(c)
    lines = md.splitlines()
    assert lines[0] == "# Compare A → B" and lines[2].startswith("**NOT REPRODUCED: ")
    assert any(line.startswith("| arm | A tok/s") for line in lines)
    assert any(line.startswith("| baseline | ") and "NOT REPRODUCED" in line for line in lines)
    assert any(line.startswith("| eagle3-3step / baseline | ") and "REPRODUCED" in line for line in lines)
    assert "## Likely causes, most likely first" in md and "1. gpu clocks" in md


def test_a_claim_of_94_against_a_measured_60_8() -> None:
    result = _result("R", SPEEDS, blocks=3)
    cv = claim_verdict(result, "eagle3-3step", claimed_tps=94.0, claimed_ratio=1.06)
    assert cv.status == "not reproduced" and cv.exit_code == 3
    assert cv.baseline == "baseline" and cv.tps is not None and cv.ratio_verdict is not None
    text = claim_text(cv)
    m = cv.measured
    assert m is not None and m.lo is not None and m.hi is not None
    assert (
        f"eagle3-3step: claimed 94.0 tok/s, measured 60.8 tok/s [{m.lo:.1f}, {m.hi:.1f}] over 3 launches -> "
        f"NOT REPRODUCED ({(m.value / 94 - 1) * 100:+.1f} %); baseline measured 83.0 tok/s beside it"
    ) in text
    assert "eagle3-3step vs baseline: claimed ratio 1.060, measured 0.733" in text
    doc = json.loads(json.dumps(claim_json(cv)))
    assert doc["claimed_tok_s"] == 94.0 and doc["tok_s_verdict"]["status"] == "not reproduced"
    fair = claim_verdict(result, "eagle3-3step", claimed_tps=60.8)
    assert fair.status == "reproduced" and fair.exit_code == 0


def test_bad_claims_are_input_errors() -> None:
    result = _result("R", SPEEDS, blocks=3)
    with pytest.raises(InputError, match="only: baseline, eagle3-3step"):
        claim_verdict(result, "medusa", claimed_tps=94.0)
    with pytest.raises(InputError, match="nothing claimed"):
        claim_verdict(result, "eagle3-3step")
    with pytest.raises(InputError, match="needs a baseline"):
        claim_verdict(result, "baseline", claimed_ratio=1.06)
    with pytest.raises(InputError, match="positive"):
        claim_verdict(result, "eagle3-3step", claimed_tps=-1.0)


def test_other_data_is_an_environment_step_named_first() -> None:
    """Two experiments on other data (another sha256) are compared, and the change is said like an engine change:
    first among the causes, in every rendering; the same data under another file name is no change."""
    from orchestrator.experiment.reproduce import likely_causes
    from orchestrator.results.datasource import DataSource

    v1 = DataSource("dataset", "chat.jsonl", "a" * 64, "/data/chat.jsonl")
    v2 = DataSource("dataset", "chat.jsonl", "b" * 64, "/data/chat.jsonl")
    a, b = _result("A", SPEEDS), _result("B", SPEEDS)
    a, b = dataclasses.replace(a, dataset=v1), dataclasses.replace(b, dataset=v2)
    change = f"dataset: chat.jsonl (sha256 {'a' * 16}…) -> chat.jsonl (sha256 {'b' * 16}…)"
    c = compare(a, b, tolerance=0.03, causes=likely_causes(a, b))
    assert c.dataset_change == change and c.causes[0] == change
    text = compare_text(c)
    assert f"  environment step: B sent other data than A ({change})" in text.splitlines()[3]
    doc = compare_json(c)
    assert doc["dataset_change"] == change and doc["causes"][0] == change
    assert doc["a"]["dataset"] == {
        "kind": "dataset",
        "name": "chat.jsonl",
        "sha256": "a" * 64,
        "origin": "/data/chat.jsonl",
    }
    assert f"**Environment step: B sent other data than A ({change})" in compare_markdown(c)
    copy = dataclasses.replace(v1, name="copy.jsonl", origin="/tmp/copy.jsonl")
    same = compare(a, dataclasses.replace(b, dataset=copy), tolerance=0.03)
    assert same.dataset_change is None and "environment step" not in compare_text(same)
    assert compare_json(same)["dataset_change"] is None
    builtin = dataclasses.replace(b, dataset=DataSource("generated", "builtin"))
    assert (
        compare(a, builtin).dataset_change == f"dataset: chat.jsonl (sha256 {'a' * 16}…) -> builtin (generated by orch)"
    )


def _levels(exp_id: str, at: dict[int, dict[str, float]], blocks: int = 5) -> ABResult:
    """Two arms at several concurrency levels: speeds[level][arm]."""
    names = tuple(next(iter(at.values())))
    launches = []
    for b in range(blocks):
        for i, name in enumerate(names):
            runs = tuple(
                dataclasses.replace(_run(k, speeds[name] * FACTORS[b] * (1 + 0.0005 * k)), concurrency=level)
                for level, speeds in at.items()
                for k in range(3)
            )
            launches.append(
                LaunchResult(
                    profile=name,
                    launch_id=f"{exp_id}-{b}-{i}",
                    runs=runs,
                    ready_s=4.0,
                    env_report={"ok": True},
                    teardown={},
                    spec_steps=None,
                    block=b,
                    position=i,
                    arm_index=i,
                )
            )
    return ABResult(
        experiment_id=exp_id,
        simulated=True,
        host="local",
        profiles=names,
        launches=tuple(launches),
        host_facts={},
        design=Design.make(2, blocks, "fixed", 0),
    )


def test_every_level_both_measured_is_judged_and_the_worst_decides() -> None:
    recorded = _levels("a", {1: SPEEDS, 8: {"baseline": 300.0, "eagle3-3step": 200.0}})
    same = compare_levels(recorded, _levels("b", {1: SPEEDS, 8: {"baseline": 300.0, "eagle3-3step": 200.0}}))
    assert same.status == "reproduced" and [float(x.concurrency) for x in same.levels] == [1.0, 8.0]
    assert same.reason.endswith(", at each of the 2 levels")
    # the headline level reproduces, concurrency 8 does not (the speculative arm lost a fifth there): not reproduced,
    # said with its level, and the exit code follows
    moved = compare_levels(recorded, _levels("b", {1: SPEEDS, 8: {"baseline": 300.0, "eagle3-3step": 160.0}}))
    assert [x.status for x in moved.levels] == ["reproduced", "not reproduced"]
    assert moved.status == "not reproduced" and moved.exit_code == 3
    assert moved.reason.startswith("concurrency 8: beyond ±3.0%: eagle3-3step tok/s -20.0%")
    text = compare_text(moved)
    assert "2 levels (concurrency 1, concurrency 8), each judged; tolerance" in text
    assert "  concurrency 1: REPRODUCED: " in text and "  concurrency 8: NOT REPRODUCED: " in text
    doc = json.loads(json.dumps(compare_json(moved)))
    assert doc["status"] == "not reproduced" and doc["concurrency"] == 1
    assert [(x["concurrency"], x["status"]) for x in doc["levels"]] == [(1, "reproduced"), (8, "not reproduced")]
    assert "## concurrency 8: NOT REPRODUCED: " in compare_markdown(moved)
    # one level in common: the plain comparison, no levels
    single = compare_levels(recorded, _levels("b", {1: SPEEDS}))
    assert single.levels == () and single.status == "reproduced"


def _at(result: ABResult, *, rates: tuple[float, ...] = (), concurrency: tuple[int, ...] = ()) -> ABResult:
    """The result with each launch's runs repeated at each level (rates: open loop, concurrency 0)."""
    launches = []
    for la in result.launches:
        runs = [
            dataclasses.replace(r, index=k * len(la.runs) + r.index, rate=rate, concurrency=0)
            for k, rate in enumerate(rates)
            for r in la.runs
        ]
        runs += [
            dataclasses.replace(r, index=k * len(la.runs) + r.index, concurrency=c)
            for k, c in enumerate(concurrency)
            for r in la.runs
        ]
        launches.append(dataclasses.replace(la, runs=tuple(runs)))
    return dataclasses.replace(result, launches=tuple(launches))


NEAREST = "rates close but not equal are never paired"


def test_rates_on_one_side_only_are_named_and_left_out_of_the_verdict() -> None:
    # The reviewer's case: 0.625 and 12.3 req/s in A, 0.634 and 12.3 in B. Only 12.3 is one level of both; it
    # reproduces, and the verdict is that, not "no valid runs" at 0.625 and INCONCLUSIVE.
    c = compare_levels(_at(_result("A", SPEEDS), rates=(0.625, 12.3)), _at(_result("B", SPEEDS), rates=(0.634, 12.3)))
    assert c.status == "reproduced" and c.exit_code == 0
    assert isinstance(c.concurrency, Rate) and c.concurrency == 12.3 and c.levels == ()
    assert [r.verdict.status for r in c.arms if r.verdict] == ["reproduced", "reproduced"]
    assert [(x.side, float(x.level), x.nearest) for x in c.one_sided] == [("A", 0.625, 0.634), ("B", 0.634, 0.625)]
    assert c.reason == (
        "all 3 values agree within ±3.0%, at 12.3 req/s, the one level both measured; not judged, measured on one "
        "side only: A's 0.625 req/s, B's 0.634 req/s"
    )
    a_only = (
        f"0.625 req/s: measured by A only, not judged (B measured rates 0.634, 12.3 req/s; B's nearest, 0.634 req/s, "
        f"is another level: {NEAREST})"
    )
    assert c.one_sided[0].said == a_only
    text = compare_text(c)
    assert text.splitlines()[0] == f"REPRODUCED: {c.reason}"
    assert "  12.3 req/s (the one level both measured); tolerance ±3.0%" in text
    assert f"    {a_only}" in text
    assert "    0.634 req/s: measured by B only, not judged (A measured rates 0.625, 12.3 req/s; A's nearest" in text
    assert "no valid runs" not in text and "blocks would likely decide" not in text
    assert not [line for line in text.splitlines() if line.endswith("one side only")]  # no table row of 0.625's
    md = compare_markdown(c)
    assert "- 0\\.625 req/s: measured by A only, not judged (B measured rates 0.634, 12.3 req/s; B's nearest" in md
    assert "no valid runs" not in md and "| one side only |" not in md
    doc = json.loads(json.dumps(compare_json(c)))
    assert doc["status"] == "reproduced" and doc["exit_code"] == 0 and doc["rate"] == 12.3 and "levels" not in doc
    assert doc["not_judged_levels"][0] == {
        "measured_by": "A",
        "concurrency": None,
        "rate": 0.625,
        "other_side": {"concurrency": [], "rates": [0.634, 12.3]},
        "nearest_rate": 0.634,
        "reason": a_only,
    }
    b_only = doc["not_judged_levels"][1]
    assert (b_only["measured_by"], b_only["rate"], b_only["nearest_rate"]) == ("B", 0.634, 0.625)


def test_concurrency_levels_on_one_side_only_are_named_and_left_out_too() -> None:
    c = compare_levels(
        _at(_result("A", SPEEDS), concurrency=(1, 4, 8)), _at(_result("B", SPEEDS), concurrency=(1, 4, 16))
    )
    assert c.status == "reproduced" and [x.concurrency for x in c.levels] == [1, 4]
    assert c.reason.endswith(
        ", at each of the 2 levels both measured; not judged, measured on one side only: A's concurrency 8, "
        "B's concurrency 16"
    )
    assert [(x.side, x.level, x.nearest) for x in c.one_sided] == [("A", 8, None), ("B", 16, None)]
    text = compare_text(c)
    assert "2 levels both measured (concurrency 1, concurrency 4), each judged" in text
    assert "    concurrency 8: measured by A only, not judged (B measured concurrency 1, 4, 16)" in text
    assert "    concurrency 16: measured by B only, not judged (A measured concurrency 1, 4, 8)" in text
    assert "no valid runs" not in text
    doc = json.loads(json.dumps(compare_json(c)))
    assert [(x["concurrency"], x["status"]) for x in doc["levels"]] == [(1, "reproduced"), (4, "reproduced")]
    assert [(x["measured_by"], x["concurrency"], x["rate"]) for x in doc["not_judged_levels"]] == [
        ("A", 8, None),
        ("B", 16, None),
    ]
    assert doc["not_judged_levels"][0]["other_side"] == {"concurrency": [1, 4, 16], "rates": []}


def test_a_level_on_one_side_only_leaves_the_verdict_and_blocks_hint_to_the_shared_levels() -> None:
    # The shared level is undecided (B: two noisy blocks): the verdict and the "about N blocks" hint are that level's
    # own, as compare gives it there alone; A's other level adds only the sentence that it was not judged.
    a = _at(_result("A", SPEEDS), rates=(0.625, 12.3))
    b = _at(_result("B", SPEEDS, blocks=2, factors=(0.99, 1.02)), rates=(12.3,))
    alone = compare(a, b, concurrency=Rate(12.3))
    assert alone.status == "inconclusive" and "blocks would likely decide" in alone.reason
    c = compare_levels(a, b)
    assert c.status == "inconclusive" and c.exit_code == 4
    assert c.reason == f"12.3 req/s: {alone.reason}; not judged, measured on one side only: A's 0.625 req/s"
    # ... and a shared level that reproduces is reproduced, whatever A measured besides
    same = compare_levels(_at(_result("A", SPEEDS), rates=(0.625, 12.3)), _at(_result("B", SPEEDS), rates=(12.3,)))
    assert same.status == "reproduced" and same.exit_code == 0


def test_rates_that_print_alike_are_told_apart() -> None:
    c = compare_levels(
        _at(_result("A", SPEEDS), rates=(0.625, 12.3)), _at(_result("B", SPEEDS), rates=(0.6250001, 12.3))
    )
    assert c.status == "reproduced"
    assert c.one_sided[0].said.startswith("0.625 req/s: measured by A only")
    assert "B's nearest, 0.6250001 req/s, is another level" in c.one_sided[0].said
    assert c.one_sided[1].said.startswith("0.6250001 req/s: measured by B only")
    assert c.reason.endswith("not judged, measured on one side only: A's 0.625 req/s, B's 0.6250001 req/s")
