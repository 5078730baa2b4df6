"""What an experiment is asked to do, as frozen objects built before anything runs: server profiles, prompt sets and
the workload, the A/B design, the typed `RunOptions` a command is called with, its plan and the limits it meets, and
what its verdicts are on (`slo`: the metric and the service-level objectives goodput counts against), and the
open-loop arrival schedule (`arrivals`: seeded, the same for every arm and launch), and what `--sweep auto` asks
for (`sweep`: the probe's workload and the rate levels'), and `datasets` (ShareGPT JSON, CSV and shipped datasets such
as HumanEval, with their origin, licence and sha256), and `traces` (a Mooncake JSONL trace replayed as one open-loop
level: its schedule, prompts sharing hash-id blocks, output lengths), and `sessions` (a dataset's conversations as
multi-turn sessions under --turns: the user's turns, the replies left to the server), and `coverage` (how much of a
dataset each launch sends: the whole dataset by default, or a seeded subset covering every category, in the plan's
words), and `secretpatterns` (secrets
in values found by what they look like, detect-secrets' patterns: what orch masks in what it prints, stores and
exports, on top of common/redaction's names).
"""

__all__ = [
    "arrivals",
    "coverage",
    "datasets",
    "design",
    "limits",
    "options",
    "plan",
    "profile",
    "prompts",
    "secretpatterns",
    "sessions",
    "slo",
    "sweep",
    "traces",
    "workload",
]
