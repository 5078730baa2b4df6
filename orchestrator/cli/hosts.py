"""Hosts: `orch hosts list|check`, `orch status`, `orch down`."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import click

from orchestrator import engines
from orchestrator.cli.base import Seconds, units
from orchestrator.cli.hostlist import entry_line, group_entry, host_entry
from orchestrator.cli.jsonout import JsonCommand, emit, json_option
from orchestrator.cli.launches import stored_profiles, summarize, table
from orchestrator.cli.options import db_option, host_options, with_host_options
from orchestrator.common.printable import visible
from orchestrator.config.secretpatterns import scrub
from orchestrator.hosts import lock as locks
from orchestrator.hosts import open_reachable, resolve_host
from orchestrator.hosts.base import Host, default_namespace
from orchestrator.hosts.check import check_host
from orchestrator.hosts.group import GroupHost
from orchestrator.hosts.inventory import inventory_paths, load_groups, load_inventory
from orchestrator.launch import group as multinode
from orchestrator.results.store import default_path as default_db_path
from orchestrator.ui.events import Lines


@click.command("down")
@with_host_options
@click.option(
    "--grace",
    default=10.0,
    show_default=True,
    type=Seconds(0, 600),
    help="Time each server gets between SIGTERM and SIGKILL" + units(0, 600),
)
@click.option(
    "--force",
    is_flag=True,
    help="Also stop the servers of an orch session that is still running on the host (it will fail).",
)
def down_cmd(host_spec: str, inventory: str | None, accept_new_host_key: bool, grace: float, force: bool) -> None:
    """Stop every server orch launched on the host (found by its launch marker; nothing else is touched).

    A live orch session's servers are left alone unless --force: down takes the host lock like a run does.
    A group node that cannot be reached is named (exit 1) and the other nodes are still cleaned up.
    """
    failed = False
    with _open_nodes(host_spec, inventory, accept_new_host_key) as (_, nodes):
        for name, node in nodes:  # a group: every node (a crashed multi-node launch left ranks on each)
            if isinstance(node, str):
                click.echo(_unreachable_line(name, node))
                failed = True
                continue
            where = host_spec if len(nodes) == 1 else f"{host_spec} ({name})"
            if not force:
                locks.acquire_host_lock(node, "orch down", 0.0, purpose="orch down")
            try:
                result = node.call("down", namespace=default_namespace(), grace_s=grace, force=force)
            finally:
                if not force:
                    locks.release(node)
            failed |= _print_down(where, result)
    if failed:
        raise SystemExit(1)


@contextlib.contextmanager
def _open_nodes(
    host_spec: str, inventory: str | None, accept_new_host_key: bool
) -> Iterator[tuple[Host | None, list[tuple[str, Host | str]]]]:
    """HOST and its machines in rank order, each as its Host or why it could not be reached: a group's nodes are
    opened one by one, so one node that is down does not hide the others (look-only and cleanup commands)."""
    group = open_reachable(host_spec, inventory=inventory, accept_new_host_key=accept_new_host_key)
    host: Host | None
    unreachable: dict[str, str]
    if group is None:
        # What opening takes long for (a Slurm allocation's queue wait) is said on stderr: stdout may be --json.
        say = Lines(functools.partial(click.echo, err=True))
        host = resolve_host(host_spec, inventory=inventory, accept_new_host_key=accept_new_host_key, events=say)
        unreachable = {}
    else:
        host, unreachable = group
    try:
        nodes: list[tuple[str, Host | str]]
        if host is None or isinstance(host, GroupHost):
            reached = iter(host.nodes if host else [])
            names = host.group.nodes if host else tuple(unreachable)
            nodes = [(name, unreachable[name] if name in unreachable else next(reached)) for name in names]
        else:
            nodes = [(node.name, node) for node in host.members()]
        yield host, nodes
    finally:
        if host is not None:
            host.close()


def _unreachable_line(name: str, why: str) -> str:
    return (
        f"cannot reach {name}: {why.rstrip('.')}; its leftovers stay until it can be reached (orch down --host {name})"
    )


def _print_down(where: str, result: dict[str, Any]) -> bool:
    """What `down` did on one machine; True when a live session's launch was left running."""
    stopped, live = result["stopped"], result["live"]
    if not stopped and not live:
        click.echo(f"nothing launched by orch is running on {where}")
    for item in stopped:
        click.echo(
            f"stopped {item['launch_id']} on {where}: {len(item['found'])} process(es)"
            + (f", {len(item['remaining'])} would not die" if item["remaining"] else "")
        )
    for item in live:
        click.echo(
            f"left {item['launch_id']} running on {where}: it belongs to a live orch session (process "
            f"{str(item['owner']).split(':')[0]} on the host); `orch down --force` stops it anyway"
        )
    return bool(live)


@click.command("status", cls=JsonCommand)
@with_host_options
@db_option
@click.option("-v", "--verbose", is_flag=True, help="Also list every process of each launch (workers included).")
@json_option
def status_cmd(
    host_spec: str, inventory: str | None, accept_new_host_key: bool, db: str | None, verbose: bool, as_json: bool
) -> None:
    """What orch launched on the host and is still running: one line per launch (profile, launch id, PID, port,
    age, state), then GPU memory. The profile names come from the results database (--db), else from the launch
    itself (orch names it in the launch's environment); a launch of an older orch recorded in another database
    shows "(another results store)".

    A group node that cannot be reached gets a line saying so (exit 1); the other nodes are still shown."""
    with _open_nodes(host_spec, inventory, accept_new_host_key) as (_, nodes):
        # A group: every node, one section each (its ranks and GPUs); a node that cannot be reached says so.
        states = [(name, n if isinstance(n, str) else
                   n.call("status", namespace=default_namespace(), nvidia_smi=n.config.nvidia_smi))
                  for name, n in nodes]  # fmt: skip
    unreachable = [name for name, state in states if isinstance(state, str)]
    if as_json:
        docs = [
            {"node": name, "status": "error", "error": state}
            if isinstance(state, str)
            else _status_doc(host_spec if len(states) == 1 else name, state, db)
            for name, state in states
        ]
        emit({"status": "ok", "host": host_spec, **docs[0]} if len(docs) == 1 else
             {"status": "error" if unreachable else "ok", "host": host_spec, "nodes": docs})  # fmt: skip
    else:
        for name, state in states:
            if len(states) > 1:
                click.echo(f"== {host_spec} ({name})")
            if isinstance(state, str):
                click.echo(_unreachable_line(name, state))
            else:
                _print_status(host_spec if len(states) == 1 else f"{host_spec} ({name})", state, db, verbose)
    if unreachable:
        raise SystemExit(1)


def _status_doc(node: str, state: dict[str, Any], db: str | None) -> dict[str, Any]:
    # Command lines come back from the host masked by name, flag and URL (processes.masked_cmdline, stdlib); what
    # only a pattern tells (a GitHub token after an innocuous flag) is masked here, before it reaches stdout.
    procs = [{**p, "cmdline": scrub(str(p.get("cmdline", "")))} for p in state["processes"]]
    profiles = stored_profiles(Path(db) if db else default_db_path(), (str(p["launch_id"]) for p in procs))
    return {"node": node, "launches": summarize(procs, profiles), "processes": procs, "gpus": state["gpus"]}


def _print_status(where: str, state: dict[str, Any], db: str | None, verbose: bool) -> None:
    doc = _status_doc(where, state, db)
    procs, summary = doc["processes"], doc["launches"]
    if not procs:
        click.echo(f"nothing launched by orch is running on {where}")
    else:
        for line in table(summary):
            click.echo(line)
    if verbose:
        for p in sorted(procs, key=lambda d: (d["launch_id"], d["pid"])):
            ports = f" ports {','.join(map(str, p['ports']))}" if p["ports"] else ""
            click.echo(visible(f"{p['launch_id']}  PID {p['pid']} (pgid {p['pgid']}){ports}  {p['cmdline']}"))
    elif procs and any(item["processes"] > 1 for item in summary):
        click.echo(f"({len(procs)} processes in all; -v lists each with its command line)")
    for line in gpu_lines(state["gpus"]):
        click.echo(line)


def gpu_lines(gpus: dict[str, Any]) -> list[str]:
    if not gpus["available"]:
        return [f"GPUs: unknown ({gpus['error']})"]
    lines = [
        f"GPU {g['index']}: {g.get('name')}, {g.get('memory.used')} / {g.get('memory.total')} MiB used"
        for g in gpus["gpus"]
    ]
    lines += [
        f"  GPU process PID {a['pid']} on GPU {a.get('gpu_index')}: {a.get('used_memory')} MiB, {a.get('cmdline')}"
        + (f" (orch launch {a['launch_id']})" if a.get("launch_id") else " (not launched by orch)")
        for a in gpus["apps"]
    ]
    return lines


@click.group("hosts")
def hosts_group() -> None:
    """The host inventory (hosts.yaml) and host checks."""


@hosts_group.command("list", cls=JsonCommand)
@host_options()[0]  # --inventory
@json_option
def hosts_list(inventory: str | None, as_json: bool) -> None:
    """Hosts in the inventory: SSH hosts (where orch will connect), Slurm entries (what orch asks Slurm for) and
    groups of hosts (multi-node profiles)."""
    hosts = load_inventory(inventory)
    groups = load_groups(inventory)
    entries = [host_entry(h) for _, h in sorted(hosts.items())]
    entries += [group_entry(g) for _, g in sorted(groups.items())]
    searched = [str(p) for p in inventory_paths(inventory)]
    if as_json:
        emit({"status": "ok", "inventory": entries[0]["source"] if entries else None, "searched": searched,
              "hosts": entries})  # fmt: skip
        return
    if not entries:
        click.echo("no host inventory found in " + ", ".join(searched))
    for doc in entries:
        click.echo(entry_line(doc))


@hosts_group.command("check", cls=JsonCommand)
@click.argument("host_spec", metavar="HOST")
@host_options()[0]  # --inventory
@host_options()[1]  # --accept-new-host-key
@json_option
def hosts_check(host_spec: str, inventory: str | None, accept_new_host_key: bool, as_json: bool) -> None:
    """Connect and report what matters for a benchmark, one ok/warn/fail line each; exits 1 on any fail.

    HOST may be an inventory group: then every node is checked (one section each; a node that cannot be reached
    gets one fail line and the others are still checked), and the nodes are compared in what one multi-node server
    needs equal on all of them (GPU model, driver, engine package versions) and whether they need a port_stride.
    HOST may be a Slurm host too (`slurm:PARTITION`, or an inventory entry with `scheduler: slurm`): then orch asks
    Slurm for one node and checks that node."""
    with _open_nodes(host_spec, inventory, accept_new_host_key) as (host, nodes):
        if host is None or isinstance(host, GroupHost):
            sections = [
                (name, [("fail", f"cannot reach {name}: {node}")] if isinstance(node, str) else
                 check_host(node, default_namespace()))
                for name, node in nodes
            ]  # fmt: skip
            missing = [name for name, node in nodes if isinstance(node, str)]
            report = group_checks(host) if host is not None and not missing else [
                ("warn", f"nodes not compared: {', '.join(missing)} could not be reached")]  # fmt: skip
        else:
            sections, report = [], check_host(host, default_namespace())
        calls = sum(node.stats.calls for node in host.members()) if host is not None else 0
        errors = {name: node for name, node in nodes if isinstance(node, str)}
    everything = [level for _, checks in sections for level, _ in checks] + [level for level, _ in report]
    failed = "fail" in everything
    if as_json:
        # "status" is the worst check: a host that answers but fails a check is not an error of orch's.
        node_docs = [
            {
                "node": name,
                "status": _worst(lv for lv, _ in checks),
                "checks": _checks_doc(checks),
                **({"error": errors[name]} if name in errors else {}),
            }
            for name, checks in sections
        ]
        emit(
            {
                "status": _worst(everything),
                "host": host_spec,
                **({"nodes": node_docs} if sections else {}),
                "checks": _checks_doc(report),
                "host_calls": calls,
            }
        )
        if failed:
            raise SystemExit(1)
        return
    for name, checks in sections:
        click.echo(f"== {host_spec} ({name})")
        _print_checks(checks)
    if sections:
        click.echo(f"== {host_spec} (group: {', '.join(name for name, _ in sections)})")
    _print_checks(report)
    click.echo(f"({calls} host-side calls)")
    if failed:
        raise SystemExit(1)


def group_checks(group: GroupHost) -> list[tuple[str, str]]:
    """The nodes compared: one fail per field that differs between them (what `orch ab` refuses to launch on)."""
    facts, mismatches = multinode.node_facts(group, engines.fact_packages(), allow_mismatch=True)
    out = [
        ("fail", f"nodes differ in {m} (a multi-node launch is refused unless --allow-node-mismatch)")
        for m in mismatches
    ] or [("ok", "nodes agree on GPU model, driver, engine packages")]
    clash = multinode.port_clash(group, facts, len(group.nodes))
    if clash:
        out.append(("fail", f"{clash}; until then `orch ab` refuses a multi-node launch on {group.name}"))
    return out


def _worst(levels: Iterable[str]) -> str:
    seen = set(levels)
    return "fail" if "fail" in seen else "warn" if "warn" in seen else "ok"


def _checks_doc(checks: list[tuple[str, str]]) -> list[dict[str, str]]:
    return [{"level": level, "text": text} for level, text in checks]


def _print_checks(checks: list[tuple[str, str]]) -> None:
    for level, text in checks:
        click.echo(f"{level:<4}  {text}")
