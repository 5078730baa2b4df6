"""A bundle never runs its author's code unasked: `orch reproduce` shows what it would run that this machine's own
profiles would not, asks on a terminal, refuses elsewhere unless --trust-bundle or a signature by an allowed signer
(real ssh-keygen -Y) says to run it; and nothing starts before that decision."""

from __future__ import annotations

import dataclasses
import json
import os
import pty
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.cli import main
from orchestrator.config import profile as profiles_mod
from orchestrator.config.options import OptionError, RunOptions
from orchestrator.errors import BundleDeclined, BundleError, InputError, UntrustedBundle
from orchestrator.experiment import reproduce as reproduce_mod
from orchestrator.experiment import trust
from orchestrator.results import bundle as bundle_mod
from tests.conftest import FAST_SIM, free_port
from tests.faults.support import FAST, assert_nothing_left, assert_plain, orch_env, run

PROFILE = {"engine": "sglang", "model_path": "/models/m", "tp_size": 1, "ready_timeout_s": 30, "sim": FAST_SIM}
REPRO = ("--gpu-wait", "0", "--grace", "2")
needs_ssh_keygen = pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="needs OpenSSH's ssh-keygen")


@pytest.fixture(scope="module")
def sent(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A simulator experiment of profile p, exported as a bundle, and p itself (the receiver's copy of it)."""
    root = tmp_path_factory.mktemp("sender")
    (root / "profiles").mkdir()
    profile = {**PROFILE, "port": free_port()}
    (root / "profiles" / "p.yaml").write_text(yaml.safe_dump(profile))
    env = orch_env(root / "home")
    ran = run("bench", "p", "--sim", "--runs", "1", "--max-tokens", "16", *FAST, cwd=root, env=env)
    assert ran.rc == 0, ran.text
    path = root / "sent.orch.json"
    exported = run("export", "last", "--format", "bundle", "-o", str(path), cwd=root, env=env)
    assert exported.rc == 0, exported.text
    return {"path": path, "bundle": json.loads(path.read_text()), "profile": profile}


def receiver(sent: dict[str, Any], tmp_path: Path) -> Path:
    """A receiver's working directory with this machine's own profile p: the sender's, unchanged."""
    home = tmp_path / "receiver"
    (home / "profiles").mkdir(parents=True)
    (home / "profiles" / "p.yaml").write_text(yaml.safe_dump(sent["profile"]))
    return home


def crafted(sent: dict[str, Any], where: Path, env: dict[str, str], name: str = "crafted.orch.json") -> Path:
    """The sent bundle with its profile's env replaced and its digest recomputed, as anyone can."""
    bundle = json.loads(json.dumps(sent["bundle"]))
    bundle["content"]["profiles"][0]["env"] = env
    bundle["digest"] = bundle_mod.digest_of(bundle)
    path = where / name
    path.write_text(json.dumps(bundle))
    return path


def canary(where: Path) -> tuple[Path, Path]:
    """A directory whose sitecustomize.py (imported by every Python process with it on PYTHONPATH) writes a file."""
    code, out = where / "canary", where / "CANARY-RAN"
    code.mkdir()
    (code / "sitecustomize.py").write_text(f"import pathlib\npathlib.Path({str(out)!r}).write_text('ran')\n")
    return code, out


def test_a_bundle_that_sets_pythonpath_runs_its_code_only_with_trust_bundle(
    sent: dict[str, Any], tmp_path: Path
) -> None:
    """No terminal and no --trust-bundle: refused (exit 2) naming both ways to run it, PYTHONPATH flagged, and nothing
    started (no canary, no store). With --trust-bundle the canary runs in the simulator's server process."""
    home = receiver(sent, tmp_path)
    code, ran = canary(tmp_path)
    bundle = crafted(sent, tmp_path, {"PYTHONPATH": str(code)})
    db = tmp_path / "r.db"
    refused = run("reproduce", str(bundle), "--db", str(db), *REPRO, cwd=home)
    assert refused.rc == 2, refused.text
    assert "--trust-bundle" in refused.err and "--allowed-signers" in refused.err, refused.err
    assert f'env.PYTHONPATH: "{code}" (here: not set)' in refused.err, refused.err
    assert "! p: env PYTHONPATH: where Python finds its modules" in refused.err, refused.err
    assert "reproducing" not in refused.text and not ran.exists() and not db.exists()
    assert_plain(refused.text)

    trusted = run("reproduce", str(bundle), "--trust-bundle", "--json", "--db", str(db), *REPRO, cwd=home)
    assert trusted.rc in (0, 3, 4), trusted.text
    assert ran.read_text() == "ran"
    doc = json.loads(trusted.out)
    assert doc["bundle_trust"]["basis"] == "trust-bundle" and doc["bundle_trust"]["differing_arms"] == ["p"]
    assert_nothing_left()


def test_ld_preload_is_flagged_and_json_stays_one_document(
    sent: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An LD_PRELOAD (with an escape sequence that would rewrite the terminal's line) is named, escaped; under
    --json the refusal is still one parseable document, exit 2."""
    monkeypatch.chdir(receiver(sent, tmp_path))
    bundle = crafted(sent, tmp_path, {"LD_PRELOAD": "/tmp/evil.so\x1b[2K\r"})
    with pytest.raises(UntrustedBundle) as refused:
        reproduce_mod.plan_bundle(str(bundle), RunOptions(command="reproduce", blocks=None))
    message = str(refused.value)
    assert 'env.LD_PRELOAD: "/tmp/evil.so\\u001b[2K\\r" (here: not set)' in message, message
    assert "! p: env LD_PRELOAD: the dynamic loader" in message and "\x1b" not in message and "\r" not in message
    db = tmp_path / "r.db"
    assert main(["reproduce", str(bundle), "--json", "--db", str(db)]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert doc["status"] == "error" and doc["exit_code"] == 2 and "LD_PRELOAD" in doc["error"], doc
    assert not db.exists()


def test_a_bundle_of_this_machines_own_profiles_needs_no_question(
    sent: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same profile here (another port is no difference: a reproduction serves on the recorded port or --port)
    runs unasked; the same name with another value anywhere else, or no such profile, does not."""
    home = receiver(sent, tmp_path)
    monkeypatch.chdir(home)
    options = RunOptions(command="reproduce", blocks=None)
    (home / "profiles" / "p.yaml").write_text(yaml.safe_dump({**sent["profile"], "port": free_port()}))
    plan = reproduce_mod.plan_bundle(str(sent["path"]), options)
    assert plan.trust is not None and plan.trust.basis == "own-profiles", plan.trust
    (home / "profiles" / "p.yaml").write_text(yaml.safe_dump({**sent["profile"], "env": {"NCCL_ALGO": "Tree"}}))
    with pytest.raises(UntrustedBundle, match=r'env.NCCL_ALGO: not set \(here: "Tree"\)'):
        reproduce_mod.plan_bundle(str(sent["path"]), options)
    (home / "profiles" / "p.yaml").unlink()
    with pytest.raises(UntrustedBundle, match="arm p: no profile named p on this machine"):
        reproduce_mod.plan_bundle(str(sent["path"]), options)


def test_the_question_decides_before_anything_starts(
    sent: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The core without a terminal: `ask` is shown the review; no is BundleDeclined, yes a plan that says so."""
    monkeypatch.chdir(receiver(sent, tmp_path))
    bundle = crafted(sent, tmp_path, {"PYTHONSTARTUP": "/tmp/x.py"})
    options = RunOptions(command="reproduce", blocks=None)
    shown: list[str] = []

    def no(text: str) -> bool:
        shown.append(text)
        return False

    with pytest.raises(BundleDeclined, match="nothing was started"):
        reproduce_mod.plan_bundle(str(bundle), options, ask=no)
    assert "env.PYTHONSTARTUP" in shown[0] and "signature: not checked" in shown[0], shown
    plan = reproduce_mod.plan_bundle(str(bundle), options, ask=lambda _text: True)
    assert plan.trust is not None and plan.trust.basis == "answered-yes"


def test_a_plan_not_made_by_plan_bundle_never_runs(sent: dict[str, Any], tmp_path: Path) -> None:
    """run_bundle refuses a plan nothing decided on, before it opens the store."""
    bundle = bundle_mod.read_bundle(sent["path"])
    db = tmp_path / "r.db"
    options = RunOptions(command="reproduce", blocks=None, db=str(db))
    plan = reproduce_mod.BundlePlan(
        path=str(sent["path"]),
        bundle=bundle,
        profiles=bundle_mod.profiles_from_bundle(bundle),
        blocks=None,
        options=options,
    )
    with pytest.raises(UntrustedBundle, match="nothing decided that it may run here"):
        reproduce_mod.run_bundle(plan, 0.03)
    assert not db.exists()


def _on_a_terminal(args: list[str], cwd: Path, answer: bytes) -> tuple[int, str]:
    """orch with stdin, stdout and stderr on a pseudo-terminal; `answer` typed once it asks. Returns (rc, output)."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", *args],
        cwd=cwd,
        env=orch_env(),
        stdin=follower,
        stdout=follower,
        stderr=follower,
        start_new_session=True,
    )
    os.close(follower)
    seen, answered = b"", False
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([leader], [], [], 1.0)
            if ready:
                try:
                    chunk = os.read(leader, 4096)
                except OSError:  # EIO: the child closed the terminal
                    chunk = b""
                if not chunk and proc.poll() is not None:
                    break
                seen += chunk
            if not answered and b"[y/N]" in seen:
                os.write(leader, answer)
                answered = True
            if proc.poll() is not None and not ready:
                break
        return proc.wait(timeout=60), seen.decode(errors="replace")
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(leader)


def test_on_a_terminal_it_asks_and_no_runs_nothing(sent: dict[str, Any], tmp_path: Path) -> None:
    home = receiver(sent, tmp_path)
    code, ran = canary(tmp_path)
    bundle = crafted(sent, tmp_path, {"PYTHONPATH": str(code)})
    db = tmp_path / "r.db"
    rc, shown = _on_a_terminal(["reproduce", str(bundle), "--db", str(db), *REPRO], home, b"n\n")
    assert "env.PYTHONPATH" in shown and "Run it? [y/N]" in shown, shown
    assert rc == 1 and "not run: you answered no; nothing was started" in shown, shown
    assert not ran.exists() and not db.exists()


def test_a_claim_takes_no_trust_options() -> None:
    """A profile's claim runs this machine's own profiles: the bundle's options are refused, not silently ignored."""
    options = RunOptions(command="reproduce", blocks=None, trust_bundle=True, allowed_signers="allowed_signers")
    with pytest.raises(OptionError, match="--trust-bundle and --allowed-signers apply to a result bundle"):
        reproduce_mod.plan_reproduction(
            "baseline",
            reproduce_mod.Claim(tok_s=80),
            options.replace(given=frozenset({"trust_bundle", "allowed_signers"})),
        )


def test_code_loading_variables_follow_one_rule() -> None:
    for name in ("PYTHONPATH", "PYTHONSTARTUP", "PYTHONHOME", "PYTHONUSERBASE", "LD_PRELOAD", "LD_LIBRARY_PATH",
                 "LD_AUDIT", "DYLD_INSERT_LIBRARIES", "PATH", "CUDA_HOME", "HF_HOME", "HOME", "BASH_ENV", "ENV",
                 "NODE_OPTIONS", "PERL5LIB", "VLLM_PLUGINS", "NCCL_NET_PLUGIN", "TRITON_CACHE_DIR",
                 "TORCH_EXTENSIONS_DIR", "BASH_FUNC_x%%", "CLASSPATH"):  # fmt: skip
        assert trust.code_env_reason(name) is not None, name
    for name in ("NCCL_ALGO", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "TOKENIZERS_PARALLELISM", "HF_TOKEN",
                 "ORCH_SIM_SLOWDOWN", "SGLANG_TORCH_PROFILER"):  # fmt: skip
        assert trust.code_env_reason(name) is None, name


# ---------------------------------------------------------------- signed bundles (real ssh-keygen -Y)


def _key(where: Path, name: str, passphrase: str = "") -> Path:
    key = where / name
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", passphrase, "-C", name, "-f", str(key)],
        check=True,
        stdin=subprocess.DEVNULL,
        timeout=60,
    )
    return key


def _allowed(where: Path, principal: str, key: Path) -> Path:
    path = where / "allowed_signers"
    path.write_text(f"{principal} {' '.join(key.with_suffix('.pub').read_text().split()[:2])}\n")
    return path


@needs_ssh_keygen
def test_a_bundle_signed_by_an_allowed_signer_runs_unasked_and_says_who_signed_it(
    sent: dict[str, Any], tmp_path: Path
) -> None:
    home = receiver(sent, tmp_path)
    code, ran = canary(tmp_path)
    unsigned = crafted(sent, tmp_path, {"PYTHONPATH": str(code)})
    key = _key(tmp_path, "alice")
    signed = tmp_path / "signed.orch.json"
    exported = run("export", str(unsigned), "--format", "bundle", "--sign", str(key), "-o", str(signed), cwd=home)
    assert exported.rc == 0 and "signed with ssh-ed25519 key SHA256:" in exported.err, exported.text
    assert json.loads(signed.read_text())["version"] == bundle_mod.SIGNED_VERSION
    assert "PRIVATE" not in signed.read_text() and "PRIVATE" not in exported.text
    shown = run("show", str(signed), cwd=home)
    assert shown.rc == 0 and "signed with ssh-ed25519 key SHA256:" in shown.err and "not checked here" in shown.err
    allowed = _allowed(tmp_path, "alice@example.com", key)
    db = tmp_path / "r.db"
    again = run("reproduce", str(signed), "--allowed-signers", str(allowed), "--db", str(db), *REPRO, cwd=home)
    assert again.rc in (0, 3, 4), again.text
    assert "bundle trusted: signed by alice@example.com (ssh-ed25519 key SHA256:" in again.out, again.out
    assert ran.read_text() == "ran"
    assert_nothing_left()


@needs_ssh_keygen
def test_a_tampered_or_foreign_signature_never_runs(
    sent: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Changed after signing (digest recomputed): refused, exit 2, even with --trust-bundle. Signed by a key the
    file does not list, or not signed at all: as if unsigned, refused without a terminal, saying why."""
    from orchestrator.results import signing

    monkeypatch.chdir(receiver(sent, tmp_path))
    unsigned = crafted(sent, tmp_path, {"PYTHONPATH": "/tmp/nowhere"})
    alice, mallory = _key(tmp_path, "alice"), _key(tmp_path, "mallory")
    allowed = _allowed(tmp_path, "alice@example.com", alice)
    by_mallory = signing.sign_bundle(bundle_mod.read_bundle(unsigned), str(mallory))
    tampered = json.loads(json.dumps(signing.sign_bundle(bundle_mod.read_bundle(unsigned), str(alice))))
    tampered["content"]["profiles"][0]["env"] = {"PYTHONPATH": "/tmp/elsewhere"}
    tampered["digest"] = bundle_mod.digest_of(tampered)
    paths = {}
    for name, bundle in (("mallory", by_mallory), ("tampered", tampered)):
        paths[name] = tmp_path / f"{name}.orch.json"
        paths[name].write_text(json.dumps(bundle))
    options = RunOptions(command="reproduce", blocks=None, allowed_signers=str(allowed))
    with pytest.raises(BundleError, match="signature: does not verify with the key it names"):
        reproduce_mod.plan_bundle(str(paths["tampered"]), options.replace(trust_bundle=True))
    with pytest.raises(UntrustedBundle, match=r"signed with ssh-ed25519 key SHA256:\S+, which .* does not allow"):
        reproduce_mod.plan_bundle(str(paths["mallory"]), options)
    with pytest.raises(UntrustedBundle, match="signature: the bundle is not signed"):
        reproduce_mod.plan_bundle(str(unsigned), options)
    # Alice's key listed for git's signatures only: not one for orch bundles.
    git_only = tmp_path / "git_only"
    git_only.write_text(allowed.read_text().replace(" ssh-ed25519", ' namespaces="git" ssh-ed25519', 1))
    by_alice = tmp_path / "alice.orch.json"
    by_alice.write_text(json.dumps(signing.sign_bundle(bundle_mod.read_bundle(unsigned), str(alice))))
    assert reproduce_mod.plan_bundle(str(by_alice), options).trust.basis == "signature"  # type: ignore[union-attr]
    with pytest.raises(UntrustedBundle, match=r"listed for alice@example\.com, but not valid for orch bundles now"):
        reproduce_mod.plan_bundle(str(by_alice), options.replace(allowed_signers=str(git_only)))
    db = tmp_path / "r.db"
    assert main(["reproduce", str(paths["tampered"]), "--allowed-signers", str(allowed), "--db", str(db)]) == 2
    assert not db.exists()


@needs_ssh_keygen
def test_a_key_with_a_passphrase_fails_clearly_and_never_prompts(sent: dict[str, Any], tmp_path: Path) -> None:
    key = _key(tmp_path, "locked", passphrase="secret words")
    out = tmp_path / "signed.orch.json"
    signed = run("export", str(sent["path"]), "--format", "bundle", "--sign", str(key), "-o", str(out), cwd=tmp_path)
    assert signed.rc == 2 and f"--sign {key}: ssh-keygen could not sign with it" in signed.err, signed.text
    assert "ssh-add" in signed.err and not out.exists()
    assert_plain(signed.text)


@needs_ssh_keygen
def test_an_allowed_signers_file_that_lists_no_signer_is_refused_saying_why(
    sent: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Not a regular file, or no signer line in it: refused (exit 2) saying what is wrong with the file, naming the
    first bad line; before, /dev/zero was "no such file" and a garbage file merely "did not allow" the key."""
    from orchestrator.results import signing

    bundle = bundle_mod.read_bundle(sent["path"])
    garbage = tmp_path / "garbage"
    garbage.write_text("# who may sign orch bundles\n\ngarbage\nalice@example.com ssh-ed25519 not-a-key\n")
    comments = tmp_path / "comments"
    comments.write_text("# nobody yet\n")
    cases = {
        "/dev/zero": "--allowed-signers /dev/zero: not a regular file but a device, not an allowed-signers file",
        str(tmp_path): "not a regular file but a directory",
        str(garbage): f"--allowed-signers {garbage}: no allowed signer in it (line 3: expected PRINCIPALS [OPTIONS] "
        "KEYTYPE KEY)",
        str(comments): "no allowed signer in it (it holds no line but comments)",
        str(tmp_path / "missing"): "no such file",
    }
    for path, expected in cases.items():
        with pytest.raises(InputError) as e:
            signing.check_signature(bundle, path, "b.orch.json")
        assert expected in str(e.value) and "PRINCIPAL [OPTIONS] KEYTYPE KEY" in str(e.value), e.value
    db = tmp_path / "r.db"
    for path in ("/dev/zero", str(garbage)):
        assert (
            main(["reproduce", str(sent["path"]), "--allowed-signers", path, "--db", str(db), "--gpu-wait", "0"]) == 2
        )
        err = capsys.readouterr().err
        assert f"Error: --allowed-signers {path}: " in err and "Traceback" not in err, err
    assert not db.exists()
    # One signer line among bad ones reads as ssh-keygen reads it (the bad line skipped), and a key it does not list
    # is "not allowed", naming the skipped line.
    alice, mallory = _key(tmp_path, "alice"), _key(tmp_path, "mallory")
    mixed = tmp_path / "mixed"
    mixed.write_text("garbage\n" + _allowed(tmp_path, "alice@example.com", alice).read_text())
    by_alice = signing.check_signature(signing.sign_bundle(bundle, str(alice)), str(mixed), "b.orch.json")
    assert by_alice.signer == "alice@example.com"
    by_mallory = signing.check_signature(signing.sign_bundle(bundle, str(mallory)), str(mixed), "b.orch.json")
    assert by_mallory.signer is None and "does not allow; its line 1 is no signer line" in by_mallory.note


def test_the_review_quotes_a_variable_name_that_is_none() -> None:
    """A profile's env names are checked on read, but the review never prints one raw: a name that is no valid name
    (a newline in it, past some other check) is shown as JSON, on its line."""
    mine = profiles_mod.from_resolved(
        {"name": "p", "engine": "sglang", "model_path": "/m", "tp_size": 1, "port": 8000}, "mine"
    )
    theirs = dataclasses.replace(mine, env=(("LD_PRELOAD\nsignature: good", "/tmp/x.so"),))
    differs = trust.differences(theirs, mine)
    lines = [*differs, *trust.review("b.orch.json", [theirs], simulated=True).lines()]
    assert all("\n" not in line for line in lines), lines
    assert differs == ['env."LD_PRELOAD\\nsignature: good": "/tmp/x.so" (here: not set)']
    assert any(line.strip() == 'with env: "LD_PRELOAD\\nsignature: good"="/tmp/x.so"' for line in lines), lines
    assert any('! p: env "LD_PRELOAD\\nsignature: good": the dynamic loader' in line for line in lines), lines
