"""The `orch` command line: end-to-end A/B in a real subprocess, JSON contract, errors, Ctrl-C."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator.agent import ops
from orchestrator.cli import main
from tests.conftest import NAMESPACE, WriteProfile, run_orch, wait_for_line

SimProfiles = Callable[..., dict[str, Path]]
REPO = Path(__file__).resolve().parents[2]


def orch(*args: str, cwd: Path) -> subprocess.Popen[str]:
    return run_orch(*args, cwd=cwd)


def test_ab_json_end_to_end_in_a_subprocess(sim_profiles: SimProfiles, tmp_path: Path) -> None:
    sim_profiles()
    db = tmp_path / "r.db"
    proc = orch(
        "ab",
        "baseline",
        "eagle3",
        "--sim",
        "--blocks",
        "1",
        "--runs",
        "2",
        "--warmup",
        "1",
        "--max-tokens",
        "48",
        "--grace",
        "2",
        "--min-run-s",
        "0",
        "--json",
        "--db",
        str(db),
        cwd=tmp_path,
    )
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    doc = json.loads(out)  # stdout holds only the JSON document
    assert set(doc) >= {"experiment_id", "simulated", "arms", "comparisons"}
    assert doc["simulated"] is True
    assert [a["profile"] for a in doc["arms"]] == ["baseline", "eagle3"]
    for arm in doc["arms"]:
        assert len(arm["runs"]) == 2
        for run in arm["runs"]:
            assert set(run) >= {"tokens", "seconds", "tok_s", "prompt_tokens", "ttft_s"}
            assert run["tokens"] == 48
        assert arm["median_tok_s"] > 0
    (cmp,) = doc["comparisons"]
    assert cmp["arm"] == "eagle3" and cmp["vs"] == "baseline"
    assert cmp["ratio"] == pytest.approx(doc["arms"][1]["median_tok_s"] / doc["arms"][0]["median_tok_s"])
    assert "SIMULATED" in err and "Run 1/2: 48 tokens in" in err and "env check ok" in err
    (spec,) = doc["speculation"]  # eagle3 vs a non-speculative baseline: explained, with the break-even
    assert spec["arm"] == "eagle3" and spec["steps"] == 3 and spec["measured_tau"] == doc["arms"][1]["accept_length"]
    assert spec["breakeven_tau"] == pytest.approx(spec["cycle_ms"] / spec["baseline_token_ms"])
    rows = sqlite3.connect(db).execute("SELECT COUNT(*) FROM runs").fetchone()[0]
    assert rows == 6
    assert ops.op_find(NAMESPACE) == []


def test_text_output_has_seed_style_run_lines_and_summary(
    sim_profiles: SimProfiles, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    sim_profiles()
    monkeypatch.chdir(tmp_path)
    code = main(
        [
            "bench",
            "baseline",
            "--sim",
            "--runs",
            "2",
            "--warmup",
            "1",
            "--max-tokens",
            "24",
            "--grace",
            "2",
            "--min-run-s",
            "0",
            "--db",
            str(tmp_path / "r.db"),
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "Warmup 1/1 done (" in out
    import re

    # Not a terminal: each progress line starts with the time of day, then the seed's line as it was.
    lines = [re.sub(r"^\d\d:\d\d:\d\d ", "", ln) for ln in out.splitlines()]
    lines = [ln for ln in lines if ln.strip().startswith("Run ")]
    assert len(lines) == 2
    assert re.fullmatch(r"\s+Run 1/2: 24 tokens in \d+\.\d\ds = \d+\.\d tok/s \(prompt: \d+ toks\)", lines[0])
    assert "benchmark of baseline (" in out and "A/B" not in out and "vs " not in out
    assert "SIMULATED" in out and "median" in out


def test_ctrl_c_tears_down_and_marks_interrupted(sim_profiles: SimProfiles, tmp_path: Path) -> None:
    sim_profiles()
    db = tmp_path / "r.db"
    proc = orch(
        "ab",
        "baseline",
        "eagle3",
        "--sim",
        "--runs",
        "50",
        "--warmup",
        "0",
        "--max-tokens",
        "40",
        "--grace",
        "2",
        "--min-run-s",
        "0",
        "--db",
        str(db),
        cwd=tmp_path,
    )
    wait_for_line(proc, "Run 1/50")
    assert ops.op_find(NAMESPACE), "the server should be running mid-benchmark"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Interrupted" in err and "Traceback" not in err
    assert ops.op_find(NAMESPACE) == []
    c = sqlite3.connect(db)
    assert c.execute("SELECT status FROM experiments").fetchone()[0] == "interrupted"
    assert c.execute("SELECT status FROM launches").fetchone()[0] == "interrupted"
    assert c.execute("SELECT COUNT(*) FROM runs").fetchone()[0] >= 1  # runs before the interrupt are kept


def test_sigterm_to_orch_also_tears_down(sim_profiles: SimProfiles, tmp_path: Path) -> None:
    sim_profiles()
    proc = orch(
        "bench",
        "baseline",
        "--sim",
        "--runs",
        "50",
        "--warmup",
        "0",
        "--max-tokens",
        "40",
        "--grace",
        "2",
        "--min-run-s",
        "0",
        "--db",
        str(tmp_path / "r.db"),
        cwd=tmp_path,
    )
    wait_for_line(proc, "Run 1/50")
    proc.terminate()
    proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert ops.op_find(NAMESPACE) == []
    status = sqlite3.connect(tmp_path / "r.db").execute("SELECT status FROM experiments").fetchone()[0]
    assert status == "interrupted"


def test_profiles_commands(
    write_profile: WriteProfile, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    assert main(["profiles", "show", "eagle3-3step"]) == 0
    out = capsys.readouterr().out
    assert "python3 -m sglang.launch_server --model-path /models/Kimi-K2.5-INT4 --tp-size 8" in out
    assert "--speculative-num-draft-tokens 4" in out and "NCCL_BUFFSIZE=16777216" in out
    assert main(["profiles", "show", "baseline", "--sim"]) == 0
    assert "-m orchestrator.sim" in capsys.readouterr().out
    assert main(["profiles", "list"]) == 0
    listing = capsys.readouterr().out
    for name in ("baseline", "eagle3-2step", "eagle3-3step", "kimi-k25-int4-tp8"):
        assert name in listing
    good = REPO / "profiles" / "baseline.yaml"
    bad = write_profile("bad", engine="sglang", model_path="/m", tp_sise=8, port=1)
    assert main(["profiles", "validate", str(good), str(bad)]) == 2  # invalid input
    out = capsys.readouterr().out
    assert f"ok      {good}" in out
    assert "bad.yaml: tp_sise: unknown field (did you mean 'tp_size'?)" in out


def test_errors_are_one_line_without_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["ab", "baseline", "no-such-profile", "--sim"]) == 2  # invalid input
    err = capsys.readouterr().err
    assert err.startswith("Error: no profile named 'no-such-profile'") and "Traceback" not in err
    assert main(["ab", "baseline"]) == 2
    assert "at least two profiles" in capsys.readouterr().err
    assert main(["ab", "baseline", "eagle3-3step", "--host", "gpu-box"]) == 1
    assert "cannot connect to gpu-box" in capsys.readouterr().err
    assert main(["bench", "baseline", "--runs", "0"]) == 2


def test_status_and_down(sim_profiles: SimProfiles, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from orchestrator.config.profile import load
    from orchestrator.hosts.local import LocalHost
    from orchestrator.launch import single

    prof = load(str(sim_profiles()["baseline"]))
    launched = single.launch(LocalHost(), prof, simulate=True, namespace=NAMESPACE)
    time.sleep(0.5)
    assert main(["status"]) == 0
    assert launched.launch_id in capsys.readouterr().out
    assert main(["down", "--grace", "2"]) == 0
    assert f"stopped {launched.launch_id}" in capsys.readouterr().out
    assert ops.op_find(NAMESPACE) == []
    assert main(["status"]) == 0
    assert "nothing launched by orch is running" in capsys.readouterr().out


def _finish(proc: subprocess.Popen[str], timeout: float = 120) -> tuple[str, str]:
    out, err = proc.communicate(timeout=timeout)
    return out, err or ""


def test_blocks_interrupted_then_resumed_with_the_same_order(sim_profiles: SimProfiles, tmp_path: Path) -> None:
    """Ctrl-C in block 2 of 2, then `--resume`: the completed launches stand, the rest of the recorded schedule
    runs, and list/show/export read the result back from the store."""
    from orchestrator.stats.estimates import schedule

    sim_profiles()
    db = str(tmp_path / "r.db")
    common = ["--runs", "2", "--warmup", "1", "--max-tokens", "40", "--grace", "2", "--min-run-s", "0", "--db", db]
    proc = orch("ab", "baseline", "eagle3", "--sim", "--blocks", "2", "--order-seed", "3", *common, cwd=tmp_path)
    seen: list[str] = []
    wait_for_line(proc, "launch 3/4: block 2/2", seen)
    wait_for_line(proc, "Run 1/2", seen)  # mid-benchmark in the first launch of block 2
    proc.send_signal(signal.SIGINT)
    out, err = _finish(proc, 60)
    assert proc.returncode == 130, "".join(seen) + out + err
    c = sqlite3.connect(db)
    exp_id, status = c.execute("SELECT id, status FROM experiments").fetchone()
    assert status == "interrupted"
    assert f"continue it with: orch ab --resume {exp_id}" in out
    statuses = [r[0] for r in c.execute("SELECT status FROM launches ORDER BY started_at")]
    assert statuses == ["complete", "complete", "interrupted"]
    assert ops.op_find(NAMESPACE) == []

    # A partial experiment can be shown (and says how to continue it).
    proc = orch("show", exp_id[:12], "--db", db, cwd=tmp_path)
    out, err = _finish(proc)
    assert proc.returncode == 0, err
    assert f"interrupted after 2 of 4 launches; continue it with: orch ab --resume {exp_id}" in out
    assert "cut short (interrupted; not in the statistics)" in out and "not run" in out  # block 2: one each

    # The workload comes from the experiment: changing it on resume is refused before anything starts.
    proc = orch("ab", "--resume", exp_id, "--runs", "3", "--db", db, cwd=tmp_path)
    out, err = _finish(proc)
    assert proc.returncode == 2 and "drop --runs" in err, err

    proc = orch("ab", "--resume", exp_id, "--grace", "2", "--json", "--db", db, cwd=tmp_path)
    out, err = _finish(proc)
    assert proc.returncode == 0, err
    assert f"resuming {exp_id}: 2 of 4 launches already complete" in err
    doc = json.loads(out)
    assert doc["experiment_id"] == exp_id and doc["status"] == "complete"
    assert doc["blocks"] == 2 and doc["design"]["seed"] == 3 and doc["design"]["order"] == "random"
    assert doc["design"]["schedule"] == schedule(2, 2, "random", 3)
    assert sorted((la["block"], la["profile"]) for la in doc["launches"]) == [
        (0, "baseline"),
        (0, "eagle3"),
        (1, "baseline"),
        (1, "eagle3"),
    ]
    (cmp,) = doc["comparisons"]
    assert cmp["verdict"] in ("slower", "inconclusive")  # eagle3 at accept length ~2 is ~25 % slower
    # An effect these 2 blocks can detect, or (on a noisy machine) the words for one past any use, never both.
    assert cmp["ci95"][0] <= cmp["ratio"] <= cmp["ci95"][1] and (cmp["mde"] is not None) != bool(cmp.get("mde_note"))
    assert any("1 launch(es) cut short are kept in the store but left out" in n for n in doc["notes"])
    # The resumed block ran in the recorded order: positions in the store follow the schedule.
    rows = c.execute(
        "SELECT block, position, arm_index FROM launches WHERE status = 'complete' ORDER BY started_at"
    ).fetchall()
    assert [(b, p) for b, p, _ in rows] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert [arm for _, _, arm in rows] == [a for block in schedule(2, 2, "random", 3) for a in block]
    assert c.execute("SELECT status FROM experiments").fetchone()[0] == "complete"
    assert ops.op_find(NAMESPACE) == []

    proc = orch("ab", "--resume", exp_id, "--db", db, cwd=tmp_path)
    out, err = _finish(proc)
    assert proc.returncode == 1 and "already complete" in err

    proc = orch("list", "--db", db, cwd=tmp_path)
    out, _ = _finish(proc)
    assert exp_id in out and "complete" in out and "4/4" in out and "SIMULATED" in out

    csv_path = tmp_path / "runs.csv"
    proc = orch("export", exp_id, "--format", "csv", "-o", str(csv_path), "--db", db, cwd=tmp_path)
    _, err = _finish(proc)
    assert proc.returncode == 0, err
    lines = csv_path.read_text().splitlines()
    assert lines[0].startswith("experiment_id,simulated,profile,arm_index,label,block") and len(lines) == 1 + 4 * 2
    proc = orch("export", "last", "--format", "md", "--db", db, cwd=tmp_path)
    out, _ = _finish(proc)
    assert out.startswith(f"# A/B {exp_id}") and "eagle3 vs baseline @ 1: " in out
    proc = orch("show", exp_id, "--json", "--db", db, cwd=tmp_path)
    out, _ = _finish(proc)
    shown = json.loads(out)
    assert shown["comparisons"] == doc["comparisons"]  # the stored result reads back as the live one


def test_stored_experiment_commands_fail_cleanly(tmp_path: Path) -> None:
    proc = orch("list", "--db", str(tmp_path / "none.db"), cwd=tmp_path)
    _, err = _finish(proc)
    assert proc.returncode == 1 and "no results database here yet" in err and "Traceback" not in err
    proc = orch("ab", "baseline", "x", "--min-effect", "70%", cwd=tmp_path)
    _, err = _finish(proc)
    assert proc.returncode == 2 and "expected more than 0% and less than 50%" in err
