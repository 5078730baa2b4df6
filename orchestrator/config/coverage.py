"""How much of a dataset each launch sends: the default that sends it whole, and the plan's words for it."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from orchestrator.config import prompts
from orchestrator.config.workload import BenchConfig, covered

# A run sends the whole dataset by default, up to this many prompts; a larger dataset sends a seeded subset of this
# many that covers every category (up to this many categories), unless --requests-per-stream says otherwise.
DEFAULT_RUN_PROMPTS = 100


def default_requests_per_stream(pool: int, concurrency: Sequence[int]) -> int:
    """--requests-per-stream when it is not given for a dataset of `pool` prompts: enough that a run at the lowest
    concurrency sends the whole dataset (at most DEFAULT_RUN_PROMPTS requests); higher levels send more."""
    return max(1, math.ceil(min(pool, DEFAULT_RUN_PROMPTS) / min(concurrency or (1,))))


def run_sizes(config: BenchConfig) -> list[tuple[int, int]]:
    """(run index, requests) of every timed run of a launch, in the order sent."""
    if config.open_loop:
        return [(run, len(config.schedule(rate, run))) for rate in config.rate for run in range(config.runs)]
    return [(run, config.requests_per_run(c)) for c in config.concurrency for run in range(config.runs)]


@dataclass(frozen=True, kw_only=True)
class Coverage:
    """What of a dataset a launch's timed runs send: its prompts and categories, and which of them the runs send."""

    name: str
    prompts: int  # in the dataset
    categories: dict[str, int]  # prompts per category in the dataset
    sent: int  # distinct prompts a launch's timed runs send
    sent_categories: frozenset[str]

    @property
    def unsent(self) -> dict[str, int]:
        return {c: n for c, n in sorted(self.categories.items()) if c not in self.sent_categories}

    def line(self) -> str:
        """The plan's words: how many of the dataset's prompts each launch sends, and which categories."""
        many = len(self.categories)
        cats = f"{many} categor{'y' if many == 1 else 'ies'}"
        if self.sent >= self.prompts:
            return f"dataset: each launch sends all {self.prompts} prompts of {self.name} ({cats})"
        head = f"dataset: each launch sends a seeded subset of {self.sent} of {self.prompts} prompts of {self.name}"
        if not self.unsent:
            return f"{head} covering all {cats}"
        return (
            f"{head} covering {len(self.sent_categories)} of {cats}; not sent: {unsent_words(self.unsent)} (more "
            "requests per run send them: --requests-per-stream, --requests or --duration)"
        )


def unsent_words(unsent: dict[str, int]) -> str:
    """writing (8 prompts), math (1 prompt)"""
    return ", ".join(f"{c} ({n} prompt{'' if n == 1 else 's'})" for c, n in unsent.items())


def coverage(config: BenchConfig, categories: Sequence[str]) -> Coverage | None:
    """What of a dataset (its prompts' categories, in order) a launch of this workload sends; None for a workload
    whose runs do not cycle a covering order (orch's own prompts, sessions, a trace, an experiment from before)."""
    if not covered(config) or not categories:
        return None
    sent: set[int] = set()
    for run, n in run_sizes(config):
        sent |= set(prompts.covering_order(categories, n, config.seed, run))
    name = Path(config.prompts).name if Path(config.prompts).suffix else config.prompts
    # The warmups' prompts are sent but not measured: only the timed runs' count.
    return Coverage(
        name=name,
        prompts=len(categories),
        categories=dict(Counter(categories)),
        sent=len(sent),
        sent_categories=frozenset(categories[i] for i in sent),
    )
