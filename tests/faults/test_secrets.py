"""Secrets never leave the host in clear: not in output, errors, reports, exports, nor anywhere in the store."""

from __future__ import annotations

import hashlib
import json
import os
import re
import sqlite3
import subprocess
import sys
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from orchestrator.agent import ops
from orchestrator.cli import main
from orchestrator.config.design import ABConfig
from orchestrator.config.profile import load
from orchestrator.config.workload import BenchConfig
from orchestrator.errors import HostError, ServerError
from orchestrator.experiment.ab import run_ab
from orchestrator.hosts.local import LocalHost
from orchestrator.launch import lifecycle, single
from orchestrator.results.store import Store
from orchestrator.ui.events import Lines
from tests import fake_nvidia_smi
from tests.conftest import FAST_SIM, NAMESPACE, WriteProfile, free_port, run_orch

DIGEST_RE = re.compile(r"<redacted hmac:[0-9a-f]{16}>")


def _secret_profile(write_profile: WriteProfile, api_key: str, hf_token: str, **sim: Any) -> Path:
    return write_profile(
        "secret",
        engine="sglang",
        model_path="/models/test-model",
        tp_size=1,
        port=free_port(),
        ready_timeout_s=30,
        server_args=["--api-key", api_key],
        env={"HF_TOKEN": hf_token, "NCCL_PROTO": "LL"},
        sim={**FAST_SIM, **sim},
    )


def _orch(*args: str, cwd: Path, timeout: float = 120) -> tuple[int, str, str]:
    proc = run_orch(*args, cwd=cwd)
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def _bench(db: Path, cwd: Path, *extra: str) -> subprocess.Popen[str]:
    args = ("bench", "secret", "--sim", "--runs", "1", "--warmup", "0", "--max-tokens", "16", "--grace", "2")
    return run_orch(*args, "--min-run-s", "0", "--db", str(db), *extra, cwd=cwd)


def _store_bytes(db: Path) -> bytes:
    return b"".join(p.read_bytes() for p in (db, Path(f"{db}-wal"), Path(f"{db}-journal")) if p.exists())


def _api_key_digests(db: Path) -> list[str]:
    """The digest each stored launch recorded for the --api-key value (argv and resolved profile agree)."""
    conn = sqlite3.connect(db)
    try:
        rows = conn.execute("SELECT argv_json, profile_json, env_json FROM launches ORDER BY started_at").fetchall()
    finally:
        conn.close()
    out = []
    for argv_json, profile_json, env_json in rows:
        argv = json.loads(argv_json)
        digest = argv[argv.index("--api-key") + 1]
        profile = json.loads(profile_json)
        assert profile["server_args"] == ["--api-key", digest]
        assert DIGEST_RE.fullmatch(digest) and DIGEST_RE.fullmatch(profile["env"]["HF_TOKEN"])
        assert json.loads(env_json)["HF_TOKEN"] == profile["env"]["HF_TOKEN"]
        out.append(digest)
    return out


def _secrets() -> tuple[str, str]:
    tag = uuid.uuid4().hex
    return f"sk-SECRET-{tag}", f"hf_SECRET-{tag[::-1]}"


def test_a_launch_failing_during_load_leaks_no_secret(write_profile: WriteProfile, tmp_path: Path) -> None:
    api_key, hf_token = _secrets()
    _secret_profile(write_profile, api_key, hf_token, fault="exit-during-load")
    db = tmp_path / "r.db"
    proc = _bench(db, tmp_path)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, out + err
    # The failure is reported with the server's log tail, its args dump in it, but scrubbed.
    assert "exited during startup" in err and "server_args=ServerArgs(" in err
    assert "api_key='<redacted>'" in err and "--api-key=<redacted> is accepted but ignored" in err
    shown = [out, err]
    for args in (
        ("show", "last"),
        ("show", "last", "--json"),
        *(("export", "last", "--format", f) for f in ("json", "csv", "md")),
    ):
        code, o, e = _orch(*args, "--db", str(db), cwd=tmp_path)
        assert code in (0, 1), e
        assert not re.search(r"^Traceback", e, re.MULTILINE), e  # the log tail quotes one; orch prints none
        shown += [o, e]
    everything = "\n".join(shown)
    assert api_key not in everything and hf_token not in everything
    assert "api_key='<redacted>'" in shown[2] + shown[3]  # `orch show last` shows the scrubbed failure

    conn = sqlite3.connect(db)
    (exp_error,) = conn.execute("SELECT error FROM experiments").fetchone()
    (launch_error,) = conn.execute("SELECT error FROM launches").fetchone()
    conn.close()
    for stored in (exp_error, launch_error):
        assert "api_key='<redacted>'" in stored and api_key not in stored
    data = _store_bytes(db)
    assert api_key.encode() not in data and hf_token.encode() not in data

    # Same secret, same store: the same digest (comparisons still work); another store: another digest.
    proc = _bench(db, tmp_path)
    proc.communicate(timeout=120)
    other = tmp_path / "other.db"
    proc = _bench(other, tmp_path)
    proc.communicate(timeout=120)
    first, second = _api_key_digests(db)
    (elsewhere,) = _api_key_digests(other)
    assert first == second != elsewhere


def test_a_successful_run_and_status_leak_no_secret(write_profile: WriteProfile, tmp_path: Path) -> None:
    api_key, hf_token = _secrets()
    path = _secret_profile(write_profile, api_key, hf_token)
    # `orch status` from another process while a server launched with the secrets runs.
    settings = lifecycle.Settings(namespace=NAMESPACE, simulate=True, grace_s=2)
    with lifecycle.running(LocalHost(), load(str(path)), settings) as srv:
        assert isinstance(srv, single.RunningServer)
        code, status_out, status_err = _orch("status", "-v", cwd=tmp_path)
    assert code == 0, status_err
    assert srv.launch.launch_id in status_out and "--api-key <redacted>" in status_out, status_out

    db = tmp_path / "r.db"
    proc = _bench(db, tmp_path, "--json")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    # The env read-back compared the host's keyed digest of HF_TOKEN with orch's: equal, so the check passes.
    assert "env check ok" in err, err
    assert json.loads(out)["arms"][0]["runs"]
    everything = "\n".join([out, err, status_out, status_err])
    assert api_key not in everything and hf_token not in everything

    data = _store_bytes(db)
    assert api_key.encode() not in data and hf_token.encode() not in data
    (digest,) = _api_key_digests(db)
    assert digest.encode() in data
    conn = sqlite3.connect(db)
    (env_report,) = conn.execute("SELECT env_report_json FROM launches").fetchone()
    (config,) = conn.execute("SELECT config_json FROM experiments").fetchone()
    conn.close()
    assert json.loads(env_report)["ok"] is True
    assert json.loads(config)["profiles"][0]["server_args"] == ["--api-key", digest]
    assert ops.op_find(NAMESPACE) == []


def test_a_server_dying_mid_run_prints_its_log_tail_scrubbed(write_profile: WriteProfile, tmp_path: Path) -> None:
    api_key, hf_token = _secrets()
    _secret_profile(write_profile, api_key, hf_token, fault="die-after-tokens:4")
    proc = _bench(tmp_path / "r.db", tmp_path)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, out + err
    # The recovery check prints the dead server's log tail (its args dump in it) as an event: scrubbed.
    assert "not repeating the run" in out and "api_key='<redacted>'" in out, out
    assert api_key not in out + err and hf_token not in out + err


def test_errors_are_scrubbed_before_they_are_stored(
    write_profile: WriteProfile, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    api_key, hf_token = _secrets()
    prof = load(str(_secret_profile(write_profile, api_key, hf_token)))

    def leaky(*args: Any, **kwargs: Any) -> None:
        # Any error text, not only a log tail, may quote a secret: the store gets it scrubbed.
        raise ServerError(f"health check said: bad key {api_key}; HF_TOKEN={hf_token} Authorization: Bearer x1y2")

    monkeypatch.setattr(single, "from_state", leaky)  # the env check (and process list) once ready
    store = Store(tmp_path / "r.db")
    events: list[str] = []
    config = ABConfig(bench=BenchConfig(min_run_s=0, runs=1, warmup=0, max_tokens=8), simulate=True, grace_s=2)
    try:
        with pytest.raises(ServerError):
            run_ab(LocalHost(), [prof], replace(config, namespace=NAMESPACE), store, events=Lines(events.append))
        (exp,) = store.experiments()
        (launch,) = store.launches(exp["id"])
    finally:
        store.close()
    for error in (exp["error"], launch["error"]):
        assert api_key not in error and hf_token not in error and "x1y2" not in error
        assert "bad key <redacted>" in error and "Bearer <redacted>" in error
    assert not any(api_key in e for e in events)


def test_profiles_show_has_keyed_digests_only(
    write_profile: WriteProfile, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    api_key, hf_token = _secrets()
    path = _secret_profile(write_profile, api_key, hf_token)
    assert main(["profiles", "show", str(path), "--sim"]) == 0
    out = capsys.readouterr().out
    assert api_key not in out and hf_token not in out
    assert "--api-key '<redacted hmac:" in out and "HF_TOKEN: <redacted hmac:" in out
    # No bare SHA-256 of the value (which a guess could confirm) in any form.
    for secret in (api_key, hf_token):
        assert hashlib.sha256(secret.encode()).hexdigest()[:12] not in out


def test_gpu_process_lines_are_masked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    api_key, hf_token = _secrets()
    fake_bin = fake_nvidia_smi.install(tmp_path / "bin", tmp_path / "state.json")
    monkeypatch.setenv("PATH", f"{fake_bin}{os.pathsep}{os.environ['PATH']}")
    env = {**os.environ, "FAKE_GPU_MIB": "30000", "FAKE_GPU_SCOPE": NAMESPACE}
    env.pop(ops.MARKER, None)
    argv = [sys.executable, "-c", "import time; time.sleep(60)", "--api-key", api_key, f"--hf-token={hf_token}"]
    user = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while not (apps := ops.op_gpus()["apps"]) and time.monotonic() < deadline:
            time.sleep(0.1)
        (app,) = apps
        assert app["pid"] == user.pid and "--api-key <redacted> --hf-token=<redacted>" in app["cmdline"]
        with pytest.raises(HostError, match="is not idle") as e:
            single.check_gpus_idle(LocalHost(), NAMESPACE)
        assert "--api-key <redacted>" in str(e.value)
        main(["hosts", "check", "local"])
        shown = capsys.readouterr()
        assert f"GPU process PID {user.pid}" in shown.out + shown.err
        assert api_key not in str(e.value) + shown.out + shown.err and hf_token not in shown.out + shown.err
    finally:
        user.kill()
        user.wait()
