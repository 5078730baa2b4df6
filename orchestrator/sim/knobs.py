"""The simulator's tuning knobs (ORCH_SIM_* environment variables) and fault specs, with validation."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

ENV_PREFIX = "ORCH_SIM_"

# Root of a^3 + a^2 + a - 1 = 0: the per-token acceptance that gives a mean accept length of exactly 2.0
# for 3 draft steps under the chain model (1 + a + a^2 + a^3 = 2).
ALPHA_TAU2_K3 = 0.5436890126920764


@dataclass(frozen=True, kw_only=True)
class Knob:
    """One simulator knob: its profile key, type, default, help text and inclusive bounds."""

    name: str
    type: type
    default: float | int | str | None
    help: str
    minimum: float | None = None
    maximum: float | None = None

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()

    def describe_valid(self) -> str:
        """What a valid value looks like, for error messages."""
        kind = {float: "a number", int: "an integer", str: "a string"}.get(self.type, self.type.__name__)
        parts = [kind]
        if self.minimum is not None and self.maximum is not None:
            parts.append(f"between {_fmt(self.minimum)} and {_fmt(self.maximum)}")
        elif self.minimum is not None:
            parts.append(f">= {_fmt(self.minimum)}")
        elif self.maximum is not None:
            parts.append(f"<= {_fmt(self.maximum)}")
        return " ".join(parts)


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


_KNOB_LIST: tuple[Knob, ...] = (
    Knob(
        name="load_s",
        type=float,
        default=2.0,
        help="seconds the workers take to 'load weights' (port closed meanwhile)",
        minimum=0.0,
        maximum=3600.0,
    ),
    Knob(
        name="warmup_s",
        type=float,
        default=1.0,
        help="seconds of warmup after the port opens (health 503 meanwhile)",
        minimum=0.0,
        maximum=3600.0,
    ),
    Knob(
        name="decode_ms",
        type=float,
        default=12.2,
        help="per-iteration decode time at batch 1 without speculation",
        minimum=0.01,
        maximum=10000.0,
    ),
    Knob(
        name="draft_ms",
        type=float,
        default=1.0,
        help="time of one draft step under speculation",
        minimum=0.0,
        maximum=10000.0,
    ),
    Knob(
        name="verify_base_ms",
        type=float,
        default=26.0,
        help="fixed part of one verify pass",
        minimum=0.0,
        maximum=10000.0,
    ),
    Knob(
        name="verify_per_token_ms",
        type=float,
        default=1.0,
        help="verify cost per draft token (x num_draft_tokens)",
        minimum=0.0,
        maximum=10000.0,
    ),
    Knob(
        name="accept_alpha",
        type=float,
        default=ALPHA_TAU2_K3,
        help="per-draft-token acceptance probability (chain model); default gives accept length 2.0 at 3 steps",
        minimum=0.0,
        maximum=1.0,
    ),
    Knob(
        name="batch_slope",
        type=float,
        default=0.02,
        help="iteration time grows by this fraction per extra running request",
        minimum=0.0,
        maximum=10.0,
    ),
    Knob(
        name="verify_batch_ms",
        type=float,
        default=0.75,
        help="under speculation, verify time added per draft token of each running request beyond the first (the "
        "compute batched drafts take); 0: speculation batches like the baseline",
        minimum=0.0,
        maximum=10000.0,
    ),
    Knob(
        name="prefill_ms",
        type=float,
        default=15.0,
        help="fixed cost of one prefill iteration (per chunk)",
        minimum=0.0,
        maximum=100000.0,
    ),
    Knob(
        name="prefill_per_token_ms",
        type=float,
        default=0.05,
        help="prefill cost per prompt token",
        minimum=0.0,
        maximum=1000.0,
    ),
    Knob(
        name="launch_noise",
        type=float,
        default=0.01,
        help="sigma of the lognormal speed factor drawn once per launch",
        minimum=0.0,
        maximum=1.0,
    ),
    Knob(
        name="slowdown",
        type=float,
        default=1.0,
        help="every simulated time is multiplied by this (1.06: the whole server 6 % slower)",
        minimum=0.1,
        maximum=10.0,
    ),
    Knob(
        name="jitter", type=float, default=0.002, help="sigma of the per-iteration time noise", minimum=0.0, maximum=0.5
    ),
    Knob(
        name="eos_prob",
        type=float,
        default=0.002,
        help="per-token EOS probability when ignore_eos is false",
        minimum=0.0,
        maximum=1.0,
    ),
    Knob(
        name="drain_s",
        type=float,
        default=2.0,
        help="on SIGTERM, how long in-flight requests may finish before being aborted",
        minimum=0.0,
        maximum=3600.0,
    ),
    Knob(
        name="seed",
        type=int,
        default=None,
        help="seeds every random draw; unset: drawn at random and logged",
        minimum=0.0,
        maximum=float(2**63 - 1),
    ),
    Knob(name="fault", type=str, default=None, help="comma-separated faults to inject (see FAULTS)"),
    Knob(
        name="fault_node_rank",
        type=int,
        default=None,
        help="multi-node: inject `fault` on this node rank only (unset: on every rank)",
        minimum=0.0,
        maximum=1023.0,
    ),
    Knob(
        name="drop_env",
        type=str,
        default=None,
        help="comma-separated env var names removed from the workers' environment",
    ),
    Knob(
        name="version",
        type=str,
        default=None,
        help="the engine version the server reports (GET /server_info); unset: the simulated 0.5.9",
    ),
    Knob(
        name="gpu_slowdown",
        type=str,
        default=None,
        help="per GPU model, 'SUBSTRING=FACTOR,...': the server is FACTOR slower on a GPU whose nvidia-smi name "
        "contains it",
    ),
    Knob(
        name="slowdown_file",
        type=str,
        default=None,
        help="a file holding a factor read at startup, like slowdown (missing: 1.0); the knob is fingerprinted, the "
        "file's content is not: a change no fingerprint can see (a degraded GPU, a busy neighbour)",
    ),
    Knob(
        name="diverge_after",
        type=int,
        default=None,
        help="under speculation, every greedy (temperature 0) request's tokens from this position on differ from the "
        "baseline's (a broken drafter, for orch ab --check-outputs); unset: speculation is lossless",
        minimum=0.0,
        maximum=float(2**31),
    ),
    Knob(
        name="prefix_cache_entries",
        type=int,
        default=0,
        help="prompts kept in a simulated prefix cache (least recently used evicted; 0: off): a repeated prompt "
        "prefills only its last token, a prompt sharing leading 64-character blocks with a cached one skips "
        "that share, as does the longest prefix held at a message (chat) or line (text) boundary (a chat's "
        "reply is kept with its conversation once generated: a next turn that sends it back finds it); both "
        "count as cached_tokens (meta_info, sglang:cached_tokens_total; vLLM mode: "
        "vllm:prefix_cache_hits_total of vllm:prefix_cache_queries_total); emptied by POST /flush_cache (vLLM "
        "mode: /reset_prefix_cache with VLLM_SERVER_DEV_MODE=1)",
        minimum=0.0,
        maximum=1e6,
    ),
    Knob(
        name="escape_linger_s",
        type=float,
        default=600.0,
        help="max lifetime of a process escaped by the escape-setsid, escape-double-fork or reexec-no-marker fault",
        minimum=0.0,
        maximum=86400.0,
    ),
)

KNOBS: dict[str, Knob] = {k.name: k for k in _KNOB_LIST}

# name -> (takes an integer argument, description)
FAULTS: dict[str, tuple[bool, str]] = {
    "exit-during-load": (False, "scheduler rank 0 dies while loading; the server exits 1 and never opens its port"),
    "hang-during-load": (False, "scheduler rank 0 never finishes loading; the port never opens"),
    "die-after-tokens": (True, "the server process hard-exits after N generated tokens in total (mid-stream)"),
    "ignore-sigterm": (False, "the main process ignores SIGTERM; only SIGKILL stops it"),
    "escape-setsid": (False, "one scheduler calls setsid() and outlives the server (until SIGKILL or escape_linger_s)"),
    "worker-hang-after-tokens": (
        True,
        "scheduler rank 0 hard-exits after N generated tokens; the server keeps its port but never generates again",
    ),
    "escape-double-fork": (
        False,
        "scheduler rank 0 double-forks a setsid'd grandchild (reparented, marker kept) that ignores SIGTERM",
    ),
    "reexec-no-marker": (
        False,
        "when told to stop, the detokenizer setsid()s and re-execs without ORCH_LAUNCH_ID, keeping its PID",
    ),
}

# Both *-after-tokens faults decide how the token stream ends; together the outcome would hinge on which N is lower.
_CONFLICTS = ({"exit-during-load", "hang-during-load"}, {"die-after-tokens", "worker-hang-after-tokens"})

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")


def parse_fault(spec: str) -> list[tuple[str, int | None]]:
    """Parse 'name[:N],name...' into [(name, N or None)]; raise ValueError with a readable message."""
    out: list[tuple[str, int | None]] = []
    seen: set[str] = set()
    valid = ", ".join(f"{n}:N" if takes else n for n, (takes, _) in FAULTS.items())
    for raw in spec.split(","):
        item = raw.strip()
        if not item:
            continue
        name, sep, arg = item.partition(":")
        name = name.strip()
        if name not in FAULTS:
            raise ValueError(f"unknown fault {name!r} in {spec!r}; valid faults: {valid}")
        if name in seen:
            raise ValueError(f"fault {name!r} given twice in {spec!r}")
        takes_arg = FAULTS[name][0]
        value: int | None = None
        if takes_arg:
            if not sep or not arg.strip():
                raise ValueError(f"fault {name!r} needs a token count, e.g. '{name}:100'")
            try:
                value = int(arg.strip())
            except ValueError:
                raise ValueError(f"fault {name!r}: {arg.strip()!r} is not an integer token count") from None
            if value < 1:
                raise ValueError(f"fault {name!r}: token count must be >= 1, got {value}")
        elif sep:
            raise ValueError(f"fault {name!r} takes no argument, got {item!r}")
        seen.add(name)
        out.append((name, value))
    for group in _CONFLICTS:
        if group <= seen:
            raise ValueError(f"faults {' and '.join(sorted(group))} cannot be combined")
    return out


def parse_gpu_slowdown(spec: str) -> list[tuple[str, float]]:
    """'H100=1.06,A100=1.5' -> [('H100', 1.06), ('A100', 1.5)]; ValueError with a readable message."""
    out = []
    for item in (p.strip() for p in spec.split(",")):
        if not item:
            continue
        name, sep, factor = item.partition("=")
        try:
            value = float(factor)
        except ValueError:
            value = float("nan")
        if not sep or not name.strip() or not 0.1 <= value <= 10.0:
            raise ValueError(f"expected SUBSTRING=FACTOR items (FACTOR 0.1 to 10), e.g. 'H100=1.06', got {item!r}")
        out.append((name.strip(), value))
    return out


def _parse_value(knob: Knob, raw: str) -> float | int | str | None:
    text = raw.strip()
    if text == "":
        # An exported-but-empty variable means "unset", so a profile can leave a knob blank.
        return knob.default
    value: float | int | str
    if knob.type is str:
        if knob.name == "fault":
            try:
                parse_fault(text)
            except ValueError as exc:
                raise ValueError(f"{knob.env}={raw!r} is invalid: {exc}") from None
        elif knob.name == "gpu_slowdown":
            try:
                parse_gpu_slowdown(text)
            except ValueError as exc:
                raise ValueError(f"{knob.env}={raw!r} is invalid: {exc}") from None
        elif knob.name == "drop_env":
            bad = [n for n in (p.strip() for p in text.split(",")) if n and not _ENV_NAME.match(n)]
            if bad:
                raise ValueError(
                    f"{knob.env}={raw!r} is invalid: {', '.join(map(repr, bad))} "
                    "is not an environment variable name; expected comma-separated names like NCCL_PROTO,FOO"
                )
        return text
    if knob.type is int:
        try:
            value = int(text, 10)
        except ValueError:
            raise ValueError(f"{knob.env}={raw!r} is invalid: expected {knob.describe_valid()}") from None
    else:
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"{knob.env}={raw!r} is invalid: expected {knob.describe_valid()}") from None
        if not math.isfinite(value):
            raise ValueError(f"{knob.env}={raw!r} is invalid: expected a finite number, {knob.describe_valid()}")
    if (knob.minimum is not None and value < knob.minimum) or (knob.maximum is not None and value > knob.maximum):
        raise ValueError(f"{knob.env}={raw!r} is out of range: expected {knob.describe_valid()}")
    return value


def read_knobs(environ: Mapping[str, str]) -> dict[str, float | int | str | None]:
    """Read every ORCH_SIM_* variable from environ (defaults for missing ones); raise ValueError on bad ones."""
    by_env = {k.env: k for k in KNOBS.values()}
    unknown = sorted(name for name in environ if name.startswith(ENV_PREFIX) and name not in by_env)
    if unknown:
        # A misspelt knob would silently leave the default in place and skew a benchmark, so refuse it.
        raise ValueError(f"unknown simulator knob {', '.join(unknown)}; valid variables: {', '.join(sorted(by_env))}")
    out: dict[str, float | int | str | None] = {}
    for knob in KNOBS.values():
        raw = environ.get(knob.env)
        out[knob.name] = knob.default if raw is None else _parse_value(knob, raw)
    return out


def knob_faults(knobs: Mapping[str, float | int | str | None]) -> dict[str, int | None]:
    """The parsed fault knob as {name: argument}."""
    spec = knobs.get("fault")
    return dict(parse_fault(spec)) if isinstance(spec, str) else {}


def knob_float(knobs: Mapping[str, float | int | str | None], name: str) -> float:
    """A numeric knob as float (knob values are typed loosely because the dict mixes kinds)."""
    value = knobs[name]
    if isinstance(value, (int, float)):
        return float(value)
    raise TypeError(f"knob {name} is not numeric: {value!r}")
