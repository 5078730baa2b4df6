"""What a new user tripped on (issue 35): a missing bundle called a profile, a trace given as a dataset, a dataset
refused after the plan line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.cli import main

Capsys = pytest.CaptureFixture[str]


@pytest.mark.parametrize("target", ["missing.orch.json", "./missing", "sub/missing.json"])
def test_a_missing_bundle_is_called_a_bundle(capsys: Capsys, tmp_path: Path, target: str) -> None:
    """`orch reproduce missing.orch.json` said "no such profile file"."""
    db = tmp_path / "r.db"
    assert main(["reproduce", str(target), "--db", str(db)]) == 2
    out, err = capsys.readouterr()
    said = "no such bundle file (`orch export ID --format bundle` writes one; a PROFILE is a name or a .yaml file)"
    assert out == "" and err == f"Error: {target}: {said}\n", err
    assert "profile file" not in err and not db.exists()
    assert main(["reproduce", str(target), "--db", str(db), "--json"]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert doc["exit_code"] == 2 and "no such bundle file" in doc["error"]


def test_a_missing_profile_is_still_a_profile(capsys: Capsys, tmp_path: Path) -> None:
    # A name, or a .yaml path, is a PROFILE's claim: its refusals are the profile's, as before.
    assert main(["reproduce", "no-such-profile", "--sim", "--db", str(tmp_path / "r.db")]) == 2
    assert "no profile named 'no-such-profile'" in capsys.readouterr().err
    assert main(["reproduce", "missing.yaml", "--sim", "--db", str(tmp_path / "r.db")]) == 2
    assert "missing.yaml: no such profile file" in capsys.readouterr().err


TRACE = '{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [1]}\n'


@pytest.mark.parametrize("command", [["bench", "baseline"], ["ab", "baseline", "eagle3-3step"]], ids=" ".join)
@pytest.mark.parametrize(
    ("name", "content", "said"),
    [
        ("bad.jsonl", '{"prompt": "hi"}\n{"prompt": 5}\n', 'bad.jsonl:2: needs "prompt"'),
        ("missing.jsonl", None, "missing.jsonl: cannot read the prompt file"),
        ("bad.csv", "prompt\n\n", "bad.csv: no prompts in the file"),
        ("bad.json", '[{"conversations": 5}]', 'bad.json:1: expected an object with "conversations"'),
        (
            "trace.jsonl",
            TRACE,
            "trace.jsonl:1: no prompt, but timestamp, input_length, output_length: this looks like a request trace, "
            "not a dataset; replay it with --trace trace.jsonl",
        ),
    ],
    ids=["bad jsonl", "missing", "bad csv", "bad sharegpt", "a trace"],
)
def test_a_bad_dataset_is_refused_before_the_plan_line(
    capsys: Capsys,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    command: list[str],
    name: str,
    content: str | None,
    said: str,
) -> None:
    """`--dataset PATH` (a bad file, a missing one, a request trace): the refusal is all that is printed, and a trace
    is named as one, with the option that replays it."""
    monkeypatch.chdir(tmp_path)
    if content is not None:
        (tmp_path / name).write_text(content)
    db = tmp_path / "r.db"
    assert main([*command, "--sim", "--dataset", name, "--db", str(db)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("Error: ") and said in err and err.count("\n") == 1, (out, err)


def test_a_dataset_with_a_prompt_and_trace_fields_is_a_dataset(tmp_path: Path) -> None:
    # Only a line with no prompt is taken for a trace: prompts with extra fields load as ever.
    from orchestrator.config import prompts

    path = tmp_path / "d.jsonl"
    path.write_text('{"prompt": "hi", "timestamp": 0, "input_length": 1, "output_length": 1}\n')
    assert [item.text for item in prompts.load_jsonl(str(path))] == ["hi"]
