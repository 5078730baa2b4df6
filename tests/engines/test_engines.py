"""The engine adapter boundary: an engine added here, in the test alone, runs through the whole run loop."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import MappingProxyType

import pytest

from orchestrator import engines
from orchestrator.agent import ops
from orchestrator.config.design import ABConfig
from orchestrator.config.profile import Profile, load
from orchestrator.config.workload import BenchConfig
from orchestrator.engines import Engine
from orchestrator.errors import ProfileError
from orchestrator.experiment.ab import run_ab
from orchestrator.hosts.local import LocalHost
from orchestrator.results.load import load_result
from orchestrator.results.store import Store
from tests.conftest import FAST_SIM, NAMESPACE, WriteProfile, free_port

REPO = Path(__file__).resolve().parents[2]


class Toy(Engine):
    """A made-up engine whose server is orch's simulator started its own way: its own flag order, its own
    readiness endpoint, no packages worth importing."""

    name = "toy"
    health_path = "/health"
    env_overrides: Mapping[str, str] = MappingProxyType({"TOY_THREADS": "toy sets it from the core count"})
    packages = ("json",)
    version_package = None
    endpoints = ("completions",)  # the OpenAI API, which the simulator serves as SGLang does
    simulated = True

    def server_flags(self, profile: Profile) -> list[str]:
        return ["--port", str(profile.port), "--host", profile.host, "--model-path", profile.model_path]

    def launch_argv(self, profile: Profile, python: str, *, simulate: bool) -> list[str]:
        return [python, "-m", "orchestrator.sim", *self.server_flags(profile)]


@pytest.fixture
def toy() -> Iterator[Engine]:
    engine = engines.register(Toy())
    yield engine
    engines._REGISTRY.pop("toy", None)


def test_an_engine_registered_in_a_test_runs_end_to_end(
    toy: Engine, write_profile: WriteProfile, tmp_path: Path
) -> None:
    path = write_profile("toyp", engine="toy", model_path="/m/toy", port=free_port(), sim=FAST_SIM)
    prof = load(str(path))
    assert prof.launch_argv("py", simulate=True)[:4] == ["py", "-m", "orchestrator.sim", "--port"]
    store = Store(tmp_path / "r.db")
    bench = BenchConfig(min_run_s=0, runs=2, warmup=0, max_tokens=16, endpoint="completions")
    cfg = ABConfig(bench=bench, simulate=True,
                   namespace=NAMESPACE, grace_s=2, gpu_wait_s=0)  # fmt: skip
    result = run_ab(LocalHost(), [prof], cfg, store)
    (launch,) = result.launches
    assert len(launch.timed_at()) == 2 and launch.fingerprint is not None
    assert launch.fingerprint["software"]["engine"] == "toy (simulated)"
    # An engine with no info endpoint of its own: its simulator still reports its version and knobs.
    assert launch.fingerprint["software"]["engine_version"] is not None
    assert launch.fingerprint["env"]["sim_knobs"] is not None
    assert load_result(store, result.experiment_id).arms[0].median_at() is not None
    assert ops.op_find(NAMESPACE) == []


def test_unknown_engines_are_named_with_the_known_ones(toy: Engine, write_profile: WriteProfile) -> None:
    path = write_profile("bad", engine="tyo", model_path="/m", tp_size=1, port=30000)
    known = r"engine: expected one of sglang, vllm, llamacpp, toy, got 'tyo' \(did you mean 'toy'\?\)"
    with pytest.raises(ProfileError, match=known):
        load(str(path))
    with pytest.raises(ProfileError, match=r"unknown engine 'sglnag' .*did you mean 'sglang'"):
        engines.get("sglnag")


# What only an engine may say: its name and title, its endpoints and paths, its counter names (each carries the
# engine's name: vllm:..., sglang:...), its process names. Read from the registry, so a new engine's are covered.
PROCESS_NAMES = ("llama-server", "launch_server")


def protocol_words() -> set[str]:
    words = set(PROCESS_NAMES)
    for name in engines.names():
        e = engines.get(name)
        words |= {name, e.title, e.health_path, *e.info_paths, *(e.cache_counters or ()), *(e.counters or ())}
        words |= {p for p in (e.version_path, e.metrics_path) if p}
        words |= {e.wire(endpoint).path for endpoint in e.endpoints}
        if e.cache_flush is not None and e.cache_flush.request is not None:
            words.add(e.cache_flush.request.path)
    return {w for w in words if w}


# Where a string outside engines/ may still name an engine: a peer benchmarking tool's convention or issue, or a
# dataset's origin, told to the user (not how orch speaks to any server). Each (module, the phrase it may hold).
NAMED_FOR_USERS = {
    ("cli/options.py", "vLLM's --goodput"): "a bare SLO number means milliseconds to vLLM's benchmark",
    ("fields.py", "vLLM's --goodput"): "the same, in the refusal of a bare number",
    ("cli/options.py", "vLLM's --burstiness"): "how gamma:CV maps to vLLM's benchmark's option",
    ("cli/options.py", "SGLang's generated-shared-prefix"): "the dataset's origin",
    ("report/outputs.py", "vLLM issue"): "the peer issue behind the token-weighted accept length",
}


def _docstrings(tree: ast.AST) -> set[int]:
    kinds = (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    return {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, kinds) and node.body and isinstance(node.body[0], ast.Expr)
    }


def test_no_engine_specific_string_outside_engines_and_the_simulator() -> None:
    """Every string constant (docstrings aside) of every module but engines/ and sim/ is free of what only an
    engine may say: the client, agent, launch, reports and nightly ask the adapter (Engine.wire, request_body,
    version_of, fact_packages, env_prefixes, cache_counters, ...)."""
    words = protocol_words()
    assert {"sglang", "vLLM", "/v1/completions", "/generate", "/metrics", "vllm:prefix_cache_hits_total"} <= words
    pattern = re.compile("|".join(re.escape(w) for w in sorted(words, key=len, reverse=True)), re.IGNORECASE)
    root = REPO / "orchestrator"
    found = []
    for path in sorted(root.rglob("*.py")):
        module = path.relative_to(root).as_posix()
        if module.startswith(("engines/", "sim/")):
            continue
        tree = ast.parse(path.read_text())
        docs = _docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
                text = node.value
                for (where, phrase), _why in NAMED_FOR_USERS.items():
                    if where == module:
                        text = text.replace(phrase, "")
                hit = pattern.search(text)
                if hit:
                    found.append(f"{module}:{node.lineno}: {hit.group(0)!r} in {node.value[:80]!r}")
    assert found == [], "engine-specific strings outside engines/ (ask the adapter instead):\n" + "\n".join(found)


def test_every_phrase_named_for_users_is_still_there() -> None:
    for module, phrase in NAMED_FOR_USERS:
        assert phrase in (REPO / "orchestrator" / module).read_text(), (module, phrase)
