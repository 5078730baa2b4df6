"""Results as data: `run` (one benchmark run), `model` (launches → arms → the A/B result), by concern beside it:
`comparison` (one arm against the baseline at a level: ratio, CI, verdict), `pairing` (launches block by block, runs
paired run by run), `capacity` (the A/B on the highest load within the SLO), `energy` (joules per token), `warnings`
(what a result warns of beside its numbers), `autostop` (`--blocks auto`'s stopping rule and its notes); `store` and
`schema` (the versioned SQLite file, written as each run ends), `load` (a stored experiment read back as the model),
`bundle`, `bundleformat` and `bundlefields` (one self-contained file per experiment, every field checked on read),
`signing` and `sshsig` (a bundle signed with an SSH key, and checked against the signers the receiver trusts),
`compare` (two experiments, or a claim, side by side), `goodput` (a run's value of any metric a comparison may be on,
goodput under an SLO from its per-request rows), `curves` (each arm's numbers over the levels with CIs over launches,
and the Pareto front: what the load plots draw), `outputs` (the lossless check: each arm's generated outputs against
the baseline's, prompt by prompt; accept length per request as a distribution); `categories` (each arm's tok/s and
each comparison's paired ratio per prompt category); `byprompt` (the same per prompt, for a set of at most 20, and
the prompts whose ratio goes against the verdict); `cache` (prefix-cache attestation: each arm's cached share of
prompt tokens, and the warning when arms differ); `turns` (multi-turn sessions' TTFT, tok/s and prefix-cache share by
turn); `datasource` (what an experiment's requests were drawn from, by name and sha256: a change of it is an
environment step).
"""

__all__ = [
    "autostop",
    "bundle",
    "bundlefields",
    "bundleformat",
    "byprompt",
    "cache",
    "capacity",
    "categories",
    "compare",
    "comparison",
    "curves",
    "datasource",
    "energy",
    "goodput",
    "load",
    "model",
    "outputs",
    "pairing",
    "run",
    "schema",
    "signing",
    "sshsig",
    "store",
    "turns",
    "warnings",
]
