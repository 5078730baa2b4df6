"""Result bundles: one versioned, self-contained file per experiment (design, profiles, workload, every value)."""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

from orchestrator import __version__, prompts
from orchestrator import profile as profiles_mod
from orchestrator.bench import BenchConfig, request_items
from orchestrator.errors import BundleError, InputError, OrchError, StoreError
from orchestrator.redaction import SECRET_FLAG_RE
from orchestrator.results import ABResult, load_result
from orchestrator.store import Store

BUNDLE_FORMAT = "orch-result-bundle"
BUNDLE_VERSION = 1
MAX_BUNDLE_BYTES = 200 * 1024 * 1024
# A prompt file larger than this travels as its digest and original path only.
MAX_PROMPT_BYTES = 5 * 1024 * 1024
# A secret in the store is a digest keyed with that store's key: useless to anyone else. The bundle says only that
# it was set, so the receiver knows to provide it.
WITHHELD = "<withheld: set by the sender>"
_DIGEST_RE = re.compile(r"<redacted hmac:[0-9a-f]*>")
ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
STATUSES = ("running", "complete", "failed", "interrupted")

# The bundle's fields and their store columns: this table, not the schema, defines the format.
# Type codes: str int num bool dict list any; a trailing "?" allows null or absence.
EXPERIMENT_FIELDS = {
    "id": "str",
    "kind": "str",
    "status": "str",
    "simulated": "bool",
    "host": "str",
    "arms": "list",
    "created_at": "num",
    "finished_at": "num?",
    "error": "str?",
    "orch_version": "str",
}
LAUNCH_FIELDS = {
    "launch_id": "str",
    "arm_index": "int",
    "block": "int",
    "position": "int",
    "profile": "str",
    "resolved_profile": "dict",
    "argv": "list",
    "env": "dict",
    "pid": "int?",
    "started_at": "num",
    "ready_s": "num?",
    "preflight": "any?",
    "env_report": "dict?",
    "teardown": "dict?",
    "gpus": "dict?",
    "fingerprint": "dict?",
    "status": "str",
    "error": "str?",
    "runs": "list",
}
RUN_FIELDS = {
    "warmup": "bool",
    "concurrency": "int",
    "idx": "int",
    "tokens": "int",
    "seconds": "num",
    "tok_s": "num",
    "aggregate_tok_s": "num?",
    "prompt_tokens": "int",
    "ttft_s": "num?",
    "spec_accept_length": "num?",
    "spec_verify_ct": "int?",
    "accept_source": "str?",
    "token_source": "str?",
    "requests": "int",
    "errors": "int",
    "metrics": "dict?",
    "valid": "bool",
    "invalid_reason": "str?",
    "finished_at": "num",
    "per_request": "list",
}
REQUEST_FIELDS = {
    "idx": "int",
    "tokens": "int",
    "prompt_tokens": "int?",
    "ttft_s": "num?",
    "e2e_s": "num?",
    "chunks": "int?",
    "accept_length": "num?",
    "error": "str?",
}
# Bundle key → store column, where they differ (the store keeps JSON in *_json text columns).
_LAUNCH_COLUMNS = {
    "resolved_profile": "profile_json",
    "argv": "argv_json",
    "env": "env_json",
    "preflight": "preflight_json",
    "env_report": "env_report_json",
    "teardown": "teardown_json",
    "gpus": "gpus_json",
    "fingerprint": "fingerprint_json",
}


class AlreadyImported(OrchError):
    """The bundle is already in this store (not a failure: importing is idempotent)."""

    def __init__(self, message: str, exp_id: str) -> None:
        super().__init__(message)
        self.exp_id = exp_id


# ---------------------------------------------------------------- digests and secrets


def canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def digest_of(bundle: Mapping[str, Any]) -> str:
    """sha256 over the canonical JSON of everything in the bundle but the digest itself."""
    return "sha256:" + hashlib.sha256(canonical({k: v for k, v in bundle.items() if k != "digest"})).hexdigest()


def content_digest(content: Any) -> str:
    """The experiment's own identity, apart from when and by whom it was exported."""
    return "sha256:" + hashlib.sha256(canonical(content)).hexdigest()


def withhold(obj: Any) -> Any:
    """obj with every secret digest replaced by WITHHELD (in strings at any depth)."""
    if isinstance(obj, str):
        return _DIGEST_RE.sub(WITHHELD, obj)
    if isinstance(obj, list):
        return [withhold(v) for v in obj]
    if isinstance(obj, dict):
        return {k: withhold(v) for k, v in obj.items()}
    return obj


# ---------------------------------------------------------------- making one


def _loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def make_bundle(store: Store, ref: str) -> dict[str, Any]:
    """Everything needed to re-run and judge a stored experiment, as one JSON-ready document."""
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
        "prompts": prompt_set(config),
        "launches": launches,
    }
    imported = _loads(exp.get("imported_json")) or {}
    bundle: dict[str, Any] = {
        "format": BUNDLE_FORMAT,
        "version": BUNDLE_VERSION,
        "exported": {"at": time.time(), "orch_version": __version__, "imported_from": imported.get("from")},
        "content": withhold(content),
    }
    bundle["digest"] = digest_of(bundle)
    return bundle


def _launch(store: Store, row: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in LAUNCH_FIELDS:
        if key == "runs":
            continue
        column = _LAUNCH_COLUMNS.get(key, key)
        out[key] = _loads(row.get(column)) if column.endswith("_json") else row.get(column)
    if out["position"] is None:
        out["position"] = row["arm_index"]
    per_run: dict[tuple[int, int, int], list[dict[str, Any]]] = {}
    for r in store.requests(row["launch_id"]):
        per_run.setdefault((r["run_warmup"], r["run_concurrency"], r["run_idx"]), []).append(
            {k: r[k] for k in REQUEST_FIELDS}
        )
    runs = []
    for r in store.runs(row["launch_id"]):
        run = {k: r.get(k) for k in RUN_FIELDS if k not in ("metrics", "per_request")}
        run["warmup"], run["valid"] = bool(r["warmup"]), bool(r["valid"])
        run["metrics"] = _loads(r.get("metrics_json"))
        run["per_request"] = per_run.get((r["warmup"], r["concurrency"], r["idx"]), [])
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


def bench_config(config: Mapping[str, Any]) -> BenchConfig:
    """The workload a bundle's (or a stored) config describes."""
    known = {f.name for f in fields(BenchConfig)}
    data = {k: v for k, v in dict(config["bench"]).items() if k in known}
    data["concurrency"] = tuple(data.get("concurrency", (1,)))
    return BenchConfig(**data)


def requests_sha256(bench: BenchConfig) -> str:
    return hashlib.sha256(json.dumps(request_items(bench), sort_keys=True).encode()).hexdigest()


def prompt_set(config: dict[str, Any]) -> dict[str, Any]:
    """Built-in and random prompts are generated from the config; a prompt file travels with the bundle itself
    (if it is small enough and still the file the experiment sent), else as its digest and where it was."""
    recorded = config.get("requests_sha256")
    source = str((config.get("bench") or {}).get("prompts", "builtin"))
    if source in ("builtin", "random"):
        return {"source": source, "generated": True, "requests_sha256": recorded}
    out: dict[str, Any] = {"source": "file", "path": source, "requests_sha256": recorded, "items": None}
    try:
        size = Path(source).stat().st_size
        if size > MAX_PROMPT_BYTES:
            out["note"] = f"the file is {size} bytes, over the {MAX_PROMPT_BYTES}-byte limit for bundling"
            return out
        items = prompts.load_jsonl(source)
        if recorded is not None and requests_sha256(bench_config(config)) != recorded:
            out["note"] = "the file changed since the experiment ran; only its digest is bundled"
            return out
    except (OSError, InputError, KeyError, TypeError, ValueError) as e:
        out["note"] = f"the file could not be read at export ({e}); only its digest is bundled"
        return out
    out["items"] = [
        {"category": it.category, **({"prompt": it.text} if it.text is not None else {"messages": it.messages})}
        for it in items
    ]
    return out


def prompt_file_text(bundle: Mapping[str, Any]) -> str | None:
    """The bundled prompt file as JSONL (write it and point the workload at it to send the same requests), or None
    when the prompts are generated or were not bundled."""
    items = bundle["content"]["prompts"].get("items")
    if items is None:
        return None
    return "".join(json.dumps(item, ensure_ascii=False) + "\n" for item in items)


# ---------------------------------------------------------------- files


def write_bundle(bundle: Mapping[str, Any], path: str | Path) -> None:
    """Write atomically: the file is either the whole bundle or not there."""
    target = Path(path)
    data = json.dumps(bundle, indent=1, sort_keys=True, ensure_ascii=False) + "\n"
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent or Path("."))
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(data)
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as e:
        raise StoreError(f"{path}: cannot write the bundle: {e.strerror or e}") from e


def read_bundle(path: str | Path) -> dict[str, Any]:
    """A bundle file, checked (format, version, digest, every field) before anyone uses it."""
    where = str(path)
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_BUNDLE_BYTES + 1)
    except IsADirectoryError:
        raise BundleError(f"{where}: is a directory, not a result bundle") from None
    except OSError as e:
        raise BundleError(f"{where}: cannot read the bundle: {e.strerror or e}") from e
    if len(data) > MAX_BUNDLE_BYTES:
        raise BundleError(f"{where}: larger than {MAX_BUNDLE_BYTES // 2**20} MiB; not a result bundle orch can read")
    if not data.strip():
        raise BundleError(f"{where}: the file is empty, not a result bundle")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BundleError(f"{where}: not UTF-8 text (byte {e.start}); not a result bundle") from None
    try:
        bundle = json.loads(text)
    except json.JSONDecodeError as e:
        if e.pos >= len(text.rstrip()):
            raise BundleError(
                f"{where}: truncated: the JSON ends at byte {len(data)} in the middle of the document (an interrupted "
                "copy or download?); ask for the file again"
            ) from None
        raise BundleError(
            f"{where}: not JSON (line {e.lineno}, column {e.colno}: {e.msg}); not a result bundle"
        ) from None
    except RecursionError:
        raise BundleError(f"{where}: JSON nested too deeply; not a result bundle") from None
    return check_bundle(bundle, where)


def check_bundle(bundle: Any, where: str) -> dict[str, Any]:
    if not isinstance(bundle, dict) or bundle.get("format") != BUNDLE_FORMAT:
        hint = ""
        if isinstance(bundle, dict) and "experiment_id" in bundle and "comparisons" in bundle:
            hint = " It looks like `orch export --format json` output, which cannot be re-run or imported;"
        raise BundleError(
            f'{where}: not an orch result bundle (no "format": "{BUNDLE_FORMAT}").{hint} '
            "Ask for the file `orch export ID --format bundle` writes"
        )
    version = bundle.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise BundleError(f"{where}: version: expected a positive integer, got {json.dumps(version)[:40]}")
    if version > BUNDLE_VERSION:
        raise BundleError(
            f"{where}: bundle version {version} is newer than this orch ({__version__}) understands "
            f"(up to {BUNDLE_VERSION}); upgrade orch to read it"
        )
    digest = bundle.get("digest")
    if not isinstance(digest, str):
        raise BundleError(f"{where}: digest: missing; the file is incomplete or was not written by orch")
    if digest != digest_of(bundle):
        raise BundleError(
            f"{where}: the content does not match its digest (edited or damaged after export); "
            "ask the sender for the file again"
        )
    _check_content(bundle.get("content"), where)
    return bundle


# ---------------------------------------------------------------- validation


def _type_ok(value: Any, code: str) -> bool:
    code = code.rstrip("?")
    if code == "any":
        return True
    if code == "num":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if code == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if code == "bool":
        return isinstance(value, bool) or (isinstance(value, int) and value in (0, 1))
    return isinstance(value, {"str": str, "dict": dict, "list": list}[code])


_NAMES = {"str": "text", "int": "an integer", "num": "a finite number", "bool": "true or false", "dict": "an object"}


def _check(obj: Any, spec: Mapping[str, str], where: str) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise BundleError(f"{where}: expected an object, got {_shown(obj)}")
    for key, code in spec.items():
        value = obj.get(key)
        if value is None and code.endswith("?"):
            continue
        if key not in obj:
            raise BundleError(f"{where}.{key}: required field is missing")
        if not _type_ok(value, code):
            expected = _NAMES.get(code.rstrip("?"), "a list")
            raise BundleError(f"{where}.{key}: expected {expected}, got {_shown(value)}")
    return obj


def _shown(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _unique(keys: list[Any], where: str, what: str) -> None:
    seen: set[Any] = set()
    for key in keys:
        if key in seen:
            raise BundleError(f"{where}: {what} {key} appears twice")
        seen.add(key)


def _check_content(content: Any, where: str) -> None:
    c = _check(
        content,
        {
            "experiment": "dict",
            "config": "dict",
            "design": "dict?",
            "profiles": "list",
            "prompts": "dict",
            "launches": "list",
        },
        f"{where}: content",
    )
    exp = _check(c["experiment"], EXPERIMENT_FIELDS, f"{where}: content.experiment")
    if not ID_RE.match(exp["id"]):
        raise BundleError(f"{where}: content.experiment.id: {_shown(exp['id'])} is not an experiment id")
    if exp["status"] not in STATUSES:
        raise BundleError(f"{where}: content.experiment.status: expected one of {', '.join(STATUSES)}")
    arms = exp["arms"]
    if not arms or not all(isinstance(a, str) for a in arms):
        raise BundleError(f"{where}: content.experiment.arms: expected a non-empty list of profile names")
    _check(c["config"], {"bench": "dict", "requests_sha256": "str?", "host_facts": "dict?"}, f"{where}: content.config")
    for key in ("min_effect", "target_tps"):
        value = c["config"].get(key)
        if value is not None and not (_type_ok(value, "num") and math.isfinite(value)):
            raise BundleError(f"{where}: content.config.{key}: expected a finite number")
    try:
        bench_config(c["config"])
    except (TypeError, ValueError) as e:
        raise BundleError(f"{where}: content.config.bench: not a workload this orch understands ({e})") from None
    if c["design"] is not None:
        _check_design(c["design"], len(arms), f"{where}: content.design")
    if len(c["profiles"]) != len(arms) or not all(isinstance(p, dict) for p in c["profiles"]):
        raise BundleError(f"{where}: content.profiles: expected one resolved profile (an object) per arm ({len(arms)})")
    _check(c["prompts"], {"source": "str", "requests_sha256": "str?"}, f"{where}: content.prompts")
    items = c["prompts"].get("items")
    if items is not None and not (isinstance(items, list) and all(isinstance(i, dict) for i in items)):
        raise BundleError(f"{where}: content.prompts.items: expected a list of prompt objects")
    ids = []
    for i, launch in enumerate(c["launches"]):
        at = f"{where}: content.launches[{i}]"
        _check(launch, LAUNCH_FIELDS, at)
        ids.append(launch["launch_id"])
        if not 0 <= launch["arm_index"] < len(arms):
            raise BundleError(f"{at}.arm_index: {launch['arm_index']} is not an arm (0..{len(arms) - 1})")
        if launch["block"] < 0 or launch["position"] < 0:
            raise BundleError(f"{at}: block and position must not be negative")
        for j, run in enumerate(launch["runs"]):
            _check(run, RUN_FIELDS, f"{at}.runs[{j}]")
            for k, req in enumerate(run["per_request"]):
                _check(req, REQUEST_FIELDS, f"{at}.runs[{j}].per_request[{k}]")
            _unique([r["idx"] for r in run["per_request"]], f"{at}.runs[{j}]", "request index")
        _unique([(bool(r["warmup"]), r["concurrency"], r["idx"]) for r in launch["runs"]], at, "run")
    _unique(ids, f"{where}: content.launches", "launch id")


def _check_design(design: Any, arms: int, where: str) -> None:
    _check(design, {"blocks": "int", "order": "str", "seed": "int", "schedule": "list"}, where)
    for b, block in enumerate(design["schedule"]):
        if not isinstance(block, list) or not all(_type_ok(a, "int") and 0 <= a < arms for a in block):
            raise BundleError(f"{where}.schedule[{b}]: expected a list of arm indexes (0..{arms - 1})")


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
            same, origin = before.get("content_sha256") == mine, f"imported from {before.get('from')}"
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
    imported = {"from": source, "at": time.time(), "digest": bundle["digest"], "content_sha256": mine}
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
            column = _LAUNCH_COLUMNS.get(key, key)
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
            )
            runs.append(run_row)
            for req in run["per_request"]:
                requests.append(
                    {k: req.get(k) for k in REQUEST_FIELDS}
                    | {
                        "launch_id": launch["launch_id"],
                        "run_warmup": warmup,
                        "run_concurrency": run["concurrency"],
                        "run_idx": run["idx"],
                    }
                )
    store.import_experiment(experiment_row, launches, runs, requests)
    return str(exp_id)


def result_from_bundle(bundle: Mapping[str, Any], *, min_effect: float | None = None) -> ABResult:
    """The bundle's experiment as the ABResult `orch show` renders, read without touching the user's store."""
    store = Store(":memory:")
    try:
        exp_id = import_bundle(store, bundle)
        return load_result(store, exp_id, min_effect=min_effect)
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
            return value.replace(WITHHELD, env[name])

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
        if eq and WITHHELD in value:
            # --api-key=X, or NAME=X as given to env(1): the latter from the same-named variable
            out.append(f"{flag}={fill(flag if not flag.startswith('-') else secret_variable(flag), value)}")
        elif i > 0 and isinstance(argv[i - 1], str) and SECRET_FLAG_RE.match(argv[i - 1]):
            out.append(fill(secret_variable(argv[i - 1]), arg))
        else:
            out.append(fill("ORCH_SECRET_VALUE", arg))  # no flag to name it after: say so rather than guess
    return out
