"""The CPU in a fingerprint: what it is, how fast it ran when the launch was ready, and how both rank as causes."""

from __future__ import annotations

import multiprocessing
import sys
import time
from typing import Any

import pytest

from orchestrator.agent import cpu, facts
from orchestrator.errors import BundleError
from orchestrator.experiment.failon import env_differences
from orchestrator.launch import fingerprint
from orchestrator.launch.fingerprint import STATE, diff, environment
from orchestrator.results.bundlefields import check_fingerprint

PROBE = "python 3.11.7, loop 200000, median of 9; copy 64 MiB"


def fp(
    probe_ms: float | None = 20.0, steal: float = 0.0, others: float = 3.0, copy: float = 1.4, **host: Any
) -> dict[str, Any]:
    speed = {"probe": PROBE, "probe_ms": probe_ms, "mem_copy_gb_s": copy, "steal_pct": steal, "others_busy_pct": others}
    cpu_facts = {"family": "23", "model": "1", "stepping": "2", "inference_flags": ["avx", "avx2", "fma"]}
    return {
        "host": {"hostname": "box", "cpu_model": "AMD EPYC", "cpu": {**cpu_facts, **host}, "speed": speed},
        "software": {"engine": "llamacpp", "engine_version": "11434.0.0", "engine_build": {"ggml_cpu": ["avx2"]}},
    }


def test_the_agent_reads_the_cpu_and_its_speed_on_this_machine() -> None:
    found = cpu.facts()
    assert found["logical_cpus"] >= 1
    if sys.platform == "linux" and found["inference_flags"] is not None:
        assert found["family"] is not None
    speed = cpu.op_cpu_speed()
    assert speed["probe_ms"] > 0 and speed["mem_copy_gb_s"] > 0 and speed["probe"].startswith("python ")
    assert speed["steal_pct"] is None or 0 <= speed["steal_pct"] <= 100
    # ... and the host part of every fingerprint carries the CPU's facts.
    assert facts.op_fingerprint(packages=[])["host"]["cpu"] == found


def _spin(until: float) -> None:
    while time.monotonic() < until:
        pass


@pytest.mark.skipif((multiprocessing.cpu_count() or 1) < 2, reason="needs a second CPU for the other process")
def test_another_process_busy_while_probing_is_seen_as_other_load() -> None:
    # A process of this test's own spins on the other CPU(s) while the probe runs: its use is "others", not the
    # probe's own.
    spinners = [
        multiprocessing.Process(target=_spin, args=(time.monotonic() + 3.0,))
        for _ in range((multiprocessing.cpu_count() or 2) - 1)
    ]
    for p in spinners:
        p.start()
    try:
        time.sleep(0.3)
        busy = cpu.op_cpu_speed()
    finally:
        for p in spinners:
            p.terminate()
            p.join()
    assert busy["others_busy_pct"] is not None and busy["others_busy_pct"] >= 50


def test_a_slower_cpu_is_a_likely_cause_with_by_how_much_and_noise_is_not() -> None:
    (d,) = diff(fp(20.0), fp(33.0))
    assert d.field == "host.speed.probe_ms" and d.category == STATE and d.weight > 80
    assert d.describe() == "CPU speed probe, ms (lower is faster): 20.0 -> 33.0 (this CPU ran 1.65x slower)"
    assert diff(fp(33.0), fp(20.0))[0].describe().endswith("(this CPU ran 1.65x faster)")
    assert diff(fp(20.0), fp(22.0)) == []  # within the probe's own repeatability
    assert diff(fp(20.0), fp(None)) == []  # not measured on one side: no evidence either way
    lines = [d.describe() for d in diff(fp(steal=0.0, others=2.0), fp(steal=12.0, others=60.0))]
    assert lines == [
        "CPU time stolen by the hypervisor, %: 0.0 -> 12.0",
        "other processes' CPU use while idle, %: 2.0 -> 60.0",
    ]
    assert diff(fp(steal=0.0, others=2.0), fp(steal=3.0, others=20.0)) == []
    # Memory bandwidth is what a CPU engine's decode follows: a rate, so lower is slower, and first.
    lines = [d.describe() for d in diff(fp(20.0, copy=2.2), fp(33.0, copy=1.3))]
    assert lines == [
        "memory copy speed, GB/s (higher is faster): 2.2 -> 1.3 (this CPU ran 1.69x slower)",
        "CPU speed probe, ms (lower is faster): 20.0 -> 33.0 (this CPU ran 1.65x slower)",
    ]
    assert diff(fp(copy=1.3), fp(copy=1.5)) == []


def test_another_interpreter_runs_the_probe_at_its_own_speed() -> None:
    other = fp(33.0)
    other["host"]["speed"]["probe"] = "python 3.12.1, loop 200000, median of 9"
    assert [d.field for d in diff(fp(20.0), other)] == ["host.speed.probe"]


def test_what_the_cpu_is_and_how_the_engine_was_built_are_compared_as_facts() -> None:
    after = fp(inference_flags=["avx", "avx2", "fma", "avx512f"], model="49")
    after["software"]["engine_build"] = {"ggml_cpu": ["avx2", "avx512"]}
    lines = [d.describe() for d in diff(fp(), after)]
    assert lines == [
        "engine build ggml_cpu: added avx512",
        "CPU instruction sets: added avx512f",
        "cpuinfo model: 1 -> 49",
    ]


def test_the_machines_state_is_no_environment_of_a_night_or_an_experiment() -> None:
    # A busy neighbour at one launch is something to report when a number moved, not a setting that changed: a
    # nightly history and --fail-on env see the same environment.
    slow = fp(40.0, steal=20.0, others=90.0)
    assert environment(fp()) == environment(slow)
    assert env_differences(fp(), slow) == []
    assert diff(fp(), slow)  # ... while a reproduction names it


def test_an_arms_speed_is_the_median_over_its_launches() -> None:
    launches = [fp(20.0, others=0.0, copy=1.4), fp(60.0, others=90.0, copy=0.5), fp(21.0, others=2.0, copy=1.3)]
    steady = fingerprint.steadied(launches)
    assert steady is not None
    assert steady["host"]["speed"]["probe_ms"] == 21.0 and steady["host"]["speed"]["others_busy_pct"] == 2.0
    assert steady["host"]["speed"]["mem_copy_gb_s"] == 1.3
    assert launches[0]["host"]["speed"]["probe_ms"] == 20.0  # the stored fingerprints are not changed
    assert fingerprint.steadied([]) is None


def test_a_bundles_cpu_facts_are_checked_like_every_other_fact() -> None:
    def bundled(**host: Any) -> dict[str, Any]:
        return {**fp(), "version": 1, "host": {**fp()["host"], **host}}

    check_fingerprint(bundled(), "p", "launches[0].fingerprint")
    with pytest.raises(BundleError, match=r"launches\[0\]\.fingerprint\.host\.cpu\.hypervisor"):
        check_fingerprint(bundled(cpu={"hypervisor": "KVM\x1b[2J"}), "p", "launches[0].fingerprint")
    with pytest.raises(BundleError, match=r"host\.speed: .* (object|mapping)"):
        check_fingerprint(bundled(speed="fast"), "p", "launches[0].fingerprint")
