"""The store's schema: the migrations that build it, its version, its indexes, and the tables each version has."""

from __future__ import annotations

import functools
import sqlite3

# A launch that runs or ran to the end holds its slot (experiment, block, arm): one per slot since schema 10. Any other
# that a store (or a bundle from an older orch's store) already held for its slot is kept, marked DUPLICATE.
COUNTED = ("running", "complete")
DUPLICATE = "duplicate"
DUPLICATE_ERROR = (
    "a second orch session ran this launch of the block at the same time (before orch refused to resume a running "
    "experiment); kept, but left out of the statistics"
)

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
    # 5: each launch's fingerprint (host, GPUs, the server's software, profile and workload digests): what a
    # reproduction or a comparison needs to explain a difference.
    """
    ALTER TABLE launches ADD COLUMN fingerprint_json TEXT;
    """,
    # 6: an experiment imported from a result bundle records where it came from (file, when, the bundle's digests),
    # so importing the same bundle again is recognised and a different one under the same id is refused.
    """
    ALTER TABLE experiments ADD COLUMN imported_json TEXT;
    """,
    # 7: nightly suites. A night records which suite (file, digest) ran when, and each item what it measured: one
    # value per series (arm and metric, or an A/B ratio) with its interval, and the environment it ran in, so the
    # history of a series is one query and an environment step is told from a regression.
    """
    CREATE TABLE nights (
        id TEXT PRIMARY KEY,
        suite TEXT NOT NULL,
        suite_path TEXT NOT NULL,
        suite_sha256 TEXT NOT NULL,
        night_at REAL NOT NULL,
        started_at REAL NOT NULL,
        finished_at REAL,
        status TEXT NOT NULL,
        exit_code INTEGER,
        owner_json TEXT,
        report_json TEXT
    );
    CREATE TABLE night_items (
        night_id TEXT NOT NULL REFERENCES nights(id),
        item TEXT NOT NULL,
        host TEXT NOT NULL,
        kind TEXT NOT NULL,
        simulated INTEGER NOT NULL,
        status TEXT NOT NULL,
        experiments_json TEXT NOT NULL,
        error TEXT,
        series_json TEXT NOT NULL,
        envs_json TEXT NOT NULL,
        finished_at REAL NOT NULL,
        PRIMARY KEY (night_id, item)
    );
    CREATE INDEX night_items_by_item ON night_items(item, host);
    """,
    # 8: each request's token-arrival profile (seconds from its start until 0 %, 10 %, ..., 100 % of its tokens had
    # arrived, as JSON): the report's tokens-over-time plot draws it. NULL for requests stored before.
    """
    ALTER TABLE requests ADD COLUMN arrivals_json TEXT;
    """,
    # 9: open-loop levels (--rate). A run is keyed by its rate too (0 for closed loop; an open-loop run's concurrency
    # is 0), so two rates' runs of one launch do not collide; each request records when it was due and how late the
    # client sent it (and how long of that a --max-concurrency cap held it). SQLite cannot change a primary key in
    # place: both tables are rebuilt, their rows copied.
    """
    CREATE TABLE runs_new (
        launch_id TEXT NOT NULL REFERENCES launches(launch_id),
        idx INTEGER NOT NULL,
        warmup INTEGER NOT NULL,
        concurrency INTEGER NOT NULL DEFAULT 1,
        rate REAL NOT NULL DEFAULT 0,
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
        PRIMARY KEY (launch_id, warmup, concurrency, rate, idx)
    );
    INSERT INTO runs_new (launch_id, idx, warmup, concurrency, tokens, seconds, tok_s, aggregate_tok_s, prompt_tokens,
                          ttft_s, spec_accept_length, spec_verify_ct, accept_source, token_source, requests, errors,
                          metrics_json, valid, invalid_reason, finished_at)
        SELECT launch_id, idx, warmup, concurrency, tokens, seconds, tok_s, aggregate_tok_s, prompt_tokens, ttft_s,
               spec_accept_length, spec_verify_ct, accept_source, token_source, requests, errors, metrics_json, valid,
               invalid_reason, finished_at FROM runs ORDER BY rowid;
    DROP TABLE runs;
    ALTER TABLE runs_new RENAME TO runs;
    CREATE TABLE requests_new (
        launch_id TEXT NOT NULL REFERENCES launches(launch_id),
        run_warmup INTEGER NOT NULL,
        run_concurrency INTEGER NOT NULL,
        run_rate REAL NOT NULL DEFAULT 0,
        run_idx INTEGER NOT NULL,
        idx INTEGER NOT NULL,
        tokens INTEGER NOT NULL,
        prompt_tokens INTEGER,
        ttft_s REAL,
        e2e_s REAL,
        chunks INTEGER,
        accept_length REAL,
        error TEXT,
        arrivals_json TEXT,
        scheduled_s REAL,
        send_lag_s REAL,
        queued_s REAL,
        PRIMARY KEY (launch_id, run_warmup, run_concurrency, run_rate, run_idx, idx)
    );
    INSERT INTO requests_new (launch_id, run_warmup, run_concurrency, run_idx, idx, tokens, prompt_tokens, ttft_s,
                              e2e_s, chunks, accept_length, error, arrivals_json)
        SELECT launch_id, run_warmup, run_concurrency, run_idx, idx, tokens, prompt_tokens, ttft_s, e2e_s, chunks,
               accept_length, error, arrivals_json FROM requests ORDER BY rowid;
    DROP TABLE requests;
    ALTER TABLE requests_new RENAME TO requests;
    """,
    # 10: one launch per slot of the design. Two sessions that resumed one experiment at once each ran its remaining
    # launches, and the statistics counted both: a launch that runs or ran to the end (COUNTED) is now unique per
    # experiment, block and arm, so a second one cannot be written. Duplicates a store already holds are kept, marked
    # `duplicate` (the first recorded complete one stands) and so left out of the statistics.
    """
    UPDATE launches SET status = 'duplicate', error = 'a second orch session ran this launch of the block at the same'
        || ' time (before orch refused to resume a running experiment); kept, but left out of the statistics'
    WHERE status IN ('running', 'complete') AND EXISTS (
        SELECT 1 FROM launches k
        WHERE k.experiment_id = launches.experiment_id AND k.block = launches.block
            AND k.arm_index = launches.arm_index AND k.status IN ('running', 'complete')
            AND ((k.status = 'complete' AND launches.status = 'running')
                 OR (k.status = launches.status AND k.rowid < launches.rowid))
    );
    CREATE UNIQUE INDEX launches_one_per_slot ON launches(experiment_id, block, arm_index)
        WHERE status IN ('running', 'complete');
    """,
)
SCHEMA_VERSION = len(MIGRATIONS)

# Indexes for the reads that must stay fast on a big store: the launches completed per experiment (`orch list`), and
# the running experiments checked at every open. (`orch list` and `last` go newest first by rowid, the table's own
# order.) They are not a schema version: SQLite keeps an index current on every write, whichever orch writes, so an
# older orch (which refuses a newer user_version) reads and writes an indexed file exactly as before. Created on open
# where missing.
INDEXES: dict[str, str] = {
    "experiments_running": "CREATE INDEX IF NOT EXISTS experiments_running ON experiments(status)"
    " WHERE status = 'running'",
    "launches_by_experiment_status": "CREATE INDEX IF NOT EXISTS launches_by_experiment_status"
    " ON launches(experiment_id, status)",
}


def actual_schema(conn: sqlite3.Connection) -> dict[str, set[str]]:
    """Each table's column names."""
    tables = [
        r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")
    ]
    return {t: {r[0] for r in conn.execute("SELECT name FROM pragma_table_info(?)", (t,))} for t in tables}


@functools.cache
def expected_schema(version: int) -> dict[str, set[str]]:
    """The tables and columns an orch database has at schema `version` (built from the migrations themselves)."""
    conn = sqlite3.connect(":memory:")
    try:
        for migration in MIGRATIONS[:version]:
            conn.executescript(migration)
        return actual_schema(conn)
    finally:
        conn.close()
