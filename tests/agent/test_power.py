"""Energy per run from nvidia-smi's power samples: parsing, the trapezoid over the steady window, the per-GPU sum,
the looping sampler and the bench_run op with the fake nvidia-smi; a missing or failing one never fails a run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from orchestrator.agent import ops, power
from orchestrator.agent.power import Sample
from tests import fake_nvidia_smi
from tests.client.test_client_stream import Server, generate_answer
from tests.wires import wire

INSTANT = "power.draw.instant"
FIELDS = ("timestamp", "index", "uuid", "power.draw", "power.draw.instant", "clocks.sm")


# ---------------------------------------------------------------- parsing


def test_a_row_is_parsed_with_its_own_timestamp_and_the_instant_reading_first() -> None:
    row = "2025/06/01 12:00:00.250, 3, GPU-abc, 412.80, 398.50, 1980"
    s = power.parse_line(row, FIELDS, arrived=0.0)
    assert s is not None and (s.index, s.uuid, s.watts, s.field, s.clock_mhz) == (
        3,
        "GPU-abc",
        398.5,
        "power.draw.instant",
        1980.0,
    )
    assert s.t - (power.parse_timestamp("2025/06/01 12:00:00.000") or 0.0) == pytest.approx(0.25)


def test_a_gpu_without_an_instant_reading_falls_back_to_power_draw_and_junk_is_no_sample() -> None:
    s = power.parse_line("2025/06/01 12:00:00.000, 0, GPU-a, 300.00, [N/A], [N/A]", FIELDS, arrived=0.0)
    assert s is not None and (s.watts, s.field, s.clock_mhz) == (300.0, "power.draw", None)
    # An unreadable timestamp takes the time the row arrived; error messages and short rows are no samples.
    s = power.parse_line("garbled, 0, GPU-a, 300.00, 301.00, 1410", FIELDS, arrived=123.5)
    assert s is not None and s.t == 123.5
    assert power.parse_line("NVIDIA-SMI has failed because it couldn't communicate", FIELDS, 0.0) is None
    assert power.parse_line("2025/06/01 12:00:00.000, x, GPU-a, 1, 1, 1", FIELDS, 0.0) is None
    both = power.parse_line("2025/06/01 12:00:00.000, 0, GPU-a, [N/A], [Not Supported], 1410", FIELDS, 0.0)
    assert both is not None and both.watts is None


# ---------------------------------------------------------------- the integral


def test_the_trapezoid_interpolates_at_the_window_edges_and_holds_beyond_the_samples() -> None:
    # Constant 100 W for 2 s: 200 J.
    assert power.integrate([(0.0, 100.0), (1.0, 100.0), (2.0, 100.0)], 0.0, 2.0) == (200.0, 2.0)
    # A ramp 0 -> 100 W over [0, 1] s, then flat: over [0.5, 1.5], P(0.5) = 50 W: 0.5 * 75 + 0.5 * 100 = 87.5 J.
    joules, covered = power.integrate([(0.0, 0.0), (1.0, 100.0), (2.0, 100.0)], 0.5, 1.5)
    assert joules == pytest.approx(87.5) and covered == pytest.approx(1.0)
    # Samples only from 1 s on: the first one's power is held before it, and only half the window is covered.
    joules, covered = power.integrate([(1.0, 100.0), (2.0, 200.0)], 0.0, 2.0)
    assert joules == pytest.approx(100.0 + 150.0) and covered == pytest.approx(1.0)
    assert power.integrate([], 0.0, 1.0) == (0.0, 0.0) and power.integrate([(0.0, 5.0)], 1.0, 1.0) == (0.0, 0.0)


def _samples(index: int, watts: list[float], every: float = 0.1, t0: float = 0.0) -> list[Sample]:
    return [
        Sample(
            t=t0 + i * every, index=index, uuid=f"GPU-{index}", watts=w, field="power.draw.instant", clock_mhz=1980.0
        )
        for i, w in enumerate(watts)
    ]


def test_energy_sums_the_servers_gpus_over_the_steady_window_only() -> None:
    # GPU 0 at 300 W, GPU 1 at 200 W, GPU 2 (not the server's) at 60 W; samples every 0.1 s over [0, 3] s.
    samples = _samples(0, [300.0] * 31) + _samples(1, [200.0] * 31) + _samples(2, [60.0] * 31)
    # Before the window (ramp-up) GPU 0 drew far more: the steady window [1, 2] s must not see it.
    samples = [
        Sample(
            t=s.t, index=s.index, uuid=s.uuid, watts=900.0 if s.index == 0 and s.t < 0.85 else s.watts, field=s.field
        )
        for s in samples
    ]
    e = power.energy(samples, [0, 1], 1.0, 2.0, tokens=250)
    assert e["joules"] == pytest.approx(500.0) and e["mean_w"] == pytest.approx(500.0)
    assert e["j_per_token"] == pytest.approx(2.0) and e["tokens"] == 250 and e["seconds"] == pytest.approx(1.0)
    assert [(g["index"], round(g["joules"], 6)) for g in e["gpus"]] == [(0, 300.0), (1, 200.0)]
    assert e["coverage"] == pytest.approx(1.0) and e["max_gap_s"] == pytest.approx(0.1)
    assert e["field"] == "power.draw.instant" and e["gpus"][0]["samples"] == 11
    # No tokens in the window: the joules stand, there is no per-token figure.
    assert power.energy(samples, [0], 1.0, 2.0, tokens=0)["j_per_token"] is None


def test_samples_that_miss_the_window_give_no_figure() -> None:
    late = _samples(0, [300.0] * 5, t0=1.8)  # from 1.8 s on: 20 % of [1, 2] s
    assert "spanned 20% of the run's steady window" in power.energy(late, [0], 1.0, 2.0, tokens=10)["error"]
    assert "no steady window" in power.energy(late, [0], 2.0, 2.0, tokens=10)["error"]


# ---------------------------------------------------------------- the fake nvidia-smi and the sampler


@pytest.fixture
def smi(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """The fake nvidia-smi (2 GPUs) and its state file; forgets which power fields earlier tests' fakes had."""
    state = tmp_path / "state.json"
    fake = fake_nvidia_smi.install(tmp_path / "bin", state, gpus=2) / "nvidia-smi"
    power._FIELDS_BY_SMI.clear()
    yield fake, state
    power._FIELDS_BY_SMI.clear()


def _loops() -> list[psutil.Process]:
    """nvidia-smi loops among this process's descendants."""
    out = []
    for child in psutil.Process().children(recursive=True):
        try:
            if "-lms" in child.cmdline():
                out.append(child)
        except psutil.Error:
            pass
    return out


def test_the_fake_loops_every_interval_until_sigint(smi: tuple[Path, Path]) -> None:
    fake, _ = smi
    proc = subprocess.Popen(
        [str(fake), "--query-gpu=timestamp,index,power.draw", "--format=csv,noheader,nounits", "-lms", "50"],
        stdout=subprocess.PIPE,
        text=True,
    )
    time.sleep(0.6)
    proc.send_signal(2)
    out, _ = proc.communicate(timeout=10)
    assert proc.returncode == 0
    rows = [line.split(", ") for line in out.splitlines()]
    assert len(rows) >= 6 and {r[1] for r in rows} == {"0", "1"} and {r[2] for r in rows} == {"62.15"}
    # Its existing one-shot answers are unchanged, and it says which fields it knows.
    one = subprocess.run([str(fake), "--query-gpu=power.draw", "--format=csv,noheader,nounits"], capture_output=True)
    assert one.stdout == b"62.15\n62.15\n"
    assert b'"power.draw.instant"' in subprocess.run([str(fake), "--help-query-gpu"], capture_output=True).stdout


def test_the_sampler_reads_rows_while_it_runs_and_leaves_no_process(smi: tuple[Path, Path]) -> None:
    fake, _ = smi
    sampler = power.PowerSampler(str(fake), interval_ms=50)
    assert sampler.start() and "-lms" in sampler.command
    assert sampler.wait_for(lambda s: len(s) >= 8, 10.0)
    assert _loops()
    sampler.stop()
    assert not _loops() and sampler.error is None
    assert {s.index for s in sampler.samples} == {0, 1} and {s.field for s in sampler.samples} == {INSTANT}
    times = [s.t for s in sampler.samples if s.index == 0]
    assert times == sorted(times) and 0.03 < (times[-1] - times[0]) / (len(times) - 1) < 0.5


def test_an_older_driver_is_sampled_through_power_draw(smi: tuple[Path, Path]) -> None:
    fake, state = smi
    state.write_text(json.dumps({"no_instant": True}))
    assert power.power_fields(str(fake)) == ("power.draw",)
    sampler = power.PowerSampler(str(fake), interval_ms=50)
    assert sampler.start() and sampler.wait_for(bool, 10.0)
    sampler.stop()
    assert sampler.error is None and {s.field for s in sampler.samples} == {"power.draw"}


# ---------------------------------------------------------------- the bench_run op


class SlowServer(Server):
    """Answers every request with `answer`, one `piece` bytes every `delay` s: a run that lasts."""

    delay = 0.03

    def _serve(self, conn: object) -> None:
        import socket

        assert isinstance(conn, socket.socket)
        try:
            request = b""
            while b"\r\n\r\n" not in request:
                request += conn.recv(65536)
            if request.startswith(b"GET /metrics"):
                conn.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
                return
            head, _, body = request.partition(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            while len(body) < length:
                body += conn.recv(65536)
            for i in range(0, len(self.answer), self.piece):
                conn.sendall(self.answer[i : i + self.piece])
                time.sleep(self.delay)
        except OSError:
            pass
        finally:
            conn.close()


@pytest.fixture
def server() -> Iterator[SlowServer]:
    srv = SlowServer()
    srv.answer, srv.piece = generate_answer(30, incremental=True), 300
    yield srv
    srv.close()


@pytest.fixture
def gpu_user() -> Iterator[subprocess.Popen[bytes]]:
    """A process the fake nvidia-smi puts on GPU 1 (its scope: this test session's namespace)."""
    env = {
        **os.environ,
        "FAKE_GPU_MIB": "30000",
        "FAKE_GPU_INDEX": "1",
        "FAKE_GPU_SCOPE": os.environ.get("ORCH_NAMESPACE", ""),
    }
    proc = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.1)"], env=env)
    time.sleep(0.3)  # its environ is readable once the interpreter has started
    yield proc
    proc.kill()
    proc.wait()


def _bench(server: SlowServer, **args: object) -> dict[str, object]:
    return ops.op_bench_run(server.port, wire("generate").to_dict(), [{"text": "x"}] * 2, [30] * 2, 1, 30.0, **args)  # type: ignore[arg-type]


def test_bench_run_samples_the_launchs_gpu_during_the_run_and_stops_nvidia_smi_after(
    smi: tuple[Path, Path], server: SlowServer, gpu_user: subprocess.Popen[bytes]
) -> None:
    fake, state = smi
    state.write_text(json.dumps({"power_w": {"1": 250.0}}))
    watch = [{"pid": gpu_user.pid, "create_time": psutil.Process(gpu_user.pid).create_time(), "cmdline": "x"}]
    seen: list[int] = []
    stop = threading.Event()

    def count() -> None:  # nvidia-smi loops while the run is in flight
        while not stop.is_set():
            seen.append(len(_loops()))
            time.sleep(0.05)

    watcher = threading.Thread(target=count, daemon=True)
    watcher.start()
    s = _bench(server, watch=watch, power_smi=str(fake))
    stop.set()
    watcher.join()
    assert s["valid"], s["invalid_reason"]
    energy = s["energy"]
    assert isinstance(energy, dict) and "error" not in energy, energy
    assert max(seen) == 1 and not _loops()  # one loop during the run, none left after
    # Only GPU 1 holds the launch's process: 250 W there, GPU 0's idle 62 W left out.
    assert [g["index"] for g in energy["gpus"]] == [1] and energy[
        "gpus_rule"
    ] == "the GPUs holding the launch's processes"
    assert energy["mean_w"] == pytest.approx(250.0) and energy["field"] == INSTANT
    window = energy["window_s"]
    assert window == pytest.approx(s["steady_window_s"]) and energy["seconds"] == pytest.approx(window[1] - window[0])
    assert energy["seconds"] > 0.5 and energy["gpus"][0]["samples"] >= 5  # sampled every 100 ms during the run
    assert energy["tokens"] == round(float(s["aggregate_tok_s"]) * energy["seconds"])  # type: ignore[arg-type]
    assert energy["j_per_token"] == pytest.approx(energy["joules"] / energy["tokens"])
    assert energy["coverage"] == pytest.approx(1.0)


def test_a_missing_or_failing_nvidia_smi_gives_no_energy_and_never_fails_the_run(
    smi: tuple[Path, Path], server: SlowServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server.delay = 0.0
    fake, state = smi
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    s = _bench(server, power_smi="nvidia-smi")
    assert s["valid"] and s["energy"] == {"source": "nvidia-smi", "interval_ms": 100, "error": "no nvidia-smi"}
    s = _bench(server, power_smi=str(tmp_path / "none" / "nvidia-smi"))
    assert s["valid"] and "no nvidia-smi at" in s["energy"]["error"]  # type: ignore[index]
    state.write_text(json.dumps({"fail": "NVIDIA-SMI has failed because it couldn't communicate with the driver"}))
    s = _bench(server, power_smi=str(fake))
    assert s["valid"] and "couldn't communicate" in s["energy"]["error"], s["energy"]  # type: ignore[index]
    assert not _loops()
    # Without power_smi nothing is sampled and the summary has no energy entry (as before).
    assert "energy" not in _bench(server)


def _sleeper(env: dict[str, str]) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time\nwhile True: time.sleep(0.1)"], env={**os.environ, **env}
    )
    time.sleep(0.3)
    return proc


def test_unmatched_pids_fall_back_to_busy_gpus_among_the_launchs_visible_devices(
    smi: tuple[Path, Path], gpu_user: subprocess.Popen[bytes]
) -> None:
    fake, _ = smi
    for visible, expected in ((None, [1]), ("1", [1]), ("GPU-" + fake_nvidia_smi.gpu_uuid(1)[4:], [1]), ("0", None)):
        # A launch process that holds no GPU itself (as a container's PIDs look to nvidia-smi), GPU 1 busy.
        launch = _sleeper({"CUDA_VISIBLE_DEVICES": visible} if visible else {})
        try:
            watch = [{"pid": launch.pid, "create_time": psutil.Process(launch.pid).create_time()}]
            found = power.launch_gpus(str(fake), watch)
        finally:
            launch.kill()
            launch.wait()
        if expected is None:
            assert isinstance(found, str) and "no GPU holds a compute process" in found
        else:
            assert not isinstance(found, str) and found[0] == expected, found
            where = "its CUDA_VISIBLE_DEVICES" if visible else "all GPUs (no CUDA_VISIBLE_DEVICES)"
            assert found[1] == f"the GPUs with a compute process among {where}; the launch's own PIDs were not seen"
