"""What a finished experiment's exit code is under --fail-on."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.config.profile import Expect
from orchestrator.config.slo import DEFAULT_METRIC
from orchestrator.errors import InputError
from orchestrator.launch.fingerprint import STATE, Difference, diff
from orchestrator.results.compare import claim_verdict
from orchestrator.results.comparison import Comparison
from orchestrator.results.model import ABResult, ArmResult, LaunchResult
from orchestrator.results.run import Rate, level_phrase
from orchestrator.stats.crossover import Crossover
from orchestrator.stats.reproduction import DEFAULT_TOLERANCE, NOT_REPRODUCED, REPRODUCED

MODES = ("slower", "different", "env")
# Bounds on what is taken across the levels (docs/load.md#verdicts-on-the-crossover-and-the-highest-load-within-an-slo):
# `crossover-below=R` fails when an arm's crossover lies below R, `max-rate-slo-below=R` when an arm's highest load
# within the SLO does; R in the levels' unit (req/s, or a concurrency).
BOUNDS = {"crossover-below": "crossover", "max-rate-slo-below": "max_rate_slo"}
GRAMMAR = (*MODES, *(f"{b}=R" for b in BOUNDS))
OK, FAIL, INCONCLUSIVE = "ok", "fail", "inconclusive"
# The project-wide contract: 3 a verdict the user asked to fail on, 4 undecided (1, 2 and 130 are the CLI's).
EXIT_CODES = {OK: 0, FAIL: 3, INCONCLUSIVE: 4}
# fingerprint.diff ranks what moves a number: engine and packages, the workers' env, GPUs and their settings, the
# profile and argv, the workload all weigh 50 or more. Below that are orch's own version and facts about the box
# (hostname, boot id, container id, kernel, the venv's path, GPU UUIDs) that change between launches on their own.
ENV_MIN_WEIGHT = 50
SHOWN_DIFFERENCES = 3


@dataclass(frozen=True)
class Check:
    """One judgement under one mode: a comparison, a claim, or the environment of the experiment."""

    mode: str
    status: str  # ok | fail | inconclusive
    text: str  # what was judged, and what it came to

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.status]

    def line(self) -> str:
        return f"fail-on {self.mode}: {self.text} -> " + ("ok" if self.status == OK else f"exit {self.exit_code}")

    def to_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "status": self.status, "exit_code": self.exit_code, "reason": self.text}


@dataclass(frozen=True)
class FailOn:
    """The decision: 3 if any check fails, else 4 if any is undecided, else 0."""

    modes: tuple[str, ...]
    checks: tuple[Check, ...]

    @property
    def status(self) -> str:
        statuses = {c.status for c in self.checks}
        return FAIL if FAIL in statuses else INCONCLUSIVE if INCONCLUSIVE in statuses else OK

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.status]

    @property
    def reasons(self) -> tuple[str, ...]:
        return tuple(c.line() for c in self.checks)

    def lines(self) -> list[str]:
        """One line per check, and the overall exit code when there is more than one."""
        out = list(self.reasons)
        if len(self.checks) > 1:
            counts = {s: sum(c.status == s for c in self.checks) for s in (FAIL, INCONCLUSIVE, OK)}
            tally = ", ".join(f"{n} {'failed' if s == FAIL else s}" for s, n in counts.items() if n)
            out.append(f"fail-on {','.join(self.modes)}: exit {self.exit_code} ({tally})")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "modes": list(self.modes),
            "status": self.status,
            "exit_code": self.exit_code,
            "reasons": list(self.reasons),
            "checks": [c.to_dict() for c in self.checks],
        }


def parse_modes(values: Iterable[str]) -> tuple[str, ...]:
    """`--fail-on slower --fail-on env` and `--fail-on slower,env` alike; each mode once, in the order given. A bound
    is written `crossover-below=R` (R a number above 0) and kept as `crossover-below=6` (R as %g)."""
    out: list[str] = []
    for value in values:
        for item in str(value).split(","):
            mode = item.strip().lower()
            if not mode:
                continue
            name, eq, bound = mode.partition("=")
            name = name.strip()
            if name in BOUNDS:
                mode = f"{name}={_bound(bound.strip() if eq else '', item.strip(), name):g}"
            elif mode not in MODES:
                raise InputError(f"unknown --fail-on mode {item.strip()!r}; valid: {', '.join(GRAMMAR)}")
            if mode not in out:
                out.append(mode)
    return tuple(out)


def _bound(text: str, given: str, name: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (0 < value < float("inf")):  # NaN fails too
        raise InputError(
            f"--fail-on {given!r}: {name}=R needs R, a load above 0 in the levels' unit (requests per second for "
            f"--rate levels, streams for --concurrency), e.g. {name}=4"
        )
    return value


def across_levels_metric(mode: str) -> str | None:
    """`crossover` for `crossover-below=R`, `max_rate_slo` for `max-rate-slo-below=R`, else None."""
    return BOUNDS.get(mode.partition("=")[0])


def levels_refusal(
    modes: Sequence[str], *, levels: int, arms: int, percentile_slo: bool, blocks: int | None = None
) -> str | None:
    """Why a bound mode cannot be judged by this experiment, said before anything launches; None if it can. Both
    need two or more levels and (their CI is over blocks) two or more blocks (`blocks`: a fixed number, None for
    --blocks auto or unknown); a crossover needs a second arm, the highest load within an SLO an --slo with a
    percentile objective."""
    for mode in modes:
        metric = across_levels_metric(mode)
        if metric is None:
            continue
        if levels < 2:
            return (
                f"--fail-on {mode}: needs two or more levels to interpolate between (--rate R1,R2,... or "
                "--concurrency N1,N2,...); this experiment runs one"
            )
        if metric == "crossover" and arms < 2:
            return (
                f"--fail-on {mode}: a crossover is where an arm's ratio to the first arm crosses 1; it needs two or "
                "more profiles (orch ab)"
            )
        if blocks is not None and blocks < 2:
            return (
                f"--fail-on {mode}: its 95% CI is taken over blocks and needs two or more (--blocks 2 or more); this "
                f"experiment runs {blocks}"
            )
        if metric == "max_rate_slo" and not percentile_slo:
            return (
                f"--fail-on {mode}: the highest load within an SLO needs --slo with a percentile objective (e.g. "
                "--slo ttft_p99=500ms,e2e_p99=10s)"
            )
    return None


def single_profile_refusal(
    name: str, expect: Expect | None, modes: Sequence[str], concurrency: Sequence[int] = (1,)
) -> str | None:
    """Why `orch bench NAME --fail-on …` cannot decide anything (said before anything launches), or None.
    With one profile there is no baseline: slower and different are judged against the profile's expect.tok_s."""
    judged = [m for m in parse_modes(modes) if m in ("slower", "different")]
    if not judged:
        return None
    if expect is None or expect.tok_s is None:
        why = (
            f"--fail-on {judged[0]} needs something to compare with: a second profile (orch ab) or an `expect:` "
            f"block with tok_s in profile {name} (docs/reproduce.md)"
        )
        if expect is not None and expect.ratio is not None:
            why += f"; its expect.ratio needs its baseline beside it: orch ab {expect.vs} {name}"
        return why
    if 1 not in concurrency:
        return f"--fail-on {judged[0]}: expect.tok_s of profile {name} is single-stream tok/s; add 1 to --concurrency"
    return None


def fail_on_verdict(
    result: ABResult,
    modes: Sequence[str],
    *,
    tolerance: float | None = None,
    expect: Expect | None = None,
) -> FailOn:
    """Judge a finished experiment under the modes (MODES; comma lists accepted).

    slower: 3 if any arm is slower than the first arm at any concurrency level the experiment ran (on the result's
    metric, --metric: for a latency, slower is higher), else 4 if any comparison is undecided (inconclusive, or one
    block: no CI), else 0. A single-arm result (orch bench) is judged against `expect` (the profile's expect.tok_s,
    single-stream) within `tolerance` (default 3 %): 3 when it is not reproduced and the measured value is below, 4
    when that cannot be told.
    different: the same, but faster fails too (anything but "no difference"; for one arm: not reproduced either way).
    env: 3 if any worker environment differed from its profile, or launches of one arm differ in their fingerprints
    in what moves a number (engine, packages, GPUs and their settings, worker env, profile, workload)."""
    wanted = parse_modes(modes)
    tol = DEFAULT_TOLERANCE if tolerance is None else tolerance
    if not 0 < tol < 1:
        raise InputError(f"tolerance must be a fraction between 0 and 1 (0.03 for 3 %), got {tol}")
    checks: list[Check] = []
    for mode in wanted:
        if mode == "env":
            checks += env_checks(result)
        elif across_levels_metric(mode):
            checks += bound_checks(result, mode)
        elif len(result.arms) > 1:
            levels = result.levels or [1]
            for level in levels:
                checks += [comparison_check(c, mode, len(levels) > 1) for c in result.comparisons_at(level)]
        else:
            checks.append(expect_check(result, mode, expect, tol))
        if mode != "env" and (mode not in ("slower", "different") or len(result.arms) < 2):
            # Whatever speed the mode judges, a verdict held back by a prefix-cache gap leaves it undecided (env
            # judges the environment alone: a cache gap is no part of it).
            checks += cache_checks(result, mode)
    return FailOn(wanted, tuple(checks))


def cache_gap_reason(c: Comparison, who: str, base: str, at: str, numbers: str) -> str:
    gap = c.cache_gap
    assert gap is not None
    said = f"; the CI alone says {c.ci_verdict}" if c.ci_verdict else ""
    return f"{who} vs {base}{at} is inconclusive: {gap.reason} ({numbers}{said}); {gap.advice}"


def cache_checks(result: ABResult, mode: str) -> list[Check]:
    """One inconclusive check per comparison whose verdict a prefix-cache gap holds back (results/cache)."""
    levels = result.levels or [1]
    out = []
    for level in levels:
        for c in result.comparisons_at(level):
            if c.held_back:
                at = f" at {level_phrase(c.concurrency)}" if len(levels) > 1 else ""
                ratio = f"ratio {c.ratio:.3f}" if c.ratio is not None else "no ratio"
                out.append(
                    Check(mode, INCONCLUSIVE, cache_gap_reason(c, c.arm_label or c.arm, c.vs_label or c.vs, at, ratio))
                )
    return out


def _ci(lo: float | None, hi: float | None, digits: int, name: str = "95% CI") -> str:
    return f", {name} {lo:.{digits}f}-{hi:.{digits}f}" if lo is not None and hi is not None else ""


def comparison_check(c: Comparison, mode: str, name_level: bool) -> Check:
    """One arm against the baseline at one level, from the comparison's own verdict (its CI over blocks)."""
    who, base = c.arm_label or c.arm, c.vs_label or c.vs
    # A comparison on another metric than tok/s names it (--metric): "slower on ttft_p99" is a higher p99 TTFT.
    at = ("" if c.metric == DEFAULT_METRIC else f" on {c.metric}") + (
        f" at {level_phrase(c.concurrency)}" if name_level else ""
    )
    est = c.estimate
    if est is None or c.ratio is None:
        return Check(mode, INCONCLUSIVE, f"{who} vs {base}{at}: {c.note or 'no block in which both have valid runs'}")
    if est.blocks < 2:
        return Check(
            mode,
            INCONCLUSIVE,
            f"{who} vs {base}{at} is inconclusive: ratio {c.ratio:.3f} from one block, which has no confidence "
            "interval (use --blocks 3 or more)",
        )
    # One of a family of verdicts (several levels or arms): the interval is at its Holm level, not 95 %.
    name = "95% CI" if c.adjustment is None else c.adjustment.describe()
    numbers = (
        "" if c.metric == DEFAULT_METRIC else f"{c.metric} "
    ) + f"ratio {c.ratio:.3f}{_ci(est.lo, est.hi, 3, name)}"
    if c.held_back and c.cache_gap is not None:
        return Check(mode, INCONCLUSIVE, cache_gap_reason(c, who, base, at, numbers))
    if c.verdict == "slower":
        return Check(mode, FAIL, f"{who} is slower than {base}{at} ({numbers})")
    if c.verdict == "faster":
        return Check(mode, FAIL if mode == "different" else OK, f"{who} is faster than {base}{at} ({numbers})")
    if c.verdict == "no difference":
        within = f"within ±{c.min_effect * 100:.1f}%"
        return Check(mode, OK, f"{who} and {base}{at}: no difference ({numbers}, {within})")
    more = f"; about {c.blocks_needed} blocks would decide" if c.blocks_needed and c.blocks_needed > est.blocks else ""
    return Check(mode, INCONCLUSIVE, f"{who} vs {base}{at} is inconclusive ({numbers}{more})")


def expect_check(result: ABResult, mode: str, expect: Expect | None, tolerance: float) -> Check:
    """One arm (no baseline) against the tok/s its profile's expect: block claims, at concurrency 1."""
    if not result.arms:
        return Check(mode, INCONCLUSIVE, "the result has no arm to judge")
    arm = result.arms[0].label
    if expect is None or expect.tok_s is None:
        return Check(
            mode, INCONCLUSIVE, f"nothing to compare {arm} with: no second arm, and no expect.tok_s in its profile"
        )
    if result.levels and 1 not in result.levels:
        return Check(
            mode, INCONCLUSIVE, f"{arm}: expect.tok_s is single-stream, and this experiment did not run concurrency 1"
        )
    v = claim_verdict(result, arm, claimed_tps=expect.tok_s, tolerance=tolerance, concurrency=1)
    within = f"±{tolerance * 100:.1f}%"
    if v.measured is None or v.tps is None:
        return Check(mode, INCONCLUSIVE, f"{arm}: no valid timed run at concurrency 1 to judge against expect.tok_s")
    m = v.measured
    measured = f"{m.value:.1f} tok/s{_ci(m.lo, m.hi, 1)} over {m.launches} launch(es)"
    against = f"against expect.tok_s {expect.tok_s:.1f}"
    if v.tps.status == REPRODUCED:
        return Check(mode, OK, f"{arm} meets its expect: {measured} {against} (within {within})")
    if v.tps.status == NOT_REPRODUCED:
        change = f"{v.tps.change * 100:+.1f}%, beyond {within}"
        if v.tps.change < 0:
            return Check(mode, FAIL, f"{arm} is slower than its expect: {measured} {against} ({change})")
        status = FAIL if mode == "different" else OK
        return Check(mode, status, f"{arm} is faster than its expect: {measured} {against} ({change})")
    return Check(mode, INCONCLUSIVE, f"{arm} against its expect is inconclusive: {measured} {against}; {v.tps.reason}")


# ---------------------------------------------------------------- bounds on the crossover and the SLO capacity


def bound_checks(result: ABResult, mode: str) -> list[Check]:
    """`crossover-below=R`: each arm's crossover against the first arm; `max-rate-slo-below=R`: each arm's highest
    load within the SLO (both from stats/crossover, with their CI over blocks)."""
    name, _, text = mode.partition("=")
    bound = float(text)
    rate = any(isinstance(level, Rate) for level in result.levels)
    if BOUNDS[name] == "crossover":
        found = [(f"{arm.label}'s crossover vs {result.arms[0].label}", c) for arm, c in result.crossovers()]
        words = ("it pays at every level", "it pays at no level")
        missing = "no crossover to judge: it needs two or more levels and two or more blocks with every level"
    else:
        found = [(f"{arm.label}'s highest load within the SLO", c) for arm, c in result.max_within_slo()]
        words = ("within the SLO at every level", "outside the SLO at every level")
        missing = (
            "no highest load within the SLO to judge: it needs --slo with a percentile objective, two or more levels "
            "and two or more blocks with every level"
        )
    if not found:
        return [Check(mode, INCONCLUSIVE, missing)]
    return [bound_check(mode, who, c, bound, rate, words) for who, c in found]


def _load(x: float, rate: bool) -> str:
    return f"{x:.3g} req/s" if rate else f"concurrency {x:.3g}"


def bound_check(
    mode: str, who: str, c: Crossover, bound: float, rate: bool, words: tuple[str, str] = ("better", "worse")
) -> Check:
    """One crossover (or SLO capacity) against `bound`: fail when its 95 % CI lies below, ok when at or above,
    inconclusive when it straddles the bound or the levels measured cannot say (a censored answer beyond the range
    on the bound's side). The answer is oriented so that "pays" is the good side: an SLO capacity "pays" within it."""
    lo_level, hi_level = c.levels[0], c.levels[-1]
    shown = _load(bound, rate)
    span = f"{_load(lo_level, rate)} to {_load(hi_level, rate)}"
    if c.status == "pays throughout":
        what = f"{who} lies beyond the range measured ({span}: {words[0]})"
        if hi_level >= bound:
            return Check(mode, OK, f"{what}, so at or above {shown}")
        return Check(mode, INCONCLUSIVE, f"{what}; the range ends below {shown}: add a level at or above it")
    if c.status == "never pays":
        what = f"{who} lies below the range measured ({span}: {words[1]})"
        if lo_level <= bound:
            return Check(mode, FAIL, f"{what}, so below {shown}")
        return Check(mode, INCONCLUSIVE, f"{what}; the range starts above {shown}: add a level at or below it")
    lo = _load(c.lo, rate) if c.lo is not None else f"below {_load(lo_level, rate)}"
    hi = _load(c.hi, rate) if c.hi is not None else f"beyond {_load(hi_level, rate)}"
    ci = f"95% CI {lo} to {hi}, over {c.blocks} blocks"
    if c.status == "undecided":
        return Check(mode, INCONCLUSIVE, f"{who} is undecided: no crossing seen, but one may lie between {lo} and {hi}")
    assert c.at is not None
    at = _load(c.at, rate)
    if not c.pays_below:
        # Worse below the crossing, better above it: it does not pay at the low end of the range at all.
        what = f"{who}: worse below ~{at}, better above it ({ci})"
        if lo_level <= bound:
            return Check(mode, FAIL, f"{what}: it does not pay at {_load(lo_level, rate)}, below {shown}")
        return Check(mode, INCONCLUSIVE, f"{what}; the range starts above {shown}")
    what = f"{who} is ~{at} ({ci})"
    if c.hi is not None and c.hi < bound:
        return Check(mode, FAIL, f"{what}: below {shown}")
    if c.lo is not None and c.lo >= bound:
        return Check(mode, OK, f"{what}: at or above {shown}")
    return Check(mode, INCONCLUSIVE, f"{what}: the CI straddles {shown}; more blocks narrow it")


# ---------------------------------------------------------------- env


def _mismatch_text(report: dict[str, Any]) -> str:
    by_var: dict[str, tuple[str, set[str]]] = {}
    for m in report.get("mismatches") or []:
        got = "missing" if m.get("actual") is None else repr(m.get("actual"))
        by_var.setdefault(str(m.get("var")), (repr(m.get("expected")), set()))[1].add(got)
    parts = [
        f"{var} {want} in the profile, {' / '.join(sorted(got))} in some processes"
        for var, (want, got) in by_var.items()
    ]
    shown = "; ".join(parts[:SHOWN_DIFFERENCES])
    return shown + (f" (+{len(parts) - SHOWN_DIFFERENCES} more)" if len(parts) > SHOWN_DIFFERENCES else "")


def _unreadable(fp: dict[str, Any], path: str) -> bool:
    """Whether fp says it could not read the field at path (then its None is no evidence of a difference)."""
    for item in fp.get("unreadable") or []:
        field = str(item.get("field") or "")
        # "host": the whole host round trip failed, so nothing it reads (host, GPUs, packages) is known.
        roots = ("host", "gpus", "software") if field == "host" else (field,)
        if any(path == r or path.startswith(r + ".") for r in roots):
            return True
    return False


def env_differences(a: dict[str, Any], b: dict[str, Any]) -> list[Difference]:
    """What differs between two launches' fingerprints and could move the number (most likely first); fields that
    one side could not read are no evidence either way."""
    out = []
    for d in diff(a, b):
        if d.weight < ENV_MIN_WEIGHT or d.category == STATE:
            continue  # (a slower CPU at one launch is noise to report, not a setting that changed)
        if (d.before is None and _unreadable(a, d.field)) or (d.after is None and _unreadable(b, d.field)):
            continue
        out.append(d)
    return out


def fingerprint_drift(arm: ArmResult) -> list[tuple[LaunchResult, LaunchResult, list[Difference]]]:
    """Launches of one arm whose fingerprint differs from the arm's first fingerprinted launch: (first, that launch,
    the differences). Launches without a fingerprint (older results, or one that failed to read) are left out."""
    usable = [(launch, fp) for launch in arm.launches if (fp := launch.fingerprint) and not fp.get("error")]
    out = []
    for launch, fp in usable[1:]:
        found = env_differences(usable[0][1], fp)
        if found:
            out.append((usable[0][0], launch, found))
    return out


def env_checks(result: ABResult) -> list[Check]:
    """Every arm's workers got its profile env, and each arm's launches ran in one environment."""
    checks: list[Check] = []
    for arm in result.arms:
        if not arm.env_ok:
            bad = [launch for launch in arm.launches if launch.env_report.get("ok", True) is False]
            first = bad[0]
            others = f" (and {len(bad) - 1} more launch(es))" if len(bad) > 1 else ""
            checks.append(
                Check(
                    "env",
                    FAIL,
                    f"{arm.label} (block {first.block + 1}): the workers' environment is not the profile's: "
                    f"{_mismatch_text(first.env_report)}{others}",
                )
            )
        drift = fingerprint_drift(arm)
        if drift:
            first, launch, found = drift[0]
            shown = "; ".join(d.describe() for d in found[:SHOWN_DIFFERENCES])
            more = f" (+{len(found) - SHOWN_DIFFERENCES} more)" if len(found) > SHOWN_DIFFERENCES else ""
            others = f"; {len(drift) - 1} more launch(es) differ" if len(drift) > 1 else ""
            checks.append(
                Check(
                    "env",
                    FAIL,
                    f"{arm.label}'s launches did not run in one environment: block {launch.block + 1} vs block "
                    f"{first.block + 1}: {shown}{more}{others}",
                )
            )
    for arm in result.arms:
        if arm.attached_url:
            checks.append(
                Check(
                    "env",
                    INCONCLUSIVE,
                    f"{arm.label}'s environment was not verified: it ran on {arm.attached_url}, a server orch did not "
                    "launch (attached)",
                )
            )
    if checks:
        return checks
    launches = len(result.launches)
    unfingerprinted = sum(1 for launch in result.launches if not launch.fingerprint or launch.fingerprint.get("error"))
    note = f"; {unfingerprinted} launch(es) without a fingerprint were not compared" if unfingerprinted else ""
    return [
        Check(
            "env",
            OK,
            f"every launch's workers got the profile env, and each arm's launches agree on engine, GPUs, env and "
            f"profile ({launches} launch(es){note})",
        )
    ]
