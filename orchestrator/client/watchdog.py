"""The watchdog a run polls while it is in flight: a check of the launch (in a thread) that may abort the run."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import threading
from collections.abc import Callable


def in_thread(fn: Callable[[], str | None]) -> asyncio.Future[str | None]:
    """fn() in a daemon thread: a slow check never stalls the event loop, and a hung one never blocks exit."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[str | None] = loop.create_future()

    def work() -> None:
        try:
            result, error = fn(), None
        except Exception as e:
            result, error = None, e

        def settle() -> None:
            if fut.done():
                return
            if error is not None:
                fut.set_exception(error)
            else:
                fut.set_result(result)

        with contextlib.suppress(RuntimeError):  # the run ended and its loop is closed: nobody waits any more
            loop.call_soon_threadsafe(settle)

    threading.Thread(target=work, name="orch-client-watchdog", daemon=True).start()
    return fut


async def watch(check: Callable[[], str | None], every_s: float, abort: Callable[[str], None]) -> None:
    """Call check() every every_s (in a thread); the first reason it gives aborts the run. A check that fails for
    want of a descriptor (EMFILE, ENFILE) is skipped, not taken for the launch's failure."""
    while True:
        await asyncio.sleep(every_s)
        try:
            reason = await in_thread(check)
        except OSError as e:
            if e.errno in (errno.EMFILE, errno.ENFILE):
                # Out of descriptors here (this process, or the machine): that says nothing of the launch, and the
                # next check, once requests have ended, may read it again.
                continue
            reason = f"the watchdog check failed: {type(e).__name__}: {e}"
        except Exception as e:
            reason = f"the watchdog check failed: {type(e).__name__}: {e}"
        if reason:
            abort(str(reason))
            return
