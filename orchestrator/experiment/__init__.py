"""Running an experiment: `run.run(options)` is the core of `orch ab` and `orch bench`; `ab` the A/B loop over
blocks and arms (under the host lock, `hosts.lock`), `arm` one launch of an arm, `host` the host's facts and the
nodes an experiment needs, `resume` the resume policy, `reproduce` the core of `orch reproduce` (a bundle or a
profile's claim planned, re-run and judged), `trust` (what a bundle would make this machine run that its own
profiles would not, and what decides that it may), `failon` the exit code under --fail-on, `sweep` --sweep auto's probe
(each arm's synchronous and saturated rates, and the rates between).
"""

__all__ = ["ab", "arm", "failon", "host", "reproduce", "resume", "run", "sweep", "trust"]
