"""What orch must know about a kind of inference server: its command line, readiness, env rewrites, versions."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from orchestrator.profile import Profile


class Engine(ABC):
    """One engine adapter. Nothing outside the adapter branches on an engine's name: the run loop, the benchmark
    and the reports ask the adapter."""

    name: str
    # The endpoint whose 200 means "ready to serve" (not merely "the port is open").
    health_path: str
    # Variables the engine rewrites in its workers, so a profile value for them is not what the workers get: the
    # env read-back explains such a mismatch instead of calling it a failure of the profile.
    env_overrides: Mapping[str, str]
    # Packages whose versions decide the server's speed, as the server's interpreter imports them (fingerprint).
    packages: tuple[str, ...]
    # The package whose version is the engine's version (None: only the server itself can say).
    version_package: str | None

    @abstractmethod
    def server_flags(self, profile: Profile) -> list[str]:
        """The server's flags for a profile, as an argv list (never a shell string)."""

    @abstractmethod
    def launch_argv(self, profile: Profile, python: str, *, simulate: bool) -> list[str]:
        """The whole command line: the engine itself, or orch's simulator of it (same flags)."""
