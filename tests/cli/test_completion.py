"""Shell completion: stored experiment ids (newest first) and profile names, never an error."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO


def _complete(words: str, cwd: Path) -> list[str]:
    """What bash completion offers for the words (click's bash_complete protocol: 'type,value' lines)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "_ORCH_COMPLETE": "bash_complete", "COMP_WORDS": words}
    env["COMP_CWORD"] = str(len(words.split()) - (0 if words.endswith(" ") else 1))
    proc = subprocess.run([sys.executable, "-m", "orchestrator"], cwd=cwd, env=env, capture_output=True, text=True)
    assert proc.returncode == 0 and not proc.stderr, proc.stderr
    return proc.stdout.splitlines()


def test_completion_of_experiment_ids_and_profile_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = tmp_path / "r.db"
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE experiments (id TEXT, created_at REAL, status TEXT, arms_json TEXT)")
    rows = [("20260101-1-aaa", 1.0, "complete", '["baseline", "eagle3"]'), ("20260102-2-bbb", 2.0, "failed", "[]")]
    conn.executemany("INSERT INTO experiments VALUES (?, ?, ?, ?)", rows)
    conn.commit()
    conn.close()
    newest_first = ["plain,last", "plain,20260102-2-bbb", "plain,20260101-1-aaa"]
    assert _complete(f"orch show --db {db} ", tmp_path) == newest_first
    assert _complete(f"orch export --db {db} 20260101", tmp_path) == ["plain,20260101-1-aaa"]
    assert _complete(f"orch report --db {db} l", tmp_path) == ["plain,last"]
    assert _complete(f"orch show --db {db} ./res", tmp_path) == ["file,./res"]  # a bundle file
    assert _complete(f"orch show --db {tmp_path / 'missing.db'} x", tmp_path) == ["file,x"]  # never an error
    (tmp_path / "broken.db").write_text("not sqlite")
    assert _complete(f"orch show --db {tmp_path / 'broken.db'} ", tmp_path) == ["plain,last"]

    import click

    from orchestrator.cli.complete import profile_names

    monkeypatch.chdir(REPO)
    ctx = click.Context(click.Command("x"))
    names = [item.value for item in profile_names(ctx, click.Argument(["p"]), "eagle3")]
    assert names == ["eagle3-2step", "eagle3-3step"]
    assert profile_names(ctx, click.Argument(["p"]), "zz-none") == []
