"""Signed result bundles: OpenSSH's `ssh-keygen -Y sign` over a bundle's canonical bytes, and the check against an
allowed-signers file (`-Y check-novalidate`, `-Y find-principals`, `-Y verify`, as git's gpg.format=ssh does)."""

from __future__ import annotations

import base64
import binascii
import os
import re
import shutil
import struct
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator import files
from orchestrator.common.printable import visible
from orchestrator.errors import BundleError, InputError, OrchError
from orchestrator.results.bundleformat import (
    SIGNATURE_NAMESPACE,
    SIGNED_VERSION,
    digest_of,
    signature_key,
    signed_bytes,
)
from orchestrator.results.sshsig import SignatureKey, read_signature

# ssh-keygen answers in milliseconds; an agent that asks its user to confirm a signature may take a while.
TIMEOUT_S = 120.0
# An allowed-signers file is a line per signer (~100 bytes each): a file far larger is not one.
MAX_ALLOWED_SIGNERS_BYTES = 1 << 20
ALLOWED_SIGNERS_FORM = (
    "one `PRINCIPAL [OPTIONS] KEYTYPE KEY` line per signer, as ssh-keygen -Y verify reads; see docs/reproduce.md#trust"
)
_KEY_TYPE_RE = re.compile(r"^[A-Za-z0-9@._+-]{1,100}\Z")  # ssh-ed25519, sk-ssh-ed25519@openssh.com, ...


@dataclass(frozen=True, kw_only=True)
class SignatureCheck:
    """What an allowed-signers file says of a bundle's signature: by whom, when it verifies and its key is listed."""

    key: SignatureKey | None  # None: the bundle is not signed
    signer: str | None  # the allowed signer (principal) whose key made a good signature; None: no such signer
    allowed_signers: str
    note: str  # in words, for the question, the refusal or the report

    def to_dict(self) -> dict[str, Any]:
        return {
            "signed": self.key is not None,
            "key": None if self.key is None else self.key.describe(),
            "signer": self.signer,
            "allowed_signers": self.allowed_signers,
        }


@dataclass(frozen=True, kw_only=True)
class AllowedSigners:
    """An allowed-signers file as orch reads it before ssh-keygen does: how many signer lines it has, and the first
    line that is none (ssh-keygen skips such a line)."""

    path: str
    signers: int
    first_bad: tuple[int, str] | None  # (line number, what is wrong with it)


def read_allowed_signers(path: str) -> AllowedSigners:
    """The file `--allowed-signers` names, refused (InputError) when it is not a regular file, not text, or holds no
    signer line at all (naming its first bad line): otherwise every signature would merely be "not allowed"."""
    shown = visible(path)
    try:
        with files.open_regular(path) as f:
            data = f.read(MAX_ALLOWED_SIGNERS_BYTES + 1)
    except FileNotFoundError:
        raise InputError(f"--allowed-signers {shown}: no such file ({ALLOWED_SIGNERS_FORM})") from None
    except files.NotRegularFile as e:
        raise InputError(
            f"--allowed-signers {shown}: {e}, not an allowed-signers file ({ALLOWED_SIGNERS_FORM})"
        ) from None
    except OSError as e:
        raise InputError(f"--allowed-signers {shown}: cannot read it: {e.strerror or e}") from None
    if len(data) > MAX_ALLOWED_SIGNERS_BYTES:
        raise InputError(
            f"--allowed-signers {shown}: larger than {MAX_ALLOWED_SIGNERS_BYTES // 2**20} MiB, not an allowed-signers "
            f"file ({ALLOWED_SIGNERS_FORM})"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(
            f"--allowed-signers {shown}: not text (byte {e.start} is not UTF-8); {ALLOWED_SIGNERS_FORM}"
        ) from None
    signers, first_bad = 0, None
    for number, line in enumerate(text.splitlines(), 1):
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        why = _signer_line_problem(words)
        if why is None:
            signers += 1
        elif first_bad is None:
            first_bad = (number, why)
    if not signers:
        found = f"line {first_bad[0]}: {first_bad[1]}" if first_bad else "it holds no line but comments"
        raise InputError(f"--allowed-signers {shown}: no allowed signer in it ({found}); {ALLOWED_SIGNERS_FORM}")
    return AllowedSigners(path=path, signers=signers, first_bad=first_bad)


def _signer_line_problem(words: list[str]) -> str | None:
    """What is wrong with an allowed-signers line (split on blanks), or None: its principals, any options, then a
    public key as a .pub file has it (the key type, then base64 of a key blob that names that type)."""
    if len(words) < 3:
        return "expected PRINCIPALS [OPTIONS] KEYTYPE KEY"
    if any(_is_key(words[i], words[i + 1]) for i in range(1, len(words) - 1)):
        return None
    return "no KEYTYPE KEY after the principals (a public key as a .pub file has it)"


def _is_key(key_type: str, body: str) -> bool:
    if not _KEY_TYPE_RE.match(key_type):
        return False
    try:
        blob = base64.b64decode(body, validate=True)
    except (binascii.Error, ValueError):
        return False
    name = key_type.encode()
    return blob[:4] == struct.pack(">I", len(name)) and blob[4 : 4 + len(name)] == name


def _ssh_keygen() -> str:
    found = shutil.which("ssh-keygen")
    if found is None:
        raise OrchError(
            "ssh-keygen is not on PATH: signing and checking bundles uses OpenSSH's ssh-keygen -Y, as git's SSH "
            "signing does (package openssh-client)"
        )
    return found


def _run(args: list[str], stdin: Path | None = None) -> subprocess.CompletedProcess[str]:
    """ssh-keygen without a terminal: in its own session (no controlling tty to prompt on), stdin a file or
    /dev/null, no askpass program; so a key that needs a passphrase fails at once instead of waiting for one."""
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "SSH_ASKPASS", "WAYLAND_DISPLAY")}
    env["SSH_ASKPASS_REQUIRE"] = "never"
    with open(stdin, "rb") if stdin is not None else open(os.devnull, "rb") as source:
        try:
            return subprocess.run(
                [_ssh_keygen(), *args],
                stdin=source,
                capture_output=True,
                text=True,
                env=env,
                start_new_session=True,
                timeout=TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise OrchError(f"ssh-keygen {args[0]} {args[1]} did not answer within {TIMEOUT_S:g} s") from None


def _said(proc: subprocess.CompletedProcess[str]) -> str:
    """ssh-keygen's own reason (its last line; the passphrase prompt it could not show left out)."""
    lines = [line.replace("Enter passphrase:", "").strip() for line in proc.stderr.splitlines()]
    lines = [line for line in lines if line]
    return visible(lines[-1]) if lines else f"exit status {proc.returncode}"


@contextmanager
def _scratch() -> Iterator[Path]:
    """A private directory for the signed bytes and the signature (ssh-keygen reads and writes files)."""
    path = Path(tempfile.mkdtemp(prefix="orch-sign-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def sign_bundle(bundle: Mapping[str, Any], key: str) -> dict[str, Any]:
    """The bundle signed with the SSH key `key` (a private key file, or a public one whose private half ssh-agent
    holds): version 2, its signature over signed_bytes, its digest recomputed. A key that needs a passphrase ssh-agent
    does not hold is refused (InputError), never asked for."""
    if not Path(key).is_file():
        raise InputError(f"--sign {key}: no such key file (an SSH private key, or the .pub of a key ssh-agent holds)")
    signed = {k: v for k, v in bundle.items() if k not in ("digest", "signature")}
    signed["version"] = SIGNED_VERSION
    with _scratch() as tmp:
        message = tmp / "bundle"
        message.write_bytes(signed_bytes(signed))
        proc = _run(["-Y", "sign", "-n", SIGNATURE_NAMESPACE, "-f", str(Path(key).resolve()), str(message)])
        sig = tmp / "bundle.sig"
        if proc.returncode != 0 or not sig.is_file():
            raise InputError(
                f"--sign {key}: ssh-keygen could not sign with it ({_said(proc)}); a key with a passphrase must be "
                "in ssh-agent first (ssh-add KEY): orch never asks for a passphrase"
            )
        armored = sig.read_text()
    read_signature(armored)  # ssh-keygen wrote it: a failure here is a bug, not the user's
    signed["signature"] = armored
    signed["digest"] = digest_of(signed)
    return signed


def check_signature(bundle: Mapping[str, Any], allowed_signers: str, where: str) -> SignatureCheck:
    """Whether a (read and checked) bundle is signed by a key `allowed_signers` lists for orch bundles. A signature
    that does not verify against its own key (the bundle changed after signing) is a BundleError; an unsigned bundle,
    or one signed by a key the file does not allow, is a SignatureCheck without a signer."""
    listed = read_allowed_signers(allowed_signers)
    allowed = str(Path(allowed_signers).resolve())
    key = signature_key(bundle)
    if key is None:
        return SignatureCheck(key=None, signer=None, allowed_signers=allowed, note="the bundle is not signed")
    with _scratch() as tmp:
        message, sig = tmp / "bundle", tmp / "bundle.sig"
        message.write_bytes(signed_bytes(bundle))
        sig.write_text(str(bundle["signature"]))
        ns = ["-n", SIGNATURE_NAMESPACE, "-s", str(sig)]
        if _run(["-Y", "check-novalidate", *ns], stdin=message).returncode != 0:
            raise BundleError(
                f"{where}: signature: does not verify with the key it names ({key.describe()}): the bundle was "
                "changed after it was signed, or its signature is damaged; ask the sender for the file again"
            )
        # Who the key is, as git asks it (no namespace: `-Y verify` below holds the principal to orch-bundle's).
        found = _run(["-Y", "find-principals", "-s", str(sig), "-f", allowed])
        principals = [p.strip() for p in found.stdout.splitlines() if p.strip()] if found.returncode == 0 else []
        for principal in principals:
            if _run(["-Y", "verify", *ns, "-f", allowed, "-I", principal], stdin=message).returncode == 0:
                return SignatureCheck(
                    key=key,
                    signer=principal,
                    allowed_signers=allowed,
                    note=f"signed by {visible(principal)} ({key.describe()})",
                )
    named = f" (listed for {visible(', '.join(principals))}, but not valid for orch bundles now)" if principals else ""
    skipped = (
        f"; its line {listed.first_bad[0]} is no signer line ({listed.first_bad[1]}) and was skipped"
        if listed.first_bad
        else ""
    )
    return SignatureCheck(
        key=key,
        signer=None,
        allowed_signers=allowed,
        note=f"signed with {key.describe()}, which {visible(allowed_signers)} does not allow{named}{skipped}",
    )
