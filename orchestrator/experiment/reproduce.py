"""Reproducing a result (`orch reproduce`): a bundle's design, or a profile's claim, planned and refused before
anything starts, re-run from fresh state and judged; and the fingerprint differences that most likely explain a
difference."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator import files, yamlfile
from orchestrator.common.printable import visible
from orchestrator.config import datasets, limits, prompts, traces
from orchestrator.config import profile as profiles_mod
from orchestrator.config.design import ABConfig
from orchestrator.config.options import OptionError, RunOptions
from orchestrator.config.profile import Profile
from orchestrator.config.workload import check_requests
from orchestrator.errors import BundleError, InputError, OrchError, UntrustedBundle
from orchestrator.experiment import resume
from orchestrator.experiment import run as experiment
from orchestrator.experiment import trust as trust_mod
from orchestrator.experiment.ab import run_ab
from orchestrator.hosts.base import Host
from orchestrator.launch import fingerprint, ports
from orchestrator.report.lines import SIM_BANNER
from orchestrator.results import bundle as bundle_mod
from orchestrator.results import datasource, signing
from orchestrator.results.compare import ClaimVerdict, ExperimentComparison, claim_verdict, compare_levels
from orchestrator.results.datasource import DataSource
from orchestrator.results.model import ABResult
from orchestrator.results.run import RunResult
from orchestrator.results.store import Store
from orchestrator.ui.events import QUIET, Events, Lines

# Ranks a change of data above every fingerprint difference (the engine version's is 100).
DATASET_WEIGHT = 1000
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


def check_plan(
    bundle: dict[str, Any], profiles: list[Profile], blocks: int | None, source: str, data: BundleData | None = None
) -> None:
    """The bundle's plan (its blocks unless `blocks` overrides them) within the limits `orch ab` keeps, refused
    before anything is generated or launched: a bundle may have been written by anyone. A trace's requests are
    counted from the trace the re-run would replay (`data`: a copy given or the recorded file, else the bundle's own
    lines)."""
    design = bundle["content"].get("design") or {}
    bench = bundle_mod.bench_config(bundle["content"]["config"])
    trace = None
    if bench.trace is not None:
        text = bundle_mod.trace_file_text(bundle)
        if data is not None and data.trace is not None:
            trace = traces.load(data.trace, bench.requests_per_level)
        elif text is not None:
            trace = traces.from_text(f"{source}: the bundled trace", text, bench.requests_per_level)
    try:
        limits.checked_plan(
            bench,
            profiles,
            blocks=blocks if blocks is not None else design.get("blocks", 1),
            sim=bool(bundle["content"]["experiment"]["simulated"]),
            # The bundle's fields by their names in it; --blocks is the user's own.
            names={"blocks": "--blocks"} if blocks is not None else {},
            trace=trace,
        )
    except limits.PlanError as e:
        raise limits.PlanError(f"{source}: the bundle's plan is refused: {e}") from None


def likely_causes(recorded: ABResult, new: ABResult, arm_map: Mapping[str, str] | None = None) -> list[str]:
    """What differs between the two experiments' fingerprints, most likely to move the numbers first. Each arm's
    first fingerprinted launch on each side is compared, its measured CPU speed the median over the arm's launches
    (fingerprint.steadied; a multi-node one with every node's facts; arms paired by
    name, or by arm_map: new's name -> recorded's); a difference seen in several arms is said once. Other data (a
    dataset or trace of another sha256) comes first: it changes what is measured, not only how fast."""
    ranked: dict[str, int] = {}
    data = datasource.change(recorded.dataset, new.dataset)
    if data is not None:
        ranked[data] = DATASET_WEIGHT
    names = arm_map or {}
    for arm in recorded.arms:
        other = next((b for b in new.arms if names.get(b.label, b.label) == arm.label), None)
        if other is None:
            continue
        before = fingerprint.steadied([launch.fingerprint for launch in arm.launches if launch.fingerprint])
        after = fingerprint.steadied([launch.fingerprint for launch in other.launches if launch.fingerprint])
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
    judged = compare_levels(recorded, new, tolerance=tolerance, arm_map=arm_map)  # refuses a bad map before any diff
    return dataclasses.replace(judged, causes=tuple(likely_causes(recorded, new, arm_map)))


@dataclass(frozen=True)
class BundleData:
    """Where a re-run's data comes from, decided and checked before anything starts: the data the bundle's experiment
    sent (`recorded`), and a file to send it from — a copy the receiver pointed at, or the recorded file where it
    still is, each checked against the recorded sha256 — or None: the bundle's own items or trace lines (written out
    again), or prompts orch generates or ships."""

    recorded: DataSource | None
    prompts: str | None = None
    trace: str | None = None


def bundle_data(
    bundle: Mapping[str, Any], prompts: str | None = None, trace: str | None = None, source: str = "BUNDLE"
) -> BundleData:
    """The data to re-run a bundle on. `prompts` (--prompts/--dataset PATH) and `trace` (--trace PATH) point at a copy
    of the bundle's own data, for data it does not carry (too big, or only its digest); a copy whose sha256 is not the
    recorded one is refused, naming both (InputError: never a reproduction on other data)."""
    config = bundle["content"]["config"]
    bench = bundle_mod.bench_config(config)
    want = datasource.recorded(config) or DataSource("generated", bench.prompts)
    shipped = bundle["content"]["prompts"]
    if trace is not None and bench.trace is None:
        raise InputError(
            f"{source}: --trace points at a copy of the trace a bundle's experiment replayed; this one replayed none "
            f"(it sent {want.label()}): drop --trace"
        )
    if prompts is not None and (bench.trace is not None or want.kind == "generated"):
        raise InputError(
            f"{source}: --prompts points at a copy of the dataset a bundle's experiment sent; this one sent "
            f"{want.label()}, which needs no copy: drop --prompts"
        )
    if bench.trace is not None:
        if trace is not None:
            check_copy(want, datasource_of(trace, "trace"), f"--trace {trace}", source)
            return BundleData(want, trace=trace)
        if bundle_mod.trace_file_text(bundle) is not None:
            return BundleData(want)
        if _still_there(bench.trace, want):
            return BundleData(want, trace=bench.trace)
        note = visible(str((shipped.get("trace") or {}).get("note") or "it was not bundled"))  # the sender's words
        raise InputError(
            f"{source}: the bundle's experiment replayed {want.label()}, which the bundle does not carry ({note}) "
            f"and which is not at {visible(str(bench.trace))}; give a copy with --trace PATH (checked against its "
            "sha256)"
        )
    if want.kind == "generated":
        return BundleData(want)
    if prompts is not None:
        check_copy(want, datasource_of(prompts, "dataset"), f"--prompts {prompts}", source)
        return BundleData(want, prompts=prompts)
    if shipped.get("generated"):
        check_shipped(want, bench.prompts, source)
        return BundleData(want)
    if bundle_mod.prompt_file_text(bundle) is not None:
        return BundleData(want)
    recorded_at = config.get("dataset") if isinstance(config.get("dataset"), dict) else {}
    path = recorded_at.get("path") or shipped.get("path") or bench.prompts  # the resolved path, where recorded
    if _still_there(path, want):
        return BundleData(want, prompts=path)
    note = visible(str(shipped.get("note") or "it was not bundled"))  # the sender's words
    raise InputError(
        f"{source}: the bundle's experiment sent {want.label()}, which the bundle does not carry ({note}); give a "
        "copy with --prompts PATH (or --dataset PATH; checked against its sha256)"
    )


def datasource_of(path: str, kind: str) -> DataSource:
    """What a file (or, for a dataset, a --prompts name) the receiver points at holds, by name and sha256."""
    if kind == "trace":
        return DataSource("trace", Path(path).name, datasets.file_sha256(path), path)
    found = datasets.provenance(path)
    if found is None:
        return DataSource("generated", path)
    return DataSource("dataset", found["name"], found["sha256"], found.get("origin") or found.get("path"))


def _named(data: DataSource) -> str:
    return data.label() + (f" from {visible(data.origin)}" if data.origin else "")


def check_copy(want: DataSource, got: DataSource, given: str, source: str) -> None:
    """A copy the receiver points at (`given`: the option and its value) must be the recorded data, by sha256 (data
    recorded without a sha256 is judged by the requests it gives: rerun_config)."""
    if want.sha256 is None and got.kind == want.kind:
        return
    if not want.same(got) or got.sha256 is None:
        raise InputError(
            f"{source}: {given} holds {got.label()}, not the data the bundle's experiment sent: {_named(want)}; "
            f"refusing to reproduce on other data (give a copy whose sha256 is {want.sha256})"
        )


def check_shipped(want: DataSource, name: str, source: str) -> None:
    """A dataset the sender's orch shipped must be the one this orch ships under that name, by sha256."""
    if name not in datasets.SHIPPED:
        raise InputError(
            f"{source}: the bundle's experiment sent {_named(want)}, a dataset the sender's orch shipped and this orch "
            f"does not (it ships {', '.join(datasets.SHIPPED)}); reproduce it with an orch that ships {name!r}"
        )
    mine = datasource_of(name, "dataset")
    if want.sha256 is not None and not want.same(mine):
        raise InputError(
            f"{source}: the bundle's experiment sent {_named(want)}; this orch ships {mine.label()} under that name: "
            "other data under the same name; refusing to reproduce on other data (reproduce it with the orch "
            "version the sender used)"
        )


def _still_there(path: str, want: DataSource) -> bool:
    """The recorded file, still at its recorded path and still the recorded data (by sha256)."""
    if want.sha256 is None:
        return False
    try:
        return datasets.file_sha256(path) == want.sha256
    except InputError:
        return False


def rerun_config(
    bundle: dict[str, Any],
    recorded: ABResult,
    base: ABConfig,
    workdir: Path,
    blocks: int | None,
    data: BundleData | None = None,
) -> ABConfig:
    """The bundle's experiment as an ABConfig: its workload (the same requests: a bundled prompt file or trace is
    written out again, or the file `data` names is read; the requests' digest checked), its order and seed, its
    blocks unless `blocks` overrides them."""
    config = bundle["content"]["config"]
    bench = bundle_mod.bench_config(config)
    data = data if data is not None else bundle_data(bundle)
    if bench.trace is not None:
        trace = data.trace
        if trace is None:
            trace = str(
                _write_out(workdir / f"trace-{recorded.experiment_id}.jsonl", bundle_mod.trace_file_text(bundle))
            )
        bench = dataclasses.replace(bench, trace=trace)  # trace_sha256 stays: the replay checks the file against it
    elif data.prompts is not None:
        bench = dataclasses.replace(bench, prompts=data.prompts)
    elif (text := bundle_mod.prompt_file_text(bundle)) is not None and not prompts.generated(bench.prompts):
        bench = dataclasses.replace(
            bench, prompts=str(_write_out(workdir / f"prompts-{recorded.experiment_id}.jsonl", text))
        )
    recorded_digest = config.get("requests_sha256")
    if recorded_digest is not None and bundle_mod.requests_sha256(bench) != recorded_digest:
        sent = data.recorded.label() if data.recorded else visible(bench.prompts)
        raise InputError(
            f"the requests this orch would send from {sent} "
            "differ from the recorded ones (another orch version, or other data?); refusing to reproduce on other "
            "requests"
        )
    check_requests(bench)
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
        cache_measured=recorded.cache_measured,
    )


def _write_out(path: Path, text: str | None) -> Path:
    if text is None:  # bundle_data found it in the bundle; a caller that skipped it gets a clear failure
        raise InputError("the bundle carries no copy of its data to write out; give one (--prompts or --trace)")
    path.parent.mkdir(parents=True, exist_ok=True)
    files.write_output(path, text, "the bundle's data")
    return path.resolve()


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
    data: BundleData | None = None,
    trust: trust_mod.Trust | None = None,
) -> tuple[ABResult, ExperimentComparison]:
    """Run the bundle's design again here, from fresh state, and judge the new result against the recorded one.
    `data`: where its data comes from (bundle_data; by default the bundle's own, or the recorded file); `trust`: what
    decided it may run (plan_bundle), stored with the new experiment."""
    recorded = bundle_mod.result_from_bundle(bundle)
    profiles = bundle_mod.profiles_from_bundle(bundle)
    data = data if data is not None else bundle_data(bundle, source=source)
    check_plan(bundle, profiles, blocks, source, data)
    config = rerun_config(bundle, recorded, base, workdir, blocks, data)
    digest = bundle["content"]["config"].get("requests_sha256")
    if isinstance(digest, str):
        what = (
            "prompts, output lengths and every request's due time"
            if config.bench.open_loop
            else "prompts and output lengths"
        )
        events.line(f"the same requests as recorded ({what}): requests_sha256 {digest[:12]}… checked")
    provenance: dict[str, Any] = {"reproduces": recorded.experiment_id, "reproduces_digest": bundle.get("digest")}
    if trust is not None:
        provenance["bundle_trust"] = trust.to_dict()
    sent = bundle["content"]["config"].get("dataset")
    if isinstance(sent, dict):
        # The same data as the recorded experiment's (its sha256, or its requests' digest, was checked): recorded as
        # that dataset, with the file it was sent from here, so that comparing the two sees no dataset change.
        here = config.bench.prompts
        provenance["dataset"] = {**sent, "sent_from": str(Path(here).resolve()) if Path(here).is_file() else here}
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


@dataclass(frozen=True, kw_only=True)
class BundlePlan:
    """A bundle to re-run, read and checked: its profiles, the blocks this run asks for (None: the bundle's own), and
    the options it runs with (the port its experiment was given, unless this run gives another)."""

    path: str
    bundle: dict[str, Any]
    profiles: list[Profile]
    blocks: int | None
    options: RunOptions
    data: BundleData | None = None  # where its data comes from, checked (bundle_data)
    trust: trust_mod.Trust | None = None  # what decided it may run here (trust.decide)

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


def missing_bundle(target: str) -> bool:
    """BUNDLE|PROFILE names a bundle file that is not there: nothing at the path, which is no profile's form either (a
    path to a file that is not YAML, or a name ending in .json, as `orch export` names bundles)."""
    path = Path(target)
    if yamlfile.exists(path) or path.suffix in (".yaml", ".yml"):
        return False
    return path.suffix == ".json" or os.sep in target


def plan_reproduction(
    target: str, claim: Claim, options: RunOptions, ask: trust_mod.Ask | None = None
) -> BundlePlan | ClaimPlan:
    """What `orch reproduce TARGET` runs, refused before anything starts (OptionError: options that cannot go with
    it, which the CLI shows as usage errors). `ask`: the question at a terminal, for a bundle that would run what
    this machine's own profiles would not (None: no terminal to ask on)."""
    if missing_bundle(target):
        raise BundleError(
            f"{target}: no such bundle file (`orch export ID --format bundle` writes one; a PROFILE is a name or a "
            ".yaml file)"
        )
    if is_bundle(target):
        if claim.given():
            raise OptionError("--claim, --claim-ratio and --vs judge a profile's claim, not a result bundle")
        return plan_bundle(target, options, ask)
    trust_flags = (("trust_bundle", "--trust-bundle"), ("allowed_signers", "--allowed-signers"))
    given = [flag for name, flag in trust_flags if options.gave(name)]
    if given:
        raise OptionError(
            f"{' and '.join(given)} {'apply' if len(given) > 1 else 'applies'} to a result bundle (whether it may run "
            "here); a profile's claim runs this machine's own profiles: drop " + ("them" if len(given) > 1 else "it")
        )
    return plan_claim(target, claim, options)


def plan_bundle(path: str, options: RunOptions, ask: trust_mod.Ask | None = None) -> BundlePlan:
    """The bundle at `path`, re-run with its own settings (only --blocks may change how many blocks), once it may
    run here (trust.decide: its own profiles, an allowed signer, --trust-bundle or `ask`), before anything starts."""
    bundle = bundle_mod.read_bundle(path)
    simulated = bool(bundle["content"]["experiment"]["simulated"])
    passed = resume.fixed_given(options, simulated, but=("blocks", "prompt_source", "trace"))
    if passed:
        raise OptionError(
            f"a bundle is re-run with its own settings; drop {', '.join(passed)} "
            "(--blocks may change the number of blocks; --prompts/--dataset and --trace point at a copy of its data)"
        )
    # Before anything starts: the data it ran on, and any copy pointed at, checked against the recorded sha256.
    data = bundle_data(
        bundle,
        prompts=options.prompt_source if options.gave("prompt_source") else None,
        trace=options.trace,
        source=path,
    )
    # Before any header line: a multi-node bundle on a --host with too few nodes is refused from the inventory alone,
    # and a plan over the limits from its numbers alone.
    profiles = bundle_mod.profiles_from_bundle(bundle)
    blocks = options.blocks if isinstance(options.blocks, int) else None  # None: the bundle's own
    check_plan(bundle, profiles, blocks, path, data)
    if not options.gave("port"):  # the port the experiment was given, unless this run gives another
        options = options.replace(port=ports.recorded(bundle["content"]["config"], f"{path}: content.config"))
    try:
        experiment.check_host_nodes(profiles, options.host_spec, options.inventory, port=options.port)
    except InputError as e:
        measured = bundle["content"]["experiment"].get("host")
        raise InputError(f"{e} (the bundle was measured on {measured!r})" if measured else str(e)) from None
    # Last, once nothing else refuses it, and before anything starts (no host, no store, no lock): may it run here?
    signature = (
        signing.check_signature(bundle, options.allowed_signers, path) if options.allowed_signers is not None else None
    )
    review = trust_mod.review(path, ports.override(profiles, options.port), simulated)
    trust = trust_mod.decide(review, signature=signature, trust_bundle=options.trust_bundle, ask=ask)
    return BundlePlan(
        path=path, bundle=bundle, profiles=profiles, blocks=blocks, options=options, data=data, trust=trust
    )


def run_bundle(plan: BundlePlan, tolerance: float) -> tuple[ABResult, ExperimentComparison]:
    """The planned bundle re-run on the options' host, stored, and judged against what it recorded."""
    bundle, options = plan.bundle, plan.options
    if plan.trust is None:  # a plan made by hand, not by plan_bundle: nothing decided that it may run here
        raise UntrustedBundle(f"{plan.path}: not planned by plan_bundle, so nothing decided that it may run here")
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
                data=plan.data,
                trust=plan.trust,
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
