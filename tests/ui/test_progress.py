"""Progress as a user sees it: the live view on a pseudo-terminal, timestamped plain lines on a pipe, -q, NO_COLOR."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator.report.lines import SIM_BANNER
from orchestrator.results.run import RunResult
from orchestrator.ui import progress
from tests.conftest import REPO

SimProfiles = Callable[..., dict[str, Path]]
# Two launches (one block): the second one is the first with an ETA; small runs keep the file quick.
AB = ("ab", "baseline", "eagle3", "--sim", "--blocks", "1", "--runs", "2", "--warmup", "1", "--max-tokens", "32")
AB_TAIL = ("--min-run-s", "0", "--grace", "2", "--gpu-wait", "0")
SGR = re.compile(r"\x1b\[([0-9;]*)m")
STAMP = re.compile(r"^\d\d:\d\d:\d\d ")


def environment(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR", "TERM", "COLUMNS", "LINES")}
    return {**env, "PYTHONPATH": str(REPO), "TERM": "xterm-256color", **extra}


def on_pty(args: tuple[str, ...], cwd: Path, **extra: str) -> tuple[int, str]:
    """`orch ARGS` with stdout and stderr on a pseudo-terminal of 160 columns; everything it wrote, raw."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", *args],
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=slave,
        stderr=slave,
        env=environment(**extra),
    )
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: the child closed its side
                    break
                if not data:
                    break
                chunks.append(data)
            elif proc.poll() is not None:
                break
        rc = proc.wait(timeout=30)
    finally:
        os.close(master)
    return rc, b"".join(chunks).decode("utf-8", errors="replace")


def on_pipe(args: tuple[str, ...], cwd: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env=environment(**extra),
    )


def colours(text: str) -> set[int]:
    """The foreground colour codes among the SGR escapes of `text`."""
    codes = {int(c) for m in SGR.finditer(text) for c in m.group(1).split(";") if c}
    return {c for c in codes if 30 <= c <= 37 or 90 <= c <= 97}


def test_live_view_on_a_terminal_shows_position_phases_eta_and_colours(
    sim_profiles: SimProfiles, tmp_path: Path
) -> None:
    sim_profiles()
    rc, out = on_pty((*AB, *AB_TAIL, "--db", str(tmp_path / "r.db")), tmp_path)
    assert rc == 0, out
    plain = SGR.sub("", out)
    assert "\x1b[2K" in out  # the view is redrawn in place
    for phase in ("cleanup", "launching the server", "loading", "env check", "warmup 1/1", "run 2/2", "teardown"):
        assert phase in plain, f"phase {phase!r} never shown:\n{plain}"
    assert "launch 1/2 · block 1/1 · " in plain and "launch 2/2 · block 1/1 · " in plain
    assert "ETA after the first launch" in plain and re.search(r"ETA \d+s", plain), plain
    assert "log: [orch-sim]" in plain  # the loading server's last log line
    assert "tokens so far this launch, last run " in plain
    # The lines above the view keep their words (tests and users grep them), with the time of day.
    assert re.search(r"\d\d:\d\d:\d\d (\x1b\[0m)?baseline: ready after", out) and "env check ok" in plain
    verdict = next(line for line in out.splitlines() if "eagle3 vs baseline @ 1:" in line)
    assert colours(verdict) == {33}, repr(verdict)  # one block: inconclusive, in yellow
    assert colours(out) >= {33, 35, 36}  # magenta SIMULATED banner, cyan phases


def test_no_color_on_a_terminal(sim_profiles: SimProfiles, tmp_path: Path) -> None:
    sim_profiles()
    rc, out = on_pty((*AB, *AB_TAIL, "--db", str(tmp_path / "r.db")), tmp_path, NO_COLOR="1")
    assert rc == 0, out
    assert "launch 2/2 · block 1/1" in SGR.sub("", out) and "\x1b[2K" in out  # still live
    assert colours(out) == set(), sorted(colours(out))


def test_pipe_gets_timestamped_plain_lines(sim_profiles: SimProfiles, tmp_path: Path) -> None:
    sim_profiles()
    done = on_pipe((*AB, *AB_TAIL, "--db", str(tmp_path / "r.db")), tmp_path)
    assert done.returncode == 0, done.stderr
    assert "\x1b" not in done.stdout + done.stderr
    progress_part, _, report = done.stdout.partition("========== A/B results")
    lines = [ln for ln in progress_part.splitlines() if ln.strip()]
    assert lines and all(STAMP.match(ln) for ln in lines), progress_part
    assert any(re.search(r"launch 2/2: block 1/1, \w+; ETA \d+s$", ln) for ln in lines), progress_part
    assert any(ln[9:].startswith("  Run 2/2: 32 tokens in ") for ln in lines)
    assert "eagle3 vs baseline @ 1:" in report and not STAMP.search(report)


def test_quiet_prints_only_the_verdict(sim_profiles: SimProfiles, tmp_path: Path) -> None:
    sim_profiles()
    done = on_pipe((*AB, *AB_TAIL, "-q", "--db", str(tmp_path / "r.db")), tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == SIM_BANNER, done.stdout
    assert re.fullmatch(r"eagle3 vs baseline @ 1: \d\.\d{3}x \(.*\) -> inconclusive: .*", lines[1]), done.stdout
    assert all(ln.startswith("WARNING: ") for ln in lines[2:]), done.stdout
    assert done.stderr == ""


def test_quiet_and_verbose_exclude_each_other(tmp_path: Path) -> None:
    done = on_pipe(("bench", "baseline", "--sim", "-q", "-v", "--db", str(tmp_path / "r.db")), tmp_path)
    assert done.returncode == 2 and "exclude each other" in done.stderr and "Traceback" not in done.stderr


# ---------------------------------------------------------------- the pieces


def test_eta_from_timed_launches_and_the_auto_ceiling() -> None:
    now = [0.0]
    t = progress.Tracker(clock=lambda: now[0])
    slot = {"total": 6, "block": 1, "blocks": 3, "max_blocks": 8, "arm": "a"}
    t.update("slot", {**slot, "n": 1})
    assert t.eta_text() == ""  # nothing timed yet
    now[0] = 40.0
    t.update("slot", {**slot, "n": 2})
    assert t.eta_s() == 4 * 40 + 40  # four launches after this one, and this one
    now[0] = 50.0
    # --blocks auto: to the end of the current design, and at most to max_blocks (16 launches).
    assert t.eta_text() == "ETA 3m10s to block 3 (at most 8 blocks: 9m50s)"


def test_severity_log_line_and_request_line() -> None:
    assert progress.severity("baseline: TEARDOWN FAILED: x") == "error"
    assert progress.severity("experiment X failed; after fixing the cause, continue it with: ...") == "error"
    assert progress.severity("b: ENV MISMATCH in 1 of 4 processes:") == "warning"
    assert progress.severity("b: ready after 1.0s") == "info"
    tail = "first\nLoading shards:  10%\rLoading shards:  50% \x1b[32m|###|\x1b[0m\n\n"
    assert progress.log_line(tail) == "Loading shards:  50% |###|"
    assert progress.log_line("x" * 300, width=20) == "x" * 17 + "..."
    req = {"index": 0, "tokens": 16, "prompt_tokens": 41, "ttft_s": 0.0255, "e2e_s": 0.21, "error": "timeout"}
    line = progress.request_line(req)
    assert line == "    request 1: 16 tokens, prompt 41, TTFT 25.5 ms, 0.21s end to end, ERROR: timeout"


def test_plain_reporter_quiet_keeps_errors_on_stderr(tmp_path: Path) -> None:
    out, err = (tmp_path / "out").open("w+"), (tmp_path / "err").open("w+")
    rep = progress.PlainReporter(out, quiet=True, err=err)
    with rep:
        rep.phase("slot", n=1, total=2, block=1, blocks=1, arm="a")
        rep.line("launch 1/2: block 1/1, a")
        rep.line("a: TEARDOWN FAILED: the agent is gone")
        rep.run("a", RunResult(index=0, warmup=False, tokens=8, seconds=1.0, tok_s=8.0, prompt_tokens=4, ttft_s=None))
    out.seek(0), err.seek(0)
    assert out.read() == ""
    assert STAMP.sub("", err.read()) == "a: TEARDOWN FAILED: the agent is gone\n"


def _run(index: int, warmup: bool, tokens: int) -> RunResult:
    return RunResult(index=index, warmup=warmup, tokens=tokens, seconds=1.0, tok_s=tokens, prompt_tokens=8, ttft_s=0.01)


def test_live_panel_counts_every_token_of_the_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from orchestrator.ui.live import LiveReporter

    view = LiveReporter(io.StringIO())
    view.tracker.update("slot", {"n": 1, "total": 2, "block": 1, "blocks": 1, "arm": "baseline"})
    view.tracker.finished(_run(0, True, 128))
    monkeypatch.setattr(progress, "live_run", lambda: (1100.0, 1.3))
    view.tracker.update("run", {"index": 0, "of": 2})
    text = view.phase_text().plain
    # the run in flight has 1,100 tokens; the launch has those and the warmup's 128
    assert "1100 tokens, 846.2 tok/s so far" in text and "1228 tokens so far this launch" in text, text


def test_a_finished_run_is_no_longer_in_flight_on_a_remote_host() -> None:
    tracker = progress.Tracker()
    progress.remote_live({"active": 1, "tokens": 500, "elapsed": 1.0})  # the host's last heartbeat of the run
    assert progress.live_run() == (500.0, 1.0)
    tracker.finished(_run(0, False, 512))
    assert progress.live_run() is None  # counted once, as finished


def test_the_accept_length_is_a_clause_of_its_own_on_a_level_line_and_as_ever_on_the_seed_s() -> None:
    from orchestrator.config.workload import BenchConfig

    config = BenchConfig(runs=1)
    seed = RunResult(
        index=0,
        warmup=False,
        tokens=128,
        seconds=2.0,
        tok_s=64.0,
        prompt_tokens=30,
        ttft_s=0.03,
        spec_accept_length=2.03,
    )
    assert progress.run_line(seed, config).endswith("= 64.0 tok/s (prompt: 30 toks) accept len 2.03")
    level = RunResult(
        index=0,
        warmup=False,
        tokens=512,
        seconds=2.0,
        tok_s=60.0,
        prompt_tokens=30,
        ttft_s=0.03,
        spec_accept_length=1.98,
        concurrency=8,
        requests=8,
    )
    assert progress.run_line(level, config).endswith(" tok/s aggregate, accept len 1.98")
