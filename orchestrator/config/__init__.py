"""What an experiment is asked to do, as frozen objects built before anything runs: server profiles, prompt sets and
the workload, the A/B design, the typed `RunOptions` a command is called with, its plan and the limits it meets, and
what its verdicts are on (`slo`: the metric and the service-level objectives goodput counts against).
"""

__all__ = ["design", "limits", "options", "plan", "profile", "prompts", "slo", "workload"]
