"""What the README promises of a checkout: `make demo` stores where `orch list` and `show` look, and the package
metadata (the distribution orch-bench, the command orch)."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from orchestrator.cli import main
from tests.conftest import REPO

Capsys = pytest.CaptureFixture[str]


def run_json(capsys: Capsys, *args: str) -> tuple[int, dict[str, Any]]:
    """`orch ARGS --json`: the exit code and the one document on stdout (nothing else may be there)."""
    code = main([*args, "--json"])
    return code, json.loads(capsys.readouterr().out)


# ---------------------------------------------------------------- make demo


def test_make_demo_stores_where_list_and_show_look_and_ends_with_the_report(
    sim_profiles: Any, tmp_path: Path, capsys: Capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchestrator.results import store

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


def _demo_command(tmp_path: Path, *assignments: str) -> list[str]:
    """The orch command line `make demo ASSIGNMENTS` would run (make -n: printed, nothing run; a venv path of the
    test's own, so the checkout's venv being there or not changes nothing)."""
    make = shutil.which("make")
    if make is None:
        pytest.skip("no make on this machine")
    done = subprocess.run([make, "-n", "demo", f"VENV={tmp_path / 'venv'}", *assignments], cwd=REPO,
                          capture_output=True, text=True, check=True, timeout=60)  # fmt: skip
    lines = [line for line in done.stdout.splitlines() if " ab baseline eagle3-3step " in line]
    assert len(lines) == 1, done.stdout
    return shlex.split(lines[0])


def test_make_demo_takes_a_port(tmp_path: Path) -> None:
    """On a shared box the profiles' port may be taken: `make demo PORT=N` passes --port N, and without PORT the
    demo serves on the profiles' own port."""
    argv = _demo_command(tmp_path, "PORT=12345")
    assert argv[argv.index("--port") + 1] == "12345" and argv.count("--port") == 1
    assert "--port" not in _demo_command(tmp_path)


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


def test_ci_runs_the_readmes_test_command_which_lints_first() -> None:
    readme = (REPO / "README.md").read_text()
    commands = re.findall(r"^(make \w+)\s+# ", readme.split("```sh\n", 1)[1].split("```", 1)[0], re.M)
    assert commands == ["make demo", "make test"]  # the two set-up commands
    ci = [line for line in (REPO / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")]
    assert ci[-1] == "make test"  # after installing what the tests need, exactly the README's command
    makefile = (REPO / "Makefile").read_text()
    prerequisites = re.search(r"^test: (.+)$", makefile, re.M)
    assert prerequisites is not None and prerequisites.group(1).split() == ["install", "lint", "llamacpp", "vllm"]
