"""Secrets found by what they look like, not by their name: detect-secrets' maintained patterns (GitHub, Azure, AWS,
Slack, Stripe, JWTs, private keys, `password=` and kin) over env values, argv items and free text, on top of the
name, flag, URL and general-form rules of common/redaction (connection strings, header lines, whole JWTs; they ship
to hosts, stdlib only). The orch side's redact, redact_argv, secret_values and scrub: use these wherever orch prints,
stores or exports a value."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from orchestrator.common import redaction
from orchestrator.common.redaction import REDACTED

# detect-secrets' plugins that find no secret here: a public IP address is provenance (where a server ran), and a
# URL's userinfo is masked by common/redaction already, keeping the host (BasicAuthDetector would take the host too).
_NOT_SECRETS = frozenset({"IPPublicDetector", "BasicAuthDetector"})
# Tokens detect-secrets 1.5 has no plugin for: GitHub's fine-grained personal access tokens (2022), and Hugging
# Face's access tokens (the credential an LLM server's host holds most often). Both are fixed prefixes.
_EXTRA = (
    re.compile(r"github_pat_[A-Za-z0-9_]{22,}"),
    re.compile(r"hf_[A-Za-z0-9]{30,}"),
)
# A masked value inside a value: nothing in it is looked at again.
_MASKED = re.compile(r"(<redacted(?: hmac:[0-9a-f]*)?>)")
_NAMED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=(?=[^=])")
# Where a keyword's value ends in a connection string or a URL's query (`Pwd=PW;Encrypt=yes`, `password=PW&ssl=1`):
# the separators of those formats, which a value there cannot hold unescaped.
_VALUE_END = re.compile(r"[;&]")


@dataclass(frozen=True)
class _Pattern:
    regex: re.Pattern[str]
    group: int = 0  # the part of a match that is the secret (a keyword's value), 0: all of it
    keyword: bool = False
    check: Callable[[str], bool] | None = None  # a plugin's own check of a candidate (a JWT must decode)


@functools.cache
def _patterns() -> tuple[_Pattern, ...]:
    """Every pattern, compiled once: each regex-based plugin of detect-secrets (as installed: a newer version brings
    its new plugins), its keyword detector (config-file form: `password=x`, `pwd: x`), and _EXTRA. Imported on first
    use: commands that redact nothing never load it."""
    from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class
    from detect_secrets.plugins.base import BasePlugin, RegexBasedDetector
    from detect_secrets.plugins.keyword import CONFIG_DENYLIST_REGEX_TO_GROUP

    out: list[_Pattern] = []
    plugins: list[type[BasePlugin]] = sorted(get_mapping_from_secret_type_to_class().values(), key=lambda c: c.__name__)
    for plugin in plugins:
        if not issubclass(plugin, RegexBasedDetector) or plugin.__name__ in _NOT_SECRETS:
            continue
        detector = plugin()

        def check(candidate: str, detector: RegexBasedDetector = detector) -> bool:
            return any(True for _ in detector.analyze_string(candidate))

        out += [_Pattern(regex, check=check) for regex in detector.denylist]
    out += [_Pattern(regex, group, keyword=True) for regex, group in CONFIG_DENYLIST_REGEX_TO_GROUP.items()]
    out += [_Pattern(regex) for regex in _EXTRA]
    return tuple(out)


def _spans(text: str, *, keywords: bool) -> list[tuple[int, int]]:
    """Where the secrets in text are, as (start, end), overlapping ones merged."""
    found: list[tuple[int, int]] = []
    for p in _patterns():
        if p.keyword and not keywords:
            continue
        for m in p.regex.finditer(text):
            start, end = m.span(p.group)
            if start < 0 or (p.check is not None and not p.check(m.group(0))):
                continue
            if p.keyword:
                # A keyword's value: in quotes all of it (`"password": "a;b"`), else up to the separator of a
                # connection string or a query, if any.
                quoted = start > 0 and end < len(text) and text[start - 1] in "'\"" and text[end] == text[start - 1]
                if not quoted and (cut := _VALUE_END.search(text, start, end)):
                    end = cut.start()
            elif named := _NAMED.match(text, start, end):
                # A token pattern that takes the name it is given under (Azure's `AccountKey=…`): the name stays.
                start = named.end()
            # A pattern may take the character before the secret (Artifactory's `=AKC…`) or its quotes.
            while start < end and text[start] in " \t=:\"'":
                start += 1
            while end > start and text[end - 1] in " \t\"'":
                end -= 1
            if end > start:
                found.append((start, end))
    return redaction.merge_spans(found)


def find(text: str, *, keywords: bool = True) -> list[str]:
    """The secret-looking parts of text, outside what is masked already. keywords=False leaves out `name=value`
    assignments (free text: common/redaction.scrub judges those, keeping `api_key=None` and counts readable)."""
    parts = _MASKED.split(text)[::2]  # split on a capturing group: the masks are the odd items
    return [part[start:end] for part in parts for start, end in _spans(part, keywords=keywords)]


def mask(text: str, hide: Callable[[str], str], *, keywords: bool = True) -> str:
    """text with hide(secret) in place of each secret-looking part (find), the rest (masks included) as it was."""
    out = []
    for i, part in enumerate(_MASKED.split(text)):
        if i % 2:  # a mask
            out.append(part)
            continue
        pos = 0
        for start, end in _spans(part, keywords=keywords):
            out.append(part[pos:start] + hide(part[start:end]))
            pos = end
        out.append(part[pos:])
    return "".join(out)


# ---------------------------------------------------------------- the orch side's redaction


def redact(name: str, value: str, key: bytes | None = None) -> str:
    """common/redaction.redact (secret names, URL userinfo, the general forms), then each secret-looking part as a
    keyed digest: the rest of the value stays (`AccountName=x;AccountKey=<redacted hmac:…>`), it is provenance."""
    return mask(redaction.redact(name, value, key), lambda secret: redaction.digest(secret, key))


def redact_argv(argv: list[str], key: bytes | None = None) -> list[str]:
    """common/redaction.redact_argv (secret flags, URL userinfo, the general forms), then each secret-looking part as
    a keyed digest."""
    return [mask(arg, lambda secret: redaction.digest(secret, key)) for arg in redaction.redact_argv(argv, key)]


def remask(env: Mapping[str, str | None], key: bytes | None) -> dict[str, str | None]:
    """Values a host redacted by name and URL only (its agent is stdlib: no patterns there) with their
    secret-looking parts digested as orch digests them (redact): the same value compares equal to orch's own."""
    return {k: None if v is None else mask(v, lambda secret: redaction.digest(secret, key)) for k, v in env.items()}


def secret_values(argv: list[str], env: Mapping[str, str]) -> list[str]:
    """common/redaction.secret_values, and every secret-looking part of an argv item or env value: what scrub()
    removes from free text (a log tail quoting the server's arguments)."""
    found = redaction.secret_values(argv, dict(env))
    for value in [*argv, *env.values()]:
        found += find(value)
    return [v for v in dict.fromkeys(found) if v]


def scrub(text: str, secrets: Iterable[str] = ()) -> str:
    """common/redaction.scrub (known values, URL userinfo, the general forms, `api_key=…` and kin), then every
    token-shaped secret (a GitHub or Slack token, a private key) as `<redacted>`."""
    return mask(redaction.scrub(text, secrets), lambda _: REDACTED, keywords=False)
