"""Small inputs orch used to take silently or answer wrongly: each is refused with a reason, or said right."""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from orchestrator.agent import ops
from orchestrator.agent.processes import MARKER, PROFILE
from orchestrator.cli import main
from orchestrator.cli.launches import ANOTHER_STORE, summarize, table
from orchestrator.client import runner
from orchestrator.config import profile as P
from orchestrator.config.workload import BenchConfig
from orchestrator.errors import InputError
from orchestrator.launch import single
from orchestrator.nightly import night
from orchestrator.nightly import suite as suite_mod
from orchestrator.results.run import RunResult
from orchestrator.results.store import Store, default_path
from orchestrator.ui import progress
from orchestrator.ui.events import Lines
from tests.conftest import NAMESPACE, WriteProfile
from tests.faults.test_client_faults import OK_HEAD, Loopback, gen_event
from tests.nightly.test_nightly import sim_profile, write_suite
from tests.wires import wire

Capsys = pytest.CaptureFixture[str]


def _refused(capsys: Capsys, rc: int, *needles: str) -> str:
    out, err = capsys.readouterr()
    assert rc == 2, out + err
    assert "Traceback" not in err and "Error: unexpected" not in err, err
    for needle in needles:
        assert needle in err, err
    return out


# ---------------------------------------------------------------- --db ""


@pytest.mark.parametrize("command", [["list"], ["show", "last"], ["ab", "a", "b", "--sim"], ["history", "x"]])
def test_an_empty_db_option_is_refused_not_read_as_the_default_store(capsys: Capsys, command: list[str]) -> None:
    Store().close()  # the default store exists: it must not be what an empty --db reads
    before = default_path().stat().st_mtime_ns
    rc = main([*command, "--db", ""])
    _refused(capsys, rc, "--db", "empty", "SQLite results file")
    assert default_path().stat().st_mtime_ns == before


# ---------------------------------------------------------------- ORCH_DB_BUSY_TIMEOUT_S


@pytest.mark.parametrize("value", ["abc", "-1", "nan", "inf", "1e9"])
def test_an_invalid_busy_timeout_is_refused_naming_the_variable(
    capsys: Capsys, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, value: str
) -> None:
    db = tmp_path / "r.db"
    Store(db).close()
    monkeypatch.setenv("ORCH_DB_BUSY_TIMEOUT_S", value)
    rc = main(["list", "--db", str(db)])
    _refused(capsys, rc, f"ORCH_DB_BUSY_TIMEOUT_S={value!r}", "non-negative number of seconds")
    # Nothing created either: the variable is checked before the file (or its directory) is.
    with pytest.raises(InputError, match="ORCH_DB_BUSY_TIMEOUT_S"):
        Store(tmp_path / "new" / "r.db")
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("value", ["0", "2.5", ""])
def test_a_valid_or_empty_busy_timeout_is_taken(
    capsys: Capsys, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, value: str
) -> None:
    db = tmp_path / "r.db"
    Store(db).close()
    monkeypatch.setenv("ORCH_DB_BUSY_TIMEOUT_S", value)
    assert main(["list", "--db", str(db)]) == 0, capsys.readouterr()


# ---------------------------------------------------------------- an inventory of invalid groups only


@pytest.mark.parametrize(
    ("group", "field"),
    [
        ("{nodes: [gpu-a, gpu-b]}", "hosts.pair.nodes: 'gpu-a' is not a host of this inventory (its hosts: none)"),
        ("{nodes: []}", "hosts.pair.nodes: a group needs at least one host"),
        ("{nodes: [gpu-a], port_stride: -1}", "hosts.pair.port_stride"),
    ],
)
@pytest.mark.parametrize("how", ["--inventory", "ORCH_HOSTS"])
def test_an_inventory_of_only_invalid_groups_is_refused(
    capsys: Capsys, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, group: str, field: str, how: str
) -> None:
    inv = tmp_path / "hosts.yaml"
    inv.write_text(f"hosts:\n  pair: {group}\n")
    if how == "ORCH_HOSTS":
        monkeypatch.setenv("ORCH_HOSTS", str(inv))
        rc = main(["hosts", "list"])
    else:
        rc = main(["hosts", "list", "--inventory", str(inv)])
    out = _refused(capsys, rc, str(inv), field)
    assert "no host inventory found" not in out


# ---------------------------------------------------------------- nightly --json on an invalid suite


def test_nightly_json_says_why_an_invalid_suite_was_refused(capsys: Capsys, tmp_path: Path) -> None:
    suite = tmp_path / "suite.yaml"
    suite.write_text("suite: s\nitems: nope\n")
    for extra in ([], ["--check"]):
        rc = main(["nightly", str(suite), "--json", *extra])
        out = _refused(capsys, rc)  # the document says why; stderr does not repeat it
        doc = json.loads(out)
        assert doc["status"] == "error" and doc["exit_code"] == 2 and str(suite) in doc["error"]
    rc = main(["nightly", str(tmp_path / "missing.yaml"), "--json"])
    doc = json.loads(_refused(capsys, rc))
    assert doc["status"] == "error" and "missing.yaml" in doc["error"]


def test_history_json_says_why_too(capsys: Capsys, tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    Store(db).close()
    rc = main(["history", "nope", "--db", str(db), "--json"])
    doc = json.loads(_refused(capsys, rc))
    assert doc == {"status": "error", "error": doc["error"], "exit_code": 2} and "'nope'" in doc["error"]
    assert "no nightly history" in doc["error"]


# ---------------------------------------------------------------- durations


def test_a_short_deadline_is_said_in_seconds_not_as_zero_minutes(write_profile: WriteProfile, tmp_path: Path) -> None:
    sim_profile(write_profile, "check")
    path = write_suite(tmp_path, [{"name": "check", "bench": "check", "host": "local"}], deadline="25s")
    events: list[str] = []
    store = Store(tmp_path / "n.db")
    try:
        night.NightRunner(
            suite=suite_mod.load(str(path)),
            store=store,
            night_at=time.time(),
            events=Lines(events.append),
            only=("none",),
        ).run()
    finally:
        store.close()
    line = next(e for e in events if "deadline" in e)
    assert "deadline 25s," in line and "0 min" not in line, line
    assert [progress.duration(s) for s in (25, 90, 7200)] == ["25s", "1m30s", "2h00m"]


# ---------------------------------------------------------------- a stalled run's line


def test_a_stalled_run_says_it_failed_and_how_long_it_really_took() -> None:
    srv = Loopback()
    calls = [0]

    def handle(conn: socket.socket, line: bytes) -> None:
        calls[0] += 1
        if calls[0] == 1:  # a stream that goes silent after two tokens; the other request completes
            conn.sendall(OK_HEAD + gen_event(1) + gen_event(2))
            conn.settimeout(30)
            with contextlib.suppress(OSError):
                conn.recv(1)
        else:
            conn.sendall(OK_HEAD + gen_event(1) + gen_event(2, final=True) + b"data: [DONE]\n\n")

    srv.handler = handle
    try:
        for n in (1, 2):
            calls[0] = 0
            summary = runner.run(
                "127.0.0.1", srv.port, wire("generate"), [{"text": "x"}] * n, [2] * n, n, 30.0, stall_s=1.0
            )
            # The run lasted until the stalled request was given up, not until its last token.
            assert summary["seconds"] >= 1.0, summary
            run = RunResult.from_summary(0, False, summary)
            line = progress.run_line(run, BenchConfig(runs=3))
            assert line.startswith(f"  Run 1/3{' @ 2 streams' if n == 2 else ''}: FAILED after "), line
            assert f"{summary['seconds']:.2f}s" in line and "stalled: no token for 1s after 2 tokens" in line, line
    finally:
        srv.close()


# ---------------------------------------------------------------- orch status and another store's launches


def test_status_names_the_profile_of_a_launch_another_store_recorded(tmp_path: Path) -> None:
    launch_id = f"{NAMESPACE}:20260101T000000-abcdef"
    env = {**os.environ, MARKER: launch_id, PROFILE: "eagle3"}
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    try:
        deadline = time.monotonic() + 30
        while not (found := ops.op_find(NAMESPACE)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [p["profile"] for p in found] == ["eagle3"]
        # Not in this store: the launch's own name; nameless too (an older orch): said so, not "?".
        assert summarize(found, {})[0]["profile"] == "eagle3"
        nameless = [{**p, "profile": None} for p in found]
        assert summarize(nameless, {})[0]["profile"] == ANOTHER_STORE
        assert ANOTHER_STORE in table(summarize(nameless, {}))[1]
        # The store's own record wins; a store that could not be read leaves it unknown.
        assert summarize(nameless, {launch_id: "baseline"})[0]["profile"] == "baseline"
        assert summarize(nameless, None)[0]["profile"] is None
    finally:
        proc.kill()
        proc.wait()


def test_a_launch_carries_its_profile_name(write_profile: WriteProfile, tmp_path: Path) -> None:
    profile = P.load(str(sim_profile(write_profile, "named")))
    sent: dict[str, Any] = {}

    def call(op: str, **kw: Any) -> dict[str, Any]:
        sent.update(kw)
        return {"pid": 1, "pgid": 1, "started_at": 0.0}

    host: Any = SimpleNamespace(python=sys.executable, sim_pythonpath=None, workdir=str(tmp_path), call=call)
    launched = single.launch(host, profile, simulate=True, namespace=NAMESPACE)
    assert sent["env"][PROFILE] == "named" and launched.env[PROFILE] == "named"


# ---------------------------------------------------------------- an ambiguous id prefix


def test_an_ambiguous_id_prefix_is_a_usage_error_listing_the_matches(capsys: Capsys, tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    store = Store(db)
    ids = [f"20261129-{i}" for i in range(2, 14)]
    for exp_id in ids:
        store.create_experiment(
            exp_id, kind="ab", simulated=True, host="local", arms=["a", "b"], config={}, orch_version="t"
        )
    store.close()
    rc = main(["show", "20261129-1", "--db", str(db)])  # -10 to -13
    _refused(capsys, rc, "'20261129-1' matches several experiments", "20261129-10", "20261129-11", "give more")
    rc = main(["show", "2026", "--db", str(db)])
    _refused(capsys, rc, "and 2 more")
    store = Store(db)
    try:
        with pytest.raises(InputError, match="matches several"):  # what every caller of find_experiment gets
            store.find_experiment("2026")
    finally:
        store.close()


# ---------------------------------------------------------------- one duration syntax


TIME_OPTIONS = {
    ("ab",): ("--duration", "--min-run-s", "--stall-timeout", "--first-token-timeout", "--ready-timeout", "--grace",
              "--wait", "--gpu-wait"),
    ("bench",): ("--duration", "--stall-timeout", "--grace", "--wait"),
    ("reproduce",): ("--ready-timeout", "--grace", "--gpu-wait"),
    ("down",): ("--grace",),
}  # fmt: skip


@pytest.mark.parametrize(("command", "option"), [(c, o) for c, opts in TIME_OPTIONS.items() for o in opts])
def test_every_option_that_takes_a_time_takes_units(command: tuple[str, ...], option: str) -> None:
    """`--duration 30s` was refused ("not a valid finite float") while a suite's `deadline: 3h` and `--slo
    ttft_p99=500ms` took units: every time orch reads is seconds, or a duration with units (fields.seconds_of)."""
    import click

    from orchestrator.cli.base import cli
    from orchestrator.cli.lazy import LazyGroup

    assert isinstance(cli, LazyGroup)
    cmd = cli.get_command(click.Context(cli), command[0])
    assert cmd is not None
    param = next(p for p in cmd.params if option in p.opts)
    convert = param.type.convert
    assert convert("30s", param, None) == 30.0 and convert("1500ms", param, None) == 1.5
    assert convert("2.5", param, None) == 2.5 and convert(10, param, None) == 10.0
    assert convert("1m30s", param, None) == 90.0


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--rate", "1", "--duration", "30x"], "Invalid value for '--duration': expected a duration from 1ms to 1d: "
         "seconds as a number (30, 2.5) or with units (500ms, 30s, 5m, 3h, 1h30m), got '30x'"),
        # The examples are within the option's range: 2d is refused by --duration, so it is no example of it.
        (["--rate", "1", "--duration", "2d"], "'--duration': expected a duration from 1ms to 1d: seconds as a number "
         "(30, 2.5) or with units (500ms, 30s, 5m, 3h, 1h30m), got '2d'"),
        (["--stall-timeout", "nan"], "'--stall-timeout': expected a duration from 500ms to 1d"),
        (["--grace", "30s5m"], "'--grace': expected a duration from 0s to 10m: seconds as a number (30, 2.5) or with "
         "units (500ms, 30s, 5m), got '30s5m'"),
        (["--ready-timeout", "500ms"], "'--ready-timeout': expected a duration from 1s to 1d: seconds as a number "
         "(30, 2.5) or with units (30s, 5m, 3h, 1h30m), got '500ms'"),
    ],
)  # fmt: skip
def test_a_bad_duration_is_refused_naming_the_option_and_the_forms(
    args: list[str], needle: str, capsys: Capsys
) -> None:
    _refused(capsys, main(["ab", "no-such-a", "no-such-b", "--sim", *args]), needle)


def test_a_duration_with_units_is_taken_by_the_cli_a_suite_and_an_slo(capsys: Capsys, tmp_path: Path) -> None:
    from orchestrator.config.slo import parse_slo
    from orchestrator.fields import seconds_of

    # Accepted: the refusal that follows is the missing profile's, after the options were read.
    _refused(capsys, main(["ab", "no-such-a", "no-such-b", "--sim", "--rate", "1", "--duration", "30s"]), "no-such-a")
    assert [seconds_of(v) for v in ("30", "2.5", "500ms", "30s", "5m", "3h", "1h30m", "1d2h", " 2 M ", 45)] == [
        30.0, 2.5, 0.5, 30.0, 300.0, 10800.0, 5400.0, 93600.0, 120.0, 45.0,
    ]  # fmt: skip
    assert [seconds_of(v) for v in ("30s5m", "1m1m", "nan", "inf", "-5s", "5 minutes", "", True, None)] == [None] * 9
    assert parse_slo("ttft_p99=500ms,e2e_p99=1m30s").limit("e2e") == 90.0
    assert suite_mod.duration("1h30m") == 5400.0 and suite_mod.WORKLOAD_FIELDS["duration"]("500ms") == 0.5
    with pytest.raises(Exception, match=r"expected a duration from 1s to 7d: seconds as a number"):
        suite_mod.duration("500ms")


def test_an_slo_limit_carries_its_unit_and_is_refused_in_the_one_wording(capsys: Capsys) -> None:
    """`--slo` refused `ttft_p99=0.5` ("the limit needs a unit") and worded its range its own way ("must be more
    than 0 and at most 86400 s"), while docs said it took 30 and 2.5. An SLO limit carries its unit (a bare 500 is
    500 ms to vLLM's --goodput and 500 s to orch), and every refusal is fields.seconds' wording, with examples a
    limit may be and, for a bare number, why it is refused."""
    from orchestrator.config.slo import parse_slo
    from orchestrator.errors import InputError

    forms = "expected a duration from 1ms to 1d: a number with units (500ms, 30s, 5m, 3h, 1h30m)"
    for value in ("500", "0.5"):
        with pytest.raises(InputError) as e:
            parse_slo(f"ttft_p99={value}")
        assert str(e.value) == (
            f"--slo: 'ttft_p99={value}': {forms}, got '{value}'; a bare number is refused: vLLM's --goodput reads "
            f"{value} as milliseconds, orch's durations as seconds: write {value}ms or {value}s"
        )
    for value in ("0ms", "-5ms", "2d", "5 minutes"):
        with pytest.raises(InputError) as e:
            parse_slo(f"e2e={value}")
        assert str(e.value) == f"--slo: 'e2e={value}': {forms}, got '{value}'"
    _refused(capsys, main(["ab", "a", "b", "--sim", "--slo", "tpot_p99=50"]), f"'tpot_p99=50': {forms}, got '50'")


def _shown_examples(text: str) -> list[str]:
    """The durations a help text or a message shows: the range's ends and the items of every parenthesised list."""
    from orchestrator.fields import seconds_of

    ends = [end for pair in re.findall(r"from (\S+) to (\S+?):", text) for end in pair]
    items = [item.strip() for group in re.findall(r"\(([^()]*)\)", text) for item in group.split(",")]
    return [*ends, *(item for item in items if seconds_of(item) is not None)]


def _commands() -> list[tuple[str, Any]]:
    import click

    from orchestrator.cli.base import cli

    out: list[tuple[str, Any]] = []

    def walk(group: click.Group, path: str) -> None:
        ctx = click.Context(group)
        for name in group.list_commands(ctx):
            cmd = group.get_command(ctx, name)
            if isinstance(cmd, click.Group):
                walk(cmd, f"{path} {name}")
            elif cmd is not None:
                out.append((f"{path} {name}".strip(), cmd))

    walk(cli, "")
    return out


def test_every_duration_an_options_help_or_refusal_shows_is_one_that_option_takes() -> None:
    """Help and errors showed values their own option refuses: --ready-timeout's 500ms (from 1s), --grace's 1h30m
    (at most 10m), --gpu-wait's 1h30m (at most 1h), --duration's refusal listing 2d (at most 1d). Each option's
    examples are derived from its range: every one shown is parsed here with that option's own parser."""
    import click

    from orchestrator.cli.base import Seconds
    from orchestrator.cli.options import slo_help
    from orchestrator.config.slo import LIMIT, parse_slo
    from orchestrator.errors import InputError

    checked = 0
    for name, cmd in _commands():
        for param in cmd.params:
            if not isinstance(param.type, Seconds):
                continue
            with pytest.raises(click.BadParameter) as refused:
                param.type.convert("soon", param, None)
            help_shown, error_shown = _shown_examples(param.help or ""), _shown_examples(str(refused.value))
            assert len(help_shown) >= 2 and len(error_shown) >= 4, (name, param.opts, param.help, refused.value)
            for example in (*help_shown, *error_shown):
                param.type.convert(example, param, None)  # raises for one the option refuses
                checked += 1
    assert checked > 100
    # --slo: its help's objectives and limits, and those its refusal shows.
    slos = re.findall(r"\b(?:ttft|tpot|e2e)_p\d+=[^ ,;)]+(?:,(?:ttft|tpot|e2e)_p\d+=[^ ,;)]+)*", slo_help())
    assert slos and all(parse_slo(s) for s in slos)
    limits = re.findall(r"with its unit: ([^;]*);", slo_help())[0].split(", ")
    assert limits and all(LIMIT(v) for v in limits)
    with pytest.raises(InputError) as refused:
        parse_slo("ttft=soon")
    assert all(LIMIT(v) for v in _shown_examples(str(refused.value)))
    # A suite's times: every field that takes one shows what it takes.
    for fields in (suite_mod.WORKLOAD_FIELDS, suite_mod.ITEM_FIELDS, suite_mod.TOP_FIELDS):
        for field, check in fields.items():
            try:
                check("soon")
            except Exception as e:
                if "expected a duration" in str(e):
                    assert all(check(v) is not None for v in _shown_examples(str(e))), field


# ---------------------------------------------------------------- refusals name what the user typed


def test_a_workload_refusal_names_the_option_or_field_the_user_gave() -> None:
    """The plan's checks named the workload's internal fields (`requests_per_level`) whoever gave them: orch ab's
    refusal names its option (--requests), a suite's its field (requests), a bundle's its JSON path."""
    from orchestrator.config import limits

    bench = BenchConfig(rate=(1.0,), requests_per_level=200_000)
    profile = P.from_resolved({"name": "p", "engine": "sglang", "model_path": "/m", "port": 1, "tp_size": 1}, "test")
    for names, field in ((limits.OPTIONS, "--requests"), (limits.SUITE_NAMES, "requests")):
        with pytest.raises(limits.PlanError) as e:
            limits.checked_plan(bench, [profile], blocks=1, sim=False, names=names)
        assert str(e.value).startswith(f"{field}: expected a whole number from 1 to 100,000, got 200000"), e.value
    with pytest.raises(limits.PlanError, match=r"^content\.config\.bench\.requests_per_level: expected"):
        limits.check_workload(bench, "content.config.bench.")
    with pytest.raises(limits.PlanError, match=r"^--duration, --requests: an open-loop workload gives exactly one"):
        limits.checked_plan(BenchConfig(rate=(1.0,)), [profile], blocks=1, sim=False)


def test_a_suites_plan_refusal_names_the_suites_fields(write_profile: WriteProfile, tmp_path: Path) -> None:
    """A suite's workload over the plan's limits was refused with orch ab's options ("lower --runs, --rate,
    --duration or --requests"): it names the suite's fields, as its other refusals do."""
    sim_profile(write_profile, "check")
    work = {"rate": [1000], "duration": "1d", "runs": 2}
    path = write_suite(tmp_path, [{"name": "load", "bench": "check", "host": "local", "sim": True, "workload": work}])
    with pytest.raises(suite_mod.SuiteError) as e:
        suite_mod.load(str(path))
    said = str(e.value)
    assert "item 'load': workload: about " in said and "lower runs, rate, duration or requests" in said, said
    assert "--" not in said, said
    closed = {"runs": 10_000, "concurrency": [64], "requests_per_stream": 10}
    path = write_suite(tmp_path, [{"name": "c", "bench": "check", "host": "local", "sim": True, "workload": closed}])
    with pytest.raises(suite_mod.SuiteError, match=r"lower runs, concurrency or requests_per_stream$"):
        suite_mod.load(str(path))
    short = {"rate": [16], "requests": 4, "min_run_s": 1}  # due within 0.25 s: every run too short
    path = write_suite(tmp_path, [{"name": "s", "bench": "check", "host": "local", "sim": True, "workload": short}])
    with pytest.raises(
        suite_mod.SuiteError, match=r"under min_run_s 1s, .* raise duration \(or requests\) or lower min_run_s$"
    ):
        suite_mod.load(str(path))


def test_a_trace_replays_plan_refusal_names_what_shortens_a_replay() -> None:
    """Over the requests a launch may send, a trace's plan said "rate x --duration ... lower --rate, --duration",
    options a trace refuses; it names --runs and --requests N."""
    from orchestrator.config.plan import plan
    from orchestrator.config.traces import TraceRequest

    bench = BenchConfig(runs=2000, warmup=0, rate=(1.0,), requests_per_level=100, trace="t.jsonl")
    lines = [TraceRequest(timestamp_ms=i, input_length=1, output_length=1, hash_ids=()) for i in range(100)]
    refusal = plan(bench, [], blocks=1, calibrated=False, trace=lines).refusal()
    assert refusal is not None and "(warmups + runs x the trace's requests)" in refusal
    assert "lower --runs, or replay the trace's first N requests (--requests N)" in refusal and "--rate" not in refusal


def test_a_dataset_refusal_is_all_that_is_printed(
    capsys: Capsys, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plan line and the --min-run-s WARNING came before a bad dataset's refusal, as if the run were going
    ahead: the inputs are checked first, so the refusal is the only output."""
    from orchestrator.errors import OrchError
    from orchestrator.experiment import run

    def launched(*_: object, **__: object) -> None:
        raise OrchError("stopped where it would launch")

    monkeypatch.setattr(run, "execute", launched)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "hi"}\n{"prompt": 5}\n')
    args = ["ab", "baseline", "sim-eagle3-fast", "--sim", "--min-run-s", "1h", "--db", str(tmp_path / "r.db")]
    out = _refused(capsys, main([*args, "--prompts", str(bad)]), f"{bad}:2")
    assert out == ""
    # A good one: the plan and the warning, as before.
    good = tmp_path / "good.jsonl"
    good.write_text('{"prompt": "hi"}\n')
    assert main([*args, "--prompts", str(good)]) == 1
    out, err = capsys.readouterr()
    assert "stopped where it would launch" in err
    assert "plan (--blocks auto): " in out and "WARNING: by the simulator's calibration" in err
