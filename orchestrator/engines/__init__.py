"""Engine adapters: one module per kind of inference server, registered here by name."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from orchestrator.client.request import ENDPOINT_NAMES
from orchestrator.engines.base import CacheFlush, Engine, Probe, ServerProfile
from orchestrator.engines.llamacpp import LlamaCpp
from orchestrator.engines.sglang import SGLang
from orchestrator.engines.vllm import VLLM
from orchestrator.errors import InputError, ProfileError
from orchestrator.fields import did_you_mean

_REGISTRY: dict[str, Engine] = {}


def register(engine: Engine) -> Engine:
    """Make an engine known by its name (profiles say `engine: NAME`); a later registration replaces an earlier."""
    _REGISTRY[engine.name] = engine
    return engine


def names() -> tuple[str, ...]:
    return tuple(_REGISTRY)


def get(name: str) -> Engine:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ProfileError(
            f"unknown engine {name!r}{did_you_mean(name, _REGISTRY)}; known: {', '.join(_REGISTRY)}"
        ) from None


def fact_packages(engine_names: Iterable[str] | None = None) -> tuple[str, ...]:
    """The packages the host facts record for these engines (every registered one by default): each engine's own,
    then what it runs on, each once, in that order."""
    out: dict[str, None] = {}
    for name in names() if engine_names is None else engine_names:
        out.update(dict.fromkeys(get(name).fact_packages))
    return tuple(out)


def endpoint_help() -> str:
    """--endpoint's help, from the registry: what each endpoint is on each engine that serves it, and its default."""
    ways = []
    for endpoint in ENDPOINT_NAMES:
        paths: dict[str, list[str]] = {}
        for name in names():
            if endpoint in get(name).endpoints:
                paths.setdefault(get(name).wire(endpoint).path, []).append(get(name).title or name)
        if paths:
            ways.append(f"{endpoint} (" + "; ".join(f"POST {p} on {', '.join(n)}" for p, n in paths.items()) + ")")
    defaults = "; ".join(f"{name}: {get(name).endpoints[0]}" for name in names())
    return f"{', '.join(ways)}. Default: the first one every arm's engine serves ({defaults})."


def simulated() -> tuple[str, ...]:
    """The engines orch ships a simulator of (`--sim`), by title ("SGLang")."""
    return tuple(get(name).title or name for name in names() if get(name).simulated)


def flush_help() -> str:
    """How --flush-cache empties each engine's prefix cache, from the registry (engines/base.CacheFlush)."""
    ways = []
    for name in names():
        flush = get(name).cache_flush
        if flush is not None:
            needs = f" (needs {flush.needs_env[0]}={flush.needs_env[1]} in the server's env)" if flush.needs_env else ""
            ways.append(f"{get(name).title or name}: {flush.means}{needs}")
    return "; ".join(ways)


def common_endpoint(engine_names: Sequence[str]) -> str:
    """The benchmark endpoint every given engine serves, the first engine's preference first."""
    served = [get(n).endpoints for n in engine_names]
    for endpoint in served[0] if served else ("generate",):
        if all(endpoint in s for s in served):
            return endpoint
    kinds = "; ".join(f"{n}: {', '.join(s)}" for n, s in zip(engine_names, served, strict=True))
    raise InputError(f"these engines share no benchmark endpoint ({kinds})")


def check_use(profiles: Sequence[ServerProfile], endpoint: str, *, simulate: bool, flush_cache: bool = False) -> None:
    """Refuse, before anything is launched, what a profile's engine cannot do: serve the endpoint, be simulated,
    keep a run from its predecessors' prefix cache (--flush-cache)."""
    for p in profiles:
        engine = get(p.engine)
        flush = engine.cache_flush if flush_cache else None
        if flush_cache and flush is None:
            raise InputError(
                f"{p.source}: engine {engine.name} has no way for orch to empty its prefix cache; drop --flush-cache"
            )
        # Where the engine serves its flush only when started with a variable, a launched server without it is
        # refused now (an attached one is the user's: its 404 says the same on the first timed run).
        if flush is not None and flush.needs_env is not None and p.attach is None:
            name, value = flush.needs_env
            if dict(p.env).get(name) != value:
                raise InputError(f"{p.source}: --flush-cache: its env does not set {name}={value}; {flush.enable}")
        if endpoint not in engine.endpoints:
            raise InputError(
                f"{p.source}: engine {engine.name} does not serve the {endpoint!r} endpoint; use --endpoint "
                f"{' or '.join(engine.endpoints)} (the workload's endpoint must be one every arm serves)"
            )
        if simulate and not engine.simulated and p.attach is None:
            raise InputError(
                f"{p.source}: orch has no simulator of {engine.name}; run it for real (drop --sim) on a host that "
                "has it"
            )


register(SGLang())
register(VLLM())
register(LlamaCpp())

__all__ = [
    "CacheFlush",
    "Engine",
    "Probe",
    "check_use",
    "common_endpoint",
    "endpoint_help",
    "fact_packages",
    "flush_help",
    "get",
    "names",
    "register",
    "simulated",
]
