"""Minimal HTTP/1.1 for the simulator: request parsing, keep-alive, Content-Length and chunked bodies."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

MAX_HEADER_BYTES = 64 * 1024
MAX_BODY_BYTES = 64 * 1024 * 1024
SERVER_HEADER = b"server: orch-sim (SIMULATED sglang)\r\n"

REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    411: "Length Required",
    413: "Payload Too Large",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


class HttpError(Exception):
    """A request we cannot parse; answered with status and then the connection is closed."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(kw_only=True)
class Request:
    method: str
    path: str
    query: str
    version: str
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""

    @property
    def keep_alive(self) -> bool:
        conn = self.headers.get("connection", "").lower()
        if self.version == "HTTP/1.0":
            return "keep-alive" in conn
        return "close" not in conn

    def json(self) -> Any:
        """The body parsed as JSON; HttpError(400) if it is not."""
        try:
            return json.loads(self.body.decode("utf-8") if self.body else "")
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise HttpError(400, f"request body is not valid JSON: {exc}") from None


async def read_request(
    reader: asyncio.StreamReader, idle_timeout: float, writer: asyncio.StreamWriter | None = None
) -> Request | None:
    """Read one request; None when the peer closed (or idled out) between requests."""
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=idle_timeout)
    except asyncio.IncompleteReadError as exc:
        if exc.partial.strip():
            raise HttpError(400, "incomplete request head") from None
        return None
    except asyncio.LimitOverrunError:
        raise HttpError(431, "request head too large") from None
    except (asyncio.TimeoutError, ConnectionError):
        return None
    try:
        text = head.decode("latin-1")
    except UnicodeDecodeError:  # pragma: no cover - latin-1 decodes any byte
        raise HttpError(400, "undecodable request head") from None
    lines = text.split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        raise HttpError(400, f"malformed request line {lines[0]!r}")
    method, target, version = parts
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep:
            raise HttpError(400, f"malformed header line {line!r}")
        headers[name.strip().lower()] = value.strip()
    path, _, query = target.partition("?")
    req = Request(method=method.upper(), path=unquote(path), query=query, version=version, headers=headers)
    if writer is not None and headers.get("expect", "").lower() == "100-continue":
        # curl waits a second for this before sending a large body.
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    if "chunked" in headers.get("transfer-encoding", "").lower():
        req.body = await _read_chunked(reader)
    elif "content-length" in headers:
        try:
            length = int(headers["content-length"])
        except ValueError:
            raise HttpError(400, "invalid Content-Length") from None
        if length < 0 or length > MAX_BODY_BYTES:
            raise HttpError(413, f"body of {length} bytes not accepted")
        try:
            req.body = await reader.readexactly(length)
        except asyncio.IncompleteReadError:
            raise HttpError(400, "body shorter than Content-Length") from None
    return req


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    body = bytearray()
    try:
        while True:
            size_line = await reader.readuntil(b"\r\n")
            size = int(size_line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                # Trailers (rare) end with an empty line.
                while (await reader.readuntil(b"\r\n")) != b"\r\n":
                    pass
                return bytes(body)
            if len(body) + size > MAX_BODY_BYTES:
                raise HttpError(413, "chunked body too large")
            body += await reader.readexactly(size)
            await reader.readexactly(2)
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
        raise HttpError(400, "malformed chunked body") from None


def response(
    status: int,
    body: bytes = b"",
    content_type: str | None = "application/json",
    keep_alive: bool = True,
) -> bytes:
    head = [f"HTTP/1.1 {status} {REASONS.get(status, 'Unknown')}\r\n".encode()]
    head.append(SERVER_HEADER)
    if content_type:
        head.append(f"content-type: {content_type}\r\n".encode())
    head.append(f"content-length: {len(body)}\r\n".encode())
    if not keep_alive:
        head.append(b"connection: close\r\n")
    head.append(b"\r\n")
    return b"".join(head) + body


def json_response(status: int, obj: Any, keep_alive: bool = True) -> bytes:
    return response(status, json.dumps(obj).encode(), "application/json", keep_alive)


def stream_head(keep_alive: bool = True) -> bytes:
    conn = b"" if keep_alive else b"connection: close\r\n"
    return (
        b"HTTP/1.1 200 OK\r\n" + SERVER_HEADER + b"content-type: text/event-stream; charset=utf-8\r\n"
        b"cache-control: no-cache\r\ntransfer-encoding: chunked\r\n" + conn + b"\r\n"
    )


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


LAST_CHUNK = b"0\r\n\r\n"
