"""The prefix cache emptied before a timed run (--flush-cache): one HTTP request to the server, retried while busy."""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Mapping
from typing import Any

# SGLang answers 400 "Cache not flushed" while a request still runs or waits (one the previous run cancelled may
# take a moment to leave); a busy answer is asked again for this long before the run is refused.
FLUSH_PATIENCE_S = 10.0
FLUSH_RETRY_S = 0.2
FLUSH_TIMEOUT_S = 30.0


def flush_cache(address: str, port: int, request: Mapping[str, Any]) -> dict[str, Any] | None:
    """Send `request` ({"method", "path"}) to the server; None once it answered 2xx, else what went wrong:
    {"method", "path", "status" (None: no answer), "body" (its first 300 characters, or the connection error)}.
    A 2xx whose JSON body says `"success": false` is a failure too. A 404 is never retried (the route is not
    there); other failures are, for FLUSH_PATIENCE_S."""
    method, path = str(request.get("method") or "POST"), str(request["path"])
    deadline = time.monotonic() + FLUSH_PATIENCE_S
    while True:
        status, body = _send(address, port, method, path)
        if status is not None and 200 <= status < 300 and not says_it_failed(body):
            return None
        if status == 404 or time.monotonic() >= deadline:
            return {"method": method, "path": path, "status": status, "body": body[:300]}
        time.sleep(FLUSH_RETRY_S)


def _send(address: str, port: int, method: str, path: str) -> tuple[int | None, str]:
    conn = http.client.HTTPConnection(address, port, timeout=FLUSH_TIMEOUT_S)
    try:
        conn.request(method, path, body=b"", headers={"Content-Length": "0"})
        answer = conn.getresponse()
        return answer.status, answer.read(4096).decode(errors="replace").strip()
    except (OSError, http.client.HTTPException) as e:
        return None, f"{type(e).__name__}: {e}"
    finally:
        conn.close()


def says_it_failed(body: str) -> bool:
    """A 2xx answer whose body is a JSON object with `"success": false`: vLLM's reset of the prefix cache answers
    so when the engine could not reset it (requests still running), where the status alone says OK."""
    try:
        answer = json.loads(body)
    except ValueError:
        return False
    return isinstance(answer, dict) and answer.get("success") is False
