"""Running an experiment: `run.run(options)` is the core of `orch ab`, `orch bench` and `orch reproduce`; `ab` the
A/B loop over blocks and arms, `arm` one launch of an arm, `host` the host's facts and locks, `resume` the resume
policy, `reproduce` a bundle re-run and judged, `failon` the exit code under --fail-on.
"""

__all__ = ["ab", "arm", "failon", "host", "reproduce", "resume", "run"]
