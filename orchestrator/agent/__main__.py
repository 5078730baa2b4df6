"""Starts orch's host-side agent (`python -m orchestrator.agent --serve`; on a host, the shipped orch_agent.py)."""

from orchestrator.agent.ops import main

main()
