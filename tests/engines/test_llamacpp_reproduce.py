"""The README's real llama.cpp result, reproduced by orch itself from the bundle shipped in docs/examples/."""

from __future__ import annotations

import json
import platform
import re
from pathlib import Path

import psutil

from orchestrator.results.bundle import result_from_bundle
from orchestrator.results.bundleformat import read_bundle
from orchestrator.results.store import Store
from tests.conftest import finish, free_port, run_orch
from tests.engines.test_llamacpp import children_gone, real

REPO = Path(__file__).resolve().parents[2]
README_BUNDLE = REPO / "docs" / "examples" / "llamacpp-lookup-friendly.orch.json"
# Differences that every reproduction elsewhere shows and that explain no number: another checkout of orch, another
# box's names and ids, the venv's path. A NOT REPRODUCED with only these named is a gap in the fingerprint.
EXPLAIN_NOTHING = (
    "orch commit",
    "orch version",
    "hostname",
    "boot id",
    "container id",
    "server Python path",
    "engine version read from",
)


def test_every_shipped_real_result_reads_back_and_is_pointed_to_from_the_docs() -> None:
    """docs/examples/*.orch.json: real llama.cpp or vLLM experiments (never simulated) with a fingerprint on every
    launch, each named in README.md or docs/ beside the numbers it holds, each launch's fingerprint carrying what the
    CPU was (model, instruction sets, cores), how fast it ran, and how llama-server was built or which vLLM and torch
    served."""
    bundles = sorted((REPO / "docs" / "examples").glob("*.orch.json"))
    assert README_BUNDLE in bundles
    docs = (REPO / "README.md").read_text() + "".join(p.read_text() for p in (REPO / "docs").glob("*.md"))
    for path in bundles:
        result = result_from_bundle(read_bundle(path))
        assert not result.simulated, path
        assert all(launch.fingerprint for arm in result.arms for launch in arm.launches), path
        engines = {launch.fingerprint["software"]["engine"] for arm in result.arms for launch in arm.launches}
        assert engines in ({"llamacpp"}, {"vllm"}), (path, engines)
        assert path.name in docs, f"{path.name} is shipped but no doc points to it"
        for fingerprint in (launch.fingerprint for arm in result.arms for launch in arm.launches):
            assert fingerprint is not None
            cpu, speed = fingerprint["host"].get("cpu"), fingerprint["host"].get("speed")
            assert fingerprint["host"].get("cpu_model"), path
            assert cpu and cpu["family"] and cpu["logical_cpus"] >= 1 and cpu["inference_flags"], path
            assert speed and speed["probe_ms"] > 0 and speed["mem_copy_gb_s"] > 0, path
            if engines == {"llamacpp"}:
                assert fingerprint["software"].get("engine_build"), path
            else:
                assert fingerprint["software"].get("engine_version") and fingerprint["software"].get("torch"), path


# A real result in a capture: cpu-baseline and cpu-pld are the llama.cpp profiles, cpu-vllm-* vLLM's CPU build's (the
# simulator's have other names), and these are lines only a run's report prints.
REAL_RESULT = re.compile(
    r"vs cpu-baseline @|cpu-(?:baseline|pld): prefix cache|cpu-pld vs cpu-baseline: \d|cpu-(?:baseline|pld) by turn"
    r"|^ *cpu-(?:baseline|pld) +\d+ +\d+ |vs cpu-vllm-baseline @|^ *cpu-vllm-(?:baseline|ngram) +\d+ +\d+ ",
    re.MULTILINE,
)


BUNDLE_NAME = re.compile(r"examples/([\w.-]+\.orch\.json)")


def real_captures(text: str) -> list[tuple[int, str]]:
    """The fenced blocks of a Markdown text that show a real llama.cpp run's report: (first line, the block with
    the 12 lines before it and 6 after, where its bundle is named)."""
    lines = text.splitlines()
    found, start = [], None
    for n, line in enumerate(lines):
        if not line.lstrip().startswith("```"):
            continue
        if start is None:
            start = n
            continue
        if REAL_RESULT.search("\n".join(lines[start:n])):
            found.append((start + 1, "\n".join(lines[max(0, start - 12) : n + 7])))
        start = None
    return found


def test_every_real_capture_in_the_docs_names_a_shipped_bundle() -> None:
    """A real engine's report quoted in README.md or docs/ points, beside it, to the bundle it came from, and that
    bundle ships: a number nobody can check is not published as a result."""
    examples = REPO / "docs" / "examples"
    seen = 0
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for line, context in real_captures(doc.read_text()):
            seen += 1
            names = BUNDLE_NAME.findall(context)
            assert names, f"{doc.name}:{line}: a real engine's capture with no bundle named beside it"
            missing = [n for n in names if not (examples / n).is_file()]
            assert not missing, f"{doc.name}:{line}: names {missing}, not shipped in docs/examples/"
    assert seen >= 10  # the captures this test was written against; fewer means the pattern stopped matching


def test_a_capture_without_its_bundle_is_found() -> None:
    """The check above can fail: a report line in a fenced block with no bundle named near it is reported."""
    text = "Some prose.\n\n```\n  cpu-pld vs cpu-baseline @ 1: 1.2x, 95% CI [1.1, 1.3]\n```\n"
    ((line, context),) = real_captures(text)
    assert line == 3 and not BUNDLE_NAME.findall(context)
    assert real_captures("```\n  spec vs base: 0/8 prompts identical\n```\n") == []


@real
def test_the_readmes_real_result_is_reproduced_or_its_difference_named(tmp_path: Path) -> None:
    """`orch reproduce` of the shipped bundle, with the real llama-server, on whatever state this machine is in:
    REPRODUCED; or INCONCLUSIVE, saying what would decide; or NOT REPRODUCED with a cause orch can name (a slower
    CPU or memory, other load, another build...). A NOT REPRODUCED it cannot explain fails: a fingerprint gap."""
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    db = tmp_path / "r.db"
    # In 2 blocks of the recording's 3: about a minute in make test's pass of real engines alone (beside the rest of
    # the suite, 4 launches once took 20 minutes). Fewer new blocks only widen the new side's interval; the verdict's
    # rules are the same.
    args = ["reproduce", str(README_BUNDLE), "--blocks", "2", "--port", str(free_port()), "--json", "--db", str(db)]
    proc = run_orch(*args, cwd=tmp_path)  # the bundle's profiles are orch's own bundled cpu-baseline and cpu-pld
    out, err = finish(proc, 1200)
    assert proc.returncode in (0, 3, 4), out + err
    doc = json.loads(out)
    verdict = doc["reproduction"]
    assert verdict["status"] == {0: "reproduced", 3: "not reproduced", 4: "inconclusive"}[proc.returncode]
    explained = [c for c in verdict["causes"] if not c.startswith(EXPLAIN_NOTHING)]
    if proc.returncode == 3:
        assert explained, f"NOT REPRODUCED and no cause in the fingerprints: {verdict['reason']}; {verdict['causes']}"
    if proc.returncode == 4:
        assert "block" in verdict["reason"], verdict["reason"]  # how many blocks would decide, or the recording's

    # The re-run was a real A/B through the whole lifecycle: fresh launches in blocks, env read back, real spec stats.
    assert doc["simulated"] is False and "SIMULATED" not in out + err
    base_arm, pld_arm = doc["arms"]
    assert base_arm["accept_length"] is None and pld_arm["accept_length"] > 1.0
    assert all(r["tokens"] == 128 and r["valid"] for a in doc["arms"] for r in a["runs"])
    assert all(a["env_check"]["ok"] for a in doc["arms"])
    assert {r["accept_source"] for r in pld_arm["runs"]} == {
        "timings (tokens / (tokens - draft_n_accepted) of this run's requests)"
    }
    assert pld_arm["runs"][0]["spec"]["drafted"] > 0
    # Its fingerprint says what the CPU is, how fast it ran, and what llama.cpp was built for.
    fp = json.loads(Store(db).launches(doc["experiment_id"])[0]["fingerprint_json"])
    assert fp["software"]["engine"] == "llamacpp" and fp["software"]["engine_version"] == "11434.0.0"
    assert fp["host"]["speed"]["probe_ms"] > 0 and fp["host"]["speed"]["mem_copy_gb_s"] > 0
    assert fp["host"]["cpu"]["logical_cpus"] >= 1
    if platform.machine() == "x86_64":  # the Makefile's portable build: AVX2, FMA, F16C
        assert {"avx2", "fma", "f16c"} <= set(fp["software"]["engine_build"]["ggml_cpu"])
    children_gone(before)
