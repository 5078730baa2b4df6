"""Rendering comparisons and claim verdicts: text to paste in a ticket, a JSON document, Markdown."""

from __future__ import annotations

from typing import Any

from orchestrator.common.printable import visible
from orchestrator.report.lines import SIM_BANNER
from orchestrator.report.markdown import md_table, md_text
from orchestrator.report.text import text_table
from orchestrator.results.compare import (
    ArmSide,
    ClaimVerdict,
    ExperimentComparison,
    OneSidedLevel,
    Side,
    estimate_json,
)
from orchestrator.results.run import Rate, level_phrase
from orchestrator.stats.estimates import RatioEstimate
from orchestrator.stats.reproduction import NOT_REPRODUCED, ArmEstimate, ReproVerdict


def _est(e: ArmEstimate | RatioEstimate | None, digits: int = 1) -> str:
    """value [lo, hi] xN, or the value and "(1 launch, no CI)"."""
    if e is None:
        return "-"
    if isinstance(e, ArmEstimate):
        value, lo, hi, n = e.value, e.lo, e.hi, e.launches
    else:
        value, lo, hi, n = e.ratio, e.lo, e.hi, e.blocks
    if n < 2 or lo is None or hi is None:
        return f"{value:.{digits}f} (x1, no CI)"
    return f"{value:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}] x{n}"


def _change(v: ReproVerdict | None) -> str:
    if v is None:
        return "-"
    if v.ci is None:
        return f"{v.change * 100:+.1f}%"
    return f"{v.change * 100:+.1f}% [{(v.ci[0] - 1) * 100:+.1f}, {(v.ci[1] - 1) * 100:+.1f}]"


def _status(v: ReproVerdict | None, one_side: bool = False) -> str:
    if one_side:
        return "one side only"
    return "no valid runs" if v is None else v.status.upper()


def _pair(a: float | None, b: float | None, scale: float = 1.0, digits: int = 1) -> str:
    def f(x: float | None) -> str:
        return "-" if x is None else f"{x * scale:.{digits}f}"

    return f"{f(a)} / {f(b)}"


def _side_attr(s: ArmSide | None, name: str) -> Any:
    return getattr(s, name) if s is not None else None


def _arm_rows(c: ExperimentComparison) -> list[list[str]]:
    head = ["arm", "A tok/s [95% CI] xlaunches", "B tok/s [95% CI]", "B vs A [95% CI]", "TTFT ms A/B"]
    rows = [[*head, "ITL p50 ms A/B", "accept A/B", "verdict"]]
    for r in c.arms:
        rows.append(
            [
                r.shown,
                _est(_side_attr(r.a, "tok_s")),
                _est(_side_attr(r.b, "tok_s")),
                _change(r.verdict),
                _pair(_side_attr(r.a, "ttft_s"), _side_attr(r.b, "ttft_s"), 1000.0),
                _pair(_side_attr(r.a, "itl_p50_s"), _side_attr(r.b, "itl_p50_s"), 1000.0),
                _pair(_side_attr(r.a, "accept_length"), _side_attr(r.b, "accept_length"), digits=2),
                _status(r.verdict, r.a is None or r.b is None),
            ]
        )
    return rows


def _ratio_rows(c: ExperimentComparison) -> list[list[str]]:
    rows = [["ratio", "A [95% CI] xblocks", "B [95% CI]", "B vs A [95% CI]", "verdict"]]
    for r in c.ratios:
        one_side = r.a is None or r.b is None
        rows.append([r.shown, _est(r.a, 3), _est(r.b, 3), _change(r.verdict), _status(r.verdict, one_side)])
    return rows


def _side(s: Side) -> str:
    return f"{s.experiment_id} (host {s.host}, {s.blocks} block(s))"


def _data_step(change: str, head: str = "environment step") -> str:
    return (
        f"{head}: B sent other data than A ({change}); like an engine change, it may explain a difference: the two "
        "are not like for like"
    )


def headline(c: ExperimentComparison | ClaimVerdict) -> str:
    """The one line at the top: the status and why."""
    return f"{c.status.upper()}: {c.reason}"


def _details(c: ExperimentComparison, arms_too: bool = True) -> list[str]:
    """The reason behind every value that did not reproduce (and, with `arms_too`, the arms found on one side
    only: said once, under the first level)."""
    out = []
    for r in c.arms:
        if r.verdict is not None and r.verdict.status != "reproduced":
            out.append(f"{r.shown} tok/s: {r.verdict.status}: {r.verdict.reason}")
    for q in c.ratios:
        if q.verdict is not None and q.verdict.status != "reproduced":
            out.append(f"ratio {q.shown}: {q.verdict.status}: {q.verdict.reason}")
    ratio_verdicts = [q.verdict.status for q in c.ratios if q.verdict is not None]
    if c.status != "reproduced" and ratio_verdicts and set(ratio_verdicts) == {"reproduced"}:
        # Another machine's absolute speed may differ while the speed-up holds: say that the ratios stand on
        # their own, since the overall verdict (and exit code) also judges every arm's tok/s.
        out.append(
            "every ratio reproduced on its own; the overall verdict also judges each arm's tok/s "
            "(--json: ratios[].verdict.status)"
        )
    if not arms_too:
        return out
    if c.only_in_a:
        out.append(f"only in A: {', '.join(c.only_in_a)}")
    if c.only_in_b:
        out.append(f"only in B: {', '.join(c.only_in_b)}")
    if c.map_hint:
        out.append(f"if they are the same arms under other names, pair them: {c.map_hint}")
    return out


def _causes_title(c: ExperimentComparison) -> str:
    return "likely causes, most likely first:" if c.status == NOT_REPRODUCED else "what differs (fingerprints):"


def _where(c: ExperimentComparison) -> str:
    """The level(s) judged, in words."""
    both = " both measured" if c.one_sided else ""
    if c.levels:
        return f"{len(c.levels)} levels{both} ({', '.join(level_phrase(x.concurrency) for x in c.levels)}), each judged"
    return level_phrase(c.concurrency) + (" (the one level both measured)" if c.one_sided else "")


ONE_SIDED_TITLE = "levels measured on one side only (nothing to judge them against):"


def compare_text(c: ExperimentComparison) -> str:
    lines = [
        headline(c),
        f"  A (recorded): {_side(c.a)}",
        f"  B (new):      {_side(c.b)}",
        *([f"  {_data_step(c.dataset_change)}"] if c.dataset_change else []),
        f"  {_where(c)}; tolerance ±{c.tolerance * 100:.1f}%; tok/s = geometric mean of launch "
        "medians, 95% CI across launches",
    ]
    if c.one_sided:
        lines += [f"  {ONE_SIDED_TITLE}", *(f"    {x.said}" for x in c.one_sided)]
    if c.a.simulated or c.b.simulated:
        lines.append(SIM_BANNER)
    for level in c.levels or (c,):
        if c.levels:
            lines += ["", f"  {level_phrase(level.concurrency)}: {headline(level)}"]
        lines += text_table(_arm_rows(level))
        if level.ratios:
            lines.append("")
            lines += text_table(_ratio_rows(level))
        lines += ["  " + d for d in _details(level, level is (c.levels or (c,))[0])]
    if c.causes:
        lines.append("  " + _causes_title(c))
        lines += [f"    {i}. {cause}" for i, cause in enumerate(c.causes, 1)]
    # Each line one line, shown not obeyed: arm names come from stores and bundles, causes quote servers' versions.
    return "\n".join(visible(line) for line in lines)


def _verdict_json(v: ReproVerdict | None) -> dict[str, Any] | None:
    return v.to_dict() if v is not None else None


def _arm_side_json(s: ArmSide | None) -> dict[str, Any] | None:
    if s is None:
        return None
    return {
        "tok_s": estimate_json(s.tok_s),
        "ttft_s": s.ttft_s,
        "itl_p50_s": s.itl_p50_s,
        "accept_length": s.accept_length,
    }


def _side_json(s: Side) -> dict[str, Any]:
    return {
        "experiment_id": s.experiment_id,
        "host": s.host,
        "simulated": s.simulated,
        "blocks": s.blocks,
        "dataset": s.dataset.to_dict() if s.dataset is not None else None,
    }


def compare_json(c: ExperimentComparison) -> dict[str, Any]:
    """The `orch compare --json` document. Field names are a contract: add, never rename. With two or more levels,
    the top-level fields are the headline level's (status and reason over every level) and `levels` has each."""
    doc = _level_json(c)
    doc["not_judged_levels"] = [_one_sided_json(x) for x in c.one_sided]
    if c.levels:
        doc["levels"] = [{k: v for k, v in _level_json(x).items() if k not in ("a", "b")} for x in c.levels]
    return doc


def _one_sided_json(x: OneSidedLevel) -> dict[str, Any]:
    """A level only one side measured: the level as a level's own fields are, the other side's levels, and for a
    rate the nearest on the other side (another level all the same)."""
    return {
        "measured_by": x.side,
        "concurrency": None if isinstance(x.level, Rate) else x.level,
        "rate": float(x.level) if isinstance(x.level, Rate) else None,
        "other_side": {
            "concurrency": [level for level in x.other if not isinstance(level, Rate)],
            "rates": [float(level) for level in x.other if isinstance(level, Rate)],
        },
        "nearest_rate": float(x.nearest) if x.nearest is not None else None,
        "reason": x.said,
    }


def _level_json(c: ExperimentComparison) -> dict[str, Any]:
    return {
        "status": c.status,
        "reason": c.reason,
        "exit_code": c.exit_code,
        "tolerance": c.tolerance,
        "concurrency": None if isinstance(c.concurrency, Rate) else c.concurrency,
        **({"rate": float(c.concurrency)} if isinstance(c.concurrency, Rate) else {}),
        "a": _side_json(c.a),
        "b": _side_json(c.b),
        "arms": [
            {
                "label": r.label,
                "b_label": r.b_label or r.label,
                "a": _arm_side_json(r.a),
                "b": _arm_side_json(r.b),
                "verdict": _verdict_json(r.verdict),
            }
            for r in c.arms
        ],
        "ratios": [
            {
                "arm": r.arm,
                "vs": r.vs,
                "b_name": r.b_name or f"{r.arm} / {r.vs}",
                "a": estimate_json(r.a),
                "b": estimate_json(r.b),
                "verdict": _verdict_json(r.verdict),
            }
            for r in c.ratios
        ],
        "only_in_a": c.only_in_a,
        "only_in_b": c.only_in_b,
        "arm_map": dict(c.arm_map),
        "causes": list(c.causes),
        "dataset_change": c.dataset_change,
    }


def compare_markdown(c: ExperimentComparison) -> str:
    """The comparison as Markdown; every sentence escaped whole (md_text: arm names come from stores and bundles,
    causes quote servers' versions), the markup added around it."""
    t = md_text
    lines = [f"# {t(f'Compare {c.a.experiment_id} → {c.b.experiment_id}')}", "", f"**{t(headline(c))}**", ""]
    if c.a.simulated or c.b.simulated:
        lines += [f"**{t(SIM_BANNER)}**", ""]
    lines += [
        t(
            f"A (recorded): {_side(c.a)}; B (new): {_side(c.b)}. {_where(c)[:1].upper() + _where(c)[1:]}; tolerance "
            f"±{c.tolerance * 100:.1f}%."
        ),
        "",
        *([f"**{t(_data_step(c.dataset_change, 'Environment step'))}**", ""] if c.dataset_change else []),
    ]
    if c.one_sided:
        title = ONE_SIDED_TITLE[:1].upper() + ONE_SIDED_TITLE[1:]
        lines += [t(title), "", *(f"- {t(x.said)}" for x in c.one_sided), ""]
    for level in c.levels or (c,):
        if c.levels:
            lines += [f"## {t(f'{level_phrase(level.concurrency)}: {headline(level)}')}", ""]
        lines += md_table(_arm_rows(level))
        if level.ratios:
            lines += ["", *md_table(_ratio_rows(level))]
        details = _details(level, level is (c.levels or (c,))[0])
        if details:
            lines += ["", *(f"- {t(d)}" for d in details)]
        if c.levels:
            lines.append("")
    if c.causes:
        lines += ["", f"## {_causes_title(c).rstrip(':').capitalize()}", ""]
        lines += [f"{i}. {t(cause)}" for i, cause in enumerate(c.causes, 1)]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- claims


def _verdict_tail(v: ReproVerdict | None) -> str:
    if v is None:
        return "no valid measurement"
    out = f"{v.status.upper()} ({v.change * 100:+.1f} %)"
    if v.status == "inconclusive" and v.blocks_needed:
        out += f"; about {v.blocks_needed} blocks would likely decide"
    return out


def claim_lines(cv: ClaimVerdict) -> list[str]:
    """One paste for the colleague: the verdict, the claimed and measured values, the baseline beside them."""
    lines = [headline(cv)]
    if cv.simulated:
        lines.append(SIM_BANNER)
    m = cv.measured
    over = f" over {m.launches} launch{'es' if m.launches != 1 else ''}" if m else ""
    ci = f" [{m.lo:.1f}, {m.hi:.1f}]" if m and m.lo is not None and m.hi is not None else " (no CI)"
    measured = "no valid runs" if m is None else f"{m.value:.1f} tok/s{ci}"
    if cv.claimed_tps is not None:
        line = f"{cv.arm}: claimed {cv.claimed_tps:.1f} tok/s, measured {measured}{over} -> "
        line += _verdict_tail(cv.tps)
    else:
        line = f"{cv.arm}: measured {measured}{over}"
    if cv.baseline is not None:
        bm = cv.baseline_measured
        line += f"; baseline measured {'-' if bm is None else f'{bm.value:.1f}'} tok/s beside it"
    lines.append(line)
    if cv.claimed_ratio is not None:
        r = cv.ratio
        shown = "-" if r is None else _est(r, 3).split(" x")[0]
        blocks = f" over {r.blocks} block{'s' if r.blocks != 1 else ''}" if r else ""
        lines.append(
            f"{cv.arm} vs {cv.baseline}: claimed ratio {cv.claimed_ratio:.3f}, measured {shown}{blocks} -> "
            + _verdict_tail(cv.ratio_verdict)
        )
    for v in (cv.tps, cv.ratio_verdict):
        if v is not None and v.status != "reproduced":
            lines.append(f"  {v.reason}")
    return lines


def claim_text(cv: ClaimVerdict) -> str:
    return "\n".join(visible(line) for line in claim_lines(cv))


def claim_json(cv: ClaimVerdict) -> dict[str, Any]:
    return {
        "status": cv.status,
        "reason": cv.reason,
        "exit_code": cv.exit_code,
        "tolerance": cv.tolerance,
        "simulated": cv.simulated,
        "arm": cv.arm,
        "claimed_tok_s": cv.claimed_tps,
        "measured_tok_s": estimate_json(cv.measured),
        "tok_s_verdict": _verdict_json(cv.tps),
        "baseline": cv.baseline,
        "baseline_tok_s": estimate_json(cv.baseline_measured),
        "claimed_ratio": cv.claimed_ratio,
        "measured_ratio": estimate_json(cv.ratio),
        "ratio_verdict": _verdict_json(cv.ratio_verdict),
    }
