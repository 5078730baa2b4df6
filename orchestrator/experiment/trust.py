"""The trust a result bundle needs before `orch reproduce` runs it: what it would make this machine run that this
machine's own profiles would not, the code that would load with it, and what decided to run it anyway."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.common.redaction import REDACTED, SECRET_NAME_RE, hide_argv, mask_userinfo
from orchestrator.config import profile as profiles_mod
from orchestrator.config.profile import Profile
from orchestrator.errors import BundleDeclined, InputError, ProfileError, UntrustedBundle
from orchestrator.results.signing import SignatureCheck

# Environment variables that change what code a process loads, each with why. A bundle can set any variable in a
# profile's env, and the server (or the simulator: a Python process too) starts with it, so these are named first in
# what a bundle would run. The rule: the start-up and search paths of the interpreters and the dynamic loader that a
# server's processes use, and every variable named like a search path, a plugin, a code cache or interpreter options.
CODE_LOADING_ENV: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern), why)
    for pattern, why in (
        (
            r"^PYTHON(PATH|STARTUP|HOME|USERBASE|PLATLIBDIR|PYCACHEPREFIX|EXECUTABLE)$",
            "where Python finds its modules and start-up code (a sitecustomize.py there runs in every Python process)",
        ),
        (r"^PYTHON(BREAKPOINT|WARNINGS)$", "names Python code for the interpreter to import"),
        (r"^(LD|DYLD)_", "the dynamic loader: which shared libraries are loaded into every process"),
        (r"^(BASH_ENV|ENV|ZDOTDIR|PROMPT_COMMAND)$|^BASH_FUNC_", "shell code a shell runs as it starts"),
        (
            r"^(NODE_OPTIONS|PERL5OPT|RUBYOPT|JAVA_TOOL_OPTIONS|_JAVA_OPTIONS|JDK_JAVA_OPTIONS)$",
            "options an interpreter applies as it starts (they can load code)",
        ),
        (r"^(GCONV_PATH|OPENSSL_CONF|OPENSSL_MODULES|OPENSSL_ENGINES)$", "modules a library loads"),
        (r"PLUGINS?$", "a plugin to load"),
        (r"(^|_)HOME$", "a search root: where programs, libraries, user site-packages or downloaded code are found"),
        (r"(PATH|LIB)$", "a search path for programs, libraries or modules"),
        (r"CACHE|EXTENSIONS_DIR$", "a cache of compiled kernels or downloaded code, loaded from there"),
    )
)
# Server flags that name code for the server to load (a plugin, a worker class, a logits processor, a loader...).
CODE_LOADING_FLAG_RE = re.compile(
    r"^--?[\w-]*(plugin|extension|cls|class|module|middleware|processor|hook|import|remote-code|custom|script|"
    r"preload|loader|load-format)[\w-]*$",
    re.IGNORECASE,
)
# What is compared with this machine's own profile: everything that decides the server that runs, but the port
# (`orch reproduce` serves on the recorded port or --port, whatever the profile says) and the profile's claim.
NOT_COMPARED = ("name", "source", "chain", "description", "raw", "expect", "port")
COMPARED = tuple(f.name for f in dataclasses.fields(Profile) if f.name not in NOT_COMPARED)
PYTHON = "<python>"  # the host's interpreter: orch's own choice, never the bundle's
_PLAIN_ARG_RE = re.compile(r"^[A-Za-z0-9_@%+=:,./<>-]+\Z")

# Asks at a terminal: shown the review, returns whether to run it.
Ask = Callable[[str], bool]


def code_env_reason(name: str) -> str | None:
    """Why an environment variable changes what code a process loads, or None when it does not (as far as orch
    knows: docs/reproduce.md#trust has the rule)."""
    return next((why for pattern, why in CODE_LOADING_ENV if pattern.search(name)), None)


def _shown(value: Any) -> str:
    """A value as JSON: every control character escaped, so nothing in a bundle can rewrite the question's lines."""
    return json.dumps(value, sort_keys=True)


def _arg(arg: str) -> str:
    return arg if _PLAIN_ARG_RE.match(arg) else _shown(arg)


def _name(name: str) -> str:
    """An env variable's name as the review shows it: as it is when it is a valid name, else as JSON (one line)."""
    return name if profiles_mod.ENV_NAME_RE.match(name) else _shown(name)


def _env_value(name: str, value: str | None) -> str:
    if value is None:
        return "not set"
    return _shown(REDACTED if SECRET_NAME_RE.search(name) else mask_userinfo(value, lambda _: REDACTED))


def _field_value(name: str, value: Any) -> str:
    if name == "server_args":
        return _shown(hide_argv(list(value), lambda _: REDACTED))
    if name == "speculative":
        return _shown(None if value is None else dataclasses.asdict(value))
    if name == "sim":
        return _shown(dict(value))
    return _shown(value)


def differences(theirs: Profile, mine: Profile) -> list[str]:
    """How the bundle's profile differs from this machine's one of the same name, field by field (env by variable),
    the bundle's value first; secrets masked."""
    out: list[str] = []
    for name in COMPARED:
        a, b = getattr(theirs, name), getattr(mine, name)
        if name == "env":
            env_a, env_b = dict(a), dict(b)
            for key in sorted(set(env_a) | set(env_b)):
                bundled, here = env_a.get(key), env_b.get(key)
                if bundled != here:
                    out.append(f"env.{_name(key)}: {_env_value(key, bundled)} (here: {_env_value(key, here)})")
        elif a != b:
            out.append(f"{name}: {_field_value(name, a)} (here: {_field_value(name, b)})")
    return out


def command_line(profile: Profile, simulated: bool) -> str:
    """What a launch of the profile runs, as it would be shown in a shell (secrets masked)."""
    if profile.attach is not None:
        return f"nothing launched: the server already running at {_shown(profile.attach)} is benchmarked"
    try:
        argv = profile.launch_argv(PYTHON, simulate=simulated)
    except InputError:  # an engine without a simulator: refused before any launch anyway
        argv = [PYTHON, "...", *profile.server_flags()]
    shown = " ".join(_arg(a) for a in hide_argv(argv, lambda _: REDACTED))
    return shown + (f"  (on each of {profile.nnodes} nodes)" if profile.nnodes > 1 else "")


def loads_code(profile: Profile, simulated: bool) -> list[str]:
    """What in the profile makes the server load code beyond the engine's own: env variables, and (for a real
    engine: the simulator loads no model and no plugin) remote code in model directories, packaged models, flags."""
    out = [f"env {_name(name)}: {why}" for name, _ in profile.env if (why := code_env_reason(name)) is not None]
    if simulated or profile.attach is not None:
        return out
    if profile.trust_remote_code:
        out.append(
            "trust_remote_code: the server runs Python code shipped in its model directories (model_path "
            f"{_shown(profile.model_path)}, a draft model, a --tokenizer)"
        )
    if profile.python is not None:
        out.append(f"python {_shown(profile.python)}: the server runs under that interpreter, not the host's own")
    if profile.model_path.startswith("package:"):
        out.append(f"model_path {_shown(profile.model_path)}: imports that Python package in the server's interpreter")
    for arg in profile.server_args:
        flag = arg.split("=", 1)[0]
        if CODE_LOADING_FLAG_RE.match(flag):
            out.append(f"server_args {_arg(flag)}: names code for the server to load")
    return out


@dataclass(frozen=True, kw_only=True)
class ArmReview:
    """One arm of a bundle beside this machine's profile of the same name."""

    name: str
    own: str | None  # where this machine's profile of that name is; None: it has none it can read
    why_not_own: str | None = None  # why not (no such profile, or the error reading it)
    differences: tuple[str, ...] = ()
    command: str = ""
    env: str = ""
    loads_code: tuple[str, ...] = ()

    @property
    def same(self) -> bool:
        """The bundle runs exactly what this machine's own profile would (its port aside)."""
        return self.own is not None and not self.differences


@dataclass(frozen=True, kw_only=True)
class Review:
    """What a bundle would make this machine run, arm by arm, against this machine's own profiles."""

    source: str
    simulated: bool
    arms: tuple[ArmReview, ...]

    @property
    def needs_consent(self) -> bool:
        return any(not arm.same for arm in self.arms)

    @property
    def differing(self) -> list[str]:
        return [arm.name for arm in self.arms if not arm.same]

    def lines(self, signature: SignatureCheck | None = None) -> list[str]:
        """The review as the question (or the refusal) shows it."""
        how = " (on orch's simulator of each engine)" if self.simulated else ""
        out = [f"{self.source} would make this machine run what its own profiles would not{how}:"]
        for arm in self.arms:
            if arm.same:
                out.append(f"  arm {arm.name}: the same as this machine's profile {arm.name} ({arm.own})")
                continue
            if arm.own is None:
                out.append(f"  arm {arm.name}: {arm.why_not_own}")
            else:
                out.append(f"  arm {arm.name}: differs from this machine's profile {arm.name} ({arm.own}) in")
                out += [f"      {line}" for line in arm.differences]
            out.append(f"    runs: {arm.command}")
            out.append(f"    with env: {arm.env or '(nothing of its own)'}")
        flagged = [f"  ! {arm.name}: {what}" for arm in self.arms if not arm.same for what in arm.loads_code]
        if flagged:
            out += ["code it would make this machine load:", *flagged]
        if signature is None:
            out.append("signature: not checked (--allowed-signers FILE accepts a bundle signed by someone you trust)")
        else:
            out.append(f"signature: {signature.note}")
        return out


def review(source: str, profiles: Sequence[Profile], simulated: bool) -> Review:
    """Each of the bundle's profiles (as they would run: withheld secrets filled) against this machine's profile of
    the same name, found as `orch ab NAME` would find it (./profiles, the user's profile directory, orch's own)."""
    arms = []
    for theirs in profiles:
        arm = ArmReview(
            name=theirs.name,
            own=None,
            command=command_line(theirs, simulated),
            env=" ".join(f"{_name(k)}={_env_value(k, v)}" for k, v in theirs.env),
            loads_code=tuple(loads_code(theirs, simulated)),
        )
        try:
            mine = profiles_mod.load(theirs.name)
        except ProfileError as e:
            first = str(e).splitlines()[0]
            why = (
                f"no profile named {theirs.name} on this machine"
                if first.startswith(f"no profile named {theirs.name!r}")
                else f"this machine's profile {theirs.name} cannot be read ({_shown(first)[1:-1]})"
            )
            arms.append(dataclasses.replace(arm, why_not_own=why))
            continue
        arms.append(dataclasses.replace(arm, own=mine.source, differences=tuple(differences(theirs, mine))))
    return Review(source=source, simulated=simulated, arms=tuple(arms))


@dataclass(frozen=True, kw_only=True)
class Trust:
    """What decided that a bundle may run: its profiles are this machine's own, a signature by an allowed signer,
    --trust-bundle, or a yes at the terminal."""

    basis: str  # own-profiles | signature | trust-bundle | answered-yes
    note: str  # one line for the report
    differing: tuple[str, ...] = ()  # the arms that differ from this machine's own profiles
    signature: SignatureCheck | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "basis": self.basis,
            "note": self.note,
            "differing_arms": list(self.differing),
            "signature": None if self.signature is None else self.signature.to_dict(),
        }


def decide(rev: Review, *, signature: SignatureCheck | None, trust_bundle: bool, ask: Ask | None) -> Trust:
    """Whether the bundle may run, before anything starts: a good signature by an allowed signer, or profiles that
    are this machine's own, need no question; otherwise --trust-bundle, or a yes at the terminal (`ask`; None: no
    terminal), else UntrustedBundle (no terminal) or BundleDeclined (answered no)."""
    differing = tuple(rev.differing)
    if signature is not None and signature.key is not None and signature.signer is not None:
        note = f"{signature.note}, an allowed signer in {signature.allowed_signers}"
        return Trust(basis="signature", note=note, differing=differing, signature=signature)
    if not differing:
        return Trust(basis="own-profiles", note="its profiles are this machine's own", signature=signature)
    if trust_bundle:
        note = f"run as it says (--trust-bundle); arms unlike this machine's own profiles: {', '.join(differing)}"
        return Trust(basis="trust-bundle", note=note, differing=differing, signature=signature)
    text = "\n".join(rev.lines(signature))
    if ask is None:
        raise UntrustedBundle(
            f"{text}\nrefused: there is no terminal to ask on. Read the above, then give --trust-bundle to run it, "
            "or --allowed-signers FILE to run bundles signed by someone you trust (docs/reproduce.md#trust)"
        )
    if not ask(text):
        raise BundleDeclined(f"not run: you answered no; nothing was started ({rev.source})")
    return Trust(basis="answered-yes", note="run after a yes at the terminal", differing=differing, signature=signature)
