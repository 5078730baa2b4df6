"""Bundle numbers and plans: every number checked on read, every plan within `orch ab`'s limits before anything is
built, a finished reproduction never lost to its judging step, and prompts handed on through any number of people."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.cli import main
from orchestrator.config import limits
from orchestrator.config.options import OptionError, RunOptions
from orchestrator.experiment import reproduce as reproduce_mod
from orchestrator.results import bundle as bundle_mod
from tests.conftest import FAST_SIM, free_port
from tests.faults.support import FAST, assert_plain, orch_env, run

PROFILE = {"engine": "sglang", "model_path": "/models/m", "tp_size": 1, "ready_timeout_s": 30, "sim": FAST_SIM}
PROMPTS = [{"category": "file", "prompt": "first prompt"}, {"category": "chat", "prompt": "second prompt"}]


@pytest.fixture(scope="module")
def sent(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A simulator experiment sent with `--prompts FILE`, exported as a bundle; the file is gone afterwards (as on
    any receiver's disk)."""
    root = tmp_path_factory.mktemp("sender")
    (root / "profiles").mkdir()
    (root / "profiles" / "p.yaml").write_text(yaml.safe_dump({**PROFILE, "port": free_port()}))
    prompt_file = root / "mine.jsonl"
    prompt_file.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    env = orch_env(root / "home")
    ran = run("bench", "p", "--sim", "--runs", "1", "--max-tokens", "16", *FAST, "--prompts", str(prompt_file),
              cwd=root, env=env)  # fmt: skip
    assert ran.rc == 0, ran.text
    path = root / "sent.orch.json"
    exported = run("export", "last", "--format", "bundle", "-o", str(path), cwd=root, env=env)
    assert exported.rc == 0, exported.text
    prompt_file.unlink()
    return {"root": root, "path": path, "bundle": json.loads(path.read_text())}


def _forged(sent: dict[str, Any], tmp_path: Path, change: str) -> Path:
    """The sent bundle with one change, its digest recomputed (as anyone can): only the checks on read stop it."""
    bundle = json.loads(json.dumps(sent["bundle"]))
    content = bundle["content"]  # noqa: F841 (used by the change)
    exec(change)
    bundle["digest"] = bundle_mod.digest_of(bundle)
    path = tmp_path / "forged.orch.json"
    path.write_text(json.dumps(bundle))
    return path


RUN = 'content["launches"][0]["runs"][-1]'
NUMBERS = {
    "tok_s NaN": (
        f'{RUN}["tok_s"] = float("nan")',
        "content.launches[0].runs[0].tok_s: expected a finite number, got NaN",
    ),
    "tok_s 0": (
        f'{RUN}["tok_s"] = 0',
        "content.launches[0].runs[0].tok_s: a valid run measured more than 0 tok/s, got 0",
    ),
    "tok_s negative": (
        f'{RUN}["tok_s"] = -5.0',
        "content.launches[0].runs[0].tok_s: expected a number of at least 0, got -5.0",
    ),
    "ttft infinite": (
        f'{RUN}["ttft_s"] = float("inf")',
        "content.launches[0].runs[0].ttft_s: expected a finite number, got Infinity",
    ),
    "max_tokens -1": (
        'content["config"]["bench"]["max_tokens"] = -1',
        "content.config.bench.max_tokens: expected a whole number from 1 to 1,000,000, got -1",
    ),
    "runs 10^9": (
        'content["config"]["bench"]["runs"] = 10**9',
        "content.config.bench.runs: expected a whole number from 1 to 10,000, got 1000000000",
    ),
    "blocks 10^9": ('content["design"]["blocks"] = 10**9', "content.design.blocks: expected a whole number from 1 to"),
}


@pytest.fixture
def nothing_built(monkeypatch: pytest.MonkeyPatch) -> None:
    """Building a request sequence or starting the A/B fails the test at once: a regression past the checks must
    fail it, not take the machine's memory (runs or blocks of 10^9 grow it by tens of MB/s)."""
    from orchestrator.config import prompts

    def built(*args: object, **kw: object) -> None:
        raise AssertionError("got past the plan checks")

    monkeypatch.setattr(prompts, "request_sequence", built)
    monkeypatch.setattr(reproduce_mod, "run_ab", built)


@pytest.mark.parametrize("case", list(NUMBERS))
def test_every_number_of_a_bundle_is_checked_on_read(
    sent: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str], nothing_built: None, case: str
) -> None:
    """show, compare, import and reproduce all refuse it with exit 2 naming the field, before anything runs."""
    change, expected = NUMBERS[case]
    bad = _forged(sent, tmp_path, change)
    db = tmp_path / "r.db"
    for command in (
        ["show", str(bad)],
        ["compare", str(bad), str(sent["path"])],
        ["import", str(bad), "--db", str(db)],
        ["reproduce", str(bad), "--db", str(db), "--gpu-wait", "0"],
    ):
        assert main(command) == 2, command
        captured = capsys.readouterr()
        assert captured.err.startswith(f"Error: {bad}: ") and expected in captured.err, captured.err
        assert "Traceback" not in captured.err and "unexpected" not in captured.err
        assert "reproducing" not in captured.out + captured.err
    assert not db.exists()


def test_a_bundles_plan_meets_the_limits_orch_ab_keeps(
    sent: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str], nothing_built: None
) -> None:
    """Every field in range, yet 10000 runs at 1 and at 4096 streams: the plan `orch ab` refuses is refused for a
    bundle too, before "reproducing" and before a request is generated. (The recorded runs, at concurrency 1, are
    runs of that workload: a workload without their level is refused on read.)"""
    bad = _forged(sent, tmp_path, 'content["config"]["bench"].update(runs=10000, concurrency=[1, 4096], max_tokens=1)')
    db = tmp_path / "r.db"
    assert main(["reproduce", str(bad), "--db", str(db), "--gpu-wait", "0"]) == 2
    captured = capsys.readouterr()
    assert "the bundle's plan is refused" in captured.err and "over the limit of 100000" in captured.err
    assert "reproducing" not in captured.out + captured.err and not db.exists()
    # --blocks may change a bundle's blocks, within the same limits.
    assert main(["reproduce", str(sent["path"]), "--blocks", "1001", "--db", str(db)]) == 2
    assert "1001" in capsys.readouterr().err and not db.exists()


def test_a_plan_from_any_caller_is_checked_before_anything_is_built() -> None:
    """run_ab itself refuses an absurd plan (a caller that skipped the check), before touching the host or store."""
    from orchestrator.config.design import ABConfig
    from orchestrator.config.profile import from_resolved
    from orchestrator.config.workload import BenchConfig
    from orchestrator.experiment.ab import run_ab

    prof = from_resolved({**PROFILE, "name": "p", "port": 1, "speculative": None}, "test")
    absurd = ABConfig(bench=BenchConfig(runs=10000, concurrency=(4096,)), simulate=True, namespace="x", blocks=1)
    with pytest.raises(limits.PlanError, match="over the limit of 100000"):
        run_ab(None, [prof], absurd, None)  # type: ignore[arg-type]
    with pytest.raises(limits.PlanError, match="blocks: expected a whole number from 1 to 1000"):
        run_ab(None, [prof], ABConfig(bench=BenchConfig(), namespace="x", blocks=10**9), None)  # type: ignore[arg-type]


def test_a_failure_judging_a_reproduction_keeps_and_names_the_new_experiment(
    sent: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(*args: object, **kw: object) -> None:
        raise ValueError("values must be positive to be compared on the log scale")

    monkeypatch.setattr(reproduce_mod, "compare_results", broken)
    db = tmp_path / "r.db"
    # The receiver has no profile named p: its bundle runs only when told to (docs/reproduce.md#trust).
    rc = main(["reproduce", str(sent["path"]), "--trust-bundle", "--db", str(db), "--gpu-wait", "0", "--grace", "2"])
    captured = capsys.readouterr()
    assert rc == 1, captured.err
    conn = sqlite3.connect(db)
    try:
        (exp_id, status), *_ = conn.execute("SELECT id, status FROM experiments WHERE imported_json IS NULL").fetchall()
    finally:
        conn.close()
    assert status == "complete"
    assert f"stored as experiment {exp_id}" in captured.err and f"orch show {exp_id}" in captured.err
    assert f"orch compare {sent['path']} {exp_id}" in captured.err and "ValueError" in captured.err
    assert_plain(captured.out + captured.err)


def test_prompts_survive_a_chain_of_hand_ons(sent: dict[str, Any], tmp_path: Path) -> None:
    """sender → B (import, export) → C (import, export) → reproduce at C: the prompt file exists on no disk but
    the sender's (now deleted), yet every bundle carries it and the last one re-sends the same requests."""
    previous: Path = sent["path"]
    for person in ("b", "c"):
        env = orch_env(tmp_path / person)
        imported = run("import", str(previous), cwd=tmp_path, env=env)
        assert imported.rc == 0, imported.text
        handed = tmp_path / f"from-{person}.orch.json"
        exported = run("export", "last", "--format", "bundle", "-o", str(handed), cwd=tmp_path, env=env)
        assert exported.rc == 0, exported.text
        shipped = bundle_mod.read_bundle(handed)["content"]["prompts"]
        assert shipped["items"] == PROMPTS, shipped
        assert bundle_mod.read_bundle(handed)["content"] == sent["bundle"]["content"]
        previous = handed
    again = run("reproduce", str(previous), "--trust-bundle", "--gpu-wait", "0", "--grace", "2", cwd=tmp_path, env=env)
    assert again.rc in (0, 3, 4), again.text
    assert "cannot be re-sent" not in again.text and "differ from the recorded ones" not in again.text
    assert_plain(again.text)


def test_a_resumed_experiment_meets_the_same_limits(
    sent: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str], nothing_built: None
) -> None:
    """A stored experiment (imported, or written by an older orch) whose workload is absurd: --resume refuses it
    with the field named, before its request sequence is built."""
    db = tmp_path / "r.db"
    assert main(["import", str(sent["path"]), "--db", str(db)]) == 0
    exp_id = sent["bundle"]["content"]["experiment"]["id"]
    config = {**sent["bundle"]["content"]["config"]}
    config["bench"] = {**config["bench"], "runs": 10**9}
    conn = sqlite3.connect(db)
    try:
        with conn:
            conn.execute("UPDATE experiments SET config_json = ?, status = 'interrupted'", (json.dumps(config),))
    finally:
        conn.close()
    capsys.readouterr()
    assert main(["ab", "--resume", exp_id, "--db", str(db)]) == 2
    err = capsys.readouterr().err
    assert "runs: expected a whole number from 1 to 10,000, got 1000000000" in err and "Traceback" not in err


def test_a_bundle_is_planned_with_its_own_settings(sent: dict[str, Any], nothing_built: None) -> None:
    """The core without click: a bundle's plan keeps its blocks and port unless this run gives them, and refuses
    the settings it fixes (this machine has no profile named p: --trust-bundle lets its bundle run)."""
    options = RunOptions(command="reproduce", blocks=None, trust_bundle=True)
    plan = reproduce_mod.plan_reproduction(str(sent["path"]), reproduce_mod.Claim(), options)
    assert isinstance(plan, reproduce_mod.BundlePlan) and plan.simulated and plan.blocks is None
    assert [p.name for p in plan.profiles] == ["p"]
    assert plan.options.port == sent["bundle"]["content"]["config"].get("port")
    again = reproduce_mod.plan_bundle(str(sent["path"]), options.replace(blocks=2, given=frozenset({"blocks"})))
    assert again.blocks == 2
    with pytest.raises(OptionError, match="drop --runs, --seed"):
        reproduce_mod.plan_bundle(str(sent["path"]), options.replace(runs=3, seed=1, given=frozenset({"runs", "seed"})))
