"""The lossless check (orch ab --check-outputs) and accept length per request, from the client to every report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from orchestrator.cli import main
from orchestrator.client.request import KEEP_OUTPUT, Record, count_openai_chunk, kept_output
from orchestrator.report.jsondoc import ab_json
from orchestrator.report.markdown import ab_markdown
from orchestrator.report.text import ab_text
from orchestrator.results.model import ABResult, Design, LaunchResult
from orchestrator.results.outputs import accept_distribution, diverge, outputs_check
from orchestrator.results.run import RunResult
from orchestrator.sim.engine import greedy_token
from orchestrator.sim.requests import generate_body, openai_body
from tests.conftest import FAST_SIM, WriteProfile, free_port
from tests.engines.test_llamacpp import children_gone, cpu_profiles, real  # noqa: F401 (fixture)
from tests.wires import body

Capsys = pytest.CaptureFixture[str]


def test_the_body_asks_for_greedy_output_and_the_client_keeps_it_only_when_told() -> None:
    item = {"text": "say something"}
    for endpoint in ("generate", "completions", "chat"):
        built = body(endpoint, item, 8, "m")
        assert KEEP_OUTPUT not in built
        temperature = built["sampling_params"]["temperature"] if endpoint == "generate" else built["temperature"]
        assert temperature == 0.0
        assert body(endpoint, item, 8, "m", keep_output=True)[KEEP_OUTPUT] is True
    rec = Record(index=3, start=0.0, max_tokens=8, output=[])
    for piece in ("Hel", "lo", " world"):
        count_openai_chunk({"choices": [{"text": piece}]}, rec, [])
    rec.temperature = 0.0
    kept = {"index": 3, "text": "Hello world", "pieces": ["Hel", "lo", " world"], "temperature": 0.0}
    assert kept_output(rec) == kept
    rec.error = "stalled"
    assert kept_output(rec) is None  # a cut output says nothing about the decoding
    assert kept_output(Record(index=0, start=0.0, max_tokens=8)) is None


def test_a_divergence_is_found_by_token_or_by_stream_chunk() -> None:
    same = {"text": " a b c", "ids": [1, 2, 3]}
    assert diverge(same, dict(same)) is None
    position, unit, length, base, arm = diverge(same, {"text": " a b d", "ids": [1, 2, 4]}) or ()
    assert (position, unit, length) == (2, "token", 3) and base.endswith("c") and arm.endswith("d")
    pieces = {"text": "one two three", "pieces": ["one", " two", " three"]}
    where = diverge(pieces, {"text": "one two four", "pieces": ["one", " two", " four"]})
    assert where is not None and where[:3] == (2, "chunk", 3)
    # Text only (no ids): the first differing character decides, excerpts are escaped onto one line.
    where = diverge({"text": 'x\n"y', "pieces": ["x", '\n"y']}, {"text": "x\nz", "pieces": ["x", "\nz"]})
    assert where is not None and where[0] == 1 and where[3] == 'x\\n\\"y' and where[4] == "x\\nz"


def _run(index: int, texts: list[str], accepts: list[tuple[float, int]] | None = None) -> RunResult:
    outputs = [
        {"index": i, "text": t.replace("|", ""), "pieces": t.split("|"), "temperature": 0.0}
        for i, t in enumerate(texts)
    ]
    metrics: dict[str, Any] = {"outputs": outputs}
    if accepts:
        metrics["accept_lengths"] = [list(a) for a in accepts]
    return RunResult(
        index=index,
        warmup=False,
        tokens=64,
        seconds=1.0,
        tok_s=64.0,
        prompt_tokens=10,
        ttft_s=0.01,
        concurrency=1,
        metrics=metrics,
    )


def _result(base: list[str], spec: list[str], *, blocks: int = 2, accepts: Any = None) -> ABResult:
    launches = []
    for b in range(blocks):
        launches.append(
            LaunchResult(
                profile="base",
                launch_id=f"b{b}",
                runs=(_run(0, base),),
                ready_s=1.0,
                env_report={"ok": True},
                teardown={},
                spec_steps=None,
                block=b,
                position=0,
                arm_index=0,
            )
        )
        spec_runs = (_run(0, spec, accepts),)
        launches.append(
            LaunchResult(
                profile="spec",
                launch_id=f"s{b}",
                runs=spec_runs,
                ready_s=1.0,
                env_report={"ok": True},
                teardown={},
                spec_steps=3,
                block=b,
                position=1,
                arm_index=1,
            )
        )
    design = Design.make(2, blocks, "fixed", 1)
    return ABResult(
        experiment_id="exp",
        simulated=True,
        host="local",
        profiles=("base", "spec"),
        launches=tuple(launches),
        host_facts={},
        design=design,
    )


def test_identical_arms_pass_and_a_late_rare_divergence_reads_as_numerics() -> None:
    texts = [f"a|b|c|d|e|f|g|h|{i}" for i in range(4)]
    check, control = outputs_check(_result(texts, texts))
    assert (check.compared, check.identical, check.share, check.pattern) == (8, 8, 1.0, "none")
    assert control.kind == "control" and control.compared == 4 and control.share == 1.0
    late = [*texts[:3], "a|b|c|d|e|f|g|X|3"]
    check = outputs_check(_result(texts, late))[0]
    assert check.identical == 6 and check.pattern == "rare" and "numerics" in check.reading()
    first = check.first
    assert first is not None and (first.block, first.request, first.position, first.unit) == (0, 3, 7, "chunk")
    early = ["a|X|c", "Y|b", "a|Z", "a|b|c|d|e|f|g|h|3"]
    check = outputs_check(_result(texts, early))[0]
    assert check.pattern == "early and often" and "broken drafter" in check.reading()
    often = [t[:-1] + "X" for t in texts]
    check = outputs_check(_result(texts, often))[0]
    assert check.pattern == "often, late" and "control" in check.reading()


def test_every_format_reports_the_check_and_the_accept_length_distribution() -> None:
    texts = ["a|b|c", "d|e|f"]
    # One long request accepting 3 per pass and one short accepting 1: tokens weigh the long one in.
    result = _result(texts, ["a|b|c", "d|X|f"], accepts=[(3.0, 90), (1.0, 10)])
    dist = accept_distribution(result.arms[1])
    assert dist is not None and dist.per_request_mean == 2.0 and dist.token_weighted == pytest.approx(2.5)
    assert accept_distribution(result.arms[0]) is None
    text, md, doc = ab_text(result), ab_markdown(result), ab_json(result)
    line = "spec vs base: 2/4 prompts identical (50.0%); 2 diverged, median at 33% of the output; first: block 1"
    assert line in text and line in md and "## Lossless check" in md
    assert "lossless check (--check-outputs; temperature 0.0 sent to every arm: greedy):" in text
    assert "spec: mean of per-request 2.00 vs token-weighted 2.50 (4 requests" in text
    check, control = doc["outputs_check"]
    assert check["share_identical"] == 0.5 and check["first_divergence"]["request"] == 1
    assert check["temperatures"] == [0.0]
    assert check["first_divergence"]["position"] == 1 and check["first_divergence"]["block"] == 1
    assert control["kind"] == "control" and control["share_identical"] == 1.0
    (acc,) = doc["accept_length_per_request"]
    assert acc["arm"] == "spec" and acc["per_request_mean"] == 2.0 and acc["token_weighted"] == pytest.approx(2.5)
    from orchestrator.report.html import ab_html

    page = ab_html(result)
    assert '<section id="lossless-check">' in page and '<figure id="fig-accept">' in page
    # Without kept outputs the check says nothing anywhere.
    plain = ABResult(experiment_id="exp", simulated=True, host="local", profiles=("base",), launches=(), host_facts={})
    assert ab_json(plain)["outputs_check"] is None and "lossless" not in ab_text(plain)


def test_the_simulators_greedy_output_follows_the_prompt_alone() -> None:
    body = {"prompt": "p", "max_tokens": 4, "temperature": 0.0}
    key = openai_body(body, 4096, chat=False).greedy
    assert key is not None and key == openai_body(dict(body), 4096, chat=False).greedy
    assert openai_body({**body, "prompt": "q"}, 4096, chat=False).greedy != key
    assert openai_body({**body, "temperature": 0.7}, 4096, chat=False).greedy is None
    assert openai_body({"prompt": "p", "max_tokens": 4}, 4096, chat=False).greedy is None  # default: sampled
    assert generate_body({"text": "p", "sampling_params": {"temperature": 0}}, 4096).greedy is not None
    assert greedy_token(key, 5) == greedy_token(key, 5) != greedy_token(key, 5, 1)


def _sim_pair(write_profile: WriteProfile, diverge_after: int | None) -> tuple[str, str]:
    common: dict[str, Any] = {"engine": "sglang", "model_path": "/models/m", "tp_size": 2, "ready_timeout_s": 30}
    base = write_profile("base", **common, port=free_port(), sim=dict(FAST_SIM))
    knobs = {**FAST_SIM, **({"diverge_after": diverge_after} if diverge_after is not None else {})}
    spec = {"algorithm": "EAGLE3", "draft_model_path": "/d", "num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4}
    other = write_profile("spec", **common, port=free_port(), sim=knobs, speculative=spec)
    return str(base), str(other)


@pytest.mark.slow
def test_on_the_simulator_a_lossless_drafter_passes_and_a_broken_one_is_found(
    write_profile: WriteProfile, tmp_path: Path, capsys: Capsys
) -> None:
    short = ["--sim", "--runs", "2", "--warmup", "0", "--max-tokens", "24", "--min-run-s", "0", "--check-outputs"]
    db = str(tmp_path / "r.db")
    # Lossless (the default): every prompt identical on /generate (token ids), and the baseline-vs-baseline control.
    code = main(["ab", *_sim_pair(write_profile, None), *short, "--blocks", "2", "--concurrency", "2", "--db", db])
    assert code == 0
    capsys.readouterr()
    assert main(["show", "last", "--db", db, "--json"]) == 0  # read back from the store
    check, control = json.loads(capsys.readouterr().out)["outputs_check"]
    assert (check["compared"], check["identical"], check["pattern"]) == (8, 8, "none")
    assert control["kind"] == "control" and control["compared"] == 4 and control["share_identical"] == 1.0
    # A broken drafter (diverge_after 5) on /v1/completions (text, by stream chunk): every prompt, at chunk 5.
    pair = _sim_pair(write_profile, 5)
    args = ["ab", *pair, *short, "--blocks", "1", "--endpoint", "completions", "--json", "--db", db]
    assert main(args) == 0
    (check,) = json.loads(capsys.readouterr().out)["outputs_check"]
    assert check["compared"] == 2 and check["identical"] == 0 and check["pattern"] == "early and often"
    first = check["first_divergence"]
    assert (first["position"], first["unit"], first["length"], first["request"]) == (5, "chunk", 24, 0)
    assert main(["show", "last", "--db", db]) == 0
    text = capsys.readouterr().out
    assert "spec vs base: 0/2 prompts identical (0.0%)" in text and "more likely a broken drafter" in text


@real
@pytest.mark.slow
def test_a_real_llama_cpp_ab_checks_its_outputs(
    cpu_profiles: tuple[Path, Path],  # noqa: F811 (the fixture imported above)
    tmp_path: Path,
    capsys: Capsys,
) -> None:
    import psutil

    before = {p.pid for p in psutil.Process().children(recursive=True)}
    base, pld = cpu_profiles
    args = ["ab", str(base), str(pld), "--check-outputs", "--blocks", "1", "--runs", "1", "--warmup", "0"]
    args += ["--max-tokens", "16", "--min-run-s", "0", "--json", "--db", str(tmp_path / "r.db")]
    assert main(args) == 0
    (check,) = json.loads(capsys.readouterr().out)["outputs_check"]
    # Whether they match is what the check measures (numerics may differ): here only that it compared the prompt.
    assert check["compared"] == 1 and check["identical"] + check["diverged"] == 1
    assert check["first_divergence"] is None or check["first_divergence"]["unit"] == "chunk"
    children_gone(before)


def _blocks(base: list[list[str]], spec: list[list[str]]) -> ABResult:
    """An A/B whose baseline and arm generated these texts in each block (one run each)."""
    launches = []
    for b, (base_texts, spec_texts) in enumerate(zip(base, spec, strict=True)):
        launches.append(
            LaunchResult(
                profile="base",
                launch_id=f"b{b}",
                runs=(_run(0, base_texts),),
                ready_s=1.0,
                env_report={"ok": True},
                teardown={},
                spec_steps=None,
                block=b,
                position=0,
                arm_index=0,
            )
        )
        launches.append(
            LaunchResult(
                profile="spec",
                launch_id=f"s{b}",
                runs=(_run(0, spec_texts),),
                ready_s=1.0,
                env_report={"ok": True},
                teardown={},
                spec_steps=3,
                block=b,
                position=1,
                arm_index=1,
            )
        )
    return ABResult(
        experiment_id="exp",
        simulated=True,
        host="local",
        profiles=("base", "spec"),
        launches=tuple(launches),
        host_facts={},
        design=Design.make(2, len(base), "fixed", 1),
    )


def test_fishers_exact_test_matches_the_textbook_tables() -> None:
    from orchestrator.stats.fisher import more_often_p

    assert more_often_p(3, 4, 1, 4) == pytest.approx(17 / 70)  # the lady tasting tea, one-sided
    assert more_often_p(4, 12, 0, 6) == pytest.approx(495 / 3060)
    assert more_often_p(0, 12, 0, 6) == 1.0 and more_often_p(0, 0, 0, 0) == 1.0
    with pytest.raises(ValueError):
        more_often_p(5, 4, 0, 4)


def test_the_lossless_check_holds_an_arms_divergences_against_the_baselines_own_repeat() -> None:
    texts = [f"a|b|c|d|e|f|g|h|{i}" for i in range(6)]
    late = [*texts[:4], "a|b|c|d|e|f|g|X|4", "a|b|c|d|e|f|g|X|5"]  # 2 of 6 prompts, late: "rare"
    # The arm diverges on 6 of 18 prompts, the baseline never against itself (0 of 12): more than numerics.
    result = _blocks([texts] * 3, [late] * 3)
    check, control = outputs_check(result)
    assert check.pattern == "rare" and control.kind == "control" and (control.compared, control.identical) == (12, 12)
    assert check.control is not None and check.control.verdict == "more"
    assert "numerics explain" in check.reading() and "consistent with numerics" not in check.reading()
    doc = ab_json(result)["outputs_check"][0]["against_control"]
    p = 18564 / 593775  # C(18,6) / C(30,6): all 6 divergences in the arm's 18 prompts
    assert doc["verdict"] == "more" and doc["p"] == pytest.approx(p) and doc["test"] == "fisher exact, one-sided"
    assert (doc["diverged"], doc["compared"], doc["control_diverged"], doc["control_compared"]) == (6, 18, 0, 12)
    line = "against the control: 6/18 diverged vs 0/12 in the baseline's own repeat: diverges more than numerics "
    line += f"explain (Fisher exact p={p:.3g}, one-sided)"
    from orchestrator.report.html import ab_html

    assert line in ab_text(result) and line in ab_markdown(result) and line.replace("'", "&#x27;") in ab_html(result)
    # The baseline diverges from itself as often (4 of 12): numerics.
    shaky = [*texts[:4], "a|b|c|d|e|f|g|Y|4", "a|b|c|d|e|f|g|Y|5"]
    comparison = outputs_check(_blocks([texts, shaky, shaky], [late, late, late]))[0].control
    assert comparison is not None and comparison.verdict == "numerics"
    assert "no more often than the baseline against itself" in comparison.sentence()
    # Two prompts against one: no split of so few could show more, so it cannot tell.
    comparison = outputs_check(_blocks([texts[:1]] * 2, [texts[:1], ["a|X"]]))[0].control
    assert comparison is not None and (comparison.diverged, comparison.compared) == (1, 2)
    assert comparison.verdict == "cannot tell" and "too few prompts" in comparison.sentence()
    # One block: no control, and the way to get one.
    alone = _blocks([texts], [late])
    (check,) = outputs_check(alone)
    assert check.control is not None and check.control.verdict == "no control"
    assert "--blocks 2 or more" in ab_text(alone) and ab_json(alone)["outputs_check"][0]["against_control"]["p"] is None


def test_several_arms_held_against_one_control_are_one_holm_family() -> None:
    """Two arms, each with its own "diverges more" verdict, printed together: one arm's p of 0.031 would read as a
    broken drafter alone (below 0.05), but held with a second arm by Holm it is tested at 0.025 and is not."""
    texts = [f"a|b|c|d|e|f|g|h|{i}" for i in range(6)]
    late = [*texts[:4], "a|b|c|d|e|f|g|X|4", "a|b|c|d|e|f|g|X|5"]  # diverges on 2 of 6 prompts
    labels = ("base", "spec", "other")
    launches = []
    for b in range(3):
        for position, (label, generated) in enumerate(zip(labels, (texts, late, texts), strict=True)):
            run = _run(0, generated)
            accept = None if label == "base" else 3
            launches.append(
                LaunchResult(
                    profile=label,
                    launch_id=f"{label}{b}",
                    runs=(run,),
                    ready_s=1.0,
                    env_report={"ok": True},
                    teardown={},
                    spec_steps=accept,
                    block=b,
                    position=position,
                    arm_index=position,
                )
            )
    result = ABResult(
        experiment_id="exp",
        simulated=True,
        host="local",
        profiles=labels,
        launches=tuple(launches),
        host_facts={},
        design=Design.make(3, 3, "fixed", 1),
    )
    spec, other, control = outputs_check(result)
    assert control.kind == "control" and spec.control is not None and other.control is not None
    p = 18564 / 593775  # 6 of the arm's 18 prompts against 0 of the control's 12: 0.0313
    assert spec.control.p == pytest.approx(p) and spec.control.family == 2 and spec.control.alpha == 0.025
    assert spec.control.verdict != "more" and other.control.verdict == "numerics"
    assert "held to 0.025 by Holm over 2 arms" in spec.control.sentence()
    doc = ab_json(result)["outputs_check"][0]["against_control"]
    assert doc["alpha"] == 0.025 and doc["adjustment"] == {"method": "holm", "family_size": 2}
    # The same arm alone against the control: "more" at 0.05, no adjustment named.
    alone = _blocks([texts] * 3, [late] * 3)
    single = outputs_check(alone)[0].control
    assert single is not None and single.verdict == "more" and single.family == 1 and "Holm" not in single.sentence()
    assert ab_json(alone)["outputs_check"][0]["against_control"]["adjustment"] is None
