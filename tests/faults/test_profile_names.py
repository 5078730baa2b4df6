"""A profile loaded from any file path gets a valid profile name, so the bundle of its experiment can be read back
and reproduced."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from orchestrator.config import profile
from tests.conftest import FAST_SIM, free_port
from tests.faults.support import FAST, assert_nothing_left, assert_plain, run


def _sim_profile(path: Path, **extra: object) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fields = dict(
        engine="sglang", model_path="/models/m", tp_size=1, port=free_port(), ready_timeout_s=30, sim=FAST_SIM
    )
    path.write_text(yaml.safe_dump({**fields, **extra}))
    return path


@pytest.mark.parametrize(
    ("stem", "name"),
    [
        ("my profile", "my_profile"),
        ("baseline", "baseline"),
        ("tp8 (eagle3)", "tp8__eagle3_"),
        (".hidden", "hidden"),
        ("über-fast", "ber-fast"),
        ("  ", "profile"),
    ],
)
def test_a_profile_file_of_any_name_gets_a_valid_name(tmp_path: Path, stem: str, name: str) -> None:
    path = _sim_profile(tmp_path / "dir with space" / f"{stem}.yaml")
    prof = profile.load(str(path))
    assert prof.name == name and profile.NAME_RE.match(prof.name), prof.name
    # What reading a bundle does with the stored profile: it must accept the name it was stored under.
    back = profile.from_resolved(prof.to_dict(), "bundle profiles[0]")
    assert back.name == name and back.chain == prof.chain


def test_a_chain_through_an_odd_file_name_is_named_validly(tmp_path: Path) -> None:
    parent = _sim_profile(tmp_path / "odd dir" / "base line.yaml")
    child = tmp_path / "odd dir" / "my child.yaml"
    child.write_text(yaml.safe_dump({"extends": str(parent), "tp_size": 1}))
    prof = profile.load(str(child))
    assert prof.chain == ("my_child", "base_line")
    assert profile.from_resolved(prof.to_dict(), "bundle").chain == ("my_child", "base_line")


def test_the_bundle_of_a_bench_on_such_a_file_reads_back_and_reproduces(tmp_path: Path) -> None:
    path = _sim_profile(tmp_path / "my profiles" / "my profile.yaml")
    db, bundle = tmp_path / "sender.db", tmp_path / "r.orch.json"
    bench = run("bench", str(path), "--sim", "--runs", "2", "--max-tokens", "32", *FAST, "--db", str(db), cwd=tmp_path)
    assert bench.rc == 0, bench.text
    exported = run("export", "last", "--format", "bundle", "-o", str(bundle), "--db", str(db), cwd=tmp_path)
    assert exported.rc == 0, exported.text
    assert json.loads(bundle.read_text())["content"]["experiment"]["arms"] == ["my_profile"]

    shown = run("show", str(bundle), cwd=tmp_path)
    assert shown.rc == 0 and "my_profile" in shown.out, shown.text
    assert_plain(shown.text)

    # The profile was given as a file, so no profile of that name is this machine's own: it runs when told to.
    mine = tmp_path / "mine.db"
    again = run(
        "reproduce", str(bundle), "--trust-bundle", "--json", "--gpu-wait", "0", "--db", str(mine), cwd=tmp_path
    )
    assert again.rc in (0, 3, 4), again.text
    assert_plain(again.text)
    assert "reproduction" in json.loads(again.out), again.out
    assert_nothing_left(int(yaml.safe_load(path.read_text())["port"]))
