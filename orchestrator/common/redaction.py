"""Secrets: keyed digests of secret values, redacted argv and scrubbed free text (stdlib only; shipped to hosts
with the agent, which digests and masks there so that no secret leaves a host in clear)."""

from __future__ import annotations

import hashlib
import hmac
import os
import re
from collections.abc import Callable, Iterable

# Names whose values must never leave the host in clear text: matched anywhere in the name (HF_TOKEN,
# AWS_SECRET_ACCESS_KEY, GOOGLE_APPLICATION_CREDENTIALS, PGPASSWORD), PASS and PWD only as a word of their own
# (REDIS_PASS, MYSQL_PWD), COOKIE as the last word (COOKIE, SESSION_COOKIE: a session is a login). Not names that
# merely contain one: TOKENIZERS_PARALLELISM, NUM_PASSES, BYPASS, PWD or OLDPWD (the shell's directories),
# COOKIE_JAR (a path). A false match hides a setting from "what differs", a missed one leaks. Secrets in values
# under other names (a GitHub token in MY_VAR, a connection string's key) are found by pattern on the orch side
# (config/secretpatterns.py), which this module must not import (it ships to hosts, stdlib only).
SECRET_NAME_RE = re.compile(
    r"TOKEN(?!IZ)|KEY|SECRET|PASSWORD|PASSWD|PASSPHRASE|CREDENTIAL|AUTH|SSHPASS"
    r"|(?<![A-Z0-9])PASS(?![A-Z0-9])|(?<=[_.-])PWD(?![A-Z0-9])|(?<![A-Z0-9])COOKIES?$",
    re.IGNORECASE,
)
# Flags are matched on their last word only: --api-key and --hf-token are secrets, --num-draft-tokens is not.
_SECRET_WORD = r"(?:key|token|secret|password|passwd|passphrase|pass|credentials?|cookies?)"
SECRET_FLAG_RE = re.compile(rf"^--(?:(?:[\w-]*[-_])?{_SECRET_WORD}|[\w-]*[-_]pwd)$", re.IGNORECASE)
REDACTED = "<redacted>"
# A keyed digest as redact() writes it, alone or inside a value (a URL's userinfo).
DIGEST_RE = re.compile(r"<redacted hmac:[0-9a-f]*>")
# Secrets shorter than this are not replaced by value in free text: every "1" or "ab" in a log would go with them.
MIN_SECRET_LEN = 4
# In free text (log tails, errors): `api_key='x'`, `HF_TOKEN=x`, `"password": "x"`, `--api-key x`, `Bearer x`.
_VALUE = r"(?P<value><redacted[^>]*>|'[^']*'|\"[^\"]*\"|[^\s,;)}\]'\"]+)"
_NAME = rf"(?:(?:[A-Za-z0-9]+[_.-])*{_SECRET_WORD}|(?:[A-Za-z0-9]+[_.-])+pwd)"
_ASSIGN_RE = re.compile(
    rf"(?P<name>(?<![A-Za-z0-9]){_NAME}(?![A-Za-z0-9]))(?P<sep>['\"]?\s*[=:]\s*){_VALUE}",
    re.IGNORECASE,
)
_FLAG_VALUE_RE = re.compile(rf"(?P<name>(?<![\w-])--{_NAME})(?P<sep>\s+)(?!-){_VALUE}", re.IGNORECASE)
# A count such as SGLang's `#new-token: 126` or `#cached-token: 0`: `name: number` is a statistic, not a secret.
_NUMBER_RE = re.compile(r"[+-]?\d+(?:\.\d+)?%?")
# The userinfo of a URL (`postgres://user:pw@db/x`): everything up to the last "@" before the host ends at "/", "?"
# or "#", so an unescaped "@" in a password goes too. In free text a quote ends the URL as well.
_URL_USERINFO_RE = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^\s/?#]+)@")
_TEXT_URL_USERINFO_RE = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^\s/?#'\"]+)@")
# A whole value `user:pw@proxy:3128` (proxies take it without a scheme); the colon tells it from `git@github.com:x`,
# the host from an image digest (`image:tag@sha256:…`).
_BARE_USERINFO_RE = re.compile(r"^(?P<head>)(?P<userinfo>[^\s/?#:@]+:[^\s/?#]*)@(?!sha\d+:)(?=[A-Za-z0-9\[])")
_BEARER_RE = re.compile(r"\b(?P<name>Bearer|Basic)(?P<sep>\s+)(?P<value>[A-Za-z0-9._~+/=-]+)", re.IGNORECASE)
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Digests made without a store's key (commands with no store) use this one: comparable within one process only.
_PROCESS_KEY = os.urandom(32)


def redact(name: str, value: str, key: bytes | None = None) -> str:
    """Hide secret-looking values but keep them comparable (same value and key → same digest): the whole value of a
    secret-named variable, else the userinfo of each URL in it (`postgres://<redacted hmac:…>@db/x`: the host stays,
    it is provenance)."""
    if SECRET_NAME_RE.search(name):
        return digest(value, key)
    return mask_userinfo(value, lambda userinfo: digest(userinfo, key))


def digest(value: str, key: bytes | None = None) -> str:
    """value as a keyed digest (`<redacted hmac:…>`): equal values under one key give equal digests."""
    # Keyed (HMAC), not a bare hash: without the store's key a guessed secret cannot be confirmed from its digest.
    mac = hmac.new(key or _PROCESS_KEY, value.encode(), hashlib.sha256).hexdigest()
    return f"<redacted hmac:{mac[:16]}>"


def mask_userinfo(value: str, hide: Callable[[str], str]) -> str:
    """value with hide(userinfo) in place of the userinfo of each URL in it (`scheme://user:pw@host`), or of the
    whole value when it is `user:pw@host[:port]`; the rest as it was."""

    def one(m: re.Match[str]) -> str:
        userinfo = m.group("userinfo")
        if userinfo == REDACTED or DIGEST_RE.fullmatch(userinfo):
            return m.group(0)  # masked already
        return f"{m.group('head')}{hide(userinfo)}@"

    masked = _URL_USERINFO_RE.sub(one, value)
    return masked if masked != value else _BARE_USERINFO_RE.sub(one, value)


def redact_argv(argv: list[str], key: bytes | None = None) -> list[str]:
    """Hide the value after a secret-looking flag (`--api-key X`, `--api-key=X`) and any URL's userinfo, keeping
    them comparable."""
    return hide_argv(argv, lambda value: digest(value, key))


def hide_argv(argv: list[str], hide: Callable[[str], str]) -> list[str]:
    """argv with `hide` applied to each secret value (after a secret flag, or in `--flag=`/`NAME=` form) and to the
    userinfo of each URL in any other argument."""
    out: list[str] = []
    for i, arg in enumerate(argv):
        flag, eq, value = arg.partition("=")
        named = bool(eq) and (flag.startswith("-") or _ENV_NAME_RE.match(flag) is not None)
        if named and (SECRET_FLAG_RE.match(flag) or (_ENV_NAME_RE.match(flag) and SECRET_NAME_RE.search(flag))):
            out.append(f"{flag}={hide(value)}")  # --api-key=X, or HF_TOKEN=X as given to env(1)
        elif i > 0 and SECRET_FLAG_RE.match(argv[i - 1]) and not arg.startswith("--"):
            # argparse never takes a value starting with "--" in this form: such an arg is the next flag.
            out.append(hide(arg))
        elif named:
            out.append(f"{flag}={mask_userinfo(value, hide)}")  # --proxy=user:pw@host keeps its flag
        else:
            out.append(mask_userinfo(arg, hide))
    return out


def secret_values(argv: list[str], env: dict[str, str]) -> list[str]:
    """The values redact_argv/redact hide: what scrub() must also remove from free text such as log tails. Of a URL's
    userinfo also the password alone, which a server may print by itself."""
    found: list[str] = []

    def collect(value: str) -> str:
        found.append(value)
        user, colon, password = value.partition(":")
        if colon and user and password:
            found.append(password)
        return value

    hide_argv(argv, collect)
    for name, value in env.items():
        if SECRET_NAME_RE.search(name):
            found.append(value)
        else:
            mask_userinfo(value, collect)
    return [v for v in dict.fromkeys(found) if v]


def scrub(text: str, secret_values: Iterable[str] = ()) -> str:
    """Free text (a log tail, an error) without the known secret values, any URL's userinfo, nor anything else that
    looks like a secret."""
    for value in sorted({v for v in secret_values if len(v) >= MIN_SECRET_LEN}, key=len, reverse=True):
        text = text.replace(value, REDACTED)
    text = _TEXT_URL_USERINFO_RE.sub(
        lambda m: m.group(0) if m.group("userinfo") == REDACTED else f"{m.group('head')}{REDACTED}@", text
    )
    for pattern in (_BEARER_RE, _FLAG_VALUE_RE, _ASSIGN_RE):
        text = pattern.sub(_hide_match, text)
    return text


def _hide_match(m: re.Match[str]) -> str:
    value = m.group("value")
    if value.startswith("<redacted") or value.strip("'\"") in ("", "None", "null"):
        return m.group(0)  # nothing secret to hide: keep `api_key=None` readable
    quote = value[0] if value[0] in "'\"" and value[-1] == value[0] and len(value) > 1 else ""
    colon_form = m.re is _ASSIGN_RE and not quote and "=" not in m.group("sep")
    if colon_form and (not re.search(r"[_.-]", m.group("name")) or _NUMBER_RE.fullmatch(value)):
        return m.group(0)  # prose ("first token: 0.5 s") or a count ("#new-token: 126"), not an assignment
    return f"{m.group('name')}{m.group('sep')}{quote}{REDACTED}{quote}"
