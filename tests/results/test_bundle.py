"""Result bundles: export → import elsewhere → the same report; secrets withheld; profiles back; bad files refused."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.cli import main
from orchestrator.config import profile as profiles_mod
from orchestrator.config.workload import BenchConfig
from orchestrator.errors import InputError, ProfileError
from orchestrator.results import bundle as bundle_mod
from tests.conftest import FAST_SIM, REPO, free_port

API_KEY, HF_TOKEN = "sk-SECRET-api-value", "hf_SECRETtokenvalue"
SECRETS = {"ORCH_SECRET_API_KEY": API_KEY, "HF_TOKEN": HF_TOKEN}


def _env(xdg: Path) -> dict[str, str]:
    # Module-scoped work runs before the per-test private dirs exist: give every orch its own, explicitly.
    dirs = {v: str(xdg / v.lower()) for v in ("XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME")}
    return {**os.environ, **dirs, "PYTHONPATH": str(REPO)}


def _orch(*args: str, cwd: Path, xdg: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", *args],
        cwd=cwd,
        env=_env(xdg),
        text=True,
        capture_output=True,
        timeout=180,
    )


@pytest.fixture(scope="module")
def sent(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One real simulator experiment whose profiles carry an argv secret and an env secret, exported as a bundle."""
    root = tmp_path_factory.mktemp("sender")
    profiles = root / "profiles"
    profiles.mkdir()
    base = {
        "engine": "sglang",
        "model_path": "/models/test-model",
        "tp_size": 2,
        "port": free_port(),
        "ready_timeout_s": 30,
        "server_args": ["--api-key", API_KEY],
        "env": {"NCCL_PROTO": "LL", "HF_TOKEN": HF_TOKEN},
        "sim": FAST_SIM,
    }
    (profiles / "base.yaml").write_text(yaml.safe_dump(base))
    (profiles / "baseline.yaml").write_text("extends: base\n")
    eagle = {"extends": "base", "port": free_port(), "speculative": {"algorithm": "NGRAM", "num_steps": 3}}
    (profiles / "ngram.yaml").write_text(yaml.safe_dump(eagle))
    xdg = root / "xdg-sender"
    run = _orch(
        *("ab", "baseline", "ngram", "--sim", "--blocks", "2", "--runs", "2", "--warmup", "0"),
        *("--max-tokens", "16", "--min-run-s", "0", "--grace", "2"),
        cwd=root,
        xdg=xdg,
    )
    assert run.returncode == 0, run.stderr
    shown = _orch("show", "last", cwd=root, xdg=xdg)
    assert shown.returncode == 0, shown.stderr
    exported = _orch("export", "last", "--format", "bundle", cwd=root, xdg=xdg)
    assert exported.returncode == 0, exported.stderr
    (path,) = root.glob("*.orch.json")  # the default name: <id>.orch.json
    assert "secret values withheld" in exported.stderr
    return {"root": root, "xdg": xdg, "path": path, "report": shown.stdout, "profiles": profiles}


def test_import_into_another_store_shows_the_same_report(sent: dict[str, Any], tmp_path: Path) -> None:
    path: Path = sent["path"]
    exp_id = path.name.removesuffix(".orch.json")
    receiver = tmp_path / "xdg-receiver"
    imported = _orch("import", str(path), cwd=tmp_path, xdg=receiver)
    assert imported.returncode == 0, imported.stderr
    assert f"imported experiment {exp_id} (4 launches)" in imported.stdout and f"orch show {exp_id}" in imported.stdout
    shown = _orch("show", exp_id, cwd=tmp_path, xdg=receiver)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == sent["report"]
    again = _orch("import", str(path), cwd=tmp_path, xdg=receiver)
    assert again.returncode == 0 and "already in" in again.stdout and "imported from" in again.stdout
    # The sender's own store holds the original: importing it there is a no-op too, not a duplicate.
    home = _orch("import", str(path), cwd=tmp_path, xdg=sent["xdg"])
    assert home.returncode == 0 and "recorded here" in home.stdout
    # export works unchanged on the imported experiment, and re-exporting gives the same content.
    md = _orch("export", exp_id, "--format", "md", cwd=tmp_path, xdg=receiver)
    assert md.returncode == 0 and f"# A/B {exp_id}" in md.stdout
    out = tmp_path / "again.orch.json"
    assert _orch("export", exp_id, "--format", "bundle", "-o", str(out), cwd=tmp_path, xdg=receiver).returncode == 0
    first, second = bundle_mod.read_bundle(path), bundle_mod.read_bundle(out)
    assert first["content"] == second["content"] and second["exported"]["imported_from"] == str(path.resolve())


def test_show_and_export_read_a_bundle_file_without_importing(sent: dict[str, Any], tmp_path: Path) -> None:
    fresh = tmp_path / "xdg-nobody"
    shown = _orch("show", str(sent["path"]), cwd=tmp_path, xdg=fresh)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == sent["report"]
    as_json = _orch("export", str(sent["path"]), "--format", "json", cwd=tmp_path, xdg=fresh)
    assert as_json.returncode == 0 and json.loads(as_json.stdout)["experiment_id"] in sent["path"].name
    assert not fresh.exists()  # nothing was imported, no store created


def test_secrets_are_withheld_not_digested(sent: dict[str, Any]) -> None:
    text = sent["path"].read_text()
    assert API_KEY not in text and HF_TOKEN not in text
    assert "redacted hmac" not in text
    bundle = json.loads(text)
    for prof in bundle["content"]["profiles"]:
        assert prof["env"]["HF_TOKEN"] == bundle_mod.WITHHELD
        assert prof["server_args"] == ["--api-key", bundle_mod.WITHHELD]
    launch = bundle["content"]["launches"][0]
    assert launch["env"]["HF_TOKEN"] == bundle_mod.WITHHELD
    assert launch["argv"][launch["argv"].index("--api-key") + 1] == bundle_mod.WITHHELD


def test_profiles_from_bundle_round_trip(sent: dict[str, Any]) -> None:
    bundle = bundle_mod.read_bundle(sent["path"])
    got = bundle_mod.profiles_from_bundle(bundle, environ=SECRETS)
    originals = [profiles_mod.load(str(sent["profiles"] / f"{n}.yaml")) for n in ("baseline", "ngram")]
    assert [p.name for p in got] == ["baseline", "ngram"]
    for mine, theirs in zip(got, originals, strict=True):
        assert profiles_mod.differing_fields(mine, theirs) == []
        assert mine.chain == theirs.chain and mine.env_dict()["HF_TOKEN"] == HF_TOKEN
    with pytest.raises(InputError, match=r"set HF_TOKEN, ORCH_SECRET_API_KEY in orch's environment"):
        bundle_mod.profiles_from_bundle(bundle, environ={})


def test_from_resolved_validates_like_a_file() -> None:
    good = {"name": "x", "engine": "sglang", "model_path": "/m", "tp_size": 1, "port": 8000, "speculative": None}
    assert profiles_mod.from_resolved(good, "b.json: profiles[0]").port == 8000
    with pytest.raises(ProfileError, match=r"b.json: profiles\[0\]: tp_size: .*got 0"):
        profiles_mod.from_resolved({**good, "tp_size": 0}, "b.json: profiles[0]")
    with pytest.raises(ProfileError, match=r"portt: unknown field \(did you mean 'port'"):
        profiles_mod.from_resolved({**good, "portt": 1}, "b.json: profiles[0]")
    with pytest.raises(ProfileError, match=r"env\.ORCH_LAUNCH_ID: reserved"):
        profiles_mod.from_resolved({**good, "env": {"ORCH_LAUNCH_ID": "x"}}, "b.json: profiles[0]")


def _resealed(bundle: dict[str, Any]) -> dict[str, Any]:
    bundle["digest"] = bundle_mod.digest_of(bundle)
    return bundle


def _bad_bundles(original: dict[str, Any], text: str) -> dict[str, tuple[str, str]]:
    """name → (file text, what the error must say)."""
    newer = json.loads(text)
    newer["version"] = bundle_mod.BUNDLE_VERSION + 1
    tampered = json.loads(text)
    tampered["content"]["launches"][0]["runs"][0]["tok_s"] *= 1.5
    missing = json.loads(text)
    del missing["content"]["launches"][1]["runs"][0]["tok_s"]
    ill = json.loads(text)
    ill["content"]["launches"][0]["arm_index"] = "first"
    slo = json.loads(text)
    slo["content"]["config"]["slo"] = {"ttft_p99": "fast"}
    metric = json.loads(text)
    metric["content"]["config"]["metric"] = "goodput"  # without an SLO to count against
    # Names, ids and digests a terminal would show or reproduce would use: refused on read, naming the field.
    arm = json.loads(text)
    arm["content"]["experiment"]["arms"][0] = "base\x1b]0;owned\x07line"
    profile = json.loads(text)
    profile["content"]["profiles"][1]["name"] = "baseline"
    profile_field = json.loads(text)
    profile_field["content"]["profiles"][0]["env"] = {"ORCH_LAUNCH_ID": "x"}
    exp_id = json.loads(text)
    exp_id["content"]["experiment"]["id"] = "my-experiment"
    launch_id = json.loads(text)
    launch_id["content"]["launches"][0]["launch_id"] = "x\ny"
    launch_profile = json.loads(text)
    launch_profile["content"]["launches"][0]["profile"] = "other"
    host = json.loads(text)
    host["content"]["experiment"]["host"] = "gpu-box\r\x1b[2K"
    requests_digest = json.loads(text)
    requests_digest["content"]["config"]["requests_sha256"] = "not-a-digest"
    port = json.loads(text)
    port["content"]["config"]["port"] = 70000
    signature = json.loads(text)
    signature["signature"] = "-----BEGIN SSH SIGNATURE-----\nAAAA\n-----END SSH SIGNATURE-----\n"
    signed_v2 = json.loads(text)
    signed_v2.update(version=2, signature="not a signature")
    return {
        **_bad_fields(text),
        **{
            "not json": ("this is not json {", "not JSON"),
            "truncated": (text[: len(text) // 2], "truncated"),
            "empty": ("", "empty"),
            "wrong format": (json.dumps({"format": "something-else", "version": 1}), "not an orch result bundle"),
            "json export": (
                json.dumps({"experiment_id": "x", "comparisons": []}),
                "`orch export --format json` output",
            ),
            "newer": (json.dumps(newer), f"bundle version {bundle_mod.BUNDLE_VERSION + 1} is newer"),
            "tampered": (json.dumps(tampered), "does not match its digest"),
            "missing field": (json.dumps(_resealed(missing)), "content.launches[1].runs[0].tok_s: required field"),
            "ill-typed": (json.dumps(_resealed(ill)), "content.launches[0].arm_index: expected an integer"),
            "bad slo": (json.dumps(_resealed(slo)), "content.config: slo: ttft_p99: expected a limit in seconds"),
            "bad metric": (
                json.dumps(_resealed(metric)),
                "content.config: metric goodput counts requests within the SLO",
            ),
            "arm name": (
                json.dumps(_resealed(arm)),
                'content.experiment.arms[0]: "base\\u001b]0;owned\\u0007line" is not a profile name (letters,',
            ),
            "profile name": (
                json.dumps(_resealed(profile)),
                'content.profiles[1].name: "baseline" is not its arm\'s name',
            ),
            "profile field": (
                json.dumps(_resealed(profile_field)),
                "content.profiles[0]: env.ORCH_LAUNCH_ID: reserved",
            ),
            "experiment id": (
                json.dumps(_resealed(exp_id)),
                'content.experiment.id: "my-experiment" is not an experiment id',
            ),
            "launch id": (
                json.dumps(_resealed(launch_id)),
                'content.launches[0].launch_id: "x\\ny" is not an orch launch id',
            ),
            "launch profile": (
                json.dumps(_resealed(launch_profile)),
                'content.launches[0].profile: "other" is not its arm\'s profile',
            ),
            "host": (json.dumps(_resealed(host)), 'content.experiment.host: "gpu-box\\r\\u001b[2K" is not a host name'),
            "requests digest": (
                json.dumps(_resealed(requests_digest)),
                'content.config.requests_sha256: "not-a-digest" is not a sha256 digest',
            ),
            "port": (
                json.dumps(_resealed(port)),
                "content.config.port: expected an integer from 1 to 65535, got 70000",
            ),
            "signature in v1": (json.dumps(_resealed(signature)), "signature: a version 1 bundle carries none"),
            "signature malformed": (json.dumps(_resealed(signed_v2)), "signature: expected the armored text"),
        },
    }


# Every field of the format is checked on read by type, range, enumeration or format (issue 34, item 1): one case per
# kind of check, each naming its field and quoting the value on one line. name -> (change to the bundle `b`, whose
# content is `c` and launches `launches`; what the refusal says).
FIELDS: dict[str, tuple[str, str]] = {
    "env name": (
        'c["profiles"][0]["env"] = {"PYTHONPATH\\n": "/tmp/x"}',
        'content.profiles[0].env: the key "PYTHONPATH\\n" is no field or variable name',
    ),
    "launch env name": (
        'launches[0]["env"]["LD_PRELOAD\\n"] = "/tmp/x.so"',
        'content.launches[0].env: the key "LD_PRELOAD\\n" is no field or variable name',
    ),
    "workload digest": (
        'launches[0]["fingerprint"]["workload_sha256"] = "zz"',
        'content.launches[0].fingerprint.workload_sha256: "zz" is not a sha256 digest',
    ),
    "profile digest": (
        'launches[1]["fingerprint"]["profile_sha256"] = "../x"',
        'content.launches[1].fingerprint.profile_sha256: "../x" is not a sha256 digest',
    ),
    "launch status": (
        'launches[0]["status"] = "evil\\n"',
        'content.launches[0].status: expected one of running, complete, failed, interrupted, duplicate, got "evil\\n"',
    ),
    "experiment kind": (
        'c["experiment"]["kind"] = "x\\nFORGED"',
        'content.experiment.kind: expected one of ab, got "x\\nFORGED"',
    ),
    "block": ('launches[0]["block"] = 999', "content.launches[0].block: 999 is not a block of the design (0..1)"),
    "position": ('launches[0]["position"] = 5', "content.launches[0].position: 5 is not a position in a block (0..1)"),
    "slot": (
        'launches[0]["position"] = 1 - launches[0]["position"]',
        "content.launches[0].position: block 0 launches arm",
    ),
    "duplicate slot": (
        'launches.append({**launches[0], "launch_id": launches[0]["launch_id"] + "-again"})',
        "content.launches[4]: a second launch of arm",
    ),
    "arm index": ('launches[2]["arm_index"] = 7', "content.launches[2].arm_index: 7 is not an arm (0..1)"),
    "run index": (
        'launches[0]["runs"][1]["idx"] = 5',
        "content.launches[0].runs[1].idx: 5 is not a run of the workload (its 2 runs per level are 0..1)",
    ),
    "warmup flag": (
        'launches[0]["runs"][1]["warmup"] = True',
        "content.launches[0].runs[1].idx: 1 is not a warmup of the workload (it has no warmups)",
    ),
    "run level": (
        'launches[3]["runs"][0]["concurrency"] = 8',
        "content.launches[3].runs[0].concurrency: concurrency 8 is not a level of the workload ([1])",
    ),
    "created at": (
        'c["experiment"]["created_at"] = 1e300',
        "content.experiment.created_at: expected a time (Unix seconds from 0 to 253402300799), got 1e+300",
    ),
    "run finished at": (
        'launches[0]["runs"][0]["finished_at"] = -1',
        "content.launches[0].runs[0].finished_at: expected a time",
    ),
    "night at": (
        'c["config"]["nightly"] = {"night_id": "n1", "suite": "s", "item": "i", "night_at": 1e300}',
        "content.config.nightly.night_at: expected a time",
    ),
    "hostname": (
        'launches[0]["fingerprint"]["host"]["hostname"] = "box\\nFORGED LINE"',
        'content.launches[0].fingerprint.host.hostname: "box\\nFORGED LINE" is not a recorded fact (printable',
    ),
    "engine version": (
        'launches[1]["fingerprint"]["software"]["engine_version"] = "9" * 300',
        "content.launches[1].fingerprint.software.engine_version: ",
    ),
    "orch version": (
        'b["exported"]["orch_version"] = "0.1\\x1b]0;title\\x07"',
        'exported.orch_version: "0.1\\u001b]0;title\\u0007" is not a version',
    ),
    "host facts": (
        'c["config"]["host_facts"]["kernel"] = "6.1\\r\\x1b[2K"',
        'content.config.host_facts.kernel: "6.1\\r\\u001b[2K" is not a recorded fact',
    ),
    "sqlite integer": (
        'launches[0]["runs"][0]["tok_s"] = 10**19',
        "content.launches[0].runs[0].tok_s: expected a number of at most",
    ),
    "nan deep": (
        'launches[0]["runs"][0]["metrics"]["window_s"] = float("nan")',
        "content.launches[0].runs[0].metrics.window_s: expected a finite number, got NaN",
    ),
    "schedule": (
        'c["design"]["schedule"][1] = [0, 0]',
        "content.design.schedule[1]: [0, 0] does not launch each of the 2 arms once (0..1)",
    ),
    "order": ('c["design"]["order"] = "x"', 'content.design.order: expected one of random, fixed, abba, got "x"'),
    "min effect": ('c["config"]["min_effect"] = 5', "content.config.min_effect: expected a fraction above 0"),
    "dataset name": (
        'c["config"]["dataset"] = {"name": "x\\ny", "sha256": None}',
        'content.config.dataset.name: "x\\ny" is not text (printable text on one line',
    ),
    "prompt source": (
        'c["prompts"]["source"] = "builtin\\nFORGED"',
        'content.prompts.source: "builtin\\nFORGED" is not a prompt set',
    ),
    "namespace": ('c["config"]["namespace"] = "../x"', 'content.config.namespace: "../x" is not a namespace'),
    "reproduces": ('c["config"]["reproduces"] = "x\\ny"', 'content.config.reproduces: "x\\ny" is not an experiment id'),
    "trust basis": (
        'c["config"]["bundle_trust"] = {"basis": "forged"}',
        "content.config.bundle_trust.basis: expected one of own-profiles, signature, trust-bundle, answered-yes, got",
    ),
    "extends chain": (
        'c["profiles"][0]["extends_chain"] = ["baseline", "x\\ny"]',
        'content.profiles[0].extends_chain[1]: "x\\ny" is not a profile name',
    ),
    "profile problems": (
        'c["profiles"][0].update(engine="nope\\nFORGED", tp_size=0)',
        "content.profiles[0]: engine: expected one of sglang, vllm, llamacpp, got 'nope\\nFORGED'; ",
    ),
}


def _bad_fields(text: str) -> dict[str, tuple[str, str]]:
    out = {}
    for name, (change, expected) in FIELDS.items():
        b = json.loads(text)
        c = b["content"]
        launches = c["launches"]  # noqa: F841 (used by the change)
        exec(change)
        out[name] = (json.dumps(_resealed(b)), expected)
    return out


@pytest.mark.parametrize(
    "case",
    [
        "not json",
        "truncated",
        "empty",
        "wrong format",
        "json export",
        "newer",
        "tampered",
        "missing field",
        "ill-typed",
        "bad slo",
        "bad metric",
        "arm name",
        "profile name",
        "profile field",
        "experiment id",
        "launch id",
        "launch profile",
        "host",
        "requests digest",
        "port",
        "signature in v1",
        "signature malformed",
        *FIELDS,
    ],
)
def test_bad_bundles_exit_2_with_one_clear_line(
    sent: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    text = sent["path"].read_text()
    content, expected = _bad_bundles(json.loads(text), text)[case]
    bad = tmp_path / "bad.orch.json"
    bad.write_text(content)
    db = tmp_path / "r.db"
    for command in (["import", str(bad), "--db", str(db)], ["show", str(bad)], ["export", str(bad)]):
        assert main(command) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"Error: {bad}: ") and expected in err, err
        assert err.count("\n") == 1 and "Traceback" not in err
    assert not db.exists()  # refused before anything was written


def test_a_different_experiment_under_the_same_id_is_refused(sent: dict[str, Any], tmp_path: Path) -> None:
    other = json.loads(sent["path"].read_text())
    other["content"]["launches"][0]["runs"][0]["tok_s"] += 1.0
    forged = tmp_path / "other.orch.json"
    bundle_mod.write_bundle(_resealed(other), forged)
    result = _orch("import", str(forged), cwd=tmp_path, xdg=sent["xdg"])
    assert result.returncode == 1
    assert "already holds a different experiment" in result.stderr and "recorded here" in result.stderr
    assert str(forged) in result.stderr


def test_a_prompt_file_travels_with_the_bundle(tmp_path: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "one"}\n{"messages": [{"role": "user", "content": "two"}], "category": "chat"}\n')
    bench = BenchConfig(runs=3, warmup=1, prompts=str(prompts))
    config = {"bench": bench.to_dict(), "requests_sha256": bundle_mod.requests_sha256(bench)}
    shipped = bundle_mod.prompt_set(config)
    assert shipped["source"] == "file" and len(shipped["items"]) == 2
    copy = tmp_path / "received.jsonl"
    text = bundle_mod.prompt_file_text({"content": {"prompts": shipped}})
    assert text is not None
    copy.write_text(text)
    # The receiver's copy sends the very same requests.
    assert bundle_mod.requests_sha256(BenchConfig(runs=3, warmup=1, prompts=str(copy))) == config["requests_sha256"]
    prompts.write_text('{"prompt": "edited since"}\n')
    changed = bundle_mod.prompt_set(config)
    assert changed["items"] is None and "changed" in changed["note"] and changed["path"] == str(prompts)
    assert bundle_mod.prompt_set({"bench": BenchConfig().to_dict(), "requests_sha256": "x"})["generated"] is True


def test_export_refuses_a_store_record_no_bundle_may_hold(
    sent: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An arm name with a newline, written into the store by hand (SQLite): `orch export --format bundle` refuses up
    front, exit 2, naming the arm and why, and writes nothing: every bundle orch writes reads back."""
    db = tmp_path / "copy.db"
    shutil.copy(sent["xdg"] / "xdg_data_home" / "orch" / "orch.db", db)
    exp_id = sent["path"].name.removesuffix(".orch.json")
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE experiments SET arms_json = ? WHERE id = ?", (json.dumps(["base\nline", "ngram"]), exp_id))
        conn.execute("UPDATE launches SET profile = ? WHERE profile = 'baseline'", ("base\nline",))
    conn.close()
    out = tmp_path / "out.orch.json"
    assert main(["export", exp_id, "--format", "bundle", "--db", str(db), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"Error: experiment {exp_id} in {db}: content.experiment.arms[0]: ") and err.count("\n") == 1
    assert '"base\\nline" is not a profile name' in err and "not exported" in err, err
    assert not out.exists() and not list(tmp_path.glob("*.orch.json"))


def test_a_bundle_file_name_is_quoted_on_one_line(
    sent: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A received file's own name may carry a newline (it came with the file): the refusal shows it escaped."""
    bad = tmp_path / "x\nsignature: good signature by alice@example.com.orch.json"
    bad.write_text("{}")
    assert main(["show", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "x\\nsignature: good signature" in err, err
