"""What a person sees while an experiment runs: `events` (the one channel the core reports through: lines and
phases), `progress` (shown as timestamped plain lines) and `live` (the same on a terminal, with rich).
"""

__all__ = ["events", "live", "progress"]
