"""The simulated scheduler: one asyncio loop that batches running requests and paces them by the timing model."""

from __future__ import annotations

import asyncio
import hashlib
import math
import random
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from typing import Any

from orchestrator.sim import logs
from orchestrator.sim.timing import TimingModel

EOS_TOKEN_ID = 2
TOKEN_BASE = 1000
# Output text is built from these words, one token each; plain ASCII so they need no JSON escaping.
_WORD_TEXT = """
the of and to in is that for it as was with be by on not he this are or his from at which but have
an they you were her she there been one all we their has would when if so no will more can other
into some could them than then its time only new these two may first also any like over such our
well after most made very where through back years way much just good before should people those
because each many under great same another still must between both life world work day long part
small place system model token server batch cache graph draft verify decode prefill kernel tensor
stream latency memory simulated throughput request response engine sample accept reject bonus step
layer weight
"""
WORDS: tuple[str, ...] = tuple(_WORD_TEXT.split())
HEALTH_CHECK_TIMEOUT_S = 20.0
MAX_TOTAL_TOKENS = 1_000_000
LATE_COUNT_S = 0.01
LATE_WARN_S = 0.25
LATE_RESET_S = 1.0


def count_text_tokens(text: str) -> int:
    """Deterministic stand-in tokenizer: about one token per word or per 4 characters of a long word."""
    return max(1, sum(max(1, math.ceil(len(w) / 4)) for w in text.split()))


def count_chat_tokens(messages: Sequence[Any]) -> int:
    """Prompt tokens of a chat: content tokens plus a few template tokens per message."""
    total = 3
    for m in messages:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list):
            content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        total += 4 + (count_text_tokens(content) if isinstance(content, str) and content.strip() else 0)
    return total


def greedy_token(key: bytes, position: int, shift: int = 0) -> int:
    """The token a greedy (temperature 0) request of this prompt generates at this position: a function of the
    prompt alone, as greedy decoding of one model is; `shift` moves it to another word (a diverging arm)."""
    digest = hashlib.blake2b(key + position.to_bytes(4, "little"), digest_size=8).digest()
    return TOKEN_BASE + (int.from_bytes(digest, "little") + shift) % len(WORDS)


def token_piece(token_id: int) -> str:
    if token_id == EOS_TOKEN_ID:
        return ""
    return " " + WORDS[(token_id - TOKEN_BASE) % len(WORDS)]


# Given which keys the prefix cache holds, the tokens of the longest shorter prefix of a prompt it holds (None: none).
PrefixHit = Callable[[Callable[[bytes], bool]], "int | None"]


class Sink:
    """Where a request's output goes; the scheduler calls it directly so no task wake-up per token is needed."""

    def emit(self, req: Req) -> None:
        """New tokens are available (request not finished)."""

    def finish(self, req: Req) -> None:
        """The request finished (length, stop or abort); called exactly once."""

    def disconnected(self) -> bool:
        return False


class Req:
    """One generation request and its cumulative output."""

    __slots__ = (
        "accepted_drafts",
        "cached_tokens",
        "created_mono",
        "created_wall",
        "decode_iters",
        "done",
        "finish_reason",
        "greedy",
        "ids_str",
        "ignore_eos",
        "kind",
        "max_new_tokens",
        "min_new_tokens",
        "output_ids",
        "prefix_blocks",
        "prefix_hit",
        "prompt_key",
        "prompt_tokens",
        "reply_key",
        "rid",
        "rng",
        "sent_text",
        "sink",
        "stop",
        "text",
        "verify_ct",
    )

    def __init__(
        self,
        prompt_tokens: int,
        max_new_tokens: int,
        *,
        min_new_tokens: int = 0,
        ignore_eos: bool = False,
        stop: Sequence[str] = (),
        kind: str = "user",
        sink: Sink | None = None,
        rid: str | None = None,
        greedy: bytes | None = None,
        prompt_key: bytes | None = None,
        prefix_hit: PrefixHit | None = None,
        reply_key: Callable[[str], tuple[bytes, int]] | None = None,
        prefix_blocks: tuple[bytes, ...] = (),
    ) -> None:
        self.rid = rid or uuid.uuid4().hex
        self.rng: random.Random | None = None  # a user request's own stream of draws (set on submission)
        self.prompt_key = prompt_key  # the simulated prefix cache's key (None: never cached)
        self.prefix_hit = prefix_hit  # ... and the longest shorter prefix held (sim/requests.PrefixHit)
        self.reply_key = reply_key  # the key and tokens of the prompt with its reply (kept when it finishes)
        self.prefix_blocks = prefix_blocks  # its prefixes block by block (sim/requests.prefix_blocks)
        self.cached_tokens = 0  # prompt tokens the prefix cache supplied (set at prefill)
        self.greedy = greedy  # a temperature-0 request's prompt key: its tokens follow from it (greedy_token)
        self.prompt_tokens = prompt_tokens
        self.max_new_tokens = max_new_tokens
        self.min_new_tokens = min_new_tokens
        self.ignore_eos = ignore_eos
        self.stop = tuple(s for s in stop if s)
        self.kind = kind
        self.sink = sink or Sink()
        self.created_wall = time.time()
        self.created_mono = time.monotonic()
        self.output_ids: list[int] = []
        self.ids_str = ""
        self.text = ""
        self.sent_text = 0
        self.verify_ct = 0
        self.accepted_drafts = 0
        self.decode_iters = 0
        self.finish_reason: dict[str, Any] | None = None
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    @property
    def completion_tokens(self) -> int:
        return len(self.output_ids)

    @property
    def e2e_latency(self) -> float:
        return time.monotonic() - self.created_mono


class SimEngine:
    """Batches all running requests in one loop; iteration times come from the timing model."""

    def __init__(
        self,
        model: TimingModel,
        rng: random.Random,
        *,
        max_running: int,
        stream_interval: int,
        decode_log_interval: int,
        cuda_graph: bool,
        cuda_graph_max_bs: int,
        die_after_tokens: int | None = None,
        on_crash: Callable[[int], None] | None = None,
        diverge_after: int | None = None,
        prefix_cache_entries: int = 0,
    ) -> None:
        self.model = model
        # The diverge_after knob: under speculation, greedy outputs leave the baseline's from this token on.
        self.diverge_after = diverge_after if model.spec is not None else None
        self.rng = rng
        # Each user request draws its tokens, EOS and accept lengths from a stream of its own, seeded from the
        # launch's seed and its place among user requests: the shared stream also feeds timing noise and health
        # checks (as many as the client's polls happened to be), so a seeded launch would not repeat its accept
        # lengths otherwise.
        self.request_seed = rng.getrandbits(64)
        self.user_submitted = 0
        self.max_running = max_running
        self.stream_interval = stream_interval
        self.decode_log_interval = decode_log_interval
        self.cuda_graph = cuda_graph
        self.cuda_graph_max_bs = cuda_graph_max_bs
        self.die_after_tokens = die_after_tokens
        self.on_crash = on_crash
        self.waiting: deque[Req] = deque()
        self.running: list[Req] = []
        self.prefilling: list[Req] = []
        self.wake = asyncio.Event()
        self.broken = False
        self.stopped = False
        self.crash_pending = False
        # Lifetime counters (Prometheus) and the decode-log window.
        self.gen_tokens_total = 0
        self.prompt_tokens_total = 0
        self.verify_calls_total = 0
        # The simulated prefix cache: whole prompts by digest, least recently used first (0 entries: off).
        # prompt key -> (prompt tokens, its prefix blocks), least recently used first; and how many cached prompts
        # hold each block (a block leaves with the last prompt that holds it).
        self.prefix_cache: OrderedDict[bytes, tuple[int, tuple[bytes, ...]]] = OrderedDict()
        self.cached_blocks: dict[bytes, int] = {}
        self.prefix_cache_entries = prefix_cache_entries
        self.cached_tokens_total = 0
        # vLLM's spec_decode counters: one draft per request per verify, its tokens, and the accepted ones by
        # position, as the rejection sampler counts them (before a max_tokens or EOS cut).
        self.spec_drafts_total = 0
        self.spec_draft_tokens_total = 0
        self.spec_accepted_total = 0
        self.spec_accepted_per_pos = [0] * (model.spec.depth if model.spec is not None else 0)
        self.user_tokens = 0
        self.decode_iterations = 0
        self.win_tokens = 0
        self.win_verify = 0
        self.win_start = time.monotonic()
        self.last_gen_throughput = 0.0
        self.last_accept_len = 0.0
        # The lifetime accept length as SGLang exposes it: folded in only when a decode line is logged.
        self.fold_tokens = 0
        self.fold_verify = 0
        self.last_receive = 0.0
        self.late_iterations = 0
        self.max_late_s = 0.0
        self._last_late_warn = 0.0

    # ---- submission -------------------------------------------------------------------------------------
    def busy(self) -> bool:
        return bool(self.running or self.waiting or self.prefilling)

    def submit(self, req: Req) -> None:
        if req.kind == "user":
            req.rng = random.Random(f"{self.request_seed}:{self.user_submitted}")
            self.user_submitted += 1
        self.waiting.append(req)
        self.wake.set()

    def abort_all(self, message: str) -> int:
        reqs = [*self.prefilling, *self.running, *self.waiting]
        self.prefilling = []
        self.running.clear()
        self.waiting.clear()
        for r in reqs:
            self._finish(r, {"type": "abort", "message": message})
        return len(reqs)

    # ---- token production ---------------------------------------------------------------------------------
    def _finish(self, req: Req, reason: dict[str, Any]) -> None:
        if req.done.done():
            return
        req.finish_reason = reason
        if self.prefix_cache_entries > 0 and req.reply_key is not None and req.kind == "user":
            self._cache_keep(*req.reply_key(req.text))  # the reply's tokens stay cached, as in a radix cache
        try:
            req.sink.finish(req)
        finally:
            req.done.set_result(None)

    def _append(self, req: Req, n: int, decode: bool) -> None:
        """Append up to n tokens, stopping at EOS, a stop string, max_new_tokens or the crash fault."""
        rng = req.rng or self.rng
        eos_prob = self.model.eos_prob
        for _ in range(n):
            if req.finish_reason is not None or self.crash_pending:
                return
            count = len(req.output_ids)
            if not req.ignore_eos and count >= req.min_new_tokens and eos_prob > 0 and rng.random() < eos_prob:
                tid = EOS_TOKEN_ID
            else:
                tid = TOKEN_BASE + rng.randrange(len(WORDS))  # drawn either way: the seeded stream stays the same
                if req.greedy is not None:
                    broken = self.diverge_after is not None and count >= self.diverge_after
                    tid = greedy_token(req.greedy, count, 1 if broken else 0)
            req.output_ids.append(tid)
            req.ids_str = f"{req.ids_str},{tid}" if req.ids_str else str(tid)
            if req.kind != "health":
                self.gen_tokens_total += 1
                if decode:
                    self.win_tokens += 1
            if req.kind == "user":
                self.user_tokens += 1
                if self.die_after_tokens is not None and self.user_tokens >= self.die_after_tokens:
                    self.crash_pending = True
            if tid == EOS_TOKEN_ID:
                req.finish_reason = {"type": "stop", "matched": EOS_TOKEN_ID}
                return
            req.text += token_piece(tid)
            if req.stop:
                tail = req.text[-(max(len(s) for s in req.stop) + 16) :]
                for s in req.stop:
                    if s in tail:
                        req.text = req.text[: req.text.rfind(s)]
                        req.finish_reason = {"type": "stop", "matched": s}
                        return
            if count + 1 >= req.max_new_tokens:
                req.finish_reason = {"type": "length", "length": req.max_new_tokens}
                return

    def _deliver(self, reqs: Sequence[Req], first: bool) -> None:
        self.last_receive = time.monotonic()
        for r in reqs:
            if r.finish_reason is not None:
                self._finish(r, r.finish_reason)
            elif first or r.decode_iters % self.stream_interval == 0:
                r.sink.emit(r)

    def _drop_disconnected(self) -> None:
        for queue in (self.running, self.waiting):
            gone = [r for r in queue if r.sink.disconnected()]
            for r in gone:
                queue.remove(r)
                logs.log(f"Abort request {r.rid} (client disconnected)", "debug")
                self._finish(r, {"type": "abort", "message": "client disconnected"})

    # ---- the loop -------------------------------------------------------------------------------------------
    async def _sleep_until(self, deadline: float) -> float:
        loop = asyncio.get_running_loop()
        delay = deadline - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
            return deadline
        late = -delay
        self.max_late_s = max(self.max_late_s, late)
        if late > LATE_COUNT_S:
            self.late_iterations += 1
        if late > LATE_WARN_S:
            now = time.monotonic()
            if now - self._last_late_warn > 10:
                self._last_late_warn = now
                logs.log(
                    f"simulator is running {late * 1000:.0f} ms behind its schedule: this host's CPU, not the "
                    "timing model, now limits the simulated throughput",
                    "warning",
                )
        await asyncio.sleep(0)
        # Catching up a long backlog would release a burst of tokens; restart the schedule instead.
        return loop.time() if late > LATE_RESET_S else deadline

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        next_t = loop.time()
        while not self.stopped:
            if self.broken or not (self.running or self.waiting):
                self.wake.clear()
                await self.wake.wait()
                next_t = loop.time()
                continue
            self._drop_disconnected()
            if self.waiting and len(self.running) < self.max_running:
                next_t = await self._prefill_step(next_t)
            elif self.running:
                next_t = await self._decode_step(next_t)
            else:
                next_t = loop.time()
            if self.crash_pending and self.on_crash is not None:
                self.on_crash(self.user_tokens)

    def _cache_lookup(self, req: Req) -> int:
        """Prompt tokens the prefix cache holds for this request, and the prompt stored for the next one; 0 when off.
        The same prompt again: all but its last token (which must be computed to give the first token, as in
        SGLang); another prompt: its leading blocks any cached prompt shares, as that share of its tokens."""
        if self.prefix_cache_entries <= 0 or req.prompt_key is None or req.kind != "user":
            return 0
        found = self.prefix_cache.pop(req.prompt_key, None)
        if found is not None:
            self._uncache(found[1])
            hit = min(found[0], req.prompt_tokens) - 1
        else:
            # Else the leading blocks a cached prompt shares (a shared system prompt), as that share of its tokens,
            # or the longest prefix held whole at a message or line boundary (a multi-turn session's earlier turn
            # with its reply), whichever is more.
            shared = 0
            for block in req.prefix_blocks:
                if block not in self.cached_blocks:
                    break
                shared += 1
            hit = req.prompt_tokens * shared // len(req.prefix_blocks) if req.prefix_blocks else 0
            if req.prefix_hit is not None and (prefix := req.prefix_hit(self.prefix_cache.__contains__)) is not None:
                hit = max(hit, prefix)
            hit = min(hit, req.prompt_tokens - 1)
        self._cache_keep(req.prompt_key, req.prompt_tokens, req.prefix_blocks)
        return max(0, hit)

    def _cache_keep(self, key: bytes, tokens: int, blocks: tuple[bytes, ...] = ()) -> None:
        """Hold a prompt (most recently used last), its blocks counted, evicting the least recently used past the
        knob's number of entries."""
        old = self.prefix_cache.pop(key, None)
        if old is not None:
            self._uncache(old[1])
        self.prefix_cache[key] = (tokens, blocks)
        for block in blocks:
            self.cached_blocks[block] = self.cached_blocks.get(block, 0) + 1
        while len(self.prefix_cache) > self.prefix_cache_entries:
            self._uncache(self.prefix_cache.popitem(last=False)[1][1])

    def _uncache(self, blocks: tuple[bytes, ...]) -> None:
        for block in blocks:
            left = self.cached_blocks.get(block, 0) - 1
            if left > 0:
                self.cached_blocks[block] = left
            else:
                self.cached_blocks.pop(block, None)

    def flush_prefix_cache(self) -> bool:
        """Empty the prefix cache (SGLang's /flush_cache, vLLM's /reset_prefix_cache); refused (False) while a
        request runs or waits, as SGLang refuses it."""
        if any(r.kind == "user" for r in (*self.running, *self.waiting, *self.prefilling)):
            return False
        self.prefix_cache.clear()
        self.cached_blocks.clear()
        return True

    def cache_hit_rate(self) -> float:
        """Lifetime cached / prompt tokens (SGLang's cache_hit_rate gauge)."""
        return self.cached_tokens_total / self.prompt_tokens_total if self.prompt_tokens_total else 0.0

    async def _prefill_step(self, start: float) -> float:
        new: list[Req] = []
        while self.waiting and len(self.running) + len(new) < self.max_running:
            new.append(self.waiting.popleft())
        self.prefilling = new
        for r in new:
            r.cached_tokens = self._cache_lookup(r)
        tokens = sum(r.prompt_tokens - r.cached_tokens for r in new)
        cached = sum(r.cached_tokens for r in new)
        dt = self.model.prefill_iteration_ms(tokens, self.rng) / 1000.0
        if logs.enabled("info") and any(r.kind != "health" for r in new):
            usage = self._kv_tokens() / MAX_TOTAL_TOKENS
            logs.log(
                f"Prefill batch. #new-seq: {len(new)}, #new-token: {tokens}, #cached-token: {cached}, token usage: "
                f"{usage:.2f}, #running-req: {len(self.running)}, #queue-req: {len(self.waiting)}",
                prefix=" TP0",
            )
        next_t = await self._sleep_until(start + dt)
        self.prefilling = []
        for r in new:
            if r.done.done():
                continue
            if r.kind != "health":
                self.prompt_tokens_total += r.prompt_tokens
                self.cached_tokens_total += r.cached_tokens
            if r.max_new_tokens <= 0:
                r.finish_reason = {"type": "length", "length": 0}
            else:
                self._append(r, 1, decode=False)
        self.running.extend(r for r in new if r.finish_reason is None and not r.done.done())
        self._deliver([r for r in new if not r.done.done()], first=True)
        return next_t

    async def _decode_step(self, start: float) -> float:
        batch = list(self.running)
        dt = self.model.decode_iteration_ms(len(batch), self.rng) / 1000.0
        next_t = await self._sleep_until(start + dt)
        spec = self.model.spec is not None
        for r in batch:
            if r.done.done() or self.crash_pending:
                continue
            n = self.model.tokens_this_iteration(r.rng or self.rng)
            r.decode_iters += 1
            if spec:
                r.verify_ct += 1
                if r.kind != "health":
                    self.verify_calls_total += 1
                    self.win_verify += 1
                    self._count_draft(n - 1)
            before = len(r.output_ids)
            self._append(r, min(n, r.max_new_tokens - before), decode=True)
            if spec:
                r.accepted_drafts += max(0, len(r.output_ids) - before - 1)
        self.decode_iterations += 1
        self.running = [r for r in self.running if r.finish_reason is None and not r.done.done()]
        self._deliver([r for r in batch if not r.done.done()], first=False)
        if self.decode_iterations % self.decode_log_interval == 0:
            self._log_decode(len(batch))
        return next_t

    def _count_draft(self, accepted: int) -> None:
        self.spec_drafts_total += 1
        self.spec_draft_tokens_total += len(self.spec_accepted_per_pos)
        self.spec_accepted_total += accepted
        for pos in range(accepted):
            self.spec_accepted_per_pos[pos] += 1

    def _kv_tokens(self) -> int:
        return sum(r.prompt_tokens + len(r.output_ids) for r in self.running)

    def _log_decode(self, batch: int) -> None:
        now = time.monotonic()
        elapsed = max(1e-9, now - self.win_start)
        self.last_gen_throughput = self.win_tokens / elapsed
        parts = [
            f"Decode batch. #running-req: {batch}",
            f"#token: {self._kv_tokens()}",
            f"token usage: {self._kv_tokens() / MAX_TOTAL_TOKENS:.2f}",
        ]
        if self.model.spec is not None and self.win_verify > 0:
            self.last_accept_len = self.win_tokens / self.win_verify
            drafts = max(1, self.model.spec.num_draft_tokens - 1)
            parts.append(f"accept len: {self.last_accept_len:.2f}")
            parts.append(f"accept rate: {(self.last_accept_len - 1) / drafts:.2f}")
            self.fold_tokens += self.win_tokens
            self.fold_verify += self.win_verify
        graph = self.cuda_graph and batch <= self.cuda_graph_max_bs
        parts.append(f"cuda graph: {graph}")
        parts.append(f"gen throughput (token/s): {self.last_gen_throughput:.2f}")
        parts.append(f"#queue-req: {len(self.waiting)}")
        logs.log(", ".join(parts), prefix=" TP0")
        self.win_tokens = 0
        self.win_verify = 0
        self.win_start = now

    # ---- reporting ------------------------------------------------------------------------------------------
    def internal_state(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "last_gen_throughput": self.last_gen_throughput,
            "memory_usage": {"note": "simulated", "kvcache": 0.0},
        }
        if self.model.spec is not None and self.fold_verify > 0:
            state["avg_spec_accept_length"] = self.fold_tokens / self.fold_verify
        return state

    def spec_meta(self, req: Req) -> dict[str, Any]:
        """SGLang's final-chunk speculative fields for one request."""
        spec = self.model.spec
        if spec is None:
            return {}
        proposed = req.verify_ct * max(1, spec.num_draft_tokens - 1)
        return {
            "spec_verify_ct": req.verify_ct,
            "spec_accept_length": (req.completion_tokens / req.verify_ct) if req.verify_ct else 0,
            "spec_accept_rate": (req.accepted_drafts / proposed) if req.verify_ct else 0.0,
            "spec_accept_token_num": req.accepted_drafts,
            "spec_draft_token_num": proposed,
        }
