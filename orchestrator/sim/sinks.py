"""The simulator's response writers: /generate's and the OpenAI API's answers, streamed as SSE or sent once."""

from __future__ import annotations

import asyncio
import json
import time
from typing import TYPE_CHECKING, Any

from orchestrator.sim.documents import generate_payload
from orchestrator.sim.engine import Req, Sink
from orchestrator.sim.httpio import LAST_CHUNK, chunk, json_response, response

if TYPE_CHECKING:
    from orchestrator.sim.server import SimServer


def openai_error(message: str, status: int = 400) -> dict[str, Any]:
    kind = {400: "BadRequestError", 404: "NotFoundError", 503: "ServiceUnavailableError"}.get(status, str(status))
    return {"object": "error", "message": message, "type": kind, "param": None, "code": status}


def _openai_finish(reason: dict[str, Any] | None) -> tuple[str | None, Any]:
    if reason is None:
        return None, None
    kind = str(reason.get("type"))
    return kind, reason.get("matched")


class _HttpSink(Sink):
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    def disconnected(self) -> bool:
        return self.writer.transport.is_closing() or self.reader.at_eof()

    def _data(self, payload: bytes) -> None:
        if not self.writer.transport.is_closing():
            self.writer.write(chunk(b"data: " + payload + b"\n\n"))

    def _done(self) -> None:
        if not self.writer.transport.is_closing():
            self.writer.write(chunk(b"data: [DONE]\n\n") + LAST_CHUNK)


class GenerateSink(_HttpSink):
    """Native /generate: cumulative text and output_ids; streamed as SSE or returned once."""

    def __init__(
        self, server: SimServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, stream: bool, keep: bool
    ) -> None:
        super().__init__(reader, writer)
        self.server = server
        self.stream = stream
        self.keep = keep

    def emit(self, req: Req) -> None:
        if self.stream:
            self._data(generate_payload(req, self.server.engine, final=False))

    def finish(self, req: Req) -> None:
        payload = generate_payload(req, self.server.engine, final=True)
        if self.stream:
            self._data(payload)
            self._done()
        elif not self.writer.transport.is_closing():
            self.writer.write(response(200, payload, "application/json", self.keep))


class OpenAISink(_HttpSink):
    """OpenAI /v1/completions and /v1/chat/completions: text deltas, optional usage chunk."""

    def __init__(
        self,
        server: SimServer,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        chat: bool,
        stream: bool,
        include_usage: bool,
        keep: bool,
        continuous_usage: bool = False,
    ) -> None:
        super().__init__(reader, writer)
        self.server = server
        self.chat = chat
        self.stream = stream
        self.include_usage = include_usage
        # stream_options.continuous_usage_stats (vLLM's name, also honoured by other OpenAI-compatible servers):
        # every chunk carries the cumulative usage, so a client can count the tokens in a multi-token chunk.
        self.continuous_usage = continuous_usage
        self.keep = keep
        self.created = int(time.time())
        self.role_sent = False

    def _chunk_obj(self, req: Req, choice: dict[str, Any]) -> bytes:
        obj = {
            "id": req.rid,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.server.cfg.served_model_name,
            "choices": [choice],
            "usage": self._usage(req) if self.continuous_usage else None,
        }
        return json.dumps(obj).encode()

    def _delta(self, content: str | None, role: str | None = None) -> dict[str, Any]:
        return {"role": role, "content": content, "reasoning_content": None, "tool_calls": None}

    def _take(self, req: Req) -> str:
        delta = req.text[req.sent_text :]
        req.sent_text = len(req.text)
        return delta

    def _role(self, req: Req) -> None:
        if self.chat and not self.role_sent:
            self.role_sent = True
            choice = {"index": 0, "delta": self._delta("", "assistant"), "logprobs": None, "finish_reason": None}
            self._data(self._chunk_obj(req, choice))

    def emit(self, req: Req) -> None:
        if not self.stream:
            return
        self._role(req)
        delta = self._take(req)
        if not delta:
            return
        if self.chat:
            choice = {"index": 0, "delta": self._delta(delta), "logprobs": None, "finish_reason": None}
        else:
            choice = {"index": 0, "text": delta, "logprobs": None, "finish_reason": None, self.server.stop_key: None}
        self._data(self._chunk_obj(req, choice))

    def _usage(self, req: Req) -> dict[str, Any]:
        return {
            "prompt_tokens": req.prompt_tokens,
            "completion_tokens": req.completion_tokens,
            "total_tokens": req.prompt_tokens + req.completion_tokens,
            # With the prefix cache on, its count (as SGLang's --enable-cache-report and vLLM's
            # --enable-prompt-tokens-details send it); None otherwise, as before.
            "prompt_tokens_details": {"cached_tokens": req.cached_tokens} if self._caching() else None,
        }

    def _caching(self) -> bool:
        engine = self.server.engine
        return engine is not None and engine.prefix_cache_entries > 0

    def finish(self, req: Req) -> None:
        reason, matched = _openai_finish(req.finish_reason)
        if not self.stream:
            self._finish_once(req, reason, matched)
            return
        self._role(req)
        delta = self._take(req)
        if self.chat:
            if delta:
                choice = {"index": 0, "delta": self._delta(delta), "logprobs": None, "finish_reason": None}
                self._data(self._chunk_obj(req, choice))
            choice = {
                "index": 0,
                "delta": self._delta(None),
                "logprobs": None,
                "finish_reason": reason,
                self.server.stop_key: matched,
            }
        else:
            stop = self.server.stop_key
            choice = {"index": 0, "text": delta, "logprobs": None, "finish_reason": reason, stop: matched}
        self._data(self._chunk_obj(req, choice))
        if self.include_usage:
            obj: dict[str, Any] = {
                "id": req.rid,
                "object": "chat.completion.chunk" if self.chat else "text_completion",
                "created": self.created,
                "model": self.server.cfg.served_model_name,
                "choices": [],
                "usage": self._usage(req),
            }
            self._data(json.dumps(obj).encode())
        self._done()

    def _finish_once(self, req: Req, reason: str | None, matched: Any) -> None:
        if self.chat:
            message = {"role": "assistant", "content": req.text, "reasoning_content": None, "tool_calls": None}
            choice = {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": reason,
                self.server.stop_key: matched,
            }
            obj_type = "chat.completion"
        else:
            choice = {
                "index": 0,
                "text": req.text,
                "logprobs": None,
                "finish_reason": reason,
                self.server.stop_key: matched,
            }
            obj_type = "text_completion"
        obj: dict[str, Any] = {
            "id": req.rid,
            "object": obj_type,
            "created": self.created,
            "model": self.server.cfg.served_model_name,
            "choices": [choice],
            "usage": self._usage(req),
        }
        if not self.writer.transport.is_closing():
            self.writer.write(json_response(200, obj, self.keep))
