"""What orch must know about a kind of inference server: its command line, readiness, profile fields, statistics."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol

from orchestrator.client.request import Wire, flatten, ids_text


class SpecSettings(Protocol):
    """What an engine reads of a profile's speculative settings (config.profile.Speculative)."""

    @property
    def algorithm(self) -> str: ...
    @property
    def draft_model_path(self) -> str | None: ...
    @property
    def num_steps(self) -> int | None: ...
    @property
    def eagle_topk(self) -> int | None: ...
    @property
    def num_draft_tokens(self) -> int | None: ...
    @property
    def prompt_lookup_min(self) -> int | None: ...
    @property
    def prompt_lookup_max(self) -> int | None: ...
    @property
    def engine_config(self) -> tuple[tuple[str, Any], ...]: ...


class ServerProfile(Protocol):
    """What an engine reads of a profile (config.profile.Profile). Engines sit below config, which validates a
    profile through them, so they name the shape they read instead of importing the class."""

    @property
    def name(self) -> str: ...
    @property
    def source(self) -> str: ...
    @property
    def engine(self) -> str: ...
    @property
    def model_path(self) -> str: ...
    @property
    def port(self) -> int: ...
    @property
    def tp_size(self) -> int: ...
    @property
    def host(self) -> str: ...
    @property
    def served_model_name(self) -> str | None: ...
    @property
    def trust_remote_code(self) -> bool: ...
    @property
    def mem_fraction_static(self) -> float | None: ...
    @property
    def speculative(self) -> SpecSettings | None: ...
    @property
    def server_args(self) -> tuple[str, ...]: ...
    @property
    def attach(self) -> str | None: ...
    @property
    def env(self) -> tuple[tuple[str, str], ...]: ...


# The OpenAI API's endpoints, which every engine here serves (Engine.wire's default).
OPENAI_PATHS = MappingProxyType({"completions": "/v1/completions", "chat": "/v1/chat/completions"})


def openai_body(endpoint: str, item: Mapping[str, Any], max_tokens: int, model: str) -> dict[str, Any]:
    """One streamed OpenAI-API request (Engine.request_body's default): exactly max_tokens (ignore_eos, which vLLM,
    SGLang and llama.cpp all take), greedy; cumulative usage in every chunk (continuous_usage_stats), so multi-token
    chunks are counted exactly. A token-id prompt goes as ids to completions, as text to chat."""
    common = {
        "model": model,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    if endpoint == "completions":
        prompt: Any = (
            item["input_ids"]
            if item.get("input_ids") is not None
            else (item.get("text") or flatten(list(item.get("messages") or [])))
        )
        return {**common, "prompt": prompt}
    if endpoint == "chat":
        messages = item.get("messages") or [{"role": "user", "content": item.get("text") or ids_text(dict(item))}]
        return {**common, "messages": messages}
    raise ValueError(f"{endpoint!r} is no OpenAI API endpoint; expected one of {', '.join(OPENAI_PATHS)}")


# Where orch's simulator answers its version and knobs as JSON, whatever engine it plays (the fingerprint's sim_knobs).
SIMULATOR_INFO_PATH = "/server_info"

# Top-level profile fields only some engines take; every engine takes the rest (model_path, host, port, env...).
OPTIONAL_FIELDS = ("served_model_name", "tp_size", "trust_remote_code", "mem_fraction_static", "nnodes")
# speculative.* fields only some engines take (algorithm is always there).
OPTIONAL_SPEC_FIELDS = (
    "draft_model_path",
    "num_steps",
    "eagle_topk",
    "num_draft_tokens",
    "prompt_lookup_min",
    "prompt_lookup_max",
    "engine_config",
)


@dataclass(frozen=True)
class Probe:
    """One HTTP request whose 200 means "ready" (JSON-able: the host-side agent sends it next to the server).

    A generation probe (a body) must also answer with a JSON object that carries no `error`. `gate`: a cheap GET
    polled first while the server answers "not yet" (llama.cpp's /health during loading), so a long load is not a
    stream of generation requests in the server's log."""

    method: str
    path: str
    body: Mapping[str, Any] | None = None
    gate: str | None = None

    @property
    def label(self) -> str:
        return f"{self.method} {self.path}" if self.body is not None else self.path

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.method, "path": self.path, "body": dict(self.body or {}) or None, "gate": self.gate}


@dataclass(frozen=True, kw_only=True)
class SpecCounters:
    """Speculative decoding over one run, read from an engine's own counters (deltas across the run)."""

    accept_length: float  # tokens per verify (target forward) pass
    acceptance_rate: float | None  # accepted draft tokens / drafted tokens
    drafted: float | None
    accepted: float | None
    source: str
    drafts: float | None = None  # drafts proposed (one per verify pass that drafted)
    per_position: tuple[float, ...] | None = None  # accepted tokens at draft position 1, 2, … (where reported)


@dataclass(frozen=True, kw_only=True)
class CacheFlush:
    """How `--flush-cache` keeps one timed run from finding prompts an earlier run left in the prefix cache.

    `request`: sent just before each timed run (in the call that carries the run), a 2xx meaning the cache is empty;
    `enable`: what makes the server serve it, said when it answers 404 (never a silent no-op). `body`: fields put in
    every timed request instead, for an engine whose cache cannot be emptied from outside (no request reuses it)."""

    request: Probe | None = None
    enable: str | None = None
    body: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    # What the flush does, in the words a report or an error uses.
    means: str = ""
    # A variable (name, value) a launched server needs in its env for `request` to be served: checked before any
    # launch, so a profile without it is refused then rather than after a launch's load and warmups.
    needs_env: tuple[str, str] | None = None


class Engine(ABC):
    """One engine adapter. Nothing outside the adapter branches on an engine's name: the run loop, the benchmark
    and the reports ask the adapter."""

    name: str
    # How its makers write its name, for the reader (a profile says `engine: NAME`); the name when unset.
    title: str = ""
    # The endpoint whose 200 means "ready to serve" (not merely "the port is open").
    health_path: str
    # Variables the engine rewrites in its workers, so a profile value for them is not what the workers get: the
    # env read-back explains such a mismatch instead of calling it a failure of the profile.
    env_overrides: Mapping[str, str]
    # Prefixes of the variables it reads (SGLANG_...): the env read-back reports them from every worker beside the
    # profile's own, as it does the runtime's (agent/ops.RUNTIME_PREFIXES: NCCL_, CUDA_, ...).
    env_prefixes: tuple[str, ...] = ()
    # Packages whose versions decide the server's speed, as the server's interpreter imports them (fingerprint).
    packages: tuple[str, ...]
    # The package whose version is the engine's version (None: only the server itself can say).
    version_package: str | None
    # What it runs on whose version the host facts and `orch hosts check` record beside version_package (torch for
    # a GPU engine): read from package metadata, cheap, and something two sessions' numbers may differ by.
    runtime_packages: tuple[str, ...] = ()
    # A script the server's interpreter runs for the fingerprint that prints one line `ORCH_PROBE {"build": {...}}`:
    # how the engine was built (for a CPU engine, the instruction sets its kernels were compiled for). None: nothing
    # to read beyond the packages' versions.
    build_probe: str | None = None
    # Which of OPTIONAL_FIELDS a profile of this engine may set, and which of them it must.
    fields: frozenset[str] = frozenset()
    required: tuple[str, ...] = ()
    # speculative.algorithm values (the engine's own spelling) and which OPTIONAL_SPEC_FIELDS it takes.
    spec_algorithms: tuple[str, ...] = ()
    spec_fields: frozenset[str] = frozenset()
    # Draft steps per cycle when a profile leaves speculative.num_steps unset (the engine's own default).
    default_spec_steps: int = 3
    # Flags a profile field owns: repeating them in server_args would make two sources of truth.
    managed_flags: Mapping[str, str] = MappingProxyType({})
    # The benchmark endpoints (client.request.ENDPOINT_NAMES) the engine serves; the first is the default.
    endpoints: tuple[str, ...] = ("completions", "chat")
    # Whether orch ships a simulator of this engine (`--sim`).
    simulated: bool = False
    # How --flush-cache empties its prefix cache before each timed run (None: it cannot, and --flush-cache is refused).
    cache_flush: CacheFlush | None = None
    # Where the server reports its settings (and maybe its version) as one JSON object, tried in order (GET): the
    # fingerprint's server_info, and the simulator's knobs. (): it has no such endpoint, and orch asks nothing.
    info_paths: tuple[str, ...] = ()
    # Where it answers {"version": ...} (GET), asked of an attached server whose info did not say (None: nowhere).
    version_path: str | None = None

    @property
    def fact_packages(self) -> tuple[str, ...]:
        """The packages whose versions the host facts record for it: its own, then what it runs on."""
        return (*((self.version_package,) if self.version_package else ()), *self.runtime_packages)

    def version_of(self, info: Mapping[str, Any]) -> str | None:
        """The version in what its info or version path answered (a JSON object): by default its "version"."""
        version = info.get("version")
        return version if isinstance(version, str) else None

    def info_paths_of(self, simulated: bool) -> tuple[str, ...]:
        """Where a launch reports its settings: the engine's info paths, and for orch's simulator of it also the
        simulator's own (SIMULATOR_INFO_PATH), which always answers with its version and knobs."""
        if simulated and SIMULATOR_INFO_PATH not in self.info_paths:
            return (*self.info_paths, SIMULATOR_INFO_PATH)
        return self.info_paths

    # Its /metrics counters of (cached prompt tokens, prompt tokens), read as deltas across a run for its prefix
    # cache's hit rate where the responses did not say (None: it has none).
    cache_counters: tuple[str, str] | None = None
    # Where it serves its counters as Prometheus text, read before and after every run (None: it has none), and
    # which metric names a run keeps the deltas of (None: every counter named `*_total`, as Prometheus names them).
    metrics_path: str | None = "/metrics"
    counters: tuple[str, ...] | None = None

    def wire(self, endpoint: str) -> Wire:
        """How the client speaks to this engine on one of its endpoints (client.request.ENDPOINT_NAMES): by default
        the OpenAI API's path and chunk stream, and this engine's counters. An engine with a native endpoint says
        how it is spoken."""
        if endpoint not in OPENAI_PATHS:
            raise ValueError(f"{self.name} has no {endpoint!r} endpoint; it serves {', '.join(self.endpoints)}")
        return Wire(path=OPENAI_PATHS[endpoint], metrics_path=self.metrics_path, counters=self.counters)

    def request_body(self, endpoint: str, item: Mapping[str, Any], max_tokens: int, model: str) -> dict[str, Any]:
        """One streamed benchmark request: exactly max_tokens generated (never stopping early at EOS), greedy; the
        prompt is the item's `text`, `messages` or `input_ids`. By default the OpenAI API's (openai_body)."""
        return openai_body(endpoint, item, max_tokens, model)

    def ready_probe(self, profile: ServerProfile) -> Probe:
        """What says a server orch launched is ready. Default: its health endpoint answers 200; engines that can
        answer a real 1-token generation say so here (ready = a real generation succeeded)."""
        return Probe("GET", self.health_path)

    def health_probe(self, profile: ServerProfile) -> Probe:
        """The check before repeating a failed run and of an attached server (whose served model orch may not know):
        by default the health endpoint."""
        return Probe("GET", self.health_path)

    @abstractmethod
    def server_flags(self, profile: ServerProfile) -> list[str]:
        """The server's flags for a profile, as an argv list (never a shell string)."""

    @abstractmethod
    def launch_argv(self, profile: ServerProfile, python: str, *, simulate: bool) -> list[str]:
        """The whole command line: the engine itself, or orch's simulator of it (same flags)."""

    def node_flags(self, nnodes: int, rank: int, init_addr: str) -> list[str]:
        """The flags that make one launch node `rank` of an `nnodes`-node server (engines whose profiles take
        `nnodes`); the rest of the command line is the same on every node."""
        raise NotImplementedError(f"{self.name} has no multi-node launches")

    def rank_probe(self) -> Probe:
        """What says a node of rank >= 1 is up (it serves no API of its own)."""
        return Probe("GET", self.health_path)

    def check_speculative(self, spec: SpecSettings) -> tuple[str, str] | None:
        """(field, why) when a speculative block is valid field by field but not as a whole for this engine."""
        return None

    def spec_from_counters(self, deltas: Mapping[str, float]) -> SpecCounters | None:
        """Speculative statistics from /metrics counter deltas across one run; None when the engine reported none."""
        return None

    def spec_steps(self, spec: Mapping[str, Any]) -> int:
        """Draft steps per speculative cycle, from a stored profile's `speculative` block."""
        return int(spec.get("num_steps") or self.default_spec_steps)


def spec_decode_counters(deltas: Mapping[str, float], prefix: str, what: str) -> SpecCounters | None:
    """vLLM's spec_decode_* counters (llama.cpp exports the same four under its own prefix): acceptance length is
    1 + accepted / drafts (each draft is one verify pass that also yields the target's own token)."""
    drafts = deltas.get(f"{prefix}spec_decode_num_drafts_total")
    if not drafts or drafts <= 0:
        return None
    accepted = max(deltas.get(f"{prefix}spec_decode_num_accepted_tokens_total", 0.0), 0.0)
    drafted = deltas.get(f"{prefix}spec_decode_num_draft_tokens_total")
    per_pos = f"{prefix}spec_decode_num_accepted_tokens_per_pos_total["
    positions = sorted((int(k[len(per_pos) : -1]), v) for k, v in deltas.items() if k.startswith(per_pos))
    if [i for i, _ in positions] != list(range(len(positions))):
        positions = []  # a gap (a series missing from one scrape): no per-position figures rather than wrong ones
    return SpecCounters(
        accept_length=1.0 + accepted / drafts,
        acceptance_rate=accepted / drafted if drafted else None,
        drafted=drafted,
        accepted=accepted,
        source=f"metrics ({what} counter deltas across this run)",
        drafts=drafts,
        per_position=tuple(max(v, 0.0) for _, v in positions) or None,
    )
