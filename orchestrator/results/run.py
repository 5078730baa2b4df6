"""One benchmark run's result (RunResult): what the client measured, as stored and compared."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


class Rate(float):
    """An open-loop level: requests per second. A closed-loop level is a plain int (the concurrency). A float, so
    that levels of either kind sort, compare and key a dict alike; `level_name` tells them apart in words."""

    def __repr__(self) -> str:
        return f"Rate({float(self)!r})"


Level = float  # an int concurrency, or a Rate


def level_name(level: Level) -> str:
    """How reports name a level after "@": "8" (concurrency), "2 req/s" (open loop)."""
    return f"{float(level):g} req/s" if isinstance(level, Rate) else str(level)


def level_phrase(level: Level) -> str:
    """A level in a sentence: "concurrency 8", "2 req/s"."""
    return level_name(level) if isinstance(level, Rate) else f"concurrency {level}"


@dataclass(frozen=True, kw_only=True)
class RunResult:
    """One run (warmups included, never in statistics). At concurrency 1 the first six fields are the seed's."""

    index: int
    warmup: bool
    tokens: int
    seconds: float
    tok_s: float  # output tokens per second per stream (tokens / end-to-end time, averaged over requests)
    prompt_tokens: int
    ttft_s: float | None  # median time to first token
    spec_accept_length: float | None = None
    spec_verify_ct: int | None = None
    valid: bool = True
    invalid_reason: str | None = None
    concurrency: int = 1
    aggregate_tok_s: float = 0.0  # output tokens per second, all streams, while all were busy
    requests: int = 1
    errors: int = 0
    accept_source: str | None = None
    token_source: str | None = None
    metrics: dict[str, Any] = field(default_factory=dict)  # ttft/itl/tpot/e2e distributions, chunk counts
    per_request: tuple[dict[str, Any], ...] = ()
    gpus: dict[str, Any] | None = None  # nvidia-smi read during this run, when it was probed
    rate: float | None = None  # open loop: the level's requests per second (concurrency is then 0); None: closed loop

    @property
    def level(self) -> Level:
        """The level this run belongs to: its rate (open loop) or its concurrency."""
        return Rate(self.rate) if self.rate else self.concurrency

    @property
    def open_loop(self) -> dict[str, Any]:
        """The run against its schedule (client.summary.open_loop_summary); {} for a closed-loop run."""
        value = self.metrics.get("open_loop")
        return value if isinstance(value, dict) else {}

    @classmethod
    def from_summary(cls, index: int, warmup: bool, s: dict[str, Any]) -> RunResult:
        return cls(
            index=index,
            warmup=warmup,
            tokens=int(s["tokens"]),
            seconds=float(s["seconds"]),
            tok_s=float(s["tok_s"]),
            prompt_tokens=int(s["prompt_tokens"]),
            ttft_s=s["ttft_s"],
            spec_accept_length=s["spec_accept_length"],
            spec_verify_ct=s["spec_verify_ct"],
            valid=bool(s["valid"]),
            invalid_reason=s["invalid_reason"],
            concurrency=int(s["concurrency"]),
            aggregate_tok_s=float(s["aggregate_tok_s"]),
            requests=int(s["requests"]),
            errors=int(s["errors"]),
            accept_source=s["accept_source"],
            token_source=s["token_source"],
            metrics={
                k: s[k]
                for k in (
                    "ttft",
                    "itl",
                    "tpot",
                    "e2e",
                    "window_s",
                    "chunks",
                    "multi_token_chunks",
                    "spec",
                    "energy",
                    "open_loop",
                    "outputs",
                    "accept_lengths",
                    "prefix_cache",
                    "turns",
                )
                if k in s
            },
            per_request=tuple(s["per_request"]),
            gpus=s.get("gpus"),
            rate=float(s["open_loop"]["rate"]) if s.get("open_loop") else None,
        )

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> RunResult:
        """A run as the store keeps it (older rows may lack the later columns)."""
        metrics = json.loads(row.get("metrics_json") or "{}")
        return cls(
            index=int(row["idx"]),
            warmup=bool(row["warmup"]),
            tokens=int(row["tokens"]),
            seconds=float(row["seconds"]),
            tok_s=float(row["tok_s"]),
            prompt_tokens=int(row["prompt_tokens"]),
            ttft_s=row["ttft_s"],
            spec_accept_length=row["spec_accept_length"],
            spec_verify_ct=row["spec_verify_ct"],
            valid=bool(row["valid"]),
            invalid_reason=row["invalid_reason"],
            # 0 for an open-loop run; absent (1) in rows stored before concurrency levels
            concurrency=int(row["concurrency"]) if row.get("concurrency") is not None else 1,
            aggregate_tok_s=float(row["aggregate_tok_s"] if row.get("aggregate_tok_s") is not None else row["tok_s"]),
            requests=int(row.get("requests") or 1),
            errors=int(row.get("errors") or 0),
            accept_source=row.get("accept_source"),
            token_source=row.get("token_source"),
            metrics=metrics,
            rate=float(row["rate"]) if row.get("rate") else None,
        )

    @property
    def energy(self) -> dict[str, Any] | None:
        """The run's energy over its steady window from the GPUs' power (agent/power.energy: joules, tokens,
        j_per_token, mean_w, the power field, the GPUs summed), {"error": why} when it was not measured, None for a
        run stored before orch measured energy or one whose runner never tried (an attached server)."""
        found = self.metrics.get("energy")
        return found if isinstance(found, dict) else None

    @property
    def j_per_token(self) -> float | None:
        """Joules per output token over the steady window, summed over the server's GPUs; None if not measured."""
        value = (self.energy or {}).get("j_per_token")
        return float(value) if isinstance(value, (int, float)) and value > 0 else None

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["per_request"] = list(self.per_request)
        return d
