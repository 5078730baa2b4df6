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
# under other names are found by their form here (a connection string's password, a header line, a JWT: mask_secrets)
# and by pattern on the orch side (a GitHub token in MY_VAR: config/secretpatterns.py), which this module must not
# import (it ships to hosts, stdlib only).
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
# JDBC's Oracle form `jdbc:oracle:thin:user/pw@host:1521/db`: a `user/password` userinfo after a JDBC-like chain of
# two or more `word:` prefixes that starts a token (not `hf:org/model@rev`, `git@github.com:org/repo.git@v1` nor a
# port: `host:8080/a@b`), nor before an image digest (`…@sha256:`). The chain starts a token, not at each of its
# colons: a long `a:a:a:…` line costs one pass, not one per colon.
_COLON_USERINFO = r"(?P<head>(?<![^\s=;,'\"(])(?:[A-Za-z][A-Za-z0-9+.-]*:){2,})(?P<userinfo>[A-Za-z][A-Za-z0-9_$#.-]*/"
_COLON_USERINFO_RE = re.compile(_COLON_USERINFO + r"(?:\"[^\"]*\"|[^\s/?#@\"]+))@(?!sha\d+:)")
_TEXT_COLON_USERINFO_RE = re.compile(_COLON_USERINFO + r"(?:\"[^\"]*\"|[^\s/?#@'\"]+))@(?!sha\d+:)")
_BEARER_RE = re.compile(r"\b(?P<name>Bearer|Basic)(?P<sep>\s+)(?P<value>[A-Za-z0-9._~+/=-]+)", re.IGNORECASE)
# Secret forms inside a value whose name says nothing (_mask_forms): small general grammars rather than one pattern per
# vendor. A key or header name is secret by its last word (`AccountKey`, `SharedAccessKey`, `db_pass`, `X-Api-Key`,
# `X-Amz-Signature`, Azure SAS's `sig`, `Authorization`) or by an ending run together (`sslpassword`, `accesstoken`,
# `dbpwd`); not `monkey`, `max_tokens`, `sslkey` (libpq's key file, a path), `SharedAccessKeyName`.
_SECRET_WORDS = frozenset(
    {"key", "token", "secret", "password", "passwd", "passphrase", "pass", "pwd", "credential", "credentials"}
    | {"cookie", "cookies", "sig", "signature", "authorization"}
)
_SECRET_ENDINGS = ("password", "passwd", "passphrase", "pwd", "secret", "token")
_WORD_RE = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])")  # SSLPassword: SSL, Password
# A key=value pair of a connection string (ODBC, ADO.NET, JDBC, libpq: `Pwd=…;`, `sslpassword=… dbname=x`) or of a
# URL's query (`?sig=…&`): the key starts the value or follows a separator; `==` is no assignment.
_PAIR = r"(?P<key>[A-Za-z_][A-Za-z0-9_.-]*)[ \t]*=[ \t]*(?!=)"
_PAIR_RE = re.compile(r"(?:^|(?<=[;?&\s]))" + _PAIR)
_TEXT_PAIR_RE = re.compile(r"(?:^|(?<=[;?&\s(,{\[\"']))" + _PAIR)  # also in a dump: `ServerArgs(sslpassword=…`
# An unquoted value ends at its format's separator: a query's `&`; a connection string's `;`, or (libpq) the blank
# before the next `key=`. In free text also at a blank, a comma, a closing bracket or a quote.
_QUERY_END_RE = re.compile(r"[&#\s]")
_PAIR_END_RE = re.compile(r";|(?<!\s)\s+(?=[A-Za-z_][A-Za-z0-9_.-]*[ \t]*=)")  # a run of blanks tried once, whole
_TEXT_QUERY_END_RE = re.compile(r"[&#\s'\"]")
_TEXT_PAIR_END_RE = re.compile(r"[\s,;)}\]'\"]")
# An HTTP header line (`Cookie: sid=…`, `Authorization: Basic …`, `X-Api-Key: …`) as a value or a line of one.
_HEADER_LINE_RE = re.compile(r"^[ \t]*(?P<name>[A-Za-z][A-Za-z0-9-]*)[ \t]*:[ \t]*(?P<value>[^\r\n]*)", re.M)
# In free text: the headers that carry a login (`Authorization:`, `Cookie:` and kin) anywhere, any secret one after
# -H/--header; the value runs to its closing quote or the end of the line.
_TEXT_HEADER_RE = re.compile(
    r"(?P<flag>(?<![\w-])(?:-H|--header)(?:[ \t]+|=))?(?P<quote>[\"']?)(?<![\w-])"
    r"(?P<name>[A-Za-z][A-Za-z0-9-]*)[ \t]*:[ \t]*"
)
# HTTP's own login headers by their last word: Authorization, Proxy-Authorization, Cookie, Set-Cookie.
_LOGIN_HEADERS = ("authorization", "cookie")
# Where a value unquoted in free text ends: a cookie string (`a=b; c=d`, Set-Cookie's `; HttpOnly`), else a token.
_COOKIES_RE = re.compile(r"[^\s;=]+(?:=[^\s;]*)?(?:;[ \t]*[^\s;=]+(?:=[^\s;]*)?)*")
_TOKEN_RE = re.compile(r"[^\s'\"]+")
# An auth scheme before the credentials (RFC 9110: `Basic …`, `Bearer …`) is kept: it says how, not what.
_AUTH_SCHEME_RE = re.compile(r"[A-Za-z][A-Za-z0-9!#$%&'*+.^_`|~-]*[ \t]+(?=\S)")
# A bearer token in a value (`Bearer abc…`): the scheme as HTTP writes it (free text also takes `bearer`: _BEARER_RE).
_VALUE_BEARER_RE = re.compile(r"(?<![A-Za-z0-9_-])(?:Bearer|Basic)[ \t]+(?P<value>[A-Za-z0-9._~+/=-]+)")
# A JSON Web Token, whole: header, payload and signature (JWE: five parts); `eyJ` is `{"` in base64.
_JWT_RE = re.compile(
    r"(?<![A-Za-z0-9_-])eyJ[A-Za-z0-9_-]+=*\.[A-Za-z0-9_-]+=*\.[A-Za-z0-9_+/=-]*(?:\.[A-Za-z0-9_+/=-]*){0,2}"
)
# What is masked already, in a value or free text: nothing inside it is looked at again.
_MASK_RE = re.compile(r"<redacted(?: hmac:[0-9a-f]*)?>")
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Digests made without a store's key (commands with no store) use this one: comparable within one process only.
_PROCESS_KEY = os.urandom(32)


def redact(name: str, value: str, key: bytes | None = None) -> str:
    """Hide secret-looking values but keep them comparable (same value and key → same digest): the whole value of a
    secret-named variable, else each secret part of it (mask_secrets): a URL's userinfo (`postgres://<redacted
    hmac:…>@db/x`: the host stays, it is provenance), a connection string's password, a header's credentials, a
    JWT."""
    if SECRET_NAME_RE.search(name):
        return digest(value, key)
    return mask_secrets(value, lambda part: digest(part, key))


def digest(value: str, key: bytes | None = None) -> str:
    """value as a keyed digest (`<redacted hmac:…>`): equal values under one key give equal digests."""
    # Keyed (HMAC), not a bare hash: without the store's key a guessed secret cannot be confirmed from its digest.
    mac = hmac.new(key or _PROCESS_KEY, value.encode(), hashlib.sha256).hexdigest()
    return f"<redacted hmac:{mac[:16]}>"


def mask_userinfo(value: str, hide: Callable[[str], str]) -> str:
    """value with hide(userinfo) in place of the userinfo of each URL in it (`scheme://user:pw@host`) and of each
    JDBC-style `…:user/pw@host` (Oracle), or of the whole value when it is `user:pw@host[:port]`; the rest as it
    was."""

    def one(m: re.Match[str]) -> str:
        userinfo = m.group("userinfo")
        if userinfo == REDACTED or DIGEST_RE.fullmatch(userinfo):
            return m.group(0)  # masked already
        return f"{m.group('head')}{hide(userinfo)}@"

    masked = _COLON_USERINFO_RE.sub(one, _URL_USERINFO_RE.sub(one, value))
    return masked if masked != value else _BARE_USERINFO_RE.sub(one, value)


def mask_secrets(value: str, hide: Callable[[str], str]) -> str:
    """value with hide(part) in place of each secret part: the userinfo of each URL (mask_userinfo), then the forms
    (_mask_forms); the rest as it was."""
    return _mask_forms(mask_userinfo(value, hide), hide)


def _mask_forms(text: str, hide: Callable[[str], str], *, free_text: bool = False) -> str:
    """text with hide(part) in place of each secret part in a general form: the value of a secret key in a connection
    string or a URL's query, quoted, braced or bare (`Pwd={a;b}`, `Password="a;b"`, `sslpassword=x`, `&sig=x`), the
    credentials of a header line (`Cookie: …`, `Authorization: Basic …`), a bearer token, a JWT (all three parts).
    free_text: a log or an error rather than one value (headers only where surely one, bare values end at a blank,
    `api_key=None` kept)."""
    out: list[str] = []
    pos = 0
    for start, end in _form_spans(text, free_text=free_text):
        out += [text[pos:start], hide(text[start:end])]
        pos = end
    return "".join(out) + text[pos:]


def _secret_key(key: str) -> bool:
    """Whether a connection string's key, a query parameter or a header names a secret (see _SECRET_WORDS)."""
    words = _WORD_RE.findall(key)
    return bool(words) and (words[-1].lower() in _SECRET_WORDS or key.lower().endswith(_SECRET_ENDINGS))


def merge_spans(spans: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """(start, end) spans sorted, those that overlap or touch merged into one."""
    merged: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged


def _form_spans(text: str, *, free_text: bool) -> list[tuple[int, int]]:
    """Where _mask_forms hides, as sorted (start, end), overlaps merged and masks already there left out."""
    found = [*_pair_spans(text, free_text), *_header_spans(text, free_text)]
    found += [m.span() for m in _JWT_RE.finditer(text)]
    found += [m.span("value") for m in (_BEARER_RE if free_text else _VALUE_BEARER_RE).finditer(text)]
    merged = merge_spans(found)
    # A mask inside a span splits it and stays as it is; both lists are sorted: one sweep.
    masks = [m.span() for m in _MASK_RE.finditer(text)]
    out: list[tuple[int, int]] = []
    i = 0
    for start, end in merged:
        while i < len(masks) and masks[i][1] <= start:
            i += 1
        j = i
        while j < len(masks) and masks[j][0] < end:
            if text[start : masks[j][0]].strip():
                out.append((start, masks[j][0]))
            start = max(start, masks[j][1])
            j += 1
        if text[start:end].strip():
            out.append((start, end))
    return out


def _pair_spans(text: str, free_text: bool) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    pos = 0
    while m := (_TEXT_PAIR_RE if free_text else _PAIR_RE).search(text, pos):
        pos = m.end()
        key, after = m.group("key"), text[m.start() - 1 : m.start()]
        if not _secret_key(key):
            continue
        start, end, pos = _pair_value(text, m.end(), query=after in ("?", "&"), free_text=free_text)
        value = text[start:end]
        # In free text `api_key=None` is no secret, nor PWD=/home/u, OLDPWD=… (the shell's directories; ODBC's Pwd= is
        # no path).
        if value and not (
            free_text and (value in ("None", "null") or (key.lower().endswith("pwd") and value[0] in "/~"))
        ):
            out.append((start, end))
    return out


def _pair_value(text: str, start: int, *, query: bool, free_text: bool) -> tuple[int, int, int]:
    """(start, end) of the value at start and where the next pair may begin: inside its braces or quotes (ODBC's
    `{…}`, ADO.NET's `"…"`/`'…'`, where `;` is part of the value and a doubled closing character escapes itself), else
    up to its format's separator."""
    close = {"{": "}", '"': '"', "'": "'"}.get(text[start : start + 1])
    if close is not None:
        i = start + 1
        while (j := text.find(close, i)) >= 0:
            if text.startswith(close, j + 1):
                i = j + 2  # `}}` or `""`: the character itself
                continue
            return start + 1, j, j + 1
        # Never closed: all of the rest is the value (a line of it in free text).
        end = _line_end(text, start) if free_text else len(text)
        return start + 1, end, end
    if free_text:
        ends = _TEXT_QUERY_END_RE if query else _TEXT_PAIR_END_RE
    else:
        ends = _QUERY_END_RE if query else _PAIR_END_RE
    cut = ends.search(text, start)
    end = cut.start() if cut else len(text)
    return start, end, end


def _header_spans(text: str, free_text: bool) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    if not free_text:
        for line in _HEADER_LINE_RE.finditer(text):
            if _secret_key(line.group("name")):
                out += _credentials(text, line.group("name"), *line.span("value"))
        return out
    pos = 0
    while m := _TEXT_HEADER_RE.search(text, pos):
        pos = m.end()
        name = m.group("name")
        if not (_secret_key(name) if m.group("flag") else _WORD_RE.findall(name)[-1].lower() in _LOGIN_HEADERS):
            continue
        line_end = _line_end(text, m.end())
        quote = m.group("quote")
        end = text.find(quote, m.end(), line_end) if quote else -1
        if found := _credentials(text, name, m.end(), line_end if end < 0 else end, bare=not quote):
            out += found
            pos = max(pos, found[-1][1])  # a header name inside the value is part of the value
    return out


def _credentials(text: str, name: str, start: int, end: int, *, bare: bool = False) -> list[tuple[int, int]]:
    """The span of a header's secret in text[start:end]: its value, after the auth scheme of an Authorization header;
    none for a number (a count such as `#new-token: 126` is no credential). bare: a header unquoted in free text,
    where the value's own grammar says where it ends (RFC 6265's `a=b; c=d`, a token)."""
    if name.lower().endswith("authorization") and (scheme := _AUTH_SCHEME_RE.match(text, start, end)):
        start = scheme.end()
    if bare:
        value = (_COOKIES_RE if name.lower().endswith("cookie") else _TOKEN_RE).match(text, start, end)
        end = value.end() if value else start
    while end > start and text[end - 1].isspace():
        end -= 1
    if end == start or _NUMBER_RE.fullmatch(text, start, end):
        return []
    return [(start, end)]


def _line_end(text: str, pos: int) -> int:
    end = text.find("\n", pos)
    return len(text) if end < 0 else end


def redact_argv(argv: list[str], key: bytes | None = None) -> list[str]:
    """Hide the value after a secret-looking flag (`--api-key X`, `--api-key=X`) and each secret part of any other
    argument (mask_secrets), keeping them comparable."""
    return hide_argv(argv, lambda value: digest(value, key))


def hide_argv(argv: list[str], hide: Callable[[str], str]) -> list[str]:
    """argv with `hide` applied to each secret value (after a secret flag, or in `--flag=`/`NAME=` form) and to each
    secret part (mask_secrets) of any other argument (`--header "Cookie: <hidden>"`)."""
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
            out.append(f"{flag}={mask_secrets(value, hide)}")  # --proxy=user:pw@host keeps its flag
        else:
            out.append(mask_secrets(arg, hide))
    return out


def secret_values(argv: list[str], env: dict[str, str]) -> list[str]:
    """The values redact_argv/redact hide: what scrub() must also remove from free text such as log tails. Of a
    userinfo (`user:pw`, Oracle's `user/pw`) also the password alone, which a server may print by itself."""
    found: list[str] = []

    def collect(value: str) -> str:
        found.append(value)
        user, *password = re.split(r"[:/]", value, maxsplit=1)
        if user and password and password[0]:
            found.append(password[0])
        return value

    hide_argv(argv, collect)
    for name, value in env.items():
        if SECRET_NAME_RE.search(name):
            found.append(value)
        else:
            mask_secrets(value, collect)
    return [v for v in dict.fromkeys(found) if v]


def scrub(text: str, secret_values: Iterable[str] = ()) -> str:
    """Free text (a log tail, an error) without the known secret values, any URL's userinfo, the forms of _mask_forms,
    nor anything else that looks like a secret."""
    for value in sorted({v for v in secret_values if len(v) >= MIN_SECRET_LEN}, key=len, reverse=True):
        text = text.replace(value, REDACTED)
    for userinfo in (_TEXT_URL_USERINFO_RE, _TEXT_COLON_USERINFO_RE):
        text = userinfo.sub(
            lambda m: m.group(0) if m.group("userinfo") == REDACTED else f"{m.group('head')}{REDACTED}@", text
        )
    text = _mask_forms(text, lambda _: REDACTED, free_text=True)
    for pattern in (_BEARER_RE, _FLAG_VALUE_RE, _ASSIGN_RE):
        text = pattern.sub(_hide_match, text)
    return text


def _hide_match(m: re.Match[str]) -> str:
    value = m.group("value")
    if value.lstrip("{").startswith("<redacted") or value.strip("'\"") in ("", "None", "null"):
        return m.group(0)  # nothing secret to hide: keep `api_key=None` readable
    quote = value[0] if value[0] in "'\"" and value[-1] == value[0] and len(value) > 1 else ""
    colon_form = m.re is _ASSIGN_RE and not quote and "=" not in m.group("sep")
    if colon_form and (not re.search(r"[_.-]", m.group("name")) or _NUMBER_RE.fullmatch(value)):
        return m.group(0)  # prose ("first token: 0.5 s") or a count ("#new-token: 126"), not an assignment
    return f"{m.group('name')}{m.group('sep')}{quote}{REDACTED}{quote}"
