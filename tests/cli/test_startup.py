"""Start-up: the lazily loaded command table, what `orch --version` and `orch list` import, the store's indexes (added
in place to an older file, harmless to an older orch), and each comparison's bootstrap computed once per report."""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
import random
import sqlite3
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

import orchestrator.cli
from orchestrator.cli import cli
from orchestrator.cli.lazy import COMMANDS, load_all
from orchestrator.report.jsondoc import ab_json
from orchestrator.report.markdown import ab_markdown
from orchestrator.report.text import ab_text
from orchestrator.results import autostop, model
from orchestrator.results.model import ABResult, Design, LaunchResult
from orchestrator.results.run import RunResult
from orchestrator.results.schema import INDEXES, MIGRATIONS, SCHEMA_VERSION
from orchestrator.results.store import Store
from orchestrator.stats.sequential import SequentialPlan

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("httpx", "asyncio", "psutil", "paramiko", "rich", "yaml", "numpy", "ruptures", "matplotlib", "detect_secrets")

# Runs orch's main() in a fresh interpreter, then reports which heavy modules that imported (the last stdout line).
PROBE = """
import json, sys
from orchestrator.cli import main
code = main(sys.argv[1:])
heavy = [m for m in HEAVY if m in sys.modules] + [m for m in sys.modules if m.startswith(("orchestrator.client.runner",
         "orchestrator.launch", "orchestrator.results.model", "orchestrator.hosts", "orchestrator.stats.estimates"))]
print("\\nPROBE " + json.dumps({"code": code, "heavy": heavy}))
""".replace("HEAVY", repr(HEAVY))


def _probe(args: list[str], cwd: Path) -> tuple[int, list[str], str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60
    )
    out, _, last = proc.stdout.rpartition("\nPROBE ")
    doc = json.loads(last)
    return int(doc["code"]), list(doc["heavy"]), out + proc.stderr


def _stored(db: Path, exp_id: str, status: str = "complete") -> None:
    store = Store(db)
    store.create_experiment(exp_id, kind="ab", simulated=True, host="h", arms=["a", "b"], config={}, orch_version="t")
    store.add_launch(
        f"{exp_id}-l", experiment_id=exp_id, arm_index=0, profile="a", profile_dict={}, argv=[], env={}, pid=1,
        started_at=0.0,
    )  # fmt: skip
    store.update_launch(f"{exp_id}-l", status="complete")
    store.finish_experiment(exp_id, status)
    store.close()


# ---------------------------------------------------------------- what the fast commands import


def test_version_help_and_list_import_nothing_heavy(tmp_path: Path) -> None:
    code, heavy, out = _probe(["--version"], tmp_path)
    assert code == 0 and "orch, version" in out and heavy == [], out
    code, heavy, out = _probe(["--help"], tmp_path)
    assert code == 0 and heavy == [], out
    assert all(f"  {name} " in out for name in COMMANDS), out  # every command, each with its help line
    db = tmp_path / "r.db"
    _stored(db, "20260101-000000-aaaa")
    _stored(db, "20260102-000000-bbbb", "failed")
    code, heavy, out = _probe(["list", "--db", str(db)], tmp_path)
    assert code == 0 and heavy == [], out
    assert out.index("20260102-000000-bbbb") < out.index("20260101-000000-aaaa")  # newest first
    code, heavy, out = _probe(["list", "--db", str(db), "--json"], tmp_path)
    assert code == 0 and heavy == [], out
    assert [e["launches_complete"] for e in json.loads(out)["experiments"]] == [1, 1]
    empty = tmp_path / "empty.db"
    Store(empty).close()
    code, heavy, out = _probe(["list", "--db", str(empty)], tmp_path)
    assert code == 0 and heavy == [] and "no experiments in" in out, out


def test_the_host_factory_imports_a_remote_transport_only_when_a_host_needs_it(tmp_path: Path) -> None:
    script = (
        "import sys\nfrom orchestrator.hosts import resolve_host\nresolve_host('local').close()\n"
        "print(sorted(m for m in sys.modules if m.startswith('orchestrator.hosts.') or m == 'paramiko'))"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), "ORCH_HOSTS": str(tmp_path / "no-hosts.yaml")}
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    loaded = proc.stdout.strip()
    assert loaded == str([f"orchestrator.hosts.{m}" for m in ("base", "group", "inventory", "local", "lock")]), (
        proc.stderr
    )


def test_completing_a_command_name_imports_no_command_module(tmp_path: Path) -> None:
    script = (
        "import sys\nfrom orchestrator.cli import cli\nimport click\n"
        "items = cli.shell_complete(click.Context(cli), sys.argv[1])\n"
        "print([i.value for i in items], sorted(m for m in sys.modules if m.startswith('orchestrator.cli.')))"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-c", script, "s"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    ).stdout
    assert out.strip() == "['show', 'status'] ['orchestrator.cli.base', 'orchestrator.cli.lazy']", out
    # The same through click's bash protocol, as a shell calls it; options of the group still complete.
    env |= {"_ORCH_COMPLETE": "bash_complete", "COMP_WORDS": "orch re", "COMP_CWORD": "1"}
    proc = subprocess.run([sys.executable, "-m", "orchestrator"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.stdout.splitlines() == ["plain,report", "plain,reproduce"], proc.stderr
    env |= {"COMP_WORDS": "orch --v"}
    proc = subprocess.run([sys.executable, "-m", "orchestrator"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.stdout.splitlines() == ["plain,--version"], proc.stderr


# ---------------------------------------------------------------- the command table


def test_the_command_table_is_every_command_with_its_own_help() -> None:
    for name, (target, summary) in COMMANDS.items():
        module, _, attr = target.partition(":")
        command = getattr(importlib.import_module(module), attr)
        assert isinstance(command, click.Command) and command.name == name, target
        assert command.short_help is None and not command.hidden, name  # the table stands in for its help line
        first = " ".join((command.help or "").partition("\n\n")[0].split())
        assert summary == first, f"COMMANDS[{name!r}] should say: {first!r}"
    # No command of a cli module is missing from the table (subcommands of hosts and profiles belong to them).
    found: dict[str, click.Command] = {}
    for info in pkgutil.iter_modules(orchestrator.cli.__path__):
        module = importlib.import_module(f"orchestrator.cli.{info.name}")
        found |= {f"{module.__name__}:{k}": v for k, v in vars(module).items() if isinstance(v, click.Command)}
    groups = [g for g in found.values() if isinstance(g, click.Group) and g is not cli]
    nested = {id(c) for g in groups for c in g.commands.values()}
    top = {target for target, c in found.items() if id(c) not in nested and c is not cli}
    assert top == {target for target, _ in COMMANDS.values()}


def test_help_is_what_a_group_holding_every_command_would_print() -> None:
    eager = click.Group(
        cli.name, commands=load_all(cli), help=cli.help, params=cli.params, context_settings=cli.context_settings
    )
    for args in (["--help"], []):
        lazy_out = CliRunner().invoke(cli, args, prog_name="orch").output
        assert lazy_out == CliRunner().invoke(eager, args, prog_name="orch").output
    assert "Commands:" in lazy_out and "  list       Stored experiments, newest first" in lazy_out


def test_an_unknown_command_is_still_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    from orchestrator.cli import main

    assert main(["lst"]) == 2
    err = capsys.readouterr().err
    assert "No such command 'lst'" in err
    if hasattr(click.exceptions, "NoSuchCommand"):  # click 8.4+ suggests a close name
        assert "Did you mean 'list'?" in err


# ---------------------------------------------------------------- the store's indexes


def _old_store(path: Path, version: int = SCHEMA_VERSION) -> None:
    """A file as an orch before the indexes made it: the migrations alone, then some experiments."""
    conn = sqlite3.connect(path)
    for migration in MIGRATIONS[:version]:
        conn.executescript(migration)
    conn.execute(f"PRAGMA user_version = {version}")
    for n in range(30):
        exp_id = f"2026-{n:03d}"
        conn.execute(
            "INSERT INTO experiments (id, kind, created_at, status, simulated, host, arms_json, config_json,"
            " orch_version) VALUES (?, 'ab', ?, ?, 1, 'local', '[\"a\", \"b\"]', '{}', 't')",
            (exp_id, 1000.0 + (n * 7) % 30, "complete" if n % 3 else "failed"),
        )
        for arm in range(2):
            conn.execute(
                "INSERT INTO launches (launch_id, experiment_id, arm_index, profile, profile_json, argv_json,"
                " env_json, started_at, status) VALUES (?, ?, ?, 'a', '{}', '[]', '{}', 0, ?)",
                (f"{exp_id}-{arm}", exp_id, arm, "complete" if arm or n % 2 else "failed"),
            )
    conn.commit()
    conn.close()


def _indexes(path: Path) -> set[str]:
    conn = sqlite3.connect(path)
    try:
        return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL")}
    finally:
        conn.close()


def _plan(store: Store, sql: str) -> str:
    return " / ".join(str(r[3]) for r in store.conn.execute("EXPLAIN QUERY PLAN " + sql))


LIST_SQL = (
    "SELECT e.*, (SELECT COUNT(*) FROM launches l WHERE l.experiment_id = e.id AND l.status = 'complete')"
    " AS launches_complete FROM experiments e ORDER BY rowid DESC LIMIT 20"
)


def test_an_older_store_is_indexed_in_place_and_lists_the_same(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    _old_store(db)
    assert not set(INDEXES) & _indexes(db)
    conn = sqlite3.connect(db)
    conn.row_factory = sqlite3.Row
    # Newest first as recorded (their created_at values are out of order: only the store's order counts)
    want = [dict(r) for r in conn.execute(LIST_SQL.replace("LIMIT 20", "LIMIT 100"))]
    conn.close()
    store = Store(db)
    try:
        assert set(INDEXES) <= _indexes(db)
        assert store.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION  # no new version
        got = store.experiments(100)
        assert [(r["id"], r["launches_complete"]) for r in got] == [(r["id"], r["launches_complete"]) for r in want]
        assert store.find_experiment("last")["id"] == want[0]["id"]
        # Newest first straight from the table (its rowid order), and the completed launches counted from the index.
        plan = _plan(store, LIST_SQL)
        assert "TEMP B-TREE" not in plan, plan
        assert "launches_by_experiment_status" in plan, plan
        running = "SELECT id, owner_json FROM experiments WHERE status = 'running' AND owner_json IS NOT NULL"
        assert "experiments_running" in _plan(store, running)
    finally:
        store.close()
    Store(db).close()  # indexed already: nothing to add


def test_an_older_schema_is_migrated_then_indexed(tmp_path: Path) -> None:
    db = tmp_path / "v6.db"
    _old_store(db, version=6)
    Store(db).close()
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert conn.execute("SELECT COUNT(*) FROM experiments").fetchone()[0] == 30
    conn.close()
    assert set(INDEXES) <= _indexes(db)


def test_a_read_only_older_store_is_read_without_its_indexes(tmp_path: Path) -> None:
    db = tmp_path / "ro.db"
    _old_store(db)
    db.chmod(0o444)
    tmp_path.chmod(0o555)
    try:
        if os.access(db, os.W_OK):
            pytest.skip("running as a user who may write anything (root)")
        store = Store(db)
        try:
            assert len(store.experiments(100)) == 30
        finally:
            store.close()
        assert not set(INDEXES) & _indexes(db)
    finally:
        tmp_path.chmod(0o755)
        db.chmod(0o644)


def test_a_read_only_connection_does_not_fail_on_the_missing_indexes(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    _old_store(db)
    store = Store.__new__(Store)
    store.path, store._orphans = db, {}
    store.conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)  # as a read-only file or mount opens
    try:
        store._ensure_indexes()  # readonly: skipped, reads still work
    finally:
        store.conn.close()
    assert not set(INDEXES) & _indexes(db)


def _before_tree(tmp_path: Path) -> Path:
    """The orchestrator package before the indexes (the last commit before issue 14), from git."""
    tree = tmp_path / "before"
    tree.mkdir()
    try:
        blob = subprocess.run(
            ["git", "-C", str(REPO), "archive", "3e11be3", "orchestrator"], capture_output=True, check=True, timeout=60
        ).stdout
    except (OSError, subprocess.SubprocessError):
        pytest.skip("the pre-issue commit is not in this checkout's git history")
    subprocess.run(["tar", "-x", "-C", str(tree)], input=blob, check=True)
    return tree


def test_the_orch_before_the_indexes_still_reads_and_writes_an_indexed_store(tmp_path: Path) -> None:
    db = tmp_path / "new.db"
    before = _before_tree(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(before)}
    # At the schema version that orch understands (a later version is refused by design, indexes or not), with
    # the indexes this orch adds: they are what must not get in the older orch's way.
    # The before tree is from before the packages: its store is orchestrator/store.py.
    version = subprocess.run(
        [sys.executable, "-c", "from orchestrator.store import SCHEMA_VERSION; print(SCHEMA_VERSION)"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    conn = sqlite3.connect(db)
    for migration in MIGRATIONS[: int(version)]:
        conn.executescript(migration)
    conn.execute(f"PRAGMA user_version = {int(version)}")
    for sql in INDEXES.values():
        conn.execute(sql)
    conn.execute(
        "INSERT INTO experiments (id, kind, created_at, status, simulated, host, arms_json, config_json, orch_version)"
        " VALUES ('20260101-000000-aaaa', 'ab', 1.0, 'complete', 1, 'h', '[\"a\", \"b\"]', '{}', 't')"
    )
    conn.execute(
        "INSERT INTO launches (launch_id, experiment_id, arm_index, profile, profile_json, argv_json, env_json,"
        " started_at, status) VALUES ('L1', '20260101-000000-aaaa', 0, 'a', '{}', '[]', '{}', 0, 'complete')"
    )
    conn.commit()
    conn.close()
    assert set(INDEXES) <= _indexes(db)
    script = (
        "import sys\nfrom orchestrator.store import Store\ns = Store(sys.argv[1])\n"
        "assert [e['id'] for e in s.experiments()] == ['20260101-000000-aaaa']\n"
        "s.create_experiment('20260102-000000-bbbb', kind='ab', simulated=True, host='local', arms=['a'], config={},"
        " orch_version='old')\n"
        "s.add_launch('L2', experiment_id='20260102-000000-bbbb', arm_index=0, profile='a', profile_dict={}, argv=[],"
        " env={}, pid=1, started_at=0.0)\n"
        "s.update_launch('L2', status='complete')\ns.finish_experiment('20260102-000000-bbbb', 'complete')\n"
        "print(len(s.experiments()))"
    )
    old = subprocess.run(
        [sys.executable, "-c", script, str(db)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    assert old.returncode == 0 and old.stdout.strip() == "2", old.stderr
    store = Store(db)
    try:
        assert store.conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"  # the indexes kept up
        assert [(e["id"], e["launches_complete"]) for e in store.experiments()] == [
            ("20260102-000000-bbbb", 1),
            ("20260101-000000-aaaa", 1),
        ]
    finally:
        store.close()


# ---------------------------------------------------------------- one bootstrap per comparison


def _three_level_result() -> ABResult:
    rng = random.Random(3)
    launches = []
    for block in range(3):
        for arm, speed in enumerate((82.0, 90.0, 83.0)):
            runs = tuple(
                RunResult(
                    index=i,
                    warmup=False,
                    tokens=256,
                    seconds=3.0,
                    tok_s=speed * rng.gauss(1, 0.01) / c,
                    prompt_tokens=20,
                    ttft_s=0.02,
                    concurrency=c,
                    aggregate_tok_s=speed,
                )
                for c in (1, 4, 16)
                for i in range(3)
            )
            launches.append(
                LaunchResult(
                    profile=f"p{arm}",
                    launch_id=f"L{block}{arm}",
                    runs=runs,
                    ready_s=1.0,
                    env_report={},
                    teardown={},
                    block=block,
                    arm_index=arm,
                )
            )
    design = Design.make(3, 3, "random", 5, SequentialPlan())
    result = ABResult(
        experiment_id="e",
        simulated=True,
        host="local",
        profiles=("p0", "p1", "p2"),
        launches=tuple(launches),
        host_facts={},
        design=design,
    )
    return autostop.with_auto_notes(result)  # as load_result makes it: the notes ask for the comparisons too


def test_every_comparison_is_bootstrapped_once_per_report(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    bootstrap = model.ratio_ci

    def counted(*a: object, **k: object) -> object:
        calls.append(1)
        return bootstrap(*a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(model, "ratio_ci", counted)
    result = _three_level_result()
    text = ab_text(result)
    # Two arms against the baseline at three levels: one Holm family of 6, each member bootstrapped at every step it
    # is still open (stats/family), so at least 6 and at most 6 + 5 + 4 + 3 + 2 + 1 intervals.
    family = len(calls)
    assert 2 * 3 <= family <= 21
    doc, md = ab_json(result), ab_markdown(result)
    assert len(calls) == family  # the other formats read the same comparisons: nothing bootstrapped again
    assert "--blocks auto stopped after 3 blocks" in text and len(doc["comparisons_by_concurrency"]) == 6
    assert "p1 vs p0 @ 16" in md
    # Another minimum effect is another judgement: a new result, with its own comparisons (its whole family).
    stricter = result.__class__(**{**{f: getattr(result, f) for f in result.__dataclass_fields__}, "min_effect": 0.3})
    assert all(c.min_effect == 0.3 and c.verdict != "faster" for c in stricter.comparisons_at(1))
    again = len(calls)
    assert again > family
    stricter.comparisons_at(4), stricter.comparisons_at(16)
    assert len(calls) == again  # the family was computed once, for every level


def test_cached_comparisons_are_the_computed_ones() -> None:
    result = _three_level_result()
    fresh = ABResult(**{f: getattr(result, f) for f in result.__dataclass_fields__})
    for level in (16, 4, 1):  # asked in another order: the same family, the same comparisons
        assert result.comparisons_at(level) == fresh.comparisons_at(level)
    assert result.comparisons_at() == result.comparisons_at(1) and result.comparisons == result.comparisons_at(1)
    result.comparisons_at(1).clear()  # a caller's list is its own
    assert len(result.comparisons_at(1)) == 2
