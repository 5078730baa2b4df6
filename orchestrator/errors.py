"""The error hierarchy: every failure a user can cause or meet is an OrchError with a readable message."""

from __future__ import annotations


class OrchError(Exception):
    """Base class; the CLI prints `Error: <message>` and exits non-zero."""


class ProfileError(OrchError):
    """A profile (or profile file) is missing, malformed or invalid."""


class HostError(OrchError):
    """Something about the host: a foreign port owner, a failed host-side call, an unreachable host."""


class ServerError(OrchError):
    """The inference server failed to launch, become ready, or stay alive."""


class BenchError(OrchError):
    """A benchmark request failed or returned something that cannot be measured."""


class StoreError(OrchError):
    """The results database cannot be opened, migrated or written."""
