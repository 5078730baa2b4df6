"""`orch profiles list|show|validate`."""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Any

import click
import yaml

from orchestrator import engines, yamlfile
from orchestrator.cli.base import EXIT_USAGE
from orchestrator.cli.complete import profile_names
from orchestrator.cli.jsonout import JsonCommand, emit, json_option
from orchestrator.common.printable import visible
from orchestrator.config import profile as profiles_mod
from orchestrator.config.secretpatterns import redact, redact_argv
from orchestrator.engines.base import OPTIONAL_FIELDS
from orchestrator.errors import ProfileError
from orchestrator.fields import did_you_mean

REDACTED_MARK = "<redacted hmac:"

# ---------------------------------------------------------------- profiles


@click.group("profiles")
def profiles_group() -> None:
    """List, show and validate server profiles (./profiles, the user config dir, then the bundled set)."""


@profiles_group.command("list", cls=JsonCommand)
@json_option
def profiles_list(as_json: bool) -> None:
    """Every profile name visible from here, with where it comes from."""
    found = profiles_mod.available()
    rows: list[dict[str, Any]] = []
    for name, path in sorted(found.items()):
        row: dict[str, Any] = {"name": name, "path": str(path), "description": None, "valid": True}
        try:
            row["description"] = profiles_mod.load(str(path)).description
        except ProfileError as e:
            row.update(valid=False, error=str(e))
        rows.append(row)
    if as_json:
        dirs = [str(d) for d in profiles_mod.search_dirs()]
        emit({"status": "ok", "search_dirs": dirs, "profiles": rows})
        return
    if not rows:
        click.echo("no profiles found in " + ", ".join(str(d) for d in profiles_mod.search_dirs()))
        return
    width = max(len(r["name"]) for r in rows)
    for r in rows:
        desc = r["description"] if r["valid"] else "INVALID: " + r["error"].replace("\n", "; ")
        click.echo(f"{r['name'].ljust(width)}  {visible(desc or '')}  [{visible(r['path'])}]")


# The order a hand-written profile has its fields in.
FILE_FIELDS = (*profiles_mod.TOP_FIELDS, "speculative", "env", "sim")


def file_fields(prof: profiles_mod.Profile) -> dict[str, Any]:
    """The resolved profile as a profile file would have it: no `extends`, nothing unset, only the fields its
    engine takes, so the YAML validates as it is when saved under profiles/."""
    data = prof.to_dict()
    takes = engines.get(prof.engine).fields
    out: dict[str, Any] = {}
    for key in FILE_FIELDS:
        value = data.get(key)
        if key in OPTIONAL_FIELDS and key not in takes:
            continue
        if isinstance(value, dict):
            value = {k: v for k, v in value.items() if v is not None}
        if value is None or value == "" or value == [] or value == {}:
            continue
        out[key] = value
    return out


def _launch_line(prof: profiles_mod.Profile, python: str, sim: bool) -> tuple[list[str], dict[str, str]]:
    env = prof.env_dict() | (prof.sim_env() if sim else {})
    # Secret-looking values are shown as digests: this output ends up in terminals, tickets and chat.
    return redact_argv(prof.launch_argv(python, simulate=sim)), {k: redact(k, v) for k, v in sorted(env.items())}


@profiles_group.command("show", cls=JsonCommand)
@click.argument("name", shell_complete=profile_names)
@click.option("--sim", is_flag=True, help="Show the launch as `--sim` would run it (the simulator).")
@click.option("--python", "python", default="python3", show_default=True, help="Interpreter shown in the command.")
@json_option
def profiles_show(name: str, sim: bool, python: str, as_json: bool) -> None:
    """The resolved profile as YAML that starts a new profile file, and the exact launch command as a comment.

    Save it as profiles/NEW.yaml and edit; the `extends` chain is already applied."""
    prof = profiles_mod.load(name)
    fields = file_fields(prof)
    argv, env = _launch_line(prof, python, sim)
    if as_json:
        emit(
            {
                "status": "ok",
                "name": prof.name,
                "source": prof.source,
                "extends_chain": list(prof.chain),
                "profile": fields,
                "simulated": sim,
                "command": argv,
                "env": env,
            }
        )
        return
    click.echo(f"# {prof.name} (from {prof.source}; extends chain: {' -> '.join(prof.chain)})")
    click.echo("# resolved; as a file of its own it needs no `extends`")
    text = yaml.safe_dump(fields, sort_keys=False, allow_unicode=True).rstrip()
    if REDACTED_MARK in text:
        click.echo("# secret-looking values are shown as digests: put the real values back in a copy")
    click.echo(text)
    click.echo("\n# launch command" + (" (SIMULATOR)" if sim else "") + ":")
    prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    # A leading ~/ stays unquoted: orch expands it on the host (agent.facts.home_path), as this shell line would.
    shown = ["~/" + shlex.quote(a[2:]) if a.startswith("~/") else shlex.quote(a) for a in argv]
    command = (prefix + " " if prefix else "") + " ".join(shown)
    # A launcher script inside the command (llama.cpp's) spans lines: each stays a comment.
    click.echo("\n".join("#   " + line for line in command.splitlines()))


@profiles_group.command("validate")
@click.argument("profiles", metavar="NAME|FILE...", nargs=-1, required=True, shell_complete=profile_names)
def profiles_validate(profiles: tuple[str, ...]) -> None:
    """Check profiles, given as names or files: one `ok` line per valid one, one `invalid` line per problem (every
    problem of a file, not just the first); exits 2 (invalid input) if any is invalid."""
    bad = 0
    for ref in profiles:
        missing = _missing_name(ref)
        if missing:
            bad += 1
            click.echo(f"invalid {missing}")
            continue
        try:
            prof = profiles_mod.validate_file(ref)
        except ProfileError as e:
            bad += 1
            for problem in profiles_mod.problems_of(e):
                click.echo(f"invalid {_named(ref, problem)}")
            continue
        # A name says which file it found; a file says which profile name it has.
        click.echo(f"ok      {ref} ({prof.source if ref == prof.name else prof.name})")
    if bad:
        raise SystemExit(EXIT_USAGE)


def _missing_name(ref: str) -> str | None:
    """A NAME that no profile has, said as `NAME: no such profile (did you mean X?); profiles: ...`."""
    path = Path(ref)
    if yamlfile.is_file(path) or path.suffix in (".yaml", ".yml") or os.sep in ref:
        return None  # a file: validate_file says what is wrong with it
    known = sorted(profiles_mod.available())
    if ref in known:
        return None
    return f"{ref}: no such profile{did_you_mean(ref, known)}; profiles: {', '.join(known) or 'none'}"


def _named(ref: str, problem: str) -> str:
    """Each line starts with what it is about: a problem that does not name its file gets the NAME|FILE given."""
    head = problem.split(": ", 1)[0]
    return problem if head == ref or head.endswith((".yaml", ".yml")) else f"{ref}: {problem}"
