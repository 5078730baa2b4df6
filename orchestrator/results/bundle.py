"""Result bundles: one versioned, self-contained file per experiment (design, profiles, workload, every value)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from orchestrator import __version__, files
from orchestrator.common.printable import visible
from orchestrator.common.redaction import SECRET_FLAG_RE
from orchestrator.config import datasets, prompts, sessions
from orchestrator.config import profile as profiles_mod
from orchestrator.config.slo import SLO
from orchestrator.config.workload import BenchConfig, requests_digest
from orchestrator.errors import BundleError, InputError, OrchError, StoreError
from orchestrator.results.bundleformat import (
    BUNDLE_FORMAT,
    BUNDLE_VERSION,
    LAUNCH_COLUMNS,
    LAUNCH_FIELDS,
    MAX_BUNDLE_BYTES,
    MAX_PROMPT_BYTES,
    OPTIONAL_REQUEST_FIELDS,
    OPTIONAL_RUN_FIELDS,
    REQUEST_FIELDS,
    RUN_FIELDS,
    SIGNATURE_NAMESPACE,
    SIGNED_VERSION,
    UNSIGNED_VERSION,
    WITHHELD,
    bench_config,
    check_bundle,
    content_digest,
    digest_of,
    read_bundle,
    signature_key,
    signed_bytes,
    withhold,
)
from orchestrator.results.load import load_result
from orchestrator.results.model import ABResult
from orchestrator.results.store import Store

# The format's names are re-exported: callers need only this module.
__all__ = [
    "BUNDLE_FORMAT",
    "BUNDLE_VERSION",
    "MAX_BUNDLE_BYTES",
    "MAX_PROMPT_BYTES",
    "SIGNATURE_NAMESPACE",
    "SIGNED_VERSION",
    "UNSIGNED_VERSION",
    "WITHHELD",
    "AlreadyImported",
    "bench_config",
    "check_bundle",
    "content_digest",
    "digest_of",
    "import_bundle",
    "make_bundle",
    "profiles_from_bundle",
    "prompt_file_text",
    "prompt_set",
    "read_bundle",
    "requests_sha256",
    "result_from_bundle",
    "secret_variable",
    "signature_key",
    "signed_bytes",
    "trace_file_text",
    "trace_set",
    "withhold",
    "write_bundle",
]


class AlreadyImported(OrchError):
    """The bundle is already in this store (not a failure: importing is idempotent)."""

    def __init__(self, message: str, exp_id: str) -> None:
        super().__init__(message)
        self.exp_id = exp_id


# ---------------------------------------------------------------- making one


def _loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def make_bundle(store: Store, ref: str) -> dict[str, Any]:
    """Everything needed to re-run and judge a stored experiment, as one JSON-ready document, checked as a receiver
    checks it: a store record no bundle may hold (an arm name with a newline, written there by hand) is a
    BundleError naming it, so that every bundle orch writes reads back."""
    exp = store.find_experiment(ref)
    config = json.loads(exp["config_json"])
    arms = json.loads(exp["arms_json"])
    launch_rows = store.launches(exp["id"])
    launches = [_launch(store, row) for row in launch_rows]
    content = {
        "experiment": {
            "id": exp["id"],
            "kind": exp["kind"],
            "status": exp["status"],
            "simulated": bool(exp["simulated"]),
            "host": exp["host"],
            "arms": arms,
            "created_at": exp["created_at"],
            "finished_at": exp["finished_at"],
            "error": exp["error"],
            "orch_version": exp["orch_version"],
        },
        "config": config,
        "design": _loads(exp.get("design_json")),
        "profiles": _profiles(exp["id"], arms, config, launch_rows),
        "prompts": None,
        "launches": launches,
    }
    imported = _loads(exp.get("imported_json")) or {}
    # An imported experiment's prompts are the ones it came with: its config names a file on the sender's disk, which
    # is not here (or, worse, is another file of the same name), so handing it on must not read that path.
    content["prompts"] = imported["prompts"] if isinstance(imported.get("prompts"), dict) else prompt_set(config)
    bundle: dict[str, Any] = {
        "format": BUNDLE_FORMAT,
        "version": UNSIGNED_VERSION,  # results/signing makes it SIGNED_VERSION with its signature
        "exported": {"at": time.time(), "orch_version": __version__, "imported_from": imported.get("from")},
        "content": withhold(content),
    }
    bundle["digest"] = digest_of(bundle)
    try:
        check_bundle(bundle, f"experiment {visible(str(exp['id']))} in {store.path}")
    except BundleError as e:
        raise BundleError(f"{e}; not exported: a bundle holding it would not be read back") from None
    return bundle


def _launch(store: Store, row: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in LAUNCH_FIELDS:
        if key == "runs":
            continue
        column = LAUNCH_COLUMNS.get(key, key)
        out[key] = _loads(row.get(column)) if column.endswith("_json") else row.get(column)
    if out["position"] is None:
        out["position"] = row["arm_index"]
    per_run: dict[tuple[int, int, float, int], list[dict[str, Any]]] = {}
    for r in store.requests(row["launch_id"]):
        request = {k: r.get(k) for k in REQUEST_FIELDS if k != "arrivals_s"} | {
            "arrivals_s": _loads(r.get("arrivals_json"))
        }
        for k in OPTIONAL_REQUEST_FIELDS:
            if request[k] is None:
                del request[k]
        per_run.setdefault((r["run_warmup"], r["run_concurrency"], r.get("run_rate") or 0.0, r["run_idx"]), []).append(
            request
        )
    runs = []
    for r in store.runs(row["launch_id"]):
        run = {k: r.get(k) for k in RUN_FIELDS if k not in ("metrics", "per_request", *OPTIONAL_RUN_FIELDS)}
        if r.get("rate"):
            run["rate"] = r["rate"]
        run["warmup"], run["valid"] = bool(r["warmup"]), bool(r["valid"])
        run["metrics"] = _loads(r.get("metrics_json"))
        run["per_request"] = per_run.get((r["warmup"], r["concurrency"], r.get("rate") or 0.0, r["idx"]), [])
        runs.append(run)
    out["runs"] = runs
    return out


def _profiles(exp_id: str, arms: list[str], config: dict[str, Any], launches: list[dict[str, Any]]) -> list[Any]:
    stored = config.get("profiles")
    if isinstance(stored, list) and len(stored) == len(arms):
        return stored
    # An experiment stored before its config kept the profiles: each arm's first launch has it.
    found: dict[int, dict[str, Any]] = {}
    for row in launches:
        found.setdefault(int(row["arm_index"]), json.loads(row["profile_json"]))
    if len(found) < len(arms):
        raise StoreError(f"experiment {exp_id} was stored without its resolved profiles; it cannot be bundled")
    return [{k: v for k, v in found[i].items() if k not in ("source", "description")} for i in range(len(arms))]


def requests_sha256(bench: BenchConfig) -> str:
    return requests_digest(bench)


def prompt_set(config: dict[str, Any]) -> dict[str, Any]:
    """Built-in and random prompts are generated from the config; a prompt file travels with the bundle itself
    (if it is small enough and still the file the experiment sent), else as its digest and where it was."""
    recorded = config.get("requests_sha256")
    bench = config.get("bench") or {}
    source = str(bench.get("prompts", "builtin"))
    # Generated (builtin, random, shared-prefix:...) from the config; a shipped dataset is checked by its sha256 at use.
    if prompts.generated(source) or source in datasets.SHIPPED:
        generated = {"source": source, "generated": True, "requests_sha256": recorded}
        return generated | ({"trace": trace_set(bench)} if bench.get("trace") else {})
    # A bundled set (--prompts lookup-friendly) travels as its items too: the receiver's orch may ship other ones.
    source = prompts.source_path(source)
    out: dict[str, Any] = {"source": "file", "path": source, "requests_sha256": recorded, "items": None}
    try:
        size = Path(source).stat().st_size
        if size > MAX_PROMPT_BYTES:
            out["note"] = f"the file is {size} bytes, over the {MAX_PROMPT_BYTES}-byte limit for bundling"
            return out
        items = datasets.load_file(source)
        if recorded is not None and requests_sha256(bench_config(config)) != recorded:
            out["note"] = "the file changed since the experiment ran; only its digest is bundled"
            return out
        if bench.get("turns"):
            out["items"] = session_items(source)
            return out
    except (OSError, InputError, KeyError, TypeError, ValueError) as e:
        out["note"] = f"the file could not be read at export ({e}); only its digest is bundled"
        return out
    out["items"] = [
        {
            "category": it.category,
            **({"prompt": it.text} if it.text is not None else {"messages": it.messages}),
            **({"output_len": it.output_len} if it.output_len is not None else {}),
        }
        for it in items
    ]
    return out


def session_items(source: str) -> list[dict[str, Any]]:
    """A multi-turn experiment's file as JSONL `messages` lines, every user turn of each conversation in file order
    (its system messages first): read back as sessions they are the same sessions in the same order, where a
    prompt item would keep only each conversation's first turn."""
    out = []
    for s in sessions.reader(source)(source):
        if s is None:
            continue
        messages = [*s.context, *({"role": "user", "content": t} for t in s.turns)]
        item: dict[str, Any] = {"category": s.category, "messages": messages}
        out.append(item | ({"output_len": s.output_len} if s.output_len is not None else {}))
    return out


def trace_set(bench: Mapping[str, Any]) -> dict[str, Any]:
    """A replayed trace: its lines verbatim (so that, written out again, it has the sha256 the experiment recorded)
    if it is small enough and still the file the experiment replayed, else its name, path and sha256 only."""
    path = str(bench["trace"])
    recorded = bench.get("trace_sha256")
    out: dict[str, Any] = {"name": Path(path).name, "path": path, "sha256": recorded, "lines": None}
    try:
        size = Path(path).stat().st_size
        if size > MAX_PROMPT_BYTES:
            out["note"] = f"the trace is {size} bytes, over the {MAX_PROMPT_BYTES}-byte limit for bundling"
            return out
        with files.open_regular(path) as f:
            data = f.read(MAX_PROMPT_BYTES + 1)
        if len(data) > MAX_PROMPT_BYTES:
            out["note"] = f"the trace grew past the {MAX_PROMPT_BYTES}-byte limit for bundling"
            return out
        if hashlib.sha256(data).hexdigest() != recorded:
            out["note"] = "the trace changed since the experiment ran; only its sha256 is bundled"
            return out
        out["lines"] = data.decode("utf-8").splitlines(keepends=True)
    except (OSError, files.NotRegularFile, UnicodeDecodeError) as e:
        out["note"] = f"the trace could not be read at export ({e}); only its sha256 is bundled"
    return out


def trace_file_text(bundle: Mapping[str, Any]) -> str | None:
    """The bundled trace's file as it was replayed (its sha256 is the recorded one), or None when not bundled."""
    trace = bundle["content"]["prompts"].get("trace")
    lines = trace.get("lines") if isinstance(trace, dict) else None
    return None if lines is None else "".join(lines)


def prompt_file_text(bundle: Mapping[str, Any]) -> str | None:
    """The bundled prompt file as JSONL (write it and point the workload at it to send the same requests), or None
    when the prompts are generated or were not bundled."""
    items = bundle["content"]["prompts"].get("items")
    if items is None:
        return None
    return "".join(json.dumps(item, ensure_ascii=False) + "\n" for item in items)


# ---------------------------------------------------------------- files


def bundle_text(bundle: Mapping[str, Any]) -> str:
    return json.dumps(bundle, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def write_bundle(bundle: Mapping[str, Any], path: str | Path | files.Output) -> None:
    """Write by files.write_output's rule: a file is either the whole bundle or not there."""
    files.write_output(path, bundle_text(bundle), "the bundle")


# ---------------------------------------------------------------- using one


def import_bundle(store: Store, bundle: Mapping[str, Any], source: str = "") -> str:
    """Put a (checked) bundle into the store as an experiment under its own id, marked imported; returns the id.
    AlreadyImported if the same experiment is already there; StoreError if a different one holds its id."""
    content = bundle["content"]
    exp = content["experiment"]
    exp_id = exp["id"]
    mine = content_digest(content)
    existing = store.experiment(exp_id)
    if existing is not None:
        before = _loads(existing.get("imported_json"))
        if before is not None:
            same, origin = before.get("content_sha256") == mine, f"imported from {visible(str(before.get('from')))}"
        else:
            same, origin = content_digest(make_bundle(store, exp_id)["content"]) == mine, "recorded here"
        if same:
            raise AlreadyImported(f"experiment {exp_id} is already in {store.path} ({origin}); nothing to do", exp_id)
        raise StoreError(
            f"{store.path} already holds a different experiment {exp_id} ({origin}) than the one in "
            f"{source or 'this bundle'}; both cannot be stored under one id: import into another --db"
        )
    launch_ids = [launch["launch_id"] for launch in content["launches"]]
    taken = store.launch_ids_taken(launch_ids)
    if taken:
        raise StoreError(
            f"{store.path} already holds launch {taken[0]} (of another experiment) that {source or 'this bundle'} "
            "also has; import into another --db"
        )
    imported = {
        "from": source,
        "at": time.time(),
        "digest": bundle["digest"],
        "content_sha256": mine,
        "prompts": content["prompts"],  # what a later export hands on (the config's file path is the sender's)
    }
    experiment_row = {
        "id": exp_id,
        "kind": exp["kind"],
        "created_at": exp["created_at"],
        "finished_at": exp.get("finished_at"),
        "status": exp["status"],
        "simulated": int(bool(exp["simulated"])),
        "host": exp["host"],
        "arms_json": json.dumps(exp["arms"]),
        "config_json": json.dumps(content["config"]),
        "orch_version": exp["orch_version"],
        "error": exp.get("error"),
        "design_json": None if content.get("design") is None else json.dumps(content["design"]),
        "imported_json": json.dumps(imported),
    }
    launches, runs, requests = [], [], []
    for launch in content["launches"]:
        row = {"experiment_id": exp_id}
        for key in LAUNCH_FIELDS:
            if key == "runs":
                continue
            column = LAUNCH_COLUMNS.get(key, key)
            value = launch.get(key)
            row[column] = (None if value is None else json.dumps(value)) if column.endswith("_json") else value
        launches.append(row)
        for run in launch["runs"]:
            warmup = int(bool(run["warmup"]))
            run_row = {k: run.get(k) for k in RUN_FIELDS if k not in ("metrics", "per_request")}
            run_row.update(
                launch_id=launch["launch_id"],
                warmup=warmup,
                valid=int(bool(run["valid"])),
                metrics_json=json.dumps(run.get("metrics") or {}),
                rate=float(run.get("rate") or 0.0),
            )
            runs.append(run_row)
            for req in run["per_request"]:
                requests.append(
                    {k: req.get(k) for k in REQUEST_FIELDS if k != "arrivals_s"}
                    | {
                        "arrivals_json": None if req.get("arrivals_s") is None else json.dumps(req["arrivals_s"]),
                        "launch_id": launch["launch_id"],
                        "run_warmup": warmup,
                        "run_concurrency": run["concurrency"],
                        "run_rate": float(run.get("rate") or 0.0),
                        "run_idx": run["idx"],
                    }
                )
    store.import_experiment(experiment_row, launches, runs, requests)
    return str(exp_id)


def result_from_bundle(
    bundle: Mapping[str, Any], *, min_effect: float | None = None, slo: SLO | None = None, metric: str | None = None
) -> ABResult:
    """The bundle's experiment as the ABResult `orch show` renders, read without touching the user's store."""
    store = Store(":memory:")
    try:
        exp_id = import_bundle(store, bundle)
        return load_result(store, exp_id, min_effect=min_effect, slo=slo, metric=metric)
    finally:
        store.close()


def profiles_from_bundle(
    bundle: Mapping[str, Any], environ: Mapping[str, str] | None = None
) -> list[profiles_mod.Profile]:
    """The resolved profiles as validated Profiles. A withheld secret comes from the receiver's environment: an env
    secret from the same-named variable, an argv secret (`--api-key`) from ORCH_SECRET_<FLAG> (ORCH_SECRET_API_KEY)."""
    env = os.environ if environ is None else environ
    content = bundle["content"]
    out: list[profiles_mod.Profile] = []
    for i, data in enumerate(content["profiles"]):
        missing: list[str] = []

        def fill(name: str, value: str, missing: list[str] = missing) -> str:
            if WITHHELD not in value:
                return value
            if name not in env:
                missing.append(name)
                return value
            # The variable holds the whole value, also where only part was withheld (a URL's userinfo).
            return env[name]

        resolved = dict(data)
        if isinstance(resolved.get("env"), dict):
            resolved["env"] = {k: fill(k, v) if isinstance(v, str) else v for k, v in resolved["env"].items()}
        if isinstance(resolved.get("server_args"), list):
            resolved["server_args"] = _fill_argv(resolved["server_args"], fill)
        name = data.get("name", content["experiment"]["arms"][i])
        if missing:
            raise InputError(
                f"profile {name!r} was run with secrets the sender withheld; set {', '.join(missing)} in orch's "
                "environment (an argv secret --FLAG comes from ORCH_SECRET_<FLAG>, e.g. ORCH_SECRET_API_KEY)"
            )
        out.append(profiles_mod.from_resolved(resolved, f"bundle profiles[{i}] ({name})"))
    return out


def secret_variable(flag: str) -> str:
    """Where the receiver provides a withheld argv secret: --api-key → ORCH_SECRET_API_KEY."""
    return "ORCH_SECRET_" + re.sub(r"[^A-Za-z0-9]", "_", flag.lstrip("-")).upper()


def _fill_argv(argv: list[Any], fill: Callable[[str, str], str]) -> list[Any]:
    out: list[Any] = []
    for i, arg in enumerate(argv):
        if not isinstance(arg, str) or WITHHELD not in arg:
            out.append(arg)
            continue
        flag, eq, value = arg.partition("=")
        # --api-key=X, or NAME=X as given to env(1); not a value that merely holds "=" (`jdbc:…?password=X`)
        if eq and WITHHELD in value and (flag.startswith("-") or re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", flag)):
            # the latter from the same-named variable
            out.append(f"{flag}={fill(flag if not flag.startswith('-') else secret_variable(flag), value)}")
        elif i > 0 and isinstance(argv[i - 1], str) and (SECRET_FLAG_RE.match(argv[i - 1]) or argv[i - 1][:2] == "--"):
            # after a secret flag, or a URL with its userinfo withheld after any flag (--proxy http://…@host)
            out.append(fill(secret_variable(argv[i - 1]), arg))
        else:
            out.append(fill("ORCH_SECRET_VALUE", arg))  # no flag to name it after: say so rather than guess
    return out
