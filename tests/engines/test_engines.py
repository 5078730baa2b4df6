"""The engine adapter boundary: an engine added here, in the test alone, runs through the whole run loop."""

from __future__ import annotations

import ast
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


# The modules that run, measure and report an experiment: none may branch on an engine's name.
# Every module of the run loop, the results and their reports (paths under orchestrator/, without .py).
ENGINE_BLIND = (
    "experiment/ab",
    "experiment/arm",
    "launch/benchmark",
    "config/workload",
    "results/run",
    "report/lines",
    "report/text",
    "report/jsondoc",
    "report/csvrows",
    "report/markdown",
    "results/model",
    "launch/single",
    "launch/group",
    "stats/estimates",
    "results/compare",
    "nightly/night",
    "nightly/history",
    "launch/attach",
    "client/runner",
    "experiment/failon",
    "nightly/suite",
    "launch/fingerprint",
    "report/html",
    "report/plots",
    "stats/sequential",
)


@pytest.mark.parametrize("module", ENGINE_BLIND)
def test_the_run_loop_never_names_an_engine(module: str) -> None:
    tree = ast.parse((REPO / "orchestrator" / f"{module}.py").read_text())
    named = [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in engines.names()
    ]
    assert named == [], f"orchestrator/{module}.py compares against engine names {named}: ask the adapter instead"
