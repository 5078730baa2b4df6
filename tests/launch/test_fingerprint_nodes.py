"""Every node of a multi-node launch counts in `orch compare` and a nightly history, not only node rank 0."""

from __future__ import annotations

import dataclasses
from typing import Any

from orchestrator.experiment import reproduce
from orchestrator.launch import fingerprint
from orchestrator.nightly import history
from orchestrator.nightly import result as nightresult
from orchestrator.results.model import ABResult
from tests.experiment.test_failon import fingerprint as make_fingerprint
from tests.experiment.test_failon import result as make_result
from tests.nightly.support import item_night, series_value


def _facts(gpu: str = "NVIDIA H100", driver: str = "550.54", sglang: str = "0.5.9") -> dict[str, Any]:
    return {"gpus": [{"name": gpu, "driver_version": driver}] * 2, "sglang": sglang, "torch": "2.5.1", "hostname": "x"}


def _host_facts(**node_b: str) -> dict[str, Any]:
    nodes = {"node-a": _facts(), "node-b": _facts(**node_b)}
    return {**nodes["node-a"], "nodes": nodes}


MULTI = make_fingerprint(profile__nnodes=2)


def test_diff_names_another_nodes_gpu_ranked_like_a_gpu_change() -> None:
    before = fingerprint.with_nodes(MULTI, _host_facts())
    after = fingerprint.with_nodes(MULTI, _host_facts(gpu="NVIDIA H200", sglang="0.5.10"))
    diffs = fingerprint.diff(before, after)
    assert [d.describe() for d in diffs] == [
        "node rank 1 sglang (import): 0.5.9 -> 0.5.10",
        "node rank 1 GPU model: NVIDIA H100 -> NVIDIA H200",
    ]
    assert [(d.category, d.weight) for d in diffs] == [("engine", 99), ("gpu", 80)]
    env = fingerprint.environment_diff(fingerprint.environment(before), fingerprint.environment(after))
    assert [d.field for d in env] == ["nodes.1.software.sglang", "nodes.1.gpus.model"]
    # Rank 1 keyed by rank: a Slurm allocation's node names change every time, and that is no change.
    renamed = {**_host_facts(), "nodes": {"gpu-17": _facts(), "gpu-23": _facts()}}
    assert fingerprint.diff(before, fingerprint.with_nodes(MULTI, renamed)) == []


def test_without_every_nodes_facts_compares_as_before() -> None:
    facts = _host_facts(gpu="NVIDIA H200")
    assert fingerprint.with_nodes(MULTI, {"gpus": []}) is MULTI  # stored before `nodes`
    assert fingerprint.with_nodes(None, facts) is None
    single = make_fingerprint()  # a one-node launch on a group: the other nodes were not used
    assert fingerprint.with_nodes(single, facts) is single
    assert fingerprint.environment(fingerprint.with_nodes(MULTI, {})) == fingerprint.environment(MULTI)


def _experiment(host_facts: dict[str, Any]) -> ABResult:
    fps = {(arm, b): make_fingerprint(profile__name=arm, profile__nnodes=2) for arm in ("a", "b") for b in range(3)}
    return dataclasses.replace(make_result({"a": 80.0, "b": 81.0}, blocks=3, fingerprints=fps), host_facts=host_facts)


def test_compare_names_another_nodes_gpu() -> None:
    causes = reproduce.likely_causes(_experiment(_host_facts()), _experiment(_host_facts(gpu="NVIDIA H200")))
    assert causes == ["node rank 1 GPU model: NVIDIA H100 -> NVIDIA H200"]
    assert reproduce.likely_causes(_experiment(_host_facts()), _experiment(_host_facts())) == []


def test_nightly_judges_another_nodes_gpu_change_an_environment_change() -> None:
    item_envs = [history.arm_environments(_experiment(_host_facts())) for _ in range(4)]
    tonight_envs = history.arm_environments(_experiment(_host_facts(gpu="NVIDIA H200")))

    def night(n: int, value: float, envs: dict[str, dict[str, Any]]) -> history.ItemNight:
        key = history.env_key(envs, ("a",))
        v = series_value("a", "tok_s", value, n=1, env=key, min_history=3)
        return item_night(n, [v], envs)

    past = [night(n, 80.0 + 0.1 * n, envs) for n, envs in enumerate(item_envs)]
    tonight = night(9, 70.0, tonight_envs)
    verdict = nightresult.judge(tonight.series[0], past, tonight, 3)
    assert verdict.status == "environment", verdict
    assert verdict.note == "node rank 1 GPU model: NVIDIA H100 -> NVIDIA H200"
    # The same nodes tonight: history goes on building (no environment step).
    same = night(9, 80.2, history.arm_environments(_experiment(_host_facts())))
    assert nightresult.judge(same.series[0], past, same, 3).status == "ok"
    # Nights stored before every node's facts counted: no evidence of a change.
    old = [night(n, 80.0 + 0.1 * n, history.arm_environments(_experiment({}))) for n in range(4)]
    assert nightresult.judge(same.series[0], old, same, 3).status == "ok"
