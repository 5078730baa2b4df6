"""Secrets in the forms a hostile review still found leaking under innocuous names: a braced ODBC or quoted ADO.NET
password holding `;`, a whole JWT, Azure Service Bus keys and SAS signatures, header lines (`Cookie:`,
`Authorization: Basic`, `X-Api-Key:`) in values and after --header/-H, Oracle's `user/password@`, and any `…password=`
key in a connection string or a URL's query. Each is masked in `orch profiles show`, an A/B's store file and its
bundle (the receiver gives it back), and in log tails on both sides; ordinary settings stay readable."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import sqlite3
import uuid
from pathlib import Path
from typing import Any

import pytest

from orchestrator.cli import main
from orchestrator.common import redaction
from orchestrator.config import secretpatterns
from orchestrator.results import bundle as bundle_mod
from tests.conftest import FAST_SIM, WriteProfile, free_port, run_orch

DIGEST = r"<redacted hmac:[0-9a-f]{16}>"
JWT_HEADER = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9"  # {"alg":"HS256","typ":"JWT"}


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _secrets() -> dict[str, str]:
    """Each secret, and each part of one that leaked on its own before (after the `;` inside quotes or braces, a
    JWT's payload and signature), unique to this test: found by substring in every output and the store file."""
    tag = uuid.uuid4().hex
    payload = _b64url(json.dumps({"sub": tag, "iat": 1516239022}).encode())
    signature = _b64url(hashlib.sha256(tag.encode()).digest())
    return {
        "odbc": f"Br{tag[:8]}}}}};dS{tag[8:16]}",  # ODBC writes a `}` in braces as `}}`
        "odbc_tail": f"dS{tag[8:16]}",
        "quoted": f"Qu{tag[:8]};Se{tag[8:16]}",
        "quoted_tail": f"Se{tag[8:16]}",
        "json": f"Js{tag[:8]};Ta{tag[8:16]}",
        "json_tail": f"Ta{tag[8:16]}",
        "jwt": f"{JWT_HEADER}.{payload}.{signature}",
        "jwt_payload": payload,
        "jwt_signature": signature,
        "bus": base64.b64encode(tag.encode()[:30]).decode(),
        "sas": _b64url(tag.encode()[:24]) + "%3D",
        "cookie": f"sid=c{tag}",
        "oracle": f"Ti{tag[:12]}",
        "sslpassword": f"ss{tag[:12]}",
        "query_token": f"qt{tag[:12]}",
        "pwd_line": f"pl{tag[:12]}",
        "dbpwd": f"dp{tag[:12]}",
        "arg_cookie": f"sid=a{tag}",
        "arg_basic": base64.b64encode(f"u:{tag}".encode()).decode(),
        "arg_api_key": f"xk{tag[:20]}",
    }


# Each form under a name that says nothing, and what orch shows of it: the secret part a keyed digest, the rest kept
# (driver, server, account, host, database, options are provenance).
def _env(s: dict[str, str]) -> dict[str, str]:
    return {
        "MY_DSN": f"Driver={{ODBC Driver 18}};Server=db;Uid=u;Pwd={{{s['odbc']}}};Encrypt=yes",
        "CONN": f'Server=db;User Id=u;Password="{s["quoted"]}";Database=x',
        "SETTINGS": f'{{"user": "u", "password": "{s["json"]}"}}',  # found by detect-secrets' keyword detector
        "UPSTREAM": f"Bearer {s['jwt']}",
        "SSO": s["jwt"],
        "BUS": f"Endpoint=sb://x.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey={s['bus']}",
        "BLOB": f"https://acct.blob.core.windows.net/c?sv=2022-11-02&sr=c&sig={s['sas']}",
        "EXTRA": f"Cookie: {s['cookie']}",
        "ORA": f"jdbc:oracle:thin:scott/{s['oracle']}@db.example:1521/orcl",
        "PG": f"host=db sslpassword={s['sslpassword']} dbname=x",
        "LEGACY": f"Server=db;Uid=u;DbPwd={s['dbpwd']};",
        "FEED": f"https://feed.example/v1?format=json&Access_Token={s['query_token']}",
    }


SHOWN = {
    "MY_DSN": rf"Driver=\{{ODBC Driver 18\}};Server=db;Uid=u;Pwd=\{{{DIGEST}\}};Encrypt=yes",
    "CONN": rf'Server=db;User Id=u;Password="{DIGEST}";Database=x',
    "SETTINGS": rf'\{{"user": "u", "password": "{DIGEST}"\}}',
    "UPSTREAM": rf"Bearer {DIGEST}",
    "SSO": DIGEST,
    "BUS": rf"Endpoint=sb://x\.servicebus\.windows\.net/;SharedAccessKeyName=k;SharedAccessKey={DIGEST}",
    "BLOB": rf"https://acct\.blob\.core\.windows\.net/c\?sv=2022-11-02&sr=c&sig={DIGEST}",
    "EXTRA": rf"Cookie: {DIGEST}",
    "ORA": rf"jdbc:oracle:thin:{DIGEST}@db\.example:1521/orcl",
    "PG": rf"host=db sslpassword={DIGEST} dbname=x",
    "LEGACY": rf"Server=db;Uid=u;DbPwd={DIGEST};",
    "FEED": rf"https://feed\.example/v1\?format=json&Access_Token={DIGEST}",
}


# Header lines passed to the server as arguments, each after a flag of its own (a bundle's receiver gives an argv
# secret back in ORCH_SECRET_<FLAG>).
def _server_args(s: dict[str, str]) -> list[str]:
    return [
        "--header", f"Cookie: {s['arg_cookie']}",
        "-H", f"Authorization: Basic {s['arg_basic']}",
        "--extra-header", f"X-Api-Key: {s['arg_api_key']}",
    ]  # fmt: skip


SHOWN_ARGS = ["--header", rf"Cookie: {DIGEST}", "-H", rf"Authorization: Basic {DIGEST}",
              "--extra-header", rf"X-Api-Key: {DIGEST}"]  # fmt: skip

# Settings that must stay readable: a false match hides them from "what differs".
ORDINARY = {
    "NCCL_IB_HCA": "mlx5_0,mlx5_1",
    "NCCL_SOCKET_IFNAME": "eth0",
    "CUDA_VISIBLE_DEVICES": "0,1,2,3",
    "MODEL_DIR": "/models/Meta-Llama-3.1-8B-Instruct",
    "HUB_URL": "https://huggingface.co/Qwen/Qwen2.5-7B?revision=main&sort=downloads",
    "WEIGHTS_SHA256": "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
    "IMAGE": "ghcr.io/org/img@sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
    "MAX_BATCH": "1234567890",
    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True,max_split_size_mb:512",
    "TORCH_CUDA_ARCH_LIST": "8.0;9.0",
    "PG_PLAIN": "host=db port=5432 dbname=x sslmode=require sslkey=/etc/ssl/client.key",
    "BUS_PLAIN": "Endpoint=sb://x.servicebus.windows.net/;SharedAccessKeyName=k;EntityPath=q",
    "LIMITS": "max_tokens=512;num_tokens=5",
    "HF_MODEL": "hf:Qwen/Qwen2.5-7B@main",
    "MIRROR": "https://mirror.example:8080/pkgs/@scope/pkg@1.2.3",
    "CACHE": "redis://cache.example:6379/0?protocol=3",
}
ORDINARY_ARGS = ["--served-model-name", "my-model", "--model-path", "/models/x", "--max-total-tokens", "8192",
                 "--speculative-num-draft-tokens", "4", "--dist-init-addr", "10.0.0.1:5000"]  # fmt: skip


def _leaked(s: dict[str, str], text: str) -> list[str]:
    return [name for name, value in s.items() if value in text]


@pytest.mark.parametrize("name", list(SHOWN))
def test_each_form_under_an_innocuous_name_is_masked_and_the_rest_stays(name: str) -> None:
    s = _secrets()
    key = b"k" * 32
    shown = secretpatterns.redact(name, _env(s)[name], key)
    assert not _leaked(s, shown), shown
    assert re.fullmatch(SHOWN[name], shown), shown
    # The host (stdlib, no patterns) masks the forms with a grammar itself, with the same digest; orch digests what
    # detect-secrets finds in the host's read-back on arrival (remask): either way the read-back matches.
    on_host = redaction.redact(name, _env(s)[name], key)
    assert on_host == shown or name == "SETTINGS", on_host
    assert secretpatterns.remask({name: on_host}, key) == {name: shown}


@pytest.mark.parametrize("flag", ["--header", "-H", "--extra-header"])
def test_each_header_argument_is_masked(flag: str) -> None:
    s = _secrets()
    argv = _server_args(s)
    i = argv.index(flag)
    shown = secretpatterns.redact_argv(["python", *argv[i : i + 2]], b"k" * 32)
    assert not _leaked(s, json.dumps(shown)), shown
    assert shown[1] == flag and re.fullmatch(SHOWN_ARGS[i + 1], shown[2]), shown
    # Also given as --flag=VALUE, and on the host (`orch status -v` masks a server's command line there).
    assert not _leaked(s, json.dumps(secretpatterns.redact_argv([f"{flag}={argv[i + 1]}"])))
    assert redaction.redact_argv(["python", *argv[i : i + 2]], b"k" * 32) == shown


def test_ordinary_settings_stay_readable() -> None:
    assert {k: secretpatterns.redact(k, v) for k, v in ORDINARY.items()} == ORDINARY
    assert secretpatterns.redact_argv(ORDINARY_ARGS) == ORDINARY_ARGS


# Free text a server may print, each secret where orch does not know it (no known values): a log tail on the orch side
# and on the host (stdlib) alike.
def _log_lines(s: dict[str, str]) -> dict[str, str]:
    return {
        "odbc": f"connecting with Driver={{X}};Server=db;Pwd={{{s['odbc']}}};Encrypt=yes",
        "quoted": f'conn=Server=db;Password="{s["quoted"]}";Database=x',
        "json": f'config {{"user": "u", "password": "{s["json"]}"}}',
        "jwt": f"calling upstream with Authorization: Bearer {s['jwt']} #new-token: 126",
        "jwt_bare": f"cached session {s['jwt']} expired",
        "bus": f"bus Endpoint=sb://x.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey={s['bus']}",
        "sas": f"GET https://acct.blob.core.windows.net/c?sv=2022-11-02&sig={s['sas']} 200",
        "cookie": f"> Cookie: {s['cookie']}; theme=dark",
        "oracle": f"url jdbc:oracle:thin:scott/{s['oracle']}@db.example:1521/orcl failed",
        "sslpassword": f"ServerArgs(model_path='m', sslpassword='{s['sslpassword']}', api_key=None)",
        "query_token": f"fetch https://feed.example/v1?format=json&Access_Token={s['query_token']}",
        "pwd_line": f"Pwd={s['pwd_line']};Server=db;Uid=u",
        "pg": f"host=db sslpassword={s['sslpassword']} dbname=x sslmode=require",
        "arg_cookie": f'curl -H "Cookie: {s["arg_cookie"]}" http://127.0.0.1:30000/health',
        "arg_basic": f"Proxy-Authorization: Basic {s['arg_basic']}",
        "arg_api_key": f"unknown flag --extra-header X-Api-Key: {s['arg_api_key']}: ignored",
    }


@pytest.mark.parametrize("form", list(_log_lines(_secrets())))
def test_a_log_line_quoting_each_form_is_scrubbed(form: str) -> None:
    s = _secrets()
    line = _log_lines(s)[form]
    for scrub in (secretpatterns.scrub, redaction.scrub):
        scrubbed = scrub(line)
        assert not _leaked(s, scrubbed), (scrub.__module__, scrubbed)
        assert "<redacted>" in scrubbed and scrub(scrubbed) == scrubbed


def test_around_a_scrubbed_secret_the_line_stays_readable() -> None:
    lines = _log_lines(_secrets())
    for scrub in (secretpatterns.scrub, redaction.scrub):
        assert scrub(lines["jwt"]) == "calling upstream with Authorization: Bearer <redacted> #new-token: 126"
        assert scrub(lines["sas"]) == "GET https://acct.blob.core.windows.net/c?sv=2022-11-02&sig=<redacted> 200"
        assert scrub(lines["cookie"]) == "> Cookie: <redacted>"
        assert scrub(lines["pg"]) == "host=db sslpassword=<redacted> dbname=x sslmode=require"


def test_log_lines_without_secrets_stay_readable() -> None:
    lines = [
        "Decode batch. #running-req: 1, #token: 130, token usage: 0.00, #new-token: 126, #cached-token: 0",
        "ServerArgs(model_path='/m', served_model_name='x', api_key=None, max_total_tokens=8192, hf_token=None)",
        "secret: ready after 2.1s; password: see docs, monkey=3",
        "GET https://huggingface.co/api/models/Qwen/Qwen2.5-7B?revision=main&expand=sha 200",
        "cwd PWD=/home/u OLDPWD=/tmp",
    ]
    for line in lines:
        assert secretpatterns.scrub(line) == line
        assert redaction.scrub(line) == line


def _profiles(write_profile: WriteProfile, s: dict[str, str], **sim: Any) -> Path:
    write_profile("plain", engine="sglang", model_path="/models/test-model", tp_size=1, port=free_port(),
                  ready_timeout_s=30, sim=FAST_SIM)  # fmt: skip
    return write_profile(
        "grammars",
        engine="sglang",
        model_path="/models/test-model",
        tp_size=1,
        port=free_port(),
        ready_timeout_s=30,
        # Unknown flags: the simulator names each, with its value, in its log (as a real server's arg dump would).
        server_args=_server_args(s),
        served_model_name="my-model",
        env={**_env(s), **ORDINARY},
        sim={**FAST_SIM, **sim},
    )


def test_profiles_show_masks_every_form(write_profile: WriteProfile, capsys: pytest.CaptureFixture[str]) -> None:
    s = _secrets()
    path = _profiles(write_profile, s)
    assert main(["profiles", "show", str(path), "--sim"]) == 0
    text = capsys.readouterr().out
    assert main(["profiles", "show", str(path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert not _leaked(s, text + json.dumps(doc)), _leaked(s, text + json.dumps(doc))
    assert {k: doc["env"][k] for k in ORDINARY} == ORDINARY
    assert [k for k, shown in SHOWN.items() if not re.fullmatch(shown, doc["env"][k])] == [], doc["env"]
    assert "--served-model-name my-model" in text and "secret-looking values are shown as digests" in text


def _store_bytes(db: Path) -> bytes:
    return b"".join(p.read_bytes() for p in (db, Path(f"{db}-wal"), Path(f"{db}-journal")) if p.exists())


def test_an_ab_stores_and_bundles_no_form_and_the_receiver_gets_them_back(
    write_profile: WriteProfile, tmp_path: Path
) -> None:
    s = _secrets()
    _profiles(write_profile, s)
    db = tmp_path / "r.db"
    args = ("ab", "plain", "grammars", "--sim", "--blocks", "1", "--runs", "1", "--warmup", "0", "--max-tokens", "8")
    proc = run_orch(*args, "--grace", "2", "--gpu-wait", "0", "--min-run-s", "0", "--db", str(db), cwd=tmp_path)
    out, err = proc.communicate(timeout=240)
    assert proc.returncode in (0, 4), out + err  # one block: the verdict may well be inconclusive
    # The host masks the forms itself with the store's key: its read-back of the env agrees with the profile.
    assert "env check ok" in out + err and "env check FAILED" not in out + err, out + err
    bundle_path = tmp_path / "sent.orch.json"
    shown = [out, err]
    for extra in (("show", "last"), ("show", "last", "--json"),
                  ("export", "last", "--format", "bundle", "-o", str(bundle_path))):  # fmt: skip
        p = run_orch(*extra, "--db", str(db), cwd=tmp_path)
        o, e = p.communicate(timeout=120)
        assert p.returncode == 0, o + e
        shown += [o, e]
    bundle_text = bundle_path.read_text()
    assert not _leaked(s, "\n".join([*shown, bundle_text])), _leaked(s, "\n".join([*shown, bundle_text]))
    assert not [name for name, value in s.items() if value.encode() in _store_bytes(db)]

    conn = sqlite3.connect(db)
    rows = conn.execute("SELECT env_json, argv_json FROM launches WHERE env_json LIKE '%MY_DSN%'").fetchall()
    conn.close()
    assert rows
    for env_json, argv_json in rows:
        env, argv = json.loads(env_json), json.loads(argv_json)
        assert [k for k, shown in SHOWN.items() if not re.fullmatch(shown, env[k])] == [], env
        assert {k: env[k] for k in ORDINARY} == ORDINARY
        i = argv.index("--header")
        assert [re.fullmatch(p, a) is not None for p, a in zip(SHOWN_ARGS, argv[i : i + 6], strict=True)] == [True] * 6

    # The bundle withholds just the secret parts; the receiver gives each value back, whole, in the same-named
    # variable (an argument in ORCH_SECRET_<FLAG>, -H's in ORCH_SECRET_VALUE), and the profile runs as it was.
    sent = json.loads(bundle_text)["content"]["profiles"][1]
    assert sent["env"]["EXTRA"] == f"Cookie: {bundle_mod.WITHHELD}"
    assert sent["env"]["ORA"] == f"jdbc:oracle:thin:{bundle_mod.WITHHELD}@db.example:1521/orcl"
    assert sent["server_args"][1] == f"Cookie: {bundle_mod.WITHHELD}"
    args_given = _server_args(s)
    environ = {**_env(s), "ORCH_SECRET_HEADER": args_given[1], "ORCH_SECRET_VALUE": args_given[3],
               "ORCH_SECRET_EXTRA_HEADER": args_given[5]}  # fmt: skip
    _, again = bundle_mod.profiles_from_bundle(bundle_mod.read_bundle(bundle_path), environ=environ)
    assert again.env_dict() == {**_env(s), **ORDINARY}
    assert list(again.server_args) == args_given
    with pytest.raises(Exception, match="MY_DSN"):
        bundle_mod.profiles_from_bundle(bundle_mod.read_bundle(bundle_path), environ={})


def test_a_failed_launch_log_tail_is_scrubbed_of_every_argument_form(
    write_profile: WriteProfile, tmp_path: Path
) -> None:
    s = _secrets()
    _profiles(write_profile, s, fault="exit-during-load")
    db = tmp_path / "r.db"
    args = ("bench", "grammars", "--sim", "--runs", "1", "--warmup", "0", "--max-tokens", "8", "--grace", "2")
    proc = run_orch(*args, "--min-run-s", "0", "--db", str(db), cwd=tmp_path)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, out + err
    # The tail quotes the simulator's warning about each unknown flag, value and all: the header names stay.
    assert "unknown flag --header Cookie: <redacted>" in err and "X-Api-Key: <redacted>" in err, err
    p = run_orch("show", "last", "--db", str(db), cwd=tmp_path)
    shown, e = p.communicate(timeout=120)
    assert not _leaked(s, "\n".join([out, err, shown, e])), _leaked(s, "\n".join([out, err, shown, e]))
    assert not [name for name, value in s.items() if value.encode() in _store_bytes(db)]
