"""Results as data: `run` (one benchmark run), `model` (launches → arms → the A/B result), `store` and `schema` (the
versioned SQLite file, written as each run ends), `load` (a stored experiment read back as the model), `bundle` and
`bundleformat` (one self-contained file per experiment), `compare` (two experiments, or a claim, side by side).
"""

__all__ = ["bundle", "bundleformat", "compare", "load", "model", "run", "schema", "store"]
