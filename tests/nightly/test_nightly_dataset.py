"""A nightly item's dataset file edited between nights: an environment change naming the dataset (old -> new, by
name and sha256), a new history segment, never a regression; `orch history` says the same."""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator.config import datasets
from tests.conftest import WriteProfile
from tests.faults.support import assert_nothing_left, run
from tests.nightly.test_nightly import night, sim_profile, write_suite


def test_a_dataset_changed_between_nights_is_an_environment_step(write_profile: WriteProfile, tmp_path: Path) -> None:
    sim_profile(write_profile, "check")
    data = tmp_path / "chat.jsonl"
    data.write_text('{"prompt": "Tell me about the sea.", "category": "chat"}\n')
    before = datasets.file_sha256(str(data))
    item = {"name": "check", "bench": "check", "workload": {"prompts": "chat.jsonl", "runs": 1}}
    suite = write_suite(tmp_path, [item])
    db = tmp_path / "nightly.db"
    rc, out, err = night(suite, db, "2026-11-01")
    assert rc == 0 and "building history `check`" in out, out + err

    data.write_text('{"prompt": "Write a limerick about a GPU.", "category": "chat"}\n')
    after = datasets.file_sha256(str(data))
    rc, out, err = night(suite, db, "2026-11-02", "--json")
    assert rc == 0, out + err
    (doc,) = json.loads(out)["items"]
    change = f"dataset: chat.jsonl (sha256 {before[:16]}…) -> chat.jsonl (sha256 {after[:16]}…)"
    assert doc["status"] == "environment", doc
    for series in doc["series"]:
        assert series["status"] == "environment" and series["note"].startswith(change), series

    hist = run("history", "check", "--db", str(db), "--metric", "tok_s", cwd=tmp_path)
    assert hist.rc == 0, hist.text
    rows = [x for x in hist.out.splitlines() if x.lstrip().startswith("2026-11-")]
    assert len(rows) == 2 and f"environment change: {change}" in rows[1] and "◆ environment step" in rows[1], rows
    assert_nothing_left()
