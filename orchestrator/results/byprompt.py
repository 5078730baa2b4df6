"""Results by prompt for a small prompt set: each arm's tok/s and accept length per prompt, each comparison's paired
ratio per prompt with its CI and verdict, and the prompts whose ratio lies on the other side of 1 from the verdict."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from orchestrator.config import datasets, prompts
from orchestrator.config.slo import DEFAULT_METRIC
from orchestrator.config.workload import BenchConfig, RunSlot, requests_digest, run_values
from orchestrator.errors import InputError
from orchestrator.results.bundleformat import bench_config
from orchestrator.results.categories import ByCategory, families
from orchestrator.results.run import Level, Rate

if TYPE_CHECKING:
    from orchestrator.results.model import ABResult

# A set of more prompts than this is a sample, judged by its categories or as a whole: a row per prompt would be a
# table no one reads, and each row would rest on too few requests to say anything.
MAX_PROMPTS = 20
EXCERPT_CHARS = 30


@dataclass(frozen=True, kw_only=True)
class PromptSet:
    """Each timed run's requests as their prompts' numbers (1-based positions in the workload's prompt list, as
    strings: results/categories groups by them as by categories) and each prompt's excerpt, by number."""

    runs: Mapping[RunSlot, tuple[str, ...]]
    excerpts: Mapping[str, str]


def excerpt(text: str) -> str:
    """A prompt's first EXCERPT_CHARS characters on one line: whitespace runs as one space, any other character
    that is not printable escaped (a prompt is untrusted text), "..." where it was cut."""
    flat = " ".join(text.split())
    shown = "".join(
        ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in flat[:EXCERPT_CHARS]
    )
    return shown + ("..." if len(flat) > EXCERPT_CHARS else "")


def _key(item: Mapping[str, Any]) -> str:
    """What makes two requests the same prompt: their input, whatever else (a schedule, a category) they carry."""
    return json.dumps([item.get("text"), item.get("messages"), item.get("input_ids")], sort_keys=True)


def _text(item: Mapping[str, Any]) -> str:
    """The text an excerpt is taken from: the prompt's text, or its messages' contents one after another."""
    if isinstance(item.get("text"), str):
        return str(item["text"])
    messages = item.get("messages") or []
    return " ".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))


def workload_prompts(bench: BenchConfig) -> PromptSet | None:
    """The prompt of every timed request of a workload whose prompt set has at most MAX_PROMPTS prompts; None for
    a larger set, prompts orch generates (builtin, random, shared-prefix), shipped datasets, sessions and traces
    (a request is not one prompt), and a dataset of two or more categories (results/categories breaks it down)."""
    source = bench.prompts
    if bench.turns is not None or bench.trace is not None or prompts.generated(source):
        return None
    try:
        if datasets.kind(source) == "shipped":
            return None
        categories = datasets.categories_of(source)
        if len(categories) > MAX_PROMPTS or (datasets.categorised(source) and len(set(categories)) > 1):
            return None
        listed = [item.to_dict() for item in datasets.load_file(prompts.source_path(source))]
        position: dict[str, int] = {}
        for i, item in enumerate(listed):
            position.setdefault(_key(item), i)  # a prompt listed twice is one prompt: its first place
        runs = run_values(bench, lambda it: str(position.get(_key(it), -1) + 1))
    except (InputError, OSError):
        return None
    if any(p == "0" for slot in runs.values() for p in slot):
        return None  # a request the list does not hold: the file is not the one the requests were drawn from
    return PromptSet(runs=runs, excerpts={str(i + 1): excerpt(_text(item)) for i, item in enumerate(listed)})


def stored_prompts(config: Mapping[str, Any]) -> PromptSet | None:
    """A stored experiment's prompts, from its stored workload; None where workload_prompts gives none, or the
    prompt file can no longer be read as it was (its requests' digest no longer matches)."""
    try:
        bench = bench_config(config)
        found = workload_prompts(bench)
        recorded = config.get("requests_sha256")
        if found is not None and recorded is not None and requests_digest(bench) != recorded:
            return None
    except (InputError, OSError, KeyError, TypeError, ValueError):
        return None
    return found


@dataclass(frozen=True)
class ByPrompt:
    """A level's results by prompt: the breakdown by category where each prompt is its own group (`table`, its
    categories the prompts' numbers in list order), each prompt's excerpt, and the opposite-sign notes."""

    table: ByCategory
    excerpts: Mapping[str, str]
    notes: tuple[str, ...]

    @property
    def level(self) -> Level:
        return self.table.level

    def label(self, prompt: str) -> str:
        """A prompt as a row names it: its number and excerpt (`3 "def add(a, b): ..."`)."""
        return f'{prompt} "{self.excerpts.get(prompt, "")}"'

    def to_dict(self) -> dict[str, Any]:
        bc = self.table

        def numbered(d: dict[str, Any]) -> dict[str, Any]:
            out = {k: v for k, v in d.items() if k != "category"}
            return {"prompt": int(d["category"]), **out}

        return {
            "concurrency": None if isinstance(bc.level, Rate) else bc.level,
            **({"rate": float(bc.level)} if isinstance(bc.level, Rate) else {}),
            "prompt_set_size": len(self.excerpts),
            "prompts": [{"prompt": int(p), "excerpt": self.excerpts.get(p, "")} for p in bc.categories],
            "arms": [numbered(a.to_dict()) for a in bc.arms],
            "comparisons": [numbered(c.to_dict()) for c in bc.comparisons],
            "notes": list(self.notes),
        }


def opposite_notes(result: ABResult, bc: ByCategory, excerpts: Mapping[str, str]) -> tuple[str, ...]:
    """Each prompt whose point ratio is on the other side of 1 from its comparison's FASTER or SLOWER verdict,
    named, with how many prompts the verdict then rests on. Only on tok/s: another metric's verdict is not about
    the per-prompt tok/s ratios."""
    if result.metric != DEFAULT_METRIC:
        return ()
    out = []
    for c in result.comparisons_at(bc.level):
        if c.verdict not in ("faster", "slower") or c.ratio is None:
            continue
        label = c.arm_label or c.arm
        mine = [p for p in bc.comparisons if p.arm_label == label and p.ratio is not None]
        faster = c.verdict == "faster"
        against = [p for p in mine if p.ratio is not None and (p.ratio < 1.0 if faster else p.ratio > 1.0)]
        rest = len(mine) - len(against)
        others = "the other prompt" if rest == 1 else f"the other {rest} prompts"
        for p in against:
            out.append(
                f'prompt {p.category} ("{excerpts.get(p.category, "")}") runs {"slower" if faster else "faster"} with '
                f"{label}: {p.ratio:.2f}x against the {c.verdict.upper()} verdict ({c.ratio:.2f}x); the verdict "
                + (f"rests on {others}" if rest else "rests on no prompt alone")
            )
    return tuple(out)


def by_prompt(result: ABResult, level: Level | None = None) -> ByPrompt | None:
    """The level's results by prompt (default: the first level); None unless the workload's prompt set is small
    (workload_prompts), two or more of its prompts were sent, and the runs carry their per-request rows. The
    per-prompt verdicts of every level and compared arm are one family (Holm, as results/categories')."""
    found = result.prompts
    if found is None or not result.levels:
        return None
    names = tuple(sorted({p for slot in found.runs.values() for p in slot}, key=int))
    if len(names) < 2:
        return None  # one prompt sent: the comparison itself is that prompt's
    level = level if level is not None else result.levels[0]
    if "by_prompt" not in result.derived:
        tables = families(result, names, found.runs, "prompt", "prompts")
        result.derived["by_prompt"] = {
            lv: ByPrompt(bc, found.excerpts, opposite_notes(result, bc, found.excerpts)) for lv, bc in tables.items()
        }
    mine: dict[Level, ByPrompt] = result.derived["by_prompt"]
    return mine.get(level)
