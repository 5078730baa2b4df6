"""`--sweep auto`: the spec and the rates (pure), the refusals (exit 2), and a short simulated sweep end to end: a
probe experiment stored on its own, rates spread from the slowest synchronous to the fastest saturated rate, per-level
verdicts, the crossover, and the sweep recorded in every report format and in a bundle."""

from __future__ import annotations

import io
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.cli import main
from orchestrator.config import arrivals
from orchestrator.config.options import RunOptions
from orchestrator.config.sweep import DEFAULT_LEVELS, THROUGHPUT_CONCURRENCY, Sweep, parse
from orchestrator.config.workload import BenchConfig
from orchestrator.errors import OrchError
from orchestrator.experiment import run as experiment
from orchestrator.experiment.sweep import rates_between, rounded, saturated_rate, synchronous_rate
from orchestrator.results import bundleformat
from orchestrator.results.run import RunResult
from orchestrator.ui.progress import PlainReporter
from tests.conftest import FAST_SIM, free_port

Capsys = pytest.CaptureFixture[str]


def test_the_spec_parses_auto_and_auto_n_and_says_what_is_valid() -> None:
    assert parse("auto") == DEFAULT_LEVELS and parse("AUTO:3") == 3 and parse(f"auto:{arrivals.MAX_LEVELS}") > 3
    for bad in ("auto:1", "auto:x", f"auto:{arrivals.MAX_LEVELS + 1}", "sweep", "auto:"):
        with pytest.raises(ValueError, match="auto"):
            parse(bad)


def test_rates_run_evenly_from_the_lowest_to_the_highest_rounded_and_distinct() -> None:
    assert rates_between(1.27, 24.5, 4) == (1.27, 9.01, 16.8, 24.5)
    assert rates_between(2.0, 2.0, 5) == (2.0,)  # nothing between: one level
    assert rates_between(0.1, 0.1004, 3) == (0.1,)
    assert all(r <= arrivals.MAX_RATE for r in rates_between(1, 1e6, 3))
    assert rounded(123456.0) == 123000.0 and rounded(0.012345) == 0.0123


def test_the_probe_measures_closed_loop_and_the_levels_run_open_loop_with_the_stop() -> None:
    bench = BenchConfig(runs=5, warmup=3, max_tokens=64, seed=7)
    spec = Sweep(levels=3, arrivals="gamma:2", duration_s=5.0, max_concurrency=8)
    probe = spec.probe_bench(bench)
    assert probe.concurrency == (1, 8) and probe.runs == 2 and probe.warmup == 2 and not probe.open_loop
    assert probe.seed == 7 and probe.max_tokens == 64  # the sweep's own requests
    assert probe.min_run_s == 0 and spec.swept_bench(bench, (1.0,)).min_run_s == bench.min_run_s
    assert Sweep().concurrency == THROUGHPUT_CONCURRENCY and Sweep(max_concurrency=1).probe_bench(
        bench
    ).concurrency == (1,)
    swept = spec.swept_bench(bench, (1.0, 2.0))
    assert swept.rate == (1.0, 2.0) and swept.arrivals == "gamma:2" and swept.duration_s == 5.0
    assert swept.stop_oversaturated and swept.max_concurrency == 8 and swept.runs == 5
    assert swept.to_dict()["stop_oversaturated"] is True
    assert "stop_oversaturated" not in BenchConfig(rate=(1.0,), duration_s=1.0).to_dict()  # digests unchanged


def _run(requests: int, seconds: float, aggregate: float, valid: bool = True) -> RunResult:
    return RunResult(
        index=0,
        warmup=False,
        tokens=requests * 64,
        seconds=seconds,
        tok_s=0.0,
        prompt_tokens=10,
        ttft_s=0.1,
        requests=requests,
        aggregate_tok_s=aggregate,
        valid=valid,
    )


def test_synchronous_and_saturated_rates_from_runs() -> None:
    assert synchronous_rate([_run(2, 1.0, 0), _run(2, 2.0, 0), _run(2, 0.1, 0, valid=False)]) == pytest.approx(1.5)
    assert saturated_rate([_run(64, 3.0, 640.0), _run(64, 3.0, 1280.0)], 64) == pytest.approx(15.0)
    assert synchronous_rate([]) is None and saturated_rate([_run(1, 1, 0)], 64) is None


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--sweep", "auto", "--rate", "1,2"], "--rate excludes it"),
        (["--sweep", "auto", "--concurrency", "4"], "--concurrency excludes it"),
        (["--sweep", "auto", "--duration", "5", "--requests", "9"], "--duration and --requests exclude each other"),
        (["--sweep", "auto:1"], "N in auto:N must be a whole number from 2"),
        (["--sweep", "everything"], "expected auto or auto:N"),
    ],
)
def test_bad_sweep_options_exit_2_before_anything_starts(
    args: list[str], message: str, capsys: Capsys, tmp_path: Path
) -> None:
    assert main(["ab", "baseline", "sim-eagle3-fast", "--sim", "--db", str(tmp_path / "r.db"), *args]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert message in err and "experiment" not in err


# ---------------------------------------------------------------- one short simulated sweep, shared


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Any, Path]]:
    """base vs spec: baseline and sim-eagle3-fast, fast to load,, --sweep auto:3, 2 blocks: (db, the result, root)."""
    root = tmp_path_factory.mktemp("sweep")
    paths = []
    for file, name, extra in (
        ("base", "baseline", {}),
        ("spec", "sim-eagle3-fast", {"verify_base_ms": 14.0, "accept_alpha": 0.7}),
    ):
        path = root / f"{file}.yaml"
        sim = {**FAST_SIM, "load_s": 0.1, **extra}
        path.write_text(yaml.safe_dump({"extends": name, "sim": sim, "port": free_port()}))
        paths.append(str(path))
    db = root / "r.db"
    options = RunOptions(
        profiles=tuple(paths),
        sim=True,
        blocks=2,
        runs=1,
        warmup=0,
        max_tokens=16,
        min_run_s=0,
        grace=2,
        gpu_wait=0,
        sweep=3,
        max_concurrency=8,
        duration=1.0,
        db=str(db),
        workdir=str(root / "work"),
        given=frozenset({"sweep", "duration", "max_concurrency"}),
    )
    out = io.StringIO()
    outcome = experiment.run(options, reporter=PlainReporter(out), warn=lambda line: None)
    (root / "progress.txt").write_text(out.getvalue())
    yield db, outcome.result, root


def test_the_probe_is_its_own_experiment_and_the_rates_come_from_it(swept: tuple[Path, Any, Path]) -> None:
    db, result, root = swept
    sweep = result.sweep
    assert sweep is not None and sweep["concurrency"] == 8 and len(sweep["rates"]) == 3
    sync, sat = sweep["synchronous"], sweep["saturated"]
    assert set(sync) == set(sat) == {"base", "spec"}
    assert sweep["rates"][0] == min(sync.values()) and sweep["rates"][-1] == max(sat.values())
    assert [float(level) for level in result.levels] == sweep["rates"]
    progress = root / "progress.txt"
    said = " ".join(progress.read_text().split())
    assert "sweep: probing each arm at concurrency 1 and 8" in said and f"experiment {sweep['probe']}" in said
    # the probe's runs counted as its own (2 per level), the sweep's as the experiment's (--runs 1)
    assert "Run 2/2 @ 8 streams" in said and f"Run 1/1 @ {sweep['rates'][0]:g} req/s" in said
    # The probe is one block by design (the levels here are two): nothing tells the user to give it more.
    assert "cannot separate restart noise" not in said and "--blocks 3+" not in said, said
    from orchestrator.results.store import Store

    store = Store(str(db))
    try:
        probe = store.find_experiment(sweep["probe"])
        assert probe["status"] == "complete"
        # What the sweep was asked for, stored with the probe: a resume from it runs the rate levels as asked.
        asked = json.loads(probe["config_json"])["sweep_probe"]
        assert asked["levels"] == 3 and asked["max_concurrency"] == 8 and asked["duration_s"] == 1.0
        assert asked["blocks"] == 2 and asked["bench"]["runs"] == 1
        assert json.loads(probe["config_json"])["bench"]["concurrency"] == [1, 8]
    finally:
        store.close()
    import contextlib

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["list", "--db", str(db)]) == 0
    (line,) = [line for line in out.getvalue().splitlines() if line.startswith(sweep["probe"])]
    assert line.endswith("SIMULATED SWEEP PROBE")


def test_every_level_has_its_verdict_and_the_crossover_is_stated(swept: tuple[Path, Any, Path], capsys: Capsys) -> None:
    db, result, _ = swept
    assert all(len(result.comparisons_at(level)) == 1 for level in result.levels)
    assert all(c.verdict for level in result.levels for c in result.comparisons_at(level))
    capsys.readouterr()
    assert main(["show", result.experiment_id, "--db", str(db)]) == 0
    text = " ".join(capsys.readouterr().out.split())
    rates = ", ".join(f"{r:g}" for r in result.sweep["rates"])
    assert f"levels from --sweep auto: rates {rates} req/s, from probe experiment {result.sweep['probe']}" in text
    assert "crossover: spec vs base" in text
    assert main(["show", result.experiment_id, "--db", str(db), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["sweep"]["rates"] == result.sweep["rates"] and doc["crossovers"]
    assert main(["export", result.experiment_id, "--db", str(db), "--format", "md"]) == 0
    assert "levels from --sweep auto: rates" in capsys.readouterr().out


def test_a_bundle_of_the_sweep_carries_its_rates_the_stop_and_the_probe(
    swept: tuple[Path, Any, Path], capsys: Capsys, tmp_path: Path
) -> None:
    db, result, _ = swept
    out = tmp_path / "sweep.orch.json"
    assert main(["export", result.experiment_id, "--db", str(db), "--format", "bundle", "-o", str(out)]) == 0
    config = bundleformat.read_bundle(out)["content"]["config"]
    # A reproduction runs these rates again as they are (the bench it plans from), with no probe of its own.
    assert config["bench"]["rate"] == result.sweep["rates"] and config["bench"]["stop_oversaturated"] is True
    assert config["sweep"]["probe"] == result.sweep["probe"]
    capsys.readouterr()
    assert main(["show", str(out)]) == 0
    assert "levels from --sweep auto: rates" in capsys.readouterr().out


# ---------------------------------------------------------- an interrupted sweep, resumed whole (issue 34, item 15)


class CtrlC(PlainReporter):
    """Progress lines as usual, and Ctrl-C (KeyboardInterrupt) at one point of a sweep: during the probe (its first
    run at the saturating concurrency), between the probe and the rate levels (the line giving the rates found), or
    during the rate levels (their first run)."""

    def __init__(self, out: io.StringIO, where: str) -> None:
        super().__init__(out)
        self.where, self.pressed = where, False

    def press(self, now: bool) -> None:
        if now and not self.pressed:
            self.pressed = True
            raise KeyboardInterrupt

    def line(self, msg: str) -> None:
        super().line(msg)
        self.press(self.where == "between" and msg.startswith("sweep: ") and "; rates " in msg)

    def run(self, name: str, run: RunResult) -> None:
        super().run(name, run)
        if not run.warmup:
            probing, leveling = run.concurrency > 1, bool(run.rate)
            self.press((self.where == "probe" and probing) or (self.where == "levels" and leveling))


@pytest.mark.slow
@pytest.mark.parametrize("where", ["probe", "between", "levels"])
def test_an_interrupted_sweep_resumes_whole_probe_then_levels(tmp_path: Path, where: str) -> None:
    paths = []
    for file, name in (("base", "baseline"), ("spec", "sim-eagle3-fast")):
        path = tmp_path / f"{file}.yaml"
        path.write_text(yaml.safe_dump({"extends": name, "sim": {**FAST_SIM, "load_s": 0.1}, "port": free_port()}))
        paths.append(str(path))
    db = tmp_path / "r.db"
    options = RunOptions(
        profiles=tuple(paths), sim=True, blocks=1, runs=1, warmup=0, max_tokens=8, min_run_s=0, grace=2, gpu_wait=0,
        sweep=2, max_concurrency=4, duration=0.5, db=str(db), workdir=str(tmp_path / "work"),
        given=frozenset({"sweep", "duration", "max_concurrency"}),
    )  # fmt: skip
    out = io.StringIO()
    with pytest.raises(KeyboardInterrupt):
        experiment.run(options, reporter=CtrlC(out, where), warn=lambda line: None)
    said = " ".join(out.getvalue().split())
    hint = re.search(r"continue it with: orch ab --resume (\S+)", said)
    assert hint is not None, said  # what to type next is always said
    resumed = experiment.run(
        RunOptions(resume=hint.group(1), db=str(db), grace=2, gpu_wait=0, given=frozenset({"resume"})),
        reporter=PlainReporter(io.StringIO()),
        warn=lambda line: None,
    ).result
    # The whole sweep ran: the probe complete, then the rate levels it found, never just the probe.
    sweep = resumed.sweep
    assert sweep is not None and resumed.experiment_id != sweep["probe"]
    assert [float(level) for level in resumed.levels] == sweep["rates"] and len(sweep["rates"]) == 2
    assert all(resumed.comparisons_at(level) for level in resumed.levels)
    from orchestrator.results.store import Store

    store = Store(str(db))
    try:
        rows = store.query("SELECT id, status, config_json FROM experiments")
    finally:
        store.close()
    statuses = {r["id"]: r["status"] for r in rows}
    assert statuses[sweep["probe"]] == "complete" and statuses[resumed.experiment_id] == "complete"
    assert len(statuses) == 2  # one probe, one levels' experiment: a resume never starts the sweep over
    probe = next(json.loads(r["config_json"]) for r in rows if r["id"] == sweep["probe"])
    assert probe["sweep_probe"] and probe["bench"]["concurrency"] == [1, 4]
    # The probe's id leads to the levels' experiment too: complete now, so there is nothing to resume.
    with pytest.raises(OrchError, match=f"experiment {resumed.experiment_id} is already complete"):
        experiment.run(
            RunOptions(resume=sweep["probe"], db=str(db), given=frozenset({"resume"})),
            reporter=PlainReporter(io.StringIO()),
            warn=lambda line: None,
        )


def test_a_probe_stored_without_the_sweeps_settings_is_refused_not_finished_alone() -> None:
    from orchestrator.experiment.resume import resumed_sweep

    with pytest.raises(OrchError, match="never run its rate levels; start the sweep again"):
        resumed_sweep({"id": "20261201-000000-abcdef"}, {"sweep_probe": True}, RunOptions())


def test_a_sweep_with_no_range_says_so_and_announces_no_levels_it_will_not_run(tmp_path: Path, capsys: Capsys) -> None:
    # --max-concurrency 1: one request in flight, so the synchronous rate is also the highest; once "sweep: 5 rate
    # levels" was announced, one level ran, every run client-limited, and nothing said there was no range.
    paths = []
    for file, name in (("base", "baseline"), ("spec", "sim-eagle3-fast")):
        path = tmp_path / f"{file}.yaml"
        path.write_text(yaml.safe_dump({"extends": name, "sim": {**FAST_SIM, "load_s": 0.1}, "port": free_port()}))
        paths.append(str(path))
    db = tmp_path / "r.db"
    options = RunOptions(
        profiles=tuple(paths),
        sim=True,
        blocks=2,
        runs=1,
        warmup=0,
        max_tokens=8,
        min_run_s=0,
        grace=2,
        gpu_wait=0,
        sweep=DEFAULT_LEVELS,
        max_concurrency=1,
        duration=0.5,
        db=str(db),
        workdir=str(tmp_path / "work"),
        given=frozenset({"sweep", "duration", "max_concurrency"}),
    )
    out = io.StringIO()
    result = experiment.run(options, reporter=PlainReporter(out), warn=lambda line: None).result
    said = " ".join(out.getvalue().split())
    Path("/tmp/intervals-said.txt").write_text(out.getvalue())
    assert f"{DEFAULT_LEVELS} rate levels" not in said, said
    assert "sweep: --max-concurrency 1 leaves no range of rates to sweep" in said
    assert "no range to sweep: --max-concurrency 1 keeps one request in flight, so the client is the limit" in said
    sweep = result.sweep
    assert sweep is not None and len(sweep["rates"]) == 1
    assert sweep["no_range"].startswith("no range to sweep: --max-concurrency 1")
    capsys.readouterr()
    assert main(["show", result.experiment_id, "--db", str(db)]) == 0
    assert "no range to sweep: --max-concurrency 1" in " ".join(capsys.readouterr().out.split())
    assert main(["show", result.experiment_id, "--db", str(db), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["sweep"]["no_range"] == sweep["no_range"]


def test_no_range_is_said_for_a_server_that_does_not_saturate_and_for_a_stored_sweep_without_the_reason() -> None:
    from orchestrator.config.sweep import no_range_reason
    from orchestrator.report.lines import sweep_lines

    assert no_range_reason(8, {"a": 2.0, "b": 3.0}, {"a": 2.0, "b": 6.0}) is None  # b saturates above 3 req/s
    reason = no_range_reason(8, {"a": 2.0, "b": 3.0}, {"a": 2.05, "b": 3.0})
    assert reason is not None and "at concurrency 8 no arm completed more requests per second" in reason
    assert reason.endswith("the lowest synchronous rate (2 req/s)")
    stored = {"probe": "p", "concurrency": 8, "synchronous": {"a": 2.0}, "saturated": {"a": 2.0}, "rates": [2.0]}
    fake: Any = type("R", (), {"sweep": stored})()
    lines: list[str] = sweep_lines(fake)
    assert lines[-1].strip() == reason
