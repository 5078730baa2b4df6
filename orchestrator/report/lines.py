"""What every report of an experiment says, whatever its format: the banners, the table rows, the comparison and
break-even lines, the design in words."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence

from orchestrator import engines
from orchestrator.client.summary import lag_text
from orchestrator.config.coverage import unsent_words
from orchestrator.config.slo import DEFAULT_METRIC, METRICS
from orchestrator.config.sweep import no_range_reason
from orchestrator.results.byprompt import ByPrompt
from orchestrator.results.capacity import CapacityComparison
from orchestrator.results.categories import ByCategory, only_category, unsent
from orchestrator.results.comparison import Comparison
from orchestrator.results.energy import EnergyComparison
from orchestrator.results.model import ABResult, ArmResult
from orchestrator.results.run import Level, Rate, level_name, level_phrase
from orchestrator.stats.estimates import BreakEven
from orchestrator.stats.family import Adjustment

SIM_BANNER = (
    f"SIMULATED: these numbers come from orch's simulator (of {' or '.join(engines.simulated())}), not from a real "
    "server on a GPU."
)


def attached_banner(result: ABResult) -> list[str]:
    """Said before any number: which arms ran on servers orch did not launch, and what that means."""
    arms = [arm for arm in result.arms if arm.attached_url]
    if not arms:
        return []
    mixed = len(arms) < len([arm for arm in result.arms if arm.launches])
    where = ", ".join(f"{arm.label} on {arm.attached_url}" for arm in arms)
    lines = [
        f"ATTACHED: {where}: measured on running server(s) orch did not launch. State NOT fresh (no restart "
        f"between blocks), environment NOT verified; host facts are {result.host}'s, not the attached server's."
    ]
    if mixed:
        lines.append("WARNING: MIXED COMPARISON of attached and launched arms (--allow-mixed); see the warnings below.")
    return lines


def node_mismatch_lines(result: ABResult) -> list[str]:
    """Said before any number (and again among the warnings): the nodes of the multi-node group differed."""
    node = result.node_mismatch()
    return [node] if node else []


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f}"


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def breakeven_lines(be: BreakEven, indent: str = "") -> list[str]:
    """The speculative-decoding explanation, in words a person checks with a calculator; from an A/B, each estimate
    with its 95 % interval, and "cannot tell" where the interval does not decide."""
    cap = f"at most {be.steps + 1} tokens per cycle"
    always = "a cycle yields at least one token, so speculation pays at any accept length (α* = 0)"

    def needs(a: float | None, tau: float) -> str:
        if a is None:
            return f"NOT reachable with {be.steps} draft steps ({cap})"
        if tau <= 1.0:
            return f"always reached: {always}"
        return f"needs per-token acceptance α ≥ {a:.3f} (chain model, {be.steps} steps)"

    def reach() -> str:
        if be.reach == "always":
            return f"always reached: {always}"
        if be.reach == "never":
            return f"NOT reachable with {be.steps} draft steps ({cap}, even at the interval's low end)"
        if be.reach == "cannot tell":
            return f"cannot tell whether it is reachable with {be.steps} draft steps ({cap}; the interval straddles it)"
        if be.breakeven_tau <= 1.0:
            head = "reached at any accept length at the estimate, but not across its interval"
        else:
            head = needs(be.breakeven_alpha, be.breakeven_tau)
        alphas = be.alpha_range
        if alphas is None:
            return head
        ends = ", ".join("out of reach" if a is None else f"{a:.3f}" for a in alphas)
        return f"{head}; α* 95% CI [{ends}]"

    ci = be.breakeven_tau_ci95
    lines = [
        f"baseline: {be.baseline_tps:.1f} tok/s = {be.baseline_token_ms:.2f} ms per token",
        f"speculative cycle: {be.cycle_ms:.1f} ms (draft + verify)",
        f"break-even accept length: {be.cycle_ms:.1f} / {be.baseline_token_ms:.2f} = {be.breakeven_tau:.3f} tokens "
        f"per cycle" + (f", 95% CI [{ci[0]:.3f}, {ci[1]:.3f}] over blocks" if ci else "") + f"; {reach()}",
    ]
    if be.measured_tau is not None:
        mci = be.measured_tau_ci95
        m = be.margin
        ratio = f"measured / break-even = the tok/s ratio {m.ratio:.3f}x, CI [{m.lo:.3f}, {m.hi:.3f}]" if m else ""
        position = {
            "above": "above break-even" + (f": {ratio}" if m else ""),
            "below": "below break-even" + (f": {ratio}" if m else ""),
            "at": "at break-even",
            "cannot tell": "cannot tell whether above or below break-even: "
            + (
                "one paired block cannot separate restart noise from a difference"
                if m is None or m.blocks < 2
                else f"{ratio} contains 1"
            ),
        }[be.position or "at"]
        lines.append(
            f"measured accept length: {be.measured_tau:.2f}"
            + (f", 95% CI [{mci[0]:.2f}, {mci[1]:.2f}] over launches" if mci else "")
            + f" ({position}"
            + (f"; α ≈ {be.measured_alpha:.3f})" if be.measured_alpha is not None else ")")
        )
    if be.target_tps is not None and be.target_tau is not None:
        lines.append(
            f"for {be.target_tps:.0f} tok/s: accept length {be.target_tau:.2f}; {needs(be.target_alpha, be.target_tau)}"
        )
    return [indent + line for line in lines]


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.2f}%"


def number(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


HEADER = [
    "arm",
    "launches",
    "runs",
    "median",
    "min",
    "max",
    "CV in",
    "CV across",
    "aggregate",
    "TTFT ms",
    "ITL p50",
    "ITL p99",
    "accept",
]


def _arm_row(arm: ArmResult, level: Level, vs: str) -> list[str]:
    """One arm at one level. median = median of launch values; min/max over runs; CVs within/across launches."""
    spread, s = arm.spread_at(level), arm.summary_at(level)
    timed = arm.timed_at(level)
    agg = arm.aggregate_at(level)
    accept = arm.accept_length_at(level)
    ttft = _median([r.ttft_s for r in timed if r.ttft_s is not None])
    itl50 = _median([r.metrics["itl"]["p50"] for r in timed if r.metrics.get("itl", {}).get("p50")])
    itl99 = _median([r.metrics["itl"]["p99"] for r in timed if r.metrics.get("itl", {}).get("p99")])
    return [
        arm.label,
        str(len(arm.launches)),
        str(len(timed)),
        number(spread.median if spread else None),
        number(s.min if s else None),
        number(s.max if s else None),
        _pct(spread.cv_within if spread else None),
        _pct(spread.cv_across if spread else None),
        "-" if agg is None else f"{agg.median:.0f}",
        _ms(ttft),
        _ms(itl50),
        _ms(itl99),
        number(accept, 2),
        vs,
    ]


def level_rows(result: ABResult, level: Level) -> list[list[str]]:
    """The header and one row per arm at one level (text and Markdown share them); its vs column is the
    tok/s ratio whatever --metric the verdicts are on."""
    ratios = {c.arm_index: c for c in result.comparisons_at(level, DEFAULT_METRIC)}
    if not is_ab(result):  # one arm: nothing to be "vs"
        return [HEADER, *(_arm_row(arm, level, "")[:-1] for arm in result.arms)]
    rows = [[*HEADER, "vs " + result.arms[0].label]]
    for i, arm in enumerate(result.arms):
        cmp = ratios.get(i)
        rows.append(_arm_row(arm, level, "1.000" if i == 0 else (f"{cmp.ratio:.3f}" if cmp and cmp.ratio else "-")))
    return rows


def is_ab(result: ABResult) -> bool:
    """Whether the experiment compares arms (`orch ab`) or measures one (`orch bench`)."""
    return len(result.arms) > 1


def title(result: ABResult) -> str:
    """The report's heading: an A/B names what it compares, a single-arm benchmark names its profile."""
    if is_ab(result):
        return f"A/B results ({result.experiment_id}, host {result.host_label})"
    return f"benchmark of {result.arms[0].label} ({result.experiment_id}, host {result.host_label})"


def ci_name(adjustment: Adjustment | None) -> str:
    """A verdict's interval by its level: "95% CI", or in a family of verdicts its Holm level ("99.2% CI")."""
    return "95% CI" if adjustment is None else adjustment.ci_name()


def family_note(adjustment: Adjustment | None) -> str:
    """Beside a family member's interval: " (Holm over 3 levels)"; nothing for a verdict of its own."""
    return "" if adjustment is None else f" ({adjustment.family_note()})"


def comparison_line(c: Comparison) -> str:
    """One arm against the baseline: the ratio, its 95 % CI over blocks (in a family of verdicts, at its Holm level,
    named), and what may be concluded from it. A comparison on another metric than tok/s names it (and, for a
    latency, that lower is better: a ratio below 1 is faster)."""
    head = f"{c.arm_label or c.arm} vs {c.vs_label or c.vs} @ {level_name(c.concurrency)}: "
    what = "" if c.metric == DEFAULT_METRIC else c.metric + ("" if c.higher_is_better else " (lower is better)")
    est = c.estimate
    if c.ratio is None or est is None:
        why = c.note or "no block in which both have valid runs"
        return head + (f"{what}: " if what else "") + why + ": nothing to compare"
    head += f"{what} " if what else ""
    pct = abs(c.ratio - 1) * 100
    better = c.ratio >= 1 if c.higher_is_better else c.ratio <= 1
    word = "faster" if better else "slower"
    note = f"; NOTE: {c.note}" if c.note else ""
    gap = c.cache_gap
    if gap is not None and gap.measured:
        note += f"; {gap.reason}, measured as part of the comparison (--cache-measured)"
    if c.held_back and gap is not None:
        said = c.ci_verdict.upper() if c.ci_verdict in ("faster", "slower") else (c.ci_verdict or "nothing")
        line = head + f"{c.ratio:.3f}x"
        if est.blocks >= 2:
            line += f", {ci_name(c.adjustment)} [{est.lo:.3f}, {est.hi:.3f}] over {est.blocks} blocks"
            line += family_note(c.adjustment)
        return line + f" -> inconclusive: {gap.reason}; the CI alone says {said}; {gap.advice}" + note
    if est.blocks < 2:
        return (
            head + f"{c.ratio:.3f}x ({pct:.1f}% {word} in one block) -> inconclusive: one launch per arm cannot "
            "separate restart noise from a real difference (use --blocks 3 or more)" + note
        )
    if c.ci_note is not None:  # an interval spanning an order of magnitude says nothing: in words, not numbers
        line = head + f"{c.ratio:.3f}x, {ci_name(c.adjustment)} {c.ci_note}"
    else:
        line = head + f"{c.ratio:.3f}x, {ci_name(c.adjustment)} [{est.lo:.3f}, {est.hi:.3f}] over {est.blocks} blocks"
    line += family_note(c.adjustment) + " -> "
    me = c.min_effect * 100
    if c.verdict in ("faster", "slower"):
        line += f"{c.verdict.upper()} by {pct:.1f}%"
    elif c.verdict == "no difference":
        line += f"no difference (the CI lies within ±{me:.1f}%)"
    else:
        line += f"inconclusive (the CI is too wide to call ±{me:.1f}%)"
        if c.advice:
            line += f"; {c.advice}"
    if c.mde_note is not None:
        line += f"; minimal detectable effect: {c.mde_note}"
    elif c.mde is not None:
        line += f"; minimal detectable effect {c.mde * 100:.1f}%"
    return line + note


def ci_method_line(comparisons: Sequence[Comparison]) -> str | None:
    """How the CIs of these comparisons were built (paired or not, widened or not): said once per level, and only
    where there is a CI (two or more blocks)."""
    methods = list(dict.fromkeys(c.estimate.method for c in comparisons if c.estimate and c.estimate.blocks >= 2))
    return f"CI: {'; '.join(methods)}" if methods else None


def order_text(result: ABResult) -> str:
    # With one arm there is no order within a block to speak of.
    d = result.design
    if not is_ab(result):
        return ", one launch each"
    return f", launch order {d.order}" + (f" (seed {d.seed})" if d.order == "random" else "")


def whatif_line(result: ABResult) -> str | None:
    """`orch whatif`'s one-line recommendation when the experiment measured two or more step counts of one drafter."""
    from orchestrator.whatif import predict

    return predict.recommendation_line(result)


# ---------------------------------------------------------------- goodput under the SLO, and the verdict's metric


def metric_line(result: ABResult) -> str | None:
    """Which metric the verdicts are on, when it is not tok/s (the table above every verdict shows tok/s)."""
    if result.metric == DEFAULT_METRIC:
        return None
    spec = METRICS[result.metric]
    way = "higher is better" if spec.higher_is_better else "lower is better: a ratio below 1 is faster"
    return f"verdicts on {result.metric}: {spec.label} ({way}), not tok/s per stream (--metric)"


def slo_line(result: ABResult) -> str | None:
    if result.slo is None:
        return None
    return (
        f"SLO {result.slo.text} ({result.slo.describe()}): a request is good when it completed within every limit; "
        "goodput = good requests per second of the run"
    )


def slo_heading(result: ABResult, level: Level) -> str:
    return (
        f"goodput at {level_phrase(level)}: median of launch values (each the median of its runs); within SLO: "
        "share of all requests within every limit; SLO met: each arm's pNN (median of launch values) within its limit"
        + ("; vs: goodput ratio" if is_ab(result) else "")
    )


def slo_rows(result: ABResult, level: Level) -> list[list[str]]:
    """Each arm's goodput under the SLO at one level: req/s and tok/s of good requests, the share of requests within
    every limit, each percentile objective's value, whether all were met, and (an A/B) the goodput ratio."""
    arms = result.arms
    objectives = [o for o in (result.slo.objectives if result.slo else ()) if o.percentile is not None]
    header = ["arm", "goodput req/s", "good tok/s", "within SLO"]
    header += [f"{o.quantity.upper()} p{o.percentile} ms" for o in objectives] + ["SLO met"]
    ab = is_ab(result)
    ratios = {c.arm_index: c for c in result.comparisons_at(level, "goodput")} if ab else {}
    rows = [header + ([f"vs {arms[0].label}"] if ab else [])]
    for i, arm in enumerate(arms):
        req, tok, got = arm.spread_at(level, "goodput"), arm.spread_at(level, "goodput_tok_s"), arm.attainment_at(level)
        checks = arm.objectives_at(level)
        met = [m for _, _, m in checks]
        verdict = "-" if not checks or None in met else ("yes" if all(met) else "no")
        row = [
            arm.label,
            number(req.median if req else None, 2),
            number(tok.median if tok else None),
            "-" if got is None or got.fraction is None else f"{got.fraction * 100:.1f}%",
            *[_ms(v) for _, v, _ in checks],
            verdict,
        ]
        if ab:
            cmp = ratios.get(i)
            row.append("1.000" if i == 0 else (f"{cmp.ratio:.3f}" if cmp and cmp.ratio else "-"))
        rows.append(row)
    return rows


def metric_heading(result: ABResult, level: Level) -> str | None:
    """The table of the verdict's metric, where no other table shows it: a latency percentile."""
    spec = METRICS[result.metric]
    if spec.higher_is_better:
        return None
    return (
        f"{spec.label} at {level_phrase(level)} ({spec.unit}, lower is better): median of launch values (each the "
        "median of its runs); min/max over launches; CV across launches" + ("; vs: ratio" if is_ab(result) else "")
    )


def metric_rows(result: ABResult, level: Level) -> list[list[str]]:
    spec = METRICS[result.metric]
    ab = is_ab(result)
    ratios = {c.arm_index: c for c in result.comparisons_at(level)} if ab else {}
    rows = [
        ["arm", "launches", f"{spec.name} {spec.unit}", "min", "max", "CV across"]
        + ([f"vs {result.arms[0].label}"] if ab else [])
    ]
    for i, arm in enumerate(result.arms):
        spread = arm.spread_at(level, spec.name)

        def shown(value: float | None) -> str:
            return number(None if value is None else value * spec.scale)

        row = [
            arm.label,
            str(spread.launches if spread else 0),
            shown(spread.median if spread else None),
            shown(spread.launch_min if spread else None),
            shown(spread.launch_max if spread else None),
            _pct(spread.cv_across if spread else None),
        ]
        if ab:
            cmp = ratios.get(i)
            row.append("1.000" if i == 0 else (f"{cmp.ratio:.3f}" if cmp and cmp.ratio else "-"))
        rows.append(row)
    return rows


def joules(value: float | None) -> str:
    """Joules to three significant figures (J/token spans 0.01 on a small model to hundreds on a big TP group)."""
    if value is None:
        return "-"
    if value >= 100:
        return f"{value:.0f}"
    return f"{value:.1f}" if value >= 10 else (f"{value:.2f}" if value >= 1 else f"{value:.3g}")


def energy_measured(result: ABResult) -> bool:
    """Whether any arm has an energy figure at any level."""
    return any(arm.energy_at(level) is not None for arm in result.arms for level in arm.levels)


def energy_missing(result: ABResult) -> str | None:
    """Why no arm has an energy figure (the runs' reasons, each once), or None when some arm has one or no run
    tried (an experiment stored before orch measured energy, an attached server)."""
    if energy_measured(result):
        return None
    reasons = [why for arm in result.arms for level in arm.levels if (why := arm.energy_missing_at(level))]
    return "; ".join(dict.fromkeys(reasons)) if reasons else None


def energy_arm_line(arm: ArmResult, level: Level) -> str | None:
    """One arm's joules per output token at one level with its CI, or why it has none."""
    est = arm.energy_at(level)
    if est is None:
        why = arm.energy_missing_at(level)
        return f"{arm.label}: not measured ({why})" if why else None
    if est.lo is not None and est.hi is not None:
        ci = f"95% CI [{joules(est.lo)}, {joules(est.hi)}] over {est.launches} launches"
    else:
        ci = "one launch: no CI (restart-to-restart noise needs --blocks 2 or more)"
    watts = f"; {est.mean_w:.0f} W" if est.mean_w is not None else ""
    gpus = f" on {est.gpus} GPU{'s' if est.gpus != 1 else ''}" if est.gpus else ""
    return f"{arm.label}: {joules(est.j_per_token)} J/token, {ci} ({est.runs} runs{watts}{gpus})"


def energy_comparison_line(c: EnergyComparison) -> str:
    """An arm's joules per output token against the baseline's, with its CI over blocks and the verdict."""
    head = f"{c.arm_label} vs {c.vs_label} @ {level_name(c.concurrency)}: "
    est = c.estimate
    if est is None:
        return head + "no block in which both measured energy"
    pct = abs(est.ratio - 1) * 100
    if est.blocks < 2:
        return head + f"{est.ratio:.3f}x the energy per token in one block -> inconclusive (use --blocks 3 or more)"
    line = head + f"{est.ratio:.3f}x the energy per token, 95% CI [{est.lo:.3f}, {est.hi:.3f}] over {est.blocks} blocks"
    if c.verdict in ("less", "more"):
        return line + f" -> {c.verdict.upper()} energy per token by {pct:.1f}%"
    if c.verdict == "no difference":
        return line + f" -> no difference (the CI lies within ±{c.min_effect * 100:.1f}%)"
    return line + f" -> inconclusive (the CI is too wide to call ±{c.min_effect * 100:.1f}%)"


def energy_lines(result: ABResult, level: Level) -> list[str]:
    """Joules per output token at one level: a heading, one line per arm, one per comparison; [] when no arm
    measured energy anywhere (`energy_missing` says why once)."""
    if not energy_measured(result):
        return []
    arms = [line for arm in result.arms if (line := energy_arm_line(arm, level))]
    if not arms:
        return []
    head = f"energy per output token at {level_phrase(level)} (J/token: joules over each run's steady window, summed "
    head += "over the server's GPUs, / output tokens in it; launch value = median of its runs):"
    return [head, *arms, *(energy_comparison_line(c) for c in result.energy_comparisons_at(level))]


POWER_FIELD_NOTES = {
    "power.draw.instant": "power.draw.instant, the board's last power reading (NVIDIA documents it as accurate to "
    "±5 W, not the window its sensor averages over)",
    "power.draw": "power.draw, which on Ampere and newer GPUs is an average over the last second (instantaneous on "
    "older ones; this driver lacks power.draw.instant), so each sample smears the second before it: close over runs "
    "of several seconds, not over a run of about one",
}


def energy_note(result: ABResult) -> str | None:
    """What the energy figures are and are not, said once wherever they are shown; the not-measured line when no
    arm has any."""
    if (why := energy_missing(result)) is not None:
        return f"energy: not measured ({why})"
    if not energy_measured(result):
        return None
    fields = sorted(
        {f for arm in result.arms for level in arm.levels if (est := arm.energy_at(level)) for f in est.fields}
    )
    said = "; ".join(POWER_FIELD_NOTES.get(f, f) for f in fields) or "nvidia-smi's power readings"
    note = (
        f"energy: from nvidia-smi's {said}, sampled every 100 ms by one looping nvidia-smi during each run and "
        "integrated (trapezoid) over the run's steady window; the board's own sensor samples and averages on the "
        "driver's schedule, so these are estimates of the GPU boards' energy (no CPU, memory or cooling), not a "
        "power meter's readings"
    )
    if result.simulated:
        note += (
            "; SIMULATED: the server was orch's simulator, so the watts are whatever the nvidia-smi on PATH reported "
            "for the GPUs it attributed to the simulator's processes (a fake one in orch's tests), not GPUs doing "
            "this work"
        )
    return note


# ---------------------------------------------------------------- where speculation stops paying


def crossover_lines(result: ABResult) -> list[str]:
    """Each arm against the first over the levels measured (two or more): the load where it stops paying (or
    starts), with its 95 % CI, or that it does not cross in the range measured."""
    rates = bool(result.levels) and isinstance(result.levels[0], Rate)
    unit = " req/s" if rates else ""

    def load(value: float, about: str = "") -> str:
        return f"{about}{value:.3g} req/s" if rates else f"concurrency {about}{value:.3g}"

    out = []
    for arm, x in result.crossovers():
        span = f"{load(x.levels[0])} to {load(x.levels[-1])}"
        on = "" if result.metric == DEFAULT_METRIC else f" on {result.metric}"
        head = f"crossover: {arm.label} vs {result.arms[0].label}{on}: "
        if x.status == "crosses" and x.at is not None:
            lo = f"below {x.levels[0]:g}" if x.lo is None else f"{x.lo:.3g}"
            hi = f"beyond {x.levels[-1]:g}" if x.hi is None else f"{x.hi:.3g}"
            better, worse = ("faster", "slower") if x.pays_below else ("slower", "faster")
            where = "below" if x.pays_below else "above"
            line = (
                f"pays {where} {load(x.at, '~')} (95% CI {lo} to {hi}{unit}, over {x.blocks} blocks); "
                f"{better} below it, {worse} above it"
            )
            if x.crosses_again:
                line += " (the ratio crosses 1 more than once in the range; the first crossing is shown)"
        elif x.status == "undecided":
            lo = load(x.levels[0]) if x.lo is None else load(x.lo)
            hi = load(x.levels[-1]) if x.hi is None else load(x.hi)
            line = f"no crossing seen in the range measured ({span}), but one between {lo} and {hi} cannot be excluded"
        else:
            verdict = "faster" if x.status == "pays throughout" else "slower"
            line = f"does not cross in the range measured ({span}): {verdict} throughout"
        out.append(head + line)
    return out


def sweep_lines(result: ABResult) -> list[str]:
    """Where --sweep auto's rate levels came from: the probe experiment and each arm's rates it measured."""
    sweep = result.sweep
    if not sweep:
        return []
    sync, sat = sweep.get("synchronous") or {}, sweep.get("saturated") or {}
    arms = "; ".join(
        f"{label} {sync.get(label, 0):g} req/s at concurrency 1, {sat.get(label, 0):g} at {sweep.get('concurrency')}"
        for label in sync
    )
    rates = ", ".join(f"{float(r):g}" for r in sweep.get("rates") or [])
    out = [
        f"levels from --sweep auto: rates {rates} req/s, from probe experiment {sweep.get('probe')} ({arms})",
        "  each rate level stops sending once the server is over-saturated (the backlog grows with time)",
    ]
    # A sweep stored before the reason was recorded, that ran one level, has it derived from the probe's rates.
    concurrency, one = sweep.get("concurrency"), len(sweep.get("rates") or []) == 1
    no_range = sweep.get("no_range") or (
        no_range_reason(concurrency, sync, sat)
        if isinstance(concurrency, int) and one and "no_range" not in sweep
        else None
    )
    return out + ([f"  {no_range}"] if isinstance(no_range, str) else [])


def level_heading(level: Level) -> str:
    """What a level's table shows, as its heading says it."""
    if isinstance(level, Rate):
        return (
            f"tok/s per stream at {level_phrase(level)} (open loop: each request's time counts from when it was "
            "scheduled)"
        )
    return f"tok/s per stream at {level_phrase(level)}"


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


def rate_lines(result: ABResult, level: Level) -> list[str]:
    """At an open-loop level, each arm's achieved rate against the offered one and its latency percentiles from the
    scheduled send time; a shortfall says who held the rate back (also among the warnings). [] at a concurrency
    level."""
    out = []
    for arm in result.arms:
        rl = arm.rate_level(level)
        if rl is None:
            continue
        achieved = "-" if rl.achieved_rate is None else f"{rl.achieved_rate:.2f}"
        scheduled = "-" if rl.scheduled_rate is None else f"{rl.scheduled_rate:.2f}"
        line = (
            f"{arm.label} @ {level_name(level)}: achieved {achieved} req/s of {scheduled} scheduled "
            f"({rl.rate:g} offered); TTFT p50 {_seconds(rl.ttft_p50_s)}, p99 {_seconds(rl.ttft_p99_s)}; "
            f"E2E p50 {_seconds(rl.e2e_p50_s)}, p99 {_seconds(rl.e2e_p99_s)}; send lag p99 "
            + ("-" if rl.send_lag_p99_s is None else lag_text(rl.send_lag_p99_s))
            + (f"; {rl.held} requests held by the cap" if rl.held else "")
            + (f"; peak {rl.peak_in_flight} in flight" if rl.peak_in_flight is not None else "")
        )
        if rl.stopped:
            where = " IN THE CLIENT" if rl.limited == "client" else ""
            line += f" -> OVER-SATURATED{where}: {rl.stopped} of {rl.runs} runs stopped sending early"
        elif rl.limited is not None:
            line += f" -> SHORT OF ITS RATE ({rl.limited}-limited)"
        out.append(line)
    return out


def slo_capacity_lines(result: ABResult) -> list[str]:
    """Each arm's highest load within the SLO's percentile objectives over the levels measured, with its 95 % CI
    over blocks (per block, where its margin limit / pNN first falls to 1: the A/B's number too), or that the SLO
    held (or failed) at every level; a note for each block that missed the SLO and met it again higher up."""
    found = result.max_within_slo()
    if not found or result.slo is None:
        return []
    rates = bool(result.levels) and isinstance(result.levels[0], Rate)
    unit, word = (" req/s", "") if rates else ("", "concurrency ")
    objectives = ", ".join(o.describe() for o in result.slo.objectives if o.percentile is not None)
    out = [f"highest load within the SLO ({objectives}), from each launch's percentiles at each level:"]
    for arm, x in found:
        span = f"{word}{x.levels[0]:g} to {x.levels[-1]:g}{unit}"
        if x.status == "crosses" and x.at is not None:
            lo = f"below {x.levels[0]:g}" if x.lo is None else f"{x.lo:.3g}"
            hi = f"beyond {x.levels[-1]:g}" if x.hi is None else f"{x.hi:.3g}"
            line = f"{word}~{x.at:.3g}{unit} (95% CI {lo} to {hi}{unit}, over {x.blocks} blocks)"
        elif x.status == "pays throughout":
            line = f"within the SLO at every level measured ({span}): the highest is beyond the range"
        elif x.status == "never pays":
            line = f"over the SLO at every level measured ({span})"
        else:
            # Some blocks left the SLO within the range, others not at all (or already at the first level): no
            # point estimate, only what counting those at the range's edge still bounds.
            if x.lo is not None and x.hi is not None:
                where = f"its 95% CI lies within {word}{x.lo:.3g} to {x.hi:.3g}{unit}"
            elif x.lo is not None:
                where = f"its 95% CI starts at {word}{x.lo:.3g}{unit}, with no upper end"
            elif x.hi is not None:
                where = f"its 95% CI ends at {word}{x.hi:.3g}{unit}, with no lower end"
            else:
                where = "the data bound it on neither side"
            line = (
                f"not decided within the range measured ({span}): in some of its {x.blocks} blocks the capacity lies "
                f"outside the levels (past the last, or over the SLO at the first); {where}: more blocks or levels "
                "would say"
            )
        out.append(f"  {arm.label}: {line}")
    out += [f"  note: {r.text()}" for r in result.slo_recoveries()]
    for c in result.capacity_comparisons():
        out.append(f"  {capacity_comparison_line(c)}")
    return out


def capacity_comparison_line(c: CapacityComparison) -> str:
    """The A/B on the highest load within the SLO: the ratio of the arms' capacities, its CI and verdict."""
    head = f"{c.arm} vs {c.base}, highest load within the SLO: "
    censored = (
        f"; {c.censored} block(s) left out: a capacity outside the levels measured (past the last, or over the SLO "
        "at the first)"
        if c.censored
        else ""
    )
    if c.bound is not None:
        end, words = (c.hi, "below") if c.bound == "upper" else (c.lo, "above")
        safe = "overstate" if c.bound == "upper" else "understate"
        return (
            f"{head}{words} {end:.3f}x (the {c.bound} end of its 95% CI over {c.blocks} blocks; in {c.censored} of "
            "them a capacity lay outside the levels measured and is counted at the range's edge, which can only "
            f"{safe} the ratio) -> {c.verdict.upper() if c.verdict else '?'}"
        )
    if c.ratio is None or c.lo is None or c.hi is None:
        return (
            head + f"not compared: {c.blocks} block(s) where both capacities lie within the levels measured, two "
            "needed (more blocks, or levels spanning both capacities)" + censored
        )
    verdict = {"higher": "HIGHER", "lower": "LOWER", "no difference": "NO DIFFERENCE"}.get(
        c.verdict or "", "inconclusive (the CI includes 1)"
    )
    return f"{head}{c.ratio:.3f}x, 95% CI [{c.lo:.3f}, {c.hi:.3f}] over {c.blocks} blocks -> {verdict}{censored}"


def category_heading(bc: ByCategory, noun: str = "category") -> str:
    """What the by-category table holds (one level: the one it is about); by prompt, with noun "prompt"."""
    held = next((c.adjustment for c in bc.comparisons if c.adjustment is not None), None)
    ci = (
        "95% CI over blocks"
        if held is None
        else f"CI over blocks at its Holm level (the level beside each; {held.family_note()}, family-wise 95%)"
    )
    return (
        f"by {noun} @ {level_name(bc.level)}: tok/s per stream from each {noun}'s requests (median of launch "
        f"medians; accept length: mean per request); ratio vs the first arm paired block by block, {ci}"
    )


def category_rows(bc: ByCategory, column: str = "category", name: Callable[[str], str] = str) -> list[list[str]]:
    """One row per category: requests, each arm's tok/s (and accept length), each comparison's ratio, CI and verdict;
    by prompt, the column "prompt" and each row named by `name`."""
    labels = list(dict.fromkeys(a.arm_label for a in bc.arms))
    vs = list(dict.fromkeys(c.arm_label for c in bc.comparisons))
    header = [column, "requests/arm", *(f"{label} tok/s" for label in labels)]
    held = next((c.adjustment for c in bc.comparisons if c.adjustment is not None), None)
    for label in vs:
        header += [f"{label} ratio", "95% CI" if held is None else "CI (Holm)", "verdict"]
    rows = [header]
    for category in bc.categories:
        arms = [bc.arm(label, category) for label in labels]
        cells = [name(category), str(arms[0].requests if arms and arms[0] is not None else 0)]
        for a in arms:
            value = number(a.tok_s if a else None)
            cells.append(value + (f" (al {a.accept_length:.2f})" if a and a.accept_length is not None else ""))
        for label in vs:
            c = next(c for c in bc.comparisons if c.arm_label == label and c.category == category)
            est = c.estimate
            ci = f"[{est.lo:.3f}, {est.hi:.3f}]" if est is not None and est.blocks >= 2 else "-"
            if c.adjustment is not None and ci != "-":
                ci += f" {c.adjustment.ci_name()}"
            ci = c.unbounded or ci
            cells += [
                f"{c.ratio:.3f}x" if c.ratio is not None else "-",
                ci,
                (c.verdict or "-") + ("" if c.paired or c.verdict is None else " (unpaired)"),
            ]
        rows.append(cells)
    return rows


def prompt_heading(bp: ByPrompt) -> str:
    """What the by-prompt table holds: category_heading's words, by prompt."""
    return category_heading(bp.table, "prompt") + "; each prompt by its number in the set and its first characters"


def prompt_rows(bp: ByPrompt) -> list[list[str]]:
    """One row per prompt sent, as category_rows."""
    return category_rows(bp.table, "prompt", bp.label)


def prompt_lines(bp: ByPrompt) -> list[str]:
    """The prompts whose ratio lies on the other side of 1 from the verdict (results/byprompt.opposite_notes)."""
    return list(bp.notes)


def one_category_line(result: ABResult) -> str | None:
    """Said where a categorised workload has a single category (HumanEval), in place of a one-row breakdown."""
    name = only_category(result)
    return None if name is None else f"by category: every prompt is {name}; the comparison above is its verdict"


def unsent_lines(result: ABResult) -> list[str]:
    """The dataset's categories no timed run sent, named (a breakdown shows only the categories sent); [] if none."""
    missing = unsent(result)
    if not missing:
        return []
    them = "it" if len(missing) == 1 else "them"
    return [
        f"categories not sent: {unsent_words(missing)}; no timed run sent a prompt of {them}, so nothing here speaks "
        f"for {them}"
    ]


def category_lines(bc: ByCategory) -> list[str]:
    """Where each arm pays and where it does not, one sentence per comparison."""
    return bc.sentences()
