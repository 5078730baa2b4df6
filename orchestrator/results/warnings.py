"""What a result warns of, beside its numbers: a noisy host, attached servers, GPUs that drifted between launches."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from orchestrator.stats.estimates import (
    ArmSpread,
    noisy_host,
    relative_range,
)

if TYPE_CHECKING:
    from orchestrator.results.model import ArmResult, LaunchResult


def host_noise_warning(label: str, spread: ArmSpread) -> str | None:
    """One arm's launches swing far more than a quiet host's do (`noisy_host`): the numbers and what to do."""
    if not noisy_host(spread) or spread.cv_across is None:
        return None
    within = (
        f"{spread.cv_within * 100:.1f}% between runs within a launch"
        if spread.cv_within is not None
        else "one run per launch, so no run-to-run noise to compare"
    )
    return (
        f"noisy host: {label}: its {spread.launches} launches ranged {spread.launch_min:.1f}-{spread.launch_max:.1f} "
        f"tok/s (CV {spread.cv_across * 100:.0f}% across launches, {within}): the same configuration should give "
        "about the same number each launch, so something else on the host moved it (other jobs, CPU or GPU "
        "clocks, memory pressure); the CIs are wide and a verdict needs many blocks: quiet the host (stop other "
        "work, check `uptime`/`top`, nvidia-smi) and run again, or run more blocks"
    )


def attached_warnings(arms: Sequence[ArmResult]) -> list[str]:
    """Arms measured on servers orch did not launch (`--attach`), and a comparison mixing them with launched arms."""
    attached = [arm for arm in arms if arm.attached_url]
    launched = [arm.label for arm in arms if not arm.attached_url and arm.launches]
    out = []
    if attached and launched:
        out.append(
            f"MIXED COMPARISON (--allow-mixed): attached {', '.join(a.label for a in attached)} against launched "
            f"{', '.join(launched)}: the difference may come from how each server was set up and what it did before, "
            "not only from its configuration"
        )
    for arm in attached:
        out.append(
            f"{arm.label} was measured on {arm.attached_url}, a server orch did not launch (attached): "
            "its state was not fresh (each block was another benchmark session on the same running server, not a "
            "restart) and its environment was not verified (orch cannot read its processes, env or host)"
        )
        if any(
            ((launch.fingerprint or {}).get("software") or {}).get("reports_orch_simulator") for launch in arm.launches
        ):
            out.append(
                f"SIMULATED: the server {arm.label} is attached to reports itself as orch's simulator: its numbers "
                "are simulated, not measured on real hardware"
            )
    return out


def gpu_drift_warnings(
    launches: Sequence[LaunchResult], labels: Sequence[str], clock_rel: float = 0.05, temp_c: float = 10.0
) -> list[str]:
    """GPU SM clocks or temperatures under load that moved between launches: throttling makes launches unequal."""
    per_gpu: dict[Any, list[tuple[str, float | None, float | None]]] = {}
    for launch in launches:
        state = launch.gpus or {}
        # Only the GPUs this launch used (an idle GPU's clock says nothing): by its processes when nvidia-smi can name
        # them (in a container it reports host PIDs), else the GPUs that were busy at the reading.
        used = {a.get("gpu_index") for a in state.get("apps") or [] if a.get("launch_id") == launch.launch_id}
        for g in state.get("gpus") or []:
            util = g.get("utilization.gpu")
            if (used and g.get("index") not in used) or (not used and isinstance(util, (int, float)) and util <= 0):
                continue
            clock, temp = g.get("clocks.sm"), g.get("temperature.gpu")
            per_gpu.setdefault(g.get("index"), []).append(
                (
                    f"{labels[launch.arm_index]}/block {launch.block + 1}",
                    float(clock) if isinstance(clock, (int, float)) else None,
                    float(temp) if isinstance(temp, (int, float)) else None,
                )
            )
    out = []
    for index, readings in sorted(per_gpu.items(), key=lambda kv: str(kv[0])):
        clocks = [c for _, c, _ in readings if c is not None]
        temps = [t for _, _, t in readings if t is not None]
        if clocks and relative_range(clocks) > clock_rel:
            detail = ", ".join(f"{w} {c:.0f}" for w, c, _ in readings if c is not None)
            out.append(f"GPU {index} SM clock under load changed between launches (MHz: {detail})")
        if temps and max(temps) - min(temps) > temp_c:
            detail = ", ".join(f"{w} {t:.0f}" for w, _, t in readings if t is not None)
            out.append(f"GPU {index} temperature under load changed between launches (°C: {detail})")
    return out
