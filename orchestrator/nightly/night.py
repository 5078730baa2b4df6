"""`orch nightly`: run a suite's items, store each the moment it ends, and judge it tonight and against history."""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator.common import stopsignals
from orchestrator.config.design import ABConfig
from orchestrator.config.secretpatterns import scrub
from orchestrator.errors import HostBusy, InputError, OrchError
from orchestrator.experiment import ab, failon
from orchestrator.experiment import host as experiment_host
from orchestrator.hosts import lock as locks
from orchestrator.hosts import open_host, resolve_host
from orchestrator.hosts.base import KINDS, HostConfig, default_namespace
from orchestrator.hosts.inventory import HostGroup, load_groups, load_inventory, parse_target
from orchestrator.launch import ports
from orchestrator.launch import single as server
from orchestrator.nightly import fanout, history
from orchestrator.nightly.result import ItemReport, NightReport, SeriesVerdict, item_status, judge, rerun_note
from orchestrator.nightly.suite import DEFAULT_TIMEOUT_S, Item, Suite
from orchestrator.results.model import ABResult, Design
from orchestrator.results.store import Store
from orchestrator.ui import progress
from orchestrator.ui.events import QUIET, Events, Lines
from orchestrator.ui.progress import run_line

# How a night queues for a busy host: its suite's `wait:`, not --wait (which `orch nightly` does not take).
WAIT_HINT = "The suite's wait: sets how long a night queues."


class NightBusyError(OrchError):
    """Another night still runs on this machine and did not finish within the suite's wait."""


# ---------------------------------------------------------------- running


class _Alarm:
    """Stops the item in progress when its time (or the night's) is up, the way Ctrl-C would: the run loop tears
    the server down and records the experiment interrupted. Signals reach only the main thread, so the timer
    thread raises SIGINT at this process and says why."""

    def __init__(self) -> None:
        self.fired: str | None = None
        self._timer: threading.Timer | None = None

    def arm(self, seconds: float, reason: str) -> None:
        self.cancel()
        self.fired = None
        self._timer = threading.Timer(max(0.0, seconds), self._fire, args=(reason,))
        self._timer.daemon = True
        self._timer.start()

    def _fire(self, reason: str) -> None:
        self.fired = reason
        os.kill(os.getpid(), _stop_signal())

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def _stop_signal() -> signal.Signals:
    """The signal that stops this process the way Ctrl-C does. Started with SIGINT ignored (`orch nightly &` in a
    script, some cron wrappers), Python installs no handler for it and a self-sent SIGINT is lost, so the item would
    run on past its timeout and the night's deadline: then SIGTERM, which orch's entry point unwinds like Ctrl-C."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN and callable(signal.getsignal(signal.SIGTERM)):
        return signal.SIGTERM
    return signal.SIGINT


def suite_inventory(suite: Suite) -> dict[str, HostConfig]:
    """The suite's inventory (its `inventory:`, else a hosts.yaml next to it, $ORCH_HOSTS or the user config
    dir's): never one in whatever directory cron starts in."""
    try:
        return load_inventory(suite.inventory) if suite.inventory else {}
    except OrchError as e:
        raise InputError(f"{suite.path}: inventory: {e}") from None


def suite_groups(suite: Suite) -> dict[str, HostGroup]:
    """The suite inventory's groups of hosts (multi-node launches); {} without an inventory."""
    try:
        return load_groups(suite.inventory) if suite.inventory else {}
    except OrchError as e:
        raise InputError(f"{suite.path}: inventory: {e}") from None


def check_hosts(suite: Suite) -> None:
    """Every item's host must resolve before anything launches (connecting is the night's job), and a multi-node
    item's host must be an inventory group of enough hosts or a Slurm host (which asks for that many nodes)."""
    inventory, groups = suite_inventory(suite), suite_groups(suite)
    for item in suite.items:
        where = f"{suite.path}: item {item.name!r}: host"
        port_where = f"{suite.path}: item {item.name!r}: port"
        nodes = experiment_host.nodes_needed(item.profiles)
        if item.host in groups:
            have = len(groups[item.host].nodes)
            if nodes > have:
                raise InputError(f"{where}: group {item.host} has {have} host(s), but a profile has nnodes: {nodes}")
            ports.check(item.port, item.profiles, groups[item.host], where=port_where)
            continue
        try:
            config = parse_target(item.host, inventory)
        except OrchError as e:
            raise InputError(f"{where}: {e}") from None
        ports.check(item.port, item.profiles, config, where=port_where)
        if nodes > 1 and not config.capabilities.allocates_nodes:
            schedulers = " or ".join(c.allocator for c in KINDS.values() if c.allocates_nodes and c.allocator)
            raise InputError(
                f"{where}: {item.host!r} is one host, but a profile has nnodes: {nodes}; name an inventory group of "
                f"at least {nodes} hosts or a {schedulers} host"
            )


def check_warnings(suite: Suite) -> list[str]:
    """What --check warns about (valid, exit code unchanged): items whose timeout the night's deadline cuts, a load
    metric at a throughput-sized threshold, and `fan_out: true` that cannot run items in parallel."""
    return (
        deadline_warnings(suite)
        + mismatch_warnings(suite)
        + load_threshold_warnings(suite)
        + fanout.warnings(suite, suite_inventory(suite))
    )


# Below this, a crossover or SLO-capacity series pages on its own noise: their 95 % CIs are typically ±10-20 % of
# the value (docs/load.md), where a throughput's is a few %.
LOAD_THRESHOLD = 0.10


def load_threshold_warnings(suite: Suite) -> list[str]:
    """crossover / max_rate_slo metrics left at a throughput-sized threshold."""
    tight = [
        f"{i.name}: {m.key} at {m.threshold * 100:g} %"
        for i in suite.items
        for m in i.metrics
        if m.name in ("crossover", "max_rate_slo") and m.threshold < LOAD_THRESHOLD
    ]
    if not tight:
        return []
    return [
        f"{'; '.join(tight)}: a crossover's or SLO capacity's 95 % CI is typically ±10-20 % of it, so such a "
        "threshold will call its noise a change; give it its own (metrics: {crossover: 20%, max_rate_slo: 20%})"
    ]


def deadline_warnings(suite: Suite) -> list[str]:
    """Items whose `timeout` is longer than the whole night: the deadline stops them first, whatever else runs."""
    long = [i for i in suite.items if i.timeout_s > suite.deadline_s]
    if not long:
        return []
    names = ", ".join(f"{i.name} ({progress.duration(i.timeout_s)})" for i in long)
    return [
        f"timeout longer than the suite's deadline ({progress.duration(suite.deadline_s)}) for {names}: such an item "
        "can never use its whole timeout, the night's deadline stops it first (and records it as timed out). Give it "
        f"a timeout within the deadline (item `timeout:`, or `defaults: timeout:`; default "
        f"{progress.duration(DEFAULT_TIMEOUT_S)}), or a longer deadline"
    ]


def mismatch_warnings(suite: Suite) -> list[str]:
    """`allow_node_mismatch: true` on items that launch on one node: nothing for it to allow."""
    single = [i.name for i in suite.items if i.allow_node_mismatch and experiment_host.nodes_needed(i.profiles) == 1]
    if not single:
        return []
    return [
        f"allow_node_mismatch: true has no effect for {', '.join(single)}: every profile of such an item runs on one "
        "node (it applies to profiles with nnodes > 1, on a group or a Slurm host)"
    ]


def describe_hosts(suite: Suite) -> str:
    """Where each host of the suite comes from, for --check: an inventory entry, a Slurm allocation asked for at
    night, or an SSH name tried at night."""
    inventory, groups = suite_inventory(suite), suite_groups(suite)
    out = []
    nodes_asked: dict[str, set[int]] = {}
    for item in suite.items:
        nodes_asked.setdefault(item.host, set()).add(experiment_host.nodes_needed(item.profiles))
    for spec in dict.fromkeys(item.host for item in suite.items):
        if spec in groups:
            group = groups[spec]
            out.append(f"{spec} (a group of {len(group.nodes)} hosts: {', '.join(group.nodes)}, from {group.source})")
            continue
        config = parse_target(spec, inventory)
        if config.is_local:
            out.append(f"{spec} (this machine)")
        elif config.capabilities.allocates_nodes:
            where = f"partition {config.partition}" if config.partition else "the default partition"
            nodes = _slurm_nodes(sorted(nodes_asked[spec]), config.exclusive)
            source = f", from {config.source}" if spec in inventory else ""
            out.append(f"{spec} (a Slurm allocation in {where}, {nodes}, asked for when the night runs{source})")
        elif spec in inventory:
            target = f"{config.user + '@' if config.user else ''}{config.address}:{config.port or 22}"
            out.append(f"{spec} ({target}, from {config.source})")
        else:
            out.append(f"{spec} (not in an inventory: an SSH name or address, first tried when the night connects; "
                       f"`orch hosts check {spec}` tries it now)")  # fmt: skip
    return "; ".join(out)


def _slurm_nodes(counts: list[int], exclusive: bool) -> str:
    """What a Slurm host's allocation asks for, by the node counts of the items on it: "an exclusive node",
    "2 exclusive nodes", "1 or 2 (by item) exclusive nodes"."""
    if counts == [1]:
        what = "an exclusive node" if exclusive else "a node"
    else:
        by_item = " (by item)" if len(counts) > 1 else ""
        shown = [str(n) for n in counts]
        numbers = ", ".join(shown[:-1]) + " or " + shown[-1] if len(shown) > 1 else shown[0]
        what = numbers + by_item + (" exclusive" if exclusive else "") + " nodes"
    return what if exclusive else what + " it may share with other jobs (exclusive: false)"


def suite_summary(suite: Suite) -> dict[str, Any]:
    """The validated suite as --check --json prints it."""
    return {
        "suite": suite.name,
        "path": str(suite.path),
        "sha256": suite.sha256,
        "deadline_s": suite.deadline_s,
        "wait_s": suite.wait_s,
        "confirm": suite.confirm,
        "min_history": suite.min_history,
        "fan_out": suite.fan_out,
        "inventory": suite.inventory,
        "warnings": check_warnings(suite),
        "items": [
            {
                "name": i.name, "kind": i.kind, "profiles": [p.name for p in i.profiles], "host": i.host,
                "simulated": i.sim, "blocks": i.blocks, "timeout_s": i.timeout_s, "threshold": i.threshold,
                "fail_on": list(i.fail_on), "metrics": {m.key: m.threshold for m in i.metrics},
                **({"slo": i.slo.to_dict()} if i.slo is not None else {}),
                "allow_node_mismatch": i.allow_node_mismatch,
                "workload": i.bench.to_dict(),
            }
            for i in suite.items
        ],
    }  # fmt: skip


def _merge(first: ABResult, second: ABResult) -> ABResult:
    """Two experiments of one item in one night as one measurement: the second's blocks follow the first's."""
    offset = first.design.blocks
    shifted = tuple(dataclasses.replace(launch, block=launch.block + offset) for launch in second.launches)
    design = Design(
        blocks=first.design.blocks + second.design.blocks,
        order=first.design.order,
        seed=first.design.seed,
        schedule=first.design.schedule + second.design.schedule,
    )
    return dataclasses.replace(first, launches=first.launches + shifted, design=design)


@dataclass(kw_only=True)
class NightRunner:
    """Runs one night of a suite against one store; `events` gets the progress lines."""

    suite: Suite
    store: Store
    night_at: float
    events: Events = QUIET
    only: tuple[str, ...] = ()
    night_id: str = ""  # default: n<the night's date>-<random>
    last: NightReport | None = None  # the night so far, also when it was interrupted
    _cut: ItemReport | None = None  # the item Ctrl-C (or SIGTERM) stopped, as far as it got
    _alarm: _Alarm = field(default_factory=_Alarm)
    _allocation: str | None = None  # the item in progress on Slurm: nightly/fanout.allocation_state

    def __post_init__(self) -> None:
        if not self.night_id:
            self.night_id = "n" + time.strftime("%Y%m%d-", time.localtime(self.night_at)) + uuid.uuid4().hex[:6]

    def run(self) -> NightReport:
        lock = locks.night_lock_path(default_namespace())
        got = locks.take_night_lock(lock, self.suite.name, self.suite.wait_s, self.events)
        if not got["acquired"]:
            holder = locks.describe_night_holder(got["holder"])
            error = (
                f"another night still runs on this machine ({holder}) after waiting {self.suite.wait_s:.0f}s (the "
                "suite's wait:); this night did not start. Nights must not overlap: move the cron time, or shorten "
                "the suite's deadline"
            )
            now = time.time()
            # Said like any other night (stdout, --markdown-out): a night that silently did not run is a night lost.
            self.last = NightReport(
                night_id=self.night_id,
                suite=self.suite.name,
                suite_path=str(self.suite.path),
                night_at=self.night_at,
                started_at=now,
                finished_at=now,
                status="busy",
                items=(),
                error=error,
            )
            raise NightBusyError(error)
        try:
            return self._run_locked()
        finally:
            locks.release_in_process(lock)

    def _run_locked(self) -> NightReport:
        suite = self.suite
        started = time.time()
        deadline = time.monotonic() + suite.deadline_s
        history.start_night(self.store, self.night_id, suite.name, str(suite.path), suite.sha256, self.night_at)
        reports: list[ItemReport] = []
        status = "complete"
        items = [i for i in suite.items if not self.only or i.name in self.only]
        self.events.line(
            f"night {self.night_id}: suite {suite.name} ({len(items)} item(s)), deadline "
            f"{progress.duration(suite.deadline_s)}, results database {self.store.path}"
        )
        fan = fanout.FanOut(self, deadline)
        parallel = fanout.fanned(suite, items, suite_inventory(suite))
        try:
            for n, item in enumerate(parallel + [i for i in items if i not in parallel], start=1):
                if time.monotonic() >= deadline:
                    status = "deadline"
                    reports.append(self._skipped(item, "the night's deadline had passed before it could start"))
                    continue
                own = " (its own allocation, in parallel)" if item in parallel else ""
                self.events.line(f"item {n}/{len(items)}: {item.name} on {item.host}{own}")
                if item in parallel:
                    fan.start(item)  # reported by fan.wait()
                else:
                    reports.append(self._item(item, deadline))
            reports += fan.wait()
            if any(r.status == "timeout" and r.error and "deadline" in r.error for r in reports):
                status = "deadline"
        except KeyboardInterrupt:
            status = "interrupted"
            reports += fan.stop()
            if self._cut is not None:
                reports.append(self._cut)
            done = {r.item for r in reports}
            reports += [self._skipped(i, "the night was interrupted") for i in items if i.name not in done]
            raise
        except BaseException:
            status = "failed"  # orch itself failed (the store, a bug): recorded as such, never as complete
            raise
        finally:
            self._alarm.cancel()
            reports += fan.stop()  # no child outlives the night
            order = {i.name: n for n, i in enumerate(items)}
            reports.sort(key=lambda r: order[r.item])
            report_obj = NightReport(
                night_id=self.night_id,
                suite=suite.name,
                suite_path=str(suite.path),
                night_at=self.night_at,
                started_at=started,
                finished_at=time.time(),
                status=status,
                items=tuple(reports),
            )
            history.finish_night(self.store, self.night_id, status, report_obj.exit_code, report_obj.to_dict())
            self.last = report_obj
        return report_obj

    def _skipped(self, item: Item, why: str) -> ItemReport:
        history.record_item(
            self.store, self.night_id, item, status="skipped", experiments=(), error=why, series=(), envs={},
            simulated=item.sim,
        )  # fmt: skip
        return ItemReport(
            item=item.name, host=item.host, kind=item.kind, simulated=item.sim, status="skipped", error=why
        )

    def _measure_once(self, item: Item, deadline: float) -> ABResult:
        """One experiment of the item, stopped at its timeout or the night's deadline, whichever comes first."""
        budget = min(item.timeout_s, deadline - time.monotonic())
        why = "the night's deadline" if budget < item.timeout_s else f"the item's timeout ({item.timeout_s:.0f}s)"
        config = ABConfig(
            bench=item.bench,
            simulate=item.sim,
            namespace=default_namespace(),
            ready_timeout_s=item.ready_timeout_s,
            grace_s=item.grace_s,
            strict_env=item.strict_env,
            allow_node_mismatch=item.allow_node_mismatch,
            lock_wait_s=max(0.0, min(self.suite.wait_s, budget)),
            gpu_wait_s=item.gpu_wait_s,
            blocks=item.blocks,
            order=item.order,
            min_effect=item.threshold,
            port=item.port,
            slo=item.slo,
            cache_measured=item.cache_measured,
        )
        prefix = f"[{item.name}] "
        self._allocation = None

        def said(msg: str) -> None:
            self._allocation = fanout.allocation_state(msg, self._allocation)
            self.events.line(prefix + msg)

        # Its phases pass on only to a night that is watched: none is yet (nightly prints lines, no live view).
        events = Lines(said, self.events.phase if self.events.watched else None)

        self._alarm.arm(budget, why)
        try:
            nodes = experiment_host.nodes_needed(item.profiles)
            # A Slurm host says how its allocation waits in the queue (and where an interrupted item stood).
            if self.suite.inventory:  # its groups too
                host = resolve_host(item.host, inventory=self.suite.inventory, nodes=nodes, events=events)
            else:
                host = open_host(parse_target(item.host, {}), nodes=nodes, events=events)
            with host:
                return ab.run_ab(
                    host,
                    list(item.profiles),
                    config,
                    self.store,
                    events=events,
                    on_run=lambda _name, run: self.events.line(prefix + "  " + run_line(run, item.bench)),
                    provenance={
                        "host_spec": item.host,
                        "namespace": config.namespace,
                        # `orch list` shows the experiment as the night's (its night_at is --now's, when given).
                        "nightly": {
                            "night_id": self.night_id,
                            "suite": self.suite.name,
                            "item": item.name,
                            "night_at": self.night_at,
                        },
                    },
                )
        except KeyboardInterrupt:
            if self._alarm.fired is not None:
                # The night's own stop (the item's time is up), handled by the caller: the night goes on, and the
                # next signal (the next item's timer, Ctrl-C) stops it again.
                stopsignals.rearm()
            raise
        finally:
            self._alarm.cancel()

    def _item(self, item: Item, deadline: float) -> ItemReport:
        began = time.monotonic()
        past = history.item_nights(self.store, item.name, item.host)
        try:
            result = self._measure_once(item, deadline)
        except KeyboardInterrupt:
            if self._alarm.fired is None:
                # Elsewhere than on Slurm nothing is said of an allocation: the item ran.
                stood = "queued" if self._allocation == "queued" else "granted"
                self._cut = self._failed(item, "interrupted", fanout.interrupted_why(stood), began)
                raise
            queued = " while queued for its allocation" if self._allocation == "queued" else ""
            return self._failed(item, "timeout", f"stopped by {self._alarm.fired}{queued}", began)
        except HostBusy as e:
            return self._failed(item, "failed", str(e.waiting_by(WAIT_HINT)), began)
        except OrchError as e:
            return self._failed(item, "failed", str(e), began)
        except Exception as e:  # a bug in orch must not cost the rest of the night
            return self._failed(item, "failed", f"unexpected {type(e).__name__}: {e}", began)
        experiments = [result.experiment_id]
        series, envs = history.measure(item, result, self.suite.min_history)
        tonight = self._tonight(item, envs)
        verdicts = [judge(v, past, tonight, self.suite.min_history) for v in series]
        if self.suite.confirm and any(v.status == "regression" for v in verdicts):
            verdicts, result, series, envs = self._confirm(
                item, deadline, past, result, verdicts, experiments, (series, envs)
            )
        expect = item.profiles[0].expect if len(item.profiles) == 1 else None
        relative = failon.fail_on_verdict(result, item.fail_on, expect=expect) if item.fail_on else None
        status = item_status(verdicts, relative is not None and relative.exit_code == 3)
        comparisons = tuple(c.to_dict() for level in result.levels for c in result.comparisons_at(level))
        mismatch = result.node_mismatch()  # allow_node_mismatch: true let nodes that differ launch
        report = ItemReport(
            item=item.name, host=item.host, kind=item.kind, simulated=item.sim, status=status,
            experiments=tuple(experiments), series=tuple(verdicts), comparisons=comparisons,
            fail_on=relative.to_dict() if relative else None, seconds=time.monotonic() - began,
            warnings=(mismatch,) if mismatch else (),
        )  # fmt: skip
        # `orch history` says a night that paged under fail_on as such, on every series of the item.
        hit = {"fail_on": text} if (text := report.fail_on_text()) else {}
        history.record_item(
            self.store, self.night_id, item, status="complete", experiments=experiments, error=None, series=series,
            envs=envs, simulated=item.sim, decisions={v.value.series: v.decision() | hit for v in verdicts},
        )  # fmt: skip
        self.events.line(f"[{item.name}] done in {report.seconds:.0f}s: {status}")
        return report

    def _confirm(
        self,
        item: Item,
        deadline: float,
        past: Sequence[history.ItemNight],
        first: ABResult,
        verdicts: list[SeriesVerdict],
        experiments: list[str],
        measured: tuple[list[history.SeriesValue], dict[str, dict[str, Any]]],
    ) -> tuple[list[SeriesVerdict], ABResult, list[history.SeriesValue], dict[str, dict[str, Any]]]:
        """Tonight looks like a regression: measure once more from fresh state and report it only if the re-run
        says so too (one bad measurement is not a regression). Tonight's value is then both experiments pooled."""
        suspects = [v.value.series for v in verdicts if v.status == "regression"]
        self.events.line(f"[{item.name}] looks like a regression ({', '.join(suspects)}); re-measuring once to confirm")
        try:
            second = self._measure_once(item, deadline)
        except KeyboardInterrupt:
            if self._alarm.fired is None:
                # The first measurement stands as evidence: stored, and said in the summary of the interrupted night.
                why = "unconfirmed: the night was interrupted during the confirmation re-run"
                noted = [dataclasses.replace(v, note=why) if v.status == "regression" else v for v in verdicts]
                series, envs = measured
                experiments += history.night_experiments(self.store, self.night_id, item.name)[1:]
                history.record_item(
                    self.store, self.night_id, item, status="interrupted", experiments=experiments, error=why,
                    series=series, envs=envs, simulated=item.sim,
                    decisions={v.value.series: v.decision() for v in noted},
                )  # fmt: skip
                self._cut = ItemReport(
                    item=item.name, host=item.host, kind=item.kind, simulated=item.sim, status="interrupted",
                    experiments=tuple(experiments), error=why, series=tuple(noted),
                )  # fmt: skip
                raise
            second = None
            why = f"the confirmation re-run was stopped by {self._alarm.fired}"
        except Exception as e:  # an OrchError, or a bug: either way the first measurement stands
            said = e.waiting_by(WAIT_HINT) if isinstance(e, HostBusy) else e
            second, why = None, f"the confirmation re-run failed: {said}"
        if second is None:
            # Unconfirmed is still reported: a regression that also breaks the re-run must not go quiet.
            self.events.line(f"[{item.name}] {why}; reporting the first measurement")
            noted = [dataclasses.replace(v, note=why) if v.status == "regression" else v for v in verdicts]
            return noted, first, *measured
        experiments.append(second.experiment_id)
        again, envs2 = history.measure(item, second, self.suite.min_history)
        tonight2 = self._tonight(item, envs2)
        rerun = {v.series: judge(v, past, tonight2, self.suite.min_history) for v in again}
        pooled = _merge(first, second)
        series, envs = history.measure(item, pooled, self.suite.min_history)
        tonight = self._tonight(item, envs)
        out = []
        for v in series:
            verdict = judge(v, past, tonight, self.suite.min_history)
            before = next((x for x in verdicts if x.value.series == v.series), None)
            if before is not None and before.status == "regression":
                status, note = rerun_note(before, rerun.get(v.series))
                verdict = dataclasses.replace(verdict, status=status, note=note)
            elif verdict.status == "regression":
                verdict = dataclasses.replace(verdict, status="ok", note="a regression only in the pooled value")
            out.append(verdict)
        notes = [f"{v.value.series} {v.note}" for v in out if v.note]
        self.events.line(f"[{item.name}] re-run: {'; '.join(notes) or 'done'}")
        return out, pooled, series, envs

    def _tonight(self, item: Item, envs: dict[str, dict[str, Any]]) -> history.ItemNight:
        """Tonight as a night in the item's history, to judge its values against the nights before (no series yet)."""
        return history.ItemNight(
            night_id=self.night_id,
            night_at=self.night_at,
            suite=self.suite.name,
            status="complete",
            error=None,
            experiments=(),
            series=(),
            envs=envs,
            simulated=item.sim,
        )

    def _failed(self, item: Item, status: str, error: str, began: float) -> ItemReport:
        # Stored and posted: a server's log tail in the error must not carry the profile's secrets.
        error = scrub(error, [v for p in item.profiles for v in server.profile_secrets(p)])
        self.events.line(f"[{item.name}] {status}: {error}")
        experiments = tuple(history.night_experiments(self.store, self.night_id, item.name))
        if experiments and status in ("interrupted", "timeout"):
            error += f" (its launches so far are stored: orch show {experiments[-1]})"
        history.record_item(
            self.store, self.night_id, item, status=status, experiments=experiments, error=error, series=(), envs={},
            simulated=item.sim,
        )  # fmt: skip
        return ItemReport(
            item=item.name, host=item.host, kind=item.kind, simulated=item.sim, status=status,
            experiments=experiments, error=error, seconds=time.monotonic() - began,
        )  # fmt: skip
