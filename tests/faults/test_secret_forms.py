"""Secrets in the forms they come in under names that say nothing (a GitHub token in MY_VAR, a connection string's
AccountKey, a JDBC or ODBC password) and cookies: masked in `orch profiles show`, withheld from bundles (and given
back by the receiver), nowhere in the SQLite file; ordinary settings stay readable."""

from __future__ import annotations

import ast
import json
import re
import sqlite3
import uuid
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.common.redaction import SECRET_NAME_RE
from orchestrator.config import secretpatterns
from orchestrator.results import bundle as bundle_mod
from tests.conftest import FAST_SIM, WriteProfile, free_port, run_orch
from tests.test_imports import PACKAGE

DIGEST = r"<redacted hmac:[0-9a-f]{16}>"


def _secrets() -> dict[str, str]:
    """Each form with a value unique to this test (found by substring in every output and the store file)."""
    tag = uuid.uuid4().hex
    return {
        "ghp": "ghp_" + (tag + tag)[:36],
        "pat": "github_pat_11" + tag[:20].upper() + "_" + (tag * 2)[:59],
        "azure": (tag * 3)[:86] + "==",
        "azure_short": "Az" + tag[:14],
        "jdbc": "PWj" + tag[:12],
        "odbc": "PWo" + tag[:12],
        "cookie": "session=s" + tag,
        "session_cookie": "c" + tag,
        "flag": "PWf" + tag[:12],
    }


# Settings that must stay readable: a false match hides them from "what differs".
ORDINARY = {
    "NCCL_IB_HCA": "mlx5_0,mlx5_1",
    "NCCL_P2P_DISABLE": "1",
    "MODEL_DIR": "/models/Meta-Llama-3.1-8B-Instruct",
    "HF_HUB_OFFLINE": "1",
    "SERVED_MODEL": "Qwen/Qwen2.5-7B-Instruct-AWQ",
    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
    "CHECKPOINT": "/data/ckpt/9fceb02d0ae598e95dc970b74767f19372d61af8/model.safetensors",
    "WEIGHTS_SHA256": "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
    "RUN_UUID": "123e4567-e89b-12d3-a456-426614174000",
    "MAX_BATCH": "1234567890",
    "COOKIE_JAR": "/var/lib/orch/cookies.txt",
}


def _env(s: dict[str, str]) -> dict[str, str]:
    return {
        "MY_VAR": s["ghp"],
        "OTHER_VAR": s["pat"],
        "STORAGE": (
            f"DefaultEndpointsProtocol=https;AccountName=x;AccountKey={s['azure']};EndpointSuffix=core.windows.net"
        ),
        "STORAGE_OLD": f"DefaultEndpointsProtocol=https;AccountName=y;AccountKey={s['azure_short']};",
        "DB_URL": f"jdbc:postgresql://db/x?user=u&password={s['jdbc']}&ssl=true",
        "ODBC": f"Driver={{ODBC Driver 18}};Server=db;Uid=u;Pwd={s['odbc']};Encrypt=yes",
        "COOKIE": s["cookie"],
        "SESSION_COOKIE": s["session_cookie"],
        **ORDINARY,
    }


def _profile(write_profile: WriteProfile, s: dict[str, str]) -> Path:
    return write_profile(
        "forms",
        engine="sglang",
        model_path="/models/test-model",
        tp_size=1,
        port=free_port(),
        ready_timeout_s=30,
        # An unknown flag: the simulator names it, with its value, in its log (as a real server's arg dump would).
        server_args=["--metrics-db", f"jdbc:mysql://db/m?password={s['flag']}"],
        env=_env(s),
        sim=FAST_SIM,
    )


def _leaked(s: dict[str, str], text: str) -> list[str]:
    return [name for name, value in s.items() if value in text]


def test_each_form_is_found_under_an_innocuous_name_and_the_rest_stays() -> None:
    s = _secrets()
    key = b"k" * 32
    shown = {name: secretpatterns.redact(name, value, key) for name, value in _env(s).items()}
    assert not _leaked(s, json.dumps(shown)), shown
    assert re.fullmatch(DIGEST, shown["MY_VAR"]) and re.fullmatch(DIGEST, shown["OTHER_VAR"])
    # The secret part only: the account, the database and the other settings are provenance.
    assert re.fullmatch(rf"DefaultEndpointsProtocol=https;AccountName=x;AccountKey={DIGEST};"
                        r"EndpointSuffix=core\.windows\.net", shown["STORAGE"])  # fmt: skip
    assert re.fullmatch(rf"DefaultEndpointsProtocol=https;AccountName=y;AccountKey={DIGEST};", shown["STORAGE_OLD"])
    assert re.fullmatch(rf"jdbc:postgresql://db/x\?user=u&password={DIGEST}&ssl=true", shown["DB_URL"])
    assert re.fullmatch(rf"Driver=\{{ODBC Driver 18\}};Server=db;Uid=u;Pwd={DIGEST};Encrypt=yes", shown["ODBC"])
    assert re.fullmatch(DIGEST, shown["COOKIE"]) and re.fullmatch(DIGEST, shown["SESSION_COOKIE"])
    assert {k: shown[k] for k in ORDINARY} == ORDINARY
    argv = secretpatterns.redact_argv(["python", "--metrics-db", f"jdbc:mysql://db/m?password={s['flag']}",
                                       "--cookie", "a=b", "--hub", s["ghp"]], key)  # fmt: skip
    assert not _leaked(s, json.dumps(argv)) and "a=b" not in argv, argv
    # Free text: a log line quoting a token is scrubbed; counts and None stay readable.
    line = f"loading with token {s['ghp']} #new-token: 126 api_key=None"
    assert secretpatterns.scrub(line) == "loading with token <redacted> #new-token: 126 api_key=None"


def test_cookie_names_are_secret_and_a_cookie_jar_is_not() -> None:
    assert [
        n for n in ("COOKIE", "SESSION_COOKIE", "HTTP_COOKIES", "auth_cookie") if not SECRET_NAME_RE.search(n)
    ] == []
    assert [n for n in ("COOKIE_JAR", "COOKIECUTTER_CONFIG", "NO_COOKIES_HERE") if SECRET_NAME_RE.search(n)] == []


def test_profiles_show_masks_every_form(write_profile: WriteProfile, capsys: pytest.CaptureFixture[str]) -> None:
    s = _secrets()
    path = _profile(write_profile, s)
    assert main(["profiles", "show", str(path), "--sim"]) == 0
    text = capsys.readouterr().out
    assert main(["profiles", "show", str(path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert not _leaked(s, text + json.dumps(doc)), _leaked(s, text + json.dumps(doc))
    assert re.search(rf"MY_VAR: '?{DIGEST}", text), text
    assert "secret-looking values are shown as digests" in text
    assert re.fullmatch(DIGEST, doc["env"]["COOKIE"]) and re.fullmatch(DIGEST, doc["profile"]["env"]["OTHER_VAR"])
    assert {k: doc["env"][k] for k in ORDINARY} == ORDINARY


def _store_bytes(db: Path) -> bytes:
    return b"".join(p.read_bytes() for p in (db, Path(f"{db}-wal"), Path(f"{db}-journal")) if p.exists())


def test_a_run_stores_and_exports_no_form_and_the_receiver_gets_them_back(
    write_profile: WriteProfile, tmp_path: Path
) -> None:
    s = _secrets()
    _profile(write_profile, s)
    db = tmp_path / "r.db"
    args = ("bench", "forms", "--sim", "--runs", "1", "--warmup", "0", "--max-tokens", "16", "--grace", "2")
    proc = run_orch(*args, "--min-run-s", "0", "--db", str(db), cwd=tmp_path)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, out + err
    # The host digests names and URLs; orch digests the patterns in what the host read back with the same key: the
    # read-back agrees with the profile.
    assert "env check ok" in out + err, out + err
    bundle_path = tmp_path / "sent.orch.json"
    shown = [out, err]
    for extra in (("show", "last"), ("show", "last", "--json"), ("export", "last", "--format", "md"),
                  ("export", "last", "--format", "bundle", "-o", str(bundle_path))):  # fmt: skip
        p = run_orch(*extra, "--db", str(db), cwd=tmp_path)
        o, e = p.communicate(timeout=120)
        assert p.returncode == 0, o + e
        shown += [o, e]
    bundle_text = bundle_path.read_text()
    assert not _leaked(s, "\n".join([*shown, bundle_text]))
    data = _store_bytes(db)
    assert not [name for name, value in s.items() if value.encode() in data]

    conn = sqlite3.connect(db)
    env_json, argv_json = conn.execute("SELECT env_json, argv_json FROM launches").fetchone()
    conn.close()
    env, argv = json.loads(env_json), json.loads(argv_json)
    assert re.fullmatch(rf"jdbc:postgresql://db/x\?user=u&password={DIGEST}&ssl=true", env["DB_URL"]), env
    assert {k: env[k] for k in ORDINARY} == ORDINARY
    assert re.fullmatch(rf"jdbc:mysql://db/m\?password={DIGEST}", argv[argv.index("--metrics-db") + 1]), argv

    # The bundle says the values were withheld, like any secret; the receiver gives each back, whole, in the
    # same-named variable (an argv secret in ORCH_SECRET_<FLAG>), and the profile runs as it was.
    sent = json.loads(bundle_text)["content"]["profiles"][0]
    assert sent["env"]["MY_VAR"] == bundle_mod.WITHHELD
    assert (
        sent["env"]["STORAGE_OLD"] == f"DefaultEndpointsProtocol=https;AccountName=y;AccountKey={bundle_mod.WITHHELD};"
    )
    full = {k: v for k, v in _env(s).items() if k not in ORDINARY}
    environ = {**full, "ORCH_SECRET_METRICS_DB": f"jdbc:mysql://db/m?password={s['flag']}"}
    (again,) = bundle_mod.profiles_from_bundle(bundle_mod.read_bundle(bundle_path), environ=environ)
    assert again.env_dict() == _env(s)
    assert list(again.server_args) == ["--metrics-db", f"jdbc:mysql://db/m?password={s['flag']}"]
    with pytest.raises(Exception, match="MY_VAR"):
        bundle_mod.profiles_from_bundle(bundle_mod.read_bundle(bundle_path), environ={})


# Where orch prints, stores or exports values: every such module redacts through config/secretpatterns; only what
# ships to the host (stdlib, no patterns) and secretpatterns itself use common/redaction's functions directly.
ORCH_SIDE_REDACTORS = {"redact", "redact_argv", "scrub", "secret_values"}
MAY_USE_THE_HOSTS = ("agent", "client", "common", "sim", "config/secretpatterns.py")


def test_nothing_on_the_orch_side_redacts_without_the_patterns() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith(MAY_USE_THE_HOSTS):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module == "orchestrator.common.redaction":
                found += [f"{rel}: {a.name}" for a in node.names if a.name in ORCH_SIDE_REDACTORS]
    assert not found, "use orchestrator.config.secretpatterns instead: " + "; ".join(found)
