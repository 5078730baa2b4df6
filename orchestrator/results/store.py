"""The results store: a versioned SQLite file, written the moment each run finishes."""

from __future__ import annotations

import contextlib
import json
import math
import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import platformdirs

from orchestrator.common.printable import visible
from orchestrator.errors import ExperimentRefError, InputError, StoreError
from orchestrator.results.schema import (
    COUNTED,
    DUPLICATE,
    DUPLICATE_ERROR,
    INDEXES,
    MIGRATIONS,
    SCHEMA_VERSION,
    actual_schema,
    expected_schema,
)

# psutil, socket and secrets are imported where they are used: `orch list` opens the store and reads it, and should
# not pay for what only a running experiment (its owner) or the secret-digest key needs.


def default_path() -> Path:
    return Path(platformdirs.user_data_dir("orch")) / "orch.db"


def open_existing(db: str | None) -> Store:
    """The results database a reading command (or a resume) needs: --db, else the default; none there is a
    StoreError saying how to make one, never an empty database created to read from."""
    path = Path(db) if db else default_path()
    if not path.exists():
        raise StoreError(f"{path}: no results database here yet (run `orch ab` first, or pass --db)")
    return Store(path)


AMBIGUOUS_SHOWN = 10  # ids an ambiguous prefix lists
# Newest first is the order the store recorded experiments in (rowid: each insert takes the largest yet + 1; orch
# never deletes one), never `created_at`: an experiment recorded under a clock set ahead would stay `last` for as long.
NEWEST_FIRST = "rowid DESC"
BUSY_TIMEOUT_MAX_S = 1e6  # sqlite3 takes the timeout in milliseconds as a C int: far beyond this overflows


def busy_timeout_s() -> float:
    """How long to wait for another process's lock on the file (ORCH_DB_BUSY_TIMEOUT_S, default 30 s). A value that
    is set but invalid is refused: silently waiting 30 s instead of what the user asked for hides their mistake."""
    raw = os.environ.get("ORCH_DB_BUSY_TIMEOUT_S")
    if raw is None or not raw.strip():  # `ORCH_DB_BUSY_TIMEOUT_S= orch ...` is the shell's way to unset it
        return 30.0
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    # nan fails both comparisons, so it lands here too
    if not 0 <= value < BUSY_TIMEOUT_MAX_S:
        raise InputError(
            f"ORCH_DB_BUSY_TIMEOUT_S={raw!r}: expected a non-negative number of seconds below "
            f"{BUSY_TIMEOUT_MAX_S:g} (such as 30, the default when it is unset)"
        )
    return value


def this_process() -> dict[str, Any]:
    """Who owns a running experiment: enough to tell later whether that process is still the same one (its PID, start
    time and, where the system has them, start ticks and the boot they count from: processes.identity) and on which
    machine."""
    import socket

    import psutil

    from orchestrator.agent.processes import identity

    return {**identity(psutil.Process()), "host": socket.gethostname()}


def owner_gone(owner: dict[str, Any]) -> str | None:
    """Why the owner process of a running experiment is known to be gone, or None (alive, elsewhere, or unknown)."""
    import socket

    pid, created = owner.get("pid"), owner.get("create_time")
    if owner.get("host") != socket.gethostname() or not isinstance(pid, int) or not isinstance(created, int | float):
        return None  # another machine's process (or an owner we cannot read) is nobody's to judge from here
    import psutil

    from orchestrator.agent.processes import boot_id, same_process

    booted, now = owner.get("boot_id"), boot_id()
    if isinstance(booted, str) and booted and now is not None and booted != now:
        # Its PID and start ticks may well be taken again in this boot: they would say nothing.
        return f"PID {pid} is gone: the machine has rebooted since"
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return f"PID {pid} is gone"
        # By start ticks since boot where recorded: a wall-clock step moves create_time, and must not make a live
        # owner look gone (its experiment would be marked interrupted under it).
        if not same_process(proc, owner, tolerance_s=0.5):
            return f"PID {pid} is gone; the PID now belongs to another process"
    except psutil.NoSuchProcess:
        return f"PID {pid} is gone"
    except psutil.Error:
        return None
    return None


def owner_text(owner_json: str | None) -> str:
    """A recorded owner in words: `orch PID 123 on host`."""
    try:
        owner = json.loads(owner_json) if owner_json else None
    except ValueError:
        owner = None
    if not isinstance(owner, dict):
        return "its owner unrecorded"
    return f"owned by orch PID {owner.get('pid')} on {owner.get('host')}"


def one_launch_per_slot(launches: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Launch rows with at most one that counts (COUNTED) per block and arm, as migration 10 leaves a store: the first
    complete one (else the first running one) stands; any other is marked DUPLICATE. Rows of an older orch's store,
    where two sessions could run one experiment at once."""
    order = sorted(range(len(launches)), key=lambda i: (launches[i].get("status") != "complete", i))
    seen: set[tuple[Any, Any]] = set()
    out = list(launches)
    for i in order:
        row = out[i]
        if row.get("status") not in COUNTED:
            continue
        slot = (row.get("block") or 0, row.get("arm_index"))
        if slot in seen:
            out[i] = {**row, "status": DUPLICATE, "error": DUPLICATE_ERROR}
        seen.add(slot)
    return out


def _kind(e: sqlite3.Error) -> str:
    """The SQLite error behind e (its code name where Python has it, else read from the message)."""
    name = getattr(e, "sqlite_errorname", "") or ""
    text = str(e).lower()
    for kind, code, words in (
        ("busy", "SQLITE_BUSY", "locked"),
        ("busy", "SQLITE_LOCKED", "locked"),
        ("readonly", "SQLITE_READONLY", "readonly"),
        ("full", "SQLITE_FULL", "disk is full"),
        ("notadb", "SQLITE_NOTADB", "not a database"),
        ("corrupt", "SQLITE_CORRUPT", "malformed"),
        ("cantopen", "SQLITE_CANTOPEN", "unable to open"),
        ("ioerr", "SQLITE_IOERR", "disk i/o error"),
    ):
        if name.startswith(code) or words in text:
            return kind
    return "other"


class Store:
    """One SQLite file. Every write commits at once, so a crash loses at most the run in flight."""

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path is not None else default_path()
        timeout_s = busy_timeout_s()  # before anything is created: an invalid setting leaves nothing behind
        # Experiments whose owner is gone but which a read-only file still records as running: shown interrupted.
        self._orphans: dict[str, str] = {}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StoreError(f"{self.path}: cannot create the results database: {e.strerror or e}") from e
        if str(self.path) != ":memory:" and not os.path.lexists(self.path):
            self._create(timeout_s)
        try:
            # A file orch may not write (permissions, an immutable file, a read-only mount) opens read-only:
            # listing and showing still work, and the first write says why it cannot.
            self.conn = sqlite3.connect(self.path, timeout=timeout_s)
        except sqlite3.Error as e:
            raise self._error(e, "opening it") from e
        try:
            self.conn.row_factory = sqlite3.Row
            try:
                self.conn.execute("PRAGMA foreign_keys = ON")
            except sqlite3.Error as e:
                raise self._error(e, "opening it") from e
            self._migrate()
            self.reap_orphans()
        except BaseException:
            self.conn.close()
            raise

    def _create(self, timeout_s: float) -> None:
        """A new store, built whole beside its path and linked into place: a failure (a full disk) leaves nothing at
        the path, never a store half made. If another orch creates it meanwhile, theirs is used."""
        import errno
        import secrets

        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.{secrets.token_hex(4)}.new")
        try:
            conn = sqlite3.connect(tmp, timeout=timeout_s)
            try:
                for target, migration in enumerate(MIGRATIONS):
                    with conn:
                        conn.executescript("BEGIN;" + migration + f"; PRAGMA user_version = {target + 1};")
                with conn:
                    for sql in INDEXES.values():
                        conn.execute(sql)
            finally:
                conn.close()
            try:
                os.link(tmp, self.path)  # never over a store another orch has just created
            except FileExistsError:
                pass
            except OSError as e:
                if e.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK):
                    raise
                if not os.path.lexists(self.path):  # a file system without hard links: a rename, checked first
                    os.rename(tmp, self.path)
        except (sqlite3.Error, OSError) as e:
            full = (isinstance(e, sqlite3.Error) and _kind(e) == "full") or getattr(e, "errno", None) == errno.ENOSPC
            why = f"the disk is full ({e})" if full else str(e)
            raise StoreError(
                f"cannot create the results database {self.path}: {why}; nothing was left there. "
                + ("Free some space, or use another --db" if full else "Check the directory, or use another --db")
            ) from e
        finally:
            for leftover in ("", "-journal", "-wal", "-shm"):
                with contextlib.suppress(OSError):
                    os.unlink(f"{tmp}{leftover}")

    def _error(self, e: sqlite3.Error, doing: str) -> StoreError:
        """What went wrong with the file, in words, and what to do about it."""
        kind = _kind(e)
        where = f"{self.path}"
        if kind == "busy":
            return StoreError(
                f"{where}: the results database is locked by another process (still busy after "
                f"{busy_timeout_s():g}s, while {doing}); let the other orch finish, or use another --db"
            )
        if kind == "readonly":
            return StoreError(
                f"{where}: the results database is read-only ({e}, while {doing}); make the file and its directory "
                "writable, or use another --db"
            )
        if kind == "full":
            return StoreError(
                f"{where}: the disk is full ({e}, while {doing}); everything recorded before is kept. Free some "
                "space, or use another --db"
            )
        if kind == "notadb":
            return StoreError(
                f"{where} is not an SQLite database (corrupt, or another kind of file: {e}); move it aside or use "
                "another --db"
            )
        if kind == "corrupt":
            return StoreError(
                f"{where}: the results database is corrupt ({e}, while {doing}); move it aside "
                "(`sqlite3 FILE .recover` may salvage it) or use another --db"
            )
        if kind == "cantopen":
            return StoreError(
                f"{where}: cannot open the results database ({e}, while {doing}); check that the file and its "
                "directory exist and are readable and writable, or use another --db"
            )
        if kind == "ioerr":
            return StoreError(f"{where}: I/O error on the results database ({e}, while {doing}); check the disk")
        return StoreError(f"{where}: the results database failed while {doing}: {e}")

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
        """A read for modules that keep their own tables here (the nightly history), failures explained."""
        return self._query(sql, params)

    def transaction(self, doing: str) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        """One committed write for modules that keep their own tables here, failures explained."""
        return self._write(doing)

    def _query(self, sql: str, params: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
        """A read, with any SQLite failure explained."""
        try:
            return self.conn.execute(sql, params).fetchall()
        except sqlite3.Error as e:
            raise self._error(e, "reading it") from e

    def _migrate(self) -> None:
        try:
            version = int(self.conn.execute("PRAGMA user_version").fetchone()[0])
        except sqlite3.Error as e:
            raise self._error(e, "opening it") from e
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"{self.path}: schema version {version} is newer than this orch understands ({SCHEMA_VERSION}); "
                "upgrade orch or use another --db"
            )
        # Checked before anything is written: someone else's SQLite file must not get orch's tables added to it.
        self._check_schema(version)
        for target in range(version, SCHEMA_VERSION):
            try:
                with self.conn:
                    self.conn.executescript("BEGIN;" + MIGRATIONS[target] + f"; PRAGMA user_version = {target + 1};")
            except sqlite3.Error as e:
                raise self._error(e, f"upgrading its schema from version {target} to {target + 1}") from e
        self._ensure_indexes()

    def _ensure_indexes(self) -> None:
        """Add the INDEXES a file lacks (one made by an older orch). Only reads get slower without them, so a file
        orch may not write now (read-only, locked, full) is read as it is, and indexed at a later open."""
        try:
            have = {r[0] for r in self.conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
            missing = [sql for name, sql in INDEXES.items() if name not in have]
            if missing:
                with self.conn:
                    for sql in missing:
                        self.conn.execute(sql)
        except sqlite3.Error as e:
            if _kind(e) not in ("readonly", "busy", "full"):
                raise self._error(e, "adding its indexes") from e

    def _check_schema(self, version: int) -> None:
        try:
            actual = actual_schema(self.conn)
        except sqlite3.Error as e:
            raise self._error(e, "opening it") from e
        expected = expected_schema(version)
        if version == 0:
            if actual:
                tables = ", ".join(visible(t) for t in sorted(actual)[:5])  # another program's names: one line
                raise StoreError(
                    f"{self.path} is not an orch results database (it has tables {tables} but no orch schema "
                    "version); use another --db"
                )
            return
        missing = [f"table {t}" for t in sorted(expected) if t not in actual]
        missing += [f"column {t}.{c}" for t in sorted(expected) if t in actual for c in sorted(expected[t] - actual[t])]
        if missing:
            more = f" and {len(missing) - 4} more" if len(missing) > 4 else ""
            raise StoreError(
                f"{self.path} is not an orch results database (schema version {version}, but missing "
                f"{', '.join(missing[:4])}{more}); use another --db"
            )

    def reap_orphans(self) -> list[str]:
        """Running experiments whose orch process (on this machine) is gone become `interrupted`, and so do their
        running launches; returns their ids. An owner that is alive, on another machine or unrecorded (an older orch)
        leaves its experiment alone. A read-only file keeps its rows; they are shown interrupted all the same."""
        reaped: list[str] = []
        rows = self._query("SELECT id, owner_json FROM experiments WHERE status = 'running' AND owner_json IS NOT NULL")
        for row in rows:
            try:
                owner = json.loads(row["owner_json"])
            except ValueError:
                continue
            gone = owner_gone(owner) if isinstance(owner, dict) else None
            if gone is None:
                continue
            error = (
                f"orch was killed ({gone}) before it recorded how this experiment ended (or it could not write here)"
            )
            self._orphans[row["id"]] = error
            reaped.append(row["id"])
            try:
                with self.conn:
                    # Only if nobody reclaimed it meanwhile (a resume records its own owner).
                    cur = self.conn.execute(
                        "UPDATE experiments SET status = 'interrupted', finished_at = ?, error = ?"
                        " WHERE id = ? AND status = 'running' AND owner_json = ?",
                        (time.time(), error, row["id"], row["owner_json"]),
                    )
                    if cur.rowcount:
                        self.conn.execute(
                            "UPDATE launches SET status = 'interrupted', error = ?"
                            " WHERE experiment_id = ? AND status = 'running'",
                            (error, row["id"]),
                        )
                    else:
                        del self._orphans[row["id"]]
                        reaped.pop()
            except sqlite3.Error as e:
                if _kind(e) != "readonly":
                    raise self._error(e, "marking experiments of a killed orch interrupted") from e
        return reaped

    def _shown(self, row: sqlite3.Row) -> dict[str, Any]:
        """An experiment row as it is: interrupted if its owner is gone, whatever a read-only file says."""
        out = dict(row)
        if out.get("status") == "running" and out.get("id") in self._orphans:
            out["status"], out["error"] = "interrupted", self._orphans[out["id"]]
        return out

    def close(self) -> None:
        self.conn.close()

    @property
    def redaction_key(self) -> bytes:
        """The random key of this store's secret digests (HMAC): a digest cannot be confirmed by guessing without it."""
        rows = self._query("SELECT value FROM meta WHERE key = 'redaction_key'")
        if not rows:
            import secrets

            with self._write("storing its secret-digest key") as c:
                c.execute(
                    "INSERT OR IGNORE INTO meta (key, value) VALUES ('redaction_key', ?)", (secrets.token_hex(32),)
                )
            rows = self._query("SELECT value FROM meta WHERE key = 'redaction_key'")
        return bytes.fromhex(rows[0][0])

    @contextmanager
    def _write(self, doing: str = "writing to it") -> Iterator[sqlite3.Connection]:
        try:
            with self.conn:
                yield self.conn
        except sqlite3.Error as e:
            raise self._error(e, doing) from e

    def create_experiment(
        self,
        exp_id: str,
        *,
        kind: str,
        simulated: bool,
        host: str,
        arms: list[str],
        config: dict[str, Any],
        orch_version: str,
        design: dict[str, Any] | None = None,
    ) -> None:
        with self._write("recording a new experiment") as c:
            c.execute(
                "INSERT INTO experiments (id, kind, created_at, status, simulated, host, arms_json, config_json,"
                " orch_version, design_json, owner_json) VALUES (?, ?, ?, 'running', ?, ?, ?, ?, ?, ?, ?)",
                (
                    exp_id,
                    kind,
                    time.time(),
                    int(simulated),
                    host,
                    json.dumps(arms),
                    json.dumps(config),
                    orch_version,
                    None if design is None else json.dumps(design),
                    json.dumps(this_process()),
                ),
            )

    def update_design(self, exp_id: str, design: dict[str, Any]) -> None:
        """`--blocks auto` scheduled another block: stored first, so a resume continues the same design."""
        with self._write("recording the experiment's design") as c:
            c.execute("UPDATE experiments SET design_json = ? WHERE id = ?", (json.dumps(design), exp_id))

    def reopen_experiment(self, exp_id: str, seen: dict[str, Any]) -> None:
        """A resumed experiment is running again, owned by this process; its earlier end (and why) is no longer its
        state. Taken over only from the state the caller checked (`seen`, the experiment as it read it: its status
        and owner), in one UPDATE, so of two sessions resuming it at once only one wins; the other gets a StoreError
        and runs nothing. Launches its gone owner left `running` are marked interrupted with it."""
        error = "orch stopped before this launch ended (its experiment was resumed)"
        with self._write("reopening an experiment") as c:
            cur = c.execute(
                "UPDATE experiments SET status = 'running', finished_at = NULL, error = NULL, owner_json = ?"
                " WHERE id = ? AND status = ? AND owner_json IS ?",
                (json.dumps(this_process()), exp_id, seen.get("status"), seen.get("owner_json")),
            )
            if cur.rowcount != 1:
                now = c.execute("SELECT status, owner_json FROM experiments WHERE id = ?", (exp_id,)).fetchone()
                state = f"it is {now['status']} now, {owner_text(now['owner_json'])}" if now else "it is gone"
                raise StoreError(
                    f"experiment {exp_id} was taken over by another orch session while this one prepared to resume it "
                    f"({state}); nothing was run. `orch list` shows it: resume it once it is no longer running"
                )
            c.execute(
                "UPDATE launches SET status = 'interrupted', error = ? WHERE experiment_id = ? AND status = 'running'",
                (error, exp_id),
            )
        self._orphans.pop(exp_id, None)

    def finish_experiment(self, exp_id: str, status: str, error: str | None = None) -> None:
        with self._write(f"recording that the experiment ended ({status})") as c:
            c.execute(
                "UPDATE experiments SET status = ?, finished_at = ?, error = ? WHERE id = ?",
                (status, time.time(), error, exp_id),
            )

    def import_experiment(
        self,
        experiment: dict[str, Any],
        launches: list[dict[str, Any]],
        runs: list[dict[str, Any]],
        requests: list[dict[str, Any]],
    ) -> None:
        """Rows of an experiment recorded elsewhere (a result bundle), all in one transaction: all or nothing."""
        schema = expected_schema(SCHEMA_VERSION)
        launches = one_launch_per_slot(launches)
        with self._write("importing an experiment") as c:
            for table, rows in (("experiments", [experiment]), ("launches", launches), ("runs", runs)):
                for row in rows:
                    self._insert(c, schema, table, row)
            for row in requests:
                self._insert(c, schema, "requests", row)

    @staticmethod
    def _insert(c: sqlite3.Connection, schema: dict[str, set[str]], table: str, row: dict[str, Any]) -> None:
        unknown = set(row) - schema[table]
        if unknown:  # column names come from orch's own code, never from a file: this is a bug, not bad input
            raise StoreError(f"cannot import into {table}: unknown columns {sorted(unknown)}")
        names = sorted(row)
        c.execute(
            f"INSERT INTO {table} ({', '.join(names)}) VALUES ({', '.join('?' for _ in names)})",
            tuple(row[n] for n in names),
        )

    def launch_ids_taken(self, launch_ids: list[str]) -> list[str]:
        """Which of these launch ids this store already holds (launch ids are unique across experiments)."""
        taken: list[str] = []
        for i in range(0, len(launch_ids), 500):
            chunk = launch_ids[i : i + 500]
            rows = self._query(
                f"SELECT launch_id FROM launches WHERE launch_id IN ({', '.join('?' for _ in chunk)})", tuple(chunk)
            )
            taken += [r[0] for r in rows]
        return taken

    def add_launch(
        self,
        launch_id: str,
        *,
        experiment_id: str,
        arm_index: int,
        profile: str,
        profile_dict: dict[str, Any],
        argv: list[str],
        env: dict[str, str],
        pid: int | None,
        started_at: float,
        block: int = 0,
        position: int | None = None,
    ) -> None:
        with self._write("recording a launch") as c:
            try:
                c.execute(
                    "INSERT INTO launches (launch_id, experiment_id, arm_index, block, position, profile, profile_json,"
                    " argv_json, env_json, pid, started_at, status)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'running')",
                    (
                        launch_id,
                        experiment_id,
                        arm_index,
                        block,
                        arm_index if position is None else position,
                        profile,
                        json.dumps(profile_dict),
                        json.dumps(argv),
                        json.dumps(env),
                        pid,
                        started_at,
                    ),
                )
            except sqlite3.IntegrityError as e:
                if "launches.experiment_id" not in str(e):  # another constraint: explained as any other failure
                    raise
                raise StoreError(
                    f"{self.path}: experiment {experiment_id} already has a launch of arm {arm_index + 1} in block "
                    f"{block + 1} running or complete (is another orch session running this experiment?); refused, "
                    "so that no launch is counted twice"
                ) from e

    def update_launch(self, launch_id: str, **fields: Any) -> None:
        allowed = {
            "ready_s",
            "preflight_json",
            "env_report_json",
            "teardown_json",
            "gpus_json",
            "fingerprint_json",
            "status",
            "error",
        }
        bad = set(fields) - allowed
        if bad:
            raise StoreError(f"cannot update launch fields {sorted(bad)}")
        values = [json.dumps(v) if k.endswith("_json") else v for k, v in fields.items()]
        sets = ", ".join(f"{k} = ?" for k in fields)
        with self._write("updating a launch") as c:
            c.execute(f"UPDATE launches SET {sets} WHERE launch_id = ?", (*values, launch_id))

    def add_run(self, launch_id: str, run: dict[str, Any]) -> None:
        """One finished run and its per-request summaries, in one transaction."""
        key = (
            launch_id,
            int(run["warmup"]),
            int(run.get("concurrency", 1)),
            float(run.get("rate") or 0.0),  # open loop: the level's rate; 0 for closed loop
            int(run["index"]),
        )
        with self._write("recording a finished run") as c:
            c.execute(
                "INSERT INTO runs (launch_id, warmup, concurrency, rate, idx, tokens, seconds, tok_s, aggregate_tok_s,"
                " prompt_tokens, ttft_s, spec_accept_length, spec_verify_ct, accept_source, token_source, requests,"
                " errors, metrics_json, valid, invalid_reason, finished_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    *key,
                    run["tokens"],
                    run["seconds"],
                    run["tok_s"],
                    run.get("aggregate_tok_s"),
                    run["prompt_tokens"],
                    run["ttft_s"],
                    run["spec_accept_length"],
                    run["spec_verify_ct"],
                    run.get("accept_source"),
                    run.get("token_source"),
                    run.get("requests", 1),
                    run.get("errors", 0),
                    json.dumps(run.get("metrics") or {}),
                    int(run["valid"]),
                    run["invalid_reason"],
                    time.time(),
                ),
            )
            c.executemany(
                "INSERT INTO requests (launch_id, run_warmup, run_concurrency, run_rate, run_idx, idx, tokens,"
                " prompt_tokens, ttft_s, e2e_s, chunks, accept_length, error, arrivals_json, scheduled_s, send_lag_s,"
                " queued_s) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (
                        *key,
                        r["index"],
                        r["tokens"],
                        r.get("prompt_tokens"),
                        r.get("ttft_s"),
                        r.get("e2e_s"),
                        r.get("chunks"),
                        r.get("accept_length"),
                        r.get("error"),
                        None if r.get("arrivals_s") is None else json.dumps(r["arrivals_s"]),
                        r.get("scheduled_s"),
                        r.get("send_lag_s"),
                        r.get("queued_s"),
                    )
                    for r in run.get("per_request") or []
                ],
            )

    def requests(self, launch_id: str) -> list[dict[str, Any]]:
        rows = self._query(
            "SELECT * FROM requests WHERE launch_id = ?"
            " ORDER BY run_warmup DESC, run_concurrency, run_rate, run_idx, idx",
            (launch_id,),
        )
        return [dict(r) for r in rows]

    def experiment(self, exp_id: str) -> dict[str, Any] | None:
        rows = self._query("SELECT * FROM experiments WHERE id = ?", (exp_id,))
        return self._shown(rows[0]) if rows else None

    def launches(self, exp_id: str) -> list[dict[str, Any]]:
        rows = [
            dict(r)
            for r in self._query("SELECT * FROM launches WHERE experiment_id = ? ORDER BY started_at", (exp_id,))
        ]
        if exp_id in self._orphans:
            for r in rows:
                if r["status"] == "running":
                    r["status"], r["error"] = "interrupted", self._orphans[exp_id]
        return rows

    def runs(self, launch_id: str) -> list[dict[str, Any]]:
        rows = self._query(
            # rowid: the order the runs finished in, so concurrency levels read back in the order they ran
            "SELECT * FROM runs WHERE launch_id = ? ORDER BY warmup DESC, rowid",
            (launch_id,),
        )
        return [dict(r) for r in rows]

    def experiments(self, limit: int = 20) -> list[dict[str, Any]]:
        """The newest experiments first (NEWEST_FIRST), each with how many of its launches completed."""
        rows = self._query(
            "SELECT e.*, (SELECT COUNT(*) FROM launches l WHERE l.experiment_id = e.id AND l.status = 'complete')"
            f" AS launches_complete FROM experiments e ORDER BY {NEWEST_FIRST} LIMIT ?",
            (limit,),
        )
        return [self._shown(r) for r in rows]

    def find_experiment(self, ref: str) -> dict[str, Any]:
        """An experiment by id, unique id prefix, or `last` (the one recorded last); otherwise ExperimentRefError
        (exit 2 at the command line, whichever command was given the id), naming the candidates where a prefix is
        ambiguous."""
        if not ref.strip():
            raise ExperimentRefError("an experiment id (or a unique prefix of one, or `last`) is needed")
        if ref == "last":
            rows = self._query(f"SELECT * FROM experiments ORDER BY {NEWEST_FIRST} LIMIT 1")
            if not rows:
                raise ExperimentRefError(f"{self.path}: no experiments stored yet, so `last` names none")
            return self._shown(rows[0])
        exact = self.experiment(ref)
        if exact is not None:
            return exact
        pattern = ref.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        shown = AMBIGUOUS_SHOWN
        rows = self._query(
            f"SELECT * FROM experiments WHERE id LIKE ? ESCAPE '\\' ORDER BY {NEWEST_FIRST} LIMIT ?",
            (pattern, shown + 1),
        )
        if len(rows) == 1:
            return self._shown(rows[0])
        if not rows:
            # An id that names nothing is the user's input to fix, as an ambiguous prefix is: exit 2, no broken store.
            raise ExperimentRefError(f"no experiment {ref!r} in {self.path} (`orch list` shows the stored ones)")
        # Which one was meant is the user's to say: a usage error (exit 2) that lists what the prefix matches.
        more = ""
        if len(rows) > shown:
            total = self._query("SELECT COUNT(*) AS n FROM experiments WHERE id LIKE ? ESCAPE '\\'", (pattern,))[0]["n"]
            more = f" and {total - shown} more"
        ids = ", ".join(r["id"] for r in rows[:shown])
        raise ExperimentRefError(
            f"{ref!r} matches several experiments in {self.path} (newest first: {ids}{more}); give more of the id"
        )
