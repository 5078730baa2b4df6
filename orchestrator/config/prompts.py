"""Prompt sets and the seeded request sequence every arm of an experiment receives identically."""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from orchestrator import files
from orchestrator.errors import BenchError, PromptFileError
from orchestrator.fields import did_you_mean, show

# Written for orch, in the spirit of Spec-Bench's task mix: speculative decoding's acceptance differs by task
# (translation and summarisation copy a lot, open chat much less), so one prompt type would flatter or punish it.
BUILTIN: dict[str, tuple[str, ...]] = {
    "chat": (
        "I just moved to a new city and I don't know anyone. What are some realistic ways to make friends as an "
        "adult who works from home?",
        "My sourdough keeps coming out dense and flat. Walk me through the most likely causes and how to fix each.",
        "Explain to a curious ten-year-old why the sky is blue and why sunsets are red.",
        "What should I consider before adopting a dog if I live in a small apartment and travel twice a month?",
        "Give me an honest comparison of learning the piano versus the guitar as a complete beginner at forty.",
    ),
    "coding": (
        "Write a Python function that merges two sorted lists into one sorted list without using sort(), then "
        "explain its time and memory complexity.",
        "Implement an LRU cache class in Python with get and put in O(1), with type hints and a short docstring.",
        "Here is a bug: a Go HTTP handler sometimes returns an empty body under load. List the usual causes "
        "(shared buffers, missing flush, early return) and show how to test for each.",
        "Write a bash script that finds the ten largest files under a directory, skipping .git folders, and "
        "prints their sizes in human-readable form.",
        "Explain the difference between a process and a thread in Linux, then show a small C example of each.",
    ),
    "math": (
        "A train leaves at 9:40 at 72 km/h; a second leaves the same station at 10:05 at 90 km/h on the same "
        "track. When and where does the second catch up? Show each step.",
        "Prove that the square root of 2 is irrational, explaining every step for a first-year student.",
        "A bag holds 5 red and 7 blue marbles. Three are drawn without replacement. What is the probability that "
        "exactly two are red? Show the calculation.",
        "Solve the system 3x + 2y = 16 and 5x - 4y = 2, and check the answer by substitution.",
        "How many ways can 8 people sit around a round table if two of them refuse to sit next to each other?",
    ),
    "summarisation": (
        "Summarise the following for a busy manager in three bullet points: The quarterly infrastructure review "
        "found that GPU utilisation averaged 41 percent, mostly because benchmark jobs held whole nodes while "
        "waiting for model weights to load from network storage. Moving weights to local NVMe cut load time from "
        "nine minutes to ninety seconds in a pilot, and the team proposes rolling this out to all inference hosts "
        "next quarter at a cost of about 40,000 dollars in drives.",
        "Summarise the main causes of the French Revolution in one paragraph covering economic, political and "
        "social pressures.",
        "Condense this support ticket into a one-line title and a two-sentence description: Customer reports that "
        "since the update on Tuesday the mobile app logs them out every time they switch to another app, even "
        "though 'remember me' is enabled. Reinstalling did not help. They use Android 14 on a Pixel 7.",
        "Summarise the plot of Romeo and Juliet in exactly five sentences.",
        "Give a short abstract for a paper that shows randomized interleaving of benchmark runs reduces false "
        "positives compared with running all baseline runs before all candidate runs.",
    ),
    "translation": (
        "Translate into French, then explain any idiom that does not carry over: 'We will cross that bridge when "
        "we come to it, but let us not burn any bridges today.'",
        "Translate into German: 'The server restarts every night at two o'clock; please save your work before "
        "then and do not start long jobs after midnight.'",
        "Translate into Spanish, keeping the formal tone: 'Dear colleagues, the meeting planned for Thursday is "
        "postponed until further notice. We apologise for the inconvenience.'",
        "Translate this English proverb into Japanese and give a literal back-translation: 'Too many cooks spoil "
        "the broth.'",
        "Translate into Italian: 'The results are preliminary and should not be shared outside the team until "
        "the second measurement confirms them.'",
    ),
    "rag": (
        "Context: orch starts every arm of a comparison from a fresh server launch, reads back the environment of "
        "each worker process, and stores each run as soon as it finishes. Question: why does orch relaunch the "
        "server for the baseline instead of reusing an earlier measurement? Answer only from the context.",
        "Context: The warranty covers manufacturing defects for 24 months from purchase. Damage from drops, "
        "liquids or unauthorised repairs is excluded. Batteries are covered for 12 months. Question: my battery "
        "died after 14 months; is it covered? Answer from the context and quote the relevant sentence.",
        "Context: In speculative decoding a small draft model proposes several tokens, and the large model "
        "verifies them in one forward pass; accepted tokens are kept and the first rejected one is replaced. "
        "Question: why can speculative decoding be slower than normal decoding? Use the context.",
        "Context: The library opens at 9:00 on weekdays and 10:00 on Saturdays, closes at 18:00 except Thursdays "
        "(20:00), and is closed on Sundays and public holidays. Question: can I return a book at 19:00 on a "
        "Thursday that is a public holiday?",
        "Context: Tensor parallelism splits each layer's matrices across GPUs and needs an all-reduce per layer; "
        "pipeline parallelism splits the layers into stages and passes activations between them. Question: "
        "which one suffers more from slow PCIe links, and why?",
    ),
}


@dataclass(frozen=True, kw_only=True)
class PromptItem:
    """One request's input: text, token ids (random prompts) or chat messages (from a file)."""

    category: str
    text: str | None = None
    input_ids: tuple[int, ...] | None = None
    messages: tuple[dict[str, Any], ...] | None = None
    output_len: int | None = None  # the dataset's output length for this prompt (capped by --max-tokens)

    def to_dict(self) -> dict[str, Any]:
        return {
            "category": self.category,
            "text": self.text,
            "input_ids": list(self.input_ids) if self.input_ids is not None else None,
            "messages": list(self.messages) if self.messages is not None else None,
            # Only when set: the digests of every workload without it stay what they were.
            **({"output_len": self.output_len} if self.output_len is not None else {}),
        }


def builtin_items() -> list[PromptItem]:
    return [PromptItem(category=c, text=t) for c, texts in BUILTIN.items() for t in texts]


def random_items(n: int, input_len: int, seed: int, vocab: int = 32000) -> list[PromptItem]:
    """Random-token prompts of an exact length (ids above the special-token range)."""
    rng = random.Random(f"random-prompts:{seed}:{input_len}")
    return [
        PromptItem(category="random", input_ids=tuple(rng.randrange(1000, vocab) for _ in range(input_len)))
        for _ in range(n)
    ]


# --prompts shared-prefix:GROUPSxPER_GROUP[:SYSTEM_LEN:QUESTION_LEN]: SGLang bench_serving's generated-shared-prefix
# dataset (--gsp-num-groups, --gsp-prompts-per-group, --gsp-system-prompt-len, --gsp-question-len), whose length
# defaults are these. GROUPS system prompts, each followed by PER_GROUP questions of its own: what a prefix cache
# (and a drafter that reads the prompt) sees in chat traffic with a few system prompts.
SHARED_PREFIX = "shared-prefix:"
SHARED_PREFIX_FORM = "shared-prefix:GROUPSxPER_GROUP[:SYSTEM_LEN:QUESTION_LEN], e.g. shared-prefix:8x16 or " + (
    "shared-prefix:8x16:1024:64"
)
SHARED_PREFIX_LENGTHS = (2048, 128)
# The most tokens one prompt may have, however it is given: --input-len, a shared-prefix prompt, a trace line's
# input_length (and a trace's output_length, as --max-tokens).
MAX_PROMPT_TOKENS = 1_000_000
# Bounds that keep the generated pool and each request within the launch limits (config/plan): prompts in the pool,
# and token ids per prompt.
MAX_SHARED_PROMPTS = 1_000_000
MAX_SHARED_PROMPT_IDS = MAX_PROMPT_TOKENS


@dataclass(frozen=True)
class SharedPrefix:
    """A generated shared-prefix workload: GROUPS system prompts of SYSTEM_LEN random token ids, each followed by
    PER_GROUP questions of QUESTION_LEN ids. A group is a category (`group-1`, ...), so results break down by system
    prompt. Every id comes from the seed: the same prompts for every arm, launch and reproduction."""

    groups: int
    per_group: int
    system_len: int = SHARED_PREFIX_LENGTHS[0]
    question_len: int = SHARED_PREFIX_LENGTHS[1]

    @classmethod
    def parse(cls, source: str) -> SharedPrefix | None:
        """The workload a --prompts value names; None when it is not shared-prefix:..., PromptFileError when it is
        but is malformed or out of bounds."""
        if not source.startswith(SHARED_PREFIX):
            return None
        parts = source[len(SHARED_PREFIX) :].split(":")
        shape = parts[0].lower().split("x")
        try:
            if len(shape) != 2 or len(parts) not in (1, 3):
                raise ValueError
            numbers = [int(v) for v in (*shape, *parts[1:])]
        except ValueError:
            raise PromptFileError(f"--prompts {source!r}: expected {SHARED_PREFIX_FORM}") from None
        spec = cls(*numbers)
        spec.check(source)
        return spec

    def check(self, source: str) -> None:
        named = [("GROUPS", self.groups), ("PER_GROUP", self.per_group)]
        named += [("SYSTEM_LEN", self.system_len), ("QUESTION_LEN", self.question_len)]
        low = next((name for name, value in named if value < 1), None)
        if low is not None:
            raise PromptFileError(f"--prompts {source!r}: {low} must be 1 or more ({SHARED_PREFIX_FORM})")
        if self.groups * self.per_group > MAX_SHARED_PROMPTS:
            raise PromptFileError(
                f"--prompts {source!r}: {self.groups * self.per_group:,} prompts; at most {MAX_SHARED_PROMPTS:,}"
            )
        if self.system_len + self.question_len > MAX_SHARED_PROMPT_IDS:
            raise PromptFileError(
                f"--prompts {source!r}: prompts of {self.system_len + self.question_len:,} tokens; at most "
                f"{MAX_SHARED_PROMPT_IDS:,}"
            )

    @property
    def prompt_len(self) -> int:
        return self.system_len + self.question_len

    def items(self, n: int, seed: int, vocab: int = 32000) -> list[PromptItem]:
        """The n prompts a benchmark sends: the pool in sample_order's seeded passes (every prompt once per pass),
        each generated on its own from the seed, so only the ones sent are ever built."""
        systems: dict[int, tuple[int, ...]] = {}

        def ids(stream: str, length: int) -> tuple[int, ...]:
            rng = random.Random(f"shared-prefix:{seed}:{stream}")
            return tuple(rng.randrange(1000, vocab) for _ in range(length))

        out = []
        for j in sample_order(self.groups * self.per_group, n, seed):
            group = j // self.per_group
            if group not in systems:
                systems[group] = ids(f"system:{group}", self.system_len)
            question = ids(f"question:{j}", self.question_len)
            out.append(PromptItem(category=f"group-{group + 1}", input_ids=systems[group] + question))
        return out


def generated(source: str) -> bool:
    """Whether a --prompts value is generated by orch from the config (no file: a bundle regenerates it)."""
    return source in ("builtin", "random") or source.startswith(SHARED_PREFIX)


# A prompt file is read line by line, never whole, and only up to this size: past it a file is a mistake (or
# /dev/zero), and a set of that many prompts is for sampling from, not for sending in a benchmark.
MAX_FILE_BYTES = 256 * 1024 * 1024
# One record (a JSONL or trace line, a CSV row, an element of a ShareGPT array) is at most this many bytes, checked
# while it is read, so a longer one is never held whole. A prompt's bytes are capped as its tokens are: a prompt of
# MAX_PROMPT_TOKENS tokens is about 4 MB of text (about 4 bytes a token), and JSON's escapes (`\uXXXX`: 6 bytes for
# a character) can make it up to 4 times that.
MAX_RECORD_BYTES = 16 * 1024 * 1024
# A category names a line of the reports: a short name on one line.
MAX_CATEGORY_CHARS = 100


def open_capped(path: str, noun: str, kind: str, too_big_hint: str) -> tuple[BinaryIO, PromptFileError]:
    """A prompt file or dataset (`noun`) opened for reading: a regular file (a FIFO or device refused before it is
    read) no larger than MAX_FILE_BYTES; returns it with the error to raise should it grow past that while read."""
    try:
        f = files.open_regular(path)
    except files.NotRegularFile as e:
        raise PromptFileError(f"{path}: {e}; {kind}") from None
    except OSError as e:
        raise PromptFileError(f"{path}: cannot read the {noun}: {e.strerror or e}") from e
    too_big = PromptFileError(f"{path}: larger than {MAX_FILE_BYTES // 2**20} MiB; {too_big_hint}")
    if os.fstat(f.fileno()).st_size > MAX_FILE_BYTES:
        f.close()
        raise too_big  # before reading a byte
    return f, too_big


def capped_lines(path: str, noun: str, kind: str, too_big_hint: str) -> Generator[tuple[int, int, bytes], None, None]:
    """(line number, byte offset, line) of every line of a text file (a `noun`: open_capped's arguments), read as a
    stream of at most MAX_FILE_BYTES in lines of at most MAX_RECORD_BYTES (a longer line is refused after reading
    that much of it, never read whole); a NUL byte is refused as not text."""
    f, too_big = open_capped(path, noun, kind, too_big_hint)
    with f:
        offset, n = 0, 0
        while line := f.readline(min(MAX_RECORD_BYTES, MAX_FILE_BYTES - offset) + 1):
            n += 1
            if offset + len(line) > MAX_FILE_BYTES:  # it grew while being read
                raise too_big
            if len(line) > MAX_RECORD_BYTES:
                raise PromptFileError(
                    f"{path}:{n}: a line longer than {MAX_RECORD_BYTES // 2**20} MiB; a line of a {noun} is one "
                    f"record, and a prompt of the most tokens orch sends ({MAX_PROMPT_TOKENS:,}) is a few MB"
                )
            if b"\0" in line:
                raise nul_refused(path, n, noun)
            yield n, offset, line
            offset += len(line)


def nul_refused(path: str, n: int, noun: str) -> PromptFileError:
    """Why a NUL byte on line n is refused: a NUL is not text (csv reads past it, a server may cut the prompt there),
    and a file saved as UTF-16 has one in every other byte."""
    return PromptFileError(f"{path}:{n}: a NUL byte; a {noun} is UTF-8 text (save a UTF-16 file as UTF-8)")


def file_lines(path: str) -> Generator[tuple[int, int, bytes], None, None]:
    """(line number, byte offset, line) of every line of a prompt file (capped_lines)."""
    return capped_lines(
        path,
        "prompt file",
        "a prompt file is a JSONL file on disk",
        "is this really a prompt file? (send a sample of the prompts: the benchmark sends only as many as its runs "
        "need)",
    )


def json_object(path: str, n: int, line: bytes, expected: str) -> dict[str, Any] | None:
    """Line n of a JSON-lines file as an object (None for a blank line); a PromptFileError naming the file and line
    otherwise, `expected` saying what the object should hold."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as e:
        raise PromptFileError(f"{path}:{n}: not UTF-8 text (byte {e.start}); expected JSON lines") from None
    if not text.strip():
        return None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise PromptFileError(f"{path}:{n}: not valid JSON ({e.msg})") from None
    except RecursionError:
        raise PromptFileError(f"{path}:{n}: JSON nested too deeply") from None
    except ValueError as e:  # an integer of more digits than Python converts (sys.get_int_max_str_digits)
        raise PromptFileError(f"{path}:{n}: not valid JSON ({e})") from None
    if not isinstance(obj, dict):
        raise PromptFileError(f"{path}:{n}: expected an object with {expected}")
    return obj


def checked_category(path: str, n: int, value: Any, field: str = "field 'category'") -> str:
    """A record's category as given (line n of `path`): a name of printable characters, not blank, at most
    MAX_CATEGORY_CHARS long; anything else (an object, a number, "", a newline) is refused naming the field."""
    if (
        isinstance(value, str)
        and value.strip()
        and len(value) <= MAX_CATEGORY_CHARS
        and value.isprintable()  # no newline, tab, escape or other control character
    ):
        return value
    raise PromptFileError(
        f"{path}:{n}: {field} is {show(value)}; expected a category: text of 1 to {MAX_CATEGORY_CHARS} printable "
        "characters (no newlines or control characters), or no category (the prompt's is then 'file')"
    )


def category_of(path: str, n: int, obj: dict[str, Any]) -> str:
    """The category of a JSON record (checked_category), 'file' without one."""
    return checked_category(path, n, obj["category"]) if "category" in obj else "file"


def output_len_of(path: str, n: int, obj: dict[str, Any]) -> int | None:
    """A line's `output_len`: a whole number of tokens, 1 or more, or absent."""
    output_len = obj.get("output_len")
    if output_len is not None and (type(output_len) is not int or output_len < 1):
        raise PromptFileError(
            f'{path}:{n}: "output_len" must be a whole number of tokens, 1 or more (got {output_len!r})'
        )
    return output_len


# The fields of a request trace's line (config/traces.py, which imports this module, reads them): a line with them and
# no prompt is a trace given where prompts go, and the refusal says which option replays it.
TRACE_FIELDS = ("timestamp", "input_length", "output_length")


def _parse(path: str, n: int, line: bytes) -> PromptItem | None:
    """One line of a prompt file as a prompt (None for a blank line)."""
    obj = json_object(path, n, line, '"prompt" or "messages"')
    if obj is None:
        return None
    category = category_of(path, n, obj)
    output_len = output_len_of(path, n, obj)
    if isinstance(obj.get("prompt"), str) and obj["prompt"].strip():
        return PromptItem(category=category, text=obj["prompt"], output_len=output_len)
    if (
        isinstance(obj.get("messages"), list)
        and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in obj["messages"]
        )
        and obj["messages"]
    ):
        return PromptItem(category=category, messages=tuple(obj["messages"]), output_len=output_len)
    if "prompt" not in obj and "messages" not in obj and all(field in obj for field in TRACE_FIELDS):
        raise PromptFileError(
            f"{path}:{n}: no prompt, but {', '.join(TRACE_FIELDS)}: this looks like a request trace, not a dataset; "
            f"replay it with --trace {path}"
        )
    raise PromptFileError(f'{path}:{n}: needs "prompt" (non-empty text) or "messages" (a list of {{role, content}})')


def load_jsonl(path: str) -> list[PromptItem]:
    """A user prompt file: one JSON object per line with "prompt" (text) or "messages" (chat), "category" optional."""
    items = [item for n, _, line in file_lines(path) if (item := _parse(path, n, line)) is not None]
    if not items:
        raise PromptFileError(f"{path}: no prompts in the file")
    return items


# Picks which prompts of a file to send, in order, from the categories of all of them (in file order).
Chooser = Callable[[list[str]], list[int]]


def sample_jsonl(path: str, choose: Chooser) -> list[PromptItem]:
    """The prompts `choose` picks from a file, in its order, holding only each prompt's offset and category and the
    chosen prompts in memory: every line is checked in a first pass, the chosen ones are read again in a second."""
    offsets: list[tuple[int, int]] = []
    categories: list[str] = []
    for k, off, line in file_lines(path):
        item = _parse(path, k, line)
        if item is not None:
            offsets.append((k, off))
            categories.append(item.category)
    if not offsets:
        raise PromptFileError(f"{path}: no prompts in the file")
    chosen = choose(categories)
    wanted = {i: offsets[i] for i in sorted(set(chosen))}
    by_index: dict[int, PromptItem] = {}
    try:
        f = files.open_regular(path)
    except OSError as e:
        raise PromptFileError(f"{path}: cannot read the prompt file again: {e.strerror or e}") from e
    with f:
        for i, (k, off) in wanted.items():
            f.seek(off)
            item = _parse(path, k, f.readline(MAX_RECORD_BYTES + 1))
            if item is None:
                raise PromptFileError(f"{path}: changed while it was read; run again")
            by_index[i] = item
    return [by_index[i] for i in chosen]


def sample_order(pool: int, n: int, seed: int) -> list[int]:
    """Which of `pool` prompts the n requests send, in order: each pass visits every prompt once, in a seeded
    shuffle, so categories stay balanced. Shuffling indexes draws exactly as shuffling the prompts would."""
    rng = random.Random(f"prompts:{seed}")
    order: list[int] = []
    while len(order) < n:
        batch = list(range(pool))
        rng.shuffle(batch)
        order.extend(batch)
    return order[:n]


def covering_order(categories: Sequence[str], n: int, seed: int, run: int) -> list[int]:
    """Which of a dataset's prompts (their categories, in file order) the n requests of one run send, in order: each
    category's prompts in a seeded shuffle, the categories taken in turn (in a seeded order; one whose prompts are
    all taken is skipped), so the first k requests cover min(k, categories) categories and the first len(categories)
    send every prompt once; past that the order starts again. Seeded by (seed, run): each run its own subset."""
    rng = random.Random(f"cover:{seed}:{run}")
    by_category: dict[str, list[int]] = {}
    for i, category in enumerate(categories):
        by_category.setdefault(category, []).append(i)
    names = sorted(by_category)
    rng.shuffle(names)
    queues = [by_category[name] for name in names]
    for queue in queues:
        rng.shuffle(queue)
    order = [
        queue[depth] for depth in range(max(map(len, queues), default=0)) for queue in queues if depth < len(queue)
    ]
    return [order[k % len(order)] for k in range(n)] if order else []


BUNDLED_DIR = Path(__file__).resolve().parent / "bundled_prompts"
# Named prompt sets shipped with orch (--prompts NAME): where prompt lookup (n-gram speculation) has text to copy,
# and where it has none, so a report can show both sides of its break-even. Chosen by their shape (lookup-friendly:
# answers that copy the prompt — code to edit, CSV to table, quote-to-summarise), not measured per model: on Gemma 3
# 270M one lookup-friendly prompt measured an accept length of 1.64 (docs/engines.md); results/byprompt shows which.
BUNDLED_SETS = ("lookup-friendly", "lookup-hostile")


def source_path(source: str) -> str:
    """A --prompts value as the file it reads: a bundled set's file, else the value itself (a JSONL path)."""
    return str(BUNDLED_DIR / f"{source}.jsonl") if source in BUNDLED_SETS else source


def request_sequence(source: str, n: int, *, seed: int, input_len: int | None = None) -> list[PromptItem]:
    """The n inputs of a benchmark: a pure function of (source, n, seed, input_len), so every arm gets the same."""
    if n <= 0:
        return []
    if source == "random":
        return random_items(n, input_len or 128, seed)
    if input_len is not None:
        raise BenchError(
            "--input-len applies to --prompts random only (builtin and file prompts have their own length)"
        )
    shared = SharedPrefix.parse(source)
    if shared is not None:
        return shared.items(n, seed)
    if source not in ("builtin", *BUNDLED_SETS) and not Path(source).exists() and not source.endswith(".jsonl"):
        names = ("builtin", "random", *BUNDLED_SETS)
        raise PromptFileError(
            f"--prompts {source!r}: no prompt set of that name{did_you_mean(source, names)} and no such file; "
            f"sets: {', '.join(names)}, {SHARED_PREFIX}GROUPSxPER_GROUP, or a JSONL file"
        )
    if source != "builtin":
        return sample_jsonl(source_path(source), lambda categories: sample_order(len(categories), n, seed))
    pool = builtin_items()
    return [pool[i] for i in sample_order(len(pool), n, seed)]
