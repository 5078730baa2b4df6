"""Bad input never escapes as a crash, is never accepted silently, and never runs as a command."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.cli import main
from orchestrator.config import profile as P
from orchestrator.errors import HostError, InputError, ProfileError
from orchestrator.hosts.inventory import load_inventory
from tests.conftest import FAST_SIM, NAMESPACE, WriteProfile, free_port, run_orch

BASE: dict[str, Any] = {"engine": "sglang", "model_path": "/m", "tp_size": 1, "port": 8000}


def _no_crash(capsys: pytest.CaptureFixture[str], rc: int, allowed: tuple[int, ...] = (0, 2)) -> str:
    out, err = capsys.readouterr()
    assert rc in allowed, out + err
    assert "Error: unexpected" not in err and "Traceback" not in err, err  # a YAML message may say "unexpected"
    return out + err


def _no_orch_launches() -> None:
    from orchestrator.agent import ops

    assert ops.op_find(NAMESPACE) == []


# ---------------------------------------------------------------- 1. NaN and infinity


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf"])
@pytest.mark.parametrize("key", ["ready_timeout_s", "mem_fraction_static"])
def test_profile_refuses_non_finite_numbers(write_profile: WriteProfile, key: str, value: str) -> None:
    path = write_profile("nan", text=yaml.safe_dump(BASE) + f"{key}: {value}\n")
    with pytest.raises(ProfileError, match=rf"nan\.yaml: {key}: expected a number .*not a finite number"):
        P.load(str(path))


@pytest.mark.parametrize("value", [".nan", ".inf"])
@pytest.mark.parametrize("knob", ["decode_ms", "accept_alpha", "load_s"])
def test_sim_block_refuses_non_finite_numbers(write_profile: WriteProfile, knob: str, value: str) -> None:
    path = write_profile("nan", text=yaml.safe_dump(BASE) + f"sim: {{{knob}: {value}}}\n")
    with pytest.raises(ProfileError, match=rf"nan\.yaml: sim\.{knob}: .*(finite|out of range)"):
        P.load(str(path))


@pytest.mark.parametrize("key", ["connect_timeout_s", "reconnect_s"])
def test_inventory_refuses_non_finite_numbers(tmp_path: Path, key: str) -> None:
    inv = tmp_path / "hosts.yaml"
    inv.write_text(f"hosts:\n  gpu-box: {{{key}: .nan}}\n")
    with pytest.raises(InputError, match=rf"hosts\.gpu-box\.{key}: expected a number .*not a finite number"):
        load_inventory(str(inv))


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "NaN"])
@pytest.mark.parametrize(
    "option", ["--ready-timeout", "--grace", "--min-run-s", "--target-tps", "--gpu-wait", "--wait"]
)
def test_bench_float_options_refuse_non_finite(
    option: str, value: str, capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    # Options are parsed before the profile is looked up, so a missing profile shows which check refused.
    rc = main(["bench", "no-such-profile", "--sim", f"{option}={value}"])
    text = _no_crash(capsys, rc, (2,))
    assert option in text and "no profile named" not in text


@pytest.mark.parametrize(
    "args",
    [
        ["--baseline-tps", "inf", "--cycle-ms", "30"],
        ["--baseline-tps", "nan", "--cycle-ms", "30"],
        ["--baseline-tps", "82", "--cycle-ms", "inf"],
        ["--baseline-tps", "82", "--cycle-ms", "30", "--accept-length", "nan"],
        ["--baseline-tps", "82", "--cycle-ms", "30", "--target-tps", "inf"],
        ["--baseline-tps", "1e308", "--cycle-ms", "1e308", "--target-tps", "1e308"],
    ],
)
def test_breakeven_refuses_non_finite_and_absurd_numbers(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["breakeven", "--steps", "3", *args])
    _no_crash(capsys, rc, (2,))


def test_down_grace_refuses_nan(capsys: pytest.CaptureFixture[str]) -> None:
    _no_crash(capsys, main(["down", "--grace", "nan"]), (2,))


def test_breakeven_arithmetic_refuses_infinity() -> None:
    from orchestrator.stats import estimates

    with pytest.raises(ValueError, match="finite"):
        estimates.breakeven(math.inf, 30.0, 3)


# ---------------------------------------------------------------- 2. deep nesting


@pytest.mark.parametrize(
    "deep",
    [
        "[" * 100_000,
        "{a: " * 100_000,
        "[" * 50_000 + "]" * 50_000,
        "".join("\n" + " " * i + "a:" for i in range(1, 900)),
    ],
)
def test_deeply_nested_yaml_is_a_clear_error(write_profile: WriteProfile, tmp_path: Path, deep: str) -> None:
    path = write_profile("deep", text="model_path: " + deep)
    t0 = time.monotonic()
    with pytest.raises(ProfileError, match=r"deep\.yaml: not valid YAML .*nested more than \d+ levels deep"):
        P.load(str(path))
    inv = tmp_path / "hosts.yaml"
    inv.write_text("hosts: " + deep)
    with pytest.raises(InputError, match=r"hosts\.yaml: not valid YAML .*nested more than \d+ levels deep"):
        load_inventory(str(inv))
    assert time.monotonic() - t0 < 10


def test_profiles_list_marks_a_deep_profile_invalid_and_goes_on(
    write_profile: WriteProfile, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    write_profile("aaa-deep", text="[" * 100_000)
    write_profile("zzz-good", **BASE, description="still listed")
    monkeypatch.chdir(tmp_path)
    out = _no_crash(capsys, main(["profiles", "list"]), (0,))
    assert "aaa-deep" in out and "INVALID" in out and "nested more than" in out
    assert "still listed" in out and "baseline" in out


# ---------------------------------------------------------------- 3. duplicate keys


def test_duplicate_keys_in_a_profile_are_refused_with_both_lines(write_profile: WriteProfile) -> None:
    top = write_profile("dup", text="engine: sglang\nmodel_path: /a\ntp_size: 1\nport: 1\nmodel_path: /b\n")
    with pytest.raises(ProfileError, match=r"dup\.yaml: .*duplicate key model_path \(lines 2 and 5\)"):
        P.load(str(top))
    nested = write_profile("dupenv", text=yaml.safe_dump(BASE) + "env:\n  NCCL_PROTO: LL\n  NCCL_PROTO: Simple\n")
    with pytest.raises(ProfileError, match=r"duplicate key NCCL_PROTO \(lines 6 and 7\)"):
        P.load(str(nested))


def test_yaml_merge_keys_still_override(write_profile: WriteProfile) -> None:
    # A merged key overridden by an explicit one is what `<<` is for, not a duplicate.
    path = write_profile("merge", text=yaml.safe_dump(BASE) + "env:\n  <<: {A: '1', B: '2'}\n  A: '3'\n")
    assert P.load(str(path)).env_dict() == {"A": "3", "B": "2"}


def test_duplicate_keys_in_the_inventory_are_refused(tmp_path: Path) -> None:
    inv = tmp_path / "hosts.yaml"
    inv.write_text("hosts:\n  gpu-box:\n    user: a\n  other: {}\n  gpu-box:\n    user: b\n")
    with pytest.raises(HostError, match=r"duplicate key gpu-box \(lines 2 and 5\)") as e:
        load_inventory(str(inv))
    assert isinstance(e.value, InputError)


# ---------------------------------------------------------------- 4. reserved env names


@pytest.mark.parametrize("name", ["ORCH_LAUNCH_ID", "SPT_NOENV", "ORCH_OWNER", "ORCH_NAMESPACE", "ORCH_ANYTHING"])
def test_reserved_env_names_are_refused(write_profile: WriteProfile, name: str) -> None:
    path = write_profile("res", **BASE, env={name: "x"})
    with pytest.raises(ProfileError, match=rf"res\.yaml: env\.{name}: reserved: orch sets"):
        P.load(str(path))


def test_simulator_knobs_in_env_are_allowed(write_profile: WriteProfile) -> None:
    path = write_profile("ok", **BASE, env={"ORCH_SIM_DECODE_MS": 5, "ORCH_SIM_FAULT": "ignore-sigterm"})
    assert P.load(str(path)).env_dict()["ORCH_SIM_DECODE_MS"] == "5"


# ---------------------------------------------------------------- 5. simulator knobs at load


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"env": {"ORCH_SIM_DECODE_MS": "-3"}}, r"env\.ORCH_SIM_DECODE_MS: .*out of range: expected a number between"),
        ({"env": {"ORCH_SIM_DECODE_MS": "fast"}}, r"env\.ORCH_SIM_DECODE_MS: .*expected a number between"),
        ({"env": {"ORCH_SIM_DECODE_MSEC": "3"}}, r"env\.ORCH_SIM_DECODE_MSEC: unknown simulator knob .*valid"),
        ({"env": {"ORCH_SIM_FAULT": "explode"}}, r"env\.ORCH_SIM_FAULT: .*unknown fault 'explode'.*valid faults"),
        ({"sim": {"accept_alpha": 1.5}}, r"sim\.accept_alpha: .*expected a number between 0 and 1"),
        ({"sim": {"drop_env": "a b"}}, r"sim\.drop_env: .*not an environment variable name"),
        ({"sim": {"fault": "exit-during-load,hang-during-load"}}, r"sim\.fault: .*cannot be combined"),
        ({"sim": {"seed": 1.5}}, r"sim\.seed: expected an integer"),
        (
            {"sim": {"decode_ms": 3}, "env": {"ORCH_SIM_DECODE_MS": "4"}},
            r"env\.ORCH_SIM_DECODE_MS: the same simulator knob as sim\.decode_ms",
        ),
    ],
)
def test_bad_simulator_knobs_are_refused_at_load(
    write_profile: WriteProfile,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    extra: dict[str, Any],
    message: str,
) -> None:
    path = write_profile("knob", **{**BASE, "port": free_port()}, **extra)
    with pytest.raises(ProfileError, match=r"knob\.yaml: " + message):
        P.load(str(path))
    assert main(["profiles", "validate", str(path)]) == 2
    assert "knob.yaml" in capsys.readouterr().out
    monkeypatch.chdir(tmp_path)
    # `orch ab` refuses before any server starts.
    text = _no_crash(
        capsys, main(["ab", str(path), str(path), "--sim", "--runs", "1", "--warmup", "0", "--max-tokens", "8"]), (2,)
    )
    assert "knob.yaml" in text and "results database" not in text
    _no_orch_launches()


# ---------------------------------------------------------------- 6. two files with the same name


def test_two_different_profiles_with_one_name_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    port = free_port()
    (tmp_path / "a" / "x.yaml").write_text(yaml.safe_dump({**BASE, "port": port, "sim": FAST_SIM}))
    (tmp_path / "b" / "x.yaml").write_text(yaml.safe_dump({**BASE, "port": port, "tp_size": 2, "sim": FAST_SIM}))
    monkeypatch.chdir(tmp_path)
    # A missing prompt file would fail later: what the error says shows which check refused the experiment.
    text = _no_crash(capsys, main(["ab", "a/x.yaml", "b/x.yaml", "--sim", "--prompts", "none.jsonl"]), (2,))
    assert "a/x.yaml and b/x.yaml are both named 'x' but differ in tp_size" in text and "Rename one" in text
    _no_orch_launches()


def test_the_same_profile_twice_is_still_an_a_a_test(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "x.yaml").write_text(yaml.safe_dump({**BASE, "description": "one"}))
    (tmp_path / "b" / "x.yaml").write_text(yaml.safe_dump({**BASE, "description": "a copy"}))
    monkeypatch.chdir(tmp_path)
    for args in (["a/x.yaml", "a/x.yaml"], ["a/x.yaml", "b/x.yaml"]):
        text = _no_crash(capsys, main(["ab", *args, "--sim", "--prompts", "none.jsonl"]), (2,))
        assert "none.jsonl: cannot read the prompt file" in text and "both named" not in text
    _no_orch_launches()


# ---------------------------------------------------------------- 7. absurd workloads


def test_an_absurd_workload_is_refused_before_the_request_sequence_is_built(
    write_profile: WriteProfile,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from orchestrator.config import plan, prompts
    from orchestrator.experiment import run

    path = write_profile("p", **{**BASE, "port": free_port()}, sim=FAST_SIM)
    built: list[object] = []
    monkeypatch.setattr(run, "check_requests", lambda config: built.append(config))
    monkeypatch.setattr(prompts, "request_sequence", lambda *a, **k: built.append(a))
    monkeypatch.chdir(tmp_path)
    t0 = time.monotonic()
    rc = main(["bench", str(path), "--sim", "--runs", "10000", "--concurrency", "4096"])
    text = _no_crash(capsys, rc, (2,))
    assert time.monotonic() - t0 < 60 and not built  # refused before building anything
    assert "plan: 1 launch(es) x 10000 runs (+2 warmup), 40960002 requests" in text
    assert "(simulator calibration)" in text
    assert f"over the limit of {plan.MAX_REQUESTS_PER_LAUNCH}" in text
    rc = main(["bench", str(path), "--runs", "10000", "--max-tokens", "1000000"])
    text = _no_crash(capsys, rc, (2,))
    assert "unknown for this engine" in text and not built
    assert f"over the limit of {plan.MAX_OUTPUT_TOKENS_PER_LAUNCH}" in text


def test_plan_arithmetic() -> None:
    from orchestrator.config.plan import plan
    from orchestrator.config.workload import BenchConfig

    config = BenchConfig(runs=3, warmup=2, max_tokens=100, concurrency=(1, 4), requests_per_stream=2)
    work = plan(config, [(lambda c: 100.0 / c, 5.0), (lambda c: 50.0, 0.0)], blocks=2, calibrated=True)
    assert (work.launches, work.runs_per_launch, work.requests_per_launch) == (4, 8, 2 + 3 * (2 + 8))
    assert work.output_tokens_per_launch == 2 * 64 + 30 * 100
    arm1 = 5.0 + 2 * 64 / 100 + 3 * 2 * 100 / 100 + 3 * 2 * 100 / 25
    arm2 = 2 * 64 / 50 + 2 * 3 * 2 * 100 / 50
    assert work.seconds == pytest.approx(2 * (arm1 + arm2)) and work.refusal() is None


# ---------------------------------------------------------------- 8. exit codes


def test_invalid_input_files_exit_2(
    write_profile: WriteProfile, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = write_profile("bad", **BASE, tp_sise=1)
    monkeypatch.chdir(tmp_path)
    text = _no_crash(capsys, main(["profiles", "show", str(bad)]), (2,))
    assert text.startswith("Error: ") and "tp_sise: unknown field" in text
    _no_crash(capsys, main(["ab", str(bad), "baseline", "--sim"]), (2,))
    inv = tmp_path / "hosts.yaml"
    inv.write_text("hosts: [1, 2]\n")
    text = _no_crash(capsys, main(["hosts", "list", "--inventory", str(inv)]), (2,))
    assert "hosts.yaml: hosts: expected a mapping" in text
    _no_crash(capsys, main(["bench", "baseline", "--sim", "--prompts", str(tmp_path / "none.jsonl")]), (2,))
    (tmp_path / "p.jsonl").write_bytes(b'{"prompt": "\xff\xfe"}\n')
    text = _no_crash(capsys, main(["bench", "baseline", "--sim", "--prompts", str(tmp_path / "p.jsonl")]), (2,))
    assert "not UTF-8" in text
    _no_orch_launches()


# ---------------------------------------------------------------- 9. fuzzing with hostile values

CANARY_NAME = "CANARY"


def _payloads(canary: Path) -> st.SearchStrategy[str]:
    hostile = [
        f"$(touch {canary})",
        f"`touch {canary}`",
        f"x; touch {canary}",
        f"x && touch {canary} #",
        f"x | touch {canary}",
        f"x\ntouch {canary}\n",
        f"'; touch {canary}; '",
        f'"; touch {canary}; "',
        f"--port=1 $(touch {canary})",
        "a\0b",
        "\r\n\t\x1b[31m",
        "x" * 200_000,
        "${HOME}",
        "%s%n{0}{}",
        "ünïcödé ✓ \u202e",
    ]
    return st.one_of(
        st.sampled_from(hostile),
        st.text(st.characters(codec="utf-8"), max_size=40),
        st.builds(lambda a, b: a + b, st.sampled_from(hostile), st.text(max_size=10)),
    )


def _profile_with(key: str, value: Any) -> dict[str, Any]:
    data: dict[str, Any] = {**BASE, "sim": dict(FAST_SIM)}
    if key in ("env-value", "env-key"):
        data["env"] = {"A": value} if key == "env-value" else {value: "1"}
    elif key == "server_args":
        data["server_args"] = ["--x", value, value]
    elif key.startswith("speculative."):
        data["speculative"] = {"algorithm": "EAGLE3", "num_steps": 3, key.split(".", 1)[1]: value}
    elif key.startswith("sim."):
        data["sim"][key.split(".", 1)[1]] = value
    elif key == "unknown-key":
        data[value] = 1
    else:
        data[key] = value
    return data


PROFILE_KEYS = [
    "model_path",
    "served_model_name",
    "host",
    "description",
    "extends",
    "engine",
    "server_args",
    "env-value",
    "env-key",
    "speculative.draft_model_path",
    "speculative.algorithm",
    "sim.fault",
    "sim.drop_env",
    "sim.decode_ms",
    "unknown-key",
    "tp_size",
]

FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@FUZZ
@given(data=st.data())
def test_fuzz_profiles(
    data: st.DataObject, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    canary = tmp_path / CANARY_NAME
    monkeypatch.chdir(tmp_path)
    key = data.draw(st.sampled_from(PROFILE_KEYS), label="field")
    value = data.draw(_payloads(canary), label="value")
    path = tmp_path / "fuzz.yaml"
    if data.draw(st.booleans(), label="raw bytes"):
        # Hostile bytes spliced into an otherwise valid file: non-UTF-8, control characters, broken YAML.
        text = yaml.safe_dump(BASE).encode()
        cut = data.draw(st.integers(0, len(text)), label="cut")
        path.write_bytes(text[:cut] + data.draw(st.binary(max_size=64), label="bytes") + text[cut:])
    else:
        path.write_text(yaml.safe_dump(_profile_with(key, value), allow_unicode=False))
    try:
        prof = P.validate_file(str(path))
        prof.launch_argv("python3", simulate=True)
        prof.to_dict()
    except ProfileError:
        pass
    for args in (["profiles", "validate", str(path)], ["profiles", "show", str(path), "--sim"]):
        _no_crash(capsys, main(args))
    assert not canary.exists()


HOST_KEYS = ["name", "address", "user", "python", "workdir", "nvidia_smi", "identity_file", "foreign_port", "port"]


@FUZZ
@given(data=st.data())
def test_fuzz_inventory(data: st.DataObject, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    canary = tmp_path / CANARY_NAME
    key = data.draw(st.sampled_from(HOST_KEYS), label="field")
    value = data.draw(_payloads(canary), label="value")
    inv = tmp_path / "hosts.yaml"
    if data.draw(st.booleans(), label="raw bytes"):
        text = b"hosts:\n  gpu-box: {address: 10.0.0.1, user: me}\n"
        cut = data.draw(st.integers(0, len(text)), label="cut")
        inv.write_bytes(text[:cut] + data.draw(st.binary(max_size=64), label="bytes") + text[cut:])
    else:
        settings_: dict[str, Any] = {"address": "10.0.0.1"}
        name = value if key == "name" else "gpu-box"
        if key != "name":
            settings_[key] = [value] if key == "identity_file" else value
        inv.write_text(yaml.safe_dump({"hosts": {name: settings_}}))
    try:
        load_inventory(str(inv))
    except HostError as e:
        assert isinstance(e, InputError)
    _no_crash(capsys, main(["hosts", "list", "--inventory", str(inv)]))
    assert not canary.exists()


def test_shell_metacharacters_never_run_end_to_end(tmp_path: Path) -> None:
    """A real launch through the simulator: every hostile value stays one argv item or env value."""
    canary = tmp_path / CANARY_NAME
    touch = f"touch {canary}"
    prof = tmp_path / "evil.yaml"
    prof.write_text(
        yaml.safe_dump(
            {
                "engine": "sglang",
                "model_path": f"/models/$({touch}); {touch}",
                "served_model_name": f"m`{touch}`|{touch}&&{touch}",
                "tp_size": 1,
                "port": free_port(),
                "ready_timeout_s": 30,
                "description": f"$({touch})",
                "server_args": ["--log-level", "info", f"--extra-flag=$({touch})"],
                "env": {"EVIL": f"$({touch})\n{touch}", "NCCL_PROTO": "LL"},
                "sim": FAST_SIM,
            }
        )
    )
    args = ["bench", str(prof), "--sim", "--runs", "1", "--warmup", "0", "--max-tokens", "8", "--min-run-s", "0"]
    proc = run_orch(*args, "--db", str(tmp_path / "r.db"), cwd=tmp_path)
    out, err = proc.communicate(timeout=120)
    assert "Traceback" not in out + err and "Error: unexpected" not in err, out + err
    assert not canary.exists(), out + err
    assert proc.returncode == 0, out + err  # the payloads really went through a launch, a run and a report


def test_a_name_too_long_for_the_filesystem_is_a_clear_error(
    write_profile: WriteProfile, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Found by test_fuzz_profiles: Path.is_file() raises ENAMETOOLONG instead of answering False.
    long = "x" * 5000
    child = write_profile("child", **BASE, extends=long)
    with pytest.raises(ProfileError, match=r"child\.yaml: extends: no profile named 'x+'"):
        P.load(str(child))
    _no_crash(capsys, main(["profiles", "show", long]), (2,))
    _no_crash(capsys, main(["hosts", "list", "--inventory", str(tmp_path / (long + ".yaml"))]), (2,))
