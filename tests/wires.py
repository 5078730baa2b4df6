"""How tests that speak to a server directly (the client, the agent, a runner) speak: the built-in engines' wires
and request bodies (engines/base.Engine.wire, request_body), SGLang's for its native generate, vLLM's for the
OpenAI API's endpoints."""

from __future__ import annotations

from typing import Any

from orchestrator import engines
from orchestrator.client.request import Wire, with_markers

SPEAKER = {"generate": "sglang", "completions": "vllm", "chat": "vllm"}


def wire(endpoint: str) -> Wire:
    """The wire of the engine that speaks `endpoint` here."""
    return engines.get(SPEAKER[endpoint]).wire(endpoint)


def body(
    endpoint: str, item: dict[str, Any], max_tokens: int, model: str, *, keep_output: bool = False
) -> dict[str, Any]:
    """One request's body as that engine builds it, with the client's own markers (keep_output, a session's turn)."""
    built = engines.get(SPEAKER[endpoint]).request_body(endpoint, item, max_tokens, model)
    return with_markers(built, item, keep_output=keep_output)
