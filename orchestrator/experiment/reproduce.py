"""Reproducing a result: a bundle's design re-run from fresh state and judged against what it recorded, and the
fingerprint differences that most likely explain a difference."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from orchestrator import files
from orchestrator.config import limits
from orchestrator.config.design import ABConfig
from orchestrator.config.profile import Profile
from orchestrator.config.workload import request_items
from orchestrator.errors import InputError, OrchError
from orchestrator.experiment.ab import run_ab
from orchestrator.hosts.base import Host
from orchestrator.launch import fingerprint
from orchestrator.results import bundle as bundle_mod
from orchestrator.results.compare import ExperimentComparison, compare
from orchestrator.results.model import ABResult
from orchestrator.results.run import RunResult
from orchestrator.results.store import Store
from orchestrator.ui.events import QUIET, Events


class JudgingFailed(OrchError):
    """The new experiment ran and is stored, but judging it against the recorded one failed: exit 1, naming it."""

    def __init__(self, exp_id: str, source: str, cause: BaseException) -> None:
        super().__init__(
            f"the reproduction ran and is stored as experiment {exp_id}, but judging it against the recorded result "
            f"failed ({type(cause).__name__}: {cause}); see it with `orch show {exp_id}`, or judge it again with "
            f"`orch compare {source} {exp_id}`"
        )
        self.exp_id = exp_id


def check_plan(bundle: dict[str, Any], profiles: list[Profile], blocks: int | None, source: str) -> None:
    """The bundle's plan (its blocks unless `blocks` overrides them) within the limits `orch ab` keeps, refused
    before anything is generated or launched: a bundle may have been written by anyone."""
    design = bundle["content"].get("design") or {}
    try:
        limits.checked_plan(
            bundle_mod.bench_config(bundle["content"]["config"]),
            profiles,
            blocks=blocks if blocks is not None else design.get("blocks", 1),
            sim=bool(bundle["content"]["experiment"]["simulated"]),
        )
    except limits.PlanError as e:
        raise limits.PlanError(f"{source}: the bundle's plan is refused: {e}") from None


def likely_causes(recorded: ABResult, new: ABResult, arm_map: Mapping[str, str] | None = None) -> list[str]:
    """What differs between the two experiments' fingerprints, most likely to move the numbers first. Each arm's
    first fingerprinted launch on each side is compared (a multi-node one with every node's facts; arms paired by
    name, or by arm_map: new's name -> recorded's); a difference seen in several arms is said once."""
    ranked: dict[str, int] = {}
    names = arm_map or {}
    for arm in recorded.arms:
        other = next((b for b in new.arms if names.get(b.label, b.label) == arm.label), None)
        if other is None:
            continue
        before = next((launch.fingerprint for launch in arm.launches if launch.fingerprint), None)
        after = next((launch.fingerprint for launch in other.launches if launch.fingerprint), None)
        pair = fingerprint.with_nodes(before, recorded.host_facts), fingerprint.with_nodes(after, new.host_facts)
        for d in fingerprint.diff(*pair):
            line = d.describe()
            ranked[line] = max(ranked.get(line, 0), d.weight)
    return sorted(ranked, key=lambda line: -ranked[line])


def compare_results(
    recorded: ABResult, new: ABResult, tolerance: float, arm_map: Mapping[str, str] | None = None
) -> ExperimentComparison:
    """`orch compare`: b judged against a (arm_map pairs arms of other names), with the fingerprint differences as
    likely causes."""
    judged = compare(recorded, new, tolerance=tolerance, arm_map=arm_map)  # refuses a bad map before any diff
    return dataclasses.replace(judged, causes=tuple(likely_causes(recorded, new, arm_map)))


def rerun_config(
    bundle: dict[str, Any], recorded: ABResult, base: ABConfig, workdir: Path, blocks: int | None
) -> ABConfig:
    """The bundle's experiment as an ABConfig: its workload (the same requests: a bundled prompt file is written out
    again and its digest checked), its order and seed, its blocks unless `blocks` overrides them."""
    config = bundle["content"]["config"]
    bench = bundle_mod.bench_config(config)
    text = bundle_mod.prompt_file_text(bundle)
    if bench.prompts not in ("builtin", "random"):
        if text is None:
            note = bundle["content"]["prompts"].get("note") or "it was not bundled"
            raise InputError(f"the bundle's prompt file {bench.prompts!r} cannot be re-sent: {note}")
        path = workdir / f"prompts-{recorded.experiment_id}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        files.write_output(path, text, "the bundle's prompt file")
        bench = dataclasses.replace(bench, prompts=str(path))
    recorded_digest = config.get("requests_sha256")
    if recorded_digest is not None and bundle_mod.requests_sha256(bench) != recorded_digest:
        raise InputError("the requests this orch would send differ from the recorded ones (another orch version?)")
    request_items(bench)
    return dataclasses.replace(
        base,
        bench=bench,
        simulate=recorded.simulated,
        blocks=blocks if blocks is not None else recorded.design.blocks,
        order=recorded.design.order,
        order_seed=recorded.design.seed,
        min_effect=recorded.min_effect,
        target_tps=recorded.target_tps,
        strict_env=bool(config.get("strict_env")),
        allow_mixed=bool(config.get("allow_mixed")),
    )


def reproduce_bundle(
    host: Host,
    bundle: dict[str, Any],
    store: Store,
    base: ABConfig,
    *,
    workdir: Path,
    tolerance: float,
    blocks: int | None = None,
    source: str = "BUNDLE",
    events: Events = QUIET,
    on_run: Callable[[str, RunResult], None] = lambda _p, _r: None,
) -> tuple[ABResult, ExperimentComparison]:
    """Run the bundle's design again here, from fresh state, and judge the new result against the recorded one."""
    recorded = bundle_mod.result_from_bundle(bundle)
    profiles = bundle_mod.profiles_from_bundle(bundle)
    check_plan(bundle, profiles, blocks, source)
    config = rerun_config(bundle, recorded, base, workdir, blocks)
    provenance = {"reproduces": recorded.experiment_id, "reproduces_digest": bundle.get("digest")}
    new = run_ab(host, profiles, config, store, events=events, on_run=on_run, provenance=provenance)
    try:
        return new, compare_results(recorded, new, tolerance)
    except Exception as e:  # the measurement is stored: a failure judging it must not hide where it is
        raise JudgingFailed(new.experiment_id, source, e) from e
