"""--fail-on: the exit-code decision over hand-built results, and `orch ab`/`orch bench` with it on the simulator."""

from __future__ import annotations

import csv
import io
import json
import re
import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from orchestrator.agent import ops
from orchestrator.cli import main
from orchestrator.config.profile import Expect
from orchestrator.errors import InputError
from orchestrator.experiment.failon import (
    MODES,
    across_levels_metric,
    bound_check,
    fail_on_verdict,
    levels_refusal,
    parse_modes,
    single_profile_refusal,
)
from orchestrator.results.model import ABResult, Design, LaunchResult
from orchestrator.results.run import RunResult
from orchestrator.stats.crossover import Crossover
from tests.conftest import FAST_SIM, NAMESPACE, WriteProfile, free_port

# Deterministic per-block launch factors (restart noise of ~0.3 %), the same for every arm of a block.
FACTORS = (1.0, 1.004, 0.996, 1.002, 0.998)


def _run(i: int, tok_s: float, concurrency: int = 1) -> RunResult:
    return RunResult(
        index=i,
        warmup=False,
        tokens=2048,
        seconds=2048 / tok_s,
        tok_s=tok_s,
        prompt_tokens=30,
        ttft_s=0.02,
        concurrency=concurrency,
        aggregate_tok_s=tok_s * concurrency,
    )


def fingerprint(**changes: Any) -> dict[str, Any]:
    """A launch fingerprint like fingerprint.collect's; changes are paths with __ (host__hostname=...)."""
    fp: dict[str, Any] = {
        "version": 1,
        "collected_at": 1.0,
        "error": None,
        "host": {"hostname": "box", "kernel": "6.8.0", "boot_id": "b-1", "container_id": None, "cpu_model": "x"},
        "gpus": {"model": "NVIDIA H100", "count": 8, "driver": "550.54", "cuda": "12.4", "uuids": ["GPU-1"]},
        "software": {"engine": "sglang", "engine_version": "0.5.9", "torch": "2.5.1", "python_executable": "/v/py"},
        "env": {"processes": 11, "workers": {"NCCL_PROTO": "LL"}, "inherited": {}},
        "profile": {"name": "p", "env": {"NCCL_PROTO": "LL"}, "tp_size": 8},
        "argv": ["/v/py", "-m", "sglang.launch_server"],
        "workload_digest": "w",
        "orch": {"version": "0.1.0", "git_sha": "aaa"},
        "unreadable": [],
    }
    for path, value in changes.items():
        *parents, leaf = path.split("__")
        node = fp
        for key in parents:
            node = node[key]
        node[leaf] = value
    return fp


Speeds = dict[str, float | Sequence[float]]  # an arm's tok/s, or one per block (noise of its own)


def result(
    speeds: Speeds,
    *,
    blocks: int = 5,
    levels: Sequence[int] = (1,),
    at_level: dict[int, dict[str, float]] | None = None,
    env_reports: dict[tuple[str, int], dict[str, Any]] | None = None,
    fingerprints: dict[tuple[str, int], dict[str, Any] | None] | None = None,
) -> ABResult:
    """An experiment of `blocks` blocks; at_level overrides an arm's speed at a concurrency level."""
    names = tuple(speeds)
    launches = []
    for b in range(blocks):
        for i, name in enumerate(names):
            runs = []
            for level in levels:
                speed = (at_level or {}).get(level, {}).get(name, speeds[name])
                value = speed[b] if isinstance(speed, Sequence) else speed * FACTORS[b % len(FACTORS)]
                runs += [_run(k, value * (1 + 0.0005 * k), level) for k in range(3)]
            fps = fingerprints or {}
            launches.append(
                LaunchResult(
                    profile=name,
                    launch_id=f"L-{b}-{i}",
                    runs=tuple(runs),
                    ready_s=4.0,
                    env_report=(env_reports or {}).get((name, b), {"ok": True}),
                    teardown={},
                    block=b,
                    position=i,
                    arm_index=i,
                    fingerprint=fps[(name, b)] if (name, b) in fps else fingerprint(profile__name=name),
                )
            )
    return ABResult(
        experiment_id="E",
        simulated=True,
        host="local",
        profiles=names,
        launches=tuple(launches),
        host_facts={},
        design=Design.make(len(names), blocks, "fixed", 0),
    )


SLOWER = {"baseline": 83.0, "eagle3-3step": 60.8}
FASTER = {"baseline": 83.0, "eagle3-2step": 95.0}
SAME = {"baseline": 83.0, "copy": 83.0}


# ---------------------------------------------------------------- slower / different over comparisons


def test_slower_fails_with_exit_3_and_names_the_arm_and_its_ci() -> None:
    d = fail_on_verdict(result(SLOWER), ["slower"])
    assert (d.exit_code, d.status) == (3, "fail")
    (line,) = d.reasons
    assert line.startswith("fail-on slower: eagle3-3step is slower than baseline (ratio 0.733, 95% CI 0.7")
    assert line.endswith("-> exit 3")
    assert d.lines() == [line]  # one check: no summary line
    doc = d.to_dict()
    assert doc["modes"] == ["slower"] and doc["exit_code"] == 3 and doc["status"] == "fail"
    assert doc["checks"][0]["mode"] == "slower" and doc["checks"][0]["exit_code"] == 3
    json.dumps(doc)  # plain data


def test_faster_passes_slower_but_fails_different() -> None:
    r = result(FASTER)
    slower = fail_on_verdict(r, ["slower"])
    assert slower.exit_code == 0 and "eagle3-2step is faster than baseline" in slower.reasons[0]
    assert slower.reasons[0].endswith("-> ok")
    different = fail_on_verdict(r, ["different"])
    assert different.exit_code == 3 and different.reasons[0].startswith("fail-on different: eagle3-2step is faster")
    assert fail_on_verdict(result(SLOWER), ["different"]).exit_code == 3


def test_no_difference_passes_both() -> None:
    r = result(SAME)
    for mode in ("slower", "different"):
        d = fail_on_verdict(r, [mode])
        assert d.exit_code == 0, d.reasons
        assert "copy and baseline: no difference (ratio 1.000" in d.reasons[0] and "within ±2.0%" in d.reasons[0]


def test_one_block_has_no_ci_so_it_is_inconclusive() -> None:
    r = result(SLOWER, blocks=1)  # 27 % slower in one block: still not a verdict
    for mode in ("slower", "different"):
        d = fail_on_verdict(r, [mode])
        assert (d.exit_code, d.status) == (4, "inconclusive")
        assert "is inconclusive: ratio 0.733 from one block, which has no confidence interval" in d.reasons[0]
        assert d.reasons[0].endswith("-> exit 4")


def test_a_wide_ci_is_inconclusive_with_the_blocks_that_would_decide() -> None:
    noisy = {"baseline": 83.0, "eagle3-3step": [74.0, 88.0, 80.0]}
    d = fail_on_verdict(result(noisy, blocks=3), ["slower"])
    assert d.exit_code == 4
    assert "eagle3-3step vs baseline is inconclusive (ratio 0.9" in d.reasons[0]
    assert "blocks would decide" in d.reasons[0]


def test_every_concurrency_level_is_judged_and_named() -> None:
    # Equal at concurrency 1, slower at 8: the headline alone would pass.
    r = result(SAME, levels=(1, 8), at_level={8: {"copy": 70.0}})
    d = fail_on_verdict(r, ["slower"])
    assert d.exit_code == 3
    assert [c.status for c in d.checks] == ["ok", "fail"]
    assert "at concurrency 1" in d.reasons[0]
    assert d.reasons[1].startswith("fail-on slower: copy is slower than baseline at concurrency 8 (ratio 0.84")


def test_one_slower_arm_among_several_fails_even_beside_an_undecided_one() -> None:
    speeds: Speeds = {"baseline": 83.0, "eagle3-3step": 60.8, "eagle3-2step": [74.0, 88.0, 80.0]}
    d = fail_on_verdict(result(speeds, blocks=3), ["slower"])
    assert [c.status for c in d.checks] == ["fail", "inconclusive"] and d.exit_code == 3
    assert d.lines()[-1] == "fail-on slower: exit 3 (1 failed, 1 inconclusive)"


def test_an_a_a_test_names_the_arms_by_label() -> None:
    r = ABResult(
        experiment_id="E",
        simulated=True,
        host="local",
        profiles=("baseline", "baseline"),
        launches=result(SAME).launches,
        host_facts={},
        design=Design.make(2, 5, "fixed", 0),
    )
    assert "baseline#2 and baseline#1: no difference" in fail_on_verdict(r, ["slower"]).reasons[0]


# ---------------------------------------------------------------- modes


def test_modes_parse_repeated_and_comma_separated_and_refuse_unknown_ones() -> None:
    assert parse_modes(["slower,env", "slower", " Different "]) == ("slower", "env", "different")
    assert parse_modes([]) == ()
    with pytest.raises(InputError, match="unknown --fail-on mode 'faster'; valid: slower, different, env"):
        parse_modes(["slower,faster"])
    with pytest.raises(InputError):
        fail_on_verdict(result(SAME), ["regression"])
    assert MODES == ("slower", "different", "env")


def test_combined_modes_fail_over_inconclusive_over_ok() -> None:
    bad_env = {("baseline", 1): {"ok": False, "mismatches": [{"var": "NCCL_PROTO", "expected": "LL", "actual": None}]}}
    undecided = result(SLOWER, blocks=1)
    assert fail_on_verdict(undecided, ["slower", "env"]).exit_code == 4  # env ok, slower undecided
    mixed = result(SLOWER, blocks=2, env_reports=bad_env)
    d = fail_on_verdict(mixed, ["different,env"])
    assert d.exit_code == 3 and d.modes == ("different", "env")
    assert fail_on_verdict(result(SAME), ("slower", "env")).exit_code == 0
    equal_but_bad_env = result(SAME, blocks=2, env_reports=bad_env)
    d = fail_on_verdict(equal_but_bad_env, ["slower", "env"])
    assert d.exit_code == 3 and [c.mode for c in d.checks if c.status == "fail"] == ["env"]
    assert d.to_dict()["reasons"] == list(d.reasons)
    assert fail_on_verdict(result(SAME), []).exit_code == 0


# ---------------------------------------------------------------- one profile against its expect: block


def one_arm(speed: float | Sequence[float], blocks: int = 3, levels: Sequence[int] = (1,)) -> ABResult:
    return result({"eagle3-3step": speed}, blocks=blocks, levels=levels)


def test_bench_is_judged_against_its_expect_block() -> None:
    claim = Expect(tok_s=94.0)
    slower = fail_on_verdict(one_arm(60.8), ["slower"], expect=claim)
    assert slower.exit_code == 3
    assert slower.reasons[0].startswith("fail-on slower: eagle3-3step is slower than its expect: 60.8 tok/s, 95% CI ")
    assert "against expect.tok_s 94.0 (-35.3%, beyond ±3.0%)" in slower.reasons[0]
    met = fail_on_verdict(one_arm(94.2), ["slower", "different"], expect=claim)
    assert met.exit_code == 0 and all("meets its expect" in r for r in met.reasons)
    faster = one_arm(120.0)
    assert fail_on_verdict(faster, ["slower"], expect=claim).exit_code == 0
    different = fail_on_verdict(faster, ["different"], expect=claim)
    assert different.exit_code == 3 and "is faster than its expect" in different.reasons[0]


def test_bench_against_its_expect_is_inconclusive_from_one_launch_or_a_wide_ci() -> None:
    claim = Expect(tok_s=94.0)
    one = fail_on_verdict(one_arm(60.8, blocks=1), ["slower"], expect=claim)
    assert one.exit_code == 4 and "comes from one launch" in one.reasons[0]
    wide = fail_on_verdict(one_arm([88.0, 99.0, 93.0]), ["slower"], expect=claim)
    assert wide.exit_code == 4 and "against its expect is inconclusive" in wide.reasons[0]


def test_bench_tolerance_is_the_callers() -> None:
    claim = Expect(tok_s=94.0)
    assert fail_on_verdict(one_arm(88.0), ["slower"], expect=claim).exit_code == 3  # -6.4 % beyond ±3 %
    assert fail_on_verdict(one_arm(88.0), ["slower"], expect=claim, tolerance=0.10).exit_code == 0
    with pytest.raises(InputError, match="tolerance must be a fraction"):
        fail_on_verdict(one_arm(88.0), ["slower"], expect=claim, tolerance=3.0)


def test_bench_without_an_expectation_or_at_another_level_cannot_decide() -> None:
    assert fail_on_verdict(one_arm(83.0), ["slower"]).exit_code == 4
    assert "nothing to compare eagle3-3step with" in fail_on_verdict(one_arm(83.0), ["slower"]).reasons[0]
    at_8 = fail_on_verdict(one_arm(83.0, levels=(8,)), ["slower"], expect=Expect(tok_s=83.0))
    assert at_8.exit_code == 4 and "did not run concurrency 1" in at_8.reasons[0]
    ratio_only = fail_on_verdict(one_arm(83.0), ["slower"], expect=Expect(ratio=1.1, vs="baseline"))
    assert ratio_only.exit_code == 4
    assert fail_on_verdict(one_arm(83.0), ["env"]).exit_code == 0  # env needs no comparison


def test_single_profile_refusal_is_said_before_anything_runs() -> None:
    why = single_profile_refusal("fast", None, ["slower"])
    assert why == (
        "--fail-on slower needs something to compare with: a second profile (orch ab) or an `expect:` block with "
        "tok_s in profile fast (docs/reproduce.md)"
    )
    ratio_only = single_profile_refusal("e3", Expect(ratio=1.1, vs="baseline"), ["different"])
    assert ratio_only is not None and "orch ab baseline e3" in ratio_only
    assert single_profile_refusal("fast", None, ["env"]) is None
    assert single_profile_refusal("fast", Expect(tok_s=80.0), ["slower"]) is None
    at_8 = single_profile_refusal("fast", Expect(tok_s=80.0), ["slower"], concurrency=(8,))
    assert at_8 is not None and "add 1 to --concurrency" in at_8


# ---------------------------------------------------------------- env


def test_env_mismatch_fails_and_names_the_arm_block_and_variable() -> None:
    report = {
        "ok": False,
        "processes": 11,
        "mismatches": [
            {"pid": 10, "var": "NCCL_PROTO", "expected": "LL", "actual": None, "note": ""},
            {"pid": 11, "var": "NCCL_PROTO", "expected": "LL", "actual": "Simple", "note": ""},
        ],
    }
    d = fail_on_verdict(result(SAME, env_reports={("copy", 2): report}), ["env"])
    assert d.exit_code == 3
    (line,) = d.reasons
    assert line == (
        "fail-on env: copy (block 3): the workers' environment is not the profile's: NCCL_PROTO 'LL' in the "
        "profile, 'Simple' / missing in some processes -> exit 3"
    )


def test_env_ok_when_every_launch_checks_out() -> None:
    d = fail_on_verdict(result(SLOWER), ["env"])
    assert d.exit_code == 0 and d.status == "ok"
    assert "every launch's workers got the profile env" in d.reasons[0] and "(10 launch(es))" in d.reasons[0]


def test_fingerprint_drift_within_one_arm_fails() -> None:
    fps: dict[tuple[str, int], dict[str, Any] | None] = {
        ("copy", 3): fingerprint(profile__name="copy", software__engine_version="0.5.10", software__torch="2.6.0"),
    }
    d = fail_on_verdict(result(SAME, fingerprints=fps), ["env"])
    assert d.exit_code == 3
    assert d.reasons[0] == (
        "fail-on env: copy's launches did not run in one environment: block 4 vs block 1: engine version: 0.5.9 -> "
        "0.5.10; torch: 2.5.1 -> 2.6.0 -> exit 3"
    )
    gpus = {("baseline", b): fingerprint(profile__name="baseline", gpus__driver="560.1") for b in (2, 4)}
    d = fail_on_verdict(result(SAME, fingerprints=gpus), ["env"])
    assert "GPU driver: 550.54 -> 560.1; 1 more launch(es) differ" in d.reasons[0]


def test_volatile_host_facts_and_orch_itself_are_not_drift() -> None:
    volatile = fingerprint(
        profile__name="copy",
        host__hostname="box-2",
        host__boot_id="b-2",
        host__container_id="c-9",
        host__kernel="6.8.1",
        orch__git_sha="bbb",
        collected_at=99.0,
        software__python_executable="/other/venv/py",
        argv=["/other/venv/py", "-m", "sglang.launch_server"],
    )
    assert fail_on_verdict(result(SAME, fingerprints={("copy", 1): volatile}), ["env"]).exit_code == 0


def test_arms_differ_from_each_other_by_design() -> None:
    # Every baseline launch on 0.5.9, every copy launch on 0.5.10: an A/B of engine versions, not drift.
    fps = {("copy", b): fingerprint(profile__name="copy", software__engine_version="0.5.10") for b in range(5)}
    assert fail_on_verdict(result(SAME, fingerprints=fps), ["env"]).exit_code == 0


def test_fields_that_could_not_be_read_and_missing_fingerprints_are_no_evidence() -> None:
    unread = fingerprint(profile__name="copy", software__torch=None)
    unread["unreadable"] = [{"field": "software.torch", "why": "import failed: timeout"}]
    host_failed = fingerprint(profile__name="copy", gpus=None, host=None)
    host_failed["unreadable"] = [{"field": "host", "why": "connection dropped"}]
    broken = {"version": 1, "collected_at": 2.0, "error": "HostError: gone", "unreadable": []}
    fps = {("copy", 1): unread, ("copy", 2): host_failed, ("copy", 3): broken, ("copy", 4): None}
    d = fail_on_verdict(result(SAME, fingerprints=fps), ["env"])
    assert d.exit_code == 0, d.reasons
    assert "2 launch(es) without a fingerprint were not compared" in d.reasons[0]
    # Read on both sides and different: that is drift, whatever else could not be read.
    torch = fingerprint(profile__name="copy", software__torch="2.6.0")
    assert fail_on_verdict(result(SAME, fingerprints={("copy", 1): torch}), ["env"]).exit_code == 3


# ---------------------------------------------------------------- the CLI, on the simulator

SHORT = ("--sim", "--warmup", "0", "--runs", "1", "--max-tokens", "16", "--min-run-s", "0", "--grace", "2")


@pytest.fixture
def sim_pair(write_profile: WriteProfile, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Callable[..., None]:
    """Profiles `fast` and `slow` (the simulator at half speed) in ./profiles, without launch-to-launch noise so
    that two blocks decide; extra fields go into `fast`."""
    monkeypatch.chdir(tmp_path)

    def make(**fast: Any) -> None:
        quiet = {**FAST_SIM, "launch_noise": 0.0}
        common = {"engine": "sglang", "model_path": "/models/m", "tp_size": 1, "ready_timeout_s": 30}
        write_profile("fast", **common, port=free_port(), sim=quiet, **fast)
        write_profile("slow", **common, port=free_port(), sim={**quiet, "slowdown": 2.0})

    return make


def test_ab_fail_on_slower_exits_3_when_b_is_slower(
    sim_pair: Callable[..., None], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sim_pair()
    db = str(tmp_path / "r.db")
    # Three blocks (t with 2 degrees of freedom): two leave a 2x effect undecided whenever a loaded machine moves one
    # block's ratio by a fifth (CI saw it).
    assert main(["ab", "fast", "slow", *SHORT, "--blocks", "3", "--fail-on", "slower", "--db", db]) == 3
    out = capsys.readouterr().out
    # The report first. The simulated arms differ 2x; a loaded machine moves the measured ratio by a few per cent.
    assert re.search(r"slow vs fast @ 1: 0\.(4[5-9]|5[0-5])", out)
    (line,) = [ln for ln in out.splitlines() if ln.startswith("fail-on")]
    assert re.match(r"fail-on slower: slow is slower than fast \(ratio 0\.(4[5-9]|5[0-5])", line)
    assert line.endswith("-> exit 3")
    assert ops.op_find(NAMESPACE) == []
    # --fail-on is a decision, not a measurement setting: --resume takes it (and then finds nothing left to run).
    assert main(["ab", "--resume", "last", "--fail-on", "slower", "--db", db]) == 1
    assert "already complete" in capsys.readouterr().err


def test_ab_fail_on_exits_0_when_b_is_not_slower_and_json_has_the_decision(
    sim_pair: Callable[..., None], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sim_pair()
    args = ["ab", "slow", "fast", *SHORT, "--blocks", "3", "--json", "--db", str(tmp_path / "r.db")]  # see above
    assert main([*args, "--fail-on", "slower,env"]) == 0
    captured = capsys.readouterr()
    doc = json.loads(captured.out)  # stdout holds one JSON document, the decision inside it
    assert doc["comparisons"][0]["verdict"] == "faster"
    fail_on = doc["fail_on"]
    assert fail_on["modes"] == ["slower", "env"] and fail_on["exit_code"] == 0 and fail_on["status"] == "ok"
    assert [c["mode"] for c in fail_on["checks"]] == ["slower", "env"]
    assert "fast is faster than slow" in fail_on["checks"][0]["reason"]
    assert "plan:" in captured.err


def test_bench_fail_on_slower_without_expect_is_refused_before_anything_launches(
    sim_pair: Callable[..., None], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sim_pair()
    db = tmp_path / "r.db"
    assert main(["bench", "fast", *SHORT, "--fail-on", "slower", "--db", str(db)]) == 2
    err = capsys.readouterr().err
    assert "--fail-on slower needs something to compare with: a second profile (orch ab) or an `expect:`" in err
    assert "profile fast (docs/reproduce.md)" in err
    assert not db.exists() or sqlite3.connect(db).execute("SELECT COUNT(*) FROM experiments").fetchone()[0] == 0
    assert main(["bench", "fast", *SHORT, "--fail-on", "slower,faster", "--db", str(db)]) == 2
    assert "valid: slower, different, env" in capsys.readouterr().err
    assert not db.exists()


def test_bench_fail_on_slower_judges_the_expect_block(
    sim_pair: Callable[..., None], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sim_pair(
        expect={"tok_s": 200.0, "note": "a claim this box cannot meet"}
    )  # the simulator gives ~80 tok/s (less over 16 tokens): far enough below for 2 launches on a loaded machine
    args = ["bench", "fast", *SHORT, "--blocks", "2", "--db", str(tmp_path / "r.db")]
    assert main([*args, "--fail-on", "slower"]) == 3
    out = capsys.readouterr().out
    assert "fail-on slower: fast is slower than its expect: " in out and "against expect.tok_s 200.0" in out


def test_bench_fail_on_env_catches_a_worker_without_the_profile_env(
    sim_pair: Callable[..., None], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sim_pair(env={"NCCL_PROTO": "LL"})
    # The simulator's drop_env knob removes the variable from its workers, as a wrapper script might.
    sim = {**FAST_SIM, "drop_env": "NCCL_PROTO"}
    Path("profiles/dropped.yaml").write_text(json.dumps({"extends": "fast", "sim": sim}))
    assert main(["bench", "dropped", *SHORT, "--fail-on", "env", "--db", str(tmp_path / "r.db")]) == 3
    out = capsys.readouterr().out
    assert "fail-on env: dropped (block 1): the workers' environment is not the profile's: NCCL_PROTO 'LL'" in out


# ---------------------------------------------------------------- bounds on the crossover and the SLO capacity


def test_bound_modes_parse_with_their_load_and_refuse_a_missing_or_bad_one() -> None:
    assert parse_modes(["slower,crossover-below=6.0", "Max-Rate-SLO-Below = 2.5", "crossover-below=6"]) == (
        "slower", "crossover-below=6", "max-rate-slo-below=2.5",
    )  # fmt: skip
    assert across_levels_metric("crossover-below=6") == "crossover" and across_levels_metric("slower") is None
    for bad in ("crossover-below", "crossover-below=0", "crossover-below=fast", "max-rate-slo-below=inf"):
        with pytest.raises(InputError, match=r"=R needs R, a load above 0 in the levels' unit"):
            parse_modes([bad])
    with pytest.raises(InputError, match="valid: slower, different, env, crossover-below=R, max-rate-slo-below=R"):
        parse_modes(["crossover-above=4"])


def _cross(status: str, at: float | None = None, lo: float | None = None, hi: float | None = None,
           pays_below: bool | None = True) -> Crossover:  # fmt: skip
    return Crossover(
        status=status,
        at=at,
        lo=lo,
        hi=hi,
        pays_below=pays_below if status == "crosses" else None,
        levels=(1.0, 2.0, 4.0, 8.0),
        blocks=3,
    )


@pytest.mark.parametrize(
    ("crossing", "bound", "status", "said"),
    [
        (_cross("crosses", 3.0, 2.5, 3.5), 4, "fail", "is ~3 req/s (95% CI 2.5 req/s to 3.5 req/s, over 3 blocks): "
         "below 4 req/s"),
        (_cross("crosses", 3.0, 2.5, 3.5), 2, "ok", "at or above 2 req/s"),
        (_cross("crosses", 3.0, 2.5, 3.5), 3, "inconclusive", "the CI straddles 3 req/s; more blocks narrow it"),
        (_cross("crosses", 1.5, None, 1.9), 2, "fail", "95% CI below 1 req/s to 1.9 req/s"),  # open below, wholly below
        (_cross("crosses", 7.0, 6.0, None), 4, "ok", "95% CI 6 req/s to beyond 8 req/s"),  # open above, wholly above
        (_cross("crosses", 7.0, None, None), 4, "inconclusive", "straddles"),
        (_cross("pays throughout"), 8, "ok", "lies beyond the range measured (1 req/s to 8 req/s: it pays"),
        (_cross("pays throughout"), 16, "inconclusive", "the range ends below 16 req/s: add a level at or above it"),
        (_cross("never pays"), 1, "fail", "lies below the range measured (1 req/s to 8 req/s: it pays at no level)"),
        (_cross("never pays"), 0.5, "inconclusive", "the range starts above 0.5 req/s: add a level at or below it"),
        (_cross("undecided", None, 2.0, None), 4, "inconclusive", "undecided: no crossing seen, but one may lie"),
        (_cross("crosses", 3.0, 2.5, 3.5, pays_below=False), 4, "fail", "worse below ~3 req/s, better above it"),
    ],
)  # fmt: skip
def test_a_bound_fails_below_passes_above_and_is_inconclusive_when_the_ci_straddles_it(
    crossing: Crossover, bound: float, status: str, said: str
) -> None:
    check = bound_check(f"crossover-below={bound:g}", "eagle3's crossover vs baseline", crossing, bound, True,
                        ("it pays at every level", "it pays at no level"))  # fmt: skip
    assert check.status == status and said in check.text, check.text
    assert check.exit_code == {"ok": 0, "fail": 3, "inconclusive": 4}[status]


def test_bounds_judge_a_result_s_crossover_and_each_arm_s_slo_capacity() -> None:
    from tests.nightly.test_nightly_load import CROSSES, P99, load_result

    r = load_result(CROSSES, P99)  # eagle3 pays below ~3.06 req/s; p99 within 300 ms up to ~3 (eagle3), ~5.8
    decision = fail_on_verdict(r, ["crossover-below=2,crossover-below=6", "max-rate-slo-below=4"])
    assert [(c.mode, c.status) for c in decision.checks] == [
        ("crossover-below=2", "ok"), ("crossover-below=6", "fail"),
        ("max-rate-slo-below=4", "ok"), ("max-rate-slo-below=4", "fail"),
    ]  # fmt: skip
    assert decision.exit_code == 3
    assert decision.checks[3].text.startswith("eagle3's highest load within the SLO is ~3 req/s (95% CI 2.93")
    # Without the SLO (or the levels) there is nothing to judge: undecided, never ok.
    one_level = result(SLOWER)
    (check,) = fail_on_verdict(one_level, ["crossover-below=4"]).checks
    assert check.status == "inconclusive" and "no crossover to judge" in check.text


def test_bounds_this_experiment_could_never_judge_are_refused_before_launch() -> None:
    assert levels_refusal(["slower"], levels=1, arms=2, percentile_slo=False) is None
    assert levels_refusal(["crossover-below=4"], levels=3, arms=2, percentile_slo=False) is None
    one = levels_refusal(["crossover-below=4"], levels=1, arms=2, percentile_slo=True)
    assert one is not None and "--fail-on crossover-below=4: needs two or more levels" in one
    single = levels_refusal(["crossover-below=4"], levels=3, arms=1, percentile_slo=True)
    assert single is not None and "needs two or more profiles (orch ab)" in single
    no_slo = levels_refusal(["max-rate-slo-below=4"], levels=3, arms=1, percentile_slo=False)
    assert no_slo is not None and "needs --slo with a percentile objective" in no_slo
    # orch bench runs one block unless told: a CI over blocks could never be had
    one_block = levels_refusal(["max-rate-slo-below=4"], levels=3, arms=1, percentile_slo=True, blocks=1)
    assert one_block == (
        "--fail-on max-rate-slo-below=4: its 95% CI is taken over blocks and needs two or more (--blocks 2 or more); "
        "this experiment runs 1"
    )
    assert levels_refusal(["max-rate-slo-below=4"], levels=3, arms=1, percentile_slo=True, blocks=2) is None
    assert levels_refusal(["slower"], levels=3, arms=2, percentile_slo=True, blocks=1) is None


def test_ab_fail_on_a_bound_without_levels_exits_2_before_anything_launches(
    sim_pair: Callable[..., None], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sim_pair()
    db = tmp_path / "r.db"
    assert main(["ab", "fast", "slow", *SHORT, "--fail-on", "crossover-below=4", "--db", str(db)]) == 2
    assert "--fail-on crossover-below=4: needs two or more levels" in capsys.readouterr().err
    args = ["ab", "fast", "slow", *SHORT, "--rate", "2,4", "--requests", "2", "--db", str(db)]
    assert main([*args, "--fail-on", "max-rate-slo-below=1"]) == 2
    assert "needs --slo with a percentile objective" in capsys.readouterr().err
    assert main([*args, "--fail-on", "crossover-below=x"]) == 2
    assert "crossover-below=R needs R" in capsys.readouterr().err
    one = ["bench", "fast", *SHORT, "--rate", "2,4", "--requests", "2", "--slo", "e2e_p99=1s", "--db", str(db)]
    assert main([*one, "--fail-on", "max-rate-slo-below=1"]) == 2
    assert "its 95% CI is taken over blocks and needs two or more" in capsys.readouterr().err
    assert not db.exists() or sqlite3.connect(db).execute("SELECT COUNT(*) FROM experiments").fetchone()[0] == 0


def test_ab_fail_on_a_crossover_bound_on_open_loop_levels(
    sim_pair: Callable[..., None], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sim_pair()
    args = ["ab", "fast", "slow", *SHORT, "--rate", "2,4", "--requests", "3", "--blocks", "3", "--json"]
    # slow is half as fast at both rates: it pays at no level, so its crossover lies below 2 req/s, below 3 (exit 3);
    # whether it pays at 1 req/s, below the range, the levels cannot say (that check alone would be exit 4).
    code = main([*args, "--slo", "ttft_p99=30s", "--fail-on", "crossover-below=3,crossover-below=1,"
                 "max-rate-slo-below=4", "--db", str(tmp_path / "r.db")])  # fmt: skip
    doc = json.loads(capsys.readouterr().out)
    checks = doc["fail_on"]["checks"]
    assert code == 3 and doc["fail_on"]["exit_code"] == 3, checks
    assert [(c["mode"], c["status"]) for c in checks] == [
        ("crossover-below=3", "fail"), ("crossover-below=1", "inconclusive"),
        ("max-rate-slo-below=4", "ok"), ("max-rate-slo-below=4", "ok"),
    ]  # fmt: skip
    assert "slow's crossover vs fast lies below the range measured (2 req/s to 4 req/s" in checks[0]["reason"]
    assert "within the SLO at every level" in checks[2]["reason"]
    assert ops.op_find(NAMESPACE) == []
    # The stored experiment, exported: every run's requests found again by its rate (each open-loop level has
    # concurrency 0 and run indices from 0), so each row has its goodput, and the arm's with a CI.
    assert main(["export", "last", "--format", "csv", "--db", str(tmp_path / "r.db")]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert len(rows) == 12 and {r["rate"] for r in rows} == {"2", "4"}
    for row in rows:
        assert float(row["goodput_req_s"]) > 0 and float(row["arm_goodput_req_s_lo"]) <= float(row["arm_goodput_req_s"])
        assert row["j_per_token"] == ""  # no nvidia-smi here
