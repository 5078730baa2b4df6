"""An SSH signature (SSHSIG, as `ssh-keygen -Y sign` writes it): the key and namespace it names, read without running
anything; whether it verifies is ssh-keygen's to say (results/signing)."""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import struct
from dataclasses import dataclass

BEGIN = "-----BEGIN SSH SIGNATURE-----"
END = "-----END SSH SIGNATURE-----"
# An ed25519 signature is ~300 bytes armored, an RSA-8192 one ~2.5 KiB: anything far larger is not one.
MAX_ARMORED = 16 * 1024
_MAGIC = b"SSHSIG"
_BASE64_RE = re.compile(r"^[A-Za-z0-9+/=]*\Z")
# Key types and namespaces are plain ASCII words (ssh-ed25519, sk-ecdsa-sha2-nistp256@openssh.com; orch-bundle, git).
_WORD_RE = re.compile(r"^[A-Za-z0-9@._+-]{1,100}\Z")
_HASHES = ("sha256", "sha512")


class SignatureFormatError(ValueError):
    """Not an armored SSH signature (what is wrong, in words)."""


@dataclass(frozen=True, kw_only=True)
class SignatureKey:
    """The public key an SSH signature was made with, and the namespace it was made for."""

    key_type: str  # ssh-ed25519, ssh-rsa, ecdsa-sha2-nistp256, ...
    fingerprint: str  # SHA256:<base64>, as ssh-keygen -l prints it
    namespace: str

    def describe(self) -> str:
        return f"{self.key_type} key {self.fingerprint}"


def _string(blob: bytes, at: int) -> tuple[bytes, int]:
    if at + 4 > len(blob):
        raise SignatureFormatError("the signature blob ends early")
    (size,) = struct.unpack(">I", blob[at : at + 4])
    end = at + 4 + size
    if end > len(blob):
        raise SignatureFormatError("the signature blob ends early")
    return blob[at + 4 : end], end


def _word(raw: bytes, what: str) -> str:
    text = raw.decode("ascii", errors="replace")
    if not _WORD_RE.match(text):
        raise SignatureFormatError(f"its {what} is not a plain word")
    return text


def read_signature(armored: object) -> SignatureKey:
    """The key and namespace of an armored SSH signature; SignatureFormatError when it is not one."""
    if not isinstance(armored, str):
        raise SignatureFormatError("expected the armored text ssh-keygen -Y sign writes")
    if len(armored) > MAX_ARMORED:
        raise SignatureFormatError(f"longer than {MAX_ARMORED} characters; not an SSH signature")
    lines = armored.strip().splitlines()
    if len(lines) < 3 or lines[0].strip() != BEGIN or lines[-1].strip() != END:
        raise SignatureFormatError(f"expected the armored text ssh-keygen -Y sign writes ({BEGIN} ... {END})")
    body = "".join(line.strip() for line in lines[1:-1])
    if not _BASE64_RE.match(body):
        raise SignatureFormatError("its body is not base64")
    try:
        blob = base64.b64decode(body, validate=True)
    except (binascii.Error, ValueError):
        raise SignatureFormatError("its body is not base64") from None
    if not blob.startswith(_MAGIC):
        raise SignatureFormatError("not an SSHSIG signature (its magic is missing)")
    at = len(_MAGIC)
    if at + 4 > len(blob) or struct.unpack(">I", blob[at : at + 4])[0] != 1:
        raise SignatureFormatError("an SSHSIG version other than 1")
    at += 4
    public_key, at = _string(blob, at)
    namespace, at = _string(blob, at)
    _reserved, at = _string(blob, at)
    hash_name, at = _string(blob, at)
    signature, at = _string(blob, at)
    if at != len(blob):
        raise SignatureFormatError("bytes after the signature")
    key_type, _ = _string(public_key, 0)
    if _word(hash_name, "hash algorithm") not in _HASHES or not signature:
        raise SignatureFormatError("an unknown hash algorithm, or no signature")
    digest = base64.b64encode(hashlib.sha256(public_key).digest()).decode().rstrip("=")
    return SignatureKey(
        key_type=_word(key_type, "key type"), fingerprint=f"SHA256:{digest}", namespace=_word(namespace, "namespace")
    )
