"""Profiles: bundled set, merging, and every kind of bad input giving a precise error."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from orchestrator.config import profile as P
from orchestrator.errors import ProfileError
from tests.conftest import WriteProfile

REPO = Path(__file__).resolve().parents[2]


def test_bundled_profiles_resolve_to_the_seed_configuration() -> None:
    base = P.load(str(REPO / "profiles" / "baseline.yaml"))
    assert base.tp_size == 8 and base.trust_remote_code and base.speculative is None
    assert base.env_dict() == {
        "NCCL_PROTO": "LL",
        "NCCL_ALGO": "Ring",
        "NCCL_P2P_LEVEL": "SYS",
        "NCCL_MAX_NCHANNELS": "16",
        "NCCL_BUFFSIZE": "16777216",
        "NCCL_NTHREADS": "512",
    }
    three = P.load(str(REPO / "profiles" / "eagle3-3step.yaml"))
    assert three.speculative == P.Speculative(
        algorithm="EAGLE3", draft_model_path="/models/Kimi-K25-eagle3", num_steps=3, eagle_topk=1, num_draft_tokens=4
    )
    two = P.load(str(REPO / "profiles" / "eagle3-2step.yaml"))
    assert two.speculative is not None and (two.speculative.num_steps, two.speculative.num_draft_tokens) == (2, 3)
    assert two.chain == ("eagle3-2step", "eagle3-3step", "kimi-k25-int4-tp8")
    argv = three.launch_argv("/root/ml-env/bin/python3", simulate=False)
    assert argv[:3] == ["/root/ml-env/bin/python3", "-m", "sglang.launch_server"]
    joined = shlex.join(argv)
    for flag in (
        "--tp-size 8",
        "--trust-remote-code",
        "--speculative-algorithm EAGLE3",
        "--speculative-num-steps 3",
        "--speculative-eagle-topk 1",
        "--speculative-num-draft-tokens 4",
        "--port 8000",
    ):
        assert flag in joined
    assert three.launch_argv("py", simulate=True)[2] == "orchestrator.sim"


def test_lookup_by_name_prefers_local_profiles_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, write_profile: WriteProfile
) -> None:
    monkeypatch.chdir(tmp_path)
    write_profile("baseline", engine="sglang", model_path="/m", tp_size=1, port=9999)
    assert P.load("baseline").port == 9999
    assert P.load("eagle3-3step").port == 8000  # falls through to the bundled set
    with pytest.raises(ProfileError, match=r"no profile named 'eagle3-3stp' \(did you mean 'eagle3-3step'\?\)"):
        P.load("eagle3-3stp")


def test_env_merges_by_key_and_null_removes(write_profile: WriteProfile) -> None:
    write_profile(
        "parent",
        engine="sglang",
        model_path="/m",
        tp_size=2,
        port=1234,
        env={"A": "1", "B": "2", "C": 3},
        server_args=["--x", "1"],
    )
    child = write_profile("child", extends="parent", env={"B": None, "D": "4"}, server_args=["--y"])
    prof = P.load(str(child))
    assert prof.env_dict() == {"A": "1", "C": "3", "D": "4"}
    assert prof.server_args == ("--y",)  # lists replace, they do not append
    assert prof.tp_size == 2


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"tp_sise": 8}, r"bad\.yaml: tp_sise: unknown field \(did you mean 'tp_size'\?\)"),
        ({"tp_size": "eight"}, r"bad\.yaml: tp_size: expected an integer from 1 to 1024, got 'eight'"),
        ({"tp_size": 0}, r"tp_size: expected an integer from 1 to 1024, got 0"),
        ({"port": 70000}, r"port: expected an integer from 1 to 65535, got 70000"),
        ({"trust_remote_code": "yes"}, r"trust_remote_code: expected true or false, got 'yes'"),
        ({"mem_fraction_static": 1.5}, r"mem_fraction_static: expected a number > 0.0 and <= 1.0, got 1.5"),
        (
            {"engine": "sglnag"},
            r"engine: expected one of sglang, vllm, llamacpp, got 'sglnag' \(did you mean 'sglang'\?\)",
        ),
        ({"env": {"1BAD": "x"}}, r"env\.1BAD: invalid environment variable name"),
        ({"env": {"NCCL-PROTO": "x"}}, r"env\.NCCL-PROTO: invalid environment variable name"),
        ({"env": {"FLAG": True}}, r"env\.FLAG: expected a string or number \(quote words like 'true'\)"),
        ({"env": ["A=1"]}, r"env: expected a mapping"),
        ({"speculative": {"algorithm": "EAGLE3", "num_steps": 3}}, r"speculative\.draft_model_path: required"),
        (
            {"speculative": {"algorithm": "EAGLE4"}},
            r"speculative\.algorithm: sglang has no algorithm 'EAGLE4' \(did you mean 'EAGLE'\?\); expected one of",
        ),
        (
            {"speculative": {"algorithm": "NGRAM", "num_stpes": 3}},
            r"speculative\.num_stpes: unknown field \(did you mean 'num_steps'\?\)",
        ),
        (
            {
                "speculative": {
                    "algorithm": "EAGLE3",
                    "draft_model_path": "/d",
                    "num_steps": 3,
                    "eagle_topk": 1,
                    "num_draft_tokens": 8,
                }
            },
            r"speculative\.num_draft_tokens: with eagle_topk 1 SGLang forces it to num_steps \+ 1 = 4, got 8",
        ),
        (
            {"speculative": {"algorithm": "EAGLE3", "draft_model_path": "/d", "eagle_topk": 2}},
            r"speculative\.num_steps: required when eagle_topk",
        ),
        ({"server_args": ["--tp-size", "4"]}, r"server_args\[0\]: --tp-size is set by the field 'tp_size'"),
        ({"server_args": "--foo"}, r"server_args: expected a list of strings"),
        ({"sim": {"decode_msec": 3}}, r"sim\.decode_msec: unknown field \(did you mean 'decode_ms'\?\)"),
        ({"sim": {"decode_ms": "fast"}}, r"sim\.decode_ms: expected a number between 0.01 and 10000, got 'fast'"),
        ({"sim": {"fault": "explode"}}, r"sim\.fault: "),
    ],
)
def test_bad_fields_name_file_field_and_valid_values(
    write_profile: WriteProfile, fields: dict[str, object], message: str
) -> None:
    base = {"engine": "sglang", "model_path": "/m", "tp_size": 1, "port": 8000}
    path = write_profile("bad", **{**base, **fields})
    with pytest.raises(ProfileError, match=message):
        P.load(str(path))


def test_missing_required_field(write_profile: WriteProfile) -> None:
    path = write_profile("nomodel", engine="sglang", tp_size=1, port=1)
    with pytest.raises(ProfileError, match=r"nomodel\.yaml: model_path: required field is missing"):
        P.load(str(path))


def test_extends_cycle_and_missing_parent(write_profile: WriteProfile) -> None:
    write_profile("a", extends="b", engine="sglang")
    b = write_profile("b", extends="a")
    with pytest.raises(ProfileError, match=r"extends: cycle b -> a -> b"):
        P.load(str(b))
    orphan = write_profile("orphan", extends="no-such-parent")
    with pytest.raises(ProfileError, match=r"orphan\.yaml: extends: no profile named 'no-such-parent'"):
        P.load(str(orphan))


def test_error_in_parent_names_the_parent_file(write_profile: WriteProfile) -> None:
    write_profile("parent", engine="sglang", model_path="/m", tp_size=1, port=1, bogus=1)
    child = write_profile("child", extends="parent")
    with pytest.raises(ProfileError, match=r"parent\.yaml: bogus: unknown field"):
        P.load(str(child))


def test_yaml_syntax_error_has_line(write_profile: WriteProfile) -> None:
    path = write_profile("broken", text="engine: sglang\nenv: {A: 1\n")
    with pytest.raises(ProfileError, match=r"broken\.yaml: not valid YAML \(line \d+, column \d+\)"):
        P.load(str(path))
    top = write_profile("list", text="- 1\n- 2\n")
    with pytest.raises(ProfileError, match=r"list\.yaml: expected a mapping of fields at the top level"):
        P.load(str(top))


def test_values_with_shell_metacharacters_stay_single_arguments(write_profile: WriteProfile) -> None:
    path = write_profile(
        "evil", engine="sglang", model_path="/m/x; rm -rf / #", tp_size=1, port=1, env={"A": "$(touch /tmp/pwned) `id`"}
    )
    prof = P.load(str(path))
    argv = prof.launch_argv("python3", simulate=False)
    assert "/m/x; rm -rf / #" in argv  # one argv element, never parsed by a shell
    assert prof.env_dict()["A"] == "$(touch /tmp/pwned) `id`"


def test_sim_section_becomes_env_and_is_ignored_by_real_launch(write_profile: WriteProfile) -> None:
    path = write_profile(
        "s", engine="sglang", model_path="/m", tp_size=1, port=1, sim={"decode_ms": 10, "fault": "hang-during-load"}
    )
    prof = P.load(str(path))
    assert prof.sim_env() == {"ORCH_SIM_DECODE_MS": "10.0", "ORCH_SIM_FAULT": "hang-during-load"}
    assert not any("sim" in a for a in prof.launch_argv("python3", simulate=False)[1:])


def test_expect_block_is_a_claim_of_its_own_file_only(write_profile: WriteProfile) -> None:
    base = write_profile(
        "claimed", engine="sglang", model_path="/m", tp_size=1, port=8000, expect={"tok_s": 94, "vs": "baseline"}
    )
    prof = P.load(str(base))
    assert prof.expect is not None and prof.expect.tok_s == 94.0 and prof.expect.vs == "baseline"
    assert "expect" not in prof.to_dict()  # a claim is not configuration: never part of what a resume compares
    child = P.load(str(write_profile("child", extends="claimed")))
    assert child.expect is None
    with pytest.raises(ProfileError, match=r"expect\.ratio: a claimed ratio needs expect\.vs"):
        P.load(str(write_profile("bad1", extends="claimed", expect={"ratio": 1.06})))
    with pytest.raises(ProfileError, match=r"expect\.tok_s:"):
        P.load(str(write_profile("bad2", extends="claimed", expect={"tok_s": float("nan")})))
    with pytest.raises(ProfileError, match=r"expect\.tokens: unknown field"):
        P.load(str(write_profile("bad3", extends="claimed", expect={"tokens": 3})))


def test_a_bad_attach_url_is_refused_without_echoing_its_credentials(write_profile: WriteProfile) -> None:
    path = write_profile(
        "att", engine="sglang", model_path="/m", tp_size=1, port=8000, attach="http://bob:s3cret@10.0.0.1/x?key=k9"
    )
    with pytest.raises(ProfileError, match=r"attach: expected http://HOST:PORT") as err:
        P.load(str(path))
    assert "s3cret" not in str(err.value) and "k9" not in str(err.value) and "***" in str(err.value)


@pytest.mark.parametrize("path", sorted(P.BUNDLED_DIR.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_bundled_profile_reads_back_from_what_an_experiment_stores(path: Path) -> None:
    # A bundle carries each profile as to_dict() wrote it, defaults of fields its engine does not take included
    # (a llama.cpp profile's tp_size 1): reading it back must give the same profile, or no bundle of it could be
    # exported (`orch export --format bundle` checks the file reads back).
    profile = P.load(str(path))
    stored = profile.to_dict()
    assert P.from_resolved(stored, "bundle").to_dict() == {**stored, "source": "bundle"}
