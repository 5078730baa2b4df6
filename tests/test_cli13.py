"""Issue 13's CLI: `--json` documents (errors too), per-request JSONL export, profile validate/show as a user meets
them."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator import profile as profiles_mod
from orchestrator.cli import main
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
    from orchestrator.store import Store

    db = tmp_path / "r.db"
    code, doc = run_json(capsys, "list", "--db", str(db))
    assert code == 1 and doc["status"] == "error" and "no results database here yet" in doc["error"]
    assert doc["exit_code"] == 1
    Store(db).close()
    code, doc = run_json(capsys, "list", "--db", str(db))
    assert code == 0 and doc == {"status": "ok", "database": str(db), "experiments": []}

    # invalid input keeps its exit code 2, with the usage message in the document; stderr keeps the human line
    code = main(["list", "--json", "--limit", "0"])
    out, err = capsys.readouterr()
    assert code == 2 and json.loads(out)["status"] == "error" and "--limit" in json.loads(out)["error"]
    assert "Error:" in err
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
    from orchestrator.ab import ABConfig, run_ab
    from orchestrator.bench import BenchConfig
    from orchestrator.hosts.local import LocalHost
    from orchestrator.store import Store
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


# ---------------------------------------------------------------- profiles validate / show


def test_validate_takes_names_and_files_and_lists_every_problem(
    write_profile: WriteProfile, tmp_path: Path, capsys: Capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    bad = write_profile(
        "bad",
        engine="sglang",
        model_pth="/m",
        port=99999,
        tp_size=0,
        speculative={"algorithm": "EAGLE3", "num_stepz": 3},
        env={"1BAD": "x"},
        sim={"load_s": -1},
    )
    assert main(["profiles", "validate", "baseline", "eagle3-3step", "bad", str(bad), "nope", "gone.yaml"]) == 2
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("ok      baseline (") and lines[0].endswith("baseline.yaml)")
    assert lines[1].startswith("ok      eagle3-3step (")
    problems = [line for line in lines if line.startswith(f"invalid {bad}: ")]
    assert len(problems) == 12  # by name and by path: the same file, every problem of it each time
    problems = problems[:6]
    assert [p.split(": ")[1] for p in problems] == [
        "model_pth",
        "tp_size",
        "port",
        "speculative.num_stepz",
        "sim.load_s",
        "env.1BAD",
    ]
    assert "did you mean 'model_path'?" in problems[0] and "did you mean 'num_steps'?" in problems[3]
    assert lines[-2].startswith("invalid nope: no such profile; profiles: ")
    assert lines[-1] == "invalid gone.yaml: no such file"


def test_validate_says_a_mistyped_name_is_no_profile_and_offers_the_close_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["profiles", "validate", "eagle3-3stp"]) == 2
    line = capsys.readouterr().out.strip()
    assert line.startswith("invalid eagle3-3stp: no such profile (did you mean 'eagle3-3step'?); profiles: "), line
    assert "baseline, " in line and "eagle3-3step" in line.rsplit("profiles: ", 1)[1]


def test_problems_across_an_extends_chain_and_after_the_merge(write_profile: WriteProfile) -> None:
    write_profile("parent", engine="sglang", model_path="/m", port=1, tp_sise=2)
    child = write_profile("child", extends="parent", mem_fraction_static=2)
    with pytest.raises(profiles_mod.ProfileProblems) as err:
        profiles_mod.validate_file(str(child))
    assert [p.split(": ")[1] for p in err.value.problems] == ["mem_fraction_static", "tp_sise"]
    lone = write_profile("lone", engine="llamacpp", port=1, tp_size=2, served_model_name="x")
    with pytest.raises(profiles_mod.ProfileProblems) as err:
        profiles_mod.validate_file(str(lone))
    fields = [p.split(": ")[1] for p in err.value.problems]
    assert "model_path" in fields and "tp_size" in fields  # missing, and not a llama.cpp field: both said
    # one problem reads exactly as before
    one = write_profile("one", engine="sglang", model_path="/m", port=1, tp_sise=2)
    with pytest.raises(profiles_mod.ProfileError, match=r"^\S+one.yaml: tp_sise: unknown field"):
        profiles_mod.validate_file(str(one))


@pytest.mark.parametrize("name", ["eagle3-3step", "cpu-pld", "cpu-baseline", "baseline"])
def test_profiles_show_prints_yaml_that_starts_a_new_profile(
    name: str, tmp_path: Path, capsys: Capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    assert main(["profiles", "show", name]) == 0
    out = capsys.readouterr().out
    data = yaml.safe_load(out)  # the command and the provenance are comments
    assert isinstance(data, dict) and "extends" not in data and "name" not in data
    original = profiles_mod.load(name)
    copy = tmp_path / "copy.yaml"
    copy.write_text(out)
    again = profiles_mod.validate_file(str(copy))
    assert profiles_mod.differing_fields(original, again) == []
    assert again.launch_argv("python3", simulate=False) == original.launch_argv("python3", simulate=False)
    command = "\n".join(line[4:] for line in out.splitlines() if line.startswith("#   "))
    assert shlex.split(command)[-len(original.server_flags()) :] == original.server_flags()


def test_profiles_show_keeps_secrets_out(write_profile: WriteProfile, capsys: Capsys) -> None:
    path = write_profile(
        "secret", engine="vllm", model_path="/m", port=1, env={"HF_TOKEN": "hf_supersecret"},
        server_args=["--api-key", "sk-supersecret"],
    )  # fmt: skip
    assert main(["profiles", "show", str(path)]) == 0
    out = capsys.readouterr().out
    assert "supersecret" not in out and "secret-looking values are shown as digests" in out
    assert main(["profiles", "show", str(path), "--json"]) == 0
    assert "supersecret" not in capsys.readouterr().out


# ---------------------------------------------------------------- make demo


def test_make_demo_stores_where_list_and_show_look_and_ends_with_the_report(
    sim_profiles: Any, tmp_path: Path, capsys: Capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchestrator import store

    makefile = (REPO / "Makefile").read_text()
    recipe = makefile.split("\ndemo: install\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert len(recipe) == 1 and "orch ab baseline eagle3-3step --sim" in recipe[0]  # nothing after the verdict
    assert "--db" not in recipe[0]
    # what the demo does, shortened: an A/B without --db, then list and show find it in the default database
    sim_profiles()
    monkeypatch.chdir(tmp_path)
    args = ["--sim", "--blocks", "1", "--runs", "1", "--warmup", "0", "--max-tokens", "8", "--min-run-s", "0"]
    assert main(["ab", "baseline", "eagle3", *args]) == 0
    capsys.readouterr()
    code, doc = run_json(capsys, "list")
    assert code == 0 and len(doc["experiments"]) == 1
    assert doc["database"] == str(store.default_path())  # in the user data dir (the tests' private XDG dir here)
    assert main(["show", "last"]) == 0
    assert doc["experiments"][0]["id"] in capsys.readouterr().out


# ---------------------------------------------------------------- packaging


def test_packaging_metadata() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    meta = tomllib.loads((REPO / "pyproject.toml").read_text())
    project = meta["project"]
    # `orch` on the package index is an unrelated project; the command and the import package keep their names
    assert project["name"] == "orch-bench" and project["scripts"] == {"orch": "orchestrator.cli:entry"}
    # an SPDX expression (the table form is deprecated), which needs setuptools >= 77 and no licence classifier
    assert project["license"] == "MIT" and meta["build-system"]["requires"] == ["setuptools>=77"]
    assert not [c for c in project["classifiers"] if c.startswith("License ::")]
    assert "Programming Language :: Python :: 3.10" in project["classifiers"]
    assert "pipx install ." in (REPO / "README.md").read_text()
