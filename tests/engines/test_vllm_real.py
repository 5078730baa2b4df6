"""vLLM's CPU build as a real engine (`make vllm`): orch's launch lifecycle, counters, cache flush and attach against
the real server, checking behaviour, never speed. One worker runs them one after another (xdist_group): each vLLM
holds both cores while it loads."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from orchestrator.agent import ops
from orchestrator.agent.facts import home_path
from orchestrator.config.profile import load
from orchestrator.results.load import load_result
from orchestrator.results.store import Store
from tests.conftest import NAMESPACE, WriteProfile, finish, free_port, run_orch
from tests.hosts.test_ssh import fake_gpu_dir, remote, sshd  # noqa: F401 (fixtures)

VLLM_HOME = Path.home() / ".cache" / "orch" / "vllm-0.32.0"
VLLM_PYTHON = VLLM_HOME / "venv" / "bin" / "python"
MODEL = VLLM_HOME / "gemma-3-270m"
HAVE_VLLM = (VLLM_HOME / "manifest.json").exists()
# `make test` runs `make vllm` first, so in CI a missing vLLM is a failure, not a skip.
pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.xdist_group("vllm"),
    pytest.mark.skipif(not HAVE_VLLM and not os.environ.get("CI"), reason="no vLLM CPU build here (make vllm)"),
]
LOAD_S = 600  # a vLLM start here: ~100 s eager on an idle 2-core machine, several times that beside the suite


def counters(url: str) -> dict[str, float]:
    """The server's own counters and histogram sums, labels dropped (one engine, one model)."""
    out: dict[str, float] = {}
    for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines():
        m = re.match(r"^(vllm:[a-z0-9_]+?)(?:\{([^}]*)\})? ([0-9.e+-]+)$", line)
        if m and (m.group(1).endswith(("_total", "_sum", "_count"))) and "position=" not in (m.group(2) or ""):
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(3))
    return out


def wait_healthy(url: str, proc: subprocess.Popen[bytes], within_s: float) -> bool:
    """True once url's /health answers 200; False when proc exits or within_s passes first."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline and proc.poll() is None:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                return True
        time.sleep(0.5)
    return False


def stop_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def served() -> Iterator[str]:
    """The bundled cpu-vllm-ngram as orch renders it, with dev routes on, started by this module in a session of its
    own, for --attach."""
    port = free_port()
    log = open(Path(os.environ.get("TMPDIR", "/tmp")) / f"vllm-attach-{port}.log", "w")  # noqa: SIM115
    profile = load("cpu-vllm-ngram").with_port(port)
    env = {**os.environ, **profile.env_dict(), "VLLM_SERVER_DEV_MODE": "1"}
    argv = [home_path(a) for a in profile.launch_argv(sys.executable, simulate=False)]
    proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        if not wait_healthy(url, proc, LOAD_S):
            pytest.fail(f"vLLM did not come up: {Path(log.name).read_text()[-3000:]}")
        yield url
    finally:
        stop_group(proc)
        log.close()


@pytest.fixture
def vllm_profiles(write_profile: WriteProfile) -> tuple[Path, Path]:
    """The bundled pair on a port of this test's own."""
    port = free_port()
    return (
        write_profile("vbase", extends="cpu-vllm-baseline", port=port),
        write_profile("vngram", extends="cpu-vllm-ngram", port=port),
    )


def test_orch_against_a_running_vllm_counts_what_vllm_counts(served: str, tmp_path: Path) -> None:
    """`orch bench --attach` with --flush-cache: its tokens, drafts and accepted drafts are exactly the server's own
    counter deltas over the same window; its tok/s per stream is within a few percent of the server's own
    accounting (tokens over its e2e request latency); every prefix-cache lookup missed after the flush."""
    profile = tmp_path / "attached.yaml"
    profile.write_text(
        "engine: vllm\nmodel_path: gemma-3-270m\nserved_model_name: gemma-3-270m\nport: 1\n"
        "speculative: {algorithm: ngram, num_steps: 3, prompt_lookup_min: 2, prompt_lookup_max: 4}\n"
    )
    before = counters(served)
    db = tmp_path / "r.db"
    args = ["bench", str(profile), "--attach", served, "--runs", "2", "--warmup", "0", "--max-tokens", "32"]
    proc = run_orch(
        *args, "--prompts", "lookup-friendly", "--flush-cache", "--min-run-s", "0", "--db", str(db), cwd=tmp_path
    )
    out, err = finish(proc, 600)
    after = counters(served)
    assert proc.returncode == 0, out + err
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    store = Store(db)
    result = load_result(store, store.find_experiment("last")["id"])
    runs = [r for launch in result.launches for r in launch.timed_at()]
    assert len(runs) == 2
    assert sum(r.tokens for r in runs) == delta["vllm:generation_tokens_total"] == 32 * sum(r.requests for r in runs)
    spec = [r.metrics["spec"] for r in runs]
    assert sum(s["drafts"] for s in spec) == delta["vllm:spec_decode_num_drafts_total"] > 0
    assert sum(s["accepted"] for s in spec) == delta["vllm:spec_decode_num_accepted_tokens_total"]
    assert all(r.spec_accept_length is not None and r.spec_accept_length > 1 for r in runs)
    # The same tokens over the summed end-to-end time of the same requests: as orch's client saw it (send to last
    # byte), and as vLLM's API server timed them (e2e_request_latency: arrival to finish). The client's includes the
    # HTTP round trip and the stream's parsing, so it can only be longer.
    orch_e2e = sum(r.metrics["e2e"]["mean"] * r.requests for r in runs)
    vllm_e2e = delta["vllm:e2e_request_latency_seconds_sum"]
    assert delta["vllm:e2e_request_latency_seconds_count"] == sum(r.requests for r in runs)
    assert 1.0 <= orch_e2e / vllm_e2e < 1.1, (orch_e2e, vllm_e2e)
    print(f"e2e orch {orch_e2e:.3f} s, vLLM {vllm_e2e:.3f} s: orch's tok/s is {vllm_e2e / orch_e2e:.4f}x vLLM's")
    assert delta["vllm:prefix_cache_hits_total"] == 0 and delta["vllm:prefix_cache_queries_total"] > 0
    assert "ATTACHED" in out and "vllm:spec_decode_*" in out


def test_the_converted_model_says_what_llama_cpp_says(served: str) -> None:
    """The same greedy prompt through vLLM (the bf16 conversion) and llama-server (the Q4_K_M GGUF it came from, the
    cpu-baseline profile's command line): the same words. Garbage, a missing <bos> or a wrong tensor would not be."""
    body = {"model": "gemma-3-270m", "prompt": "The capital of France is", "max_tokens": 12, "temperature": 0}
    theirs = httpx.post(f"{served}/v1/completions", json=body, timeout=120).json()["choices"][0]["text"]
    port = free_port()
    argv = load("cpu-baseline").with_port(port).launch_argv(sys.executable, simulate=False)
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        assert wait_healthy(f"http://127.0.0.1:{port}", proc, 120), "llama-server did not come up"
        reply = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=120).json()
        ours = reply["choices"][0]["text"]
    finally:
        stop_group(proc)
    # Q4_K_M arithmetic against bf16: the first words agree; far into a text, a near-tie may go the other way.
    assert theirs.split()[:5] == ours.split()[:5], (theirs, ours)


def test_a_real_ab_of_vllms_ngram_speculation(vllm_profiles: tuple[Path, Path], tmp_path: Path) -> None:
    """orch ab on the real server end to end: env read back from the API server, engine core and worker, vLLM and
    torch versions fingerprinted, accept length from vLLM's counters, outputs compared, nothing left running."""
    base, ngram = vllm_profiles
    db = tmp_path / "r.db"
    args = ["ab", str(base), str(ngram), "--prompts", "lookup-friendly", "--blocks", "1", "--runs", "1"]
    args += ["--warmup", "1", "--max-tokens", "32", "--min-run-s", "0", "--check-outputs", "--json"]
    proc = run_orch(*args, "--db", str(db), cwd=tmp_path)
    out, err = finish(proc, 1500)
    assert proc.returncode in (0, 4), out[-3000:] + err[-3000:]
    report = json.loads(out)
    assert report["status"] == "complete", report["status"]
    assert "SIMULATED" not in err
    assert ops.op_find(NAMESPACE) == []
    store = Store(db)
    result = load_result(store, report["experiment_id"])
    assert len(result.launches) == 2
    for launch in result.launches:
        # Read back from every process carrying the launch's marker: the API server, VLLM::EngineCore and
        # VLLM::Worker among them (the tests below see those titles).
        env = launch.env_report
        assert env["ok"] is True and env["processes"] >= 3, env
        software = launch.fingerprint["software"]
        assert str(software["engine_version"]).startswith("0.32.0") and software["torch"] == "2.13.0+cpu"
    # Readiness is a real completion: no timed run met a 503 or a failed request.
    assert all(r.valid and not r.errors for launch in result.launches for r in launch.timed_at())
    spec_runs = [r for launch in result.launches if launch.arm_index == 1 for r in launch.timed_at()]
    assert spec_runs and all("vllm:spec_decode" in (r.accept_source or "") for r in spec_runs)
    assert all(r.spec_accept_length is not None and r.spec_accept_length > 1 for r in spec_runs)
    # n-gram speculation is lossless under greedy decoding: the same text as the baseline's, prompt for prompt.
    (check,) = report["outputs_check"]
    assert check["compared"] >= 1 and check["identical"] == check["compared"], check


def _watch_until_workers(proc: subprocess.Popen[str]) -> list[dict[str, Any]]:
    """This test's launch's processes once vLLM's engine core and its worker run (fails if orch exits first)."""
    deadline = time.monotonic() + LOAD_S
    while time.monotonic() < deadline and proc.poll() is None:
        found = ops.op_find(NAMESPACE)
        titles = " ".join(p.get("cmdline") or "" for p in found)
        if "VLLM::EngineCore" in titles and "VLLM::Worker" in titles:
            print("launched:", [p.get("cmdline", "")[:60] for p in found])
            return found
        time.sleep(0.5)
    out, err = finish(proc, 300)
    pytest.fail(f"no VLLM::EngineCore and VLLM::Worker appeared (orch exit {proc.returncode}):\n{out[-2000:]}{err}")


@pytest.mark.parametrize(
    ("sig", "host"),
    [
        pytest.param(signal.SIGINT, "local", id="ctrl-c-local"),
        pytest.param(signal.SIGTERM, "testbox", id="sigterm-over-ssh", marks=pytest.mark.ssh),
    ],
)
def test_an_interrupted_vllm_launch_leaves_nothing_running(
    vllm_profiles: tuple[Path, Path], tmp_path: Path, sig: signal.Signals, host: str, request: pytest.FixtureRequest
) -> None:
    """Ctrl-C or SIGTERM while vLLM loads: orch stops the API server, its engine core and its worker. Over SSH too:
    the bundled profile, unedited, finds the venv and the model under the remote user's home."""
    if host == "testbox":
        request.getfixturevalue("remote")
    base, _ = vllm_profiles
    args = ["bench", str(base), "--host", host, "--runs", "1", "--warmup", "0", "--max-tokens", "16"]
    proc = run_orch(*args, "--db", str(tmp_path / "r.db"), cwd=tmp_path)
    seen = _watch_until_workers(proc)
    proc.send_signal(sig)
    out, err = finish(proc, 300)
    assert proc.returncode == 130, out + err
    assert ops.op_find(NAMESPACE) == []
    assert not [p["pid"] for p in seen if running(p["pid"])]


def test_a_vllm_whose_api_server_dies_while_loading_is_stopped_whole(
    vllm_profiles: tuple[Path, Path], tmp_path: Path
) -> None:
    """An error mid-launch: the API server is killed once its engine core and worker run (as an OOM kill would).
    orch says the server exited, exits 1, and stops the engine core and worker it left behind."""
    base, _ = vllm_profiles
    args = ["bench", str(base), "--runs", "1", "--warmup", "0", "--max-tokens", "16"]
    proc = run_orch(*args, "--db", str(tmp_path / "r.db"), cwd=tmp_path)
    seen = _watch_until_workers(proc)
    leader = next(p for p in seen if p["pid"] == p["pgid"])
    os.kill(leader["pid"], signal.SIGKILL)
    out, err = finish(proc, 300)
    assert proc.returncode == 1, out + err
    assert ops.op_find(NAMESPACE) == []
    assert not [p["pid"] for p in seen if running(p["pid"])]


def running(pid: int) -> bool:
    """pid is a live process: not gone, and not a zombie (dead; this machine's init reaps orphans a little later)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
