"""Secrets: keyed digests of secret values, redacted argv and scrubbed free text (stdlib only; shipped to hosts
with the agent, which digests and masks there so that no secret leaves a host in clear)."""

from __future__ import annotations

import hashlib
import hmac
import os
import re
from collections.abc import Callable, Iterable

# Names whose values must never leave the host in clear text.
SECRET_NAME_RE = re.compile(r"TOKEN|KEY|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH", re.IGNORECASE)
# Flags are matched on their last word only: --api-key and --hf-token are secrets, --num-draft-tokens is not.
_SECRET_WORD = r"(?:key|token|secret|password|passwd|credentials?)"
SECRET_FLAG_RE = re.compile(rf"^--(?:[\w-]*[-_])?{_SECRET_WORD}$", re.IGNORECASE)
REDACTED = "<redacted>"
# Secrets shorter than this are not replaced by value in free text: every "1" or "ab" in a log would go with them.
MIN_SECRET_LEN = 4
# In free text (log tails, errors): `api_key='x'`, `HF_TOKEN=x`, `"password": "x"`, `--api-key x`, `Bearer x`.
_VALUE = r"(?P<value><redacted[^>]*>|'[^']*'|\"[^\"]*\"|[^\s,;)}\]'\"]+)"
_ASSIGN_RE = re.compile(
    rf"(?P<name>(?<![A-Za-z0-9])(?:[A-Za-z0-9]+[_.-])*{_SECRET_WORD}(?![A-Za-z0-9]))(?P<sep>['\"]?\s*[=:]\s*){_VALUE}",
    re.IGNORECASE,
)
_FLAG_VALUE_RE = re.compile(
    rf"(?P<name>(?<![\w-])--(?:[\w]+[-_])*{_SECRET_WORD})(?P<sep>\s+)(?!-){_VALUE}", re.IGNORECASE
)
_BEARER_RE = re.compile(r"\b(?P<name>Bearer|Basic)(?P<sep>\s+)(?P<value>[A-Za-z0-9._~+/=-]+)", re.IGNORECASE)
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Digests made without a store's key (commands with no store) use this one: comparable within one process only.
_PROCESS_KEY = os.urandom(32)


def redact(name: str, value: str, key: bytes | None = None) -> str:
    """Hide secret-looking values but keep them comparable (same value and key → same digest)."""
    return _digest(value, key) if SECRET_NAME_RE.search(name) else value


def _digest(value: str, key: bytes | None = None) -> str:
    # Keyed (HMAC), not a bare hash: without the store's key a guessed secret cannot be confirmed from its digest.
    mac = hmac.new(key or _PROCESS_KEY, value.encode(), hashlib.sha256).hexdigest()
    return f"<redacted hmac:{mac[:16]}>"


def redact_argv(argv: list[str], key: bytes | None = None) -> list[str]:
    """Hide the value after a secret-looking flag (`--api-key X`, `--api-key=X`), keeping it comparable."""
    return hide_argv(argv, lambda value: _digest(value, key))


def hide_argv(argv: list[str], hide: Callable[[str], str]) -> list[str]:
    """argv with `hide` applied to each secret value (after a secret flag, or in `--flag=`/`NAME=` form)."""
    out: list[str] = []
    for i, arg in enumerate(argv):
        flag, eq, value = arg.partition("=")
        if eq and (SECRET_FLAG_RE.match(flag) or (_ENV_NAME_RE.match(flag) and SECRET_NAME_RE.search(flag))):
            out.append(f"{flag}={hide(value)}")  # --api-key=X, or HF_TOKEN=X as given to env(1)
        elif i > 0 and SECRET_FLAG_RE.match(argv[i - 1]) and not arg.startswith("--"):
            # argparse never takes a value starting with "--" in this form: such an arg is the next flag.
            out.append(hide(arg))
        else:
            out.append(arg)
    return out


def secret_values(argv: list[str], env: dict[str, str]) -> list[str]:
    """The values redact_argv/redact hide: what scrub() must also remove from free text such as log tails."""
    found: list[str] = []

    def collect(value: str) -> str:
        found.append(value)
        return value

    hide_argv(argv, collect)
    found += [v for k, v in env.items() if SECRET_NAME_RE.search(k)]
    return [v for v in dict.fromkeys(found) if v]


def scrub(text: str, secret_values: Iterable[str] = ()) -> str:
    """Free text (a log tail, an error) without the known secret values nor anything that looks like one."""
    for value in sorted({v for v in secret_values if len(v) >= MIN_SECRET_LEN}, key=len, reverse=True):
        text = text.replace(value, REDACTED)
    for pattern in (_BEARER_RE, _FLAG_VALUE_RE, _ASSIGN_RE):
        text = pattern.sub(_hide_match, text)
    return text


def _hide_match(m: re.Match[str]) -> str:
    value = m.group("value")
    if value.startswith("<redacted") or value.strip("'\"") in ("", "None", "null"):
        return m.group(0)  # nothing secret to hide: keep `api_key=None` readable
    quote = value[0] if value[0] in "'\"" and value[-1] == value[0] and len(value) > 1 else ""
    if m.re is _ASSIGN_RE and not quote and "=" not in m.group("sep") and not re.search(r"[_.-]", m.group("name")):
        return m.group(0)  # prose such as "first token: 0.5 s" or "secret: ready after 2 s", not an assignment
    return f"{m.group('name')}{m.group('sep')}{quote}{REDACTED}{quote}"
