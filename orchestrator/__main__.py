"""`python -m orchestrator` runs the orch CLI."""

from orchestrator.cli import entry

entry()
