"""Entry point: `python -m orchestrator.sim <sglang.launch_server flags>` (spawned workers never run this)."""

import sys

if __name__ == "__main__":
    from orchestrator.sim.server import main

    sys.exit(main())
