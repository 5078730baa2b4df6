"""Results rendered, no measuring: one module per format behind `formats.FORMATS` (`text`, `jsondoc`, `csvrows`,
`markdown`, `html` with its `plots`, `jsonl`), what every format says in `lines` (and in `outputs`: the lossless
check and accept length per request), and comparisons or a claim's verdict in `compare`.
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
    "outputs",
    "plots",
    "text",
]
