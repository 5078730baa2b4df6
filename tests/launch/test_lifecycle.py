"""The per-arm lifecycle against the real simulator: launch, readiness, env read-back, faults, teardown."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from orchestrator import engines
from orchestrator.agent import ops
from orchestrator.config.design import ABConfig
from orchestrator.config.profile import Profile, load
from orchestrator.config.workload import BenchConfig
from orchestrator.errors import BenchError, HostError, ServerError, was_interrupted
from orchestrator.experiment.ab import run_ab
from orchestrator.hosts.local import LocalHost
from orchestrator.launch import lifecycle, single
from orchestrator.launch.benchmark import local_runner, run_benchmark
from orchestrator.launch.single import describe_env
from orchestrator.results.load import load_result
from orchestrator.results.store import Store
from orchestrator.ui.events import QUIET, Lines
from tests.conftest import NAMESPACE
from tests.wires import wire

SimProfiles = Callable[..., dict[str, Path]]


def _nothing_left() -> None:
    assert ops.op_find(NAMESPACE) == []


def _running(host: LocalHost, prof: Profile, *, events: list[str] | None = None, **kw: object) -> object:
    settings = lifecycle.Settings(namespace=NAMESPACE, simulate=True, grace_s=2, **kw)  # type: ignore[arg-type]
    return lifecycle.running(host, prof, settings, QUIET if events is None else Lines(events.append))


def test_full_lifecycle_with_env_check_and_clean_teardown(sim_profiles: SimProfiles) -> None:
    prof = load(str(sim_profiles()["baseline"]))
    host = LocalHost()
    events: list[str] = []
    with lifecycle.running(
        host, prof, lifecycle.Settings(namespace=NAMESPACE, simulate=True), Lines(events.append)
    ) as srv:
        assert srv.env_report is not None and srv.env_report.ok
        assert srv.env_report.processes >= prof.tp_size + 2  # main + tp schedulers + detokenizer
        pids = [p["pid"] for p in ops.op_find(NAMESPACE)]
        assert srv.launch.pid in pids
        # Ready means a real generation succeeded (SGLang's own /health_generate may still say 503 while its
        # warmup request runs).
        one = {"input_ids": [0], "sampling_params": {"max_new_tokens": 1}}
        assert httpx.post(srv.base_url + "/generate", json=one).json()["meta_info"]["completion_tokens"] == 1
        cfg = BenchConfig(min_run_s=0, runs=1, warmup=1, max_tokens=16, warmup_max_tokens=4)
        runs = run_benchmark(
            local_runner(srv.base_url, cfg, wire=wire("generate")), cfg, model="m", engine=engines.get("sglang")
        )
        assert [r.tokens for r in runs] == [4, 16]
    assert srv.teardown is not None and srv.teardown["port_free"] and not srv.teardown["remaining"]
    assert all(not ops.op_alive(p)["alive"] for p in pids)
    assert any("ready after" in e for e in events) and any("torn down" in e for e in events)
    _nothing_left()


def test_crash_during_load_fails_fast_with_log_tail(sim_profiles: SimProfiles) -> None:
    prof = load(str(sim_profiles(sim={"fault": "exit-during-load", "load_s": 0.5})["baseline"]))
    t0 = time.monotonic()
    with (
        pytest.raises(ServerError, match=r"(?s)exited during startup.*Initialization failed"),
        _running(LocalHost(), prof),
    ):
        pass
    assert time.monotonic() - t0 < 15  # not the 30 s readiness timeout
    _nothing_left()


def test_hang_during_load_times_out_and_leaves_nothing(sim_profiles: SimProfiles) -> None:
    prof = load(str(sim_profiles(sim={"fault": "hang-during-load"})["baseline"]))
    with (
        pytest.raises(ServerError, match=r"(?s)not ready after 2s \(still loading\).*Last lines of"),
        _running(LocalHost(), prof, ready_timeout_s=2.0),
    ):
        pass
    _nothing_left()


class TunnelFails(LocalHost):
    """A host whose way to the server (an SSH or Slurm tunnel) cannot be opened once the server is launched."""

    def url(self, port: int, address: str = "127.0.0.1") -> str:
        raise HostError(f"could not open a tunnel to {address}:{port}")


def test_a_tunnel_that_fails_after_the_launch_still_stops_the_server(sim_profiles: SimProfiles) -> None:
    prof = load(str(sim_profiles()["baseline"]))
    launched: list[lifecycle.Server] = []
    settings = lifecycle.Settings(namespace=NAMESPACE, simulate=True, grace_s=2)
    with (
        pytest.raises(HostError, match="could not open a tunnel"),
        lifecycle.running(TunnelFails(), prof, settings, on_launch=launched.append),
    ):
        pytest.fail("the block must not run without a URL")
    # Recorded as launched (so the experiment marks the launch failed), then torn down: nothing left on its port.
    (srv,) = launched
    assert srv.teardown is not None and srv.teardown["port_free"] and not srv.teardown["remaining"]
    _nothing_left()


def test_ctrl_c_while_waiting_for_readiness_tears_down_at_once(sim_profiles: SimProfiles) -> None:
    prof = load(str(sim_profiles(sim={"fault": "hang-during-load"})["baseline"]))

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 1.0)
    t0 = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt), _running(LocalHost(), prof, ready_timeout_s=60):
            pass
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert time.monotonic() - t0 < 30  # interrupted at 1 s and torn down, not the 60 s readiness wait
    _nothing_left()


def test_an_arm_costs_four_host_calls_and_one_per_run(sim_profiles: SimProfiles, tmp_path: Path) -> None:
    prof = load(str(sim_profiles()["baseline"]))
    host = LocalHost()
    cfg = ABConfig(bench=BenchConfig(min_run_s=0, runs=2, warmup=1, max_tokens=8, warmup_max_tokens=4),
                   simulate=True, namespace=NAMESPACE, grace_s=2)  # fmt: skip
    run_ab(host, [prof, prof], cfg, Store(tmp_path / "r.db"))
    by_op = dict(host.stats.by_op)
    assert [by_op.pop(op) for op in ("facts", "lock", "unlock", "bench_run")] == [1, 1, 1, 6]
    # The env read-back and the fingerprint's host part come back with the readiness wait.
    assert by_op == dict.fromkeys(("preflight", "launch", "wait_ready", "teardown"), 2)
    _nothing_left()


def test_env_check_catches_vars_that_did_not_reach_the_workers(sim_profiles: SimProfiles) -> None:
    # CUDA_DEVICE_MAX_CONNECTIONS is forced to 8 by SGLang (and the simulator) in every worker; NCCL_ALGO is
    # dropped on the way to the workers by a simulator fault, like the seed's non-propagating NCCL variables.
    paths = sim_profiles(env={"CUDA_DEVICE_MAX_CONNECTIONS": "32"}, sim={"drop_env": "NCCL_ALGO"})
    prof = load(str(paths["baseline"]))
    host = LocalHost()
    with _running(host, prof) as srv:  # type: ignore[attr-defined]
        report = srv.env_report
        main_pid = srv.launch.pid
    assert report is not None and not report.ok
    by_var: dict[str, set[int]] = {}
    for m in report.mismatches:
        by_var.setdefault(m.var, set()).add(m.pid)
        assert m.pid != main_pid  # the main process got exactly what orch passed
    assert set(by_var) == {"CUDA_DEVICE_MAX_CONNECTIONS", "NCCL_ALGO"}
    assert len(by_var["NCCL_ALGO"]) >= prof.tp_size + 1  # every worker (and mp helper), not just one
    cuda = next(m for m in report.mismatches if m.var == "CUDA_DEVICE_MAX_CONNECTIONS")
    assert (cuda.expected, cuda.actual) == ("32", "8") and "forces it to 8" in cuda.note
    algo = next(m for m in report.mismatches if m.var == "NCCL_ALGO")
    assert algo.actual is None
    text = "\n".join(describe_env(report))
    assert "NCCL_ALGO: profile says 'Ring'" in text and "has missing" in text
    _nothing_left()


def test_env_check_lines_agree_in_number() -> None:
    assert describe_env(single.EnvReport(processes=1)) == [
        "env check ok: every profile variable reached the server's one process"
    ]
    assert describe_env(single.EnvReport(processes=3)) == [
        "env check ok: every profile variable reached all 3 processes"
    ]
    gone = single.EnvMismatch(pid=7, cmdline="server", var="NCCL_ALGO", expected="Ring", actual=None)
    assert describe_env(single.EnvReport(processes=1, mismatches=(gone,)))[0] == "ENV MISMATCH in 1 of 1 process:"
    assert describe_env(single.EnvReport(processes=2, mismatches=(gone,)))[0] == "ENV MISMATCH in 1 of 2 processes:"


def test_strict_env_fails_the_arm(sim_profiles: SimProfiles, tmp_path: Path) -> None:
    prof = load(str(sim_profiles(sim={"drop_env": "NCCL_PROTO"})["baseline"]))
    store = Store(tmp_path / "r.db")
    cfg = ABConfig(
        bench=BenchConfig(min_run_s=0, runs=1, warmup=0, max_tokens=8),
        simulate=True,
        namespace=NAMESPACE,
        strict_env=True,
        grace_s=2,
    )
    events: list[str] = []
    with pytest.raises(ServerError, match="environment check failed"):
        run_ab(LocalHost(), [prof, prof], cfg, store, events=Lines(events.append))
    exp = store.experiments()[0]
    assert exp["status"] == "failed"
    assert store.launches(exp["id"])[0]["status"] == "failed"
    # A resume would run the same profile again and fail the same way: orch does not suggest one.
    assert not any("--resume" in e for e in events), events
    assert not any("--resume" in n for n in load_result(store, exp["id"]).notes)
    _nothing_left()


def test_server_dying_mid_benchmark_is_an_error_and_runs_so_far_are_kept(
    sim_profiles: SimProfiles, tmp_path: Path
) -> None:
    prof = load(str(sim_profiles(sim={"fault": "die-after-tokens:40"})["baseline"]))
    store = Store(tmp_path / "r.db")
    cfg = ABConfig(
        bench=BenchConfig(min_run_s=0, runs=3, warmup=0, max_tokens=16), simulate=True, namespace=NAMESPACE, grace_s=2
    )
    with pytest.raises(BenchError, match=r"the server failed during run 3 at concurrency 1 \("):
        run_ab(LocalHost(), [prof], cfg, store)
    exp = store.experiments()[0]
    launch = store.launches(exp["id"])[0]
    assert launch["status"] == "failed"
    runs = store.runs(launch["launch_id"])
    assert [r["valid"] for r in runs] == [1, 1, 0]  # the two runs before the crash, and the failed one as evidence
    assert "requests failed" in runs[2]["invalid_reason"]
    _nothing_left()


def test_sigterm_ignored_needs_sigkill_and_escaped_worker_is_found_by_marker(sim_profiles: SimProfiles) -> None:
    prof = load(str(sim_profiles(sim={"fault": "ignore-sigterm,escape-setsid"})["baseline"]))
    with _running(LocalHost(), prof) as srv:  # type: ignore[attr-defined]
        procs = ops.op_find(NAMESPACE)
        assert any(p["pgid"] != srv.launch.pgid for p in procs)  # one worker left the process group
    td = srv.teardown
    assert srv.launch.pid in td["sigkill"]
    escaped_pids = {p["pid"] for p in procs if p["pgid"] != srv.launch.pgid}
    # The escaped worker left the group, so only a direct signal by marker could have reached it.
    assert escaped_pids <= set(td["sigkill"]) | set(td["escaped"])
    assert not td["remaining"] and td["port_free"]
    _nothing_left()


def test_preflight_cleans_leftovers_of_an_earlier_launch(sim_profiles: SimProfiles) -> None:
    prof = load(str(sim_profiles()["baseline"]))
    host = LocalHost()
    old = single.launch(host, prof, simulate=True, namespace=NAMESPACE)  # "orch crashed": never torn down
    single.wait_ready(host, old, prof, timeout_s=20)
    events: list[str] = []
    with _running(host, prof, events=events) as srv:  # type: ignore[attr-defined]
        assert srv.preflight["cleaned"][0]["launch_id"] == old.launch_id
        assert not ops.op_alive(old.pid)["alive"]
    assert any("leftover" in e for e in events)
    _nothing_left()


def test_ab_end_to_end_tells_the_seed_story(sim_profiles: SimProfiles, tmp_path: Path) -> None:
    paths = sim_profiles()
    profiles = [load(str(paths["baseline"])), load(str(paths["eagle3"]))]
    store = Store(tmp_path / "r.db")
    seen: list[tuple[str, int, bool]] = []
    cfg = ABConfig(
        # 192 tokens: enough draft cycles that a run's accept length (random per cycle) stays near its mean.
        bench=BenchConfig(min_run_s=0, runs=2, warmup=1, max_tokens=192, warmup_max_tokens=8),
        simulate=True,
        namespace=NAMESPACE,
        grace_s=2,
        order="fixed",
    )
    result = run_ab(LocalHost(), profiles, cfg, store, on_run=lambda p, r: seen.append((p, r.index, r.warmup)))
    assert seen == [
        ("baseline", 0, True),
        ("baseline", 0, False),
        ("baseline", 1, False),
        ("eagle3", 0, True),
        ("eagle3", 0, False),
        ("eagle3", 1, False),
    ]
    base, eagle = result.arms
    assert base.summary is not None and eagle.summary is not None
    assert 70 < base.summary.median < 90  # ≈ 82 tok/s, minus prefill over a short output
    assert 48 < eagle.summary.median < 72  # ≈ 60 tok/s
    assert eagle.accept_length is not None and 1.5 < eagle.accept_length < 2.6
    assert base.accept_length is None
    (cmp,) = result.comparisons
    assert cmp.arm == "eagle3" and cmp.vs == "baseline"
    assert cmp.ratio == pytest.approx(eagle.summary.median / base.summary.median)
    assert all(r.tokens == 192 for a in result.arms for r in a.timed)
    assert base.launch_id != eagle.launch_id
    exp = store.experiment(result.experiment_id)
    assert exp is not None and exp["status"] == "complete" and exp["simulated"] == 1
    assert sum(len(store.runs(la["launch_id"])) for la in store.launches(result.experiment_id)) == 6
    _nothing_left()


def test_an_interrupt_stays_an_interrupt_when_the_teardown_after_it_fails() -> None:
    try:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise OSError("teardown failed") from None  # `from None` hides the cause, never the context
    except OSError as e:
        assert was_interrupted(e)
    assert not was_interrupted(OSError("a failure of its own"))
