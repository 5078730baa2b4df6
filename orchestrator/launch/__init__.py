"""A server for an arm on a host, and what is measured on it: `lifecycle` (the one lifecycle: prepared, started,
ready, read back, stopped in `finally`) runs the steps of `single` (one process tree), `group` (one arm over a
group's nodes) or `attach` (a server someone else runs), and yields their common `Server`; `benchmark` runs the
workload against it; `ports` and `fingerprint` serve all three.
"""

__all__ = ["attach", "benchmark", "fingerprint", "group", "lifecycle", "ports", "single"]
