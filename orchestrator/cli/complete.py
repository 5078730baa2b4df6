"""Shell completion of profile names and stored experiment ids (click's `shell_complete=` callbacks)."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    # Imported when a completion runs: `orch show ID` loads this module but completes nothing.
    from click.shell_completion import CompletionItem

# A completion runs at every Tab press: keep the answer short and the database read small.
MAX_IDS = 200


def profile_names(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """Profile names visible from the current directory that start with what was typed. A completion must never
    print a traceback into the user's prompt, so any failure completes nothing."""
    from click.shell_completion import CompletionItem

    try:
        from orchestrator.config import profile

        names = sorted(profile.available())
    except Exception:
        return []
    return [CompletionItem(name) for name in names if name.startswith(incomplete)]


def experiment_ids(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """`last` and the stored experiment ids (newest first, with their arms as help) from --db or the default
    database; a path-like word completes as a file (a result bundle). Never raises."""
    from click.shell_completion import CompletionItem

    if "/" in incomplete or incomplete.startswith("."):
        return [CompletionItem(incomplete, type="file")]
    db = ctx.params.get("db") if ctx is not None else None
    items = [CompletionItem("last", help="the newest experiment")] if "last".startswith(incomplete) else []
    items += [CompletionItem(i, help=h) for i, h in stored_ids(db) if i.startswith(incomplete)]
    # Nothing stored matches: the word may be a bundle file in the current directory.
    return items or [CompletionItem(incomplete, type="file")]


def stored_ids(db: str | None) -> list[tuple[str, str]]:
    """(id, 'date status arms') of the newest experiments, read-only; [] when the database cannot be read."""
    try:
        if db:
            path = Path(db)
        else:
            from orchestrator.results.store import default_path

            path = default_path()
        if not path.is_file():
            return []
    except Exception:
        return []
    with contextlib.suppress(sqlite3.Error, ValueError, TypeError):
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=0.5)
        try:
            rows = conn.execute(
                # newest first as the store orders them (results/store.NEWEST_FIRST), without importing it
                "SELECT id, created_at, status, arms_json FROM experiments ORDER BY rowid DESC LIMIT ?",
                (MAX_IDS,),
            ).fetchall()
        finally:
            conn.close()
        return [(str(r[0]), _help(r)) for r in rows]
    return []


def _help(row: Any) -> str:
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(float(row[1])))
    arms = json.loads(row[3]) if row[3] else []
    return f"{when} {row[2]} " + " vs ".join(str(a) for a in arms)
