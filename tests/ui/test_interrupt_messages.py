"""Ctrl-C says what the interrupted command leaves behind, and under `--json` is still one JSON document (which stderr
does not repeat)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, NoReturn

import pytest

from orchestrator.cli import main
from tests.conftest import REPO, WriteProfile, free_port


def _interrupt(*args: Any, **kwargs: Any) -> NoReturn:
    raise KeyboardInterrupt


def test_interrupting_a_look_only_command_claims_no_teardown(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("orchestrator.cli.hosts.resolve_host", _interrupt)
    assert main(["status", "--host", "slurm:debug", "--json"]) == 130
    captured = capsys.readouterr()
    assert json.loads(captured.out) == {"status": "interrupted", "error": "Interrupted.", "exit_code": 130}
    assert captured.err.strip() == ""  # under --json the document is the answer (click ends the ^C line)
    assert main(["hosts", "check", "slurm:debug"]) == 130
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.strip() == "Interrupted."
    assert main(["down", "--host", "slurm:debug"]) == 130
    assert "may have stopped only some of orch's servers" in capsys.readouterr().err


def test_interrupting_a_run_still_says_torn_down_and_answers_in_json(
    write_profile: WriteProfile,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    write_profile("p", engine="sglang", model_path="/m", tp_size=1, port=free_port())
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("orchestrator.experiment.run.resolve_host", _interrupt)
    assert main(["bench", "p", "--sim", "--json", "--db", str(tmp_path / "r.db")]) == 130
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert doc["status"] == "interrupted" and doc["exit_code"] == 130 and "torn down" in doc["error"]
    # The document says it; stderr does not repeat it (a script reading both streams sees it once).
    assert "Interrupted" not in captured.err, captured.err


def test_ctrl_c_while_connecting_answers_in_json(tmp_path: Path) -> None:
    """A real SIGINT while `orch hosts check` waits for an SSH banner that never comes."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)
        listener.settimeout(30)
        port = listener.getsockname()[1]
        proc = subprocess.Popen(
            [sys.executable, "-m", "orchestrator", "hosts", "check", f"me@127.0.0.1:{port}", "--json"],
            cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)}, text=True, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )  # fmt: skip
        try:
            conn, _ = listener.accept()  # orch is now waiting for the banner
            with conn:
                proc.send_signal(signal.SIGINT)
                out, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    assert proc.returncode == 130, err
    assert json.loads(out) == {"status": "interrupted", "error": "Interrupted.", "exit_code": 130}
    assert "Interrupted" not in err and "torn down" not in err and "Traceback" not in err, err  # said once, on stdout
