"""Machine-readable output: `--json` documents of the read-only commands (failures too) and `orch export --format
jsonl`, one line per request."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from orchestrator.cli import main
from orchestrator.config import profile as profiles_mod
from tests.conftest import REPO, WriteProfile

Capsys = pytest.CaptureFixture[str]


def run_json(capsys: Capsys, *args: str) -> tuple[int, dict[str, Any]]:
    """`orch ARGS --json`: the exit code and the one document on stdout (nothing else may be there)."""
    code = main([*args, "--json"])
    return code, json.loads(capsys.readouterr().out)


# ---------------------------------------------------------------- --json


def test_json_documents_of_the_read_only_commands(capsys: Capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    code, doc = run_json(capsys, "breakeven", "--baseline-tps", "82.2", "--cycle-ms", "30", "--steps", "3")
    assert code == 0 and doc["status"] == "ok"
    assert doc["breakeven_tau"] == pytest.approx(30 / (1000 / 82.2)) and doc["steps"] == 3

    code, doc = run_json(capsys, "profiles", "list")
    assert code == 0 and doc["status"] == "ok"
    names = {p["name"]: p for p in doc["profiles"]}
    assert {"baseline", "eagle3-3step", "cpu-baseline"} <= set(names)
    assert names["baseline"]["valid"] is True and names["baseline"]["description"]

    code, doc = run_json(capsys, "profiles", "show", "eagle3-3step", "--sim")
    assert code == 0 and doc["name"] == "eagle3-3step" and doc["simulated"] is True
    assert doc["profile"]["speculative"]["num_steps"] == 3 and "extends" not in doc["profile"]
    assert doc["command"][1:3] == ["-m", "orchestrator.sim"] and doc["env"]["NCCL_BUFFSIZE"] == "16777216"

    code, doc = run_json(capsys, "status")
    assert code == 0 and doc["status"] == "ok" and doc["host"] == "local"
    assert isinstance(doc["processes"], list) and "available" in doc["gpus"]

    code, doc = run_json(capsys, "hosts", "check", "local")
    # a warning (no GPU here) is a result, not an error: exit 0 unless some check fails
    assert doc["status"] in ("ok", "warn", "fail") and code == (1 if doc["status"] == "fail" else 0)
    assert doc["checks"][0] == {"level": "ok", "text": "connected to local (this machine)"}


def test_json_list_of_an_empty_store_and_failures_as_documents(tmp_path: Path, capsys: Capsys) -> None:
    from orchestrator.results.store import Store

    db = tmp_path / "r.db"
    code, doc = run_json(capsys, "list", "--db", str(db))
    assert code == 1 and doc["status"] == "error" and "no results database here yet" in doc["error"]
    assert doc["exit_code"] == 1
    Store(db).close()
    code, doc = run_json(capsys, "list", "--db", str(db))
    assert code == 0 and doc == {"status": "ok", "database": str(db), "experiments": []}

    # invalid input keeps its exit code 2, with the usage message in the document, which stderr does not repeat
    code = main(["list", "--json", "--limit", "0"])
    out, err = capsys.readouterr()
    assert code == 2 and json.loads(out)["status"] == "error" and "--limit" in json.loads(out)["error"]
    assert "Error:" not in err and "--limit" not in err, err
    code, doc = run_json(capsys, "breakeven", "--baseline-tps", "0", "--cycle-ms", "30", "--steps", "3")
    assert code == 2 and doc["status"] == "error" and "--baseline-tps" in doc["error"]
    code, doc = run_json(capsys, "profiles", "show", "no-such-profile")
    assert code == 2 and "no profile named 'no-such-profile'" in doc["error"]
    code, doc = run_json(capsys, "hosts", "check", "no-such-host.invalid")
    assert code == 1 and doc["status"] == "error" and "cannot connect" in doc["error"]
    code, doc = run_json(capsys, "status", "--host", "no-such-host.invalid")
    assert code == 1 and doc["status"] == "error"


def test_json_list_after_an_experiment(tmp_path: Path, capsys: Capsys, stored: tuple[Path, str]) -> None:
    db, exp_id = stored
    code, doc = run_json(capsys, "list", "--db", str(db))
    assert code == 0
    (row,) = doc["experiments"]
    assert row["id"] == exp_id and row["arms"] == ["baseline", "eagle3"] and row["simulated"] is True
    assert row["launches_complete"] == row["launches_planned"] == 2 and row["blocks"] == 1
    assert row["status"] == "complete" and row["attached"] is False


# ---------------------------------------------------------------- export --format jsonl


@pytest.fixture
def stored(write_profile: WriteProfile, tmp_path: Path) -> tuple[Path, str]:
    """One short simulated A/B (one block of two arms) in its own store."""
    from orchestrator.config.design import ABConfig
    from orchestrator.config.workload import BenchConfig
    from orchestrator.experiment.ab import run_ab
    from orchestrator.hosts.local import LocalHost
    from orchestrator.results.store import Store
    from tests.conftest import FAST_SIM, NAMESPACE, free_port

    common = {"engine": "sglang", "model_path": "/m", "tp_size": 1, "sim": {**FAST_SIM, "load_s": 0.1}}
    spec = {"algorithm": "EAGLE3", "draft_model_path": "/d", "num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4}
    profiles = [
        profiles_mod.load(str(write_profile("baseline", port=free_port(), **common))),
        profiles_mod.load(str(write_profile("eagle3", port=free_port(), speculative=spec, **common))),
    ]
    db = tmp_path / "r.db"
    bench = BenchConfig(runs=2, warmup=1, max_tokens=12, warmup_max_tokens=4, min_run_s=0)
    config = ABConfig(bench=bench, simulate=True, namespace=NAMESPACE, grace_s=2, blocks=1)
    result = run_ab(LocalHost(), profiles, config, Store(db))
    return db, result.experiment_id


def test_export_jsonl_one_line_per_request(stored: tuple[Path, str], tmp_path: Path, capsys: Capsys) -> None:
    db, exp_id = stored
    assert main(["export", "last", "--db", str(db), "--format", "jsonl"]) == 0
    lines = capsys.readouterr().out.splitlines()
    records = [json.loads(line) for line in lines]
    assert len(records) == 2 * 2  # two arms, two timed runs of one request each; the warmup is left out
    first = records[0]
    assert list(first) == [
        "experiment_id",
        "simulated",
        "profile",
        "arm_index",
        "label",
        "launch_id",
        "block",
        "position",
        "concurrency",
        "run",
        "run_valid",
        "request",
        "tokens",
        "prompt_tokens",
        "ttft_s",
        "e2e_s",
        "chunks",
        "accept_length",
        "error",
        "attached",
    ]
    assert {r["experiment_id"] for r in records} == {exp_id}
    assert {r["profile"] for r in records} == {"baseline", "eagle3"}
    # counts start at 1, as in the CSV and the text report
    assert {r["block"] for r in records} == {1} and sorted({r["run"] for r in records}) == [1, 2]
    assert {r["request"] for r in records} == {1} and {r["position"] for r in records} == {1, 2}
    for r in records:
        assert r["tokens"] == 12 and r["error"] is None and r["run_valid"] is True
        assert 0 < r["ttft_s"] <= r["e2e_s"]
    assert all(r["accept_length"] for r in records if r["profile"] == "eagle3")

    # the same records from a result bundle, and to a file
    bundle, out = tmp_path / "b.orch.json", tmp_path / "req.jsonl"
    assert main(["export", exp_id, "--db", str(db), "--format", "bundle", "-o", str(bundle)]) == 0
    assert main(["export", str(bundle), "--format", "jsonl", "-o", str(out)]) == 0
    assert out.read_text().splitlines() == lines
