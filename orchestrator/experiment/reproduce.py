"""Reproducing a result (`orch reproduce`): a bundle's design, or a profile's claim, planned and refused before
anything starts, re-run from fresh state and judged; and the fingerprint differences that most likely explain a
difference."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator import files, yamlfile
from orchestrator.config import limits, prompts
from orchestrator.config import profile as profiles_mod
from orchestrator.config.design import ABConfig
from orchestrator.config.options import OptionError, RunOptions
from orchestrator.config.profile import Profile
from orchestrator.config.workload import request_items
from orchestrator.errors import InputError, OrchError
from orchestrator.experiment import resume
from orchestrator.experiment import run as experiment
from orchestrator.experiment.ab import run_ab
from orchestrator.hosts.base import Host
from orchestrator.launch import fingerprint, ports
from orchestrator.report.lines import SIM_BANNER
from orchestrator.results import bundle as bundle_mod
from orchestrator.results.compare import ClaimVerdict, ExperimentComparison, claim_verdict, compare
from orchestrator.results.model import ABResult
from orchestrator.results.run import RunResult
from orchestrator.results.store import Store
from orchestrator.ui.events import QUIET, Events, Lines

CLAIM_BLOCKS = 3  # a verdict needs the launch-to-launch spread: one launch per arm cannot give one


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
    if not prompts.generated(bench.prompts):
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
        slo=recorded.slo,
        metric=recorded.metric,
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


@dataclass(frozen=True)
class Claim:
    """What `orch reproduce PROFILE` is told the profile gives (--claim, --claim-ratio, --vs); each one left None is
    taken from the profile's expect: block."""

    tok_s: float | None = None
    ratio: float | None = None
    vs: str | None = None

    def given(self) -> bool:
        return self.tok_s is not None or self.ratio is not None or self.vs is not None


@dataclass(frozen=True)
class BundlePlan:
    """A bundle to re-run, read and checked: its profiles, the blocks this run asks for (None: the bundle's own), and
    the options it runs with (the port its experiment was given, unless this run gives another)."""

    path: str
    bundle: dict[str, Any]
    profiles: list[Profile]
    blocks: int | None
    options: RunOptions

    @property
    def simulated(self) -> bool:
        return bool(self.bundle["content"]["experiment"]["simulated"])


@dataclass(frozen=True)
class ClaimPlan:
    """A profile's claim to measure: the options run it (its baseline first, when it has one), and what it claims."""

    options: RunOptions
    tok_s: float | None
    ratio: float | None


def is_bundle(target: str) -> bool:
    """BUNDLE|PROFILE names a bundle when it is a file that is not YAML (a profile file is YAML)."""
    path = Path(target)
    return yamlfile.is_file(path) and path.suffix not in (".yaml", ".yml")


def plan_reproduction(target: str, claim: Claim, options: RunOptions) -> BundlePlan | ClaimPlan:
    """What `orch reproduce TARGET` runs, refused before anything starts (OptionError: options that cannot go with
    it, which the CLI shows as usage errors)."""
    if is_bundle(target):
        if claim.given():
            raise OptionError("--claim, --claim-ratio and --vs judge a profile's claim, not a result bundle")
        return plan_bundle(target, options)
    return plan_claim(target, claim, options)


def plan_bundle(path: str, options: RunOptions) -> BundlePlan:
    """The bundle at `path`, re-run with its own settings (only --blocks may change how many blocks)."""
    bundle = bundle_mod.read_bundle(path)
    simulated = bool(bundle["content"]["experiment"]["simulated"])
    passed = resume.fixed_given(options, simulated, but=("blocks",))
    if passed:
        raise OptionError(
            f"a bundle is re-run with its own settings; drop {', '.join(passed)} "
            "(--blocks may change the number of blocks)"
        )
    # Before any header line: a multi-node bundle on a --host with too few nodes is refused from the inventory alone,
    # and a plan over the limits from its numbers alone.
    profiles = bundle_mod.profiles_from_bundle(bundle)
    blocks = options.blocks if isinstance(options.blocks, int) else None  # None: the bundle's own
    check_plan(bundle, profiles, blocks, path)
    if not options.gave("port"):  # the port the experiment was given, unless this run gives another
        options = options.replace(port=ports.recorded(bundle["content"]["config"], f"{path}: content.config"))
    try:
        experiment.check_host_nodes(profiles, options.host_spec, options.inventory, port=options.port)
    except InputError as e:
        measured = bundle["content"]["experiment"].get("host")
        raise InputError(f"{e} (the bundle was measured on {measured!r})" if measured else str(e)) from None
    return BundlePlan(path, bundle, profiles, blocks, options)


def run_bundle(plan: BundlePlan, tolerance: float) -> tuple[ABResult, ExperimentComparison]:
    """The planned bundle re-run on the options' host, stored, and judged against what it recorded."""
    bundle, options = plan.bundle, plan.options
    store = Store(options.db)
    try:
        rep = experiment.reporter_for(options)
        bench = bundle_mod.bench_config(bundle["content"]["config"])
        event, on_run = experiment.progress(rep, bench)
        if plan.simulated:
            event(SIM_BANNER)
        event(f"reproducing {bundle['content']['experiment']['id']} from {plan.path}; results database: {store.path}")
        # A Slurm host asks for as many nodes as the bundle's largest multi-node profile spans.
        nodes = max((int(p.get("nnodes") or 1) for p in bundle["content"]["profiles"]), default=1)
        with experiment.host_for(options, options.host_spec, nodes=nodes) as host:
            base = experiment.ab_config(options.replace(sim=plan.simulated, strict_env=False), bench)
            return reproduce_bundle(
                host,
                bundle,
                store,
                base,
                workdir=store.path.parent / "reproduce",
                tolerance=tolerance,
                blocks=plan.blocks,
                source=plan.path,
                events=Lines(event),  # the lines only: no live view while reproducing, its phases reach no one
                on_run=on_run,
            )
    finally:
        store.close()


def plan_claim(target: str, claim: Claim, options: RunOptions) -> ClaimPlan:
    """The profile `target` beside its baseline (claim.vs, else expect.vs, else a profile named 'baseline'), in
    CLAIM_BLOCKS blocks unless options give another number."""
    prof = profiles_mod.load(target)
    expect = prof.expect
    if options.rate:
        raise OptionError(
            "a profile's claim is judged on its tok/s at a concurrency level (closed loop); --rate does not apply "
            "to it: drop --rate (or compare at rates with `orch ab`)"
        )
    if options.trace is not None:
        raise OptionError(
            "a profile's claim is judged on its tok/s at a concurrency level (closed loop); --trace does not apply "
            "to it: drop --trace (or replay the trace with `orch ab`)"
        )
    claimed_tps = claim.tok_s if claim.tok_s is not None else (expect.tok_s if expect else None)
    claimed_ratio = claim.ratio if claim.ratio is not None else (expect.ratio if expect else None)
    if claimed_tps is None and claimed_ratio is None:
        raise OptionError(
            f"nothing to judge in {prof.source}: give --claim TOK_S (and/or --claim-ratio R --vs BASELINE), or add "
            "an expect: block (tok_s, ratio, vs) to the profile"
        )
    vs = claim.vs or (expect.vs if expect else None)
    if vs is None and prof.name != "baseline" and "baseline" in profiles_mod.available():
        vs = "baseline"
    if claimed_ratio is not None and vs is None:
        raise OptionError("a claimed ratio needs a baseline: give --vs PROFILE (or expect.vs in the profile)")
    options = options.replace(
        profiles=(vs, target) if vs else (target,), blocks=CLAIM_BLOCKS if options.blocks is None else options.blocks
    )
    return ClaimPlan(options, claimed_tps, claimed_ratio)


def run_claim(
    plan: ClaimPlan, tolerance: float, warn: Callable[[str], None] = experiment.warn_stderr
) -> tuple[ABResult, ClaimVerdict]:
    """The planned claim measured from fresh state (a new experiment, refused like `orch ab`'s) and judged."""
    store = Store(plan.options.db)
    try:
        result = experiment.start(store, plan.options, experiment.reporter_for(plan.options), warn=warn)
    finally:
        store.close()
    verdict = claim_verdict(
        result, result.arms[-1].label, claimed_tps=plan.tok_s, claimed_ratio=plan.ratio, tolerance=tolerance
    )
    return result, verdict
