"""`python -m orchestrator` runs the orch CLI."""

import sys

from orchestrator.cli import main

sys.exit(main())
