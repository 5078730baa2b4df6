"""The nightly history: what each night measured (one value per series, with its environment), in the store."""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from orchestrator.errors import StoreError
from orchestrator.launch import fingerprint
from orchestrator.nightly.suite import ACROSS_LEVELS, Item, Metric, as_metric
from orchestrator.results.goodput import comparable
from orchestrator.results.model import ABResult, ArmResult
from orchestrator.results.run import Level
from orchestrator.results.store import Store, owner_gone, this_process
from orchestrator.stats.crossover import Crossover
from orchestrator.stats.reproduction import arm_estimate


@dataclass(frozen=True, kw_only=True)
class SeriesValue:
    """Tonight's value of one series: an arm's metric (`baseline:tok_s`) or an A/B ratio (`eagle3/baseline:tok_s`)."""

    series: str
    arm: str  # the arm's label, or "ARM/BASELINE" for a ratio
    metric: str  # as the suite writes it: tok_s, agg_tok_s@32
    value: float
    lo: float | None  # 95 % CI across launches (blocks for a ratio); None with one
    hi: float | None
    n: int  # launches (blocks for a ratio) behind the value
    threshold: float
    higher_is_better: bool
    env: str  # digest of the environment the value was measured in
    env_arms: tuple[str, ...]  # whose environments make up `env`
    min_history: int = 5  # the suite's: nights an environment needs before a regression can be called
    # crossover and max_rate_slo only: how a night that does not cross in the range measured is censored, None
    # when it crosses. "above": better at every level (value = the highest level, a lower bound), "below": worse at
    # every level (value = the lowest level, an upper bound), "undecided": no crossing seen but one not excluded
    # (value = the middle of where it may lie; never judged). result.judge says how each is judged.
    censored: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["env_arms"] = list(self.env_arms)
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SeriesValue:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known} | {"env_arms": tuple(d.get("env_arms") or ())})


def series_name(arm: str, metric: str) -> str:
    return f"{arm}:{metric}"


def env_key(envs: dict[str, dict[str, Any]], arms: Sequence[str]) -> str:
    data = {a: envs.get(a, {}) for a in arms}
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


def run_values(arm: ArmResult, metric: Metric, level: Level) -> list[list[float]]:
    """Per launch, the valid timed runs' values of the metric (runs without one left out). Goodput counts half a
    request more in every run (results/goodput.CONTINUITY): a night in which no request met the SLO is a value on
    the log scale (and a regression), not a gap in the series."""
    out = []
    for launch in arm.launches:
        values: list[float] = []
        for run in launch.timed_at(level):
            name = as_metric(metric.name)
            v: Any = comparable(run, name, arm.slo) if name is not None else run.spec_accept_length
            if isinstance(v, int | float) and math.isfinite(v) and v > 0:
                values.append(float(v))
        out.append(values)
    return out


# The environment's field for the data the item sent (results/datasource): a dataset file edited between nights is
# an environment step, named with its old and new sha256, not a regression. Nights stored before it lack the field,
# which is no change (environment_ids).
DATASET_FIELD = "dataset"


def arm_environments(result: ABResult) -> dict[str, dict[str, Any]]:
    """Each arm's environment, from its first launch with a fingerprint (and, multi-node, every node's facts), with
    the data the experiment sent, by name and sha256."""
    out: dict[str, dict[str, Any]] = {}
    for arm in result.arms:
        fp = next((launch.fingerprint for launch in arm.launches if launch.fingerprint), None)
        out[arm.label] = fingerprint.environment(fingerprint.with_nodes(fp, result.host_facts))
        if result.dataset is not None:
            out[arm.label][DATASET_FIELD] = result.dataset.label()
    return out


def measure(item: Item, result: ABResult, min_history: int = 5) -> tuple[list[SeriesValue], dict[str, dict[str, Any]]]:
    """Tonight's value of every series of an item, and each arm's environment. A metric an arm did not produce
    (accept length without speculation, a level without valid runs) is simply not there."""
    envs = arm_environments(result)
    out: list[SeriesValue] = []
    first_level = item.levels[0]
    for metric in item.metrics:
        if metric.name in ACROSS_LEVELS:
            out += across_levels(metric, result, envs, min_history)
            continue
        level = metric.concurrency if metric.concurrency is not None else first_level
        higher = metric.higher_is_better
        for arm in result.arms:
            per_launch = [v for v in run_values(arm, metric, level) if v]
            if not per_launch:
                continue
            est = arm_estimate(per_launch, seed=result.design.seed)
            out.append(
                SeriesValue(
                    series=series_name(arm.label, metric.key),
                    arm=arm.label,
                    metric=metric.key,
                    value=est.value,
                    lo=est.lo,
                    hi=est.hi,
                    n=est.launches,
                    threshold=metric.threshold,
                    higher_is_better=higher,
                    env=env_key(envs, [arm.label]),
                    env_arms=(arm.label,),
                    min_history=min_history,
                )
            )
        if metric.name not in ("tok_s", "agg_tok_s", "goodput") or len(result.arms) < 2:
            continue
        # The ratio to the baseline, measured within the night, block by block: host drift cancels out of it.
        for c in result.comparisons_at(level, "goodput" if metric.name == "goodput" else "tok_s"):
            ratio_est = c.estimate
            if ratio_est is None:
                continue
            ratio = c.aggregate_ratio if metric.name == "agg_tok_s" else c.ratio
            if ratio is None or ratio <= 0:
                continue
            has_ci = metric.name != "agg_tok_s" and ratio_est.blocks >= 2
            ci = (ratio_est.lo, ratio_est.hi) if has_ci else (None, None)
            label = f"{c.arm_label or c.arm}/{c.vs_label or c.vs}"
            arms = (c.arm_label or c.arm, c.vs_label or c.vs)
            out.append(
                SeriesValue(
                    series=series_name(label, metric.key),
                    arm=label,
                    metric=metric.key,
                    value=ratio,
                    lo=ci[0],
                    hi=ci[1],
                    n=ratio_est.blocks,
                    threshold=metric.threshold,
                    higher_is_better=True,
                    env=env_key(envs, arms),
                    env_arms=arms,
                    min_history=min_history,
                )
            )
    return out, envs


def across_levels(
    metric: Metric, result: ABResult, envs: dict[str, dict[str, Any]], min_history: int
) -> list[SeriesValue]:
    """crossover: each arm's crossing against the baseline (`eagle3/baseline:crossover`, on the experiment's
    metric, tok/s unless set); max_rate_slo: each arm's highest load within the item's slo
    (`baseline:max_rate_slo`). A night without two complete blocks at every level has no value."""
    found: list[tuple[str, tuple[str, ...], Crossover]]
    if metric.name == "crossover":
        base = result.arms[0].label if result.arms else ""
        found = [(f"{arm.label}/{base}", (arm.label, base), c) for arm, c in result.crossovers()]
    else:
        found = [(arm.label, (arm.label,), c) for arm, c in result.max_within_slo()]
    out = []
    for label, arms, c in found:
        value, lo, hi, censored, higher = censored_value(c)
        out.append(
            SeriesValue(
                series=series_name(label, metric.key),
                arm=label,
                metric=metric.key,
                value=value,
                lo=lo,
                hi=hi,
                n=c.blocks,
                threshold=metric.threshold,
                higher_is_better=higher,
                env=env_key(envs, list(arms)),
                env_arms=arms,
                min_history=min_history,
                censored=censored,
            )
        )
    return out


def censored_value(c: Crossover) -> tuple[float, float | None, float | None, str | None, bool]:
    """(value, lo, hi, censored, higher_is_better) of a crossing as a series stores it. A crossing the arm pays
    below is better higher (it pays up to a higher load); one it pays above (worse at low load), lower."""
    first, last = c.levels[0], c.levels[-1]
    if c.status == "crosses" and c.at is not None:
        return c.at, c.lo, c.hi, None, bool(c.pays_below)
    if c.status == "pays throughout":
        return last, last, None, "above", True
    if c.status == "never pays":
        return first, None, first, "below", True
    lo, hi = c.lo if c.lo is not None else first, c.hi if c.hi is not None else last
    return math.sqrt(lo * hi), c.lo, c.hi, "undecided", True


# ---------------------------------------------------------------- nights in the store


def start_night(store: Store, night_id: str, suite: str, suite_path: str, suite_sha: str, night_at: float) -> None:
    with store.transaction("recording the start of a night") as c:
        c.execute(
            "INSERT INTO nights (id, suite, suite_path, suite_sha256, night_at, started_at, status, owner_json)"
            " VALUES (?, ?, ?, ?, ?, ?, 'running', ?)",
            (night_id, suite, suite_path, suite_sha, night_at, time.time(), json.dumps(this_process())),
        )


def finish_night(store: Store, night_id: str, status: str, exit_code: int, report: dict[str, Any]) -> None:
    with store.transaction("recording how the night ended") as c:
        c.execute(
            "UPDATE nights SET status = ?, exit_code = ?, finished_at = ?, report_json = ? WHERE id = ?",
            (status, exit_code, time.time(), json.dumps(report, default=str), night_id),
        )


def record_item(
    store: Store,
    night_id: str,
    item: Item,
    *,
    status: str,
    experiments: Sequence[str],
    error: str | None,
    series: Sequence[SeriesValue],
    envs: dict[str, dict[str, Any]],
    simulated: bool,
    decisions: dict[str, dict[str, Any]] | None = None,
) -> None:
    """One item of a night, stored the moment it is decided (a night cut short keeps what it measured), with what
    the night decided about each series (`orch history` shows that, not a recomputation)."""
    rows = [
        s.to_dict() | ({"decision": decisions[s.series]} if decisions and s.series in decisions else {}) for s in series
    ]
    with store.transaction(f"recording nightly item {item.name}") as c:
        c.execute(
            "INSERT OR REPLACE INTO night_items (night_id, item, host, kind, simulated, status, experiments_json,"
            " error, series_json, envs_json, finished_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                night_id, item.name, item.host, item.kind, int(simulated), status, json.dumps(list(experiments)),
                error, json.dumps(rows), json.dumps(envs, default=str), time.time(),
            ),
        )  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class ItemNight:
    """One night of one item, as stored: what it measured, or why it could not."""

    night_id: str
    night_at: float
    suite: str
    status: str  # complete | failed | timeout | skipped
    error: str | None
    experiments: tuple[str, ...]
    series: tuple[SeriesValue, ...]
    envs: dict[str, dict[str, Any]]
    simulated: bool
    decisions: dict[str, dict[str, Any]] = field(default_factory=dict)  # series -> status, note, change

    def value(self, series: str) -> SeriesValue | None:
        return next((s for s in self.series if s.series == series), None)


def item_nights(
    store: Store, item: str, host: str | None = None, *, suite: str | None = None, before: str | None = None
) -> list[ItemNight]:
    """Every stored night of an item (on one host), oldest first; `before`: only nights before that night."""
    sql = (
        "SELECT i.*, n.night_at, n.suite FROM night_items i JOIN nights n ON n.id = i.night_id WHERE i.item = ?"
        + (" AND i.host = ?" if host is not None else "")
        + (" AND n.suite = ?" if suite is not None else "")
    )
    params: tuple[Any, ...] = (item, *((host,) if host is not None else ()), *((suite,) if suite else ()))
    rows = store.query(sql + " ORDER BY n.night_at, n.started_at", params)
    out = []
    for row in rows:
        if before is not None and row["night_id"] == before:
            break
        try:
            raw = json.loads(row["series_json"])
            series = tuple(SeriesValue.from_dict(d) for d in raw)
            decisions = {d["series"]: d["decision"] for d in raw if isinstance(d.get("decision"), dict)}
            envs = json.loads(row["envs_json"])
            experiments = tuple(json.loads(row["experiments_json"]))
        except (ValueError, TypeError, KeyError) as e:
            raise StoreError(f"{store.path}: nightly item {item} of night {row['night_id']} is unreadable: {e}") from e
        out.append(
            ItemNight(
                night_id=row["night_id"],
                night_at=float(row["night_at"]),
                suite=row["suite"],
                status=row["status"],
                error=row["error"],
                experiments=experiments,
                series=series,
                envs=envs,
                simulated=bool(row["simulated"]),
                decisions=decisions,
            )
        )
    return out


def item_hosts(store: Store, item: str) -> list[str]:
    return [r[0] for r in store.query("SELECT DISTINCT host FROM night_items WHERE item = ? ORDER BY host", (item,))]


def known_items(store: Store) -> list[str]:
    return [r[0] for r in store.query("SELECT DISTINCT item FROM night_items ORDER BY item")]


def nights(store: Store, limit: int = 20) -> list[dict[str, Any]]:
    """The latest nights, newest first; a night whose orch was killed shows as interrupted."""
    rows = [dict(r) for r in store.query("SELECT * FROM nights ORDER BY started_at DESC LIMIT ?", (limit,))]
    for row in rows:
        if row["status"] == "running" and row.get("owner_json"):
            gone = owner_gone(json.loads(row["owner_json"]))
            if gone:
                row["status"] = "interrupted"
    return rows


def night_experiments(store: Store, night_id: str, item: str) -> list[str]:
    """The experiments an item ran in a night (a failed or stopped one included), oldest first."""
    rows = store.query(
        "SELECT id FROM experiments WHERE json_extract(config_json, '$.nightly.night_id') = ?"
        " AND json_extract(config_json, '$.nightly.item') = ? ORDER BY rowid",  # as recorded, whatever the clock said
        (night_id, item),
    )
    return [r[0] for r in rows]


def series_environment(envs: dict[str, dict[str, Any]], arms: Sequence[str]) -> dict[str, Any]:
    """The environment a series was measured in: its arms' environments together."""
    return {f"{arm}\t{key}": value for arm in arms for key, value in envs.get(arm, {}).items()}


def environment_ids(envs: Sequence[dict[str, Any]]) -> list[str]:
    """A label per night that changes exactly where the environment did. A field one night could not read (None,
    or missing) is no evidence of a change: a transient nvidia-smi failure must not start a new history and blind
    the detector for `min_history` nights."""
    ids: list[str] = []
    known: dict[str, Any] = {}
    segment = 0
    for env in envs:
        if ids and any(v is not None and known.get(k) is not None and known[k] != v for k, v in env.items()):
            segment += 1
            known = {}
        known.update({k: v for k, v in env.items() if v is not None})
        ids.append(str(segment))
    return ids
