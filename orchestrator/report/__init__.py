"""Results rendered, no measuring: one module per format behind `formats.FORMATS` (`text`, `jsondoc`, `csvrows`,
`markdown`, `html` with its `plots`, `jsonl`), the sections every format renders from one model (`sections`), what
every format says in `lines` (and in `outputs`: the lossless check and accept length per request), comparisons or a
claim's verdict in `compare`, and the nightly history page (`nightly_page` its model as plain data, `nightly_html`
its rendering).
"""

__all__ = [
    "compare",
    "csvrows",
    "formats",
    "html",
    "jsondoc",
    "jsonl",
    "lines",
    "markdown",
    "nightly_html",
    "nightly_page",
    "outputs",
    "plots",
    "sections",
    "text",
]
