"""The host-side agent: everything orch does *on* a host, shipped there as source and run with the host's Python.

`ops` answers one JSON request per line (launch, find, inspect, wait, tear down, benchmark); the local host calls
`ops.dispatch` in-process, SSH and Slurm hosts run `orch_agent.py --serve` (this package's `__main__`). It, and every
package it imports (hosts.agentlink.SHIPPED_PACKAGES: agent, client, common, sim), use only the stdlib and psutil.
"""

__all__ = ["cpu", "facts", "lock", "ops", "power", "processes", "teardown", "waits"]
