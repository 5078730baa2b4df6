"""The result bundle's format: its fields, digest and secret markers, and the checks a file must pass to be read."""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

from orchestrator import __version__, files
from orchestrator.common.printable import visible
from orchestrator.config import arrivals, limits
from orchestrator.config.slo import stored_judgement
from orchestrator.config.workload import BenchConfig
from orchestrator.errors import BundleError, InputError
from orchestrator.fields import FieldError, int_range
from orchestrator.results.bundlefields import (
    ID_RE,
    ID_RULE,
    LAUNCH_ID_RE,
    MAX_INT,
    MAX_LINE,
    MAX_NAME,
    check_config_record,
    check_design_slots,
    check_experiment_record,
    check_exported,
    check_launch_record,
    check_line,
    check_name,
    check_prompt_record,
    check_record,
    check_resolved,
    check_run_record,
    check_sha256,
    check_slots,
    shown,
)
from orchestrator.results.sshsig import SignatureFormatError, SignatureKey, read_signature
from orchestrator.stats.sequential import SequentialPlan

BUNDLE_FORMAT = "orch-result-bundle"
# Version 2 adds "signature" (an SSH signature of the rest: signed_bytes). A bundle without one is still written as
# version 1, which every orch reads; the newest version this orch reads is BUNDLE_VERSION.
BUNDLE_VERSION = 2
UNSIGNED_VERSION = 1
SIGNED_VERSION = 2
# What an orch bundle signature is made for (`ssh-keygen -Y sign -n`): a signature made for git or a file is not one.
SIGNATURE_NAMESPACE = "orch-bundle"
MAX_BUNDLE_BYTES = 200 * 1024 * 1024
# A prompt file larger than this travels as its digest and original path only.
MAX_PROMPT_BYTES = 5 * 1024 * 1024
# A secret in the store is a digest keyed with that store's key: useless to anyone else. The bundle says only that
# it was set, so the receiver knows to provide it.
WITHHELD = "<withheld: set by the sender>"
_DIGEST_RE = re.compile(r"<redacted hmac:[0-9a-f]*>")
check_port = int_range(1, 65535)
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
    "rate": "num?",  # open loop: the level's requests per second (concurrency 0); absent for closed loop
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
    "arrivals_s": "list?",  # the token-arrival profile (store column arrivals_json); absent from older bundles
    # open loop only (absent for closed loop): when the request was due, how late it was sent, how long a cap held it
    "scheduled_s": "num?",
    "send_lag_s": "num?",
    "queued_s": "num?",
}
# Fields a bundle carries only where they have a value (open loop): a closed-loop experiment's bundle stays what it was
# before they existed, digest and all.
OPTIONAL_RUN_FIELDS = frozenset({"rate"})
OPTIONAL_REQUEST_FIELDS = frozenset({"scheduled_s", "send_lag_s", "queued_s"})
# Counts, durations and rates: a negative one is no measurement (and breaks the log-scale statistics).
NOT_NEGATIVE = frozenset(
    {
        "idx", "tokens", "seconds", "tok_s", "aggregate_tok_s", "prompt_tokens", "ttft_s", "spec_accept_length",
        "spec_verify_ct", "requests", "errors", "e2e_s", "chunks", "accept_length", "ready_s", "pid",
        "rate", "scheduled_s", "send_lag_s", "queued_s",
    }
)  # fmt: skip
# Bundle key → store column, where they differ (the store keeps JSON in *_json text columns).
LAUNCH_COLUMNS = {
    "resolved_profile": "profile_json",
    "argv": "argv_json",
    "env": "env_json",
    "preflight": "preflight_json",
    "env_report": "env_report_json",
    "teardown": "teardown_json",
    "gpus": "gpus_json",
    "fingerprint": "fingerprint_json",
}


# ---------------------------------------------------------------- digests and secrets


def canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def digest_of(bundle: Mapping[str, Any]) -> str:
    """sha256 over the canonical JSON of everything in the bundle but the digest itself (its signature included)."""
    return "sha256:" + hashlib.sha256(canonical({k: v for k, v in bundle.items() if k != "digest"})).hexdigest()


def signed_bytes(bundle: Mapping[str, Any]) -> bytes:
    """What a bundle's signature signs: the canonical JSON of everything but the digest and the signature."""
    return canonical({k: v for k, v in bundle.items() if k not in ("digest", "signature")})


def signature_key(bundle: Mapping[str, Any]) -> SignatureKey | None:
    """The key a (checked) bundle says it was signed with, or None when it is not signed; not verified."""
    armored = bundle.get("signature")
    return None if armored is None else read_signature(armored)


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


def bench_config(config: Mapping[str, Any]) -> BenchConfig:
    """The workload a bundle's (or a stored) config describes."""
    known = {f.name for f in fields(BenchConfig)}
    data = {k: v for k, v in dict(config["bench"]).items() if k in known}
    data["concurrency"] = tuple(data.get("concurrency", (1,)))
    data["rate"] = tuple(data.get("rate") or ())
    return BenchConfig(**data)


def read_bundle(path: str | Path) -> dict[str, Any]:
    """A bundle file, checked (format, version, digest, every field) before anyone uses it."""
    # The file's name may come with the file (a download): quoted on one line like everything in it.
    where = visible(str(path))
    try:
        with files.open_regular(path) as f:
            data = f.read(MAX_BUNDLE_BYTES + 1)
    except files.NotRegularFile as e:
        raise BundleError(f"{where}: {e}, not a result bundle") from None
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
        body = text.strip()
        # Cut short (an interrupted copy): an object that never closes, failing on its last line.
        if body.startswith("{") and not body.endswith("}") and e.lineno >= text.rstrip().count("\n") + 1:
            raise BundleError(
                f"{where}: truncated: the JSON ends at byte {len(data)} in the middle of the document (an interrupted "
                "copy or download?); ask for the file again"
            ) from None
        raise BundleError(
            f"{where}: not JSON (line {e.lineno}, column {e.colno}: {e.msg}); not a result bundle"
        ) from None
    except RecursionError:
        raise BundleError(f"{where}: JSON nested too deeply; not a result bundle") from None
    except ValueError:  # an integer of thousands of digits, which Python refuses to convert
        raise BundleError(f"{where}: a number in it is too long; not a result bundle") from None
    return check_bundle(bundle, where)


def check_bundle(bundle: Any, where: str) -> dict[str, Any]:
    if not isinstance(bundle, dict) or bundle.get("format") != BUNDLE_FORMAT:
        hint = ""
        if isinstance(bundle, dict) and "experiment_id" in bundle and "comparisons" in bundle:
            hint = "; it looks like `orch export --format json` output, which cannot be re-run or imported"
        raise BundleError(
            f'{where}: not an orch result bundle (no "format": "{BUNDLE_FORMAT}"){hint}; '
            "ask for the file `orch export ID --format bundle` writes"
        )
    version = bundle.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise BundleError(f"{where}: version: expected a positive integer, got {shown(version)}")
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
    _check_signature(bundle, version, where)
    check_exported(bundle.get("exported"), f"{where}: exported")
    # Every key, number and text of the content first: the checks of each field below see finite numbers.
    check_record(bundle.get("content"), f"{where}: content")
    _check_content(bundle.get("content"), where)
    return bundle


# ---------------------------------------------------------------- validation


def _check_signature(bundle: Mapping[str, Any], version: int, where: str) -> None:
    """Its shape only: whether it verifies, and whose key it is, takes ssh-keygen and an allowed-signers file."""
    if "signature" not in bundle:
        return
    if version < SIGNED_VERSION:
        raise BundleError(f"{where}: signature: a version {version} bundle carries none (signed ones are version 2)")
    try:
        key = read_signature(bundle["signature"])
    except SignatureFormatError as e:
        raise BundleError(f"{where}: signature: {e}") from None
    if key.namespace != SIGNATURE_NAMESPACE:
        raise BundleError(
            f"{where}: signature: made for {key.namespace!r}, not for an orch bundle ({SIGNATURE_NAMESPACE!r})"
        )


def _type_ok(value: Any, code: str) -> bool:
    code = code.rstrip("?")
    if code == "any":
        return True
    # JSON has no NaN or Infinity: a bundle holding them was not written by orch. The store keeps these numbers in
    # SQLite columns, whose integers have 64 bits (a float past that is a REAL, which a range check may still refuse).
    if code == "num":
        if isinstance(value, float):
            return math.isfinite(value)
        return isinstance(value, int) and not isinstance(value, bool) and abs(value) <= MAX_INT
    if code == "int":
        return isinstance(value, int) and not isinstance(value, bool) and abs(value) <= MAX_INT
    if code == "bool":
        return isinstance(value, bool) or (isinstance(value, int) and value in (0, 1))
    return isinstance(value, {"str": str, "dict": dict, "list": list}[code])


_NAMES = {"str": "text", "int": "an integer", "num": "a finite number", "bool": "true or false", "dict": "an object"}


def _check(obj: Any, spec: Mapping[str, str], where: str) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise BundleError(f"{where}: expected an object, got {shown(obj)}")
    for key, code in spec.items():
        value = obj.get(key)
        if value is None and code.endswith("?"):
            continue
        if key not in obj:
            raise BundleError(f"{where}.{key}: required field is missing")
        if not _type_ok(value, code):
            expected = _NAMES.get(code.rstrip("?"), "a list")
            if code.rstrip("?") in ("int", "num") and isinstance(value, int) and not isinstance(value, bool):
                expected = f"a number of at most {MAX_INT:,} in size (what the store holds)"
            raise BundleError(f"{where}.{key}: expected {expected}, got {shown(value)}")
        if key in NOT_NEGATIVE and code.rstrip("?") in ("int", "num") and isinstance(value, int | float) and value < 0:
            raise BundleError(f"{where}.{key}: expected a number of at least 0, got {shown(value)}")
    return obj


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
    arms = _check_experiment(c["experiment"], f"{where}: content.experiment")
    _check(c["config"], {"bench": "dict", "requests_sha256": "str?", "host_facts": "dict?"}, f"{where}: content.config")
    _check_config_ids(c["config"], f"{where}: content.config")
    try:
        stored_judgement(c["config"], f"{where}: content.config")
    except InputError as e:
        raise BundleError(visible(str(e))) from None
    bench = _check_bench(c["config"], where)
    check_config_record(c["config"], arms, f"{where}: content.config")
    if c["design"] is not None:
        _check_design(c["design"], len(arms), f"{where}: content.design")
    if len(c["profiles"]) != len(arms) or not all(isinstance(p, dict) for p in c["profiles"]):
        raise BundleError(f"{where}: content.profiles: expected one resolved profile (an object) per arm ({len(arms)})")
    for i, data in enumerate(c["profiles"]):
        check_resolved(data, arms[i], f"{where}: content.profiles[{i}]")
    _check_prompts(c["prompts"], f"{where}: content.prompts")
    _check_launches(c["launches"], arms, c["design"], bench, f"{where}: content.launches")


def _check_experiment(exp: Any, where: str) -> list[str]:
    """The experiment's identity: its id, status, host and arms (profile names); returns the arms."""
    _check(exp, EXPERIMENT_FIELDS, where)
    if not ID_RE.match(exp["id"]):
        raise BundleError(f"{where}.id: {shown(exp['id'])} is not an experiment id ({ID_RULE})")
    if exp["status"] not in STATUSES:
        raise BundleError(f"{where}.status: expected one of {', '.join(STATUSES)}, got {shown(exp['status'])}")
    check_line(exp["host"], f"{where}.host", "a host name", optional=False)
    arms: list[str] = exp["arms"]
    if not arms:
        raise BundleError(f"{where}.arms: expected a non-empty list of profile names")
    for i, arm in enumerate(arms):
        check_name(arm, f"{where}.arms[{i}]")
    check_experiment_record(exp, where)
    return arms


def _check_launches(
    launches: list[Any], arms: list[str], design: Mapping[str, Any] | None, bench: BenchConfig, where: str
) -> None:
    ids = []
    for i, launch in enumerate(launches):
        at = f"{where}[{i}]"
        _check(launch, LAUNCH_FIELDS, at)
        if not LAUNCH_ID_RE.match(launch["launch_id"]):
            raise BundleError(f"{at}.launch_id: {shown(launch['launch_id'])} is not an orch launch id")
        ids.append(launch["launch_id"])
        if not 0 <= launch["arm_index"] < len(arms):
            raise BundleError(f"{at}.arm_index: {launch['arm_index']} is not an arm (0..{len(arms) - 1})")
        if launch["profile"] != arms[launch["arm_index"]]:
            raise BundleError(
                f"{at}.profile: {shown(launch['profile'])} is not its arm's profile "
                f"({shown(arms[launch['arm_index']])})"
            )
        if launch["block"] < 0 or launch["position"] < 0:
            raise BundleError(f"{at}: block and position must not be negative")
        check_launch_record(launch, at)
        for j, run in enumerate(launch["runs"]):
            _check_run(run, f"{at}.runs[{j}]")
            check_run_record(run, bench, f"{at}.runs[{j}]")
        keys = [
            (bool(r["warmup"]), r["concurrency"], r["idx"])
            if r.get("rate") is None
            else (bool(r["warmup"]), f"{r['rate']:g} req/s", r["idx"])
            for r in launch["runs"]
        ]
        _unique(keys, at, "run")
    _unique(ids, where, "launch id")
    check_slots(launches, design, arms, where)


def _check_config_ids(config: Mapping[str, Any], at: str) -> None:
    """The digests and the port a reproduction checks its data against and serves on (checked on read, so `orch
    import` and `orch show` refuse what `orch reproduce` would)."""
    check_sha256(config.get("requests_sha256"), f"{at}.requests_sha256")
    bench = config["bench"]
    check_sha256(bench.get("trace_sha256"), f"{at}.bench.trace_sha256")
    dataset = config.get("dataset")
    if dataset is not None:
        if not isinstance(dataset, dict):
            raise BundleError(f"{at}.dataset: expected an object, got {shown(dataset)}")
        check_sha256(dataset.get("sha256"), f"{at}.dataset.sha256")
    if config.get("port") is not None:
        try:
            check_port(config["port"])
        except FieldError as e:
            raise BundleError(f"{at}.port: {visible(str(e))}") from None


def _check_bench(config: Mapping[str, Any], where: str) -> BenchConfig:
    """The workload, within the limits `orch ab` keeps: a bundle is re-run from these numbers (`orch reproduce`);
    its prompt set's name and trace's path printable on one line, as reports name them."""
    at = f"{where}: content.config.bench"
    try:
        bench = bench_config(config)
    except (TypeError, ValueError) as e:
        raise BundleError(f"{at}: not a workload this orch understands ({visible(str(e))})") from None
    try:
        limits.check_workload(bench, "content.config.bench.")
    except limits.PlanError as e:
        raise BundleError(f"{where}: {visible(str(e))}") from None
    check_line(bench.prompts, f"{at}.prompts", "a prompt set or a file", limit=MAX_LINE)
    check_line(bench.trace, f"{at}.trace", "a trace file", limit=MAX_LINE)
    check_line(bench.arrivals, f"{at}.arrivals", "an arrival process", limit=MAX_NAME)
    return bench


def _check_prompts(prompts: Any, at: str) -> None:
    """The prompt set: generated, or a file's items; and a replayed trace's lines, where it was bundled."""
    _check(prompts, {"source": "str", "requests_sha256": "str?"}, at)
    check_sha256(prompts.get("requests_sha256"), f"{at}.requests_sha256")
    items = prompts.get("items")
    if items is not None and not (isinstance(items, list) and all(isinstance(i, dict) for i in items)):
        raise BundleError(f"{at}.items: expected a list of prompt objects")
    trace = prompts.get("trace")
    if trace is not None:
        _check(trace, {"name": "str", "sha256": "str?", "lines": "list?"}, f"{at}.trace")
        check_sha256(trace.get("sha256"), f"{at}.trace.sha256")
        if trace.get("lines") is not None and not all(isinstance(line, str) for line in trace["lines"]):
            raise BundleError(f"{at}.trace.lines: expected a list of the trace's lines (text)")
    check_prompt_record(prompts, at)


def _check_run(run: Any, at: str) -> None:
    _check(run, RUN_FIELDS, at)
    if run.get("rate") is not None:
        if run["concurrency"] != 0 or not 0 < run["rate"] <= arrivals.MAX_RATE:
            raise BundleError(
                f"{at}: an open-loop run has concurrency 0 and a rate above 0 and at most "
                f"{arrivals.MAX_RATE:g}, got concurrency {run['concurrency']} and rate {shown(run['rate'])}"
            )
    elif not 1 <= run["concurrency"] <= limits.LEVELS[1]:
        raise BundleError(f"{at}.concurrency: expected 1 to {limits.LEVELS[1]}, got {run['concurrency']}")
    if run["valid"] and not run["warmup"] and run["tok_s"] <= 0:
        raise BundleError(f"{at}.tok_s: a valid run measured more than 0 tok/s, got {shown(run['tok_s'])}")
    for k, req in enumerate(run["per_request"]):
        _check(req, REQUEST_FIELDS, f"{at}.per_request[{k}]")
        if req.get("arrivals_s") is not None and not all(_type_ok(t, "num") for t in req["arrivals_s"]):
            raise BundleError(f"{at}.per_request[{k}].arrivals_s: expected a list of seconds")
    _unique([r["idx"] for r in run["per_request"]], f"{at}", "request index")


def _check_design(design: Any, arms: int, where: str) -> None:
    _check(design, {"blocks": "int", "order": "str", "seed": "int", "schedule": "list"}, where)
    try:
        limits.check_blocks(design["blocks"], f"{where}.blocks")
    except limits.PlanError as e:
        raise BundleError(str(e)) from None
    if design.get("auto") is not None:
        try:
            plan = SequentialPlan.from_dict(design["auto"])
        except (KeyError, TypeError, ValueError, OverflowError) as e:
            raise BundleError(
                f"{where}.auto: not a --blocks auto plan this orch understands ({visible(str(e))})"
            ) from None
        if not plan.min_blocks <= design["blocks"] <= plan.max_blocks:
            raise BundleError(
                f"{where}.blocks: {design['blocks']} blocks, outside its auto plan's {plan.min_blocks} to "
                f"{plan.max_blocks}"
            )
    for b, block in enumerate(design["schedule"]):
        if not isinstance(block, list) or not all(_type_ok(a, "int") and 0 <= a < arms for a in block):
            raise BundleError(f"{where}.schedule[{b}]: expected a list of arm indexes (0..{arms - 1})")
    check_design_slots(design, arms, where)
