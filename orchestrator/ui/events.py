"""The one channel from the core to whoever shows progress: lines a person reads, phases the live view follows."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from orchestrator.config.secretpatterns import scrub


class Events(Protocol):
    """What the launch lifecycle, an arm and the A/B loop report through (the CLI's reporter is one)."""

    def line(self, text: str) -> None:
        """A progress line, shown as it is (plain output adds the time of day)."""

    def phase(self, name: str, **info: Any) -> None:
        """Phase `name` began or moved on: what the live view shows, and what its ETA is timed by."""

    @property
    def watched(self) -> bool:
        """Whether phases reach a view: work done only for it (reading a loading server's log) is skipped if not."""


def _ignore(_: str) -> None:
    pass


@dataclass(frozen=True)
class Lines:
    """Events for a caller that takes only the lines (nightly, `orch hosts`, a bare run_ab); its phases go to
    `phases` when given (watched then), else nowhere."""

    show: Callable[[str], None] = _ignore
    phases: Callable[..., None] | None = None  # called as phase(name, **info)

    def line(self, text: str) -> None:
        self.show(text)

    def phase(self, name: str, **info: Any) -> None:
        if self.phases is not None:
            with contextlib.suppress(Exception):  # showing progress must never break a measurement
                self.phases(name, **info)

    @property
    def watched(self) -> bool:
        return self.phases is not None


QUIET = Lines()


@dataclass(frozen=True)
class Scrubbed:
    """Events that print no secret value: a line can carry a server's log tail, which has its args in clear."""

    inner: Events
    secrets: Sequence[str]

    def line(self, text: str) -> None:
        self.inner.line(scrub(text, self.secrets))

    def phase(self, name: str, **info: Any) -> None:
        self.inner.phase(name, **info)

    @property
    def watched(self) -> bool:
        return self.inner.watched
