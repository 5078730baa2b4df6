"""A stored experiment read back as the same results model a live run returns (for show, export, whatif, resume)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from orchestrator.config.slo import SLO, check_metric, stored_judgement
from orchestrator.results import datasource
from orchestrator.results.autostop import with_auto_notes
from orchestrator.results.bundleformat import bench_config
from orchestrator.results.byprompt import stored_prompts
from orchestrator.results.categories import dataset_counts, stored_categories
from orchestrator.results.goodput import needs_rows
from orchestrator.results.model import ABResult, CutShort, Design, LaunchResult, spec_steps
from orchestrator.stats.estimates import DEFAULT_MIN_EFFECT

if TYPE_CHECKING:
    from orchestrator.results.run import RunResult
    from orchestrator.results.store import Store


def port_note(port: int | None, launches: Sequence[LaunchResult]) -> str | None:
    """What a report says of a port given for the experiment (`--port`, a nightly item's `port:`); None when every
    server listened on its profile's own. The ports are the launches' own (a resume may have given another)."""
    if port is None:
        return None
    seen = {((launch.fingerprint or {}).get("profile") or {}).get("port") for launch in launches if not launch.attached}
    used = sorted(p for p in seen if isinstance(p, int)) or [port]
    where = f"port {used[0]}" if len(used) == 1 else "ports " + ", ".join(map(str, used))
    return f"servers launched on {where} (given with --port or an item's port:, in place of the profiles' own)"


def stored_launches(store: Store, exp_id: str, *, requests: bool = False) -> tuple[list[LaunchResult], list[CutShort]]:
    """The experiment's completed launches (in execution order), and those that were cut short; with `requests`,
    every run carries its per-request rows (what goodput under an SLO is counted from)."""
    from orchestrator.results.run import RunResult

    out: list[LaunchResult] = []
    discarded: list[CutShort] = []
    for row in store.launches(exp_id):
        if row["status"] != "complete":
            discarded.append(CutShort(int(row.get("block") or 0), int(row["arm_index"]), str(row["status"])))
            continue
        per_run = request_rows(store, row["launch_id"]) if requests else {}
        out.append(
            LaunchResult(
                profile=row["profile"],
                launch_id=row["launch_id"],
                runs=tuple(
                    with_rows(RunResult.from_row(r), per_run.get(run_key(r), [])) for r in store.runs(row["launch_id"])
                ),
                ready_s=float(row["ready_s"] or 0.0),
                env_report=json.loads(row["env_report_json"] or "{}"),
                teardown=json.loads(row["teardown_json"] or "{}"),
                spec_steps=spec_steps(json.loads(row["profile_json"])),
                block=int(row.get("block") or 0),
                position=int(row["position"] if row.get("position") is not None else row["arm_index"]),
                arm_index=int(row["arm_index"]),
                gpus=json.loads(row["gpus_json"]) if row.get("gpus_json") else None,
                fingerprint=json.loads(row["fingerprint_json"]) if row.get("fingerprint_json") else None,
            )
        )
    return out, discarded


RunKey = tuple[bool, int, float, int]


def request_rows(store: Store, launch_id: str) -> dict[RunKey, list[dict[str, Any]]]:
    """A launch's per-request rows by run (warmup, concurrency, rate, index), each with `index` as a live run has
    it. The rate tells an open-loop launch's runs apart: each of its levels has concurrency 0 and indices from 0."""
    out: dict[RunKey, list[dict[str, Any]]] = {}
    for r in store.requests(launch_id):
        key = (bool(r["run_warmup"]), int(r["run_concurrency"]), float(r.get("run_rate") or 0.0), int(r["run_idx"]))
        out.setdefault(key, []).append({**r, "index": r["idx"]})
    return out


def run_key(row: dict[str, Any]) -> RunKey:
    concurrency = int(row["concurrency"]) if row.get("concurrency") is not None else 1
    return bool(row["warmup"]), concurrency, float(row.get("rate") or 0.0), int(row["idx"])


def with_rows(run: RunResult, rows: list[dict[str, Any]]) -> RunResult:
    return dataclasses.replace(run, per_request=tuple(rows)) if rows else run


def _resumable(exp: dict[str, Any]) -> bool:
    """Whether `orch ab --resume` could continue a stored, unfinished experiment (so whether to suggest it)."""
    error = exp.get("error") or ""
    return (
        exp["status"] != "running"  # its owner runs it (check_not_running refuses a resume)
        and bool(exp.get("design_json"))
        and len(json.loads(exp["arms_json"])) > 1
        and "--strict-env" not in error
        and "no valid timed run" not in error
    )


def load_result(
    store: Store,
    ref: str,
    *,
    min_effect: float | None = None,
    target_tps: float | None = None,
    slo: SLO | None = None,
    metric: str | None = None,
) -> ABResult:
    """A stored experiment, finished or not, as the same ABResult a live run returns (for show/export); `slo` and
    `metric` judge it on others than its own (`orch show --slo/--metric`)."""
    exp = store.find_experiment(ref)
    config = json.loads(exp["config_json"])
    own_slo, own_metric = stored_judgement(config, f"experiment {exp['id']}")
    slo = slo if slo is not None else own_slo
    metric = metric or own_metric
    check_metric(metric, slo, "--metric" if metric != own_metric else f"experiment {exp['id']}: metric")
    categories = stored_categories(config)
    prompts = stored_prompts(config)
    rows = needs_rows(slo, metric) or categories is not None or prompts is not None
    launches, cut = stored_launches(store, exp["id"], requests=rows)
    design = (
        Design.from_dict(json.loads(exp["design_json"]))
        if exp.get("design_json")
        else Design(blocks=1, order="fixed", seed=0, schedule=(tuple(range(len(json.loads(exp["arms_json"])))),))
    )
    notes = []
    if exp["status"] != "complete":
        total = len(design.slots())
        notes.append(
            f"experiment {exp['status']} after {len(launches)} of {total} launches"
            + (f" ({exp['error']})" if exp.get("error") and exp["status"] != "interrupted" else "")
            + (f"; continue it with: orch ab --resume {exp['id']}" if _resumable(exp) else "")
        )
    if cut:
        notes.append(f"{len(cut)} launch(es) cut short are stored but left out of the statistics")
    port = port_note(config.get("port") if isinstance(config.get("port"), int) else None, launches)
    notes += [port] if port else []
    result = ABResult(
        experiment_id=exp["id"],
        simulated=bool(exp["simulated"]),
        host=exp["host"],
        profiles=tuple(json.loads(exp["arms_json"])),
        launches=tuple(launches),
        host_facts=config.get("host_facts") or {},
        target_tps=target_tps if target_tps is not None else config.get("target_tps"),
        design=design,
        min_effect=min_effect if min_effect is not None else float(config.get("min_effect", DEFAULT_MIN_EFFECT)),
        status=exp["status"],
        notes=tuple(notes),
        cut_short=tuple(cut),
        slo=slo,
        metric=metric,
        sweep=config.get("sweep") if isinstance(config.get("sweep"), dict) else None,
        categories=categories,
        # Only where the stored workload still reads as it was (its categories were found by its digest).
        dataset_categories=dataset_counts(bench_config(config)) if categories is not None else None,
        prompts=prompts,
        dataset=datasource.recorded(config),
        cache_measured=bool(config.get("cache_measured")),
    )
    return with_auto_notes(result)
