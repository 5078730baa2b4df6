"""The nightly regression suite: `suite` (the YAML file), `night` (run its items, store each at once), `fanout` and
`child` (Slurm items in parallel), `history` and `changepoint` (each series over nights, per environment), `result`
(tonight's verdicts and exit code), `report` (the night in Markdown and text) and `page` (the history page's
model, from the store, for report/nightly_html).
"""

__all__ = ["changepoint", "child", "fanout", "history", "night", "page", "report", "result", "suite"]
