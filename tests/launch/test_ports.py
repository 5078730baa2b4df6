"""A port given for a run (`--port`, a nightly item's `port:`): every engine's command line gets it, the experiment
records it (so `--resume` and a reproduction use it again), fingerprints do not count it as a difference, and a port
that would clash is refused (exit 2) before anything launches."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator import engines
from orchestrator.cli import main
from orchestrator.config import profile as profiles_mod
from orchestrator.config.profile import Profile
from orchestrator.errors import InputError
from orchestrator.experiment import ab, resume
from orchestrator.hosts.base import HostConfig
from orchestrator.hosts.inventory import HostGroup
from orchestrator.launch import fingerprint, ports
from orchestrator.nightly.suite import SuiteError
from orchestrator.nightly.suite import load as load_suite
from tests.conftest import FAST_SIM, WriteProfile, free_port
from tests.faults.support import assert_nothing_left, run, stored

SimProfiles = Callable[..., dict[str, Path]]
FAST = ["--runs", "1", "--warmup", "0", "--max-tokens", "16", "--min-run-s", "0", "--grace", "2", "--gpu-wait", "0"]


def _profile(write_profile: WriteProfile, name: str, **fields: Any) -> Profile:
    defaults = {"engine": "sglang", "tp_size": 1, "model_path": "/models/m", "port": 30000}
    return profiles_mod.load(str(write_profile(name, **{**defaults, **fields})))  # a None field is left out


# ---------------------------------------------------------------- the override


@pytest.mark.parametrize(
    ("engine", "fields"),
    [("sglang", {}), ("vllm", {}), ("llamacpp", {"model_path": "/models/m.gguf", "tp_size": None})],
)
def test_the_port_reaches_every_engines_command_line(
    write_profile: WriteProfile, engine: str, fields: dict[str, Any]
) -> None:
    prof = _profile(write_profile, engine, engine=engine, **fields)
    (moved,) = ports.override([prof], 31234)
    for simulate in (True, False) if engines.get(engine).simulated else (False,):
        argv = moved.launch_argv("python", simulate=simulate)
        assert argv[argv.index("--port") + 1] == "31234" and "30000" not in argv, argv
    assert moved.to_dict()["port"] == 31234  # what the experiment stores as the profile that ran
    assert ports.override([prof], None) == [prof]  # no port given: the profile's own


def test_an_attached_arm_keeps_its_url(write_profile: WriteProfile) -> None:
    launched = _profile(write_profile, "a")
    attached = _profile(write_profile, "b", attach="http://10.0.0.9:8000")
    assert [p.port for p in ports.override([launched, attached], 31234)] == [31234, 30000]


# ---------------------------------------------------------------- what clashes


@pytest.fixture
def not_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ports.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(ports, "unprivileged_start", lambda: 1024)


def test_a_privileged_port_is_refused_locally_unless_root(
    write_profile: WriteProfile, not_root: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    prof = [_profile(write_profile, "a")]
    why = ports.clash(80, prof, local=True, stride=None)
    assert why == (
        "--port 80: ports below 1024 are privileged on this machine and you are not root, so the server could not "
        "listen there; give a port from 1024 to 65535"
    )
    assert ports.clash(1024, prof, local=True, stride=None) is None
    assert ports.clash(80, prof, local=False, stride=None) is None  # another machine's user may be root
    monkeypatch.setattr(ports.os, "geteuid", lambda: 0)
    assert ports.clash(80, prof, local=True, stride=None) is None


def test_a_port_out_of_range_or_past_the_last_node_rank_is_refused(write_profile: WriteProfile) -> None:
    prof = [_profile(write_profile, "a")]
    assert ports.clash(0, prof, local=False, stride=None) == "--port: expected an integer from 1 to 65535, got 0"
    assert "from 1 to 65535, got 70000" in str(ports.clash(70000, prof, local=False, stride=None))
    wide = [_profile(write_profile, "wide", nnodes=3)]
    why = ports.clash(65534, wide, local=False, stride=1)
    assert why is not None and "profile wide spans 3 nodes" in why and "rank 2 would need port 65536" in why, why
    assert "give a port of at most 65533" in why
    assert ports.clash(65533, wide, local=False, stride=1) is None
    assert ports.clash(65534, wide, local=False, stride=0) is None  # every rank on its own machine, on one port


def test_an_attached_arms_port_or_only_attached_arms_are_refused(write_profile: WriteProfile) -> None:
    launched = _profile(write_profile, "a")
    here = _profile(write_profile, "b", attach="http://127.0.0.1:31000")
    why = ports.clash(31000, [launched, here], local=True, stride=None)
    assert why is not None and "arm b is attached to http://127.0.0.1:31000, which holds that port" in why, why
    assert ports.clash(31001, [launched, here], local=True, stride=None) is None
    elsewhere = _profile(write_profile, "c", attach="http://10.0.0.9:31000")
    assert ports.clash(31000, [launched, elsewhere], local=True, stride=None) is None  # another machine's port
    why = ports.clash(31000, [here], local=True, stride=None)
    assert why is not None and "every arm is attached" in why and "nothing is launched" in why


def test_the_host_decides_what_is_checked(write_profile: WriteProfile, not_root: None) -> None:
    wide = [_profile(write_profile, "wide", nnodes=2)]
    with pytest.raises(InputError, match="not root"):
        ports.check(80, wide, HostConfig(name="local"))
    ports.check(80, wide, HostConfig(name="gpu", address="10.0.0.9"))  # root or not there: the launch says
    with pytest.raises(InputError, match="rank 1 would need port 65536"):
        ports.check(65535, wide, HostGroup(name="pair", nodes=("a", "b"), port_stride=1))
    with pytest.raises(InputError, match="rank 1 would need port 65536"):
        ports.check(65535, wide, HostConfig(name="slurm:gpu", scheduler="slurm", port_stride=1))
    ports.check(None, wide, HostConfig(name="local"))  # no port given: nothing to check


def test_the_cli_refuses_a_clashing_port_before_anything_starts(
    write_profile: WriteProfile,
    not_root: None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    _profile(write_profile, "one", sim=FAST_SIM)
    _profile(write_profile, "wide", nnodes=2, sim=FAST_SIM)
    inventory = {"hosts": {"a": {"address": "10.0.0.1"}, "b": {"address": "10.0.0.2"}, "pair": {"nodes": ["a", "b"],
                 "port_stride": 4}}}  # fmt: skip
    (tmp_path / "hosts.yaml").write_text(yaml.safe_dump(inventory))
    db = str(tmp_path / "r.db")
    assert main(["bench", "one", "--sim", "--port", "80", "--db", db]) == 2
    err = capsys.readouterr().err
    assert "--port 80: ports below 1024 are privileged on this machine and you are not root" in err, err
    # From the inventory alone: no connection to 10.0.0.1 is tried.
    assert main(["bench", "wide", "--sim", "--host", "pair", "--port", "65534", "--db", db]) == 2
    assert "rank 1 would need port 65538, above 65535; give a port of at most 65531" in capsys.readouterr().err
    assert main(["bench", "one", "--attach", "http://127.0.0.1:31000", "--port", "31000", "--db", db]) == 2
    assert "every arm is attached" in capsys.readouterr().err
    assert main(["bench", "one", "--sim", "--port", "65536", "--db", db]) == 2
    assert "65536 is not in the range 1<=x<=65535" in capsys.readouterr().err
    assert not Path(db).exists() or stored(Path(db), "SELECT id FROM experiments") == []
    assert_nothing_left()


# ---------------------------------------------------------------- fingerprints


def _fp(port: int) -> dict[str, Any]:
    argv = ["/venv/bin/python", "-m", "orchestrator.sim", "--model-path", "/m", "--port", str(port), "--tp-size", "2"]
    return {"argv": argv, "profile": {"name": "a", "port": port, "tp_size": 2}, "gpus": {"model": "H100"}}


def test_the_port_is_no_difference_between_launches_or_nights() -> None:
    assert fingerprint.diff(_fp(30000), _fp(31234)) == []
    assert fingerprint.environment(_fp(30000)) == fingerprint.environment(_fp(31234))
    assert fingerprint.stable_argv(["--port=31234"]) == ["--port=<port>"]
    # A night stored before the port was left out compares equal to one stored after.
    old = {"argv": _fp(30000)["argv"][1:], "profile.name": "a", "profile.port": 30000, "profile.tp_size": 2,
           "gpus.model": "H100"}  # fmt: skip
    assert fingerprint.stable_environment(old) == fingerprint.environment(_fp(31234))
    # What the profile asks for still differs.
    other = _fp(31234)
    other["profile"]["tp_size"] = 4
    assert [d.describe() for d in fingerprint.diff(_fp(30000), other)] == ["profile tp_size: 2 -> 4"]


def test_a_resume_on_another_port_runs_the_same_configuration(write_profile: WriteProfile) -> None:
    prof = _profile(write_profile, "a")
    exp = {
        "id": "x",
        "status": "interrupted",
        "kind": "ab",
        "design_json": "{}",
        "config_json": json.dumps({"profiles": [resume.comparable_profile(prof.with_port(31234))], "port": 31234}),
    }
    resume.check_resumable(exp, [prof.with_port(31300)])
    with pytest.raises(Exception, match=r"changed since experiment x started \(fields: tp_size\)"):
        resume.check_resumable(exp, [profiles_mod.Profile(**{**prof.__dict__, "tp_size": 2}).with_port(31234)])


# ---------------------------------------------------------------- end to end


def _launches(db: Path) -> list[tuple[str, Path, dict[str, Any]]]:
    """Each launch's status, server log and fingerprint."""
    rows = stored(db, "SELECT status, launch_id, fingerprint_json FROM launches ORDER BY started_at")
    state = Path(os.environ["XDG_STATE_HOME"])  # the local host's workdir, where its launches' logs go
    logs = [next(state.rglob(f"{str(launch).replace(':', '_')}.log")) for _, launch, _ in rows]
    return [(str(s), log, json.loads(str(fp or "{}"))) for (s, _, fp), log in zip(rows, logs, strict=True)]


def _ran_on(db: Path, port: int) -> None:
    """Every launch of the store served on `port`: its server said it listened there, and its fingerprint says so."""
    launches = [la for la in _launches(db) if la[0] == "complete"]
    assert launches
    for _, log, fp in launches:
        assert f"Uvicorn running on http://127.0.0.1:{port} " in log.read_text(), log
        argv = fp["argv"]
        assert argv[argv.index("--port") + 1] == str(port) and fp["profile"]["port"] == port


def test_ab_on_a_given_port_then_resumed_and_reproduced_there(
    sim_profiles: SimProfiles, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    paths = sim_profiles()
    own = {profiles_mod.load(str(paths[n])).port for n in ("baseline", "eagle3")}
    port = next(p for p in iter(free_port, None) if p not in own)
    db = tmp_path / "r.db"

    # The second launch is interrupted before it starts: an experiment to resume.
    real = ab.run_launch
    calls: list[int] = []

    def stop_second(*args: Any, **kw: Any) -> Any:
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kw)

    monkeypatch.setattr(ab, "run_launch", stop_second)
    cmd = ["ab", "baseline", "eagle3", "--sim", "--port", str(port), "--blocks", "2", "--order", "fixed", *FAST]
    assert main([*cmd, "--db", str(db)]) == 130
    monkeypatch.setattr(ab, "run_launch", real)
    (config,) = stored(db, "SELECT config_json FROM experiments")
    recorded = json.loads(str(config[0]))
    assert recorded["port"] == port and [p["port"] for p in recorded["profiles"]] == [port, port]
    _ran_on(db, port)
    capsys.readouterr()
    assert main(["show", "last", "--db", str(db)]) == 0
    assert f"servers launched on port {port} (given with --port" in capsys.readouterr().out

    # --resume takes the recorded port; every launch, old and new, served there.
    assert main(["ab", "--resume", "last", "--grace", "2", "--gpu-wait", "0", "--db", str(db)]) == 0
    assert f"NOTE: servers launched on port {port}" in capsys.readouterr().out
    assert [la[0] for la in _launches(db)] == ["complete"] * 4
    _ran_on(db, port)

    # A reproduction of its bundle takes the recorded port too.
    bundle = str(tmp_path / "exp.orch.json")
    assert main(["export", "last", "--format", "bundle", "-o", bundle, "--db", str(db)]) == 0
    again = tmp_path / "again.db"
    assert main(["reproduce", bundle, "--blocks", "1", "--grace", "2", "--gpu-wait", "0", "--db", str(again)]) in (
        0,
        3,
        4,
    )
    _ran_on(again, port)
    (config,) = stored(again, "SELECT config_json FROM experiments")
    assert json.loads(str(config[0]))["port"] == port

    # Given another port, a reproduction serves there, and the port is not among what differs.
    other = free_port()
    moved = tmp_path / "moved.db"
    argv = ["reproduce", bundle, "--port", str(other), "--blocks", "1", "--grace", "2", "--gpu-wait", "0", "--json"]
    capsys.readouterr()
    assert main([*argv, "--db", str(moved)]) in (0, 3, 4)
    doc = json.loads(capsys.readouterr().out)
    assert not [c for c in doc["reproduction"]["causes"] if "port" in c], doc["reproduction"]["causes"]
    _ran_on(moved, other)
    assert_nothing_left()


def test_a_nightly_item_on_its_own_port_keeps_its_history(write_profile: WriteProfile, tmp_path: Path) -> None:
    write_profile(
        "check", engine="sglang", model_path="/models/m", tp_size=1, port=free_port(), ready_timeout_s=60,
        sim={**FAST_SIM, "launch_noise": 0.003},
    )  # fmt: skip
    item: dict[str, Any] = {"name": "check", "bench": "check"}
    defaults = {"host": "local", "sim": True, "timeout": "90s", "gpu_wait": 0, "grace": 2,
                "workload": {"runs": 2, "warmup": 0, "max_tokens": 32, "min_run_s": 0}}  # fmt: skip
    suite = tmp_path / "suite.yaml"

    def night(date: str, **fields: Any) -> None:
        data = {"suite": "ports", "deadline": "10m", "wait": "5s", "min_history": 3, "defaults": defaults}
        suite.write_text(yaml.safe_dump({**data, "items": [{**item, **fields}]}, sort_keys=False))
        out = run("nightly", str(suite), "--db", str(db), "--now", f"{date}T02:00", cwd=tmp_path, timeout=300)
        assert out.rc == 0 and "building history `check`" in out.out, out.text

    db = tmp_path / "nightly.db"
    night("2026-11-01")
    port = free_port()
    assert load_suite(suite).items[0].port is None
    night("2026-11-02", port=port)
    assert load_suite(suite).items[0].port == port
    _, log, fp = _launches(db)[-1]
    assert f"Uvicorn running on http://127.0.0.1:{port} " in log.read_text()
    assert fp["argv"][fp["argv"].index("--port") + 1] == str(port)
    # Another port is the same environment: the history goes on (no environment step), night 2 of 3.
    hist = json.loads(run("history", "check", "--db", str(db), "--json", cwd=tmp_path).out)
    (series,) = [s for s in hist["series"] if s["series"] == "check:tok_s"]
    assert series["steps"] == [] and len(series["nights"]) == 2
    assert_nothing_left()


def test_a_nightly_items_port_is_checked_with_the_suite(
    write_profile: WriteProfile, tmp_path: Path, not_root: None
) -> None:
    write_profile("check", engine="sglang", model_path="/models/m", tp_size=1, port=30000)
    suite = tmp_path / "suite.yaml"

    def write(port: Any) -> None:
        item = {"name": "check", "bench": "profiles/check.yaml", "host": "local", "sim": True, "port": port}
        suite.write_text(yaml.safe_dump({"suite": "s", "items": [item]}))

    write(0)
    with pytest.raises(SuiteError, match=r"item 'check': port: expected an integer from 1 to 65535, got 0"):
        load_suite(suite)
    write(80)
    out = run("nightly", str(suite), "--check", "--db", str(tmp_path / "n.db"), cwd=tmp_path)
    # The subprocess may be root (a container): then port 80 is allowed, and --check passes.
    if out.rc == 2:
        assert f"{suite}: item 'check': port 80: ports below" in out.err, out.text
    else:
        assert out.rc == 0, out.text
    from orchestrator.nightly.night import check_hosts

    with pytest.raises(InputError, match=r"item 'check': port 80: ports below 1024 are privileged"):
        check_hosts(load_suite(suite))


def test_nodes_are_one_machine_by_their_boot_id_whatever_the_clock_did() -> None:
    """A machine is its hostname and its boot: the kernel's boot_id where the agent reads one. boot_time is derived
    from the wall clock, so one machine read across a clock step must still be one machine (ranks would share a
    port); two boots are two machines even with equal boot times; facts without a boot_id compare boot_time."""
    from types import SimpleNamespace

    from orchestrator.hosts.group import GroupHost
    from orchestrator.launch.group import port_clash

    nodes = [
        SimpleNamespace(
            name=n, config=HostConfig(name=n, address=f"10.0.0.{i}"), python="python3", workdir="/w", stats=None
        )
        for i, n in enumerate(("a", "b"))
    ]
    group = GroupHost(HostGroup(name="pair", nodes=("a", "b")), nodes)  # type: ignore[arg-type]
    box = {"hostname": "box", "boot_time": 1000.0, "boot_id": "b-1"}
    stepped = {**box, "boot_time": 1000.0 + 3600}
    assert "a and b of pair are one machine (box)" in str(port_clash(group, {"a": box, "b": stepped}, 2))
    assert port_clash(group, {"a": box, "b": {**box, "boot_id": "b-2"}}, 2) is None
    old = {"hostname": "box", "boot_time": 1000.0}
    assert port_clash(group, {"a": old, "b": old}, 2) is not None
    assert port_clash(group, {"a": old, "b": {**old, "boot_time": 2000.0}}, 2) is None
