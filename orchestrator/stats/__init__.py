"""Statistics as pure functions (no I/O, no clocks): `estimates` (ratios and their CIs, verdicts, spreads, the
speculative break-even), `sequential` (`--blocks auto`'s group-sequential boundaries), `reproduction` (does a
result agree with a claim or an earlier run), `crossover` (the load where an arm stops paying, with its CI),
`family` (Holm's step-down over a family of verdicts printed together), `fisher` (Fisher's exact test on a 2×2
table of counts).
"""

__all__ = ["crossover", "estimates", "family", "fisher", "reproduction", "sequential"]
