"""`orch profiles validate` and `orch profiles show` as a user meets them: every problem named, secrets kept out."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import yaml

from orchestrator.cli import main
from orchestrator.config import profile as profiles_mod
from tests.conftest import REPO, WriteProfile

Capsys = pytest.CaptureFixture[str]


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
