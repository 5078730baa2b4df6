"""GPU power sampled by one looping nvidia-smi during a run, and the energy it adds up to over the run's steady window
(stdlib + psutil; shipped with the agent)."""

from __future__ import annotations

import contextlib
import datetime
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import psutil

from orchestrator.agent.facts import csv_query, smi_value
from orchestrator.agent.processes import HostSideError, identity_key, read_environ

INTERVAL_MS = 100
# nvidia-smi starts (NVML init: up to a second or two on a big box) before the run does, so the first sample
# precedes the run's start; a run is never held back longer than this for it.
FIRST_SAMPLE_WAIT_S = 5.0
STOP_WAIT_S = 1.0  # after SIGINT (nvidia-smi's Ctrl+C: it ends its loop), before SIGTERM
MIN_COVERAGE = 0.9  # of the steady window the samples must span for an energy figure
MAX_SAMPLES = 400_000  # rows kept per run (8 GPUs at 10 Hz for 80 minutes): bounded memory
INSTANT = "power.draw.instant"
AVERAGED = "power.draw"

_FIELDS_BY_SMI: dict[str, tuple[str, ...]] = {}
_GPUS_BY_LAUNCH: dict[tuple[tuple[int, str], ...], tuple[list[int], str]] = {}


def power_fields(nvidia_smi: str) -> tuple[str, ...]:
    """The power fields to ask for: power.draw.instant (the board's last reading) where this driver knows it, with
    power.draw (a 1 s average on Ampere and newer, instantaneous before) as its fallback. An older driver refuses a
    whole query for one unknown field, so `--help-query-gpu` says which exist (asked once per nvidia-smi)."""
    if nvidia_smi not in _FIELDS_BY_SMI:
        try:
            helptext = subprocess.run(
                [nvidia_smi, "--help-query-gpu"],
                capture_output=True,
                text=True,
                timeout=15,
                stdin=subprocess.DEVNULL,
            ).stdout
        except (OSError, subprocess.SubprocessError):
            helptext = ""
        _FIELDS_BY_SMI[nvidia_smi] = (AVERAGED, INSTANT) if f'"{INSTANT}"' in helptext else (AVERAGED,)
    return _FIELDS_BY_SMI[nvidia_smi]


@dataclass(frozen=True, kw_only=True)
class Sample:
    """One GPU's row of one loop of nvidia-smi: when it was read (wall clock), which GPU, its power and SM clock."""

    t: float
    index: int
    uuid: str
    watts: float | None
    field: str  # the power field the watts came from
    clock_mhz: float | None = None


def parse_timestamp(text: str) -> float | None:
    """nvidia-smi's `timestamp` ("2025/06/01 12:00:00.123", local time) as seconds since the epoch."""
    try:
        return datetime.datetime.strptime(text.strip(), "%Y/%m/%d %H:%M:%S.%f").timestamp()
    except ValueError:
        return None


def parse_line(line: str, fields: Sequence[str], arrived: float) -> Sample | None:
    """One `--format=csv,noheader,nounits` row of `fields` (timestamp, index, uuid, the power fields, clocks.sm);
    None for anything else (an error message, a blank line). A row without a readable timestamp takes `arrived`."""
    values = [v.strip() for v in line.split(",")]
    if len(values) != len(fields):
        return None
    row = dict(zip(fields, values, strict=True))
    index = smi_value(row.get("index", ""))
    if not isinstance(index, int):
        return None
    watts, source = None, AVERAGED
    for name in (INSTANT, AVERAGED):  # the instant reading where this GPU gives one
        value = smi_value(row[name]) if name in row else None
        if isinstance(value, (int, float)) and value >= 0:
            watts, source = float(value), name
            break
    clock = smi_value(row.get("clocks.sm", ""))
    stamp = parse_timestamp(row["timestamp"]) if "timestamp" in row else None
    return Sample(
        t=arrived if stamp is None else stamp,
        index=index,
        uuid=str(row.get("uuid", "")),
        watts=watts,
        field=source,
        clock_mhz=float(clock) if isinstance(clock, (int, float)) else None,
    )


class PowerSampler:
    """`nvidia-smi --query-gpu=… --format=csv,noheader,nounits -lms INTERVAL`, one process for a run's duration, its
    rows read by a thread as they come. Never raises: what went wrong is `error`, and the run goes on without it."""

    def __init__(self, nvidia_smi: str, interval_ms: int = INTERVAL_MS) -> None:
        self.nvidia_smi = nvidia_smi
        self.interval_ms = interval_ms
        self.fields: tuple[str, ...] = ()
        self.samples: list[Sample] = []
        self.other: list[str] = []  # lines that were no sample (nvidia-smi's own messages), the first few
        self.error: str | None = None
        self.truncated = False
        self._proc: subprocess.Popen[str] | None = None
        self._reader: threading.Thread | None = None
        self._seen = threading.Condition()

    @property
    def command(self) -> list[str]:
        query = ",".join(("timestamp", "index", "uuid", *self.fields, "clocks.sm"))
        smi = [self.nvidia_smi, f"--query-gpu={query}", "--format=csv,noheader,nounits", "-lms", str(self.interval_ms)]
        # Line-buffered where coreutils' stdbuf is there: C stdio buffers a pipe by the block, and rows held back
        # would arrive late (the timestamps keep them right) or, at a hard stop, never.
        return ["stdbuf", "-oL", *smi] if shutil.which("stdbuf") else smi

    def start(self) -> bool:
        self.fields = power_fields(self.nvidia_smi)
        try:
            # Its stdout is a pipe read by this process: if the agent dies, nvidia-smi's next write ends it too.
            self._proc = subprocess.Popen(
                self.command,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                bufsize=1,
            )
        except OSError as e:
            self.error = f"{self.nvidia_smi} could not be started: {e}"
            return False
        self._reader = threading.Thread(target=self._read, name="orch-power-sampler", daemon=True)
        self._reader.start()
        return True

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        names = ("timestamp", "index", "uuid", *self.fields, "clocks.sm")
        for line in self._proc.stdout:
            sample = parse_line(line, names, time.time()) if line.strip() else None
            with self._seen:
                if sample is None:
                    if line.strip() and len(self.other) < 5:
                        self.other.append(line.strip()[:300])
                elif len(self.samples) < MAX_SAMPLES:
                    self.samples.append(sample)
                else:
                    self.truncated = True
                self._seen.notify_all()
        with self._seen:
            self._seen.notify_all()

    def wait_for(self, ok: Callable[[list[Sample]], bool], timeout: float) -> bool:
        """Wait (bounded) until `ok(samples)` holds or nvidia-smi has stopped; whether it holds."""
        deadline = time.monotonic() + timeout
        with self._seen:
            while not ok(self.samples):
                left = deadline - time.monotonic()
                if left <= 0 or self._proc is None or (self._reader is not None and not self._reader.is_alive()):
                    return ok(self.samples)
                self._seen.wait(min(left, 0.05))
            return True

    def stop(self) -> None:
        """Ends nvidia-smi's loop as Ctrl+C does (SIGINT), then SIGTERM, then SIGKILL, each bounded; reads what is
        left of its output."""
        proc = self._proc
        if proc is None:
            return
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
            if proc.poll() is not None:
                break
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=STOP_WAIT_S if sig != signal.SIGKILL else 5.0)
        if self._reader is not None:
            self._reader.join(timeout=STOP_WAIT_S)
        if proc.stdout is not None:
            with contextlib.suppress(OSError):
                proc.stdout.close()
        if not self.samples and self.error is None:
            said = "; ".join(self.other) or "no output"
            self.error = f"{self.nvidia_smi} gave no power samples (exit {proc.returncode}: {said})"


def integrate(points: Sequence[tuple[float, float]], start: float, end: float) -> tuple[float, float]:
    """(joules, seconds covered) over [start, end] from (time, watts) points: the trapezoid rule on the piecewise-
    linear power through the points, the power at start and end interpolated between the samples around them, the
    nearest sample's power held outside the points' span; seconds covered: the part of [start, end] they span."""
    pts = sorted(points)
    if not pts or end <= start:
        return 0.0, 0.0

    def power(t: float) -> float:
        if t <= pts[0][0]:
            return pts[0][1]
        if t >= pts[-1][0]:
            return pts[-1][1]
        for (t0, p0), (t1, p1) in pairwise(pts):
            if t0 <= t <= t1:
                return p0 if t1 == t0 else p0 + (p1 - p0) * (t - t0) / (t1 - t0)
        return pts[-1][1]

    knots = [start, *(t for t, _ in pts if start < t < end), end]
    joules = sum((power(a) + power(b)) / 2 * (b - a) for a, b in pairwise(knots))
    covered = max(0.0, min(end, pts[-1][0]) - max(start, pts[0][0]))
    return joules, covered


def _visible(environ: dict[str, str] | None) -> set[str] | None:
    value = (environ or {}).get("CUDA_VISIBLE_DEVICES")
    if value is None or not value.strip():
        return None
    return {d.strip() for d in value.split(",") if d.strip()}


def launch_gpus(nvidia_smi: str, watch: Sequence[dict[str, Any]] | None) -> tuple[list[int], str] | str:
    """Which GPUs the server uses, and by which rule; or why that is unknown.

    First the GPUs holding a process of the launch (nvidia-smi's compute processes whose PID is one of the
    launch's recorded processes: what the server itself allocated on). Else, where those PIDs cannot be matched
    (in a container nvidia-smi names the host's PIDs), the GPUs holding any compute process among the launch's
    CUDA_VISIBLE_DEVICES (every GPU when it is unset). Kept per launch: its GPUs do not change while it runs."""
    key = tuple(sorted(identity_key(w) for w in watch or []))
    if key and key in _GPUS_BY_LAUNCH:
        return _GPUS_BY_LAUNCH[key]
    try:
        gpus = csv_query(nvidia_smi, "gpu", ("index", "uuid"))
        apps = csv_query(nvidia_smi, "compute-apps", ("pid", "gpu_uuid"))
    except (HostSideError, OSError, subprocess.SubprocessError) as e:
        return f"nvidia-smi could not list the GPUs' processes: {e}"
    index_of = {str(g["uuid"]): int(g["index"]) for g in gpus if isinstance(g.get("index"), int)}
    pids = {k[0] for k in key}
    own = sorted({index_of[a["gpu_uuid"]] for a in apps if a.get("pid") in pids and a.get("gpu_uuid") in index_of})
    found: tuple[list[int], str] | None = None
    if own:
        found = own, "the GPUs holding the launch's processes"
    else:
        environ = None
        for pid in sorted(pids):
            with contextlib.suppress(psutil.Error):
                environ = read_environ(psutil.Process(pid))
            if environ is not None:
                break
        visible = _visible(environ)
        busy = {index_of[a["gpu_uuid"]] for a in apps if a.get("gpu_uuid") in index_of}
        if visible is not None:
            allowed = {int(d) for d in visible if d.isdigit()} | {index_of[d] for d in visible if d in index_of}
            # MIG devices (MIG-…) name no whole GPU: the GPUs with a compute process stand for them.
            busy = busy & allowed if allowed else busy
        if busy:
            where = "its CUDA_VISIBLE_DEVICES" if visible is not None else "all GPUs (no CUDA_VISIBLE_DEVICES)"
            found = sorted(busy), f"the GPUs with a compute process among {where}; the launch's own PIDs were not seen"
    if found is None:
        return "no GPU holds a compute process of the launch, so which GPUs it uses is unknown"
    if key:
        if len(_GPUS_BY_LAUNCH) >= 16:
            _GPUS_BY_LAUNCH.pop(next(iter(_GPUS_BY_LAUNCH)))
        _GPUS_BY_LAUNCH[key] = found
    return found


def energy(
    samples: Sequence[Sample],
    gpus: Sequence[int],
    start: float,
    end: float,
    tokens: int,
) -> dict[str, Any]:
    """Energy over [start, end] (wall clock), per GPU and summed over `gpus`, and per output token received in it.
    {"error": why} when the samples do not span MIN_COVERAGE of the window on every GPU."""
    if end <= start:
        return {"error": "the run had no steady window to measure over"}
    span = end - start
    per_gpu, joules, coverage, gap = [], 0.0, 1.0, 0.0
    for index in gpus:
        mine = [s for s in samples if s.index == index and s.watts is not None]
        points = [(s.t, float(s.watts or 0.0)) for s in mine]
        j, covered = integrate(points, start, end)
        coverage = min(coverage, covered / span)
        inside = [s for s in mine if start <= s.t <= end]
        times = [start, *(s.t for s in inside), end]
        gap = max(gap, *(b - a for a, b in pairwise(times)))
        clocks = [s.clock_mhz for s in inside if s.clock_mhz is not None]
        per_gpu.append(
            {
                "index": index,
                "uuid": mine[0].uuid if mine else None,
                "joules": j,
                "mean_w": j / span,
                "samples": len(inside),
                "clock_sm_mhz": sum(clocks) / len(clocks) if clocks else None,
            }
        )
        joules += j
    if coverage < MIN_COVERAGE:
        return {
            "error": f"the power samples spanned {coverage * 100:.0f}% of the run's steady window "
            f"(at least {MIN_COVERAGE * 100:.0f}% needed)"
        }
    used = sorted({s.field for s in samples if s.index in gpus and s.watts is not None})
    return {
        "joules": joules,
        "tokens": tokens,
        "j_per_token": joules / tokens if tokens > 0 else None,
        "mean_w": joules / span,
        "seconds": span,
        "field": used[0] if len(used) == 1 else ", ".join(used),
        "coverage": coverage,
        "max_gap_s": gap,
        "gpus": per_gpu,
    }


class RunEnergy:
    """Power sampling around one run: `begin()` before it (nvidia-smi started, its first sample in, the run's start
    watched for), `finish(summary)` after it (the energy of the summary's steady window). Never raises."""

    def __init__(
        self,
        nvidia_smi: str,
        watch: Sequence[dict[str, Any]] | None,
        live: Callable[[], dict[str, float]],
        interval_ms: int = INTERVAL_MS,
    ) -> None:
        self.sampler = PowerSampler(nvidia_smi, interval_ms)
        self.nvidia_smi = nvidia_smi
        self.watch = watch
        self.live = live
        self.gpus: tuple[list[int], str] | str = "not sampled"
        self.started: float | None = None  # wall clock at the run's t0, as the client measured it
        self._done = threading.Event()
        self._clock: threading.Thread | None = None

    def begin(self) -> None:
        if shutil.which(self.nvidia_smi) is None:
            named = self.nvidia_smi != "nvidia-smi"  # an inventory's own nvidia_smi path
            self.sampler.error = f"no nvidia-smi at {self.nvidia_smi}" if named else "no nvidia-smi"
            return
        if not self.sampler.start():
            return
        self.gpus = launch_gpus(self.nvidia_smi, self.watch)
        self.sampler.wait_for(bool, FIRST_SAMPLE_WAIT_S)
        self._clock = threading.Thread(target=self._watch_start, name="orch-power-clock", daemon=True)
        self._clock.start()

    def _watch_start(self) -> None:
        # The client marks its run in flight (live()) just before it takes its t0; the elapsed time it reports,
        # taken from now, is that t0 on this clock however late the mark is seen.
        while not self._done.is_set():
            state = self.live()
            if state.get("active"):
                self.started = time.time() - float(state.get("elapsed") or 0.0)
                return
            self._done.wait(0.005)

    def finish(self, summary: dict[str, Any] | None) -> dict[str, Any]:
        try:
            return self._finish(summary)
        finally:
            self._done.set()
            self.sampler.stop()

    def _finish(self, summary: dict[str, Any] | None) -> dict[str, Any]:
        base = {"source": "nvidia-smi", "interval_ms": self.sampler.interval_ms}
        self._done.set()
        if self._clock is not None:
            self._clock.join(timeout=1.0)
        if self.sampler.error is not None:
            return {**base, "error": self.sampler.error}
        if summary is None:
            return {**base, "error": "the run did not finish"}
        if isinstance(self.gpus, str):
            return {**base, "error": self.gpus}
        if self.started is None:
            return {**base, "error": "the run's start was not seen"}
        window = summary.get("steady_window_s") or [0.0, float(summary.get("window_s") or 0.0)]
        start, end = self.started + float(window[0]), self.started + float(window[1])
        # The run is over, so the next loop of nvidia-smi reads after the window's end.
        self.sampler.wait_for(lambda s: bool(s) and s[-1].t >= end, 3 * self.sampler.interval_ms / 1000 + 1.0)
        self.sampler.stop()
        if self.sampler.error is not None:
            return {**base, "error": self.sampler.error}
        tokens = round(float(summary.get("aggregate_tok_s") or 0.0) * (end - start))
        indices, rule = self.gpus
        out = energy(self.sampler.samples, indices, start, end, tokens)
        return {
            **base,
            **out,
            "window_s": [float(window[0]), float(window[1])],
            "gpus_rule": rule,
            **({"truncated": True} if self.sampler.truncated else {}),
        }
