"""A fan-out child: one item of the parent's night (nightly/fanout.py starts it as `python -m
orchestrator.nightly.child SPEC`), run the way the night runs it, into the same store; its report to a file."""

# Its own module so that the night (nightly.py) imports the fan-out and the child imports the night, never both ways.

from __future__ import annotations

import json
import os
import pickle
import signal
import sys
import threading
import time
from typing import Any

from orchestrator.common import stopsignals
from orchestrator.errors import OrchError
from orchestrator.nightly import night
from orchestrator.nightly import suite as suite_mod
from orchestrator.nightly.result import ItemReport
from orchestrator.results.store import Store
from orchestrator.ui.events import Lines


def _watch_parent(parent: int) -> None:
    # A parent killed outright (SIGKILL) cannot forward Ctrl-C: stop the item rather than run on unattended.
    while os.getppid() == parent:
        time.sleep(1.0)
    os.kill(os.getpid(), signal.SIGINT)


def main(spec: dict[str, Any]) -> int:
    """One item of the parent's night, the way the night runs it, into the same store; its report to a file."""
    # A night started with SIGINT ignored (`orch nightly &` in a script, some cron wrappers) passes that on to us, and
    # Python then installs no KeyboardInterrupt handler: the parent's forwarded Ctrl-C, our own item timer and
    # _watch_parent would all go unheard, and the parent would SIGKILL us with the allocation still held. We run in
    # our own session, so no terminal's Ctrl-C or hangup reaches us: only the parent's signals and our own. Our
    # output is the parent's pipe: should the parent be gone, printing must not cut short our teardown.
    stopsignals.install(sigint=True)
    stopsignals.forgiving_output()
    threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True).start()
    deadline = time.monotonic() + float(spec["remaining_s"])
    suite = suite_mod.load(spec["suite"])
    if suite.sha256 != spec["sha256"]:
        print(f"{spec['suite']} changed after the night started; this item did not run", flush=True)
        return 1
    item = next(i for i in suite.items if i.name == spec["item"])
    store = Store(spec["db"])
    runner = night.NightRunner(
        suite=suite,
        store=store,
        night_at=float(spec["night_at"]),
        events=Lines(lambda msg: print(msg, flush=True)),
        night_id=spec["night_id"],
    )
    code = 0
    report: ItemReport | None = None
    try:
        report = runner._item(item, deadline)
    except KeyboardInterrupt:
        report, code = runner._cut, 130
    finally:
        store.close()
        if report is not None:
            tmp = spec["out"] + ".tmp"
            with open(tmp, "wb") as f:
                pickle.dump(report, f)
            os.replace(tmp, spec["out"])
    return code


if __name__ == "__main__":
    try:
        sys.exit(main(json.loads(sys.argv[1])))
    except OrchError as e:
        print(str(e), flush=True)
        sys.exit(1)
