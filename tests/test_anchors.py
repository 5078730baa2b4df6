"""A validating pattern ends at the end of the value (`\\Z`), never at `$`: with `re.match`, `$` also matches before a
trailing newline, so "PYTHONPATH\\n" passed as a variable name and a bundle's review printed it raw, splitting its
line (issue 34, item 1). Each validator refuses a valid value plus a newline, and no pattern in orch's source ends in
`$` but the few that classify (where matching more is the safe side)."""

from __future__ import annotations

import ast
import base64
import hashlib
import re
import struct
from pathlib import Path

import pytest

from orchestrator.config import profile as profiles_mod
from orchestrator.errors import HostError, InputError, InventoryError, ProfileError
from orchestrator.experiment import trust
from orchestrator.hosts import base as hosts_base
from orchestrator.hosts import inventory, slurm_cli
from orchestrator.launch import attach
from orchestrator.nightly import suite
from orchestrator.results import bundlefields, sshsig
from tests.conftest import REPO

# Patterns that classify rather than validate, and why a trailing newline matching there is the safe side: each by
# its file and how its pattern starts (not its line, which any edit above it moves).
CLASSIFIERS = {
    ("orchestrator/common/redaction.py", "TOKEN(?!IZ)|KEY"): "a secret's name: a name with a newline is still masked",
    ("orchestrator/common/redaction.py", "f'^--(?:(?:[\\\\w-]"): "a secret flag: its value is still masked",
    ("orchestrator/common/redaction.py", "^[A-Za-z_][A-Za-z0-9_]*$"): "NAME=VALUE with a secret name: still masked",
    ("orchestrator/experiment/trust.py", "^--?[\\w-]*(plugin"): "a flag that names code to load: still flagged",
}
REGEX_CALLS = ("compile", "match", "fullmatch", "search", "sub", "subn", "split", "findall", "finditer")

VALIDATORS = [
    (profiles_mod.NAME_RE, "baseline"),
    (profiles_mod.ENV_NAME_RE, "PYTHONPATH"),
    (profiles_mod.ATTACH_RE, "http://127.0.0.1:8000"),
    (suite.NAME_RE, "nightly-item"),
    (hosts_base.NAMESPACE_RE, "default"),
    (inventory.TARGET_RE, "me@gpu-box:2222"),
    (bundlefields.ID_RE, "20261130-192300-ee4a05"),
    (bundlefields.LAUNCH_ID_RE, "default:20261130T192300-ee4a05aa"),
    (bundlefields.SHA256_RE, "0" * 64),
    (bundlefields.NAMESPACE_RE, "default"),
]


@pytest.mark.parametrize(("pattern", "valid"), VALIDATORS, ids=lambda v: getattr(v, "pattern", v))
def test_a_validator_refuses_a_trailing_newline(pattern: re.Pattern[str], valid: str) -> None:
    assert pattern.match(valid)
    assert not pattern.match(valid + "\n")


def _source_patterns() -> list[tuple[str, int, str]]:
    """(file, line, pattern) of every literal pattern passed to a re function in orch's source."""
    out = []
    for path in sorted((REPO / "orchestrator").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and node.args):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            arg = node.args[0]
            if name in REGEX_CALLS and isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                out.append((str(path.relative_to(REPO)), node.lineno, arg.value))
            elif name in REGEX_CALLS and isinstance(arg, ast.JoinedStr):
                out.append((str(path.relative_to(REPO)), node.lineno, ast.unparse(arg)))
    return out


def test_no_pattern_in_the_source_ends_in_a_dollar_but_the_classifiers() -> None:
    found = _source_patterns()
    assert len(found) > 50  # the scan sees the source
    ending = [(f, line, p) for f, line, p in found if re.search(r"(?<!\\)\$['\"]?$", p)]
    classified = {(f, start) for f, line, p in ending for f2, start in CLASSIFIERS if f == f2 and p.startswith(start)}
    assert classified == set(CLASSIFIERS), set(CLASSIFIERS) - classified  # each classifier is still there
    unclassified = [
        (f, line, p) for f, line, p in ending if not any(f == f2 and p.startswith(s) for f2, s in CLASSIFIERS)
    ]
    assert not unclassified, unclassified


def test_the_validators_behind_the_patterns_refuse_a_trailing_newline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    good = {"name": "p", "engine": "sglang", "model_path": "/m", "tp_size": 1, "port": 8000}
    with pytest.raises(ProfileError, match=r"env\.'PYTHONPATH\\n': invalid environment variable name"):
        profiles_mod.from_resolved({**good, "env": {"PYTHONPATH\n": "/tmp/x"}}, "b.json: profiles[0]")
    with pytest.raises(ProfileError, match="name: expected a profile name"):
        profiles_mod.from_resolved({**good, "name": "p\n"}, "b.json: profiles[0]")
    with pytest.raises(ProfileError, match="attach: expected http://HOST:PORT"):
        profiles_mod.from_resolved({**good, "attach": "http://127.0.0.1:8000\n"}, "b.json: profiles[0]")
    monkeypatch.setenv("ORCH_NAMESPACE", "default\n")
    with pytest.raises(HostError, match="ORCH_NAMESPACE='default\\\\n' is invalid"):
        hosts_base.default_namespace()
    with pytest.raises(InputError, match="namespace 'default\\\\n' is invalid"):
        slurm_cli.job_name("default\n", "h:1:2")
    with pytest.raises(InputError, match="partition: 'gpu\\\\n' is invalid"):
        slurm_cli.AllocationRequest(partition="gpu\n")
    with pytest.raises(InputError, match="is not a partition name"):
        inventory.parse_target("slurm:gpu\n", {})
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text('hosts:\n  "gpu-box\\n": {address: 10.0.0.1}\n')
    with pytest.raises(InventoryError, match="invalid host name"):
        inventory.load_inventory(str(hosts))
    with pytest.raises(ValueError, match="not a plain word"):
        sshsig.read_signature(_armored(key_type=b"ssh-ed25519\n"))
    assert sshsig.read_signature(_armored(key_type=b"ssh-ed25519")).key_type == "ssh-ed25519"


def _armored(*, key_type: bytes) -> str:
    def string(b: bytes) -> bytes:
        return struct.pack(">I", len(b)) + b

    key = string(key_type) + string(hashlib.sha256(b"k").digest())
    blob = b"SSHSIG" + struct.pack(">I", 1) + b"".join(map(string, (key, b"orch-bundle", b"", b"sha512", b"sig")))
    return f"{sshsig.BEGIN}\n{base64.b64encode(blob).decode()}\n{sshsig.END}\n"


def test_the_review_quotes_an_argument_with_a_trailing_newline() -> None:
    """trust's plain-argument test ended at `$`: an argument "x\\n" was shown raw and split the review's line."""
    profile = profiles_mod.from_resolved(
        {
            "name": "p",
            "engine": "sglang",
            "model_path": "/m",
            "tp_size": 1,
            "port": 8000,
            "server_args": ["--x", "y\n"],
        },
        "b.json: profiles[0]",
    )
    line = trust.command_line(profile, simulated=True)
    assert "\n" not in line and '"y\\n"' in line


@pytest.mark.parametrize(
    "url", ["http://h:1/?key=SECRET\nx", "http://h:1/#SECRET\nx", "http://user:SEC\nRET@h:1", "http://u:p\nSECRET@h:1"]
)
def test_a_credential_split_by_a_newline_stays_out_of_the_refusal(url: str) -> None:
    """The masks ended at `$` and `.` stops at a newline: the part of a key or password after one was shown."""
    good = {"name": "p", "engine": "sglang", "model_path": "/m", "tp_size": 1, "port": 8000}
    with pytest.raises(ProfileError) as profile_error:
        profiles_mod.from_resolved({**good, "attach": url}, "b.json: profiles[0]")
    with pytest.raises(InputError) as option_error:
        attach.check_url(url)
    for e in (profile_error, option_error):
        assert "SECRET" not in str(e.value) and "RET" not in str(e.value), e.value
