"""A server's launch on a host, and what is measured on it: `single` (one process tree), `group` (one arm over a
group's nodes), `attach` (a server someone else runs), each `start`ed into a `Launch` that fingerprints and is
torn down in `finally`; `benchmark` runs the workload against it; `ports` and `fingerprint` serve all three.
"""

__all__ = ["attach", "benchmark", "fingerprint", "group", "ports", "single"]
