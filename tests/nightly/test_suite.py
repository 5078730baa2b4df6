"""Nightly suite files: what a valid one becomes, and every mistake refused with file, item and field named."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.nightly import suite as suite_mod
from orchestrator.nightly.suite import SuiteError
from tests.conftest import WriteProfile
from tests.faults.support import assert_plain, run


@pytest.fixture
def suite_dir(write_profile: WriteProfile, profile_dir: Path) -> Path:
    """profiles/ with a plain and a speculative profile, next to where the suite file goes."""
    write_profile("plain", engine="sglang", model_path="/m", tp_size=1, port=31111, sim={"load_s": 0.1})
    write_profile(
        "spec",
        extends="plain",
        speculative={"algorithm": "EAGLE3", "draft_model_path": "/d", "num_steps": 3, "eagle_topk": 1,
                     "num_draft_tokens": 4},
    )  # fmt: skip
    return profile_dir.parent


def write_suite(where: Path, data: Any, name: str = "suite.yaml") -> Path:
    path = where / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
    return path


GOOD: dict[str, Any] = {
    "suite": "box",
    "deadline": "2h",
    "wait": "10m",
    "defaults": {
        "host": "local",
        "sim": True,
        "threshold": "3%",
        "workload": {"runs": 2, "max_tokens": 64, "min_run_s": 0},
    },
    "items": [
        {"name": "spec-vs-plain", "ab": ["plain", "spec"], "metrics": ["tok_s", "accept_length"], "fail_on": "slower"},
        {
            "name": "plain-levels",
            "bench": "plain",
            "blocks": 2,
            "workload": {"concurrency": [1, 8], "warmup": 0},
            "metrics": {"tok_s": "2%", "agg_tok_s@8": "5%", "ttft_p99@8": 0.1},
            "timeout": 600,
            "grace": "5s",
            "gpu_wait": "2m",
        },
    ],
}


def test_a_valid_suite(suite_dir: Path) -> None:
    s = suite_mod.load(write_suite(suite_dir, GOOD))
    assert s.name == "box" and s.deadline_s == 7200 and s.wait_s == 600 and s.confirm and s.min_history == 5
    ab, bench = s.items
    assert ab.kind == "ab" and [p.name for p in ab.profiles] == ["plain", "spec"] and ab.blocks == 3
    assert ab.fail_on == ("slower",) and ab.sim and ab.threshold == pytest.approx(0.03)
    assert [m.key for m in ab.metrics] == ["tok_s", "accept_length"]
    assert ab.bench.runs == 2 and ab.bench.max_tokens == 64 and ab.bench.warmup == 2
    # The item's workload is merged with the defaults' field by field.
    assert bench.kind == "bench" and bench.blocks == 2 and bench.timeout_s == 600
    assert bench.grace_s == 5 and bench.gpu_wait_s == 120 and ab.grace_s == 10
    assert bench.bench.concurrency == (1, 8) and bench.bench.warmup == 0 and bench.bench.runs == 2
    by_key = {m.key: m for m in bench.metrics}
    assert by_key["tok_s"].threshold == pytest.approx(0.02) and by_key["agg_tok_s@8"].concurrency == 8
    assert by_key["ttft_p99@8"].threshold == pytest.approx(0.1) and not by_key["ttft_p99@8"].higher_is_better
    assert len(s.sha256) == 64


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda d: d.update(deadlin="1h"), "suite.yaml: deadlin: unknown field (did you mean 'deadline'?)"),
        (lambda d: d.update(deadline="soon"), "suite.yaml: deadline: expected a duration from 1s to 7d"),
        (lambda d: d.update(items=[]), "items: expected a list of one or more items"),
        (lambda d: d["items"][0].update(ab=["plain"]), "item 'spec-vs-plain': ab: expected a list of two or more"),
        (lambda d: d["items"][0].update(bench="plain"), "item 'spec-vs-plain': give exactly one of ab:"),
        (lambda d: d["items"][0].update(ab=["plain", "nope"]), "item 'spec-vs-plain': ab[1]: no profile named 'nope'"),
        (lambda d: d["items"][1].update(metrics=["tok/s"]), "item 'plain-levels': metrics: unknown metric 'tok/s'"),
        (lambda d: d["items"][1].update(metrics=["tok_s@32"]), "metrics: tok_s@32: the workload runs concurrency 1, 8"),
        (lambda d: d["items"][1].update(metrics={"tok_s": "60%"}), "metrics: tok_s: expected a percentage"),
        (lambda d: d["items"][1].update(metrics=["accept_length"]), "accept_length needs a profile with speculative"),
        (lambda d: d["items"][1].update(threshold="0%"), "item 'plain-levels': threshold: expected a percentage"),
        (lambda d: d["items"][1].update(timeout="1 fortnight"), "item 'plain-levels': timeout: expected a duration"),
        (lambda d: d["items"][1].update(fail_on="faster"), "fail_on: unknown mode 'faster'; valid: slower, different"),
        (lambda d: d["items"][1].update(fail_on="slower"), "fail_on: slower needs something to compare with"),
        (lambda d: d["items"][1].update(name="plain levels"), "item 'plain levels': name: expected letters, digits"),
        (lambda d: d["items"][1].update(name="spec-vs-plain"), "item 'spec-vs-plain': name: used twice"),
        (lambda d: d["items"][1].pop("name"), "items[1]: name: required"),
        (lambda d: d["items"][1]["workload"].update(runs=0), "'plain-levels': workload: runs: expected an integer"),
        (lambda d: d["items"][1]["workload"].update(prompts="missing.jsonl"), "item 'plain-levels': workload:"),
        (lambda d: d["items"][1]["workload"].update(max_tokens=1_000_000, runs=9999), "workload: "),
        (lambda d: d["defaults"].update(blocks="three"), "defaults: blocks: expected an integer"),
        (lambda d: d["defaults"].update(name="x"), "defaults: name: every item needs its own name"),
        (lambda d: d["defaults"]["workload"].update(endpoint="grpc"), "defaults: workload: endpoint: expected one of"),
    ],
)
def test_mistakes_name_file_item_and_field(suite_dir: Path, change: Any, expected: str) -> None:
    data = yaml.safe_load(yaml.safe_dump(GOOD))
    change(data)
    with pytest.raises(SuiteError) as e:
        suite_mod.load(write_suite(suite_dir, data))
    assert expected in str(e.value)
    assert str(suite_dir / "suite.yaml") in str(e.value)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("items: [\n", "not valid YAML"),
        ("- just\n- a list\n", "expected a mapping of fields"),
        ("items:\n  - name: a\n    bench: plain\n  - name: b\n    name: c\n    bench: plain\n", "duplicate key name"),
    ],
)
def test_files_that_are_not_suites(suite_dir: Path, text: str, expected: str) -> None:
    with pytest.raises(SuiteError, match=expected):
        suite_mod.load(write_suite(suite_dir, text))


def test_missing_file_and_the_cli_exit_code(suite_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(SuiteError, match="no such suite file"):
        suite_mod.load(tmp_path / "nope.yaml")
    bad = yaml.safe_load(yaml.safe_dump(GOOD))
    bad["items"][1]["metrics"] = ["tok_s@32"]
    path = write_suite(suite_dir, bad)
    db = tmp_path / "n.db"
    out = run("nightly", str(path), "--db", str(db), cwd=tmp_path)
    assert out.rc == 2, out.text
    assert "item 'plain-levels': metrics: tok_s@32" in out.err and str(path) in out.err
    assert_plain(out.text)
    assert not db.exists()  # refused before anything was recorded, let alone launched
    good = write_suite(suite_dir, GOOD, "good.yaml")
    for option in ("--markdown-out", "--json-out"):
        out = run("nightly", str(good), "--db", str(db), option, str(tmp_path / "no-dir" / "x"), cwd=tmp_path)
        assert out.rc == 2 and f"{option} {tmp_path}/no-dir/x: directory" in out.err, out.text
    assert not db.exists()


def test_check_lists_the_items_and_hosts_are_resolved(suite_dir: Path, tmp_path: Path) -> None:
    path = write_suite(suite_dir, GOOD)
    out = run("nightly", str(path), "--check", cwd=tmp_path)
    assert out.rc == 0, out.text
    assert "spec-vs-plain: ab plain vs spec on local, SIMULATED" in out.out and "agg_tok_s@8 (5 %)" in out.out
    data = yaml.safe_load(yaml.safe_dump(GOOD))
    data["items"][0]["host"] = "gpu box!"  # a bare name is an ssh_config alias; this is no host at all
    out = run("nightly", str(write_suite(suite_dir, data, "bad-host.yaml")), "--check", cwd=tmp_path)
    assert out.rc == 2 and "item 'spec-vs-plain': host:" in out.err and "gpu box!" in out.err, out.text
    out = run("nightly", str(path), "--only", "nope", "--check", cwd=tmp_path)
    assert out.rc == 2 and "--only nope: no such item" in out.err, out.text


def test_the_inventory_is_the_suites_not_the_working_directorys(suite_dir: Path, tmp_path: Path) -> None:
    data = {"items": [{"name": "a", "bench": "plain", "host": "gpu"}]}
    path = write_suite(suite_dir, data)
    elsewhere = tmp_path / "cron-cwd"
    elsewhere.mkdir()
    (elsewhere / "hosts.yaml").write_text("hosts:\n  gpu: {address: 127.0.0.1, port: 1}\n")
    out = run("nightly", str(path), "--check", cwd=elsewhere)
    assert out.rc == 0 and "gpu (not in an inventory: an SSH name or address" in out.out, out.text
    (suite_dir / "hosts.yaml").write_text("hosts:\n  gpu: {address: 10.1.2.3, user: bench}\n")
    out = run("nightly", str(path), "--check", cwd=elsewhere)
    assert out.rc == 0 and f"gpu (bench@10.1.2.3:22, from {suite_dir / 'hosts.yaml'})" in out.out, out.text
    doc = json.loads(run("nightly", str(path), "--check", "--json", cwd=elsewhere).out)
    assert doc["inventory"] == str(suite_dir / "hosts.yaml") and doc["items"][0]["host"] == "gpu"


def test_profiles_and_prompt_files_are_found_next_to_the_suite(suite_dir: Path, tmp_path: Path) -> None:
    (suite_dir / "prompts.jsonl").write_text('{"prompt": "hello there"}\n')
    data = {
        "items": [
            {"name": "a", "bench": "profiles/plain.yaml", "workload": {"prompts": "prompts.jsonl"}},
            {"name": "b", "bench": "plain"},
        ]
    }
    s = suite_mod.load(write_suite(suite_dir, data, "nightly.yaml"))
    assert s.name == "nightly" and s.items[0].profiles[0].name == "plain"
    assert s.items[0].bench.prompts == str(suite_dir / "prompts.jsonl")
    assert s.items[1].threshold == suite_mod.DEFAULT_THRESHOLD and s.items[1].blocks == 1


def _fan(suite_dir: Path, hosts: dict[str, Any], items: list[tuple[str, str]], **top: Any) -> Path:
    (suite_dir / "hosts.yaml").write_text(yaml.safe_dump({"hosts": hosts}))
    data = {"fan_out": True, **top, "items": [{"name": n, "bench": "plain", "host": h} for n, h in items]}
    return write_suite(suite_dir, data)


def test_check_warns_when_fan_out_has_no_slurm_item_to_fan_out(suite_dir: Path, tmp_path: Path) -> None:
    path = _fan(suite_dir, {"gpu": {"address": "10.1.2.3"}}, [("a", "local"), ("b", "gpu")])
    out = run("nightly", str(path), "--check", cwd=tmp_path)
    assert out.rc == 0, out.text  # a warning, not an error
    (line,) = [x for x in out.out.splitlines() if "WARNING" in x]
    assert "fan_out: true has no effect for this suite" in line and "a (on local), b (on gpu)" in line, line
    doc = json.loads(run("nightly", str(path), "--check", "--json", cwd=tmp_path).out)
    assert len(doc["warnings"]) == 1 and "no effect for this suite" in doc["warnings"][0]
    # Some items on Slurm: the others are named as running in-process, one after another.
    path = _fan(suite_dir, {"h100": {"scheduler": "slurm", "partition": "gpu"}}, [("a", "local"), ("b", "h100")])
    out = run("nightly", str(path), "--check", cwd=tmp_path)
    assert out.rc == 0, out.text
    (line,) = [x for x in out.out.splitlines() if "WARNING" in x]
    assert "fan_out: true has no effect for a (on local)" in line and "b (on" not in line, line
    # Hosts are resolved without asking Slurm, and a Slurm host is described as one (not as an SSH name).
    assert "h100 (a Slurm allocation in partition gpu, an exclusive node" in out.out, out.text


def test_check_warns_that_non_exclusive_slurm_items_take_turns_on_a_shared_node(
    suite_dir: Path, tmp_path: Path
) -> None:
    shared = {"scheduler": "slurm", "partition": "gpu", "exclusive": False, "gres": "gpu:1"}
    hosts = {"c1": shared, "c2": shared, "whole": {"scheduler": "slurm"}}
    path = _fan(suite_dir, hosts, [("a", "c1"), ("b", "c2"), ("c", "whole"), ("d", "slurm:gpu")], wait="20m")
    out = run("nightly", str(path), "--check", cwd=tmp_path)
    assert out.rc == 0, out.text
    (line,) = [x for x in out.out.splitlines() if "WARNING" in x]
    assert "a (on c1), b (on c2) run on Slurm hosts with `exclusive: false`" in line, line
    assert "take turns on that node's host lock" in line and "wait: (20m00s)" in line, line
    assert "c (on" not in line and "d (on" not in line  # exclusive allocations never share a node
    assert (
        "slurm:gpu (a Slurm allocation in partition gpu" in out.out
        and "a node it may share with other jobs (exclusive: false)" in out.out
    )
    doc = json.loads(run("nightly", str(path), "--check", "--json", cwd=tmp_path).out)
    assert doc["warnings"] == [line.strip().removeprefix("WARNING: ")]
    # Without fan_out nothing runs at once; one non-exclusive item has nothing of the night's to take turns with.
    data = yaml.safe_load(path.read_text())
    data["fan_out"] = False
    out = run("nightly", str(write_suite(suite_dir, data)), "--check", cwd=tmp_path)
    assert out.rc == 0 and "WARNING" not in out.out, out.text
    assert json.loads(run("nightly", str(path), "--check", "--json", cwd=tmp_path).out)["warnings"] == []
    out = run("nightly", str(_fan(suite_dir, hosts, [("a", "c1"), ("c", "whole")])), "--check", cwd=tmp_path)
    assert out.rc == 0 and "WARNING" not in out.out, out.text


def test_check_refuses_a_multi_node_item_on_a_host_that_cannot_hold_it(
    suite_dir: Path, write_profile: WriteProfile, tmp_path: Path
) -> None:
    write_profile("wide", extends="plain", tp_size=2, nnodes=2)
    hosts = {
        "a": {"address": "10.1.2.3"},
        "b": {"address": "10.1.2.4"},
        "pair": {"nodes": ["a", "b"]},
        "solo": {"nodes": ["a"]},
        "h100": {"scheduler": "slurm", "partition": "gpu"},
    }
    (suite_dir / "hosts.yaml").write_text(yaml.safe_dump({"hosts": hosts}))

    def check(host: str) -> Any:
        return run("nightly", str(write_suite(suite_dir, {"items": [{"name": "w", "bench": "wide", "host": host}]})),
                   "--check", cwd=tmp_path)  # fmt: skip

    out = check("pair")  # a group of two, and a Slurm host (asks for two nodes): both fine
    assert out.rc == 0, out.text
    assert "pair (a group of 2 hosts: a, b, from" in out.out, out.out
    assert check("h100").rc == 0
    out = check("a")
    assert out.rc == 2 and "item 'w': host: 'a' is one host, but a profile has nnodes: 2" in out.err, out.text
    assert "an inventory group of at least 2 hosts or a Slurm host" in out.err
    out = check("solo")
    assert out.rc == 2 and "group solo has 1 host(s), but a profile has nnodes: 2" in out.err, out.text
    assert_plain(out.text)


def test_an_item_may_allow_its_nodes_to_differ(suite_dir: Path) -> None:
    items = [{"name": "a", "bench": "plain", "allow_node_mismatch": True}, {"name": "b", "bench": "plain"}]
    s = suite_mod.load(write_suite(suite_dir, {"items": items}))
    assert [i.allow_node_mismatch for i in s.items] == [True, False]
    items[0]["allow_node_mismatch"] = "sometimes"
    with pytest.raises(SuiteError, match="allow_node_mismatch"):
        suite_mod.load(write_suite(suite_dir, {"items": items}))


def test_check_says_how_many_nodes_a_slurm_host_asks_for(
    suite_dir: Path, write_profile: WriteProfile, tmp_path: Path
) -> None:
    write_profile("wide", extends="plain", tp_size=2, nnodes=2)
    hosts = {"h100": {"scheduler": "slurm", "partition": "gpu"}, "shared": {"scheduler": "slurm", "exclusive": False}}
    (suite_dir / "hosts.yaml").write_text(yaml.safe_dump({"hosts": hosts}))

    def described(items: list[tuple[str, str]]) -> str:
        data = {"items": [{"name": f"i{n}", "bench": b, "host": h} for n, (b, h) in enumerate(items)]}
        out = run("nightly", str(write_suite(suite_dir, data)), "--check", cwd=tmp_path)
        assert out.rc == 0, out.text
        return next(x for x in out.out.splitlines() if "hosts:" in x)

    assert "h100 (a Slurm allocation in partition gpu, 2 exclusive nodes, asked for" in described([("wide", "h100")])
    line = described([("wide", "shared")])
    assert "2 nodes it may share with other jobs (exclusive: false)" in line, line
    line = described([("wide", "h100"), ("plain", "h100")])
    assert "1 or 2 (by item) exclusive nodes" in line, line
    assert "an exclusive node" in described([("plain", "h100")])


def test_check_warns_about_a_timeout_the_deadline_always_cuts(suite_dir: Path, tmp_path: Path) -> None:
    items = [{"name": "long", "bench": "plain"}, {"name": "short", "bench": "plain", "timeout": "20m"}]
    path = write_suite(suite_dir, {"deadline": "30m", "items": items})
    out = run("nightly", str(path), "--check", cwd=tmp_path)
    assert out.rc == 0, out.text  # a warning, not an error
    (line,) = [x for x in out.out.splitlines() if "WARNING" in x]
    assert "timeout longer than the suite's deadline (30m00s) for long (1h00m):" in line, line
    assert "can never use its whole timeout" in line and "short" not in line, line
    doc = json.loads(run("nightly", str(path), "--check", "--json", cwd=tmp_path).out)
    assert doc["warnings"] == [line.strip().removeprefix("WARNING: ")]
    # Within the deadline (the default one, 6h, included): nothing to say.
    out = run("nightly", str(write_suite(suite_dir, {"items": items})), "--check", cwd=tmp_path)
    assert out.rc == 0 and "WARNING" not in out.out, out.text


def test_check_warns_that_allow_node_mismatch_does_nothing_on_one_node(
    suite_dir: Path, write_profile: WriteProfile, tmp_path: Path
) -> None:
    write_profile("wide", extends="plain", tp_size=2, nnodes=2)
    (suite_dir / "hosts.yaml").write_text(yaml.safe_dump({"hosts": {"h100": {"scheduler": "slurm"}}}))
    items = [
        {"name": "one", "bench": "plain", "allow_node_mismatch": True},
        {"name": "two", "bench": "wide", "host": "h100", "allow_node_mismatch": True},
    ]
    out = run("nightly", str(write_suite(suite_dir, {"items": items})), "--check", cwd=tmp_path)
    assert out.rc == 0, out.text
    (line,) = [x for x in out.out.splitlines() if "allow_node_mismatch" in x and "WARNING" in x]
    assert "has no effect for one:" in line and "two" not in line.split("for ", 1)[1].split(":")[0], line
    del items[0]["allow_node_mismatch"]
    out = run("nightly", str(write_suite(suite_dir, {"items": items})), "--check", cwd=tmp_path)
    assert out.rc == 0 and "no effect" not in out.out, out.text


def test_an_items_workload_may_flush_the_prefix_cache_and_generate_shared_prefixes(suite_dir: Path) -> None:
    data = yaml.safe_load(yaml.safe_dump(GOOD))
    data["items"][0]["workload"] = {"flush_cache": True, "prompts": "shared-prefix:2x4:64:8"}
    ab, bench = suite_mod.load(write_suite(suite_dir, data)).items
    assert ab.bench.flush_cache and ab.bench.prompts == "shared-prefix:2x4:64:8"  # generated: not a path
    assert not bench.bench.flush_cache
    data["items"][0]["workload"] = {"flush_cache": "yes"}
    with pytest.raises(SuiteError, match="flush_cache"):
        suite_mod.load(write_suite(suite_dir, data))


def test_an_item_may_run_multi_turn_sessions_and_measure_the_cache(suite_dir: Path) -> None:
    """workload: turns: as --turns (the file beside the suite; closed loop only); cache_measured as --cache-measured."""
    conv = [{"conversations": [{"from": "human", "value": f"q{k} of {i}"} for k in range(3)]} for i in range(4)]
    (suite_dir / "conv.json").write_text(json.dumps(conv))
    data = yaml.safe_load(yaml.safe_dump(GOOD))
    data["items"][0]["workload"] = {"prompts": "conv.json", "turns": 3}
    data["items"][0]["cache_measured"] = True
    ab, bench = suite_mod.load(write_suite(suite_dir, data)).items
    assert ab.bench.turns == 3 and ab.bench.prompts == str(suite_dir / "conv.json") and ab.cache_measured
    assert bench.bench.turns is None and not bench.cache_measured
    for extra, said in (({"rate": [2]}, "turns: not with rate"), ({"input_len": 8}, "turns: not with input_len")):
        data["items"][0]["workload"] = {"prompts": "conv.json", "turns": 3, **extra}
        with pytest.raises(SuiteError, match=said):
            suite_mod.load(write_suite(suite_dir, data))
    data["items"][0]["workload"] = {"prompts": "conv.json", "turns": 4}
    with pytest.raises(SuiteError, match="no conversation with 4 user turns"):
        suite_mod.load(write_suite(suite_dir, data))
