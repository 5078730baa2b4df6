"""The results store: a versioned SQLite file, written the moment each run finishes."""

from __future__ import annotations

import json
import secrets
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import platformdirs

from orchestrator.errors import StoreError

# Each entry migrates the schema from version i to i + 1; append only, never edit a shipped one.
MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE experiments (
        id TEXT PRIMARY KEY,
        kind TEXT NOT NULL,
        created_at REAL NOT NULL,
        finished_at REAL,
        status TEXT NOT NULL,
        simulated INTEGER NOT NULL,
        host TEXT NOT NULL,
        arms_json TEXT NOT NULL,
        config_json TEXT NOT NULL,
        orch_version TEXT NOT NULL,
        error TEXT
    );
    CREATE TABLE launches (
        launch_id TEXT PRIMARY KEY,
        experiment_id TEXT NOT NULL REFERENCES experiments(id),
        arm_index INTEGER NOT NULL,
        profile TEXT NOT NULL,
        profile_json TEXT NOT NULL,
        argv_json TEXT NOT NULL,
        env_json TEXT NOT NULL,
        pid INTEGER,
        started_at REAL NOT NULL,
        ready_s REAL,
        preflight_json TEXT,
        env_report_json TEXT,
        teardown_json TEXT,
        status TEXT NOT NULL,
        error TEXT
    );
    CREATE TABLE runs (
        launch_id TEXT NOT NULL REFERENCES launches(launch_id),
        idx INTEGER NOT NULL,
        warmup INTEGER NOT NULL,
        tokens INTEGER NOT NULL,
        seconds REAL NOT NULL,
        tok_s REAL NOT NULL,
        prompt_tokens INTEGER NOT NULL,
        ttft_s REAL,
        spec_accept_length REAL,
        spec_verify_ct INTEGER,
        valid INTEGER NOT NULL,
        invalid_reason TEXT,
        finished_at REAL NOT NULL,
        PRIMARY KEY (launch_id, warmup, idx)
    );
    CREATE INDEX launches_by_experiment ON launches(experiment_id);
    """,
    # 2: concurrency levels and richer run metrics; one run per (launch, warmup, concurrency, index);
    # per-request summaries.
    """
    CREATE TABLE runs_new (
        launch_id TEXT NOT NULL REFERENCES launches(launch_id),
        idx INTEGER NOT NULL,
        warmup INTEGER NOT NULL,
        concurrency INTEGER NOT NULL DEFAULT 1,
        tokens INTEGER NOT NULL,
        seconds REAL NOT NULL,
        tok_s REAL NOT NULL,
        aggregate_tok_s REAL,
        prompt_tokens INTEGER NOT NULL,
        ttft_s REAL,
        spec_accept_length REAL,
        spec_verify_ct INTEGER,
        accept_source TEXT,
        token_source TEXT,
        requests INTEGER NOT NULL DEFAULT 1,
        errors INTEGER NOT NULL DEFAULT 0,
        metrics_json TEXT,
        valid INTEGER NOT NULL,
        invalid_reason TEXT,
        finished_at REAL NOT NULL,
        PRIMARY KEY (launch_id, warmup, concurrency, idx)
    );
    INSERT INTO runs_new (launch_id, idx, warmup, concurrency, tokens, seconds, tok_s, aggregate_tok_s, prompt_tokens,
                          ttft_s, spec_accept_length, spec_verify_ct, valid, invalid_reason, finished_at)
        SELECT launch_id, idx, warmup, 1, tokens, seconds, tok_s, tok_s, prompt_tokens, ttft_s, spec_accept_length,
               spec_verify_ct, valid, invalid_reason, finished_at FROM runs;
    DROP TABLE runs;
    ALTER TABLE runs_new RENAME TO runs;
    CREATE TABLE requests (
        launch_id TEXT NOT NULL REFERENCES launches(launch_id),
        run_warmup INTEGER NOT NULL,
        run_concurrency INTEGER NOT NULL,
        run_idx INTEGER NOT NULL,
        idx INTEGER NOT NULL,
        tokens INTEGER NOT NULL,
        prompt_tokens INTEGER,
        ttft_s REAL,
        e2e_s REAL,
        chunks INTEGER,
        accept_length REAL,
        error TEXT,
        PRIMARY KEY (launch_id, run_warmup, run_concurrency, run_idx, idx)
    );
    """,
    # 3: blocked designs. An experiment records its design (blocks, order, seed, schedule) and each launch its block
    # and position in it, plus the GPUs' state under load (clock/temperature drift between launches).
    """
    ALTER TABLE experiments ADD COLUMN design_json TEXT;
    ALTER TABLE launches ADD COLUMN block INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE launches ADD COLUMN position INTEGER;
    ALTER TABLE launches ADD COLUMN gpus_json TEXT;
    UPDATE launches SET position = arm_index;
    """,
    # 4: who owns a running experiment (so a later session can tell a killed orch from a live one), and store-wide
    # settings such as the key of the secret digests.
    """
    ALTER TABLE experiments ADD COLUMN owner_json TEXT;
    CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
    """,
)
SCHEMA_VERSION = len(MIGRATIONS)


def default_path() -> Path:
    return Path(platformdirs.user_data_dir("orch")) / "orch.db"


class Store:
    """One SQLite file. Every write commits at once, so a crash loses at most the run in flight."""

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path is not None else default_path()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.conn = sqlite3.connect(self.path, timeout=30)
            self.conn.row_factory = sqlite3.Row
            self.conn.execute("PRAGMA foreign_keys = ON")
            self._migrate()
        except sqlite3.DatabaseError as e:
            raise StoreError(f"{self.path}: cannot open the results database: {e}") from e
        except OSError as e:
            raise StoreError(f"{self.path}: cannot create the results database: {e.strerror or e}") from e

    def _migrate(self) -> None:
        version = int(self.conn.execute("PRAGMA user_version").fetchone()[0])
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"{self.path}: schema version {version} is newer than this orch understands ({SCHEMA_VERSION}); "
                "upgrade orch or use another --db"
            )
        for target in range(version, SCHEMA_VERSION):
            with self.conn:
                self.conn.executescript("BEGIN;" + MIGRATIONS[target] + f"; PRAGMA user_version = {target + 1};")

    def close(self) -> None:
        self.conn.close()

    @property
    def redaction_key(self) -> bytes:
        """The random key of this store's secret digests (HMAC): a digest cannot be confirmed by guessing without it."""
        row = self.conn.execute("SELECT value FROM meta WHERE key = 'redaction_key'").fetchone()
        if row is None:
            with self._write() as c:
                c.execute(
                    "INSERT OR IGNORE INTO meta (key, value) VALUES ('redaction_key', ?)", (secrets.token_hex(32),)
                )
            row = self.conn.execute("SELECT value FROM meta WHERE key = 'redaction_key'").fetchone()
        return bytes.fromhex(row[0])

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        try:
            with self.conn:
                yield self.conn
        except sqlite3.DatabaseError as e:
            raise StoreError(f"{self.path}: write failed: {e}") from e

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
        with self._write() as c:
            c.execute(
                "INSERT INTO experiments (id, kind, created_at, status, simulated, host, arms_json, config_json,"
                " orch_version, design_json) VALUES (?, ?, ?, 'running', ?, ?, ?, ?, ?, ?)",
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
                ),
            )

    def reopen_experiment(self, exp_id: str) -> None:
        """A resumed experiment is running again; its earlier end (and why) is no longer its state."""
        with self._write() as c:
            c.execute(
                "UPDATE experiments SET status = 'running', finished_at = NULL, error = NULL WHERE id = ?", (exp_id,)
            )

    def finish_experiment(self, exp_id: str, status: str, error: str | None = None) -> None:
        with self._write() as c:
            c.execute(
                "UPDATE experiments SET status = ?, finished_at = ?, error = ? WHERE id = ?",
                (status, time.time(), error, exp_id),
            )

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
        pid: int,
        started_at: float,
        block: int = 0,
        position: int | None = None,
    ) -> None:
        with self._write() as c:
            c.execute(
                "INSERT INTO launches (launch_id, experiment_id, arm_index, block, position, profile, profile_json,"
                " argv_json, env_json, pid, started_at, status) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'running')",
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

    def update_launch(self, launch_id: str, **fields: Any) -> None:
        allowed = {"ready_s", "preflight_json", "env_report_json", "teardown_json", "gpus_json", "status", "error"}
        bad = set(fields) - allowed
        if bad:
            raise StoreError(f"cannot update launch fields {sorted(bad)}")
        values = [json.dumps(v) if k.endswith("_json") else v for k, v in fields.items()]
        sets = ", ".join(f"{k} = ?" for k in fields)
        with self._write() as c:
            c.execute(f"UPDATE launches SET {sets} WHERE launch_id = ?", (*values, launch_id))

    def add_run(self, launch_id: str, run: dict[str, Any]) -> None:
        """One finished run and its per-request summaries, in one transaction."""
        key = (launch_id, int(run["warmup"]), int(run.get("concurrency", 1)), int(run["index"]))
        with self._write() as c:
            c.execute(
                "INSERT INTO runs (launch_id, warmup, concurrency, idx, tokens, seconds, tok_s, aggregate_tok_s,"
                " prompt_tokens, ttft_s, spec_accept_length, spec_verify_ct, accept_source, token_source, requests,"
                " errors, metrics_json, valid, invalid_reason, finished_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
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
                "INSERT INTO requests (launch_id, run_warmup, run_concurrency, run_idx, idx, tokens, prompt_tokens,"
                " ttft_s, e2e_s, chunks, accept_length, error) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
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
                    )
                    for r in run.get("per_request") or []
                ],
            )

    def requests(self, launch_id: str) -> list[dict[str, Any]]:
        rows = self.conn.execute(
            "SELECT * FROM requests WHERE launch_id = ? ORDER BY run_warmup DESC, run_concurrency, run_idx, idx",
            (launch_id,),
        ).fetchall()
        return [dict(r) for r in rows]

    def experiment(self, exp_id: str) -> dict[str, Any] | None:
        row = self.conn.execute("SELECT * FROM experiments WHERE id = ?", (exp_id,)).fetchone()
        return dict(row) if row else None

    def launches(self, exp_id: str) -> list[dict[str, Any]]:
        rows = self.conn.execute(
            "SELECT * FROM launches WHERE experiment_id = ? ORDER BY started_at", (exp_id,)
        ).fetchall()
        return [dict(r) for r in rows]

    def runs(self, launch_id: str) -> list[dict[str, Any]]:
        rows = self.conn.execute(
            # rowid: the order the runs finished in, so concurrency levels read back in the order they ran
            "SELECT * FROM runs WHERE launch_id = ? ORDER BY warmup DESC, rowid",
            (launch_id,),
        ).fetchall()
        return [dict(r) for r in rows]

    def experiments(self, limit: int = 20) -> list[dict[str, Any]]:
        """The newest experiments first, each with how many of its launches completed."""
        rows = self.conn.execute(
            "SELECT e.*, (SELECT COUNT(*) FROM launches l WHERE l.experiment_id = e.id AND l.status = 'complete')"
            " AS launches_complete FROM experiments e ORDER BY created_at DESC LIMIT ?",
            (limit,),
        ).fetchall()
        return [dict(r) for r in rows]

    def find_experiment(self, ref: str) -> dict[str, Any]:
        """An experiment by id, unique id prefix, or `last`; StoreError naming the candidates otherwise."""
        if not ref.strip():
            raise StoreError("an experiment id (or a unique prefix of one, or `last`) is needed")
        if ref == "last":
            rows = self.conn.execute("SELECT * FROM experiments ORDER BY created_at DESC LIMIT 1").fetchall()
            if not rows:
                raise StoreError(f"{self.path}: no experiments stored yet")
            return dict(rows[0])
        exact = self.experiment(ref)
        if exact is not None:
            return exact
        pattern = ref.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        rows = self.conn.execute(
            "SELECT * FROM experiments WHERE id LIKE ? ESCAPE '\\' ORDER BY created_at DESC LIMIT 6", (pattern,)
        ).fetchall()
        if len(rows) == 1:
            return dict(rows[0])
        if not rows:
            raise StoreError(f"no experiment {ref!r} in {self.path} (`orch list` shows the stored ones)")
        ids = ", ".join(r["id"] for r in rows[:5])
        raise StoreError(
            f"{ref!r} matches several experiments ({ids}{', ...' if len(rows) > 5 else ''}); give more of the id"
        )
