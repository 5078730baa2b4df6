"""Engine adapters: one module per kind of inference server, registered here by name."""

from __future__ import annotations

from orchestrator.engines.base import Engine
from orchestrator.engines.sglang import SGLang
from orchestrator.errors import ProfileError
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


register(SGLang())

__all__ = ["Engine", "get", "names", "register"]
