"""Server profiles: YAML files saying what server to run, validated and resolved into frozen objects."""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import platformdirs

from orchestrator import engines, yamlfile
from orchestrator.config.secretpatterns import redact, redact_argv
from orchestrator.engines.base import OPTIONAL_FIELDS
from orchestrator.errors import ProfileError
from orchestrator.fields import (
    FieldError,
    boolean,
    choice,
    did_you_mean,
    float_range,
    int_range,
    key_name,
    nonempty_str,
    show,
    str_list,
    text,
)
from orchestrator.sim.knobs import ENV_PREFIX as SIM_ENV_PREFIX
from orchestrator.sim.knobs import KNOBS as SIM_KNOBS
from orchestrator.sim.knobs import read_knobs

# The one rule for a profile name: what a name on the command line, an `extends`, a stored experiment's arm and a
# result bundle's profile must match (from_resolved, which reads a bundle's profiles back, checks it).
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*\Z")
NAME_RULE = "letters, digits, '.', '_', '-', starting with a letter or digit"
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
# http://HOST:PORT of a server orch attaches to instead of launching (no path, no credentials, no query).
ATTACH_RE = re.compile(r"^http://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+):([0-9]{1,5})/?\Z")
BUNDLED_DIR = Path(__file__).resolve().parent / "bundled_profiles"


def name_for(stem: str) -> str:
    """The profile name of a file with this stem: the stem itself when it is a valid name, else the stem with every
    other character as '_' and no leading '.', '_' or '-' ("my profile" → "my_profile"), so that a profile loaded
    from any file path is stored and bundled under a name its bundle can be read back with."""
    if NAME_RE.match(stem):
        return stem
    name = re.sub(r"[^A-Za-z0-9._-]", "_", stem).lstrip("._-")
    return name or "profile"


def user_profile_dir() -> Path:
    return Path(platformdirs.user_config_dir("orch")) / "profiles"


def search_dirs(cwd: Path | None = None) -> list[Path]:
    """Where names are looked up, in order: ./profiles, the user config dir, then the bundled set."""
    return [(cwd or Path.cwd()) / "profiles", user_profile_dir(), BUNDLED_DIR]


@dataclass(frozen=True, kw_only=True)
class Speculative:
    """Speculative-decoding settings; the engine adapter maps them onto its flags (SGLang's --speculative-*)."""

    algorithm: str
    draft_model_path: str | None = None
    num_steps: int | None = None
    eagle_topk: int | None = None
    num_draft_tokens: int | None = None
    prompt_lookup_min: int | None = None  # the n-gram window (vLLM's ngram)
    prompt_lookup_max: int | None = None
    # Any other key of the engine's own speculative config, passed as it is (vLLM: --speculative-config), sorted.
    engine_config: tuple[tuple[str, Any], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """As stored with an experiment: the first five fields always, the later ones only when set, so experiments
        stored before they existed still compare equal on resume and keep their workload digest."""
        out: dict[str, Any] = {k: getattr(self, k) for k in FIRST_SPEC_FIELDS}
        for key in ("prompt_lookup_min", "prompt_lookup_max"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.engine_config:
            out["engine_config"] = {k: list(v) if isinstance(v, tuple) else v for k, v in self.engine_config}
        return out


FIRST_SPEC_FIELDS = ("algorithm", "draft_model_path", "num_steps", "eagle_topk", "num_draft_tokens")


@dataclass(frozen=True, kw_only=True)
class Expect:
    """A claim that comes with a profile ("this gives 94 tok/s on our box"): what `orch reproduce PROFILE` judges.
    Never inherited through `extends`: a claim is about one file's configuration."""

    tok_s: float | None = None  # claimed single-stream tok/s (at concurrency 1)
    ratio: float | None = None  # claimed ratio against `vs`
    vs: str | None = None  # the baseline profile the ratio (and the side-by-side run) is against
    host: str | None = None  # where the claim was measured (informational)
    date: str | None = None
    note: str | None = None


@dataclass(frozen=True, kw_only=True)
class Profile:
    """A resolved profile: every `extends` applied, every value validated."""

    name: str
    source: str
    chain: tuple[str, ...]
    engine: str
    model_path: str
    port: int
    tp_size: int = 1
    nnodes: int = 1  # > 1: one launch spreads over that many hosts of an inventory group (launch/group.py)
    host: str = "127.0.0.1"
    served_model_name: str | None = None
    trust_remote_code: bool = False
    mem_fraction_static: float | None = None
    speculative: Speculative | None = None
    server_args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    sim: tuple[tuple[str, float | int | str], ...] = ()
    ready_timeout_s: float = 900.0
    description: str = ""
    attach: str | None = None  # a running server's URL: benchmarked as it is, never launched or stopped
    # The interpreter that runs the server on the host, when it is not the host's own (an engine in a venv of its
    # own, beside orch's agent); a leading ~/ is the home of the host's user. The simulator always runs under the
    # host's Python.
    python: str | None = None
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    expect: Expect | None = field(default=None, compare=False)

    def env_dict(self) -> dict[str, str]:
        return dict(self.env)

    def sim_env(self) -> dict[str, str]:
        """The simulator knobs as the ORCH_SIM_* variables the simulator reads."""
        return {SIM_KNOBS[k].env: str(v) for k, v in self.sim}

    def server_flags(self) -> list[str]:
        """The server's flags, as its engine adapter renders them (an argv list, never a shell string)."""
        return engines.get(self.engine).server_flags(self)

    def launch_argv(self, python: str, *, simulate: bool) -> list[str]:
        """The server's command line on a host whose Python is `python` (the profile's own python, if it names one,
        runs a real server)."""
        interpreter = python if simulate or self.python is None else self.python
        return engines.get(self.engine).launch_argv(self, interpreter, simulate=simulate)

    def with_port(self, port: int) -> Profile:
        """This profile serving on `port` instead of its own (--port, a nightly item's `port:`). Every engine adapter
        renders --port from the profile's port, so this one replacement reaches every engine's command line, the
        port checks before a launch and the teardown alike."""
        return dataclasses.replace(self, port=port)

    def to_dict(self, *, redaction_key: bytes | None = None) -> dict[str, Any]:
        """The resolved profile as plain data, for provenance in results; secret values as digests keyed with
        redaction_key (a store's key: equal within that store), or with a per-process key when none is given."""
        spec = self.speculative
        return {
            "name": self.name,
            "source": self.source,
            "extends_chain": list(self.chain),
            "engine": self.engine,
            "model_path": self.model_path,
            "served_model_name": self.served_model_name,
            "tp_size": self.tp_size,
            "host": self.host,
            "port": self.port,
            "trust_remote_code": self.trust_remote_code,
            "mem_fraction_static": self.mem_fraction_static,
            "speculative": None if spec is None else spec.to_dict(),
            "server_args": redact_argv(list(self.server_args), redaction_key),
            "env": {k: redact(k, v, redaction_key) for k, v in self.env},
            "sim": dict(self.sim),
            "ready_timeout_s": self.ready_timeout_s,
            "description": self.description,
            "attach": self.attach,
            # Only when set: experiments stored before the field existed still compare equal on resume.
            **({"nnodes": self.nnodes} if self.nnodes != 1 else {}),
            **({"python": self.python} if self.python is not None else {}),
        }


def _engine(v: Any) -> str:
    """An engine some adapter is registered for (looked up when checked, so a registered engine is known at once)."""
    return str(choice(engines.names())(v))


def _attach_url(v: Any) -> str:
    url = nonempty_str(v)
    m = ATTACH_RE.match(url)
    if m is None or not 1 <= int(m.group(2)) <= 65535:
        # Never echo a credential or a query string (a key) from the file into an error message.
        shown = re.sub(r"(?s)[?#].*", "?***", re.sub(r"(?s)//.*@", "//***@", url))
        raise FieldError(
            f"expected http://HOST:PORT of a running server (no path, credentials or query), got {show(shown)}"
        )
    return url.rstrip("/")


def _interpreter(v: Any) -> str:
    path = nonempty_str(v)
    if not (path.startswith("/") or path.startswith("~/")) or "\0" in path:
        raise FieldError(
            f"expected the interpreter's absolute path on the host (or one under ~/, the host user's home), got "
            f"{show(path)}"
        )
    return path


TOP_FIELDS: dict[str, Any] = {
    "description": text,
    "engine": lambda v: _engine(v),
    "model_path": nonempty_str,
    "served_model_name": nonempty_str,
    "tp_size": int_range(1, 1024),
    "nnodes": int_range(1, 1024),
    "host": nonempty_str,
    "port": int_range(1, 65535),
    "trust_remote_code": boolean,
    "mem_fraction_static": float_range(0.0, 1.0, lo_open=True),
    "server_args": str_list,
    "ready_timeout_s": float_range(1.0, 86400.0),
    "attach": _attach_url,
    "python": _interpreter,
}


def _config_value(v: Any) -> Any:
    if isinstance(v, (str, bool, int, float)) and not (isinstance(v, float) and not math.isfinite(v)):
        return v
    if isinstance(v, list):
        return tuple(_config_value(x) for x in v)
    raise FieldError(f"expected a string, number, true/false or a list of them, got {show(v)}")


def _engine_config(v: Any) -> tuple[tuple[str, Any], ...]:
    """speculative.engine_config: {key: value} for the engine's own speculative config (checked by the engine)."""
    if not isinstance(v, dict):
        raise FieldError(f"expected a mapping of the engine's speculative-config keys to values, got {show(v)}")
    out = []
    for key, value in v.items():
        if not isinstance(key, str) or not re.match(r"^[A-Za-z_][A-Za-z0-9_]*\Z", key):
            raise FieldError(f"{key_name(key)}: expected a key name (letters, digits, '_')")
        try:
            out.append((key, _config_value(value)))
        except FieldError as e:
            raise FieldError(f"{key}: {e}") from None
    return tuple(sorted(out))


SPEC_FIELDS: dict[str, Any] = {
    "algorithm": nonempty_str,
    "draft_model_path": nonempty_str,
    "num_steps": int_range(1, 32),
    "eagle_topk": int_range(1, 64),
    "num_draft_tokens": int_range(1, 512),
    "prompt_lookup_min": int_range(1, 1024),
    "prompt_lookup_max": int_range(1, 1024),
    "engine_config": _engine_config,
}
EXPECT_FIELDS: dict[str, Any] = {
    "tok_s": float_range(0.0, 1e7, lo_open=True),
    "ratio": float_range(0.0, 1e3, lo_open=True),
    "vs": nonempty_str,
    "host": text,
    "date": text,
    "note": text,
}
ALL_TOP_KEYS = (*TOP_FIELDS, "extends", "env", "speculative", "sim", "expect")
# Every engine needs these; an engine adds its own (engines.Engine.required).
REQUIRED = ("engine", "model_path", "port")


# ---------------------------------------------------------------- loading


def resolve_path(name_or_path: str, cwd: Path | None = None) -> Path:
    """A path if it names a file, else NAME looked up in search_dirs()."""
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or os.sep in name_or_path:
        if yamlfile.is_file(p) or yamlfile.exists(p):
            return p  # something that is no regular file (a FIFO) is refused by the read, saying what it is
        raise ProfileError(f"{name_or_path}: no such profile file")
    if not NAME_RE.match(name_or_path):
        raise ProfileError(f"{name_or_path!r} is not a valid profile name ({NAME_RULE})")
    for d in search_dirs(cwd):
        for ext in (".yaml", ".yml"):
            candidate = d / f"{name_or_path}{ext}"
            if yamlfile.is_file(candidate):
                return candidate
    known = sorted(available(cwd))
    hint = did_you_mean(name_or_path, known)
    where = ", ".join(str(d) for d in search_dirs(cwd))
    raise ProfileError(f"no profile named {name_or_path!r}{hint}; looked in {where}")


def available(cwd: Path | None = None) -> dict[str, Path]:
    """Profile names visible from here; earlier search dirs shadow later ones."""
    found: dict[str, Path] = {}
    for d in search_dirs(cwd):
        if not d.is_dir():
            continue
        for f in sorted(d.iterdir()):
            if f.suffix in (".yaml", ".yml") and f.is_file() and NAME_RE.match(f.stem):
                found.setdefault(f.stem, f)
    return found


def _read_yaml(path: Path) -> dict[str, Any]:
    data = yamlfile.load(path, ProfileError, "profile")
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ProfileError(f"{path}: expected a mapping of fields at the top level, got {type(data).__name__}")
    return data


def reserved_env(name: str) -> str | None:
    """Why a profile may not set this environment variable, or None if it may."""
    if name == "SPT_NOENV" or (name.startswith("ORCH_") and not name.startswith(SIM_ENV_PREFIX)):
        return (
            "reserved: orch sets ORCH_* variables (the launch marker ORCH_LAUNCH_ID and its other bookkeeping) "
            "and SPT_NOENV itself on every launch, and finds and stops its servers by them; "
            f"only the simulator's {SIM_ENV_PREFIX}* knobs may be set here"
        )
    return None


class ProfileProblems(ProfileError):
    """Every problem found in one pass over a profile (`profiles validate` lists them all); each one a whole
    `path: field: what` message, so one problem reads exactly as a plain ProfileError."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = list(problems)


def problems_of(e: ProfileError) -> list[str]:
    return list(e.problems) if isinstance(e, ProfileProblems) else [str(e)]


def _check_raw_keys(path: Path, data: Mapping[str, Any]) -> None:
    """Every layer is checked on its own, so errors name the file that has them and the merge only ever sees
    values of the right shape (a YAML alias bomb never reaches it)."""
    problems = _raw_key_problems(path, data)
    if problems:
        raise ProfileProblems(problems)


def _raw_key_problems(path: Path, data: Mapping[str, Any]) -> list[str]:
    problems: list[str] = []
    for key in data:
        if key not in ALL_TOP_KEYS:
            problems.append(f"{path}: {key_name(key)}: unknown field{did_you_mean(str(key), ALL_TOP_KEYS)}")
    if "extends" in data and (not isinstance(data["extends"], str) or not data["extends"]):
        problems.append(f"{path}: extends: expected a profile name, got {show(data['extends'])}")
    for key, checker in TOP_FIELDS.items():
        if data.get(key) is not None:
            try:
                checker(data[key])
            except FieldError as e:
                problems.append(f"{path}: {key}: {e}")
    for section, known in (("speculative", SPEC_FIELDS), ("sim", SIM_KNOBS), ("expect", EXPECT_FIELDS)):
        value = data.get(section)
        if value is None:
            continue
        if not isinstance(value, dict):
            problems.append(f"{path}: {section}: expected a mapping (or null), got {show(value)}")
            continue
        for key, item in value.items():
            if key not in known:
                problems.append(f"{path}: {section}.{key_name(key)}: unknown field{did_you_mean(str(key), known)}")
                continue
            if item is None:
                continue
            try:
                if section == "sim":
                    _sim_value(f"{path}: sim.{key}", key, item)
                else:
                    (SPEC_FIELDS if section == "speculative" else EXPECT_FIELDS)[key](item)
            except FieldError as e:
                problems.append(f"{path}: {section}.{key}: {e}")
            except ProfileError as e:
                problems.append(str(e))
    env = data.get("env")
    if env is None:
        return problems
    if not isinstance(env, dict):
        problems.append(f"{path}: env: expected a mapping of NAME: value, got {show(env)}")
        return problems
    for key, value in env.items():
        problem = _env_problem(key, value)
        if problem:
            problems.append(f"{path}: env.{key_name(key)}: {problem}")
    return problems


def _env_problem(key: Any, value: Any) -> str | None:
    if not isinstance(key, str) or not ENV_NAME_RE.match(key):
        return "invalid environment variable name (letters, digits and '_', not starting with a digit)"
    why = reserved_env(key)
    if why:
        return why
    if isinstance(value, bool) or not (value is None or isinstance(value, str | int | float)):
        return f"expected a string or number (quote words like 'true'), got {show(value)}"
    if isinstance(value, str) and "\0" in value:
        return "contains a NUL byte, which no environment can hold"
    if isinstance(value, float) and not math.isfinite(value):
        return f"expected a finite number or a string, got {value}"
    if key.startswith(SIM_ENV_PREFIX) and value is not None:
        # Checked by the simulator's own parser now, not when a launch is already under way.
        try:
            read_knobs({key: _env_value(value)})
        except ValueError as e:
            return str(e)
    return None


def _merge(base: dict[str, Any], child: Mapping[str, Any]) -> dict[str, Any]:
    """Deep merge: mappings merge by key, a null removes an inherited key, everything else replaces."""
    out = dict(base)
    for key, value in child.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _load_chain(path: Path, cwd: Path | None) -> tuple[dict[str, Any], list[Path]]:
    chain: list[Path] = []
    layers: list[dict[str, Any]] = []
    problems: list[str] = []  # every layer's, so one pass reports them all
    current: Path | None = path
    try:
        while current is not None:
            resolved = current.resolve()
            if resolved in chain:
                cycle = " -> ".join(p.stem for p in [*chain, resolved])
                raise ProfileError(f"{path}: extends: cycle {cycle}")
            chain.append(resolved)
            data = _read_yaml(current)
            problems += _raw_key_problems(current, data)
            layers.append(data)
            parent = data.get("extends")
            if not isinstance(parent, str) or not parent:
                current = None
                continue
            try:
                current = _resolve_parent(current, parent, cwd)
            except ProfileError as e:
                raise ProfileError(f"{current}: extends: {e}") from e
    except ProfileError as e:
        raise ProfileProblems([*problems, *problems_of(e)]) from e
    if problems:
        raise ProfileProblems(problems)
    merged: dict[str, Any] = {}
    for layer in reversed(layers):
        # A claim (`expect`) belongs to the file that makes it, never to the profiles extending it.
        merged = _merge(
            merged, {k: v for k, v in layer.items() if k != "extends" and (k != "expect" or layer is layers[0])}
        )
    return merged, chain


def _resolve_parent(child: Path, parent: str, cwd: Path | None) -> Path:
    # A parent beside the child wins, so a directory of profiles is self-contained wherever it lives.
    for ext in (".yaml", ".yml"):
        sibling = child.parent / f"{parent}{ext}"
        if NAME_RE.match(parent) and yamlfile.is_file(sibling):
            return sibling
    return resolve_path(parent, cwd)


def load(name_or_path: str, cwd: Path | None = None) -> Profile:
    """Load, merge and validate a profile; every error names the file and the field path."""
    path = resolve_path(name_or_path, cwd)
    merged, chain = _load_chain(path, cwd)
    return _build(path, merged, chain)


# What Profile.to_dict() writes besides the fields a profile file has.
_RESOLVED_ONLY = ("name", "source", "extends_chain")
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(Profile) if f.default is not dataclasses.MISSING}


def from_resolved(data: Mapping[str, Any], source: str) -> Profile:
    """A resolved profile as stored with an experiment (`Profile.to_dict()`, e.g. from a result bundle) back as a
    Profile, through the same validation as a file; errors name `source` and the field."""
    where = Path(source)
    if not isinstance(data, Mapping):
        raise ProfileError(f"{source}: expected a mapping of profile fields, got {show(data)}")
    known = (*_RESOLVED_ONLY, *(k for k in ALL_TOP_KEYS if k != "extends"))
    for key in data:
        if key not in known:
            raise ProfileError(f"{source}: {key_name(key)}: unknown field{did_you_mean(str(key), known)}")
    name = data.get("name")
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise ProfileError(f"{source}: name: expected a profile name ({NAME_RULE}), got {show(name)}")
    chain = data.get("extends_chain", [name])
    if not isinstance(chain, list) or not all(isinstance(c, str) for c in chain):
        raise ProfileError(f"{source}: extends_chain: expected a list of profile names, got {show(chain)}")
    # to_dict() writes every field, unset ones as null or (tp_size, trust_remote_code) as their defaults, even for
    # an engine that takes no such field: a file would leave them out.
    raw = {k: v for k, v in data.items() if k not in _RESOLVED_ONLY and v is not None}
    engine_name = raw.get("engine")
    if isinstance(engine_name, str) and engine_name in engines.names():
        takes = engines.get(engine_name).fields
        for key in OPTIONAL_FIELDS:
            if key in raw and key not in takes and raw[key] == _DEFAULTS.get(key):
                del raw[key]
    if isinstance(raw.get("speculative"), Mapping):
        raw["speculative"] = {k: v for k, v in raw["speculative"].items() if v is not None}
    _check_raw_keys(where, raw)
    built = _build(where, raw, [])
    return dataclasses.replace(built, name=name, source=source, chain=tuple(chain))


def _build(path: Path, data: dict[str, Any], chain: list[Path]) -> Profile:
    problems: list[str] = []
    values: dict[str, Any] = {}
    for key, checker in TOP_FIELDS.items():
        if key in data:
            try:
                values[key] = checker(data[key])
            except FieldError as e:
                problems.append(f"{path}: {key}: {e}")
    for key in REQUIRED:
        if key not in data:
            problems.append(f"{path}: {key}: required field is missing (set it here or in a profile it extends)")
    if "engine" not in values:
        raise ProfileProblems(problems)  # nothing past this point can be checked without the engine
    engine = engines.get(values["engine"])
    for key in OPTIONAL_FIELDS:
        if key == "nnodes" and key not in engine.fields:
            if values.get(key, 1) != 1:
                multi = [name for name in engines.names() if "nnodes" in engines.get(name).fields]
                problems.append(
                    f"{path}: nnodes: multi-node launches are supported only by engine: {' or '.join(multi)}, not "
                    f"{engine.name}; remove the field or set it to 1"
                    if multi
                    else f"{path}: nnodes: no engine here supports multi-node launches; remove the field or set it to 1"
                )
        elif key in values and key not in engine.fields:
            takes = ", ".join(sorted(engine.fields)) or "none of " + ", ".join(OPTIONAL_FIELDS)
            problems.append(
                f"{path}: {key}: not a field of {engine.name} profiles (of the engine-specific fields it takes: "
                f"{takes}); pass the engine's own flag in server_args instead"
            )
    for key in engine.required:
        if key not in data:
            problems.append(
                f"{path}: {key}: required field is missing for engine {engine.name} (set it here or in a profile "
                "it extends)"
            )

    spec: Speculative | None = None
    sim: tuple[tuple[str, float | int | str], ...] = ()
    env = tuple(sorted((k, _env_value(v)) for k, v in (data.get("env") or {}).items() if v is not None))
    try:
        spec = _build_spec(path, data.get("speculative"), engine)
    except ProfileError as e:
        problems += problems_of(e)
    try:
        sim = _build_sim(path, data.get("sim") or {}, dict(env))
    except ProfileError as e:
        problems += problems_of(e)

    for i, arg in enumerate(values.get("server_args", ())):
        flag = arg.split("=", 1)[0]
        if flag in engine.managed_flags:
            problems.append(
                f"{path}: server_args[{i}]: {key_name(flag)} is set by the field {engine.managed_flags[flag]!r}; "
                "set that field instead of passing the flag"
            )
    expect_raw = data.get("expect") or {}
    expect = Expect(**{k: EXPECT_FIELDS[k](v) for k, v in expect_raw.items() if v is not None}) if expect_raw else None
    if expect is not None and expect.ratio is not None and expect.vs is None:
        problems.append(f"{path}: expect.ratio: a claimed ratio needs expect.vs, the profile it is against")
    if problems:
        raise ProfileProblems(problems)
    return Profile(
        name=name_for(path.stem),
        source=str(path),
        chain=tuple(name_for(p.stem) for p in chain),
        speculative=spec,
        env=env,
        sim=sim,
        raw=data,
        expect=expect,
        **values,
    )


def _env_value(v: Any) -> str:
    # YAML turns 16777216 into an int and 1e3 into a float; the environment only has strings.
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def _build_spec(path: Path, raw: Any, engine: engines.Engine) -> Speculative | None:
    if raw is None:
        return None
    values: dict[str, Any] = {}
    for key, checker in SPEC_FIELDS.items():
        if key in raw:
            if key != "algorithm" and key not in engine.spec_fields:
                raise ProfileError(
                    f"{path}: speculative.{key}: not a field of {engine.name}'s speculative settings (it takes: "
                    f"{', '.join(['algorithm', *sorted(engine.spec_fields)])})"
                )
            try:
                values[key] = checker(raw[key])
            except FieldError as e:
                raise ProfileError(f"{path}: speculative.{key}: {e}") from None
    known = engine.spec_algorithms
    if "algorithm" not in values:
        raise ProfileError(
            f"{path}: speculative.algorithm: required when speculative is set ({engine.name}: {', '.join(known)})"
        )
    if values["algorithm"] not in known:
        algo = values["algorithm"]
        raise ProfileError(
            f"{path}: speculative.algorithm: {engine.name} has no algorithm {algo!r}{did_you_mean(algo, known)}; "
            f"expected one of {', '.join(known) or '(none: this engine has no speculative decoding)'}"
        )
    spec = Speculative(**values)
    problem = engine.check_speculative(spec)
    if problem is not None:
        raise ProfileError(f"{path}: speculative.{problem[0]}: {problem[1]}")
    return spec


def _sim_value(where: str, key: str, value: Any) -> float | int | str:
    """One `sim:` knob, checked by the simulator's own parser (bounds, fault specs) so it fails at load."""
    knob = SIM_KNOBS[key]
    if knob.type is str:
        if not isinstance(value, str):
            raise ProfileError(f"{where}: expected text, got {show(value)}")
    else:
        numeric_ok = isinstance(value, int) if knob.type is int else isinstance(value, int | float)
        if isinstance(value, bool) or not numeric_ok:
            raise ProfileError(f"{where}: expected {knob.describe_valid()}, got {show(value)}")
    try:
        read_knobs({knob.env: _env_value(value)})
    except ValueError as e:
        raise ProfileError(f"{where}: {e}") from None
    typed: float | int | str = value if knob.type is str else knob.type(value)
    return typed


def _build_sim(path: Path, raw: Mapping[str, Any], env: Mapping[str, str]) -> tuple[tuple[str, float | int | str], ...]:
    out: list[tuple[str, float | int | str]] = []
    for key, value in raw.items():
        if value is None:
            continue
        knob = SIM_KNOBS[key]
        if knob.env in env:
            # The sim block would silently win over env at launch; one place per knob keeps the profile honest.
            raise ProfileError(f"{path}: env.{knob.env}: the same simulator knob as sim.{key}; set it in one place")
        out.append((key, _sim_value(f"{path}: sim.{key}", key, value)))
    return tuple(sorted(out))


# What does not change the server that runs: where the profile came from and its prose.
_PROVENANCE = ("name", "source", "chain", "description", "raw")


def differing_fields(a: Profile, b: Profile) -> list[str]:
    """The fields in which two profiles would launch different servers (empty: the same server)."""
    names = [f.name for f in dataclasses.fields(Profile) if f.name not in _PROVENANCE]
    return [n for n in names if getattr(a, n) != getattr(b, n)]


def check_distinct_names(profiles: list[Profile]) -> None:
    """Arms are labelled by file stem; two different servers under one name would read as an A/A test."""
    first: dict[str, Profile] = {}
    for prof in profiles:
        other = first.setdefault(prof.name, prof)
        diff = differing_fields(other, prof)
        if diff:
            raise ProfileError(
                f"{other.source} and {prof.source} are both named {prof.name!r} but differ in "
                f"{', '.join(diff)}; an experiment labels arms by name, so this would look like an A/A test. "
                "Rename one of the files (the same profile twice is a real A/A test and is fine)"
            )


def validate_file(name_or_path: str, cwd: Path | None = None) -> Profile:
    """Validate one profile (the CLI's `profiles validate`): a file that exists, else a profile NAME looked up
    like any other; errors list every problem found (ProfileProblems)."""
    p = Path(name_or_path)
    if yamlfile.is_file(p):
        return load(str(p) if (p.suffix in (".yaml", ".yml") or os.sep in name_or_path) else f"./{name_or_path}", cwd)
    if p.suffix in (".yaml", ".yml") or os.sep in name_or_path:
        raise ProfileError(f"{name_or_path}: no such file")
    return load(name_or_path, cwd)
