"""`--blocks auto`'s stopping rule after each block (`auto_look`) and what the report says of it (`auto_notes`)."""

from __future__ import annotations

from orchestrator.results.comparison import why_undecided
from orchestrator.results.model import ABResult, has_valid_run
from orchestrator.results.run import level_name


def auto_look(result: ABResult) -> tuple[bool, str]:
    """The stopping rule of `--blocks auto`, after every scheduled block ran: stop once every comparison is decided
    (faster, slower or no difference by its repeated CI), at the maximum, or when an arm has no valid run at all
    (more blocks would not give it one); the line says which."""
    plan = result.design.auto
    if plan is None:
        return True, "fixed design"
    blocks = result.design.blocks
    empty = [arm.label for i, arm in enumerate(result.arms) if not has_valid_run(result.launches, i)]
    if empty:
        return True, f"look after block {blocks}: no valid run in {', '.join(empty)}; stopping"
    # A verdict held back by a prefix-cache gap (results/cache) is not noise: more blocks would not decide it.
    open_ = [c for c in result.undecided() if not (c.held_back and c.ci_verdict not in (None, "inconclusive"))]
    if not open_:
        held = sum(1 for c in result.undecided() if c.held_back)
        if held:
            return True, (
                f"look after block {blocks}: every comparison is decided by its CI, {held} held back by a "
                "prefix-cache gap that more blocks would not close; stopping (--blocks auto)"
            )
        return True, f"look after block {blocks}: every comparison is decided; stopping (--blocks auto)"
    if blocks >= plan.max_blocks:
        return True, f"look after block {blocks}: {len(open_)} comparison(s) undecided at the maximum; stopping"
    names = ", ".join(f"{c.arm_label or c.arm} @ {level_name(c.concurrency)}" for c in open_)
    return (
        False,
        f"look after block {blocks}: undecided: {names}; adding block {blocks + 1} of at most {plan.max_blocks}",
    )


def auto_notes(result: ABResult) -> list[str]:
    """What `--blocks auto` did and why it stopped, for the report (nothing for a fixed design)."""
    plan = result.design.auto
    if plan is None:
        return []
    out = [
        f"--blocks auto ({plan.min_blocks} to {plan.max_blocks} blocks): the CIs are {plan.describe()}, valid at "
        "whichever block the experiment stopped (a plain 95% CI after looking at every block would be too narrow)"
    ]
    if result.status != "complete":
        return out
    open_ = result.undecided()
    if not open_:
        out.append(f"--blocks auto stopped after {result.design.blocks} blocks: every comparison is decided")
    else:
        out.append(
            f"--blocks auto stopped after {result.design.blocks} blocks with {len(open_)} comparison(s) "
            "inconclusive: " + "; ".join(why_undecided(c) for c in open_)
        )
    return out


def with_auto_notes(result: ABResult) -> ABResult:
    notes = auto_notes(result)
    return result.with_notes(*notes) if notes else result
