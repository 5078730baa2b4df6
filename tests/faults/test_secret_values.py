"""Secrets inside values: a URL's userinfo and password-like variable names are masked wherever a value leaves orch,
server logs are private, and log scrubbing keeps the server's counters."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import stat
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from orchestrator.agent import ops
from orchestrator.cli import main
from orchestrator.common.redaction import SECRET_NAME_RE, redact, redact_argv, scrub
from orchestrator.config.profile import load
from orchestrator.hosts.local import LocalHost
from orchestrator.launch import fingerprint, lifecycle, single
from orchestrator.results import bundle as bundle_mod
from tests.conftest import FAST_SIM, NAMESPACE, WriteProfile, free_port, run_orch

DIGEST = r"<redacted hmac:[0-9a-f]{16}>"


def _passwords() -> dict[str, str]:
    tag = uuid.uuid4().hex
    return {name: f"PW{name}-{tag}" for name in ("db", "proxy", "mysql", "redis", "flag")}


def _profile(write_profile: WriteProfile, pw: dict[str, str], **sim: Any) -> Path:
    return write_profile(
        "vals",
        engine="sglang",
        model_path="/models/test-model",
        tp_size=1,
        port=free_port(),
        ready_timeout_s=30,
        # An unknown flag: the simulator names it, with its value, in its log (as a real server's arg dump would).
        server_args=["--model-url", f"https://svc:{pw['flag']}@models.example/v1"],
        env={
            "DATABASE_URL": f"postgres://orch:{pw['db']}@db.example:5432/runs",
            "HTTPS_PROXY": f"http://proxyuser:{pw['proxy']}@proxy.example:3128",
            "MYSQL_PWD": pw["mysql"],
            "REDIS_PASS": pw["redis"],
            "NUM_PASSES": "3",
        },
        sim={**FAST_SIM, **sim},
    )


def _orch(*args: str, cwd: Path) -> tuple[int, str]:
    proc = run_orch(*args, cwd=cwd)
    out, err = proc.communicate(timeout=120)
    return proc.returncode, out + err


def _bench(db: Path, cwd: Path, *extra: str) -> tuple[int, str, str]:
    args = ("bench", "vals", "--sim", "--runs", "1", "--warmup", "0", "--max-tokens", "16", "--grace", "2")
    proc = run_orch(*args, "--min-run-s", "0", "--db", str(db), *extra, cwd=cwd)
    out, err = proc.communicate(timeout=120)
    return proc.returncode, out, err


def _store_bytes(db: Path) -> bytes:
    return b"".join(p.read_bytes() for p in (db, Path(f"{db}-wal"), Path(f"{db}-journal")) if p.exists())


def _assert_none_of(pw: dict[str, str], text: str) -> None:
    leaked = [name for name, value in pw.items() if value in text]
    assert not leaked, f"{leaked} in:\n{text}"


def test_userinfo_and_password_variables_are_masked_in_every_output_and_the_store(
    write_profile: WriteProfile, tmp_path: Path
) -> None:
    pw = _passwords()
    _profile(write_profile, pw)
    db = tmp_path / "r.db"
    code, out, err = _bench(db, tmp_path, "--json")
    assert code == 0, out + err
    # The host digests the profile's env with the store's key, URL userinfo included: it agrees with orch's digests.
    assert "env check ok" in err, err
    shown = [out, err]
    bundle_path = tmp_path / "sent.orch.json"
    for args in (
        ("show", "last"),
        ("show", "last", "--json"),
        *(("export", "last", "--format", f) for f in ("json", "csv", "jsonl", "md")),
        ("export", "last", "--format", "bundle", "-o", str(bundle_path)),
    ):
        code, text = _orch(*args, "--db", str(db), cwd=tmp_path)
        assert code == 0, text
        shown.append(text)
    bundle_text = bundle_path.read_text()
    _assert_none_of(pw, "\n".join([*shown, bundle_text]))
    data = _store_bytes(db)
    assert not [name for name, value in pw.items() if value.encode() in data]

    conn = sqlite3.connect(db)
    env_json, argv_json, profile_json = conn.execute(
        "SELECT env_json, argv_json, profile_json FROM launches"
    ).fetchone()
    conn.close()
    env, argv, profile = json.loads(env_json), json.loads(argv_json), json.loads(profile_json)
    # The userinfo is a keyed digest; the host, port and path stay (provenance). Password-named values: all of it.
    assert re.fullmatch(rf"postgres://{DIGEST}@db\.example:5432/runs", env["DATABASE_URL"]), env
    assert re.fullmatch(rf"http://{DIGEST}@proxy\.example:3128", env["HTTPS_PROXY"]), env
    assert re.fullmatch(DIGEST, env["MYSQL_PWD"]) and re.fullmatch(DIGEST, env["REDIS_PASS"]), env
    assert env["NUM_PASSES"] == "3"
    assert profile["env"] == {k: env[k] for k in profile["env"]}
    assert re.fullmatch(rf"https://{DIGEST}@models\.example/v1", argv[argv.index("--model-url") + 1]), argv

    # The bundle withholds the userinfo only; the receiver gives the whole value back in the same-named variable.
    sent = json.loads(bundle_text)["content"]["profiles"][0]
    assert sent["env"]["DATABASE_URL"] == f"postgres://{bundle_mod.WITHHELD}@db.example:5432/runs"
    full = {
        "DATABASE_URL": "postgres://me:mine@db.example:5432/runs",
        "HTTPS_PROXY": "http://proxy.example:3128",
        "MYSQL_PWD": "m",
        "REDIS_PASS": "r",
        "ORCH_SECRET_MODEL_URL": "https://models.example/v1",
    }
    (again,) = bundle_mod.profiles_from_bundle(bundle_mod.read_bundle(bundle_path), environ=full)
    assert again.env_dict() == {**{k: v for k, v in full.items() if not k.startswith("ORCH_")}, "NUM_PASSES": "3"}
    assert list(again.server_args) == ["--model-url", "https://models.example/v1"]


def test_a_failed_launch_log_tail_is_scrubbed_of_url_userinfo(write_profile: WriteProfile, tmp_path: Path) -> None:
    pw = _passwords()
    _profile(write_profile, pw, fault="exit-during-load")
    db = tmp_path / "r.db"
    code, out, err = _bench(db, tmp_path)
    assert code == 1, out + err
    # The tail quotes the simulator's warning about the unknown flag, value and all: userinfo masked, host kept.
    assert "--model-url https://<redacted>@models.example/v1" in err, err
    code, text = _orch("show", "last", "--db", str(db), cwd=tmp_path)
    _assert_none_of(pw, "\n".join([out, err, text]))
    assert not [name for name, value in pw.items() if value.encode() in _store_bytes(db)]


def test_status_masks_userinfo_in_a_server_command_line(write_profile: WriteProfile, tmp_path: Path) -> None:
    pw = _passwords()
    prof = load(str(_profile(write_profile, pw)))
    with lifecycle.running(LocalHost(), prof, lifecycle.Settings(namespace=NAMESPACE, simulate=True, grace_s=2)) as srv:
        assert isinstance(srv, single.RunningServer)
        code, text = _orch("status", "-v", cwd=tmp_path)
        log = Path(srv.launch.log_path)
        # The raw log stays on the host, readable by its owner only (orch often runs as root on shared hosts).
        assert stat.S_IMODE(log.stat().st_mode) == 0o600
    assert code == 0, text
    assert srv.launch.launch_id in text and "--model-url https://<redacted>@models.example/v1" in text, text
    _assert_none_of(pw, text)


def test_profiles_show_masks_userinfo_and_password_variables(
    write_profile: WriteProfile, capsys: pytest.CaptureFixture[str]
) -> None:
    pw = _passwords()
    path = _profile(write_profile, pw)
    assert main(["profiles", "show", str(path), "--sim"]) == 0
    text = capsys.readouterr().out
    assert main(["profiles", "show", str(path), "--json"]) == 0
    as_json = json.loads(capsys.readouterr().out)
    _assert_none_of(pw, text + json.dumps(as_json))
    assert re.search(rf"DATABASE_URL: postgres://{DIGEST}@db\.example:5432/runs", text), text
    assert "secret-looking values are shown as digests" in text
    assert re.fullmatch(DIGEST, as_json["env"]["MYSQL_PWD"]) and as_json["env"]["NUM_PASSES"] == "3"


def test_server_logs_are_created_private(tmp_path: Path) -> None:
    old = os.umask(0o022)  # what a root shell usually has: new files world-readable
    try:
        fresh = tmp_path / "logs" / "fresh.log"
        reused = tmp_path / "logs" / "reused.log"
        reused.parent.mkdir()
        reused.write_text("an earlier launch's log\n")
        reused.chmod(0o644)
        for log in (fresh, reused):
            ops.op_launch([sys.executable, "-c", "print('started')"], {}, str(log))
            deadline = time.monotonic() + 10
            while "started" not in log.read_text() and time.monotonic() < deadline:
                time.sleep(0.05)
            assert log.read_text() == "started\n"
            assert stat.S_IMODE(log.stat().st_mode) == 0o600, log
    finally:
        os.umask(old)


SGLANG_LINE = (
    "[2025-01-01 10:00:00] Decode batch. #running-req: 1, #token: 130, token usage: 0.00, "
    "gen throughput (token/s): 60.1, #new-token: 126, #cached-token: 0, #queue-req: 0"
)


def test_scrubbing_keeps_counts_and_hides_secrets() -> None:
    assert scrub(SGLANG_LINE) == SGLANG_LINE
    text = (
        "ServerArgs(api_key='sk-abc123', url='http://u:pw9@hub.example/x') Authorization: Bearer abcdef123 "
        "--api-key XYZ987 token=abc123def db_pass=hunter2 redis-pwd: hunter3"
    )
    assert scrub(text) == (
        "ServerArgs(api_key='<redacted>', url='http://<redacted>@hub.example/x') Authorization: Bearer <redacted> "
        "--api-key <redacted> token=<redacted> db_pass=<redacted> redis-pwd: <redacted>"
    )
    assert scrub(scrub(text)) == scrub(text)


SECRET_NAMES = ("MYSQL_PWD", "REDIS_PASS", "DB_PASS_FILE", "SSHPASS", "GPG_PASSPHRASE", "AZURE_CREDENTIALS", "HF_TOKEN")
HARMLESS_NAMES = ("NUM_PASSES", "BYPASS", "COMPASS_DIR", "PWD", "OLDPWD", "TOKENIZERS_PARALLELISM", "NCCL_PROTO")


def test_password_like_names_are_secret() -> None:
    assert [n for n in SECRET_NAMES if not SECRET_NAME_RE.search(n)] == []


def test_names_that_only_contain_a_secret_word_are_not_masked() -> None:
    # A false match hides a setting from "what differs": TOKENIZERS_PARALLELISM=false vs true must show.
    assert [n for n in HARMLESS_NAMES if SECRET_NAME_RE.search(n)] == []


def test_fingerprints_compare_masked_urls_by_host_across_stores() -> None:
    store_a, store_b = os.urandom(32), os.urandom(32)
    pw = _passwords()

    def fp(key: bytes, url: str, api_key: str) -> dict[str, Any]:
        env = {"DATABASE_URL": redact("DATABASE_URL", url, key)}
        return {"env": {"workers": env}, "argv": redact_argv(["python", f"--api-key={api_key}"], key)}

    url = f"postgres://orch:{pw['db']}@db.example/runs"
    a, b = fp(store_a, url, pw["flag"]), fp(store_b, url, pw["flag"])
    _assert_none_of(pw, json.dumps([a, b]))
    # Another store's key gives other digests, but that is no difference; another host is one.
    assert fingerprint.diff(a, b) == []
    moved = fp(store_b, url.replace("db.example", "db2.example"), pw["flag"])
    (difference,) = fingerprint.diff(a, moved)
    assert "db2.example" in difference.describe()
    # Within one store two passwords stay two digests (resume and the env check tell them apart).
    assert redact("DATABASE_URL", url, store_a) != redact("DATABASE_URL", url.replace(pw["db"], "other"), store_a)
