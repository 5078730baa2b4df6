"""`orch status`'s view of a host: one summary per launch from the host's per-process answer."""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from orchestrator.common.printable import visible

# What the launch's owner (the orch session that started it) tells about whose it is now.
STATES = {
    "alive": "in use by a running orch session",
    "me": "in use by this orch",
    "dead": "left behind: its orch session is gone (`orch down` stops it)",
    "unknown": "owner unknown (`orch down --force` stops it)",
}


# A launch the results store does not know and whose processes do not name their profile (an older orch's launch
# recorded in another store): its profile is unknown here.
ANOTHER_STORE = "(another results store)"


def summarize(
    procs: list[dict[str, Any]], profiles: dict[str, str] | None, now: float | None = None
) -> list[dict[str, Any]]:
    """One dict per launch (oldest first): profile, launch id, leader PID, ports, age, state, process count.
    The profile is the results store's record, else what the launch's processes carry (ORCH_PROFILE), else
    ANOTHER_STORE when the store was read (`profiles` is None when it could not be: then unknown, None)."""
    now = time.time() if now is None else now
    by_launch: dict[str, list[dict[str, Any]]] = {}
    for p in procs:
        by_launch.setdefault(str(p["launch_id"]), []).append(p)
    out = []
    for lid in sorted(by_launch, key=lambda x: (launch_started(x) or 0.0, x)):
        group = sorted(by_launch[lid], key=lambda p: p["pid"])
        # The launched command is the leader of its own process group; workers share that group.
        leader = next((p for p in group if p["pid"] == p.get("pgid")), group[0])
        started = launch_started(lid)
        owner_state = str(leader.get("owner_state") or "unknown")
        ports = sorted({port for p in group for port in p.get("ports") or []})
        out.append(
            {
                "launch_id": lid,
                "profile": (profiles or {}).get(lid)
                or next((str(p["profile"]) for p in group if p.get("profile")), None)
                or (None if profiles is None else ANOTHER_STORE),
                "pid": leader["pid"],
                "ports": ports,
                "started_at": started,
                "age_s": None if started is None else max(0.0, now - started),
                # No listening port yet: the server is still loading (or will never listen).
                "serving": bool(ports),
                "owner_state": owner_state,
                "processes": len(group),
            }
        )
    return out


def launch_started(launch_id: str) -> float | None:
    """When orch started the launch, from the stamp in its id (`<namespace>:<YYYYmmddTHHMMSS>-<hex>`, taken on the
    machine orch runs on, so the age needs no agreement between this clock and the host's)."""
    stamp = launch_id.rpartition(":")[2].partition("-")[0]
    try:
        return time.mktime(time.strptime(stamp, "%Y%m%dT%H%M%S"))
    except (ValueError, OverflowError):
        return None


def age_text(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def state_text(launch: dict[str, Any]) -> str:
    phase = "serving" if launch["serving"] else "not listening yet"
    return f"{phase}, {STATES.get(launch['owner_state'], launch['owner_state'])}"


def stored_profiles(db: Path, launch_ids: Iterable[str]) -> dict[str, str] | None:
    """Profile names of these launches as the results database recorded them; None when it cannot say (an older
    schema, a lock): status must answer whatever state the database is in. No file yet: it records none of them."""
    ids = sorted(set(launch_ids))
    if not ids or not db.is_file():
        return {}
    with contextlib.suppress(sqlite3.Error):
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1.0)
        try:
            marks = ",".join("?" * len(ids))
            rows = conn.execute(f"SELECT launch_id, profile FROM launches WHERE launch_id IN ({marks})", ids)
            return {str(lid): str(profile) for lid, profile in rows}
        finally:
            conn.close()
    return None


def table(launches: list[dict[str, Any]]) -> list[str]:
    """The launches as aligned text lines under a header."""
    rows = [["profile", "launch", "PID", "port", "age", "state"]]
    for item in launches:
        rows.append(
            [
                item["profile"] or "?",
                item["launch_id"],
                str(item["pid"]),
                ",".join(map(str, item["ports"])) or "-",
                age_text(item["age_s"]),
                state_text(item),
            ]
        )
    # A profile name read from a host's process (ORCH_PROFILE) or a store: a newline in it stays in its row.
    rows = [[visible(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return ["  ".join([*(c.ljust(w) for c, w in zip(r, widths, strict=False)), r[-1]]).rstrip() for r in rows]
