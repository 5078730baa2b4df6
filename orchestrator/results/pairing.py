"""The two arms' launches block by block, and their runs paired run by run where they sent the same requests."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from orchestrator.config.slo import SLO
from orchestrator.results.goodput import block_values
from orchestrator.results.run import Level

if TYPE_CHECKING:
    from orchestrator.results.model import ArmResult, LaunchResult

Paired = dict[str, tuple[list[list[float]], list[list[float]]]]
# The fingerprint fields that digest a launch's workload, newest first (fingerprint.WORKLOAD_KEY and the key used before
# it): the model reads stored fingerprints without importing the code that collects them.
WORKLOAD_KEYS = ("workload_sha256", "workload_digest")


def same_requests(base: LaunchResult, arm: LaunchResult, level: Level) -> bool:
    """Run i of both launches sent the same requests: the same workload digest (settings and every request, recorded
    in each launch's fingerprint) and the same valid timed runs at this level. A launch without a digest (an older
    orch, a hand-made bundle) or a run invalid in only one of them breaks the correspondence."""
    fps = [launch.fingerprint or {} for launch in (base, arm)]
    # fingerprint.WORKLOAD_KEY, else LEGACY_WORKLOAD_KEY in launches stored before it (both launches the same kind).
    key = next((k for k in WORKLOAD_KEYS if all(isinstance(fp.get(k), str) for fp in fps)), None)
    if key is None or fps[0][key] != fps[1][key]:
        return False
    return [r.index for r in base.timed_at(level)] == [r.index for r in arm.timed_at(level)]


def block_pairs(base: ArmResult, arm: ArmResult) -> list[tuple[LaunchResult, LaunchResult]]:
    """The two arms' launches block by block, in block order: the blocks where both launched (each block holds one
    launch of every arm, in a random order; a block cut short may hold only some)."""
    base_by = {launch.block: launch for launch in base.launches}
    arm_by = {launch.block: launch for launch in arm.launches}
    return [(base_by[block], arm_by[block]) for block in sorted(base_by.keys() & arm_by.keys())]


def paired_blocks(
    base: ArmResult, arm: ArmResult, level: Level, metrics: Sequence[str], slo: SLO | None = None
) -> tuple[Paired, bool]:
    """Per metric, the run values of the two arms' launches block by block, over the same blocks for every metric:
    those where both launches have valid runs with positive values (goodput: `goodput.block_values`), each launch's
    runs in run order; and whether every such block's two launches sent the same requests run by run
    (`same_requests`)."""
    out: Paired = {m: ([], []) for m in metrics}
    shared = True
    for b_launch, a_launch in block_pairs(base, arm):
        b_timed = sorted(b_launch.timed_at(level), key=lambda r: r.index)
        a_timed = sorted(a_launch.timed_at(level), key=lambda r: r.index)
        found = {m: block_values(b_timed, a_timed, m, slo) for m in metrics}
        values = {m: v for m, v in found.items() if v is not None}
        if b_timed and a_timed and len(values) == len(found):
            for m, (b, a) in values.items():
                out[m][0].append(b)
                out[m][1].append(a)
            shared = shared and same_requests(b_launch, a_launch, level)
    return out, shared


def energy_paired(base: ArmResult, arm: ArmResult, level: Level) -> tuple[list[list[float]], list[list[float]], bool]:
    """The joules per token of the measured runs of both arms' launches block by block (blocks where both have
    some, runs in run order), and whether every such block's runs correspond one to one (same requests, same runs
    measured)."""
    b_out: list[list[float]] = []
    a_out: list[list[float]] = []
    paired = True
    for b_launch, a_launch in block_pairs(base, arm):
        b_runs = sorted(b_launch.energy_runs_at(level), key=lambda r: r.index)
        a_runs = sorted(a_launch.energy_runs_at(level), key=lambda r: r.index)
        if not b_runs or not a_runs:
            continue
        b_out.append([float(r.j_per_token or 0.0) for r in b_runs])
        a_out.append([float(r.j_per_token or 0.0) for r in a_runs])
        paired = (
            paired
            and same_requests(b_launch, a_launch, level)
            and [r.index for r in b_runs] == [r.index for r in a_runs]
        )
    return b_out, a_out, paired


def spec_paired(
    base: ArmResult, arm: ArmResult, level: Level
) -> tuple[list[list[float]], list[list[tuple[float, float]]], bool]:
    """For the break-even's interval, block by block (blocks where both launches have such runs): the baseline's
    runs' tok/s and the speculative arm's runs' (tok/s, accept length), runs in run order; and whether every such
    block's runs correspond one to one (same requests, same runs)."""
    b_out: list[list[float]] = []
    a_out: list[list[tuple[float, float]]] = []
    paired = True
    for b_launch, a_launch in block_pairs(base, arm):
        b_runs = sorted((r for r in b_launch.timed_at(level) if r.tok_s > 0), key=lambda r: r.index)
        a_runs = sorted(
            (r for r in a_launch.timed_at(level) if r.tok_s > 0 and (r.spec_accept_length or 0) > 0),
            key=lambda r: r.index,
        )
        if not b_runs or not a_runs:
            continue
        b_out.append([r.tok_s for r in b_runs])
        a_out.append([(r.tok_s, float(r.spec_accept_length or 0.0)) for r in a_runs])
        paired = (
            paired
            and same_requests(b_launch, a_launch, level)
            and [r.index for r in b_runs] == [r.index for r in a_runs]
        )
    return b_out, a_out, paired
