"""Results rendered, no measuring: `experiment` (text, JSON, CSV, Markdown of one experiment), `compare` (two
experiments, or a claim), `html` with `plots` (one self-contained file), `jsonl` (per-request records).
"""

__all__ = ["compare", "experiment", "html", "jsonl", "plots"]
