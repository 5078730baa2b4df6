"""The `orch` command group, and what every command module shares (exit codes, the finite-float option type)."""

from __future__ import annotations

import math
from typing import Any

import click

from orchestrator import __version__

EXIT_INTERRUPTED = 130
MAX_TPS = 1e7  # tok/s options: far above any server, low enough that the arithmetic cannot overflow
EXIT_USAGE = 2  # click's code for usage errors; invalid input files (InputError) get it too


class FiniteFloat(click.FloatRange):
    """A float option within a range that also refuses nan and inf (every comparison with nan is false, so a
    plain FloatRange lets `--ready-timeout nan` through, and then readiness waits forever)."""

    name = "finite float"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        rv = super().convert(value, param, ctx)
        if not math.isfinite(rv):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return rv


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 120})
@click.version_option(__version__, prog_name="orch")
def cli() -> None:
    """orch: honest A/B benchmarks of LLM inference servers.

    Every arm starts from a fresh, verified server launch; the environment each worker process
    really got is read back; every run is stored the moment it finishes.
    """
