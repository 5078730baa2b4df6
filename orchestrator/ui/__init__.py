"""What a person sees while an experiment runs: `progress` (the phase hooks the core calls, shown as timestamped plain
lines) and `live` (the same on a terminal, with rich).
"""

__all__ = ["live", "progress"]
