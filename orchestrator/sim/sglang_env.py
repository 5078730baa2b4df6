"""SGLang's environment rules: the env rewrite before its workers spawn, and SGLANG_HEALTH_CHECK_TIMEOUT."""

from __future__ import annotations

import os
import random
import tempfile
import time
from collections.abc import Mapping, MutableMapping, Sequence

from orchestrator.sim import logs
from orchestrator.sim.engine import HEALTH_CHECK_TIMEOUT_S


def rewrite_env(
    env: MutableMapping[str, str],
    *,
    enable_symm_mem: bool = False,
    enable_nccl_nvls: bool = False,
    enable_metrics: bool = False,
    drop: Sequence[str] = (),
    run_id: str | None = None,
) -> list[str]:
    """Apply SGLang's pre-spawn env rules (engine.py `_set_envs_and_config`) plus drop_env; describe changes."""
    changes: list[str] = []

    def put(key: str, value: str) -> None:
        old = env.get(key)
        if old != value:
            changes.append(f"{key}={value}" + ("" if old is None else f" (was {old})"))
        env[key] = value

    if "NCCL_CUMEM_ENABLE" not in env or enable_symm_mem:
        put("NCCL_CUMEM_ENABLE", str(int(enable_symm_mem)))
    if "NCCL_NVLS_ENABLE" not in env or enable_nccl_nvls or enable_symm_mem:
        put("NCCL_NVLS_ENABLE", str(int(enable_nccl_nvls or enable_symm_mem)))
    put("CUDA_DEVICE_MAX_CONNECTIONS", "8")
    put("CUDA_MODULE_LOADING", "AUTO")
    if env.get("TRTLLM_ENABLE_PDL", "1") != "0":
        put("TRTLLM_ENABLE_PDL", "1")
    if env.get("CUTE_DSL_LOG_LEVEL") is None:
        put("CUTE_DSL_LOG_LEVEL", "30")
    if env.get("CUTE_DSL_LOG_TO_CONSOLE") is None:
        put("CUTE_DSL_LOG_TO_CONSOLE", "1")
    put("SGLANG_RUN_ID", run_id or f"sglang-run-{time.time()}-{random.randint(0, 100000000)}")
    if enable_metrics and "PROMETHEUS_MULTIPROC_DIR" not in env:
        # SGLang points this at a fresh temp dir; the simulator writes no metric files, so it only names one.
        put("PROMETHEUS_MULTIPROC_DIR", os.path.join(tempfile.gettempdir(), f"orch-sim-prometheus-{os.getpid()}"))
    for name in drop:
        if name in env:
            del env[name]
            changes.append(f"{name} removed (drop_env)")
    return changes


def health_check_timeout(environ: Mapping[str, str]) -> float:
    """SGLang's SGLANG_HEALTH_CHECK_TIMEOUT (seconds health waits for output before 503), default 20."""
    raw = environ.get("SGLANG_HEALTH_CHECK_TIMEOUT", "").strip()
    if not raw:
        return HEALTH_CHECK_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not (0 < value < 86400):
        logs.log(f"SGLANG_HEALTH_CHECK_TIMEOUT={raw!r} is not a positive number of seconds; using 20", "warning")
        return HEALTH_CHECK_TIMEOUT_S
    return value
