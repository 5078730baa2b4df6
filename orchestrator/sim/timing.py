"""Pure timing model of the simulator: iteration times, speculative acceptance and noise."""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass

# One chain model for orch's break-even arithmetic and its simulator (stats.py is stdlib-only and ships with it).
from orchestrator.common.acceptance import chain_accept_length as mean_accept_length


def sample_accept_length(rng: random.Random, alpha: float, k: int) -> int:
    """Tokens one verify yields: consecutive accepted drafts (each with prob alpha, at most k) + 1 bonus."""
    n = 1
    for _ in range(k):
        if rng.random() < alpha:
            n += 1
        else:
            break
    return n


def spec_cycle_ms(
    num_steps: int, num_draft_tokens: int, draft_ms: float, verify_base_ms: float, verify_per_token_ms: float
) -> float:
    """One speculative cycle at batch 1: num_steps draft passes plus one verify of num_draft_tokens."""
    return num_steps * draft_ms + verify_base_ms + verify_per_token_ms * num_draft_tokens


def batch_factor(batch: int, slope: float) -> float:
    """How much slower an iteration gets with batch running requests (linear in batch)."""
    return 1.0 + slope * max(0, batch - 1)


def verify_batch_extra_ms(batch: int, draft_tokens: int, verify_batch_ms: float) -> float:
    """Verify time the drafts of every running request but the first add (0 at batch 1).

    One verify forward runs batch x (draft_tokens + 1) tokens; alone, the drafts ride on the memory-bound pass
    (verify_per_token_ms), but batched with other requests they compete for the compute the batch needs.
    """
    return verify_batch_ms * max(0, batch - 1) * draft_tokens


def decode_cycle_ms(base_ms: float, batch: int, slope: float, extra_ms: float) -> float:
    """One decode iteration of batch running requests before speed and noise: base x batch factor + extra."""
    return base_ms * batch_factor(batch, slope) + extra_ms


def iteration_ms(
    base_ms: float, speed_factor: float, batch: int, slope: float, noise: float, extra_ms: float = 0.0
) -> float:
    """Wall time of one scheduler iteration: (base x batch factor + extra) x speed x (1 + noise)."""
    return decode_cycle_ms(base_ms, batch, slope, extra_ms) * speed_factor * (1.0 + noise)


def prefill_time_ms(total_tokens: int, prefill_ms: float, per_token_ms: float, chunk_size: int) -> float:
    """Prefill of total_tokens prompt tokens: one fixed cost per chunk plus a per-token cost."""
    chunks = max(1, math.ceil(total_tokens / chunk_size)) if chunk_size > 0 else 1
    return chunks * prefill_ms + per_token_ms * total_tokens


def draw_speed_factor(rng: random.Random, sigma: float) -> float:
    """Lognormal restart-to-restart speed factor (>1 means this launch runs slower)."""
    return math.exp(rng.gauss(0.0, sigma)) if sigma > 0 else 1.0


def draw_noise(rng: random.Random, sigma: float) -> float:
    """Per-iteration relative noise, clipped so an iteration never takes zero or negative time."""
    if sigma <= 0:
        return 0.0
    return max(-0.5, min(0.5, rng.gauss(0.0, sigma)))


@dataclass(frozen=True)
class SpecConfig:
    """Resolved speculative settings (after SGLang's rules)."""

    algorithm: str
    num_steps: int
    topk: int
    num_draft_tokens: int

    @property
    def depth(self) -> int:
        """Longest chain of drafts one verify can accept."""
        if self.algorithm == "NGRAM":
            return max(0, self.num_draft_tokens - 1)
        return max(0, min(self.num_steps, self.num_draft_tokens - 1))

    @property
    def draft_steps(self) -> int:
        """Draft-model passes per cycle (NGRAM drafts from a CPU n-gram table, not a model)."""
        return 0 if self.algorithm == "NGRAM" else self.num_steps


@dataclass(frozen=True, kw_only=True)
class TimingModel:
    """The knobs that shape timing, bound to one launch's speculative config and speed factor."""

    decode_ms: float
    draft_ms: float
    verify_base_ms: float
    verify_per_token_ms: float
    accept_alpha: float
    batch_slope: float
    verify_batch_ms: float
    prefill_ms: float
    prefill_per_token_ms: float
    jitter: float
    eos_prob: float
    speed_factor: float
    chunk_size: int
    spec: SpecConfig | None

    @classmethod
    def from_knobs(
        cls,
        knobs: Mapping[str, float | int | str | None],
        spec: SpecConfig | None,
        speed_factor: float,
        chunk_size: int,
    ) -> TimingModel:
        def f(name: str) -> float:
            value = knobs[name]
            if not isinstance(value, (int, float)):
                raise TypeError(f"knob {name} must be numeric, got {value!r}")
            return float(value)

        return cls(
            decode_ms=f("decode_ms"),
            draft_ms=f("draft_ms"),
            verify_base_ms=f("verify_base_ms"),
            verify_per_token_ms=f("verify_per_token_ms"),
            accept_alpha=f("accept_alpha"),
            batch_slope=f("batch_slope"),
            verify_batch_ms=f("verify_batch_ms"),
            prefill_ms=f("prefill_ms"),
            prefill_per_token_ms=f("prefill_per_token_ms"),
            jitter=f("jitter"),
            eos_prob=f("eos_prob"),
            speed_factor=speed_factor,
            chunk_size=chunk_size,
            spec=spec,
        )

    @property
    def base_cycle_ms(self) -> float:
        """One decode iteration at batch 1 before speed factor and noise."""
        if self.spec is None:
            return self.decode_ms
        return spec_cycle_ms(
            self.spec.draft_steps,
            self.spec.num_draft_tokens,
            self.draft_ms,
            self.verify_base_ms,
            self.verify_per_token_ms,
        )

    @property
    def mean_accept_length(self) -> float:
        return 1.0 if self.spec is None else mean_accept_length(self.accept_alpha, self.spec.depth)

    def batch_extra_ms(self, batch: int) -> float:
        """What batching adds to a cycle beyond the batch factor: the drafts' verify compute (0 without speculation)."""
        if self.spec is None:
            return 0.0
        return verify_batch_extra_ms(batch, max(0, self.spec.num_draft_tokens - 1), self.verify_batch_ms)

    def cycle_ms(self, batch: int = 1) -> float:
        """One decode iteration with batch running requests, before speed factor and noise."""
        return decode_cycle_ms(self.base_cycle_ms, batch, self.batch_slope, self.batch_extra_ms(batch))

    def decode_iteration_ms(self, batch: int, rng: random.Random) -> float:
        noise = draw_noise(rng, self.jitter)
        return self.cycle_ms(batch) * self.speed_factor * (1.0 + noise)

    def prefill_iteration_ms(self, total_tokens: int, rng: random.Random) -> float:
        base = prefill_time_ms(total_tokens, self.prefill_ms, self.prefill_per_token_ms, self.chunk_size)
        return base * self.speed_factor * (1.0 + draw_noise(rng, self.jitter))

    def tokens_this_iteration(self, rng: random.Random) -> int:
        """Tokens one running request gains from one decode iteration (before max/EOS caps)."""
        if self.spec is None:
            return 1
        return sample_accept_length(rng, self.accept_alpha, self.spec.depth)

    def steady_tokens_per_s(self, batch: int = 1) -> float:
        """Expected per-request decode rate (long outputs, no noise, this launch's speed factor)."""
        return 1000.0 * self.mean_accept_length / (self.cycle_ms(batch) * self.speed_factor)
