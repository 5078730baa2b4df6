"""Starting a simulated server, whichever engine it imitates: knobs, seed, speed factor, env rewrite, serve."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.sim import logs
from orchestrator.sim.args import ServerConfig
from orchestrator.sim.knobs import knob_faults, knob_float, parse_gpu_slowdown, read_knobs
from orchestrator.sim.timing import draw_speed_factor

if TYPE_CHECKING:
    from orchestrator.sim.server import SimServer


def _gpu_slowdown(spec: Any) -> float:
    """gpu_slowdown: how much slower this GPU model is, by the name nvidia-smi reports (1.0 without nvidia-smi)."""
    if not isinstance(spec, str) or not spec:
        return 1.0
    try:
        proc = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return 1.0
    out = proc.stdout if proc.returncode == 0 else ""
    name = out.splitlines()[0].strip() if out.strip() else ""
    factor = next((f for sub, f in parse_gpu_slowdown(spec) if sub in name), 1.0)
    logs.log(f"GPU {name or '(none)'}: gpu_slowdown factor {factor:g}")
    return factor


def _file_slowdown(path: Any) -> float:
    """slowdown_file: the factor written in that file (1.0 when it is absent); unreadable content is an error."""
    if not isinstance(path, str) or not path:
        return 1.0
    try:
        text = Path(path).read_text().strip()
    except FileNotFoundError:
        return 1.0
    factor = float(text)  # a ValueError here is reported by main as an invalid knob
    if not 0.1 <= factor <= 10.0:
        raise ValueError(f"{path} holds {text!r}: expected a factor between 0.1 and 10")
    logs.log(f"slowdown_file {path}: factor {factor:g}")
    return factor


def load_knobs() -> dict[str, float | int | str | None] | None:
    """The ORCH_SIM_* knobs, or None (logged) when one is invalid."""
    try:
        return read_knobs(os.environ)
    except ValueError as exc:
        logs.log(f"invalid simulator knob: {exc}", "error")
        return None


def launch(
    cfg: ServerConfig,
    knobs: dict[str, float | int | str | None],
    server_cls: type[SimServer],
    settings_line: str,
    rewrite: Callable[[list[str]], list[str]],
) -> int:
    """What every mode does once its flags are parsed: seed, speed, env rewrite, then serve until stopped."""
    logs.set_level(cfg.log_level)
    fault_rank = knobs.get("fault_node_rank")
    if fault_rank is not None and fault_rank != cfg.node_rank:
        knobs = {**knobs, "fault": None}  # a fault aimed at another node of the group
    if "ignore-sigterm" in knob_faults(knobs):
        # Set before anything else runs; the workers reset it so only this process is deaf to SIGTERM.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)

    seed_knob = knobs["seed"]
    if isinstance(seed_knob, int):
        seed = seed_knob
        logs.log(f"seed={seed} (from ORCH_SIM_SEED)", force=True)
    else:
        seed = random.SystemRandom().randrange(2**32)
        # Always printed, whatever --log-level says: without it a launch cannot be reproduced.
        logs.log(f"seed={seed} (drawn at random; set ORCH_SIM_SEED={seed} to reproduce this launch)", force=True)
    # slowdown: a deliberate change of the whole box's speed (a "state change" for reproduction tests), on top of
    # the restart-to-restart noise every launch draws.
    speed = draw_speed_factor(random.Random(f"{seed}:speed"), knob_float(knobs, "launch_noise")) * knob_float(
        knobs, "slowdown"
    )
    speed *= _gpu_slowdown(knobs.get("gpu_slowdown"))
    try:
        speed *= _file_slowdown(knobs.get("slowdown_file"))
    except (OSError, ValueError) as exc:
        logs.log(f"invalid simulator knob: ORCH_SIM_SLOWDOWN_FILE: {exc}", "error")
        return 2

    for note in cfg.notes:
        logs.log(note)
    for warning in cfg.warnings:
        logs.log(warning, "warning")
    logs.log(settings_line)
    shown = ", ".join(f"{k}={v}" for k, v in knobs.items() if v is not None)
    logs.log(f"simulator knobs: {shown}")
    faults = knob_faults(knobs)
    if faults:
        logs.log(
            "FAULT injection active: " + ", ".join(k if v is None else f"{k}:{v}" for k, v in faults.items()), "warning"
        )

    drop_spec = knobs["drop_env"]
    drop = [n.strip() for n in drop_spec.split(",") if n.strip()] if isinstance(drop_spec, str) else []
    changes = rewrite(drop)
    logs.log("environment for worker processes: " + ("; ".join(changes) or "unchanged"))

    server = server_cls(cfg, knobs, seed, speed, changes)
    model = server.model
    spec = cfg.spec
    desc = (
        "no speculation"
        if spec is None
        else f"{spec.algorithm} steps={spec.num_steps} topk={spec.topk} draft_tokens={spec.num_draft_tokens}"
    )
    logs.log(
        f"timing model: {desc}; nominal cycle {model.base_cycle_ms:.2f} ms, mean accept length "
        f"{model.mean_accept_length:.3f}; launch speed factor {speed:.4f} "
        f"(lognormal, sigma={knob_float(knobs, 'launch_noise'):g}); expected single-stream "
        f"{model.steady_tokens_per_s(1):.1f} tok/s"
    )
    try:
        code = asyncio.run(server.run())
    except KeyboardInterrupt:
        code = 0
    logs.log(f"exiting with code {code}")
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip multiprocessing's atexit join: an escaped worker (fault) must not keep this process alive.
    os._exit(code)
