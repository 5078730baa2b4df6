"""The what-if in words: warnings, the recommendation, the text table, the profile to create and the JSON document."""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from orchestrator.common.acceptance import alpha_for_accept_length
from orchestrator.whatif.arms import SpecArm, describe_family, mean_point
from orchestrator.whatif.fit import t_band, t_factor

if TYPE_CHECKING:  # the what-if is handed in: whatif calls this module, never the other way round
    from orchestrator.whatif.predict import Fit, WhatIf

UNCERTAINTY = "Student's t (95%) over per-block refits: each block's launches fitted on their own"
# Settings arms of one drafter may differ in without changing what is modelled (a port, a name, a label).
SAME_FAMILY_IGNORED = {
    "name",
    "source",
    "description",
    "extends_chain",
    "port",
    "host",
    "served_model_name",
    "ready_timeout_s",
    "speculative",
    "expect",
    "attach",
}


def warnings_for(w: WhatIf, per_block: Sequence[Fit]) -> list[str]:
    """What could make the prediction wrong, measured on this experiment."""
    out = []
    n = len(w.blocks)
    if n < 2:
        out.append("one block: restart-to-restart noise is not estimated, so no uncertainty band; use --blocks 3")
    elif n == 2:
        out.append(
            "two blocks: Student's t with 1 degree of freedom (12.7) makes the bands wide; 3+ blocks narrow them"
        )
    cost = w.fit.cost
    if cost.per_step_ms <= 0:
        out.append(
            f"the fitted cycle time does not grow with the draft steps ({cost.per_step_ms:+.2f} ms per step): the "
            "measurements are too noisy for the cost model; more tokens per run or more blocks"
        )
    configs = {(a.steps, a.verified) for a in w.arms}
    if len(configs) > 2:
        res = [(mean_point([a.per_block[b] for b in w.blocks]), a) for a in w.arms]
        rel = [abs(p.cycle_ms - cost.cycle_ms(p.steps)) / p.cycle_ms for p, _ in res]
        if max(rel) > 0.03:
            out.append(
                f"the cycle time is not linear in the draft steps: the fit misses a measured arm by "
                f"{max(rel) * 100:.1f}% (verify cost may grow faster than linearly with the verified tokens)"
            )
    out += _alpha_drift(w)
    lo, hi = min(w.measured_steps), max(w.measured_steps)
    far = [r.steps for r in w.rows if r.steps > hi + 2 or r.steps < lo - 2]
    if far:
        out.append(
            f"{_counts(far)} step(s) lie more than 2 from the measured {_counts(w.measured_steps)}: the linear cost "
            f"and the {'chain' if w.fit.accept.kind == 'chain' else 'extrapolated per-position'} acceptance are "
            "extrapolated that far; check the recommendation by running it"
        )
    differ = sorted(
        {
            k
            for a in w.arms
            for b in w.arms
            for k in set(a.profile) | set(b.profile)
            if k not in SAME_FAMILY_IGNORED and a.profile.get(k) != b.profile.get(k)
        }
    )
    if differ:
        out.append(
            f"the arms fitted also differ in {', '.join(differ)}: the model puts every difference in "
            "their speed down to the step count"
        )
    if w.baseline is None:
        out.append("no arm without speculation on the same model and TP size: no comparison with not speculating")
    return out


def _alpha_drift(w: WhatIf) -> list[str]:
    """A constant-α chain assumes each draft is accepted alike whatever the step count: compare the α of the
    shortest and the longest step count, block by block."""
    if w.fit.accept.kind != "chain":
        return []
    short = [a for a in w.arms if a.steps == min(w.measured_steps)]
    long = [a for a in w.arms if a.steps == max(w.measured_steps)]

    def alpha(arms: list[SpecArm], b: int) -> float | None:
        p = mean_point([a.per_block[b] for a in arms])
        return alpha_for_accept_length(p.accept_length, p.depth)

    diffs = []
    for b in w.blocks:
        s, lg = alpha(short, b), alpha(long, b)
        if s is None or lg is None:
            return []
        diffs.append(lg - s)
    mean = statistics.fmean(diffs)
    band = t_band(mean, diffs)
    if band is None or band[0] <= 0 <= band[1] or abs(mean) < 0.02:
        return []
    return [
        f"the per-draft acceptance differs between step counts (α {w.alpha_by_arm[short[0].arm.label]:.3f} at "
        f"{short[0].steps} steps, {w.alpha_by_arm[long[0].arm.label]:.3f} at {long[0].steps}; difference 95% CI "
        f"[{band[0]:+.3f}, {band[1]:+.3f}]): a constant-α chain does not describe this drafter, so predictions away "
        "from the measured step counts may be off"
    ]


def _counts(steps: Sequence[int]) -> str:
    return ", ".join(str(s) for s in steps)


def _span(steps: Sequence[int]) -> str:
    contiguous = steps == list(range(steps[0], steps[-1] + 1))
    return f"{steps[0]}-{steps[-1]}" if contiguous and len(steps) > 2 else _counts(steps)


def _band(b: tuple[float, float] | None, fmt: str = ".1f") -> str:
    return f"[{format(b[0], fmt)}, {format(b[1], fmt)}]" if b else "[no band]"


def recommendation(w: WhatIf) -> str:
    """One line for the A/B report."""
    b = w.best
    what = "measured" if b.source == "measured" else "predicted"
    line = (
        f"what-if ({w.family[3]} drafter, measured at {_counts(w.measured_steps)} steps): best of "
        f"{_span([r.steps for r in w.rows])} steps is {b.steps}, {what} {b.tok_s or 0:.1f} tok/s " + _band(b.tok_s_ci95)
    )
    if b.vs_baseline is not None and w.baseline is not None:
        line += f" ({b.vs_baseline:.2f}x {w.baseline[0]})"
        if b.vs_baseline_ci95 and b.vs_baseline_ci95[1] < 1.0:
            line += "; not speculating is faster"
    return line + f"; orch whatif {w.experiment_id} for the table and the profile to create"


def profile_to_create(w: WhatIf) -> dict[str, Any] | None:
    """The profile that runs the best step count, when it was only predicted: its name and YAML text."""
    k = w.best.steps
    if w.best.source == "measured":
        return None
    src = min(w.arms, key=lambda a: (abs(a.steps - k), -a.steps))
    name = src.arm.profile
    new = re.sub(r"\d+(?=-?steps?\b)", str(k), name) if re.search(r"\d+-?steps?\b", name) else f"{name}-{k}step"
    spec = ["speculative:", f"  num_steps: {k}"]
    if (src.profile.get("speculative") or {}).get("num_draft_tokens"):
        spec.append(f"  num_draft_tokens: {k + src.verified - src.steps}")
    text = "\n".join([f"extends: {name}", *spec]) + "\n"
    base = w.baseline[0] if w.baseline else None
    check = f"orch ab {base + ' ' if base else ''}{new}" + (" --sim" if w.simulated else "") + " --blocks 3"
    return {"name": new, "path": f"profiles/{new}.yaml", "yaml": text, "check": check}


def text_lines(w: WhatIf) -> list[str]:
    out = [f"what-if for experiment {w.experiment_id} at concurrency {w.concurrency}: {describe_family(w.family)}"]
    if w.simulated:
        out.append("SIMULATED: measured on orch's simulator, not on a real server.")
    fitted = ", ".join(f"{a.arm.label} ({a.steps} steps)" for a in w.arms)
    out.append(f"  fitted from {fitted} over {len(w.blocks)} block(s)")
    if w.baseline:
        out.append(f"  baseline {w.baseline[0]}: {w.baseline[1]:.1f} tok/s {_band(w.baseline[2])}")
    c = w.fit.cost
    if c.per_token_ms is None:
        out.append(
            f"  cost model: cycle = {c.verify_ms:.2f} ms + {c.per_step_ms:.3f} ms x steps (a draft step and "
            f"the verified token it adds; {c.offset} + steps tokens verified)"
        )
    else:
        out.append(
            f"  cost model: cycle = {c.verify_ms:.2f} ms + {c.per_step_ms:.3f} ms x steps + "
            f"{c.per_token_ms:.3f} ms x verified tokens (predicted with steps + 1 verified)"
        )
    a = w.fit.accept
    per_arm = ", ".join(f"{k} {v:.3f}" if v is not None else f"{k} -" for k, v in w.alpha_by_arm.items())
    if a.kind == "chain":
        out.append(
            f"  acceptance: constant-α chain fitted to the accept lengths, α = {a.alpha:.3f} "
            f"{_band(w.alpha_ci95, '.3f')} (per arm: {per_arm})"
        )
    else:
        probs = ", ".join(f"{p:.3f}" for p in a.per_position)
        out.append(f"  acceptance: per-position counters, P(draft i accepted) = {probs}; beyond: x {a.alpha:.3f} each")
    t = t_factor(len(w.blocks))
    out.append(f"  uncertainty: {UNCERTAINTY}" + (f" ({len(w.blocks)} blocks, t = {t:.2f})" if t else " (no band)"))
    head = ["steps", "source", "accept", "cycle ms", "tok/s", "95% band", "model tok/s", "vs base", "break-even"]
    table = [head]
    for r in w.rows:
        table.append(
            [
                str(r.steps),
                r.source,
                f"{r.accept_length:.2f}",
                f"{r.cycle_ms:.2f}",
                "-" if r.tok_s is None else f"{r.tok_s:.1f}",
                _band(r.tok_s_ci95),
                "-" if r.fit_tok_s is None else f"{r.fit_tok_s:.1f}",
                "-" if r.vs_baseline is None else f"{r.vs_baseline:.3f}",
                "-" if r.breakeven_accept_length is None else f"{r.breakeven_accept_length:.2f}",
            ]
        )
    out += _table(table)
    b = w.best
    line = f"  best: {b.steps} steps, {b.source} {b.tok_s or 0:.1f} tok/s {_band(b.tok_s_ci95)}"
    if w.indistinguishable:
        line += f"; within the uncertainty also: {_counts(w.indistinguishable)}"
    out.append(line)
    if b.vs_baseline_ci95 and b.vs_baseline_ci95[1] < 1.0 and w.baseline:
        out.append(f"  not speculating ({w.baseline[0]}) is faster than any step count here")
    create = profile_to_create(w)
    if create:
        out.append(f"  to check the prediction, create {create['path']}:")
        out += ["      " + ln for ln in create["yaml"].splitlines()]
        out.append(f"    and run: {create['check']}")
    if w.target_tps:
        out.append(f"  for {w.target_tps:g} tok/s (constant-α chain at the fitted cycle times):")
        rows = [["steps", "cycle ms", "accept needed", "α needed", "α range (cycle band)"]]
        for tr in w.target:
            rng = tr.alpha_needed_range
            rows.append(
                [
                    str(tr.steps),
                    f"{tr.cycle_ms:.2f}",
                    f"{tr.accept_length_needed:.2f}",
                    _alpha(tr.alpha_needed),
                    f"{_alpha(rng[0])} - {_alpha(rng[1])}" if rng else "-",
                ]
            )
        out += _table(rows)
    out += [f"  WARNING: {x}" for x in w.warnings]
    return out


def _alpha(a: float | None) -> str:
    return "not reachable" if a is None else f"{a:.3f}"


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(c.ljust(wd) for c, wd in zip(r, widths, strict=True)).rstrip() for r in rows]


def to_dict(w: WhatIf) -> dict[str, Any]:
    """The `orch whatif --json` document (docs/speculative.md describes every field)."""
    c, a = w.fit.cost, w.fit.accept
    engine, model, tp, algorithm, draft, topk = w.family
    return {
        "status": "ok",
        "experiment_id": w.experiment_id,
        "simulated": w.simulated,
        "concurrency": w.concurrency,
        "family": {
            "engine": engine,
            "model_path": model,
            "tp_size": tp,
            "algorithm": algorithm,
            "draft_model_path": draft,
            "eagle_topk": topk,
        },
        "arms": [
            {
                "label": s.arm.label,
                "profile": s.arm.profile,
                "steps": s.steps,
                "verified_tokens": s.verified,
                "blocks": sorted(s.per_block),
                "alpha": w.alpha_by_arm.get(s.arm.label),
            }
            for s in w.arms
        ],
        "blocks": list(w.blocks),
        "baseline": None
        if w.baseline is None
        else {"label": w.baseline[0], "tok_s": w.baseline[1], "tok_s_ci95": _list(w.baseline[2])},
        "cost_model": {
            "kind": c.kind,
            "verify_ms": c.verify_ms,
            "per_step_ms": c.per_step_ms,
            "per_token_ms": c.per_token_ms,
            "verified_tokens": f"steps + {c.offset}",
        },
        "acceptance_model": {
            "kind": a.kind,
            "alpha": a.alpha,
            "alpha_ci95": _list(w.alpha_ci95),
            "per_position": list(a.per_position) if a.kind == "per-position" else None,
        },
        "uncertainty": {"method": UNCERTAINTY, "level": 0.95, "blocks": len(w.blocks), "t": t_factor(len(w.blocks))},
        "predictions": [r.to_dict() for r in w.rows],
        "best": {
            "steps": w.best.steps,
            "source": w.best.source,
            "tok_s": w.best.tok_s,
            "tok_s_ci95": _list(w.best.tok_s_ci95),
            "vs_baseline": w.best.vs_baseline,
            "indistinguishable": list(w.indistinguishable),
        },
        "recommendation": recommendation(w),
        "profile_to_create": profile_to_create(w),
        "target": None if not w.target_tps else {"tok_s": w.target_tps, "per_steps": [t.to_dict() for t in w.target]},
        "warnings": list(w.warnings),
    }


def _list(b: tuple[float, float] | None) -> list[float] | None:
    return [b[0], b[1]] if b and all(math.isfinite(x) for x in b) else None
