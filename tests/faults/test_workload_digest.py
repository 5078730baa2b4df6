"""The fingerprint's workload digest is what is sent, not where the prompt file lives; the renamed field keeps stored
fingerprints and nightly histories comparable."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import yaml

from orchestrator.config.workload import BenchConfig
from orchestrator.launch import fingerprint
from orchestrator.nightly import history, result
from orchestrator.report import html
from tests.conftest import FAST_SIM, free_port
from tests.faults.support import FAST, assert_nothing_left, assert_plain, run
from tests.nightly.support import item_night

PROMPTS = [{"category": "chat", "prompt": f"tell me about the number {i}"} for i in range(4)]


def _prompt_file(path: Path, items: list[dict[str, str]] = PROMPTS) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(it) + "\n" for it in items))
    return str(path)


def test_the_digest_is_of_the_requests_not_of_the_prompt_files_path(tmp_path: Path) -> None:
    here = BenchConfig(runs=2, prompts=_prompt_file(tmp_path / "a" / "prompts.jsonl"))
    there = dataclasses.replace(here, prompts=_prompt_file(tmp_path / "elsewhere" / "copy.jsonl"))
    assert fingerprint.workload_digest(here) == fingerprint.workload_digest(there)
    edited = dataclasses.replace(here, prompts=_prompt_file(tmp_path / "b" / "p.jsonl", PROMPTS[:3]))
    assert fingerprint.workload_digest(edited) != fingerprint.workload_digest(here)
    assert fingerprint.workload_digest(dataclasses.replace(here, max_tokens=64)) != fingerprint.workload_digest(here)


def _fp(**fields: Any) -> dict[str, Any]:
    return {"version": 1, "gpus": {"model": "H200"}, "software": {"engine_version": "0.5.9"}, **fields}


def test_an_old_fingerprints_digest_is_no_difference_but_a_new_one_is() -> None:
    old, new = _fp(workload_digest="path-and-requests"), _fp(workload_sha256="requests")
    assert [d for d in fingerprint.diff(old, new) if d.category == "workload"] == []
    changed = fingerprint.diff(new, _fp(workload_sha256="other requests"))
    assert [d.describe() for d in changed] == ["workload: requests -> other requests"]


def _night(i: int, fp: dict[str, Any], value: float) -> history.ItemNight:
    env = fingerprint.environment(fp)
    series = history.SeriesValue(
        series="a:tok_s",
        arm="a",
        metric="tok_s",
        value=value,
        lo=None,
        hi=None,
        n=3,
        threshold=0.05,
        higher_is_better=True,
        env=history.env_key({"a": env}, ["a"]),
        env_arms=("a",),
    )
    return item_night(i, [series], {"a": env})


def test_a_nightly_history_stored_with_the_old_digest_goes_on_in_one_environment() -> None:
    """Nights stored before the rename hold workload_digest; tonight holds workload_sha256: the same series, no
    environment step (while a changed digest under one name would be one)."""
    past = [_night(i, _fp(workload_digest="old"), 100.0 + (i % 3) * 0.3) for i in range(8)]
    tonight = _night(8, _fp(workload_sha256="new"), 100.2)
    value = tonight.series[0]
    verdict = result.judge(value, past, tonight, 5)
    assert verdict.status == "ok", verdict
    assert set(result.series_env_ids([(n, n.series[0]) for n in [*past, tonight]])) == {"0"}
    # The contrast: the same field with another value is a step in the environment.
    moved = _night(8, _fp(workload_digest="other"), 100.2)
    assert result.judge(moved.series[0], past, moved, 5).status == "environment"


def test_reproducing_a_file_prompt_bundle_names_no_workload_cause(tmp_path: Path) -> None:
    prof = tmp_path / "profiles" / "p.yaml"
    prof.parent.mkdir()
    port = free_port()
    prof.write_text(
        yaml.safe_dump(dict(engine="sglang", model_path="/m", tp_size=1, port=port, ready_timeout_s=30, sim=FAST_SIM))
    )
    prompts = _prompt_file(tmp_path / "work" / "prompts.jsonl")
    db, bundle = tmp_path / "sender.db", tmp_path / "r.orch.json"
    args = ("--sim", "--prompts", prompts, "--runs", "2", "--max-tokens", "32", *FAST)
    assert (out := run("bench", str(prof), *args, "--db", str(db), cwd=tmp_path)).rc == 0, out.text
    assert run("export", "last", "--format", "bundle", "-o", str(bundle), "--db", str(db), cwd=tmp_path).rc == 0

    again = run("reproduce", str(bundle), "--json", "--gpu-wait", "0", "--db", str(tmp_path / "mine.db"), cwd=tmp_path)
    assert again.rc in (0, 3, 4), again.text
    assert_plain(again.text)
    causes = json.loads(again.out)["reproduction"]["causes"]
    assert not [c for c in causes if c.startswith("workload")], causes
    assert_nothing_left(port)


def test_the_html_report_shows_the_digest_of_either_scheme() -> None:
    shown = {path for _, path in html.FINGERPRINT_ROWS}
    assert (fingerprint.WORKLOAD_KEY,) in shown and (fingerprint.LEGACY_WORKLOAD_KEY,) in shown
