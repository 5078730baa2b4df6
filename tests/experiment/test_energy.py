"""Energy per output token end to end: `orch ab --sim` with the fake nvidia-smi on PATH reports J/token per arm with
its CI in JSON and text, `orch show` of the stored experiment gives the same figures, and without nvidia-smi the
report says energy was not measured."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from orchestrator.agent import ops, power
from orchestrator.cli import main
from orchestrator.hosts.base import HostConfig
from orchestrator.report.lines import joules
from tests import fake_nvidia_smi
from tests.client.test_client_stream import generate_answer
from tests.conftest import REPO, free_port

Capsys = pytest.CaptureFixture[str]
SHORT = ("--runs", "2", "--warmup", "0", "--max-tokens", "48", "--min-run-s", "0")


def _orch(capsys: Capsys, *args: str) -> tuple[int, str]:
    code = main(list(args))
    return code, capsys.readouterr().out


def _bundled_on_a_free_port(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The bundled baseline and eagle3-3step (and the base they extend) in ./profiles, on a port of their own: the
    bundled port 8000 may be another test's."""
    (tmp_path / "profiles").mkdir()
    for name in ("baseline", "eagle3-3step", "kimi-k25-int4-tp8"):
        text = (REPO / "profiles" / f"{name}.yaml").read_text()
        (tmp_path / "profiles" / f"{name}.yaml").write_text(text.replace("port: 8000", f"port: {free_port()}"))
    monkeypatch.chdir(tmp_path)


@pytest.mark.slow
def test_ab_reports_joules_per_token_per_arm_and_show_gives_the_same(
    tmp_path: Path, capsys: Capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    _bundled_on_a_free_port(tmp_path, monkeypatch)
    smi = fake_nvidia_smi.install(tmp_path / "bin", tmp_path / "state.json")
    monkeypatch.setenv("PATH", f"{smi}:{os.environ['PATH']}")
    power._FIELDS_BY_SMI.clear()
    db = str(tmp_path / "r.db")
    code = main(["ab", "baseline", "eagle3-3step", "--sim", "--blocks", "2", *SHORT, "--json", "--db", db])
    out, err = capsys.readouterr()
    assert code == 0, err
    doc = json.loads(out)
    for arm in doc["arms"]:
        energy = arm["energy"]
        # Both arms are TP8 on the fake's 8 GPUs at 412.8 W each while busy: 3302.4 W over the steady window.
        assert energy["mean_w"] == pytest.approx(8 * 412.8) and energy["gpus"] == 8, energy
        assert energy["launches"] == 2 and energy["runs"] == 4 and energy["power_fields"] == ["power.draw.instant"]
        lo, hi = energy["ci95"]
        assert lo < energy["j_per_token"] < hi and len(energy["launch_values"]) == 2
        for run in arm["runs"]:
            e = run["energy"]
            assert run["j_per_token"] == pytest.approx(e["joules"] / e["tokens"])
            # J/token = mean power / output tokens per second in the same window.
            assert run["j_per_token"] == pytest.approx(e["mean_w"] / run["aggregate_tok_s"], rel=0.02)
    (cmp,) = doc["energy_comparisons_by_concurrency"]
    assert cmp["arm_label"] == "eagle3-3step" and cmp["blocks"] == 2 and cmp["ci95"] is not None
    assert "power.draw.instant" in doc["energy_note"] and "SIMULATED" in doc["energy_note"]

    code, text = _orch(capsys, "show", "last", "--db", db)
    assert code == 0
    assert "energy per output token at concurrency 1" in text
    for arm in doc["arms"]:
        e = arm["energy"]
        lo, hi = (joules(v) for v in e["ci95"])
        line = (
            f"{arm['label']}: {joules(e['j_per_token'])} J/token, 95% CI [{lo}, {hi}] over 2 launches (4 runs; 3302 W"
        )
        assert line in text, text
    assert "eagle3-3step vs baseline @ 1: " in text and "the energy per token, 95% CI" in text
    assert "energy: from nvidia-smi's power.draw.instant" in text

    # The stored experiment gives the same figures.
    code, shown = _orch(capsys, "show", "last", "--db", db, "--json")
    again = json.loads(shown)
    assert code == 0
    assert [a["energy"] for a in again["arms"]] == [a["energy"] for a in doc["arms"]]
    assert again["energy_comparisons_by_concurrency"] == doc["energy_comparisons_by_concurrency"]
    assert [r["energy"] for a in again["arms"] for r in a["runs"]] == [
        r["energy"] for a in doc["arms"] for r in a["runs"]
    ]


def _without_nvidia_smi() -> str:
    return ":".join(d for d in os.environ["PATH"].split(":") if d and not shutil.which("nvidia-smi", path=d))


def test_a_sim_run_without_nvidia_smi_says_energy_was_not_measured(
    tmp_path: Path, capsys: Capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    _bundled_on_a_free_port(tmp_path, monkeypatch)
    monkeypatch.setenv("PATH", _without_nvidia_smi())
    db = str(tmp_path / "r.db")
    code, out = _orch(capsys, "bench", "baseline", "--sim", *SHORT, "--runs", "1", "--json", "--db", db)
    assert code == 0
    doc: dict[str, Any] = json.loads(out)
    (arm,) = doc["arms"]
    assert arm["energy"] == {"j_per_token": None, "not_measured": "no nvidia-smi"}
    assert [r["energy"]["error"] for r in arm["runs"]] == ["no nvidia-smi"] and arm["runs"][0]["j_per_token"] is None
    assert doc["energy_note"] == "energy: not measured (no nvidia-smi)"
    code, text = _orch(capsys, "show", "last", "--db", db)
    assert code == 0 and "  energy: not measured (no nvidia-smi)" in text.splitlines()
    assert "J/token" not in text


def test_client_local_on_this_machine_samples_in_process(
    sim_profiles: Callable[..., dict[str, Path]], tmp_path: Path, capsys: Capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    sim_profiles()  # the simulator's spawned workers: the fake puts the k-th on GPU k
    monkeypatch.chdir(tmp_path)
    smi = fake_nvidia_smi.install(tmp_path / "bin", tmp_path / "state.json")
    watts = {0: 300.0, 1: 200.0, 2: 100.0, 3: 50.0}
    (tmp_path / "state.json").write_text(json.dumps({"power_w": watts}))
    monkeypatch.setenv("PATH", f"{smi}:{os.environ['PATH']}")
    power._FIELDS_BY_SMI.clear()
    args = ("bench", "baseline", "--sim", *SHORT, "--runs", "1", "--client", "local", "--json")
    code = main([*args, "--db", str(tmp_path / "r.db")])
    out, err = capsys.readouterr()
    assert code == 0, err
    (run,) = json.loads(out)["arms"][0]["runs"]
    held = [g["index"] for g in run["energy"]["gpus"]]
    assert held[:2] == [0, 1] and run["energy"]["mean_w"] == pytest.approx(sum(watts[i] for i in held))


class _Host:
    """Just what the runners ask of a host: its config, its members, and calls answered by the agent in-process."""

    def __init__(self, local: bool, nodes: int = 1) -> None:
        self.config = HostConfig(name="h", address=None if local else "10.0.0.9", nvidia_smi="nvidia-smi")
        self.nodes = nodes

    def members(self) -> list[_Host]:
        return [self] * self.nodes

    def call(self, op: str, call_timeout: float | None = None, **args: Any) -> Any:
        return ops.dispatch({"op": op, "args": args})["result"]


def test_where_no_call_carries_the_run_the_energy_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.config.workload import BenchConfig
    from orchestrator.engines import get
    from orchestrator.launch import benchmark
    from tests.agent.test_power import SlowServer

    smi = fake_nvidia_smi.install(tmp_path / "bin", tmp_path / "state.json", gpus=2)
    monkeypatch.setenv("PATH", f"{smi}:{os.environ['PATH']}")
    srv = SlowServer()
    srv.answer, srv.delay = generate_answer(8, incremental=True), 0.0
    srv.piece = len(srv.answer)
    try:
        config = BenchConfig(endpoint="generate", client="local")
        url = f"http://127.0.0.1:{srv.port}"

        def energy(host: _Host, cfg: BenchConfig = config) -> Any:
            runner = benchmark.runner_for(host, "127.0.0.1", srv.port, url, cfg, get("sglang"))  # type: ignore[arg-type]
            return runner(benchmark.RunCall(bodies=[{"text": "x"}], max_tokens=[8], concurrency=1, probe_gpus=False))[
                "energy"
            ]

        assert energy(_Host(local=False)) == {"source": "nvidia-smi", "error": benchmark.NO_ENERGY_REMOTE_LOCAL_CLIENT}
        host_client = dataclasses.replace(config, client="host")
        assert energy(_Host(local=True, nodes=2), host_client)["error"] == benchmark.NO_ENERGY_MULTINODE
        # On this machine the run is sampled (no launch processes here: no GPU holds one, so no figure, and why).
        assert "no GPU holds a compute process" in energy(_Host(local=True))["error"]
        assert "no GPU holds a compute process" in energy(_Host(local=True), host_client)["error"]
    finally:
        srv.close()
