"""A result bundle's records checked on read: the launches' slots, statuses and records, the runs against the
workload, the fingerprints, host facts, provenance and times, each by type, range, enumeration or format; a refusal
names the field's path and quotes the value on one line."""

from __future__ import annotations

import json
import math
import re
import unicodedata
from collections.abc import Mapping, Sequence
from typing import Any

from orchestrator import engines
from orchestrator.common.printable import visible
from orchestrator.config.profile import ENV_NAME_RE, NAME_RE, NAME_RULE, from_resolved, problems_of
from orchestrator.config.prompts import MAX_CATEGORY_CHARS
from orchestrator.config.workload import BenchConfig
from orchestrator.errors import BundleError, InputError, ProfileError
from orchestrator.results.schema import COUNTED, DUPLICATE
from orchestrator.stats.estimates import ORDERS

# Bounds on what a report prints on one line: a name, an id, a version, a hostname; a path or a one-line
# description; and free text (an error with its server's log tail), which nothing orch records comes near.
MAX_NAME = 256
MAX_LINE = 4096
MAX_TEXT = 1 << 20
# The store keeps a bundle's counts in SQLite INTEGER columns: a larger number could not be imported.
MAX_INT = 2**63 - 1
# Times are Unix seconds that a report turns into a date: from 1970 to the last second of the year 9999.
MAX_TIME = 253402300799.0
# An experiment id as orch makes it (config/design.new_experiment_id: time, then 6 hex digits), and a launch id as it
# makes those (namespace:time-hex, -rankN for a multi-node rank; letters, digits and . _ - : in any case).
ID_RE = re.compile(r"^[0-9]{8}-[0-9]{6}-[0-9a-f]{6}\Z")
ID_RULE = "YYYYMMDD-HHMMSS- and 6 hex digits, as orch names experiments"
LAUNCH_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,199}\Z")
SHA256_RE = re.compile(r"^[0-9a-f]{64}\Z")
GIT_SHA_RE = re.compile(r"^[0-9a-f]{7,64}\Z")
# hosts/base.NAMESPACE_RE's rule (results sits below hosts).
NAMESPACE_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}\Z")
KINDS = ("ab",)  # what orch stores: `orch ab`, `orch bench` (one arm), sweeps and nightly items are all A/B runs
LAUNCH_STATUSES = ("running", "complete", "failed", "interrupted", DUPLICATE)
TRUST_BASES = ("own-profiles", "signature", "trust-bundle", "answered-yes")
# What agent/facts.op_facts reads as text: each printed as it is.
HOST_TEXTS = (
    "hostname",
    "os",
    "kernel",
    "machine",
    "python",
    "python_executable",
    "psutil",
    "boot_id",
)
# The smallest difference worth calling (`--min-effect`, a suite's threshold) and `--target-tps`, as orch takes them.
MIN_EFFECT = (0.0, 0.5)
MAX_TPS = 1e7
# The order seed orch draws (`--order-seed`, at most 2**31 - 1).
MAX_SEED = 2**31 - 1


def shown(value: Any) -> str:
    """A value as a refusal quotes it: JSON (every control character escaped: one line), at most 40 characters."""
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def printable(value: str) -> bool:
    """No control, format (bidi) or separator characters: nothing that could rewrite a terminal's line."""
    return not any(unicodedata.category(ch)[0] == "C" or unicodedata.category(ch) in ("Zl", "Zp") for ch in value)


# ---------------------------------------------------------------- values


def check_line(value: Any, at: str, what: str = "text", *, limit: int = MAX_NAME, optional: bool = True) -> None:
    """Text a report prints on one line: printable, not empty, at most `limit` characters."""
    if value is None and optional:
        return
    if not isinstance(value, str) or not value or len(value) > limit or not printable(value):
        raise BundleError(f"{at}: {shown(value)} is not {what} (printable text on one line, 1 to {limit:,} characters)")


def check_text(value: Any, at: str, *, limit: int = MAX_TEXT, optional: bool = True) -> None:
    """Free text (an error, a reason: several lines are fine), at most `limit` characters."""
    if value is None and optional:
        return
    if not isinstance(value, str) or len(value) > limit:
        raise BundleError(f"{at}: expected text of at most {limit:,} characters, got {shown(value)}")


def check_int(value: Any, at: str, lo: int = 0, hi: int = MAX_INT, *, optional: bool = False) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise BundleError(f"{at}: expected a whole number from {lo:,} to {hi:,}, got {shown(value)}")


def check_bool(value: Any, at: str, *, optional: bool = True) -> None:
    if value is None and optional:
        return
    if not isinstance(value, bool):
        raise BundleError(f"{at}: expected true or false, got {shown(value)}")


def check_time(value: Any, at: str, *, optional: bool = False) -> None:
    """A moment as Unix seconds, one a report can print as a date."""
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= MAX_TIME:
        raise BundleError(f"{at}: expected a time (Unix seconds from 0 to {MAX_TIME:.0f}), got {shown(value)}")


def check_sha256(value: Any, at: str) -> None:
    """A sha256 digest, or null (none recorded)."""
    if value is not None and not (isinstance(value, str) and SHA256_RE.match(value)):
        raise BundleError(f"{at}: {shown(value)} is not a sha256 digest (64 lowercase hex digits)")


def check_name(value: Any, at: str) -> None:
    """A profile name (an arm's, a launch's): the rule of config/profile, and no longer than a file name."""
    if not isinstance(value, str) or not NAME_RE.match(value) or len(value) > 255:
        raise BundleError(f"{at}: {shown(value)} is not a profile name ({NAME_RULE}; at most 255)")


def check_choice(value: Any, at: str, options: Sequence[str]) -> None:
    if value not in options:
        raise BundleError(f"{at}: expected one of {', '.join(options)}, got {shown(value)}")


def check_object(value: Any, at: str, *, optional: bool = True) -> dict[str, Any]:
    if value is None and optional:
        return {}
    if not isinstance(value, dict):
        raise BundleError(f"{at}: expected an object, got {shown(value)}")
    return value


def check_list(value: Any, at: str, *, optional: bool = True) -> list[Any]:
    if value is None and optional:
        return []
    if not isinstance(value, list):
        raise BundleError(f"{at}: expected a list, got {shown(value)}")
    return value


def check_lines(value: Any, at: str, *, limit: int = MAX_NAME) -> None:
    """Facts a report prints as they are (a hostname, versions, GPU names): every text in them, at any depth,
    printable on one line and at most `limit` characters."""
    if isinstance(value, str):
        check_line(value, at, "a recorded fact", limit=limit)
    elif isinstance(value, dict):
        for key, item in value.items():
            check_lines(item, f"{at}.{key}", limit=limit)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            check_lines(item, f"{at}[{i}]", limit=limit)


def check_texts(value: Any, at: str, *, limit: int = MAX_NAME, but: Mapping[str, str] | None = None) -> dict[str, Any]:
    """An object of facts (a fingerprint's host, its software) each printable text on one line, or null; `but`: the
    keys that hold something else, and what ("path": longer text, "paths": a list of those, "bool", "count",
    "facts": an object of such facts and numbers, at any depth)."""
    found = check_object(value, at)
    for key, item in found.items():
        kind = (but or {}).get(key, "text")
        if kind == "facts":
            check_lines(check_object(item, f"{at}.{key}"), f"{at}.{key}")
        elif kind in ("text", "path"):
            check_line(item, f"{at}.{key}", "a recorded fact", limit=limit if kind == "text" else MAX_LINE)
        elif kind == "bool":
            check_bool(item, f"{at}.{key}")
        elif kind == "count":
            check_int(item, f"{at}.{key}", optional=True)
        else:
            for i, text in enumerate(check_list(item, f"{at}.{key}")):
                check_line(text, f"{at}.{key}[{i}]", "a recorded fact", limit=MAX_LINE, optional=False)
    return found


def check_record(value: Any, at: str) -> None:
    """Any JSON orch records (the whole content: a teardown, metrics, a fingerprint, a profile): every key a field
    name (printable, at most MAX_NAME characters), every number finite (Python's JSON reads NaN and Infinity), every
    text at most MAX_TEXT characters. The path is put together only for a refusal."""
    try:
        _walk(value)
    except _Bad as e:
        raise BundleError(f"{at}{''.join(reversed(e.path))}: {e.what}") from None
    except RecursionError:
        raise BundleError(f"{at}: nested too deeply; not a result bundle") from None


class _Bad(Exception):
    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what
        self.path: list[str] = []


def _walk(value: Any) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            if not key or len(key) > MAX_NAME or not printable(key):
                raise _Bad(f"the key {shown(key)} is no field or variable name (printable, 1 to {MAX_NAME} characters)")
            try:
                _walk(item)
            except _Bad as e:
                e.path.append(f".{key}")
                raise
    elif isinstance(value, list):
        for i, item in enumerate(value):
            try:
                _walk(item)
            except _Bad as e:
                e.path.append(f"[{i}]")
                raise
    elif isinstance(value, float) and not math.isfinite(value):
        raise _Bad(f"expected a finite number, got {shown(value)}")
    elif isinstance(value, str) and len(value) > MAX_TEXT:
        raise _Bad(f"longer than {MAX_TEXT:,} characters")


def check_resolved(data: Any, name: str, at: str) -> None:
    """A resolved profile (an arm's, a launch's, a fingerprint's) under its name, through the validation a profile
    file gets; its problems on one line."""
    if not isinstance(data, dict):
        raise BundleError(f"{at}: expected a resolved profile (an object), got {shown(data)}")
    if data.get("name") != name:
        raise BundleError(f"{at}.name: {shown(data.get('name'))} is not its arm's name ({shown(name)})")
    try:
        from_resolved(data, at)
    except InputError as e:
        # Each problem on its one line quotes the bundle's own names and values: made visible, joined on one line.
        problems = problems_of(e) if isinstance(e, ProfileError) else [str(e)]
        raise BundleError("; ".join(visible(problem) for problem in problems)) from None
    for i, link in enumerate(data.get("extends_chain") or ()):
        check_name(link, f"{at}.extends_chain[{i}]")
    check_text(data.get("source"), f"{at}.source", limit=MAX_LINE)
    check_text(data.get("description"), f"{at}.description")


# ---------------------------------------------------------------- the experiment and the file


def check_exported(exported: Any, at: str) -> None:
    """Who wrote the file: when, with which orch, and where it had been imported from."""
    ex = check_object(exported, at, optional=False)
    check_time(ex.get("at"), f"{at}.at")
    check_line(ex.get("orch_version"), f"{at}.orch_version", "a version", optional=False)
    check_line(ex.get("imported_from"), f"{at}.imported_from", "a path", limit=MAX_LINE)


def check_experiment_record(exp: Mapping[str, Any], at: str) -> None:
    """The experiment's kind, times, error and orch version (its id, status, host and arms are checked before)."""
    check_choice(exp["kind"], f"{at}.kind", KINDS)
    check_time(exp["created_at"], f"{at}.created_at")
    check_time(exp.get("finished_at"), f"{at}.finished_at", optional=True)
    check_text(exp.get("error"), f"{at}.error")
    check_line(exp["orch_version"], f"{at}.orch_version", "a version", optional=False)


def check_design_slots(design: Mapping[str, Any] | None, arms: int, at: str) -> None:
    """A design's order, seed and schedule: every block launches every arm once; an auto plan's blocks within it."""
    if design is None:
        return
    check_choice(design["order"], f"{at}.order", ORDERS)
    check_int(design["seed"], f"{at}.seed", 0, MAX_SEED)
    schedule = design["schedule"]
    if len(schedule) != design["blocks"]:
        raise BundleError(f"{at}.schedule: {len(schedule)} blocks scheduled, but the design has {design['blocks']}")
    for b, block in enumerate(schedule):
        if sorted(block) != list(range(arms)):
            raise BundleError(
                f"{at}.schedule[{b}]: {shown(block)} does not launch each of the {arms} arms once (0..{arms - 1})"
            )


def check_slots(launches: list[dict[str, Any]], design: Mapping[str, Any] | None, arms: list[str], at: str) -> None:
    """Each launch in a slot of the design (its block, its position in the block, that position's arm), and one
    launch that ran to the end per block and arm, as the store holds them."""
    schedule: list[list[int]] = design["schedule"] if design is not None else [list(range(len(arms)))]
    held: dict[tuple[int, int], int] = {}
    for i, launch in enumerate(launches):
        where = f"{at}[{i}]"
        block, position, arm = launch["block"], launch["position"], launch["arm_index"]
        if not 0 <= block < len(schedule):
            raise BundleError(f"{where}.block: {block} is not a block of the design (0..{len(schedule) - 1})")
        if not 0 <= position < len(arms):
            raise BundleError(f"{where}.position: {position} is not a position in a block (0..{len(arms) - 1})")
        if schedule[block][position] != arm:
            slot = schedule[block][position]
            raise BundleError(
                f"{where}.position: block {block} launches arm {slot} ({arms[slot]}) at position {position}, not arm "
                f"{arm} ({arms[arm]})"
            )
        check_choice(launch["status"], f"{where}.status", LAUNCH_STATUSES)
        if launch["status"] in COUNTED:
            if (block, arm) in held:
                raise BundleError(
                    f"{where}: a second launch of arm {arm} ({arms[arm]}) in block {block}: "
                    f'launches[{held[block, arm]}] holds that slot (an older store marks such a duplicate "duplicate")'
                )
            held[block, arm] = i


# ---------------------------------------------------------------- launches and runs


def check_launch_record(launch: Mapping[str, Any], at: str) -> None:
    """What a launch recorded besides its slot and runs: when, what it ran with, and its evidence."""
    check_time(launch["started_at"], f"{at}.started_at")
    check_text(launch.get("error"), f"{at}.error")
    check_resolved(launch["resolved_profile"], launch["profile"], f"{at}.resolved_profile")
    for i, arg in enumerate(launch["argv"]):
        check_text(arg, f"{at}.argv[{i}]", limit=MAX_LINE * 16, optional=False)
    for key, value in launch["env"].items():  # what the server was started with: orch's variables and the profile's
        if not ENV_NAME_RE.match(key):
            raise BundleError(f"{at}.env: {shown(key)} is not an environment variable name")
        check_text(value, f"{at}.env.{key}", optional=False)
    for key in ("env_report", "teardown", "gpus"):
        check_object(launch.get(key), f"{at}.{key}")
    if launch.get("fingerprint") is not None:
        check_fingerprint(launch["fingerprint"], launch["profile"], f"{at}.fingerprint")


def check_fingerprint(fp: Any, profile: str, at: str) -> None:
    """A launch's fingerprint: its digests, its time, and the facts `orch compare` prints (host, GPUs, software,
    orch's version) printable on one line."""
    check_object(fp, at, optional=False)
    check_int(fp.get("version"), f"{at}.version", 1, 1000)
    check_time(fp.get("collected_at"), f"{at}.collected_at", optional=True)
    check_text(fp.get("error"), f"{at}.error")
    for key in ("profile_sha256", "workload_sha256", "workload_digest"):
        check_sha256(fp.get(key), f"{at}.{key}")
    # The CPU's facts and its measured speed (agent/cpu) are objects of names and numbers.
    check_texts(fp.get("host"), f"{at}.host", but={"cpu": "facts", "speed": "facts"})
    # The server's Python and the models it serves may be paths; the rest are names and versions.
    software = {
        "python_executable": "path",
        "served_models": "paths",
        "reports_orch_simulator": "bool",
        "engine_build": "facts",  # how the engine was built: names at any depth (Engine.build_probe)
    }
    check_texts(fp.get("software"), f"{at}.software", but=software)
    gpus = check_object(fp.get("gpus"), f"{at}.gpus")
    check_int(gpus.get("count"), f"{at}.gpus.count", optional=True)
    check_lines(gpus, f"{at}.gpus")
    check_lines(check_object(fp.get("attached"), f"{at}.attached"), f"{at}.attached", limit=MAX_LINE)
    made_by = check_object(fp.get("orch"), f"{at}.orch")
    check_line(made_by.get("version"), f"{at}.orch.version", "a version")
    if made_by.get("git_sha") is not None and not (
        isinstance(made_by["git_sha"], str) and GIT_SHA_RE.match(made_by["git_sha"])
    ):
        raise BundleError(f"{at}.orch.git_sha: {shown(made_by['git_sha'])} is not a git commit (hex digits)")
    env = check_object(fp.get("env"), f"{at}.env")
    check_int(env.get("processes"), f"{at}.env.processes", optional=True)
    check_object(env.get("sim_knobs"), f"{at}.env.sim_knobs")
    for key in ("workers", "inherited"):  # the servers' environment: variables and their (masked) values
        for name, value in check_object(env.get(key), f"{at}.env.{key}").items():
            check_text(value, f"{at}.env.{key}.{name}")
    for i, arg in enumerate(check_list(fp.get("argv"), f"{at}.argv")):
        check_text(arg, f"{at}.argv[{i}]", limit=MAX_LINE * 16, optional=False)
    for i, item in enumerate(check_list(fp.get("unreadable"), f"{at}.unreadable")):
        check_line(
            check_object(item, f"{at}.unreadable[{i}]", optional=False).get("field"), f"{at}.unreadable[{i}].field"
        )
        check_text(item.get("why"), f"{at}.unreadable[{i}].why")
    if fp.get("profile") is not None:
        check_resolved(fp["profile"], profile, f"{at}.profile")


def check_run_record(run: Mapping[str, Any], bench: BenchConfig, at: str) -> None:
    """A run in the workload: a warmup (concurrency 1) or a timed run at one of its levels, its index within the
    count of its kind; its time, sources and metrics."""
    if run["warmup"]:
        if run["concurrency"] != 1 or run.get("rate") is not None:
            raise BundleError(f"{at}: a warmup runs at concurrency 1, got {_level(run)}")
        if run["idx"] >= bench.warmup:
            raise BundleError(
                f"{at}.idx: {run['idx']} is not a warmup of the workload ({_indexes(bench.warmup, 'warmups')})"
            )
    else:
        if run.get("rate") is None and run["concurrency"] not in bench.concurrency:
            raise BundleError(
                f"{at}.concurrency: {_level(run)} is not a level of the workload ({shown(bench.concurrency)})"
            )
        if run.get("rate") is not None and not any(math.isclose(run["rate"], r, rel_tol=1e-9) for r in bench.rate):
            raise BundleError(f"{at}.rate: {_level(run)} is not a level of the workload ({shown(list(bench.rate))})")
        if run["idx"] >= bench.runs:
            raise BundleError(
                f"{at}.idx: {run['idx']} is not a run of the workload ({_indexes(bench.runs, 'runs per level')})"
            )
    check_time(run["finished_at"], f"{at}.finished_at")
    check_line(run.get("accept_source"), f"{at}.accept_source", "a source", limit=MAX_LINE)
    check_line(run.get("token_source"), f"{at}.token_source", "a source", limit=MAX_LINE)
    check_text(run.get("invalid_reason"), f"{at}.invalid_reason")
    for k, req in enumerate(run["per_request"]):
        check_text(req.get("error"), f"{at}.per_request[{k}].error")
        if req.get("arrivals_s") is not None and any(t < 0 for t in req["arrivals_s"]):
            raise BundleError(f"{at}.per_request[{k}].arrivals_s: expected seconds of at least 0")


def _indexes(count: int, what: str) -> str:
    return f"its {count} {what} are 0..{count - 1}" if count else f"it has no {what}"


def _level(run: Mapping[str, Any]) -> str:
    return f"concurrency {run['concurrency']}" if run.get("rate") is None else f"{shown(run['rate'])} req/s"


# ---------------------------------------------------------------- the config


def check_config_record(config: Mapping[str, Any], arms: list[str], at: str) -> None:
    """What the experiment's config records besides its workload, digests and judgement: the host's facts, the flags
    it ran with, where it ran, the profiles as they were, and why it ran (a night, a reproduction, a sweep)."""
    check_host_facts(config.get("host_facts"), f"{at}.host_facts")
    for key in ("strict_env", "allow_mixed", "allow_node_mismatch", "cache_measured"):
        check_bool(config.get(key), f"{at}.{key}")
    for i, port in enumerate(check_list(config.get("ports"), f"{at}.ports")):
        check_int(port, f"{at}.ports[{i}]", 1, 65535)
    effect = config.get("min_effect", 0.02)
    if isinstance(effect, bool) or not (isinstance(effect, int | float) and MIN_EFFECT[0] < effect < MIN_EFFECT[1]):
        raise BundleError(f"{at}.min_effect: expected a fraction above 0 and below 0.5, got {shown(effect)}")
    tps = config.get("target_tps")
    if tps is not None and not (isinstance(tps, int | float) and not isinstance(tps, bool) and 0 < tps <= MAX_TPS):
        raise BundleError(f"{at}.target_tps: expected tok/s above 0 and at most {MAX_TPS:g}, got {shown(tps)}")
    profiles = check_list(config.get("profiles"), f"{at}.profiles")
    # A later export hands these on as the arms' profiles: they pass the same checks.
    if len(profiles) == len(arms):
        for i, data in enumerate(profiles):
            check_resolved(data, arms[i], f"{at}.profiles[{i}]")
    for i, path in enumerate(check_list(config.get("profile_sources"), f"{at}.profile_sources")):
        check_text(path, f"{at}.profile_sources[{i}]", limit=MAX_LINE, optional=False)
    check_line(config.get("host_spec"), f"{at}.host_spec", "a --host", limit=MAX_LINE)
    check_text(config.get("workdir"), f"{at}.workdir", limit=MAX_LINE)
    namespace = config.get("namespace")
    if namespace is not None and not (isinstance(namespace, str) and NAMESPACE_RE.match(namespace)):
        raise BundleError(
            f"{at}.namespace: {shown(namespace)} is not a namespace (1-64 letters, digits, '_', '.', '-')"
        )
    check_dataset(config.get("dataset"), f"{at}.dataset")
    check_nightly(config.get("nightly"), f"{at}.nightly")
    reproduces = config.get("reproduces")
    if reproduces is not None:
        if not (isinstance(reproduces, str) and ID_RE.match(reproduces)):
            raise BundleError(f"{at}.reproduces: {shown(reproduces)} is not an experiment id ({ID_RULE})")
        digest = config.get("reproduces_digest")
        if digest is not None and not (isinstance(digest, str) and SHA256_RE.match(digest.removeprefix("sha256:"))):
            raise BundleError(f"{at}.reproduces_digest: {shown(digest)} is not a bundle digest (sha256:<64 hex>)")
    check_trust(config.get("bundle_trust"), f"{at}.bundle_trust")
    for key in ("sweep", "sweep_probe"):
        check_object(config.get(key), f"{at}.{key}")


def check_host_facts(facts: Any, at: str) -> None:
    """The host's facts as a report prints them: names and versions on one line (its GPU error is free text), a
    multi-node host's facts per node alike."""
    found = check_object(facts, at)
    for key, value in found.items():
        if key in HOST_TEXTS or key in engines.fact_packages():  # a package's version (engines.fact_packages)
            check_line(value, f"{at}.{key}", "a recorded fact", limit=MAX_LINE)
        elif key in ("cpu_count", "mem_total_bytes"):
            check_int(value, f"{at}.{key}", optional=True)
        elif key == "boot_time":
            check_time(value, f"{at}.{key}", optional=True)
        elif key == "gpus":
            for i, gpu in enumerate(check_list(value, f"{at}.gpus")):
                check_lines(check_object(gpu, f"{at}.gpus[{i}]", optional=False), f"{at}.gpus[{i}]")
        elif key in ("gpu_error", "node_mismatches"):
            for i, text in enumerate(value if isinstance(value, list) else [value]):
                check_text(text, f"{at}.{key}" + (f"[{i}]" if isinstance(value, list) else ""))
        elif key == "nodes":
            for node, node_facts in check_object(value, f"{at}.nodes").items():
                check_line(node, f"{at}.nodes", "a node name")
                check_host_facts(node_facts, f"{at}.nodes.{node}")
        else:
            check_lines(value, f"{at}.{key}", limit=MAX_LINE)


def check_dataset(dataset: Any, at: str) -> None:
    """Where the requests came from, as a report names it: its name, format, origin and licence on one line."""
    found = check_object(dataset, at)
    check_sha256(found.get("sha256"), f"{at}.sha256")
    for key in ("name", "format", "origin", "licence"):
        check_line(found.get(key), f"{at}.{key}", limit=MAX_LINE)
    for key in ("path", "sent_from"):
        check_text(found.get(key), f"{at}.{key}", limit=MAX_LINE)


def check_nightly(night: Any, at: str) -> None:
    """The night an experiment of `orch nightly` ran for, as `orch list` shows it."""
    found = check_object(night, at)
    if not found:
        return
    for key in ("night_id", "suite", "item"):
        check_line(found.get(key), f"{at}.{key}", "a name", optional=False)
    check_time(found.get("night_at"), f"{at}.night_at", optional=True)


def check_trust(trust: Any, at: str) -> None:
    """What decided that a reproduction ran (experiment/trust.Trust.to_dict)."""
    found = check_object(trust, at)
    if not found:
        return
    check_choice(found.get("basis"), f"{at}.basis", TRUST_BASES)
    check_text(found.get("note"), f"{at}.note")
    for i, name in enumerate(check_list(found.get("differing_arms"), f"{at}.differing_arms")):
        check_name(name, f"{at}.differing_arms[{i}]")
    check_object(found.get("signature"), f"{at}.signature")


def check_prompt_record(prompts: Mapping[str, Any], at: str) -> None:
    """The prompt set's names and paths, and each bundled item's shape (the receiver writes them out as JSONL)."""
    check_line(prompts["source"], f"{at}.source", "a prompt set", limit=MAX_LINE)
    check_bool(prompts.get("generated"), f"{at}.generated")
    check_text(prompts.get("path"), f"{at}.path", limit=MAX_LINE)
    check_text(prompts.get("note"), f"{at}.note")
    for i, item in enumerate(prompts.get("items") or []):
        where = f"{at}.items[{i}]"
        if not isinstance(item.get("prompt"), str) and not isinstance(item.get("messages"), list):
            raise BundleError(f'{where}: expected a "prompt" (text) or "messages" (a list)')
        check_line(item.get("category"), f"{where}.category", "a category", limit=MAX_CATEGORY_CHARS)
        check_int(item.get("output_len"), f"{where}.output_len", 1, optional=True)
    trace = prompts.get("trace")
    if isinstance(trace, dict):
        check_line(trace["name"], f"{at}.trace.name", "a file name", limit=MAX_LINE)
        check_text(trace.get("path"), f"{at}.trace.path", limit=MAX_LINE)
        check_text(trace.get("note"), f"{at}.trace.note")
