"""`--attach`: benchmarking a server orch did not launch (here a simulator the test starts itself) leaves it alone."""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import httpx
import psutil
import pytest

from orchestrator.agent import ops
from orchestrator.cli import main
from orchestrator.config.design import ABConfig
from orchestrator.config.profile import load
from orchestrator.config.workload import BenchConfig
from orchestrator.errors import InputError
from orchestrator.experiment.ab import run_ab
from orchestrator.hosts.local import LocalHost
from orchestrator.launch import attach, fingerprint
from orchestrator.report.csvrows import ab_csv
from orchestrator.report.jsondoc import ab_json
from orchestrator.report.markdown import ab_markdown
from orchestrator.report.text import ab_text
from orchestrator.results.load import load_result
from orchestrator.results.store import Store
from orchestrator.ui.events import Lines
from tests.conftest import FAST_SIM, NAMESPACE, REPO, WriteProfile, free_port

QUICK = ["--runs", "2", "--warmup", "0", "--max-tokens", "16", "--min-run-s", "0"]


@contextmanager
def started(tmp_path: Path, *args: str, health: str) -> Iterator[str]:
    """A simulator started the way someone else would start a server: no orch marker, its own session; its URL."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
    env.update(PYTHONPATH=str(REPO), ORCH_SIM_LOAD_S="0.2", ORCH_SIM_WARMUP_S="0")
    cmd = [sys.executable, "-m", "orchestrator.sim", *args, "--port", str(port)]
    with (tmp_path / "sim.log").open("wb") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        while True:
            assert proc.poll() is None, (tmp_path / "sim.log").read_text()
            with suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{port}{health}", timeout=2).status_code == 200:
                    break
            assert time.monotonic() < deadline, "the simulator never became healthy"
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
        # orch never touched it: still alive, still healthy, in the session it was started in.
        assert proc.poll() is None and psutil.Process(proc.pid).status() != psutil.STATUS_ZOMBIE
        assert httpx.get(f"http://127.0.0.1:{port}{health}", timeout=5).status_code == 200
    finally:
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # the session this test started, by its leader's PID
        proc.wait(10)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[str]:
    with started(tmp_path, "--model-path", "/models/test-model", health="/health_generate") as url:
        yield url


@pytest.fixture
def two(write_profile: WriteProfile) -> Callable[..., tuple[Path, Path]]:
    def make(**extra: object) -> tuple[Path, Path]:
        common = {"engine": "sglang", "model_path": "/models/test-model", "tp_size": 1, "sim": FAST_SIM}
        a = write_profile("left", port=free_port(), **common, **extra)
        b = write_profile("right", port=free_port(), **common, **extra)
        return a, b

    return make


@pytest.mark.parametrize(
    ("value", "want"),
    [
        ("http://127.0.0.1:8000", "http://127.0.0.1:8000"),
        ("http://Server.Example:30000/", "http://server.example:30000"),
        ("http://[::1]:8000", "http://[::1]:8000"),
    ],
)
def test_urls_are_normalised(value: str, want: str) -> None:
    assert attach.check_url(value) == want


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("http://bob:hunter2@gpu:8000", "user:password@"),
        ("http://gpu:8000/?api_key=hunter2", "query string"),
        ("https://gpu:8000", "https is not supported"),
        ("gpu:8000", "expected http://HOST:PORT"),
        ("http://gpu", "the port is required"),
        ("http://gpu:99999", "port from 1 to 65535"),
        ("http://gpu:8000/v1", "without a path"),
    ],
)
def test_bad_urls_are_refused_without_their_secrets(value: str, needle: str) -> None:
    with pytest.raises(InputError, match="--attach") as err:
        attach.check_url(value)
    assert needle in str(err.value) and "hunter2" not in str(err.value)


def test_an_attached_ab_leaves_the_server_alone_and_every_output_says_so(
    server: str, two: Callable[..., tuple[Path, Path]], tmp_path: Path
) -> None:
    a, b = two()
    profiles = attach.apply_options([load(str(a)), load(str(b))], [f"left={server}", f"right={server}"], ["a", "b"])
    store = Store(tmp_path / "r.db")
    bench = BenchConfig(min_run_s=0, runs=2, warmup=0, max_tokens=16)
    events: list[str] = []
    result = run_ab(LocalHost(), profiles, ABConfig(bench=bench, namespace=NAMESPACE, blocks=2), store,
                    events=Lines(events.append))  # fmt: skip
    assert len(result.launches) == 4 and all(launch.attached for launch in result.launches)
    assert all(len(launch.timed_at()) == 2 for launch in result.launches)
    assert any("attached to" in e and "state NOT fresh, environment NOT verified" in e for e in events)
    assert not any("launched PID" in e or "torn down in" in e for e in events)
    assert ops.op_find(NAMESPACE) == []  # nothing was launched

    stored = load_result(store, result.experiment_id)
    for shown in (result, stored):
        text = ab_text(shown)
        assert f"ATTACHED: left on {server}, right on {server}" in text
        assert "State NOT fresh" in text and "environment NOT verified" in text
        assert "not fresh (each block was another benchmark session on the same running server" in text
        doc = ab_json(shown)
        assert doc["attached"] == {"left": server, "right": server}
        assert all(arm["attached"] == server for arm in doc["arms"])
        assert all(launch["attached"]["fresh"] is False for launch in doc["launches"])
        assert all(launch["env_ok"] is None for launch in doc["launches"])
        assert all(launch["ready_s"] is None for launch in doc["launches"]) and "host facts are local's" in text
        assert any("not verified" in w for w in doc["warnings"])
        assert any(w.startswith("SIMULATED: the server left is attached to reports itself") for w in doc["warnings"])
        # Markdown keeps a URL from the profile from becoming a link (`http\://`: it reads the same rendered).
        escaped = server.replace("://", "\\://")
        assert f"**ATTACHED: left on {escaped}" in ab_markdown(shown)
        assert {row["attached"] for row in csv.DictReader(io.StringIO(ab_csv(shown)))} == {server}
    fp = stored.launches[0].fingerprint
    assert fp is not None and fp["attached"]["url"] == server and fp["host"] is None and fp["argv"] == []
    assert fp["software"]["served_models"] and fp["software"]["reports_orch_simulator"] is True


def test_cli_mixing_is_refused_unless_allowed(
    server: str, two: Callable[..., tuple[Path, Path]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = two()
    db = str(tmp_path / "r.db")
    assert main(["ab", str(a), str(b), "--sim", "--attach", f"right={server}", *QUICK, "--db", db]) == 2
    err = capsys.readouterr().err
    assert "attached arm(s) right and launched arm(s) left" in err and "--allow-mixed" in err
    assert Store(db).experiments() == []  # refused before anything started

    code = main(["ab", str(a), str(b), "--sim", "--attach", f"right={server}", "--allow-mixed", *QUICK, "--db", db,
                 "--blocks", "1",
                 "--fail-on", "env"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 4, out  # the attached arm's env cannot be verified: undecided
    assert "WARNING: MIXED COMPARISON" in out and "WARNING: right was measured on" in out
    assert "right's environment was not verified" in out
    assert ops.op_find(NAMESPACE) == []  # the launched arm was torn down as usual

    assert main(["show", "last", "--db", db]) == 0
    shown = capsys.readouterr().out
    assert "ATTACHED: right on" in shown and "MIXED COMPARISON" in shown
    assert main(["export", "last", "--db", db, "--format", "md"]) == 0
    assert "MIXED COMPARISON" in capsys.readouterr().out
    bundle = str(tmp_path / "exp.orch.json")
    assert main(["export", "last", "--db", db, "--format", "bundle", "-o", bundle]) == 0
    assert main(["show", bundle]) == 0
    assert "ATTACHED: right on" in capsys.readouterr().out
    assert main(["list", "--db", db]) == 0
    assert "SIMULATED ATTACHED" in capsys.readouterr().out


def test_a_resumed_experiment_stays_attached_to_the_same_server(
    server: str, two: Callable[..., tuple[Path, Path]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = two()
    db = tmp_path / "r.db"
    profiles = attach.apply_options([load(str(a)), load(str(b))], [f"left={server}", f"right={server}"], ["a", "b"])
    bench = BenchConfig(min_run_s=0, runs=1, warmup=0, max_tokens=16)

    def stop(_name: str, _run: object) -> None:
        raise KeyboardInterrupt

    store = Store(db)
    with pytest.raises(KeyboardInterrupt):
        run_ab(LocalHost(), profiles, ABConfig(bench=bench, namespace=NAMESPACE, blocks=2), store, on_run=stop)
    store.close()
    assert main(["ab", "--resume", "last", "--db", str(db)]) == 0  # the profile files say nothing of the server
    out = capsys.readouterr().out
    assert f"ATTACHED: left on {server}, right on {server}" in out and "resuming" in out
    assert main(["ab", "--resume", "last", "--db", str(db), "--attach", f"left={server}"]) == 2
    assert "drop --attach" in capsys.readouterr().err


def test_cli_bench_attach_and_profile_attach(
    server: str, two: Callable[..., tuple[Path, Path]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, _ = two()
    db = str(tmp_path / "r.db")
    assert main(["bench", str(a), "--attach", server, *QUICK, "--db", db, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["attached"] == {"left": server} and doc["arms"][0]["runs"]

    _, b = two(attach=server)  # the same, from the profile's own `attach:`
    assert main(["bench", str(b), *QUICK, "--db", db]) == 0
    assert f"ATTACHED: right on {server}" in capsys.readouterr().out


def test_cli_unreachable_and_bad_urls(
    two: Callable[..., tuple[Path, Path]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = two()
    db = str(tmp_path / "r.db")
    nobody = f"http://127.0.0.1:{free_port()}"
    assert main(["bench", str(a), "--attach", nobody, *QUICK, "--db", db]) == 1
    err = capsys.readouterr().err
    assert f"the attached server at {nobody} is not ready" in err and "Traceback" not in err

    assert main(["bench", str(a), "--attach", "http://me:hunter2@gpu:8000", *QUICK, "--db", db]) == 2
    err = capsys.readouterr().err
    assert "user:password@" in err and "hunter2" not in err
    assert main(["ab", str(a), str(b), "--attach", "http://gpu:8000", *QUICK, "--db", db]) == 2
    assert "say which arm is attached, as ARM=URL (arms: left, right)" in capsys.readouterr().err
    assert main(["ab", str(a), str(b), "--attach", "middle=http://gpu:8000", *QUICK, "--db", db]) == 2
    assert "'middle' is not an arm of this comparison" in capsys.readouterr().err
    assert main(["ab", str(a), str(b), "--attach", "left=ftp://gpu:8000", "--attach", "right=http://gpu:1",
                 *QUICK, "--db", db])  == 2  # fmt: skip
    assert "'ftp://gpu:8000': expected http://HOST:PORT" in capsys.readouterr().err
    assert main(["ab", str(a), str(b), "--attach", f"left={nobody}", "--attach", f"right={nobody}", "--strict-env",
                 *QUICK, "--db", db])  == 2  # fmt: skip
    assert "--strict-env needs each arm's environment read back" in capsys.readouterr().err


def test_an_attached_vllm_server_is_read_from_outside(
    write_profile: WriteProfile, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Real vLLM serves /server_info only in its dev mode: its version comes from GET /version.
    monkeypatch.setattr(fingerprint, "fetch_server_info", lambda _url, _engine: {})
    path = write_profile("vl", engine="vllm", model_path="/models/test-model", tp_size=1, port=free_port())
    with started(tmp_path, "serve", "/models/test-model", health="/health") as url:
        assert main(["bench", str(path), "--attach", url, *QUICK, "--db", str(tmp_path / "r.db"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["attached"] == {"vl": url} and doc["arms"][0]["runs"]
    fp = load_result(Store(tmp_path / "r.db"), "last").launches[0].fingerprint
    assert fp is not None and fp["software"]["engine"] == "vllm (attached)"
    assert fp["software"]["engine_version"] and fp["software"]["engine_version_source"] == "GET /version"
    assert fp["software"]["served_models"] == ["/models/test-model"]
