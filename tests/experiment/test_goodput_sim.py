"""`orch ab --slo --metric goodput` on the simulator: the bundled sim-eagle3-fast wins alone and loses under load."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.agent import ops
from orchestrator.cli import main
from tests.conftest import NAMESPACE, free_port

# At 1 stream both arms' TPOT is under 20 ms (baseline ~12, sim-eagle3-fast ~8); at 16 the baseline's is ~16 ms and
# the speculative arm's ~24 ms (docs/simulator.md): every baseline request is good, none of the other's.
SLO = "ttft_p99=500ms,tpot_p99=20ms"


@pytest.mark.slow
def test_goodput_verdicts_fail_on_and_rejudging_on_the_simulator(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)  # the bundled profiles, not a checkout's ./profiles
    db = str(tmp_path / "r.db")
    short = ["--sim", "--blocks", "3", "--runs", "2", "--warmup", "0", "--max-tokens", "64", "--min-run-s", "0"]
    args = ["ab", "baseline", "sim-eagle3-fast", *short, "--concurrency", "1,16", "--port", str(free_port())]
    code = main([*args, "--slo", SLO, "--metric", "goodput", "--fail-on", "slower", "--json", "--db", db])
    doc = json.loads(capsys.readouterr().out)
    assert code == 3, doc["fail_on"]
    assert ops.op_find(NAMESPACE) == []
    assert doc["metric"] == "goodput" and doc["slo"] == {"ttft_p99": 0.5, "tpot_p99": 0.02}
    at = {c["concurrency"]: c for c in doc["comparisons_by_concurrency"]}
    assert at[1]["metric"] == "goodput" and at[1]["verdict"] == "faster" and at[1]["ratio"] > 1.2
    assert at[16]["verdict"] == "slower" and at[16]["ratio"] < 0.1
    base, fast = ({lv["concurrency"]: lv["goodput"] for lv in arm["by_concurrency"]} for arm in doc["arms"])
    # (A request finishing alone at the end of a run may still make it: almost none of the speculative arm's do.)
    assert base[16]["attainment"] == 1.0 and fast[16]["attainment"] < 0.1 and fast[1]["attainment"] == 1.0
    assert base[16]["slo_met"] is True and fast[16]["slo_met"] is False
    # Relative, not absolute: on a loaded machine one late request in a short run is already ~0.6 good req/s.
    assert base[16]["median_req_s"] > 4 and fast[16]["median_req_s"] < 0.1 * base[16]["median_req_s"]
    (failed,) = [c for c in doc["fail_on"]["checks"] if c["status"] == "fail"]
    assert failed["reason"].startswith("sim-eagle3-fast is slower than baseline on goodput at concurrency 16")

    # The stored experiment reads back with its SLO and metric; -q style verdict lines name the metric.
    assert main(["show", "last", "--db", db]) == 0
    text = capsys.readouterr().out
    assert "verdicts on goodput: requests within every SLO limit per second" in text
    assert "sim-eagle3-fast vs baseline @ 1: goodput 1." in text and "-> FASTER by" in text
    assert "sim-eagle3-fast vs baseline @ 16: goodput 0.0" in text and "-> SLOWER by" in text
    # Judged again on a looser SLO, from the stored per-request rows: now both arms' requests are good at 16,
    # and goodput follows throughput (the speculative arm still loses, by far less).
    assert main(["show", "last", "--db", db, "--slo", "tpot_p99=40ms", "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["slo"] == {"tpot_p99": 0.04}
    at = {c["concurrency"]: c for c in again["comparisons_by_concurrency"]}
    assert at[16]["verdict"] == "slower" and 0.4 < at[16]["ratio"] < 0.9 and "note" not in at[16]
    # ... and on a latency, where lower is better: the speculative arm's p99 TPOT is higher at 16, so slower.
    assert main(["show", "last", "--db", db, "--metric", "tpot_p99", "--json"]) == 0
    at = {c["concurrency"]: c for c in json.loads(capsys.readouterr().out)["comparisons_by_concurrency"]}
    assert at[1]["verdict"] == "faster" and at[1]["ratio"] < 1 and at[16]["verdict"] == "slower"

    # What the verdicts are on is part of the experiment: a resume may not change it.
    assert main(["ab", "--resume", "last", "--slo", "ttft=1s", "--db", db]) == 2
    assert "drop --slo" in capsys.readouterr().err
    # A bundle carries both: shown from the file, it is judged as it was.
    bundle = tmp_path / "x.orch.json"
    assert main(["export", "last", "--format", "bundle", "-o", str(bundle), "--db", db]) == 0
    capsys.readouterr()
    assert main(["show", str(bundle), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["metric"] == "goodput" and shown["slo"] == doc["slo"]
    assert [c["verdict"] for c in shown["comparisons_by_concurrency"]] == ["faster", "slower"]
