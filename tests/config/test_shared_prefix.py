"""--prompts shared-prefix:GROUPSxPER_GROUP[:SYSTEM_LEN:QUESTION_LEN]: generated groups of prompts sharing a system
prompt (SGLang's generated-shared-prefix), deterministic from the seed, each group a category, and on the simulator
the prefix cache finding the shared system prompts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from orchestrator.cli import main
from orchestrator.config import datasets, plan, prompts
from orchestrator.config.workload import BenchConfig, request_items
from orchestrator.errors import BenchError, InputError, PromptFileError
from orchestrator.results.bundle import prompt_set
from tests.conftest import FAST_SIM, WriteProfile, free_port

Capsys = pytest.CaptureFixture[str]


def test_the_value_names_groups_prompts_per_group_and_lengths() -> None:
    assert prompts.SharedPrefix.parse("shared-prefix:8x16") == prompts.SharedPrefix(8, 16, 2048, 128)
    assert prompts.SharedPrefix.parse("shared-prefix:2X3:64:8") == prompts.SharedPrefix(2, 3, 64, 8)
    assert prompts.SharedPrefix.parse("builtin") is None
    assert prompts.generated("shared-prefix:2x3") and prompts.generated("random") and not prompts.generated("x.jsonl")


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("shared-prefix:8", "expected shared-prefix:GROUPSxPER_GROUP[:SYSTEM_LEN:QUESTION_LEN]"),
        ("shared-prefix:8x16:512", "expected shared-prefix:GROUPSxPER_GROUP"),
        ("shared-prefix:axb", "expected shared-prefix:GROUPSxPER_GROUP"),
        ("shared-prefix:0x16", "GROUPS must be 1 or more"),
        ("shared-prefix:2x2:0:8", "SYSTEM_LEN must be 1 or more"),
        ("shared-prefix:2000x1000", "2,000,000 prompts; at most 1,000,000"),
    ],
)
def test_a_malformed_value_is_refused_naming_the_form(value: str, why: str) -> None:
    with pytest.raises(PromptFileError, match=why.replace("[", r"\[").replace("]", r"\]")):
        request_items(BenchConfig(runs=1, warmup=0, prompts=value))
    assert issubclass(PromptFileError, InputError)  # exit 2


def test_groups_share_their_system_prompt_and_every_prompt_is_sent_once_per_pass() -> None:
    items = datasets.request_sequence("shared-prefix:3x4:32:8", 12, seed=7)
    assert len({tuple(it.input_ids or ()) for it in items}) == 12  # one pass: every prompt once
    by_group: dict[str, list[tuple[int, ...]]] = {}
    for it in items:
        assert it.input_ids is not None and len(it.input_ids) == 40 and it.text is None
        by_group.setdefault(it.category, []).append(it.input_ids)
    assert sorted(by_group) == ["group-1", "group-2", "group-3"] and all(len(v) == 4 for v in by_group.values())
    systems = {g: {ids[:32] for ids in v} for g, v in by_group.items()}
    assert all(len(s) == 1 for s in systems.values()) and len({next(iter(s)) for s in systems.values()}) == 3
    # Deterministic from the seed; another seed gives other prompts.
    assert datasets.request_sequence("shared-prefix:3x4:32:8", 12, seed=7) == items
    assert datasets.request_sequence("shared-prefix:3x4:32:8", 12, seed=8) != items


def test_it_is_generated_from_the_config_categorised_and_planned() -> None:
    source = "shared-prefix:2x3:64:8"
    assert datasets.provenance(source) is None and datasets.categorised(source)
    bench = BenchConfig(runs=2, warmup=1, prompts=source)
    assert prompt_set({"bench": bench.to_dict(), "requests_sha256": "x"})["generated"] is True
    assert plan.prompt_ids_each(bench) == 72
    with pytest.raises(BenchError, match="--input-len applies to --prompts random only"):
        datasets.request_sequence(source, 2, seed=0, input_len=5)


def test_the_cli_refuses_a_malformed_value_with_exit_2(capsys: Capsys) -> None:
    assert main(["bench", "baseline", "--sim", "--dataset", "shared-prefix:4"]) == 2
    assert "expected shared-prefix:GROUPSxPER_GROUP" in capsys.readouterr().err


@pytest.mark.slow
def test_on_the_simulator_the_shared_system_prompts_come_from_the_cache(
    write_profile: WriteProfile, tmp_path: Path, capsys: Capsys
) -> None:
    common: dict[str, Any] = {"engine": "sglang", "model_path": "/models/m", "tp_size": 2, "ready_timeout_s": 30}
    base = write_profile("cbase", **common, port=free_port(), sim={**FAST_SIM, "prefix_cache_entries": 64})
    # Each run sends its 8 prompts, 2 groups of 4, from an emptied cache: the first of each group finds nothing,
    # the 3 others find their group's 512-token system prompt (of 544 tokens).
    args = ["bench", str(base), "--sim", "--dataset", "shared-prefix:2x4:512:32", "--runs", "2", "--warmup", "0"]
    args += ["--requests-per-stream", "8", "--max-tokens", "8", "--min-run-s", "0", "--flush-cache", "--json"]
    assert main([*args, "--db", str(tmp_path / "r.db")]) == 0
    doc = json.loads(capsys.readouterr().out)
    (arm,) = doc["arms"]
    assert arm["prefix_cache"]["run_hit_rates"] == [pytest.approx(6 * 512 / (8 * 544), abs=0.02)] * 2
    (level,) = doc["by_category"]
    assert level["categories"] == ["group-1", "group-2"]


def test_too_many_generated_prompt_ids_names_the_shared_prefix_lengths() -> None:
    big = "shared-prefix:4x8:8000:64"
    bench = BenchConfig(runs=10, warmup=0, concurrency=(32,), requests_per_stream=8, prompts=big)
    refusal = plan.plan(bench, [], blocks=1, calibrated=False).refusal()
    assert refusal is not None and "generated prompt token ids per launch" in refusal, refusal
    assert "shared-prefix:GxP:S:Q" in refusal, refusal
